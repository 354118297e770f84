"""Micro-batches on the streaming route: what each stage reads of them, and its gradients summed over them.

sweep.py's module docstring says how a streamed step runs micro-batches (StreamingRoute(micro_batch=m)); the cut
itself (rows, targets, weights) is compile/micro_batches.split_batch's, as on the eager and fused routes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..compile.micro_batches import split_batch
from ..tensor import Tensor


class Cut(NamedTuple):
    """One micro-batch of a streamed step: its rows of the batch, its targets and its weight (rows_i / rows, or its
    share of the counted targets: compile/loss_shares.py)."""

    rows: slice
    targets: Any
    weight: float


WHOLE = slice(None)


def micro_batch_cuts(micro_batch: int | None, inputs: Any, targets: Any, loss_fn: Any = None) -> list[Cut]:
    """The step's micro-batches (compile/micro_batches.split_batch cuts the targets and weighs them, by rows or by
    `loss_fn`'s counted targets); one Cut of every row, the targets as given, without micro_batch or for a batch of
    no more rows."""
    chunks = split_batch(inputs, targets, micro_batch, loss_fn)
    if len(chunks) == 1:
        return [Cut(WHOLE, targets, 1.0)]
    cuts, start = [], 0
    for x, y, weight in chunks:
        cuts.append(Cut(slice(start, start + len(x)), y, weight))
        start += len(x)
    return cuts


def _rows_of(value: Any, rows: slice, batch_rows: int) -> Any:
    """A side input's rows for one micro-batch: an array with the batch's rows first is cut, anything else (a
    constant, None) goes whole, as a constant in the targets does."""
    if rows is WHOLE or not isinstance(value, np.ndarray) or value.shape[:1] != (batch_rows,):
        return value
    return value[rows]


class Feed:
    """What stage k reads for micro-batch i: its rows of the stage's input, and of the side inputs. Micro-batches fill
    their rows of whole-batch boundary activations, so every stage must keep the batch's rows first: checked here,
    naming the stage (a (1, ...) output would otherwise be broadcast over the rows without a word)."""

    def __init__(self, first: Tensor, side: dict | None, cuts: list[Cut]) -> None:
        self.first, self.cuts = first, cuts
        self.whole = len(cuts) == 1
        self.batch_rows = cuts[-1].rows.stop
        if not self.whole and first.shape[:1] != (self.batch_rows,):
            raise ValueError(f"micro-batches cut stage 0's input along its first dimension, but it has shape "
                             f"{first.shape} for a batch of {self.batch_rows} rows (model.stream_inputs); train "
                             f"this model without micro_batch")
        self.sides = [side] if self.whole or side is None else \
            [{key: _rows_of(v, cut.rows, self.batch_rows) for key, v in side.items()} for cut in cuts]

    def side(self, i: int) -> dict | None:
        return self.sides[0] if len(self.sides) == 1 else self.sides[i]

    def input(self, k: int, acts: list, i: int) -> Tensor:
        """Stage k's input for micro-batch i, outside a gradient (the forward pass, and stage 0 in the sweeps)."""
        if k == 0:
            return self.first if self.whole else Tensor(self.first.data[self.cuts[i].rows])
        return Tensor(acts[k] if self.whole else acts[k][self.cuts[i].rows])

    def whole_shape(self, shape: tuple) -> tuple:
        """The shape of a stage's kept output for the whole batch, from its first micro-batch's `shape`."""
        return shape if self.whole else (self.batch_rows,) + tuple(shape[1:])  # check_rows then checks the rows

    def check_rows(self, name: str, y: np.ndarray, i: int, whole: tuple) -> np.ndarray:
        """y, checked to be micro-batch i's rows of an array of the whole batch's shape `whole`."""
        shape, rows = y.shape, self.cuts[i].rows
        if not self.whole and shape != (rows.stop - rows.start,) + tuple(whole[1:]):
            raise ValueError(f"stage {name!r} returned shape {shape} for micro-batch {i + 1} of {len(self.cuts)} "
                             f"({rows.stop - rows.start} rows of {self.batch_rows}): micro-batches on the streaming "
                             f"route need every stage to keep the batch's rows first, the rest of its shape the same "
                             f"for every micro-batch; train this model without micro_batch")
        return y


class GradSums:
    """A stage's parameter gradients summed over the micro-batches. Each micro-batch's backward starts with .grad
    None, so that it writes its gradients where a whole batch's backward would, in place (autograd's direct leaf
    writes; adding into an existing .grad would first make each one in the stage arena, beyond the traced plan):
    the first one's into the sum itself, each later one's into the route's gradient buffer, then added."""

    def __init__(self, params: tuple, scratch: list[np.ndarray], sums: list[np.ndarray]) -> None:
        self.params, self.scratch, self.sums = params, scratch, sums
        self.summed = [False] * len(params)

    def before(self) -> None:
        """Before a micro-batch's backward: each .grad None, its buffer the sum until it holds one, then the scratch."""
        for p, g, total, summed in zip(self.params, self.scratch, self.sums, self.summed):
            p.grad, p._grad_buffer = None, (g if summed else total)

    def after(self) -> None:
        """After a micro-batch's backward: its gradients are in the sum."""
        for j, (p, total) in enumerate(zip(self.params, self.sums)):
            if p.grad is None:
                continue
            if not self.summed[j]:
                if not np.may_share_memory(p.grad, total):  # bounds only: cheap
                    np.copyto(total, p.grad)
                self.summed[j] = True
            else:
                np.add(total, p.grad, out=total)

    def finish(self) -> None:
        """Each parameter's .grad is its sum (None if no micro-batch gave it one), for the update or the norm."""
        for p, total, summed in zip(self.params, self.sums, self.summed):
            p.grad = None
            if summed:
                p.grad, p._grad_buffer = total, total
