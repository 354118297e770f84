"""What each piece of a batch weighs in tensorarena's class-index losses: the weights of micro-batches and of
evaluate()'s batches.

cross_entropy and nll_loss (and nn.CrossEntropyLoss / nn.NLLLoss) with reduction="mean" divide by the targets they
count, those not `ignore_index` (with a class weight: the sum of the counted targets' weights), not by the rows.
The whole batch's mean is then sum_i count_i * mean_i / sum_i count_i: a piece weighs count_i / count, and a piece
with nothing counted (every target ignored) has a mean of 0 / 0 = NaN that weighs nothing (its gradient is zero).
Weighing pieces by rows instead gave another update than the whole batch, and a NaN loss for such a piece stopped
a batch that trains whole. reduction="sum" adds up: every piece weighs 1.

tensorarena's pointwise losses (mse, l1, smooth_l1, huber, binary cross-entropy with or without logits; their
modules and their functions) with reduction="sum" add up too: every piece weighs 1 (weighed by rows, a batch of
two micro-batches had half its loss and another update). With "mean" they average over elements, which rows
weigh exactly (each row has as many).

Any other loss function (a user's own, one wrapping these) gets None: its pieces are weighed by rows, which is
exact for a mean over rows.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..tensor import Tensor


def _class_index_loss(loss_fn: Any) -> tuple[int, np.ndarray | None, str] | None:
    """(ignore_index, class weight, reduction) of one of tensorarena's class-index losses, or None for any other."""
    from ..nn.layers import CrossEntropyLoss, NLLLoss
    from ..ops.loss import cross_entropy
    from ..ops.nll import nll_loss

    if type(loss_fn) in (CrossEntropyLoss, NLLLoss):  # exactly these: a subclass may average otherwise
        weight = loss_fn.weight
        return (loss_fn.ignore_index, None if weight is None else np.asarray(getattr(weight, "data", weight)),
                loss_fn.reduction)
    unwrapped = _unwrapped(loss_fn)
    if unwrapped is None:
        return None
    fn, keywords = unwrapped
    if fn is not cross_entropy and fn is not nll_loss:
        return None
    weight = keywords.get("weight")  # both take one (cross_entropy's as nll_loss of log_softmax)
    return (keywords.get("ignore_index", -100), None if weight is None else np.asarray(getattr(weight, "data", weight)),
            keywords.get("reduction", "mean"))


def _unwrapped(loss_fn: Any) -> tuple[Any, dict[str, Any]] | None:
    """(function, keywords) of a loss function or a functools.partial of one with keywords only; None else."""
    if isinstance(loss_fn, functools.partial):  # nested partials are flattened by functools itself
        return None if loss_fn.args else (loss_fn.func, dict(loss_fn.keywords))
    return loss_fn, {}


def _pointwise_reduction(loss_fn: Any) -> str | None:
    """The reduction of one of tensorarena's pointwise losses (a module, or a function with its keywords), or None
    for any other loss."""
    from ..nn import layers
    from ..ops import bce, loss, regression

    modules = (layers.MSELoss, layers.L1Loss, layers.SmoothL1Loss, layers.HuberLoss, layers.BCELoss,
               layers.BCEWithLogitsLoss)
    if type(loss_fn) in modules:  # exactly these: a subclass may reduce otherwise
        return loss_fn.reduction
    unwrapped = _unwrapped(loss_fn)
    functions = (loss.mse_loss, regression.l1_loss, regression.smooth_l1_loss, regression.huber_loss,
                 bce.binary_cross_entropy, bce.binary_cross_entropy_with_logits)
    if unwrapped is None or not any(unwrapped[0] is f for f in functions):
        return None
    return unwrapped[1].get("reduction", "mean")


def piece_shares(loss_fn: Any, targets: list[Any]) -> list[float] | None:
    """Each piece's weight in the whole batch's loss, for pieces with these `targets`, when `loss_fn` is one of
    tensorarena's class-index losses; None for any other loss (or targets it would refuse: it says why)."""
    if _pointwise_reduction(loss_fn) == "sum":
        return [1.0] * len(targets)
    known = _class_index_loss(loss_fn)
    if known is None:
        return None
    ignore_index, weight, reduction = known
    if reduction == "sum":
        return [1.0] * len(targets)
    if reduction != "mean":
        return None
    counts = []
    for t in targets:
        t = t.data if isinstance(t, Tensor) else t
        if not isinstance(t, np.ndarray) or t.dtype.kind not in "iu":
            return None
        kept = t[t != ignore_index]
        if weight is None:
            counts.append(float(kept.size))
        elif kept.size and (kept.min() < 0 or kept.max() >= weight.shape[0]):
            return None  # the loss names the bad target itself
        else:
            counts.append(float(weight[kept].sum(dtype=np.float64)))
    total = sum(counts)
    if total == 0:  # nothing counted in the whole batch: its loss is NaN, whatever the pieces weigh
        return None
    return [count / total for count in counts]


def counted(loss_fn: Any, labels: np.ndarray) -> np.ndarray | None:
    """Which labels a class-index `loss_fn` counts (not its ignore_index), for an accuracy; None for other losses."""
    known = _class_index_loss(loss_fn)
    return None if known is None else labels != known[0]
