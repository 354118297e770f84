"""Micro-batches: one optimizer step over a batch too big to run whole, as a few smaller forward/backward passes.

`Trainer(..., micro_batch=m)` and `compile_step(..., micro_batch=m)` cut a batch of more than m rows into
micro-batches of m rows (the last one may be smaller), run forward and backward on each in turn, and update
once from the sum of their gradients, each weighted by its share of the batch's rows: w_i = rows_i / rows. For a
loss that is a mean over rows (every loss here with reduction="mean" over a batch of whole samples) that sum is
the gradient of the whole batch's loss, and the step's reported loss, sum(w_i * loss_i), is its loss: the same
update as one pass over the whole batch, up to the order of float sums. tensorarena's class-index losses
(cross_entropy, nll_loss, nn.CrossEntropyLoss, nn.NLLLoss) average over their counted targets instead (ignore_index,
class weights) or add up (reduction="sum"): their micro-batches weigh their share of that (compile/loss_shares.py),
so they too update as the whole batch; a micro-batch with every target ignored weighs 0, its loss (0 / 0) is not
counted and its gradient is zero. A loss of one's own that averages over something else than rows differs from the
whole batch's, as PyTorch's usual gradient-accumulation loop does. Dropout draws each micro-batch's masks in turn,
so the masks differ too.

Memory: only one micro-batch's activations are alive at a time (eager: each pass runs in an arena of its own,
closed before the next; fused: the plan is traced for m rows). Gradients add up where they are kept anyway on the
eager route (autograd accumulates into .grad); the fused route keeps one more gradient-sized buffer per flat
group (`GradAccumulator`), counted in its memory report as "grad_accumulator", and never updates inside backward.

The batch is cut along the first dimension of the inputs and of every array in the targets, which must all have
the batch's rows (a constant in a targets structure, a number or a string, goes to every micro-batch as it is).
The cuts are views: nothing is copied here (the fused route copies each micro-batch into its plan's inputs, as it
copies a whole batch). `micro_step` is the fused route's loop over them; the eager one is
train/eager_step.py; the streaming route runs every micro-batch through each stage while it is loaded
(stream/sweep.py, stream/micro_batches.py), drawing dropout masks stage by stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..tensor import Tensor
from . import targets as target_layout
from .loss_shares import piece_shares
from .flat import FlatState, _aligned_zeros

if TYPE_CHECKING:
    from .step import FusedStep
    from .step_plan import PlannedArena


def check_micro_batch(micro_batch: Any, *, auto: bool = False) -> int | str | None:
    """`micro_batch` itself if it is None or a positive int (or, where `auto` allows it, "auto"); ValueError
    otherwise."""
    if micro_batch is None or (auto and micro_batch == "auto"):
        return micro_batch
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, (int, np.integer)) or micro_batch < 1:
        also = "; or 'auto': as many as fit the memory budget" if auto else ""
        raise ValueError(f"micro_batch must be a positive number of rows (or None: the whole batch in one pass"
                         f"{also}), got {micro_batch!r}")
    return int(micro_batch)


def check_model_splits(model: Any, micro_batch: int | None) -> None:
    """Refuse micro_batch for a model whose loss couples the rows of its batch: a module of it that says why in
    `micro_batches_refused` (SimCSE: InfoNCE takes every other sentence as a negative, so each micro-batch's loss
    would have fewer of them). Weighted micro-batch gradients add up to the whole batch's only for a loss that is
    a mean over rows; this one trained another loss (0.034 against the batch's 0.130), silently."""
    if micro_batch is None or not hasattr(model, "modules"):
        return
    for module in model.modules():
        reason = getattr(module, "micro_batches_refused", None)
        if reason:
            raise ValueError(f"micro_batch={micro_batch} is not supported for {type(module).__name__}: {reason}. "
                             f"Train it without micro_batch (a smaller batch, if the whole one does not fit)")


def split_batch(inputs: Any, targets: Any, micro_batch: int | None, loss_fn: Any = None
                ) -> list[tuple[Any, Any, float]]:
    """[(inputs_i, targets_i, weight_i)]: the batch cut into micro-batches of at most `micro_batch` rows, each with
    its share of the rows, or, for tensorarena's class-index losses (`loss_fn`), of the counted targets
    (compile/loss_shares.py: 0 for a micro-batch whose targets are all ignored); [(inputs, targets, 1.0)] as given
    when there is nothing to cut."""
    if micro_batch is None:
        return [(inputs, targets, 1.0)]
    x = inputs.data if isinstance(inputs, Tensor) else inputs
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray) or x.ndim == 0:
        what = f"a {type(inputs).__name__}" if not isinstance(x, np.ndarray) else "a scalar"
        raise ValueError(f"micro_batch={micro_batch} cuts the batch along the inputs' first dimension, but the "
                         f"inputs are {what}: pass them as one array or Tensor, or train without micro_batch")
    rows = x.shape[0]
    if rows <= micro_batch:
        return [(inputs, targets, 1.0)]
    _check_rows(targets, rows, "targets")
    if targets is None:
        return [(x[start:start + micro_batch], None, min(micro_batch, rows - start) / rows)
                for start in range(0, rows, micro_batch)]
    # The targets as a plan holds them (compile/targets.py): array leaves cut, the structure and constants rebuilt.
    spec, leaves = target_layout.flatten(targets)
    chunks = [(x[start:start + micro_batch],
               target_layout.build(spec, [leaf[start:start + micro_batch] if leaf.ndim else leaf for leaf in leaves]),
               min(micro_batch, rows - start) / rows) for start in range(0, rows, micro_batch)]
    shares = piece_shares(loss_fn, [y for _, y, _ in chunks]) if loss_fn is not None else None
    if shares is not None:
        chunks = [(x, y, share) for (x, y, _), share in zip(chunks, shares)]
    return chunks


def _check_rows(y: Any, rows: int, where: str) -> None:
    """ValueError naming the first array of the targets whose first dimension is not the batch's rows."""
    if y is None or isinstance(y, (bool, int, float, complex, str, bytes, np.generic)):
        return
    if isinstance(y, dict):
        for key, value in y.items():
            _check_rows(value, rows, f"{where}[{key!r}]")
        return
    if isinstance(y, (tuple, list)) and any(isinstance(v, (np.ndarray, Tensor, dict, tuple, list)) for v in y):
        for i, value in enumerate(y):
            _check_rows(value, rows, f"{where}[{i}]")
        return
    shape = np.shape(y.data if isinstance(y, Tensor) else y)
    if shape[:1] != (rows,):
        raise ValueError(f"micro_batch cuts the batch along its first dimension, but {where} has shape {shape} "
                         f"while the inputs have {rows} rows: every array of the targets must have the batch's "
                         f"rows first (pass a per-batch constant as a number, or train without micro_batch)")


class GradAccumulator:
    """The fused route's running sum of weighted micro-batch gradients, one buffer per flat group.

    After each micro-batch's backward the flat gradients hold that micro-batch's weighted gradient (its backward
    was seeded with the weight: FusedStep.loss_seed); `add` adds it to the sum, `finish` (the last micro-batch)
    leaves the total in the flat gradients, where clipping and the flat update read it. In-place NumPy ufuncs
    only: a replayed step still allocates nothing.

    Regression (fixed): each backward was seeded with 1 and its gradient scaled by the weight afterwards. Under
    bfloat16 products that rounds g / rows_i where the whole batch (and the eager route, which seeds with the
    weight) rounds g / rows: a ViT's micro-batch gradient was 4.1e-3 off the whole batch's (eager: 8.7e-8)."""

    def __init__(self, flat: FlatState) -> None:
        self.flat = flat
        self.sums = [_aligned_zeros(g.grad.size, g.grad.dtype) for g in flat.groups]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sums)

    def add(self, *, first: bool) -> None:
        for group, total in zip(self.flat.groups, self.sums):
            if first:  # the sum starts as this gradient
                np.copyto(total, group.grad)
            else:
                np.add(total, group.grad, out=total)

    def finish(self) -> None:
        for group, total in zip(self.flat.groups, self.sums):
            np.add(group.grad, total, out=group.grad)


def micro_step(fused: FusedStep, chunks: list[tuple[Any, Any, float]], index: int, on_nonfinite: str
               ) -> tuple[float, float | None, bool, PlannedArena]:
    """FusedStep.step for a batch cut into `chunks` (split_batch): forward and backward on each micro-batch, its
    gradient added to the weighted sum, then one update. Returns what FusedStep.step does; the arena is the one
    with the highest high-water mark. A non-finite loss (on_nonfinite="skip") or any error updates nothing and
    leaves every .grad None: a partial sum must not pass for a step's gradients."""
    for x, y, _ in chunks[-1:] + chunks[:1]:
        # Planned (traced, perhaps laid out again) before any gradient is summed: a new layout mid-step would drop
        # the sum. The last micro-batch first: a smaller one is a signature of its own.
        fused.plan_for(x, y)
    flat, loss, biggest = fused.flat, 0.0, None
    try:
        for i, (x, y, weight) in enumerate(chunks):
            fused.loss_seed[...] = weight  # its backward gives the weighted gradient (GradAccumulator)
            # A micro-batch that weighs nothing (every target ignored) has a loss of 0 / 0 and a zero gradient:
            # run it (its dropout draws keep the routes' generators together), not checked, not counted.
            value, _, skipped, arena = fused._replay(x, y, index, on_nonfinite if weight else "continue",
                                                     update=False)
            if skipped:
                _drop_grads(flat)
                return value, None, True, arena
            if fused.flat is not flat:
                raise RuntimeError(f"step {index}: the fused route laid the parameters out again between "
                                   f"micro-batches (max_plans={fused.max_plans} evicted a plan mid-step?); "
                                   f"nothing was updated. Raise max_plans to 2 or more")
            if biggest is None or arena.stats.high_water > biggest.stats.high_water:
                biggest = arena
            loss += weight * value if weight else 0.0
            if i < len(chunks) - 1:
                fused.accumulator.add(first=i == 0)
            else:
                fused.accumulator.finish()
    except BaseException:
        _drop_grads(fused.flat)
        raise
    finally:
        fused.loss_seed[...] = 1.0  # a whole-batch step (an evaluation's, a trace's) seeds with 1
    return loss, fused.after_backward(flat.params(), index), False, biggest


def _drop_grads(flat: FlatState) -> None:
    for p in flat.params():
        p.grad = None
