"""More elementwise functions, as torch's: sin cos square rsqrt sign round.

Each is one tape.host call forward and one backward, so the fused and captured routes replay them. sign and
round are piecewise constant: their gradient is zeros (not None), as torch's SignBackward and RoundBackward give.
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ..tape import host
from ._base import as_tensor, is_int, new, new_like
from .arith import pow
from .cast import float_input
from .unary import of_input, of_output


def sin(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """Sine, torch.sin; an integer tensor is taken as float32, as torch's."""
    return of_input("sin", float_input(input), np.sin, _sin_grad)


def cos(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """Cosine, torch.cos; an integer tensor is taken as float32, as torch's."""
    return of_input("cos", float_input(input), np.cos, _cos_grad)


def square(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """input * input, torch.square: torch computes it as pow(input, 2), and so does this (integers stay integers)."""
    return pow(input, 2)


def rsqrt(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """1 / sqrt(input), torch.rsqrt; the gradient -g / 2 * out^3 is torch's, read from the output."""
    return of_output("rsqrt", float_input(input), _rsqrt, _rsqrt_grad)


def sign(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """-1, 0 or 1 by the sign of each element, in input's dtype (torch.sign: a bool tensor stays as it is)."""
    input = as_tensor(input)
    ad = input.data
    out = new_like(ad)
    host(_copy if ad.dtype == np.bool_ else _sign, ad, out=out)  # NumPy has no sign for bool
    return _piecewise_constant(out, input)



def _sign(ad: np.ndarray, out: np.ndarray) -> None:
    np.sign(ad, out=out)
    if ad.dtype.kind == "f":  # torch's sign(NaN) is 0; NumPy's is NaN
        out[np.isnan(ad)] = 0

def round(input: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001, A002 - torch's names
    """Each element rounded to `decimals` places, halves to even (torch.round: 0.5 -> 0, 2.5 -> 2, -0.5 -> -0).
    An integer or bool tensor comes back as a copy; torch refuses decimals for them, and so does this."""
    if not is_int(decimals):
        raise TypeError(f"round: decimals must be an int, got {decimals!r}")
    input = as_tensor(input)
    ad = input.data
    if ad.dtype.kind != "f" and decimals != 0:
        raise TypeError(f"round: decimals={decimals} needs a floating-point tensor (as torch), got dtype {ad.dtype}")
    out = new_like(ad)
    if ad.dtype.kind != "f":
        host(_copy, ad, out=out)
    else:
        host(_round, ad, int(decimals), out)
    return _piecewise_constant(out, input)


def _piecewise_constant(out: np.ndarray, input: Tensor) -> Tensor:
    """The output of sign or round: a float one records a backward of zeros, as torch's."""
    if out.dtype.kind != "f":
        return Tensor._make(out)
    shape, dtype = input.shape, input.dtype

    def backward(g):
        ga = new(shape, dtype)
        host(_fill_zero, ga)  # through host: a replayed step must zero its buffer again, not find old values
        return (ga,)

    return Tensor._make(out, (input,), backward)


# The NumPy work of the ops above, one function each: tape.host records a call as one entry of a captured step.

def _copy(ad, out):
    np.copyto(out, ad)


def _fill_zero(ga):
    ga.fill(0)


def _sin_grad(ad, g, ga):
    np.cos(ad, out=ga)
    ga *= g


def _cos_grad(ad, g, ga):
    np.sin(ad, out=ga)
    np.negative(ga, out=ga)
    ga *= g


def _rsqrt(ad, *, out):
    # 1/sqrt(0) is inf and 1/sqrt(-1) NaN, as torch's; the tests' seterr(all="raise") must not turn them into errors
    with np.errstate(divide="ignore", invalid="ignore"):
        np.sqrt(ad, out=out)
        np.divide(1, out, out=out)


def _rsqrt_grad(out, g, ga):
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        np.power(out, 3, out=ga)
        ga *= g
        ga *= -0.5


def _round(ad, decimals, out):
    # torch's round_decimals kernel: nearbyint(a * 10^d) / 10^d, or nearbyint(a / 10^-d) * 10^-d for d < 0, in the
    # tensor's own precision (NumPy's np.round multiplies by 10^d < 1 instead, which rounds differently).
    with np.errstate(over="ignore", invalid="ignore"):
        if decimals == 0:
            np.rint(ad, out=out)
        elif decimals > 0:
            scale = out.dtype.type(10.0 ** decimals)
            np.multiply(ad, scale, out=out)
            np.rint(out, out=out)
            out /= scale
        else:
            scale = out.dtype.type(10.0 ** -decimals)
            np.divide(ad, scale, out=out)
            np.rint(out, out=out)
            out *= scale
