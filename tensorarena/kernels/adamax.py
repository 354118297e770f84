"""Adamax update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.Adamax's dense single-tensor step (Kingma & Ba 2015, "Adam: A Method for Stochastic
Optimization", section 7.1), in torch's operation order: g = -grad if maximize else grad;
g += wd * p; m.lerp_(g, 1 - beta1); u = max(beta2 * u, |g| + eps) (NaN-propagating, as
torch.maximum); p -= lr / (1 - beta1^t) * m / u. The fused twin does it in one pass over memory.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import effective_grad, flat_views, lerp_, underflow_is_zero


def _neg_clr(lr: float, beta1: float, step: float) -> float:
    return -lr / (1 - beta1**step)


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def adamax_reference(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_inf: np.ndarray, *,
                     step: float, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                     maximize: bool = False, scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place Adamax step of `param` at (already incremented) step `step` (plain NumPy).

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified.
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    g = effective_grad(param, grad, weight_decay, maximize, a, b)
    lerp_(exp_avg, g, 1 - beta1, b)
    np.multiply(exp_inf, dt(beta2), out=exp_inf)
    np.abs(g, out=b)
    np.add(b, dt(eps), out=b)
    np.maximum(exp_inf, b, out=exp_inf)
    np.divide(exp_avg, exp_inf, out=a)  # g (possibly in `a`) is no longer needed
    np.multiply(a, dt(_neg_clr(lr, beta1, step)), out=a)
    np.add(param, a, out=param)


# Every scalar arrives cast to the parameter dtype and the body has no float literals, so
# float32 parameters are updated in float32 arithmetic, as torch's are.
@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, m, u, sign, wd, low, w, one_minus_w, beta2, eps, neg_clr):
    for i in numba.prange(p.size):
        gi = sign * g[i]
        gi = gi + wd * p[i]
        d = gi - m[i]
        if low:  # torch's two-sided lerp
            mi = m[i] + w * d
        else:
            mi = gi - d * one_minus_w
        m[i] = mi
        decayed = u[i] * beta2
        floor = np.abs(gi) + eps
        # torch.maximum propagates a NaN from either side; a bare comparison would drop one from `decayed`
        ui = decayed if (decayed > floor or decayed != decayed) else floor
        u[i] = ui
        p[i] = p[i] + neg_clr * (mi / ui)


def adamax_fused(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_inf: np.ndarray, *, step: float,
                 lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, maximize: bool = False,
                 scratch=None) -> None:
    """Same contract as `adamax_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, m, u = flat_views("adamax", param, grad, exp_avg, exp_inf)
    dt = param.dtype.type
    w = 1 - beta1
    _update(p, g, m, u, dt(-1.0 if maximize else 1.0), dt(weight_decay), abs(w) < 0.5, dt(w), dt(1 - w),
            dt(beta2), dt(eps), dt(_neg_clr(lr, beta1, step)))


register("adamax", "reference", adamax_reference)
register("adamax", "fused", adamax_fused)
