"""One Trainer step on every route: the route choice (or the memory_limit check) before step 1, the RNG and buffer
states a failed step puts back, the dispatch to the route's step with the switch to streaming when an eager or fused
step runs out of memory, and the fused route's step itself (with Trainer.compile, which builds its FusedStep).

Its own file so that trainer.py keeps the Trainer's options, locks and public methods. The eager route's step is
eager_step.py's, the streaming route's trainer_streaming.py's, the fused plans and their replay compile/step.py's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compile.micro_batches import split_batch
from ..compile.step_state import buffer_slots, buffer_states, restore_step_state, rng_generators, rng_states
from ..memory.meter import rss_bytes
from ..nn.modes import ensure_training
from ..tensor import Tensor
from .report import NonFiniteLossError, StepReport
from .trainer_streaming import keep_the_switch, streaming_step, switch_after_oom, undo_the_switch

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("tensorarena")


def run_step(trainer: Trainer, inputs: Any, targets: Any) -> StepReport:
    if trainer.route == "auto":
        trainer._choose_route(inputs, targets)
        trainer._limit_rows = _rows(inputs)
    elif trainer._limit_to_check and trainer.route in ("eager", "fused", "streaming"):
        trainer._check_the_limit(inputs, targets)
        trainer._limit_to_check = False  # checked once for this many rows (a larger batch: route_step)
        trainer._limit_rows = _rows(inputs)
    # Generators found once (walking every module each step would be hot-path work for nothing).
    if trainer._generators is None:
        trainer._generators = rng_generators(trainer.model)
        trainer._buffer_slots = buffer_slots(trainer.model)
    # A failed step leaves the generators where they were before it, on every route: eager's forward
    # draws its dropout masks before a bad label fails the loss, a fused trace restores what it drew, a
    # streamed forward draws stage by stage, and the out-of-memory redo must draw the failed step's masks
    # again. So are the buffers a forward writes (running statistics): the redo must not count the batch
    # twice. (tensorarena's own models have no buffers: then nothing is copied.)
    before = (rng_states(trainer.model, trainer._generators),
              buffer_states(slots=trainer._buffer_slots) if trainer._buffer_slots else None)
    try:
        return trainer._route_step(inputs, targets, before)
    except NonFiniteLossError as err:
        restore_step_state(before)
        shape = np.shape(inputs.data if isinstance(inputs, Tensor) else inputs)
        if shape[:1] == (0,):  # the mean loss of no rows is NaN: say why, not "lower the learning rate"
            raise NonFiniteLossError(f"{err} The batch is empty: inputs of shape {shape}; check the data "
                                     f"loader (its last batch?)") from None
        raise
    except BaseException:
        if trainer.stream is not None and trainer.stream.uncommitted_step is not None:
            # Only the streaming step's commit failed: its updates stand and are committed first thing later
            # (stream/route.py retry_commit), so its buffer writes and draws stand too.
            raise
        restore_step_state(before)
        raise


def route_step(trainer: Trainer, inputs: Any, targets: Any, before) -> StepReport:
    """The step on the current route; an out-of-memory eager or fused step moves to streaming and is redone."""
    if trainer.route == "streaming":
        if trainer.stream is not None:
            _check_a_larger_batch(trainer, inputs, targets)
        return streaming_step(trainer, inputs, targets)
    try:
        _check_a_larger_batch(trainer, inputs, targets)
        if trainer.route == "fused":
            report = trainer._fused_step(inputs, targets)
            if report is not None:
                return report
        return trainer._eager_step(inputs, targets)
    except MemoryError as err:  # ArenaOutOfMemory too; the step arena is already closed
        if not trainer.oom_fallback:
            raise
        switch_after_oom(trainer, err, trainer.step_count + 1, before)
    try:
        # Streaming now: a batch larger than the one planned is planned again on this route too. Its step was moved
        # here because the batch did not fit fused or eager; unchecked, streaming ran it far past the limit too
        # (batch 30000 of a small ViT: 457 MiB under memory_limit="260M", a helper's hunt).
        _check_a_larger_batch(trainer, inputs, targets)
        report = streaming_step(trainer, inputs, targets)
    except BaseException as exc:
        # A redo that failed partway left the store's stages partly applied: the state kept in memory comes back
        # (DESIGN.md: "nothing lost"), and the trainer with it to the route it left.
        again = undo_the_switch(trainer, exc)
        if again is exc:
            raise
        raise again from exc
    keep_the_switch(trainer)
    return report


def _check_a_larger_batch(trainer: Trainer, inputs: Any, targets: Any) -> None:
    """A batch of more rows than the route was planned for at step 1 is planned again before it runs: a MemoryError
    naming the budget and the need if the route does not fit it, which moves the step to streaming (oom_fallback)
    before any update. Unchecked, route auto's fused run planned for batch 8 in 300M took batch 64 to 325 MiB
    unsaid, and batch 256 in a 300M cgroup was killed, losing the steps before it."""
    checked = trainer._limit_rows
    if checked is None:
        return
    rows = _rows(inputs)
    if rows is None or rows <= checked:
        return
    log.info("a batch of %d rows, more than the %d the %s route was planned for: planning it again against %s",
             rows, checked, trainer.route, trainer.budget)
    trainer._check_the_limit(inputs, targets)
    trainer._limit_rows = rows


def fused_step(trainer: Trainer, inputs: Any, targets: Any) -> StepReport | None:
    """A replayed fused step, or None after switching to eager (allowed fallback only)."""
    from ..compile.trace import UnsupportedOpError

    start = time.perf_counter()
    index = trainer.step_count + 1
    ensure_training(trainer.model)  # a submodule the user put in eval mode stays so (nn/modes.py)
    lr = float(trainer.optimizer.param_groups[0]["lr"])
    try:
        if trainer.fused is None:
            trainer.compile(inputs, targets)
        # Traces (a new signature, a changed model or optimizer) happen inside, before any update: an
        # UnsupportedOpError leaves nothing applied.
        loss_value, grad_norm, skipped, arena = trainer.fused.step(inputs, targets, index=index,
                                                                   on_nonfinite=trainer.on_nonfinite)
    except UnsupportedOpError as err:
        if not trainer.fallback_to_eager:
            raise
        trainer.route, trainer.fallback_reason = "eager", str(err)
        log.warning("fused route unavailable, training on the eager route: %s", err)
        return None
    trainer.step_count = index
    return StepReport(step=index, loss=loss_value, route="fused", seconds=time.perf_counter() - start,
                      arena_high_water=arena.stats.high_water, rss=rss_bytes(), lr=lr, grad_norm=grad_norm,
                      skipped=skipped)


def compile_fused(trainer: Trainer, inputs: Any, targets: Any):
    """Trainer.compile's work: the FusedStep (built at the first call) with a plan for this batch's first
    micro-batch."""
    from ..compile.step import FusedStep

    if trainer.fused is None:
        trainer.fused = FusedStep(trainer.model, trainer.loss_fn, trainer.optimizer, scheduler=trainer.scheduler,
                                  clip_grad_norm=trainer.clip_grad_norm, max_plans=trainer.max_plans,
                                  update_in_backward=trainer.update_in_backward,
                                  matmul_precision=trainer.matmul_precision, replay=trainer.fused_replay,
                                  micro_batch=trainer.micro_batch)
    x, y, _ = split_batch(inputs, targets, trainer.micro_batch)[0]
    trainer.fused.plan_for(x, y)
    return trainer.fused


def _rows(inputs: Any) -> int | None:
    """The rows of a batch's inputs (an array, a Tensor, or a container of them: its first leaf), or None."""
    from ..compile import targets as target_layout

    shape = getattr(inputs, "shape", None)  # an array or a Tensor, every step: no flattening on the hot path
    if shape is not None:
        return shape[0] if len(shape) else None

    try:
        _, leaves = target_layout.flatten(inputs)
    except TypeError:
        return None
    return len(leaves[0]) if leaves and leaves[0].ndim else None
