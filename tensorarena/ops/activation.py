"""More activations, with torch's values and its choice of gradient at the kinks: silu, leaky_relu, elu, softplus.

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
