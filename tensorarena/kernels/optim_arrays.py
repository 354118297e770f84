"""Pieces the optimizer kernels share: checked flat views for the fused twins; torch's lerp, the
sign/L2-decayed gradient and the underflow setting for the references.

An optimizer kernel updates one array in place, and that array may be a single parameter or
a group's parameters concatenated into one flat buffer (the fused route); both look the same
here. Kept apart from the kernels so each kernel file holds only its own update formula.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable)


def underflow_is_zero(reference: F) -> F:
    """Run a reference update with NumPy's underflow errors off (fresh errstate per call: thread-safe).

    A tiny gradient squared (1e-25 ** 2 in float32) or a momentum buffer decaying under zero gradients
    legitimately rounds to a subnormal or 0, which torch and the fused twins give silently; under
    np.seterr(all="raise") (the tests, or a user hunting NaNs) the reference raised FloatingPointError
    instead. Only underflow: an overflow or invalid operation still reports as the caller asked.
    """
    @functools.wraps(reference)
    def quiet(*args, **kwargs):
        with np.errstate(under="ignore"):
            return reference(*args, **kwargs)
    return quiet  # type: ignore[return-value]


def flat_views(name: str, param: np.ndarray, *arrays: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """1-D views of `param` and `arrays`, `param`'s standing in for an absent (None) one.

    The fused kernels walk raw flat memory without bounds checks, so anything that is not a
    C-contiguous array shaped and typed like `param` is refused here rather than read past.
    A None slot gets `param`'s view because Numba needs an array of the right type there;
    the kernel is told separately that the slot is empty and never touches it.
    """
    flat = param.reshape(-1)
    out = [flat]
    for a in (param, *arrays):
        if a is None:
            continue
        if not a.flags.c_contiguous:
            raise ValueError(f"the fused {name} kernel needs C-contiguous arrays")
        if a.shape != param.shape or a.dtype != param.dtype:
            raise ValueError(f"{name}: array {a.dtype}{list(a.shape)} does not match param "
                             f"{param.dtype}{list(param.shape)}")
    out.extend(flat if a is None else a.reshape(-1) for a in arrays)
    return tuple(out)


def effective_grad(param: np.ndarray, grad: np.ndarray, weight_decay: float, maximize: bool,
                   a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch's g = -grad if maximize else grad; g = g + weight_decay * param (L2 decay), in scratch.

    Returns `grad` itself when neither applies, else `a` (`b` is overwritten); `grad` is never
    modified. The decay scalar meets the arrays in their dtype, as torch's Python scalars do.
    """
    g = grad
    if maximize:
        np.negative(grad, out=a)
        g = a
    if weight_decay != 0:
        np.multiply(param, param.dtype.type(weight_decay), out=b)
        np.add(g, b, out=a)
        g = a
    return g


def lerp_(start: np.ndarray, end: np.ndarray, weight: float, tmp: np.ndarray) -> None:
    """start.lerp_(end, weight) in place with torch's two-sided formula; `tmp` is scratch.

    torch computes start + w * (end - start) for w < 0.5 and end - (end - start) * (1 - w)
    otherwise (exact at both ends); following it keeps trajectories equal to rounding.
    """
    np.subtract(end, start, out=tmp)
    if abs(weight) < 0.5:
        np.multiply(tmp, weight, out=tmp)
        np.add(start, tmp, out=start)
    else:
        np.multiply(tmp, 1 - weight, out=tmp)
        np.subtract(end, tmp, out=start)


def second_moment_(exp_avg_sq: np.ndarray, g: np.ndarray, beta2: float, tmp: np.ndarray) -> None:
    """exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g in place, in torch's operation order; `tmp` is scratch."""
    dt = exp_avg_sq.dtype.type
    np.multiply(exp_avg_sq, dt(beta2), out=exp_avg_sq)
    np.multiply(g, dt(1 - beta2), out=tmp)
    np.multiply(tmp, g, out=tmp)
    np.add(exp_avg_sq, tmp, out=exp_avg_sq)


def corrected_rms(exp_avg_sq: np.ndarray, beta2: float, step: float, eps: float, out: np.ndarray) -> None:
    """out = sqrt(exp_avg_sq / (1 - beta2**step)) + eps: NAdam's and LAMB's denominator (divided before the root)."""
    dt = exp_avg_sq.dtype.type
    np.divide(exp_avg_sq, dt(1 - beta2**step), out=out)
    np.sqrt(out, out=out)
    np.add(out, dt(eps), out=out)
