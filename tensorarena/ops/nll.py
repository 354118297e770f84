"""nll_loss: the negative log-likelihood of class-index targets given log-probabilities (torch's F.nll_loss).

loss_i = -weight[t_i] * input[i, t_i]; "mean" divides the sum by the sum of the weights of the positions that
count (not by their number), as torch's; a position whose target is `ignore_index` counts in neither. The
weight is a constant, as in torch (which has no derivative for it). The target range check, the picks and
the mean's denominator are read from the arrays inside tape.host calls, so a captured step recomputes them
for every batch.
"""

from __future__ import annotations

import numpy as np

from ..autograd import is_grad_enabled
from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, contiguous, new
from .loss import _check_reduction


def nll_loss(input: Tensor, target, weight: Tensor | None = None, ignore_index: int = -100,  # noqa: A002
             reduction: str = "mean") -> Tensor:
    """torch.nn.functional.nll_loss. Shape: input (N, C) or (N, C, d...) and target (N,) / (N, d...), or (C,)
    and a 0-d target; weight (C,) rescales each class."""
    return smoothed_nll_loss(input, target, weight, ignore_index, reduction, 0.0)


def smoothed_nll_loss(input: Tensor, target, weight: Tensor | None, ignore_index: int, reduction: str,  # noqa: A002
                      label_smoothing: float, op: str = "nll_loss") -> Tensor:
    """nll_loss with torch's label smoothing of a weighted cross-entropy, on log-probabilities: per counted
    position (1 - eps) w[t] (-input[t]) + eps / C sum_c w_c (-input[c]); "mean" divides by the counted targets'
    weights sum_i w[t_i], as without smoothing. (cross_entropy with a class weight and label_smoothing is this on
    log_softmax; its kernels have no weight.) `op` is the function the user called, which the errors name: a bad
    target of cross_entropy(weight=...) said nll_loss, which the user never called."""
    _check_reduction(reduction, op)
    x_t = as_tensor(input)
    x = x_t.data
    if x.dtype.kind != "f":
        raise TypeError(f"{op}: input must hold floating-point log-probabilities, got dtype {x.dtype}")
    t = target.data if isinstance(target, Tensor) else np.asarray(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"{op}: target must hold class indices (integers), got dtype {t.dtype}")
    expected = (x.shape[:1] + x.shape[2:]) if x.ndim >= 2 else ()
    if x.ndim == 0 or t.shape != expected:
        raise ValueError(f"{op}: target shape {t.shape} does not match input shape {x.shape}: input "
                         f"(N, C, d1, ...) needs target (N, d1, ...), here {expected}")
    num_classes = x.shape[1] if x.ndim >= 2 else x.shape[0]
    if num_classes == 0:  # torch: "Target 0 is out of bounds"; NumPy would fail reshaping to (-1, 0)
        raise IndexError(f"{op}: input of shape {x.shape} has 0 classes, so no target is in range; the "
                         f"class dim (dim 1, or dim 0 for an unbatched input) must not be empty")
    wd = _class_weight(weight, num_classes, x.dtype, op)
    # (N, C, d...) -> (N*d..., C): the rows are the target's positions in C order; (C,) is one row.
    rows = contiguous(np.moveaxis(x, 1, -1)).reshape(-1, num_classes) if x.ndim > 2 \
        else contiguous(x).reshape(-1, num_classes)
    tgt = contiguous(t, np.int64).reshape(-1)
    picked_w = new(tgt.shape, x.dtype)  # each position's weight, 0 where ignored: backward's scale
    total = new((), x.dtype)  # the sum of picked_w: the mean's denominator
    losses = new(tgt.shape, x.dtype)
    out = losses.reshape(t.shape) if reduction == "none" else new((), x.dtype)
    host(_nll_forward, rows, tgt, wd, ignore_index, picked_w, total, losses, out, reduction, label_smoothing, op)

    def backward(g):
        drows = new(rows.shape, x.dtype)
        host(_nll_backward, tgt, wd, ignore_index, picked_w, total, g, reduction, label_smoothing, drows)
        if x.ndim <= 2:
            return (drows.reshape(x.shape),)
        gx = new(x.shape, x.dtype)
        host(np.copyto, gx, np.moveaxis(drows.reshape(t.shape + (num_classes,)), -1, 1))
        return (gx,)

    # Backward reads only the target (the picks' places) and arrays made here.
    return Tensor._make(out, (x_t,), backward, saved=(target if isinstance(target, Tensor) else None,))


def _class_weight(weight, num_classes: int, dtype: np.dtype, op: str) -> np.ndarray | None:
    if weight is None:
        return None
    w = weight if isinstance(weight, Tensor) else Tensor(np.asarray(weight))
    if w.requires_grad and is_grad_enabled():  # torch: "the derivative for 'weight' is not implemented"
        raise RuntimeError(f"{op}: weight requires grad, but the loss has no gradient for its class weights "
                           "(as torch's); pass weight.detach()")
    wd = w.data
    if wd.shape != (num_classes,):
        raise ValueError(f"{op}: weight must have shape ({num_classes},), one per class, got {wd.shape}")
    if wd.dtype != dtype:
        raise TypeError(f"{op}: weight has dtype {wd.dtype} but input has {dtype}; they must be the same "
                        f"(convert the weight, e.g. weight.to(input.dtype))")
    return wd


def _nll_forward(rows, tgt, wd, ignore_index, picked_w, total, losses, out, reduction, smoothing, op) -> None:
    n, num_classes = rows.shape
    keep = tgt != ignore_index
    bad = keep & ((tgt < 0) | (tgt >= num_classes))
    if bad.any():  # torch's IndexError
        raise IndexError(f"{op}: Target {tgt[bad][0]} is out of bounds: class indices must be in "
                         f"[0, {num_classes}) or equal ignore_index={ignore_index}")
    safe = np.where(keep, tgt, 0)
    if wd is None:
        np.copyto(picked_w, keep)
    else:
        np.multiply(wd[safe], keep, out=picked_w)
    with np.errstate(invalid="ignore"):  # -inf times an ignored row's 0: zeroed below
        np.multiply(rows[np.arange(n), safe], picked_w, out=losses)
    np.negative(losses, out=losses)
    # An ignored row read at class 0 times its weight 0 is NaN where that input is -inf (a masked class): torch
    # leaves ignored rows out, so they are 0 here whatever they hold.
    np.copyto(losses, 0, where=~keep)
    if smoothing:  # (1 - eps) times that, plus eps / C of every class's weighted -input, at counted positions
        with np.errstate(invalid="ignore"):  # the ignored rows' sums, dropped next
            spread = np.where(keep, -(rows @ wd if wd is not None else rows.sum(axis=1)), 0)
        losses *= 1 - smoothing
        losses += spread * (smoothing / num_classes)
    np.sum(picked_w, out=total)
    if reduction != "none":
        np.sum(losses, out=out)
        if reduction == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):  # no weight counted: nan, as torch
                out /= total
            if not total:  # (with smoothing the sum is not 0: x / 0 would be inf, torch's is nan)
                out.fill(np.nan)


def _nll_backward(tgt, wd, ignore_index, picked_w, total, g, reduction, smoothing, drows) -> None:
    # d loss_i / d input[i, t_i] = -w_i (times g_i for "none", g / total for "mean"); every other entry is 0.
    # With smoothing: (1 - eps) of that, and -eps / C w_c s_i on every entry c of a counted row.
    drows.fill(0)
    n = tgt.shape[0]
    if reduction == "none":
        s = g.reshape(-1)
    elif reduction == "sum":
        s = g
    else:
        s = g / total if total else 0.0 * g
    drows[np.arange(n), np.where(picked_w != 0, tgt, 0)] -= picked_w * s * (1 - smoothing)
    if smoothing:
        per_row = (tgt != ignore_index) * s * (smoothing / drows.shape[1])  # (n,), 0 at ignored rows
        drows -= per_row[:, None] * (wd if wd is not None else 1)
