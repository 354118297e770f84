"""The eager route's micro-batches: forward and backward on each in an arena of its own, gradients summed in .grad.

Trainer(micro_batch=m) on the eager route (compile/micro_batches.py says what is computed and why it equals the
whole batch's step). Each micro-batch's loss is backpropagated with its weight as the seed gradient (rows_i /
rows), so autograd's accumulation into .grad makes the weighted sum with no buffer of its own; the micro-batch's
arena is closed before the next one opens, so a step holds one micro-batch's activations at a time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..memory.arena import Arena
from .report import NonFiniteLossError

if TYPE_CHECKING:
    from .trainer import Trainer


def forward_backward(trainer: Trainer, chunks: list[tuple[Any, Any, float]], index: int) -> tuple[float, bool, int]:
    """(the batch's loss, skipped, the largest micro-batch arena's high-water mark): every micro-batch's forward
    and weighted backward, the sum left in the parameters' .grad. A non-finite loss (on_nonfinite="skip": skipped)
    or any error leaves every .grad None: a partial sum must not pass for a step's gradients."""
    from .trainer import _check_loss, _model_input

    trainer.optimizer.zero_grad(set_to_none=True)
    loss_value, high_water = 0.0, 0
    try:
        for i, (x, y, weight) in enumerate(chunks):
            arena = Arena(pool=trainer.pool, name=f"step {index} micro-batch {i + 1} of {len(chunks)} arena")
            with arena:
                loss = trainer.loss_fn(trainer.model(_model_input(x)), y)
                _check_loss(loss, trainer.loss_fn)
                value = loss.item()
                if not math.isfinite(value):
                    trainer.optimizer.zero_grad(set_to_none=True)
                    if trainer.on_nonfinite == "raise":
                        raise NonFiniteLossError(
                            f"loss is {value} at step {index} (micro-batch {i + 1} of {len(chunks)}); the "
                            f"parameters were not updated. Lower the learning rate or check the batch, or pass "
                            f"on_nonfinite='skip' to skip such steps.")
                    return value, True, max(high_water, arena.stats.high_water)
                loss.backward(np.asarray(weight, dtype=loss.data.dtype))
                del loss
            high_water = max(high_water, arena.stats.high_water)
            loss_value += weight * value
    except BaseException:
        trainer.optimizer.zero_grad(set_to_none=True)
        raise
    return loss_value, False, high_water
