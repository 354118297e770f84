"""Losses: cross_entropy (ignore_index, label_smoothing) and mse_loss."""

from __future__ import annotations

import numpy as np

from ..kernels import kernel
from ..tape import host
from ..tensor import Tensor
from ._base import as_dtype, as_tensor, contiguous, new, promote_types

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, what: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{what}: reduction must be one of {', '.join(map(repr, _REDUCTIONS))}, "
                         f"got {reduction!r}")


def cross_entropy(input: Tensor, target, weight=None, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> Tensor:
    """torch.nn.functional.cross_entropy for class-index targets. Shape: (N, C) or (N, C, d...) and (N,) / (N, d...).

    Also (C,) logits with a 0-d target. loss = (1-eps) * nll + eps * mean_c(-log p_c) per position;
    positions whose target is `ignore_index` count neither in the loss nor in the mean's
    denominator ("mean" over no positions is nan, as in torch, with zero gradient).

    A class `weight` (C,) is torch's: nll_loss of log_softmax over the class dim, weighted ("mean" divides by the
    counted targets' weights), its label smoothing spread over the classes by weight (nll.smoothed_nll_loss).
    """
    _check_reduction(reduction, "cross_entropy")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if weight is not None:  # the kernels have no weight: torch's definition on log_softmax
        from .nll import smoothed_nll_loss
        from .reduce import log_softmax

        input = as_tensor(input)
        if input.dtype.kind != "f":
            raise TypeError(f"cross_entropy: logits must be floating point, got dtype {input.dtype}")
        log_p = log_softmax(input, 1 if input.ndim >= 2 else 0)
        return smoothed_nll_loss(log_p, target, weight, ignore_index, reduction, label_smoothing, "cross_entropy")
    input = as_tensor(input)
    x = input.data
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
    num_classes = x.shape[1] if x.ndim >= 2 else x.shape[0]
    if num_classes == 0:  # torch: "Target 0 is out of bounds"; NumPy would fail reshaping to (-1, 0)
        raise IndexError(f"cross_entropy: logits of shape {x.shape} have 0 classes, so no target is in range; the "
                         f"class dim (dim 1, or dim 0 for unbatched logits) must not be empty")
    # The kernels take (rows, C) logits and (rows,) int64 targets: (N, C, d...) moves C last and
    # flattens to (N*d..., C), whose rows are the target's positions in C order; (C,) is one row.
    if x.ndim > 2:
        rows = contiguous(np.moveaxis(x, 1, -1)).reshape(-1, num_classes)  # (N*d..., C)
    else:
        rows = contiguous(x).reshape(-1, num_classes)  # (N, C) or (1, C)
    tgt = contiguous(t, np.int64).reshape(-1)  # (rows,); the kernels check the class range
    dtype = x.dtype
    losses = new(tgt.shape, dtype)  # per-position loss, 0 where ignored
    lse = new(tgt.shape, np.float64)  # log_total, kept for backward (kernels/cross_entropy.py): unrounded
    count = new((), np.int64)  # targets not ignored: read again by backward, in an array (see below)
    out = losses.reshape(t.shape) if reduction == "none" else new((), dtype)
    # One call (tape.host) for the kernel and the reduction, and one for backward: the count and g are
    # read inside them, so a captured step (compile/captured.py) recomputes them on every replay.
    host(_cross_entropy_forward, rows, tgt, ignore_index, label_smoothing, losses, lse, count, out, reduction)

    def backward(g):
        drows = new(rows.shape, dtype)
        host(_cross_entropy_backward, rows, tgt, lse, ignore_index, label_smoothing, g, count, reduction, drows)
        if x.ndim <= 2:
            return (drows.reshape(x.shape),)
        gx = new(x.shape, dtype)
        host(np.copyto, gx, np.moveaxis(drows.reshape(t.shape + (num_classes,)), -1, 1))
        return (gx,)

    # Backward reads the logits (rows: a view of them, or a copy) and the target. torch saves log_softmax's
    # output, not the logits, so a write to the logits is refused here only: this backward would read it.
    return Tensor._make(out, (input,), backward, saved=(input, target if isinstance(target, Tensor) else None))


def _cross_entropy_forward(rows, tgt, ignore_index, label_smoothing, losses, lse, count, out, reduction) -> None:
    count[...] = kernel("cross_entropy_forward")(rows, tgt, ignore_index, label_smoothing, losses, lse)
    if reduction != "none":
        np.sum(losses, out=out)
        if reduction == "mean":
            if count:
                out /= int(count)  # a Python int, as the kernel returns it: float32 arithmetic
            else:
                out.fill(np.nan)


def _cross_entropy_backward(rows, tgt, lse, ignore_index, label_smoothing, g, count, reduction, drows) -> None:
    # d loss_i / d x_ic = w_i (softmax_ic - q_ic), q = (1-eps) onehot + eps / C; the kernel takes a
    # scalar w (sum: g, mean: g / count) and zeroes ignored rows; "none" scales rows afterwards.
    n = int(count)
    if reduction == "none":
        scale = 1.0
    elif reduction == "sum":
        scale = float(g)
    else:
        scale = float(g) / n if n else 0.0
    kernel("cross_entropy_backward")(rows, tgt, lse, ignore_index, label_smoothing, scale, drows)
    if reduction == "none":
        with np.errstate(under="ignore"):  # a tiny probability times g may round to 0: right, not an error
            drows *= g.reshape(-1, 1)


def difference_loss_dtype(what: str, xd: np.ndarray, yd: np.ndarray) -> np.dtype:
    """The dtype of a loss of (input - target), as torch's: promoted, so a float32 input with an integer target stays
    float32 (NumPy's result_type made it float64); an integer or bool pair is refused (torch has no such kernel)."""
    dtype = promote_types(xd.dtype, yd.dtype)
    if dtype.kind != "f":
        raise TypeError(f"{what}: needs floating-point input or target, got {xd.dtype} and {yd.dtype}; cast the "
                        f"input to a float dtype (e.g. .float())")
    return dtype


def input_and_target_grads(base: np.ndarray, x: Tensor, y: Tensor) -> tuple:
    """The gradients of a loss of (input - target) given d/d input (`base`): input's is `base`, target's its
    negation, each in its own tensor's dtype, None where that tensor needs none."""
    gx = gy = None
    if y.requires_grad:
        gy = new(base.shape, base.dtype)
        host(np.negative, base, out=gy)
        gy = as_dtype(gy, y.data.dtype)
    if x.requires_grad:
        gx = as_dtype(base, x.data.dtype)
    return gx, gy


def target_tensor(target, x: Tensor) -> Tensor:
    """`target` as a Tensor: a Tensor as it is, data (an array, a list) in `x`'s dtype. The cast goes through
    as_dtype's recorded copy into the step's memory: a float64 target array (NumPy's default) cast on the heap
    was an array made outside a fused plan's buffers, which the captured replay cannot refresh, so every such
    step fell back to the Python replay."""
    if isinstance(target, Tensor):
        return target
    return Tensor(as_dtype(np.asarray(target), x.dtype))


def mse_loss(input: Tensor, target, reduction: str = "mean", weight=None) -> Tensor:  # noqa: A002 - torch's name
    """Mean squared error between equally shaped `input` and `target` (a Tensor, or data cast to input's dtype).

    torch broadcasts different shapes with a warning; that is almost always a bug
    (e.g. (N, 1) vs (N,)), so here it is a ValueError. An elementwise `weight` makes "mean"
    sum(weight * loss) / sum(weight), as torch 2.13's (loss_weight.py).
    """
    _check_reduction(reduction, "mse_loss")
    if weight is not None:  # torch's definition on the unweighted losses
        from .loss_weight import weighted_loss

        return weighted_loss(mse_loss(input, target, "none"), weight, reduction, "mse_loss")
    x = as_tensor(input)
    y = target_tensor(target, x)
    xd, yd = x.data, y.data
    if xd.shape != yd.shape:
        raise ValueError(f"mse_loss: input shape {xd.shape} and target shape {yd.shape} differ; reshape one "
                         f"explicitly (implicit broadcasting here usually hides a bug)")
    dtype = difference_loss_dtype("mse_loss", xd, yd)
    diff = new(xd.shape, dtype)  # kept for backward
    out = new(diff.shape if reduction == "none" else (), dtype)
    host(_mse_forward, xd, yd, reduction, diff, out)

    def backward(g):
        base = new(diff.shape, dtype)  # d/d input = 2 * diff * g (/ n for mean)
        host(_mse_backward, diff, g, reduction, base)
        return input_and_target_grads(base, x, y)

    # Backward reads only diff, made here; input and target count as in torch, which saves both.
    return Tensor._make(out, (x, y), backward, saved=(x, y))


# mse_loss's NumPy work, one host call each way (as cross_entropy's): g is read inside, on every replay.

def _mse_forward(xd, yd, reduction, diff, out) -> None:
    np.subtract(xd, yd, out=diff)
    if reduction == "none":
        np.multiply(diff, diff, out=out)
        return
    flat = diff.reshape(-1)
    out[...] = np.dot(flat, flat)  # one BLAS pass, no squared temporary
    if reduction == "mean":
        if diff.size:
            out /= diff.size
        else:
            out.fill(np.nan)


def _mse_backward(diff, g, reduction, base) -> None:
    two = base.dtype.type(2)
    if reduction == "none":
        np.multiply(diff, g, out=base)
        base *= two
        return
    scale = g[()] * two
    if reduction == "mean":
        n = diff.size
        scale = scale / n if n else 0
    np.multiply(diff, base.dtype.type(scale), out=base)
