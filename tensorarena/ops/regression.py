"""Regression losses beside mse_loss: l1_loss, smooth_l1_loss and huber_loss, with torch's values and gradients.

As mse_loss here, input and target must have the same shape: torch broadcasts different shapes with a warning,
which is nearly always an (N, 1) against (N,) bug. Each loss is one elementwise function of d = input - target
and its derivative; the target gets the negated gradient. All array work runs in tape.host calls.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, new
from .loss import _check_reduction, difference_loss_dtype, input_and_target_grads, target_tensor
from .loss_weight import weighted_loss


def l1_loss(input: Tensor, target, reduction: str = "mean", weight=None) -> Tensor:  # noqa: A002 - torch's name
    """|input - target| (torch's F.l1_loss); the gradient at a zero difference is 0, as torch's sign. An
    elementwise `weight` makes "mean" sum(weight * loss) / sum(weight), as torch 2.13's (loss_weight.py)."""
    if weight is not None:
        _check_reduction(reduction, "l1_loss")
        return weighted_loss(l1_loss(input, target, "none"), weight, reduction, "l1_loss")
    return _pointwise_loss(input, target, reduction, "l1_loss", _l1, _l1_grad, None)


def smooth_l1_loss(input: Tensor, target, reduction: str = "mean", beta: float = 1.0) -> Tensor:  # noqa: A002
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (torch's F.smooth_l1_loss); beta 0 is l1_loss."""
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    if beta == 0:  # torch's own branch: the quadratic part has no width
        return l1_loss(input, target, reduction)
    return _pointwise_loss(input, target, reduction, "smooth_l1_loss", _smooth_l1, _smooth_l1_grad, float(beta))


def huber_loss(input: Tensor, target, reduction: str = "mean", delta: float = 1.0, weight=None  # noqa: A002
               ) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta) (torch's F.huber_loss): smooth_l1 times delta.
    An elementwise `weight` makes "mean" the mean of weight * loss, as torch 2.13's (loss_weight.py)."""
    if not delta > 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    if weight is not None:
        _check_reduction(reduction, "huber_loss")
        return weighted_loss(huber_loss(input, target, "none", delta), weight, reduction, "huber_loss")
    return _pointwise_loss(input, target, reduction, "huber_loss", _huber, _huber_grad, float(delta))


def _pointwise_loss(input, target, reduction: str, what: str, fn, grad_fn, param) -> Tensor:
    _check_reduction(reduction, what)
    x = as_tensor(input)
    y = target_tensor(target, x)
    xd, yd = x.data, y.data
    if xd.shape != yd.shape:
        raise ValueError(f"{what}: input shape {xd.shape} and target shape {yd.shape} differ; reshape one "
                         f"explicitly (implicit broadcasting here usually hides a bug)")
    dtype = difference_loss_dtype(what, xd, yd)
    diff = new(xd.shape, dtype)  # kept for backward
    out = new(diff.shape if reduction == "none" else (), dtype)
    losses = out if reduction == "none" else new(diff.shape, dtype)
    host(_forward, fn, param, xd, yd, diff, losses, out, reduction)

    def backward(g):
        base = new(diff.shape, dtype)
        host(_backward, grad_fn, param, diff, g, reduction, base)
        return input_and_target_grads(base, x, y)

    return Tensor._make(out, (x, y), backward, saved=(x, y))


def _forward(fn, param, xd, yd, diff, losses, out, reduction) -> None:
    np.subtract(xd, yd, out=diff)
    fn(diff, param, losses)
    if reduction != "none":
        np.sum(losses, out=out)
        if reduction == "mean":
            with np.errstate(invalid="ignore"):  # no elements: nan, as torch
                out /= diff.size


def _backward(grad_fn, param, diff, g, reduction, base) -> None:
    grad_fn(diff, param, base)
    if reduction == "mean":
        base *= g / diff.size if diff.size else 0
    else:
        base *= g


def _l1(d, _param, out) -> None:
    np.abs(d, out=out)


def _l1_grad(d, _param, out) -> None:
    np.sign(d, out=out)


def _smooth_l1(d, beta, out) -> None:
    a = np.abs(d)
    np.copyto(out, np.where(a < beta, 0.5 * d * d / beta, a - 0.5 * beta))


def _smooth_l1_grad(d, beta, out) -> None:
    # torch: -1 at d <= -beta, 1 at d >= beta, d / beta between (continuous, so ties need no rule)
    np.copyto(out, np.clip(d / beta, -1, 1))


def _huber(d, delta, out) -> None:
    a = np.abs(d)
    np.copyto(out, np.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta)))


def _huber_grad(d, delta, out) -> None:
    np.copyto(out, np.clip(d, -delta, delta))
