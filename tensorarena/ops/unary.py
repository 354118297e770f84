"""Elementwise functions and activations: exp log sqrt tanh relu gelu sigmoid."""

from __future__ import annotations

import math

import numpy as np

from ..kernels import kernel
from ..tensor import Tensor
from ._base import new_like

# The same constant expressions torch's CPU kernels use, so results agree to the last bit.
_SQRT1_2 = math.sqrt(0.5)
_PDF_SCALE = (2.0 / math.sqrt(math.pi)) * _SQRT1_2 * 0.5  # 1 / sqrt(2 pi)
_TANH_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # sqrt(2 / pi)
_TANH_KAPPA = 0.044715
# Past these |x| the Gaussian pdf is 0 and tanh(inner) is exactly 1 in float32 and float64,
# so clipping changes no result and keeps x*x and x**3 from overflowing on huge inputs.
_PDF_CLIP = 40.0
_TANH_CLIP = 20.0


def exp(a: Tensor) -> Tensor:
    """e ** a."""
    ad = a.data
    out = new_like(ad)
    np.exp(ad, out=out)

    def backward(g):
        ga = new_like(ad)
        np.multiply(g, out, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def log(a: Tensor) -> Tensor:
    """Natural log."""
    ad = a.data
    out = new_like(ad)
    np.log(ad, out=out)

    def backward(g):
        ga = new_like(ad)
        np.divide(g, ad, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def sqrt(a: Tensor) -> Tensor:
    """Square root."""
    ad = a.data
    out = new_like(ad)
    np.sqrt(ad, out=out)

    def backward(g):
        ga = new_like(ad)
        np.multiply(out, 2.0, out=ga)
        np.divide(g, ga, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def tanh(a: Tensor) -> Tensor:
    """Hyperbolic tangent."""
    ad = a.data
    out = new_like(ad)
    np.tanh(ad, out=out)

    def backward(g):
        ga = new_like(ad)
        np.square(out, out=ga)
        np.subtract(1.0, ga, out=ga)
        ga *= g
        return (ga,)

    return Tensor._make(out, (a,), backward)


def relu(a: Tensor) -> Tensor:
    """max(a, 0); gradient 0 at 0, as torch."""
    ad = a.data
    out = new_like(ad)
    np.maximum(ad, 0, out=out)

    def backward(g):
        ga = new_like(ad)
        np.greater(ad, 0, out=ga)  # the 0/1 mask straight into the float buffer, no bool temporary
        ga *= g
        return (ga,)

    return Tensor._make(out, (a,), backward)


def sigmoid(a: Tensor) -> Tensor:
    """1 / (1 + e^-a), computed stably for large |a|."""
    ad = a.data
    out = new_like(ad)
    den = new_like(ad)
    # e = exp(-|a|) never overflows; sigmoid(-|a|) = e / (1 + e) and sigmoid(|a|) = 1 / (1 + e).
    # exp and the quotient may underflow to 0 for large |a|, which is the right limit.
    with np.errstate(under="ignore"):
        np.abs(ad, out=out)
        np.negative(out, out=out)
        np.exp(out, out=out)
        np.add(out, 1.0, out=den)
        negative = ad < 0
        np.divide(out, den, out=out, where=negative)
        np.divide(1.0, den, out=out, where=~negative)

    def backward(g):
        ga = new_like(ad)
        np.subtract(1.0, out, out=ga)
        with np.errstate(under="ignore"):  # a saturated sigmoid's gradient is ~0, possibly subnormal
            ga *= out
            ga *= g
        return (ga,)

    return Tensor._make(out, (a,), backward)


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """GELU; approximate="none" (erf form) or "tanh", as torch.nn.functional.gelu."""
    if approximate == "none":
        return _gelu_erf(a)
    if approximate == "tanh":
        return _gelu_tanh(a)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def _gelu_erf(a: Tensor) -> Tensor:
    ad = a.data
    out = new_like(ad)
    _normal_cdf(ad, out)
    out *= ad  # x * 0.5 * (1 + erf(x / sqrt 2))

    def backward(g):
        # d/dx x*Phi(x) = Phi(x) + x*phi(x); Phi is recomputed (as torch does) so forward keeps no extra buffer.
        ga = new_like(ad)
        _normal_cdf(ad, ga)
        pdf = new_like(ad)
        np.clip(ad, -_PDF_CLIP, _PDF_CLIP, out=pdf)
        np.square(pdf, out=pdf)
        pdf *= -0.5
        with np.errstate(under="ignore"):  # the pdf's far tails are 0, possibly via subnormals
            np.exp(pdf, out=pdf)
            pdf *= _PDF_SCALE
            pdf *= ad
        ga += pdf
        ga *= g
        return (ga,)

    return Tensor._make(out, (a,), backward)


def _normal_cdf(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.multiply(x, _SQRT1_2, out=out)
    kernel("erf")(out, out)
    out += 1.0
    out *= 0.5
    return out


def _gelu_tanh(a: Tensor) -> Tensor:
    ad = a.data
    out = new_like(ad)
    t = new_like(ad)  # tanh(inner), kept for backward: the arena holds it for the step anyway
    xc = np.clip(ad, -_TANH_CLIP, _TANH_CLIP, out=out)
    np.multiply(xc, xc, out=t)
    t *= xc
    t *= _TANH_KAPPA
    t += xc
    t *= _TANH_BETA
    np.tanh(t, out=t)
    np.add(t, 1.0, out=out)
    out *= ad
    out *= 0.5  # 0.5 * x * (1 + tanh(inner)); scaling by 0.5 is exact, so the order matches torch

    def backward(g):
        # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2)
        ga = new_like(ad)
        tmp = new_like(ad)
        np.clip(ad, -_TANH_CLIP, _TANH_CLIP, out=ga)
        np.square(ga, out=ga)
        ga *= 3.0 * _TANH_KAPPA
        ga += 1.0
        ga *= _TANH_BETA
        np.square(t, out=tmp)
        np.subtract(1.0, tmp, out=tmp)
        ga *= tmp
        ga *= ad
        ga *= 0.5
        np.add(t, 1.0, out=tmp)
        tmp *= 0.5
        ga += tmp
        ga *= g
        return (ga,)

    return Tensor._make(out, (a,), backward)
