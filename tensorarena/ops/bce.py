"""Binary cross-entropy on probabilities and on logits (torch's F.binary_cross_entropy and
F.binary_cross_entropy_with_logits), with torch's formulas, clamps and gradients (the target's too).

On probabilities torch clamps each log at -100, so a probability of exactly 0 or 1 gives a finite loss, and
divides the input's gradient by max(x (1 - x), 1e-12). On logits the loss is formed from log1p(exp(-|x|)) +
max(-x, 0), which never overflows: the numerically stable form. `weight` (broadcast to the input) and
`pos_weight` (broadcast along the last dim, one per class) are constants, as in torch, which has no
derivative for them. Every array read (the range checks included) happens inside a tape.host call, so a
captured fused step redoes it for every batch.
"""

from __future__ import annotations

import numpy as np

from ..autograd import is_grad_enabled
from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, new
from .loss import _check_reduction, target_tensor

_EPS = np.float32(1e-12)  # torch's floor under x (1 - x) in the probability form's gradient: a C float, also
# for float64 inputs (9.9999999600e-13 then)


def binary_cross_entropy(input: Tensor, target, weight=None, reduction: str = "mean") -> Tensor:  # noqa: A002
    """-w (y log x + (1 - y) log(1 - x)) elementwise, each log clamped at -100 (torch's F.binary_cross_entropy).
    input holds probabilities in [0, 1]; target has input's shape."""
    x, y, wd = _operands(input, target, weight, reduction, "binary_cross_entropy")
    xd, yd = x.data, y.data
    out = new(xd.shape if reduction == "none" else (), xd.dtype)
    losses = out if reduction == "none" else new(xd.shape, xd.dtype)
    host(_bce_forward, xd, yd, wd, losses, out, reduction)
    wants_x, wants_y = x.requires_grad, y.requires_grad

    def backward(g):
        gx = gy = None
        if wants_x:
            gx = new(xd.shape, xd.dtype)
            host(_bce_grad_input, xd, yd, wd, g, reduction, gx)
        if wants_y:
            gy = new(xd.shape, xd.dtype)
            host(_bce_grad_target, xd, wd, g, reduction, gy)
        return gx, gy

    return Tensor._make(out, (x, y), backward, saved=(x, y))


def binary_cross_entropy_with_logits(input: Tensor, target, weight=None, reduction: str = "mean",  # noqa: A002
                                     pos_weight=None) -> Tensor:
    """BCE of sigmoid(input) against target, computed stably from the logits (torch's
    F.binary_cross_entropy_with_logits); pos_weight (C,) weighs the positive term of each class (last dim)."""
    x, y, wd = _operands(input, target, weight, reduction, "binary_cross_entropy_with_logits")
    xd, yd = x.data, y.data
    pw = _constant_operand(pos_weight, xd, "pos_weight", "binary_cross_entropy_with_logits")
    out = new(xd.shape if reduction == "none" else (), xd.dtype)
    losses = out if reduction == "none" else new(xd.shape, xd.dtype)
    host(_logits_forward, xd, yd, wd, pw, losses, out, reduction)
    wants_x, wants_y = x.requires_grad, y.requires_grad

    def backward(g):
        gx = gy = None
        if wants_x:
            gx = new(xd.shape, xd.dtype)
            host(_logits_grad_input, xd, yd, wd, pw, g, reduction, gx)
        if wants_y:
            gy = new(xd.shape, xd.dtype)
            host(_logits_grad_target, xd, wd, pw, g, reduction, gy)
        return gx, gy

    return Tensor._make(out, (x, y), backward, saved=(x, y))


def _operands(input, target, weight, reduction: str, what: str):
    _check_reduction(reduction, what)
    x = as_tensor(input)
    if x.dtype.kind != "f":
        raise TypeError(f"{what}: input must be floating point, got dtype {x.dtype}")
    y = target_tensor(target, x)
    if y.shape != x.shape:  # torch's ValueError: broadcasting here is nearly always an (N, 1) vs (N,) bug
        raise ValueError(f"{what}: target size {y.shape} must be the same as input size {x.shape}; reshape one "
                         f"explicitly")
    if y.dtype != x.dtype:
        raise TypeError(f"{what}: target has dtype {y.dtype} but input has {x.dtype}; they must be the same "
                        f"(a float target of 0s and 1s: target.to(input.dtype))")
    return x, y, _constant_operand(weight, x.data, "weight", what)


def _constant_operand(w, xd: np.ndarray, name: str, what: str) -> np.ndarray | None:
    if w is None:
        return None
    w = w if isinstance(w, Tensor) else Tensor(np.asarray(w), dtype=xd.dtype)
    if w.requires_grad and is_grad_enabled():
        raise RuntimeError(f"{what}: {name} requires grad, but the loss has no gradient for it (as torch's); "
                           f"pass {name}.detach()")
    wd = w.data
    try:
        fits = np.broadcast_shapes(wd.shape, xd.shape) == xd.shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{what}: {name} of shape {wd.shape} does not broadcast to the input's shape {xd.shape}")
    if wd.dtype != xd.dtype:
        raise TypeError(f"{what}: {name} has dtype {wd.dtype} but input has {xd.dtype}; they must be the same")
    return wd


def _reduce(losses, out, reduction) -> None:
    if reduction == "none":
        return
    np.sum(losses, out=out)
    if reduction == "mean":
        with np.errstate(invalid="ignore"):  # no elements: nan, as torch
            out /= losses.size


def _scale(g, reduction, n):
    """What multiplies each element's derivative: g itself ("none"), or its one value (/ n for "mean")."""
    if reduction == "none":
        return g
    if reduction != "mean":
        return g
    # No elements: the gradient is empty, so any finite scale does (g / 0 raised under np.seterr(all="raise")).
    return g / n if n else g


def _check_range(a, name: str) -> None:
    if a.size and not ((a >= 0) & (a <= 1)).all():  # NaN fails too, as torch's check
        raise RuntimeError(f"binary_cross_entropy: all elements of {name} should be between 0 and 1 (found "
                           f"{a[~((a >= 0) & (a <= 1))].flat[0]}); for logits use binary_cross_entropy_with_logits")


# Tiny probabilities and saturated sigmoids make subnormal products (0 is the right limit), and at x = 0 or 1
# the target's gradient is infinite, times a weight of 0 NaN, as torch's: none of it is an error here.
_QUIET = np.errstate(under="ignore", invalid="ignore")


@_QUIET
def _bce_forward(xd, yd, wd, losses, out, reduction) -> None:
    _check_range(xd, "input")
    _check_range(yd, "target")
    with np.errstate(divide="ignore"):  # log(0) = -inf, then clamped at -100 as torch
        log_x = np.maximum(np.log(xd), -100)
        log_1mx = np.maximum(np.log1p(-xd), -100)
    np.multiply(yd - 1, log_1mx, out=losses)
    losses -= yd * log_x
    if wd is not None:
        losses *= wd
    _reduce(losses, out, reduction)


@_QUIET
def _bce_grad_input(xd, yd, wd, g, reduction, gx) -> None:
    # torch's order of rounding: g (x - y) / max((1 - x) x, eps), then * w, then / n for "mean"
    np.subtract(xd, yd, out=gx)
    gx *= g
    gx /= np.maximum((1 - xd) * xd, xd.dtype.type(_EPS))
    if wd is not None:
        gx *= wd
    if reduction == "mean":
        gx /= xd.size


@_QUIET
def _bce_grad_target(xd, wd, g, reduction, gy) -> None:
    # torch: -logit(x) g w, unclamped (inf at x = 0 or 1, as torch's)
    with np.errstate(divide="ignore"):
        np.log(xd, out=gy)
        gy -= np.log1p(-xd)
    np.negative(gy, out=gy)
    gy *= _scale(g, reduction, xd.size)
    if wd is not None:
        gy *= wd


def _log_sigmoid_neg(xd):
    """-log(sigmoid(x)) = log1p(exp(-|x|)) + max(-x, 0): no exp of a large positive number."""
    with np.errstate(under="ignore"):
        return np.log1p(np.exp(-np.abs(xd))) + np.maximum(-xd, 0)


def _sigmoid(xd):
    with np.errstate(under="ignore", over="ignore"):  # exp(-x) overflows to inf for very negative x: 1/inf = 0
        e = np.exp(-np.abs(xd))
        return np.where(xd >= 0, 1 / (1 + e), e / (1 + e))


@_QUIET
def _logits_forward(xd, yd, wd, pw, losses, out, reduction) -> None:
    # (1 - y) x + lw (-log sigmoid(x)), with lw = (pos_weight - 1) y + 1 (1 without pos_weight): torch's form
    soft = _log_sigmoid_neg(xd)
    if pw is not None:
        soft *= (pw - 1) * yd + 1
    np.subtract(1, yd, out=losses)
    losses *= xd
    losses += soft
    if wd is not None:
        losses *= wd
    _reduce(losses, out, reduction)


@_QUIET
def _logits_grad_input(xd, yd, wd, pw, g, reduction, gx) -> None:
    # torch: sigmoid(x) - y, or with pos_weight ((p y + 1 - y) sigmoid(x) - p y)
    s = _sigmoid(xd)
    if pw is None:
        np.subtract(s, yd, out=gx)
    else:
        py = pw * yd
        np.multiply(py + 1 - yd, s, out=gx)
        gx -= py
    gx *= _scale(g, reduction, xd.size)
    if wd is not None:
        gx *= wd


@_QUIET
def _logits_grad_target(xd, wd, pw, g, reduction, gy) -> None:
    # torch: -x, or with pos_weight log(1 - sigmoid(x)) - p log(sigmoid(x)) = -x - (p - 1) log sigmoid(x)
    np.negative(xd, out=gy)
    if pw is not None:
        gy += (pw - 1) * _log_sigmoid_neg(xd)
    gy *= _scale(g, reduction, xd.size)
    if wd is not None:
        gy *= wd
