"""The eager route's step: the define-by-run tape, one arena per step (DESIGN.md), and its micro-batches.

With Trainer(micro_batch=m) (compile/micro_batches.py says what is computed and why it equals the whole batch's
step) each micro-batch runs in an arena of its own, closed before the next one opens, so a step holds one
micro-batch's activations at a time. Its loss is backpropagated with its weight (rows_i / rows) as the seed
gradient, so autograd's accumulation into .grad makes the weighted sum with no buffer of its own.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compile.micro_batches import split_batch
from ..compile.step_state import step_scheduler
from ..memory.arena import Arena
from ..memory.meter import rss_bytes
from ..nn.modes import ensure_training
from ..optim import clip_grad_norm_
from ..tensor import Tensor
from .report import NonFiniteLossError, StepReport

if TYPE_CHECKING:
    from .trainer import Trainer


def eager_step(trainer: Trainer, inputs: Any, targets: Any) -> StepReport:
    """Trainer._eager_step's work: one step on the define-by-run tape in an arena of its own (with micro_batch,
    one arena per micro-batch, forward_backward below); returns its report."""
    start = time.perf_counter()
    index = trainer.step_count + 1
    ensure_training(trainer.model)  # a submodule the user put in eval mode stays so (nn/modes.py)
    lr = float(trainer.optimizer.param_groups[0]["lr"])
    grad_norm = None
    skipped = False
    chunks = split_batch(inputs, targets, trainer.micro_batch, trainer.loss_fn)
    arena = Arena(pool=trainer.pool, name=f"step {index} arena")
    with arena:  # closed (blocks returned) before any exception below propagates
        micro_high_water = 0
        if len(chunks) > 1:  # each micro-batch in an arena of its own, the gradients summed in .grad
            loss_value, skipped, micro_high_water = forward_backward(trainer, chunks, index)
        else:
            loss = trainer.loss_fn(trainer.model(_model_input(inputs)), targets)
            _check_loss(loss, trainer.loss_fn)
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                if trainer.on_nonfinite == "raise":
                    raise NonFiniteLossError(
                        f"loss is {loss_value} at step {index}; the parameters were not updated. "
                        f"Lower the learning rate or check the batch, or pass on_nonfinite='skip' "
                        f"to skip such steps."
                    )
                skipped = True
            else:
                trainer.optimizer.zero_grad(set_to_none=True)
                loss.backward()
        if not skipped:
            if trainer.clip_grad_norm is not None:
                # The optimizer's parameters read now, as the fused route clips them: one unfrozen
                # since the Trainer was built is clipped too.
                params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
                grad_norm = float(clip_grad_norm_(params, trainer.clip_grad_norm))
            trainer.optimizer.step()  # partly done, it raises a RuntimeError saying so: never redone
            if trainer.scheduler is not None:
                step_scheduler(trainer.scheduler, index)
        high_water = max(arena.stats.high_water, micro_high_water)
    trainer.step_count = index
    return StepReport(step=index, loss=loss_value, route=trainer.route, seconds=time.perf_counter() - start,
                      arena_high_water=high_water, rss=rss_bytes(), lr=lr, grad_norm=grad_norm,
                      skipped=skipped)


def forward_backward(trainer: Trainer, chunks: list[tuple[Any, Any, float]], index: int) -> tuple[float, bool, int]:
    """(the batch's loss, skipped, the largest micro-batch arena's high-water mark): every micro-batch's forward
    and weighted backward, the sum left in the parameters' .grad. A non-finite loss (on_nonfinite="skip": skipped)
    or any error leaves every .grad None: a partial sum must not pass for a step's gradients."""
    trainer.optimizer.zero_grad(set_to_none=True)
    loss_value, high_water = 0.0, 0
    try:
        for i, (x, y, weight) in enumerate(chunks):
            arena = Arena(pool=trainer.pool, name=f"step {index} micro-batch {i + 1} of {len(chunks)} arena")
            with arena:
                loss = trainer.loss_fn(trainer.model(_model_input(x)), y)
                _check_loss(loss, trainer.loss_fn)
                value = loss.item()
                # A weight of 0: every target ignored (compile/loss_shares.py), a 0 / 0 loss and a zero gradient,
                # neither checked nor counted (its forward ran: its dropout draws keep the routes' generators together).
                if weight and not math.isfinite(value):
                    trainer.optimizer.zero_grad(set_to_none=True)
                    if trainer.on_nonfinite == "raise":
                        raise NonFiniteLossError(
                            f"loss is {value} at step {index} (micro-batch {i + 1} of {len(chunks)}); the "
                            f"parameters were not updated. Lower the learning rate or check the batch, or pass "
                            f"on_nonfinite='skip' to skip such steps.")
                    return value, True, max(high_water, arena.stats.high_water)
                if weight:
                    loss.backward(np.asarray(weight, dtype=loss.data.dtype))
                del loss
            high_water = max(high_water, arena.stats.high_water)
            loss_value += weight * value if weight else 0.0
    except BaseException:
        trainer.optimizer.zero_grad(set_to_none=True)
        raise
    return loss_value, False, high_water


def _check_loss(loss: Any, loss_fn) -> None:
    """The eager step differentiates what loss_fn returned: a Tensor of one value (a number has no graph)."""
    if not isinstance(loss, Tensor):
        raise TypeError(f"loss_fn {getattr(loss_fn, '__name__', type(loss_fn).__name__)!r} returned a "
                        f"{type(loss).__name__}; it must return the loss as a scalar Tensor computed from the outputs "
                        f"(a Python or NumPy number has no graph to differentiate: keep the tensor ops, drop .item())")
    if math.prod(loss.shape) != 1:
        raise ValueError(f"loss_fn returned a Tensor of shape {loss.shape}; it must return one value (reduce it, "
                         f"e.g. .mean() or .sum(), as torch's backward needs a scalar)")


def _model_input(inputs: Any) -> Any:
    """What the eager step hands the model: a Tensor of an array-like batch, or a batch that is no array (a
    tokenizer's Encoding, a dict) as it is, as a PyTorch loop does. (The fused and streaming routes hold the
    inputs in a plan buffer, so they take arrays only: Tensor() says so.)"""
    if isinstance(inputs, Tensor):
        return inputs
    if isinstance(inputs, (np.ndarray, list, tuple, int, float, np.generic)):
        return Tensor(inputs)
    return inputs
