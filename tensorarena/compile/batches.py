"""A batch into a fused plan's input buffers, and the second batch the captured replay's checks run on.

Every replay starts by copying the batch into the plan's persistent inputs (load_batch); targets may be a
structure of arrays, each with a buffer of its own (compile/targets.py). The captured replay's checks
(compile/captured.py, passes 2 and 4) also run the step on a second batch made from the batch
(second_batch): its values moved and changed, so that a recording which froze anything of the first batch
gives other results than the Python replay. SecondOf makes that batch where it is loaded, in the plan's own
input buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..tensor import Tensor
from . import targets as target_layout

if TYPE_CHECKING:
    from .step_plan import StepPlan

def _data(x: Any) -> np.ndarray | None:
    return None if x is None else (x.data if isinstance(x, Tensor) else np.asarray(x))


class SecondOf:
    """The second batch of `a` (second_batch), made where it is loaded: into the plan's own input buffer, so
    the checking passes need no batch-sized copy beside it (4.8 MB for ViT-Tiny's batch of 8 images, which
    took step 1's RSS peak 2.5% over memory_report()'s prediction)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def into(self, out: np.ndarray) -> None:
        second_batch(self.a, out=out)


def load_batch(plan: "StepPlan", x: Any, y: Any) -> None:
    """Copy a batch (arrays or Tensors, or SecondOf one) into the plan's persistent inputs, as every replay
    starts. Targets may be a structure of arrays (compile/targets.py): each array goes to its own buffer."""
    _load(x, [plan.inputs], whole=True)
    if plan.target_buffers:
        _load(y, plan.target_buffers, whole=False)


def _load(value: Any, buffers: list[np.ndarray], *, whole: bool) -> None:
    second = isinstance(value, SecondOf)
    source = value.a if second else value
    if whole or isinstance(source, np.ndarray):
        leaves = [source]
    else:
        leaves = target_layout.flatten(source)[1]
    for leaf, buffer in zip(leaves, buffers, strict=True):
        if second:
            second_batch(np.asarray(leaf), out=buffer)
        else:
            np.copyto(buffer, _data(leaf))


def second_batch(a: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """The checking passes' second batch B, made from the batch A: its values moved and changed.

    Rolling alone keeps every statistic that ignores order (a mean, a std, how many ids are padding or
    targets ignored), so a number the step computed from one of them would have been frozen into the
    recording unseen; the change of values moves them (test_captured_replay shows a std).
    - Floats and 1-D integers: rolled by one along the last axis, so every value moves; floats then scaled
      and shifted (x 1.5 + 0.25), integers with their smallest and largest values swapped.
    - Floats that all lie in [0, 1] (probabilities, binary targets, pixels) stay there: x 0.5 + 0.5 instead,
      into [0.5, 1]. binary_cross_entropy rightly refuses a target or input outside [0, 1], and the second
      batch would otherwise take every BCELoss with targets from the batch off the captured replay. The mean
      and the spread still move (every affine map of [0, 1] into itself keeps some mean: this one only a batch
      of ones, which rolled equals itself, and is then no check, said so).
    - Integers of 2 or more dimensions: rolled by one along the batch axis (0), and at every position
      along the other axes the smallest and largest values over the batch swapped. Such an input may pack
      columns that index different tables (token ids up to 30000 beside type ids 0..1, on the last axis
      or a middle one, as (B, 2, T) ids and mask): moved across them, a value would index past the
      smaller table, and the capture be refused for nothing (tests/test_captured_second_batch.py). With
      a batch of two rows the roll and the swap undo each other, so the swap alone is tried next; if B
      still equals A (a batch of one row, constant positions), B is made as for 1-D integers (over the
      whole array) instead, so the check is not weakened.
    `out`: written there (and returned), cast to its dtype; floats are then moved and changed in out's
    dtype with no temporary of their size.
    """
    if out is not None and a.dtype.kind == "f" and out.dtype.kind == "f":
        scale, shift = _float_change(a)  # read from a, before out (which may be a's own buffer) is written
        if a.ndim:
            out[..., 1:] = a[..., :-1]  # np.roll(a, 1, axis=-1), into out
            out[..., :1] = a[..., -1:]
        else:
            out[...] = a
        out *= out.dtype.type(scale)
        out += out.dtype.type(shift)
        return out
    if out is not None:
        np.copyto(out, second_batch(a))
        return out
    if a.dtype.kind in "iu" and a.ndim >= 2 and a.size:
        for rolled in (True, False):
            # One copy, the rest in place (a batch-sized temporary stays in the heap's RSS after it is freed).
            b = np.roll(a, 1, axis=0) if rolled else a.copy()
            low, high = b.min(axis=0), b.max(axis=0)  # each position's own smallest and largest, over the batch
            was_low = b == low
            np.copyto(b, low, where=b == high)  # low and high broadcast over the batch axis
            np.copyto(b, high, where=was_low)
            if not np.array_equal(b, a):
                return b
    b = np.roll(a, 1, axis=-1) if a.ndim else a.copy()  # the copy; the rest in place, as above
    if b.dtype.kind == "f":
        scale, shift = _float_change(a)
        b *= b.dtype.type(scale)
        b += b.dtype.type(shift)
    elif b.dtype.kind in "iu" and b.size:
        low, high = b.min(), b.max()  # both in range for whatever reads them: ids, classes, ignore_index
        was_low = b == low
        b[b == high] = low
        b[was_low] = high
    return b


def _float_change(a: np.ndarray) -> tuple[float, float]:
    """second_batch's (scale, shift) for floats: x 0.5 + 0.5 keeps values of [0, 1] there (a loss's domain:
    binary_cross_entropy's), x 1.5 + 0.25 moves any other (NaN among them) further."""
    within = a.size and 0 <= a.min() and a.max() <= 1  # min and max are NaN if any value is: False
    return (0.5, 0.5) if within else (1.5, 0.25)
