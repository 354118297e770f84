"""Losses: cross_entropy (ignore_index, label_smoothing) and mse_loss."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._base import as_dtype, as_tensor, new

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, what: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{what}: reduction must be one of {', '.join(map(repr, _REDUCTIONS))}, "
                         f"got {reduction!r}")


def cross_entropy(logits: Tensor, target, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> Tensor:
    """torch.nn.functional.cross_entropy for class-index targets. Shape: (N, C) or (N, C, d...) and (N,) / (N, d...).

    Also (C,) logits with a 0-d target. loss = (1-eps) * nll + eps * mean_c(-log p_c) per position;
    positions whose target is `ignore_index` count neither in the loss nor in the mean's
    denominator ("mean" over no positions is nan, as in torch, with zero gradient).
    """
    _check_reduction(reduction, "cross_entropy")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    logits = as_tensor(logits)
    x = logits.data
    if x.dtype.kind != "f":
        raise TypeError(f"cross_entropy: logits must be floating point, got dtype {x.dtype}")
    t = target.data if isinstance(target, Tensor) else np.asarray(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must hold class indices, and class indices must be integers; "
                        f"got dtype {t.dtype} (probability targets are not supported)")
    expected = (x.shape[:1] + x.shape[2:]) if x.ndim >= 2 else ()
    if x.ndim == 0 or t.shape != expected:
        raise ValueError(f"cross_entropy: target shape {t.shape} does not match logits shape {x.shape}: "
                         f"logits (N, C, d1, ...) need target (N, d1, ...), here {expected}")
    cls = 1 if x.ndim >= 2 else 0  # the class axis
    num_classes = x.shape[cls]
    ignored = t == ignore_index
    bad = ~ignored & ((t < 0) | (t >= num_classes))
    if bad.any():
        raise IndexError(f"cross_entropy: target {t[bad].flat[0]} is out of bounds for {num_classes} classes "
                         f"(valid: 0..{num_classes - 1}, or ignore_index={ignore_index})")
    count = int(t.size - np.count_nonzero(ignored))
    # (N, 1, d...) so both line up with the stat buffers; ignored positions gather class 0, weighted 0.
    picks = np.expand_dims(np.where(ignored, 0, t), cls)
    ignored = np.expand_dims(ignored, cls)
    eps = label_smoothing
    dtype = x.dtype
    stat_shape = x.shape[:cls] + (1,) + x.shape[cls + 1 :]

    # Stable log-softmax with one full-size buffer: z = x - max, then exp(z) in place -> softmax.
    probs = new(x.shape, dtype)  # kept for backward
    lse = new(stat_shape, dtype)
    np.max(x, axis=cls, keepdims=True, out=lse)
    np.subtract(x, lse, out=probs)
    loss = new(stat_shape, dtype)  # per-position loss
    np.copyto(loss, np.take_along_axis(probs, picks, axis=cls))  # z at the target
    if eps:
        zsum = new(stat_shape, dtype)
        np.sum(probs, axis=cls, keepdims=True, out=zsum)
    with np.errstate(under="ignore"):  # exp of very negative logits is 0, not an error
        np.exp(probs, out=probs)
        np.sum(probs, axis=cls, keepdims=True, out=lse)
        probs /= lse
    np.log(lse, out=lse)  # log-sum-exp of z
    np.subtract(lse, loss, out=loss)  # nll = lse - z_t
    if eps:
        # mean_c(-log p_c) = lse - mean_c(z_c)
        zsum /= dtype.type(num_classes)
        np.subtract(lse, zsum, out=zsum)
        loss *= dtype.type(1.0 - eps)
        zsum *= dtype.type(eps)
        loss += zsum
    np.copyto(loss, 0, where=ignored)

    if reduction == "none":
        out = loss.reshape(t.shape)
    else:
        out = new((), dtype)
        np.sum(loss, out=out)
        if reduction == "mean":
            if count:
                out /= count
            else:
                out.fill(np.nan)

    def backward(g):
        # d loss_i / d x_ic = (softmax_ic - q_ic) with q = (1-eps) * onehot + eps / C, times the weight of i
        w = new(stat_shape, dtype)
        if reduction == "none":
            np.copyto(w, g.reshape(stat_shape))
        elif reduction == "sum":
            w.fill(g[()])
        else:
            w.fill(g[()] / count if count else 0)
        np.copyto(w, 0, where=ignored)
        gx = new(x.shape, dtype)
        np.multiply(probs, w, out=gx)
        if eps:
            smooth = new(stat_shape, dtype)
            np.multiply(w, dtype.type(eps / num_classes), out=smooth)
            gx -= smooth
        at_target = np.take_along_axis(gx, picks, axis=cls)
        w *= dtype.type(1.0 - eps)
        at_target -= w
        np.put_along_axis(gx, picks, at_target, axis=cls)
        return (gx,)

    return Tensor._make(out, (logits,), backward)


def mse_loss(input: Tensor, target, reduction: str = "mean") -> Tensor:  # noqa: A002 - torch's name
    """Mean squared error between equally shaped `input` and `target` (a Tensor, or data cast to input's dtype).

    torch broadcasts different shapes with a warning; that is almost always a bug
    (e.g. (N, 1) vs (N,)), so here it is a ValueError.
    """
    _check_reduction(reduction, "mse_loss")
    x = as_tensor(input)
    y = target if isinstance(target, Tensor) else Tensor(np.asarray(target), dtype=x.dtype)
    xd, yd = x.data, y.data
    if xd.shape != yd.shape:
        raise ValueError(f"mse_loss: input shape {xd.shape} and target shape {yd.shape} differ; reshape one "
                         f"explicitly (implicit broadcasting here usually hides a bug)")
    dtype = np.result_type(xd.dtype, yd.dtype)
    diff = new(xd.shape, dtype)  # kept for backward
    np.subtract(xd, yd, out=diff)
    n = diff.size
    if reduction == "none":
        out = new(diff.shape, dtype)
        np.multiply(diff, diff, out=out)
    else:
        out = new((), dtype)
        flat = diff.reshape(-1)
        out[...] = np.dot(flat, flat)  # one BLAS pass, no squared temporary
        if reduction == "mean":
            if n:
                out /= n
            else:
                out.fill(np.nan)

    def backward(g):
        base = new(diff.shape, dtype)  # d/d input = 2 * diff * g (/ n for mean)
        if reduction == "none":
            np.multiply(diff, g, out=base)
            base *= dtype.type(2)
        else:
            scale = g[()] * dtype.type(2)
            if reduction == "mean":
                scale = scale / n if n else 0
            np.multiply(diff, dtype.type(scale), out=base)
        gx = gy = None
        if y.requires_grad:
            gy = new(diff.shape, dtype)
            np.negative(base, out=gy)
            gy = as_dtype(gy, yd.dtype)
        if x.requires_grad:
            gx = as_dtype(base, xd.dtype)
        return gx, gy

    return Tensor._make(out, (x, y), backward)
