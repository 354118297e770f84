"""Adadelta update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.Adadelta's dense single-tensor step (Zeiler 2012, "ADADELTA: An Adaptive Learning
Rate Method"), in torch's operation order: g = -grad if maximize else grad; g += wd * p;
v = rho * v + (1 - rho) * g * g; delta = sqrt(u + eps) / sqrt(v + eps) * g;
u = rho * u + (1 - rho) * delta * delta; p -= lr * delta. The fused twin does it in one pass.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import effective_grad, flat_views, second_moment_, underflow_is_zero


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def adadelta_reference(param: np.ndarray, grad: np.ndarray, square_avg: np.ndarray, acc_delta: np.ndarray, *,
                       lr: float, rho: float, eps: float, weight_decay: float, maximize: bool = False,
                       scratch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place Adadelta step of `param` (plain NumPy).

    `scratch` is three arrays shaped like `param` (allocated here when not given): the gradient,
    the RMS of the gradients and the step are alive at once. `grad` is never modified.
    """
    a, b, c = scratch if scratch is not None else tuple(np.empty_like(param) for _ in range(3))
    dt = param.dtype.type
    g = effective_grad(param, grad, weight_decay, maximize, a, b)
    second_moment_(square_avg, g, rho, b)
    np.add(square_avg, dt(eps), out=b)
    np.sqrt(b, out=b)  # std
    np.add(acc_delta, dt(eps), out=c)
    np.sqrt(c, out=c)
    np.divide(c, b, out=c)
    np.multiply(c, g, out=c)  # delta
    second_moment_(acc_delta, c, rho, b)
    np.multiply(c, dt(-lr), out=c)
    np.add(param, c, out=param)


# Every scalar arrives cast to the parameter dtype and the body has no float literals, so
# float32 parameters are updated in float32 arithmetic, as torch's are.
@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, v, u, sign, wd, rho, one_minus_rho, eps, neg_lr):
    for i in numba.prange(p.size):
        gi = sign * g[i]
        gi = gi + wd * p[i]
        vi = v[i] * rho + one_minus_rho * gi * gi
        v[i] = vi
        delta = np.sqrt(u[i] + eps) / np.sqrt(vi + eps) * gi
        u[i] = u[i] * rho + one_minus_rho * delta * delta
        p[i] = p[i] + neg_lr * delta


def adadelta_fused(param: np.ndarray, grad: np.ndarray, square_avg: np.ndarray, acc_delta: np.ndarray, *,
                   lr: float, rho: float, eps: float, weight_decay: float, maximize: bool = False,
                   scratch=None) -> None:
    """Same contract as `adadelta_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, v, u = flat_views("adadelta", param, grad, square_avg, acc_delta)
    dt = param.dtype.type
    _update(p, g, v, u, dt(-1.0 if maximize else 1.0), dt(weight_decay), dt(rho), dt(1 - rho), dt(eps), dt(-lr))


register("adadelta", "reference", adadelta_reference)
register("adadelta", "fused", adadelta_fused)
