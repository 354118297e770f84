"""One streamed step's passes over the stages: the reads in order, the forward, the backward sweeps.

StreamingRoute.step (route.py) opens the step arena and commits; `run_step` does what lies between: the
forward over stages 0 .. N-2 (parameters only, boundary activations kept in the step arena, the RNG state
before each stage saved), then `_Sweep`, the backward from the last stage to the first (recompute with grad,
backward, update), run twice with global-norm clipping (the first sweep only for the norm). `_Loads` keeps
the store's next read in flight in the other slot while a stage computes; predict uses it too.

Micro-batches (StreamingRoute(micro_batch=m), compile/micro_batches.py): each stage, once loaded, runs every
micro-batch in turn, so the store is still read once per stage and sweep, and the stage's update, after its last
micro-batch, uses their weighted sum (each loss seeded with its weight, rows_i / rows or its share of a class-index
loss's counted targets; micro_batches.GradSums adds them up in
one more stage-sized gradient buffer). The boundary activations and input gradients stay the whole batch's (each
micro-batch fills its rows); a stage arena holds one micro-batch's activations. The RNG state is saved per stage and micro-batch, so the recompute draws
what the forward drew. The masks are drawn stage by stage (every micro-batch through stage 0, then stage 1 ...),
where the eager route's micro-batches draw micro-batch by micro-batch, so with dropout the two draw different
masks; without dropout (or in eval) they compute the same step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..autograd import enable_grad, no_grad
from ..memory.arena import Arena
from ..optim.clip import _norm
from ..tensor import Tensor
from ..train.report import NonFiniteLossError
from . import optim_state
from .buffers import StageBuffers
from .micro_batches import Cut, Feed, GradSums, micro_batch_cuts
from .stages import run_stage, stage_inputs

if TYPE_CHECKING:
    from .route import StreamingRoute
    from .store import ParamStore


def run_step(route: StreamingRoute, arena: Arena, inputs: Any, targets: Any, index: int):
    """The passes of StreamingRoute.step over the stages, in the step arena `arena`: the forward (keeping the
    boundary activations), then one backward sweep (two with clipping); returns (loss, grad_norm, skipped,
    the largest stage arena's high-water, side input bytes)."""
    n = len(route.stages)
    cuts = micro_batch_cuts(route.micro_batch, inputs, targets, route.loss_fn)
    # Once per step, first in the step arena (so they live until every stage's backward ran, and the arena's
    # bytes so far are theirs): stage 0's input and the side inputs every stage reading them gets.
    with no_grad():
        x, side = stage_inputs(route.model, route.stages, inputs)
    side_bytes = arena.stats.bytes_in_use if side is not None else 0
    feed = Feed(x, side, cuts)
    acts: list[Any] = [x] + [None] * (n - 1)  # acts[k]: the input of stage k (from 1 on, the whole batch's array)
    # rng_before[k][i]: the generators before stage k's forward on micro-batch i. The last stage's first forward
    # runs in the first sweep: its micro-batches after the first are noted there (_Sweep._generators).
    rng_before: list[list[Any]] = [[None] * len(cuts) for _ in range(n)]
    plan = [(k, True) for k in range(n - 1)]
    if route.clip_grad_norm is not None:
        plan += [(k, True) for k in reversed(range(n))]
    plan += [(k, False) for k in reversed(range(n))]
    # Every stage's gradient views, made before any stage is read or updated: a buffer that does not fit
    # a stage's layout fails here, with the store untouched, not after some stages took the step.
    grad_views = [route._grad_views(k) for k in range(n)]
    # With micro-batches, their sum: micro-batch 1 writes into it, each later one into grad_views, then added.
    sum_views = [route._grad_views(k, route._grad_sums) for k in range(n)] if len(cuts) > 1 else None
    loads = _Loads(route.store, plan)
    # The backward sweeps recompute forwards: their writes are undone.
    buffers = StageBuffers(route.model, n, len(cuts))
    stage_hw = 0
    try:
        with no_grad():
            for k in range(n - 1):
                route._attach(k, loads.get(k))
                keep = None
                for i, cut in enumerate(cuts):
                    rng_before[k][i] = route._rng_snapshot()
                    with Arena(pool=route._arena_pool, block_bytes=route._stage_block,
                               name=f"stage {route.stages[k].name!r} forward arena") as inner:
                        y = _as_tensor(run_stage(route.stages[k], feed.input(k, acts, i), feed.side(i)),
                                       route.stages[k].name).data
                        if keep is None:  # the outer step arena: lives until backward
                            keep = arena.alloc(feed.whole_shape(y.shape), y.dtype)
                        np.copyto(keep[cut.rows], feed.check_rows(route.stages[k].name, y, i, keep.shape))
                    stage_hw = max(stage_hw, inner.stats.high_water)
                    buffers.ran(k, i)
                route._detach(k)
                acts[k + 1] = keep
        rng_before[n - 1][0] = route._rng_snapshot()
        io_grads: dict[tuple, list[np.ndarray]] = {}
        sweep = _Sweep(route, arena, loads, acts, feed, rng_before, io_grads, grad_views, buffers, sum_views)
        grad_norm = scale = None
        if route.clip_grad_norm is not None:
            loss, finite = sweep.run(update=False)
            if not finite:
                return _nonfinite(route, loss, index, sweep, loads, stage_hw) + (side_bytes,)
            grad_norm = sweep.total_norm()
            coef = route.clip_grad_norm / (grad_norm + 1e-6)  # as clip_grad_norm_ (and torch)
            scale = None if coef >= 1.0 else coef  # NaN scales too, as there
        loss, finite = sweep.run(update=True, coef=scale)
        if not finite:
            return _nonfinite(route, loss, index, sweep, loads, stage_hw) + (side_bytes,)
        route._rng_restore(sweep.rng_after)  # where the eager step leaves the generators
        return loss, grad_norm, False, max(stage_hw, sweep.high_water), side_bytes
    finally:
        loads.finish()
        for k in range(n):
            route._detach(k)


def _nonfinite(route: StreamingRoute, loss: float, index: int, sweep: _Sweep, loads: _Loads, stage_hw: int):
    route._rng_restore(sweep.rng_after)
    if route.on_nonfinite == "raise":
        raise NonFiniteLossError(
            f"loss is {loss} at step {index}; the parameters were not updated. Lower the learning rate or "
            f"check the batch, or pass on_nonfinite='skip' to skip such steps.")
    return loss, None, True, max(stage_hw, sweep.high_water)


class _Loads:
    """The step's stage reads in order, read j into slot j % 2, read j + 1 always in flight.

    Read j + 1 goes to the slot of read j - 1; it is queued when j is taken, i.e. after the
    caller finished with j - 1 and queued its write-back, and the store's single I/O thread
    runs them in order, so the write empties the slot before the read refills it.
    """

    def __init__(self, store: ParamStore, plan: list[tuple[int, bool]]) -> None:
        self.store, self.plan = store, plan
        self.futures: dict[int, Any] = {}
        self.taken = 0

    def _queue(self, j: int) -> None:
        if j < len(self.plan) and j not in self.futures:
            k, params_only = self.plan[j]
            self.futures[j] = self.store.read(k, j % 2, params_only=params_only)

    def get(self, stage: int) -> int:
        """Wait for the next planned read (which must be of `stage`); returns its slot."""
        j = self.taken
        assert self.plan[j][0] == stage, (j, stage, self.plan[j])
        self._queue(j)
        self._queue(j + 1)
        self.futures.pop(j).result()
        self.taken += 1
        return j % 2

    def finish(self) -> None:
        """Wait for reads still in flight (an early exit must not leave the I/O thread filling slots)."""
        for future in self.futures.values():
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - the step's own error matters more
                pass
        self.futures.clear()


class _Sweep:
    """One backward pass over the stages, last to first; see StreamingRoute's module docstring."""

    def __init__(self, route: StreamingRoute, arena: Arena, loads: _Loads, acts: list, feed: Feed,
                 rng_before: list[list], io_grads: dict, grad_views: list[list[np.ndarray]],
                 buffers: StageBuffers, sum_views: list[list[np.ndarray]] | None = None) -> None:
        self.route, self.arena, self.loads, self.acts = route, arena, loads, acts
        self.feed = feed  # micro-batch i's rows of the inputs and side inputs, the arrays the forward pass read
        self.buffers = buffers  # the model's buffers: each stage's forward writes them once a step, not per sweep
        self.rng_before, self.io_grads = rng_before, io_grads
        self.grad_views = grad_views  # per stage, over the route's one gradient buffer
        self.sum_views = sum_views  # per stage, over the micro-batches' sum (None: the whole batch in one pass)
        self.rng_after = None
        self.norms: list[float] = []
        self.high_water = 0

    def _io_grad(self, shape: tuple, dtype, parity: int) -> np.ndarray:
        """A buffer for a stage input's gradient: two per (shape, dtype), alternating, in the step arena.

        Stage k writes its input's gradient while reading stage k + 1's, so they must differ;
        two suffice whatever the depth.
        """
        key = (tuple(shape), np.dtype(dtype).str)
        pair = self.io_grads.get(key)
        if pair is None:
            pair = self.io_grads[key] = [self.arena.alloc(shape, dtype), self.arena.alloc(shape, dtype)]
        return pair[parity]

    def run(self, *, update: bool, coef: float | None = None) -> tuple[float, bool]:
        """Recompute + backward every stage; update each one (update=True) or collect gradient norms. The
        buffers end as the stages' real forwards left them (stream/buffers.py), however the sweep ends."""
        try:
            return self._run(update, coef)
        finally:
            self.buffers.sweep_ended()

    def _generators(self, k: int, i: int) -> None:
        """The generators as stage k's forward on micro-batch i found them; the last stage's micro-batches after the
        first run for the first time in the first sweep, which notes their state (the one before is restored)."""
        if self.rng_before[k][i] is None:
            self.rng_before[k][i] = self.route._rng_snapshot()
        else:
            self.route._rng_restore(self.rng_before[k][i])

    def _run(self, update: bool, coef: float | None) -> tuple[float, bool]:
        route, n, feed = self.route, len(self.route.stages), self.feed
        upstream = None
        loss = 0.0
        for k in reversed(range(n)):
            stage = route.stages[k]
            slot = self.loads.get(k)
            # This read was queued after the write of stage k + 2 (and k + 1 may be done): a write that failed
            # stops the step here, with its own error, before a stage is computed that could not be kept.
            route.store.raise_failed_write()
            views = route._attach(k, slot)
            sums = GradSums(stage.params, self.grad_views[k], self.sum_views[k]) if self.sum_views else None
            last = k == n - 1
            # The gradient of the stage's input, the whole batch's; each micro-batch writes its rows.
            grad_in = None if k == 0 else self._io_grad(self.acts[k].shape, self.acts[k].dtype, k % 2)
            got_grad = False
            for i, cut in enumerate(feed.cuts):
                if sums is None:
                    for p, g in zip(stage.params, self.grad_views[k]):
                        p.grad, p._grad_buffer = None, g
                else:
                    sums.before()
                self._generators(k, i)
                with Arena(pool=route._arena_pool, block_bytes=route._stage_block,
                           name=f"stage {stage.name!r} backward arena") as inner:
                    if k == 0:
                        xin = feed.input(0, self.acts, i)
                    else:
                        xin = Tensor(self.acts[k][cut.rows], requires_grad=True)
                        xin._grad_buffer = grad_in[cut.rows]  # autograd writes the gradient there (tensor.py)
                    with enable_grad():
                        self.buffers.before(k, i)
                        out = _as_tensor(run_stage(stage, xin, feed.side(i)), stage.name)
                        self.buffers.after(k, i)  # before the loss: a non-finite one keeps the real forward's writes
                        if last:
                            loss_t = route.loss_fn(out, cut.targets)
                            value = float(loss_t.item())
                            self.rng_after = route._rng_snapshot()
                            # A weight of 0 (every target ignored: compile/loss_shares.py): a 0 / 0 loss, neither
                            # checked nor counted; its backward, seeded with 0, writes its rows' zero gradients.
                            if not math.isfinite(value) and (feed.whole or cut.weight):
                                return value, False
                            # Seeded with its weight (rows_i / rows): its gradients are its share, GradSums adds them.
                            loss_t.backward(None if feed.whole else np.asarray(cut.weight, dtype=loss_t.data.dtype))
                            loss += value if feed.whole else (cut.weight * value if cut.weight else 0.0)
                            del loss_t
                        elif upstream is not None and out.requires_grad:
                            out.backward(upstream if feed.whole else upstream[cut.rows])
                    if k > 0:
                        got_grad = _took_input_grad(xin, grad_in, cut, got_grad)
                self.high_water = max(self.high_water, inner.stats.high_water)
                del out, xin  # their graph saw the slot's parameters
                if sums is not None:
                    sums.after()
            if sums is not None:
                sums.finish()
            upstream = grad_in if got_grad else None
            if update:
                changed = self._update(k, views, coef)
                del views
                route._detach(k)  # before the write: io="map" unmaps the slot there
                # Journaled only if it changed: a stage nothing updated (frozen) still holds the last step.
                route.store.write(k, slot, route.step_count + 1 if changed else None)
            else:
                # Only the optimizer's parameters, as eager clips them: a trainable parameter in no group
                # (fine-tuning the head only) gets a gradient here but is neither clipped nor updated.
                self.norms.extend(_norm(p.grad, 2.0) for p in stage.params
                                  if p.grad is not None and id(p) in route._group_of)
                del views
                route._detach(k)
        return loss, True

    def _update(self, k: int, views, coef: float | None) -> bool:
        """Update stage k's parameters that have a group and a gradient; whether anything changed."""
        route = self.route
        stage = route.stages[k]
        by_group: dict[int, list[int]] = {}
        for i, p in enumerate(stage.params):
            gi = route._group_of.get(id(p))
            if p.grad is not None and gi is not None:
                by_group.setdefault(gi, []).append(i)
        if not by_group:
            return False
        # Counted (and, io="map", journaled "writing": the update changes the file itself) just before the
        # stage changes, so a failure earlier in the step leaves the route usable.
        route.store.begin_write(k, route.step_count + 1)
        route._writes += 1
        for gi, members in by_group.items():
            params = [stage.params[i] for i in members]
            if coef is not None:
                for p in params:
                    np.multiply(p.grad, coef, out=p.grad)
            optim_state.update(route.kinds, route.optimizer, route.optimizer.param_groups[gi], params,
                               [views.state[i] for i in members], [views.scalars[i] for i in members])
        return True

    def total_norm(self) -> float:
        """The global 2-norm of the gradients the last sweep saw (as clip_grad_norm_ computes it)."""
        with np.errstate(over="ignore", invalid="ignore"):
            try:
                total = math.fsum(v ** 2.0 for v in self.norms) ** 0.5
            except OverflowError:
                total = math.inf
            if any(math.isnan(v) for v in self.norms):
                total = math.nan
        return total


def _took_input_grad(xin: Tensor, grad_in: np.ndarray, cut: Cut, got_any: bool) -> bool:
    """Whether the stage's input has a gradient so far: its rows of `grad_in` hold micro-batch `cut`'s (zeros where
    its output did not depend on it while another micro-batch's did). Autograd wrote it there (xin._grad_buffer)
    unless it had to make it elsewhere."""
    rows = grad_in[cut.rows]
    if xin.grad is None:
        rows.fill(0)
        return got_any
    if not np.may_share_memory(xin.grad, rows):  # bounds only: cheap
        np.copyto(rows, xin.grad)
    return True


def _as_tensor(value: Any, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"stage {name!r} returned a {type(value).__name__}; a stage's forward must return a Tensor")
    return value
