"""More activations, with torch's values and its choice of gradient at the kinks: silu, leaky_relu, elu, softplus,
hardtanh (and relu6, hardtanh between 0 and 6), logsigmoid, mish.

Each is an elementwise forward and backward on NumPy, one tape.host call each way, so the fused and captured
routes replay them. The backward reads the input (as torch's, except elu's, which torch may read from the
output; the values agree).
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, new_like


def silu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """x * sigmoid(x) (torch's F.silu, also called swish)."""
    return _activation(input, "silu", inplace, _silu, _silu_grad, None)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:  # noqa: A002
    """x where x > 0, else negative_slope * x; at 0 the gradient is negative_slope, as torch's."""
    return _activation(input, "leaky_relu", inplace, _leaky, _leaky_grad, float(negative_slope))


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """x where x > 0, else alpha (exp(x) - 1); at 0 the gradient is alpha, as torch's."""
    return _activation(input, "elu", inplace, _elu, _elu_grad, float(alpha))


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's F.softplus)."""
    if beta == 0:
        raise ValueError("softplus: beta must not be 0 (the formula divides by it)")
    return _activation(input, "softplus", False, _softplus, _softplus_grad, (float(beta), float(threshold)))


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """min(max(x, min_val), max_val), torch's F.hardtanh; the gradient is g strictly between the bounds and 0 at
    and beyond them, as torch's. An integer tensor is clamped too (no gradient), as torch's."""
    if inplace:
        raise ValueError("hardtanh: inplace=True is not supported (ops here return a new tensor); write "
                         "x = F.hardtanh(x) instead")
    a = as_tensor(input)
    ad = a.data
    if ad.dtype == np.bool_:
        raise TypeError("hardtanh: Boolean inputs are not supported (as torch's); cast them first (e.g. x.float())")
    bounds = (float(min_val), float(max_val))
    out = new_like(ad)
    host(_hardtanh, ad, bounds, out)
    if ad.dtype.kind != "f":
        return Tensor._make(out)  # an integer result has no gradient

    def backward(g):
        ga = new_like(ad)
        host(_hardtanh_grad, ad, bounds, g, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,))


def relu6(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """min(max(x, 0), 6), torch's F.relu6: hardtanh(x, 0, 6), with its gradient (0 at 0 and at 6)."""
    if inplace:
        raise ValueError("relu6: inplace=True is not supported (ops here return a new tensor); write "
                         "x = F.relu6(x) instead")
    return hardtanh(input, 0.0, 6.0)


def logsigmoid(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), torch's F.logsigmoid, stable for large |x|."""
    return _activation(input, "logsigmoid", False, _logsigmoid, _logsigmoid_grad, None)


def mish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """x * tanh(softplus(x)), torch's F.mish (softplus without a threshold, as torch's mish kernel)."""
    return _activation(input, "mish", inplace, _mish, _mish_grad, None)


def _activation(input, what: str, inplace: bool, forward, grad, param) -> Tensor:
    if inplace:  # the engine's ops never write their input: an ignored result would silently not activate
        raise ValueError(f"{what}: inplace=True is not supported (ops here return a new tensor); write "
                         f"x = F.{what}(x) instead")
    a = as_tensor(input)
    ad = a.data
    if ad.dtype.kind != "f":
        raise TypeError(f"{what}: the input must be floating point, got dtype {ad.dtype}")
    out = new_like(ad)
    host(forward, ad, param, out)

    def backward(g):
        ga = new_like(ad)
        host(grad, ad, param, g, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,))


def _sigmoid(ad):
    with np.errstate(under="ignore"):  # exp(-|x|) never overflows; it may underflow to 0, the right limit
        e = np.exp(-np.abs(ad))
        return np.where(ad >= 0, 1 / (1 + e), e / (1 + e))


def _silu(ad, _param, out) -> None:
    np.multiply(ad, _sigmoid(ad), out=out)


def _silu_grad(ad, _param, g, ga) -> None:
    # torch: g s (1 + x (1 - s))
    s = _sigmoid(ad)
    with np.errstate(under="ignore"):
        np.multiply(ad, 1 - s, out=ga)
        ga += 1
        ga *= s
        ga *= g


def _leaky(ad, slope, out) -> None:
    np.multiply(ad, np.where(ad > 0, 1, slope).astype(ad.dtype), out=out)


def _leaky_grad(ad, slope, g, ga) -> None:
    np.multiply(g, np.where(ad > 0, 1, slope).astype(ad.dtype), out=ga)


def _elu(ad, alpha, out) -> None:
    with np.errstate(under="ignore"):
        neg = alpha * np.expm1(np.minimum(ad, 0))  # exp of a clipped argument: no overflow for large x
    np.copyto(out, np.where(ad > 0, ad, neg))


def _elu_grad(ad, alpha, g, ga) -> None:
    with np.errstate(under="ignore"):
        # The negative branch where x <= 0, 1 elsewhere: a NaN input passes the gradient through, as torch's.
        np.multiply(g, np.where(ad <= 0, alpha * np.exp(np.minimum(ad, 0)), 1), out=ga, casting="same_kind")


def _softplus(ad, param, out) -> None:
    beta, threshold = param
    z = ad * beta
    with np.errstate(under="ignore", over="ignore"):  # exp overflows only where z > threshold, not taken
        soft = np.log1p(np.exp(np.minimum(z, threshold))) / beta
    np.copyto(out, np.where(z > threshold, ad, soft), casting="same_kind")


def _softplus_grad(ad, param, g, ga) -> None:
    # torch: g where beta x > threshold, else g e / (e + 1) with e = exp(beta x)
    beta, threshold = param
    z = ad * beta
    with np.errstate(under="ignore"):
        np.multiply(g, np.where(z > threshold, 1, _sigmoid(z)), out=ga, casting="same_kind")


def _hardtanh(ad, bounds, out) -> None:
    low, high = bounds
    if out.dtype.kind in "iu":  # torch casts the bounds to the integer dtype: hardtanh(int, -0.5, 0.5) clamps to 0
        low, high = int(low), int(high)
    np.maximum(ad, low, out=out, casting="unsafe")
    np.minimum(out, high, out=out, casting="unsafe")  # after the max, as torch's clamp: min_val > max_val gives max


def _hardtanh_grad(ad, bounds, g, ga) -> None:
    # torch: 0 where x <= min_val or x >= max_val, else g; NaN compares false both ways and passes g.
    low, high = bounds
    blocked = (ad <= low) | (ad >= high)
    np.copyto(ga, g)
    ga[blocked] = 0


def _log1p_exp_minus_abs(ad):
    """log1p(exp(-|x|)): exp never overflows; it may underflow to 0 for large |x|, the right limit."""
    with np.errstate(under="ignore"):
        return np.log1p(np.exp(-np.abs(ad)))


def _softplus_stable(ad):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow for large x."""
    return np.maximum(ad, 0) + _log1p_exp_minus_abs(ad)


def _logsigmoid(ad, _param, out) -> None:
    np.subtract(np.minimum(ad, 0), _log1p_exp_minus_abs(ad), out=out, casting="same_kind")


def _logsigmoid_grad(ad, _param, g, ga) -> None:
    # torch's log_sigmoid_backward: (max_deriv - sign * z / (1 + z)) g, z = exp(-|x|), with max_deriv 1 and sign 1
    # where x < 0, else 0 and -1: 1 - sigmoid(x) either way, computed without overflow.
    negative = ad < 0
    with np.errstate(under="ignore"):
        z = np.exp(-np.abs(ad))
        share = z / (1 + z)
        np.multiply(g, np.where(negative, 1 - share, share), out=ga, casting="same_kind")


def _mish(ad, _param, out) -> None:
    np.multiply(ad, np.tanh(_softplus_stable(ad)), out=out, casting="same_kind")


def _mish_grad(ad, _param, g, ga) -> None:
    # torch: g (tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2)), sp = softplus(x)
    t = np.tanh(_softplus_stable(ad))
    with np.errstate(under="ignore"):
        np.multiply(g, t + ad * _sigmoid(ad) * (1 - t * t), out=ga, casting="same_kind")
