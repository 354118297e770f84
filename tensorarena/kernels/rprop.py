"""Rprop update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.Rprop's dense single-tensor step (Riedmiller & Braun 1993, "A Direct Adaptive
Method for Faster Backpropagation Learning: The RPROP Algorithm"; without weight backtracking),
per element: g = -grad if maximize else grad; where g * prev > 0 the step size grows by
etaplus, where it is < 0 it shrinks by etaminus and g is taken as 0 (no move, and no sign
change seen next step), else it stays; step sizes are clamped to [step_size_min,
step_size_max] (max(., min) first, so min > max gives max, as torch.clamp); p -= sign(g) * step_size; prev = g.

NaN follows torch too: torch.sign(NaN) is 0, so a NaN product leaves the step size alone and
a NaN gradient leaves its coordinate unmoved (its NaN is kept in prev).
Every decision is per element, so a flat buffer of many parameters updates as they would one by one.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import flat_views, underflow_is_zero


def _mask(scratch: np.ndarray) -> np.ndarray:
    """A boolean array shaped like `scratch`, on the first bytes of its memory: a where= mask that costs no
    allocation (a float scratch array holds at least one byte per element)."""
    return scratch.reshape(-1).view(np.bool_)[:scratch.size].reshape(scratch.shape)


@underflow_is_zero  # step sizes shrunk towards a 0 minimum may go subnormal, as torch's and the fused twin's
def rprop_reference(param: np.ndarray, grad: np.ndarray, prev: np.ndarray, step_size: np.ndarray, *,
                    etaminus: float, etaplus: float, step_size_min: float, step_size_max: float,
                    maximize: bool = False, scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place Rprop step of `param` (plain NumPy).

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified (maximize negates the product and the stored gradient instead, which is exact).
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    mask = _mask(a)
    np.multiply(grad, prev, out=b)
    if maximize:
        np.negative(b, out=b)  # (-g) * prev, rounded the same
    np.greater(b, 0, out=mask)
    np.multiply(step_size, dt(etaplus), out=step_size, where=mask)
    np.less(b, 0, out=mask)  # kept until prev is written: these coordinates store a 0 gradient
    np.multiply(step_size, dt(etaminus), out=step_size, where=mask)
    np.maximum(step_size, dt(step_size_min), out=step_size)
    np.minimum(step_size, dt(step_size_max), out=step_size)
    if maximize:
        np.negative(grad, out=prev)
    else:
        np.copyto(prev, grad)
    np.copyto(prev, 0, where=mask)
    np.sign(prev, out=b)
    np.isnan(b, out=mask)
    np.copyto(b, 0, where=mask)  # torch.sign(NaN) is 0: a NaN gradient does not move its coordinate
    np.multiply(b, step_size, out=b)
    np.subtract(param, b, out=param)


# Every scalar arrives cast to the parameter dtype and the body has no float literals, so
# float32 parameters are updated in float32 arithmetic, as torch's are.
@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, prev, size, sign, etaminus, etaplus, low, high, zero):
    for i in numba.prange(p.size):
        gi = sign * g[i]
        product = gi * prev[i]
        s = size[i]
        if product > zero:
            s = s * etaplus
        elif product < zero:
            s = s * etaminus
            gi = zero
        if s < low:  # torch.clamp: max with the low bound, then min with the high one; NaN stays NaN
            s = low
        if s > high:
            s = high
        size[i] = s
        prev[i] = gi
        if gi > zero:
            p[i] = p[i] - s
        elif gi < zero:
            p[i] = p[i] + s


def rprop_fused(param: np.ndarray, grad: np.ndarray, prev: np.ndarray, step_size: np.ndarray, *, etaminus: float,
                etaplus: float, step_size_min: float, step_size_max: float, maximize: bool = False,
                scratch=None) -> None:
    """Same contract as `rprop_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, q, s = flat_views("rprop", param, grad, prev, step_size)
    dt = param.dtype.type
    _update(p, g, q, s, dt(-1.0 if maximize else 1.0), dt(etaminus), dt(etaplus), dt(step_size_min),
            dt(step_size_max), dt(0.0))


register("rprop", "reference", rprop_reference)
register("rprop", "fused", rprop_fused)
