"""Lion update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2:
c = beta1 * m + (1 - beta1) * g; p -= lr * (sign(c) + wd * p); m = beta2 * m + (1 - beta2) * g.
The weight decay is applied first as p *= 1 - lr * wd, which is the same update. Only the
sign of the interpolation moves the weights, so every coordinate steps by exactly lr.
The fused twin does it in one pass over memory instead of ~8 NumPy passes.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import flat_views, underflow_is_zero


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def lion_reference(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, *, lr: float, beta1: float,
                   beta2: float, weight_decay: float, maximize: bool = False,
                   scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place Lion step of `param` (plain NumPy).

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified (maximize folds its sign into the coefficients instead of negating it).
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    sign = -1.0 if maximize else 1.0
    if weight_decay != 0:
        np.multiply(param, dt(1 - lr * weight_decay), out=param)
    np.multiply(exp_avg, dt(beta1), out=b)
    np.multiply(grad, dt(sign * (1 - beta1)), out=a)
    np.add(b, a, out=b)  # c
    np.sign(b, out=b)
    np.multiply(b, dt(lr), out=b)
    np.subtract(param, b, out=param)
    np.multiply(exp_avg, dt(beta2), out=exp_avg)
    np.multiply(grad, dt(sign * (1 - beta2)), out=a)
    np.add(exp_avg, a, out=exp_avg)


@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, m, decay, beta1, c_beta1, beta2, c_beta2, lr):
    for i in numba.prange(p.size):
        gi = g[i]
        mi = m[i]
        c = mi * beta1 + c_beta1 * gi
        p[i] = p[i] * decay - lr * np.sign(c)
        m[i] = mi * beta2 + c_beta2 * gi


def lion_fused(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, *, lr: float, beta1: float, beta2: float,
               weight_decay: float, maximize: bool = False, scratch=None) -> None:
    """Same contract as `lion_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, m = flat_views("lion", param, grad, exp_avg)
    dt = param.dtype.type
    sign = -1.0 if maximize else 1.0
    _update(p, g, m, dt(1 - lr * weight_decay), dt(beta1), dt(sign * (1 - beta1)), dt(beta2),
            dt(sign * (1 - beta2)), dt(lr))


register("lion", "reference", lion_reference)
register("lion", "fused", lion_fused)
