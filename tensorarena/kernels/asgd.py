"""ASGD update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.ASGD's dense single-tensor step (Polyak & Juditsky 1992, "Acceleration of Stochastic
Approximation by Averaging"), in torch's operation order: g = -grad if maximize else grad;
g += wd * p; p *= 1 - lambd * eta; p -= eta * g; then the running average ax += mu * (p - ax),
or ax = p exactly while mu is 1 (before step t0). eta and mu are the per-parameter scalars the
optimizer keeps (the values its previous step left); the kernel only reads them.
The fused twin does it in one pass over memory.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import effective_grad, flat_views, underflow_is_zero


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def asgd_reference(param: np.ndarray, grad: np.ndarray, ax: np.ndarray, *, eta: float, mu: float, lambd: float,
                   weight_decay: float, maximize: bool = False,
                   scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place ASGD step of `param` and its average `ax` with this step's `eta` and `mu` (plain NumPy).

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified.
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    g = effective_grad(param, grad, weight_decay, maximize, a, b)
    np.multiply(param, dt(1 - lambd * eta), out=param)
    np.multiply(g, dt(-eta), out=a)
    np.add(param, a, out=param)
    if mu != 1:
        np.subtract(param, ax, out=b)
        np.multiply(b, dt(mu), out=b)
        np.add(ax, b, out=ax)
    else:
        np.copyto(ax, param)  # torch copies: ax + 1 * (p - ax) could differ from p by a rounding


# Every scalar arrives cast to the parameter dtype and the body has no float literals, so
# float32 parameters are updated in float32 arithmetic, as torch's are.
@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, ax, sign, wd, decay, neg_eta, averaging, mu):
    for i in numba.prange(p.size):
        gi = sign * g[i]
        pi = p[i]
        gi = gi + wd * pi
        pi = pi * decay + neg_eta * gi
        p[i] = pi
        if averaging:
            ax[i] = ax[i] + (pi - ax[i]) * mu
        else:
            ax[i] = pi


def asgd_fused(param: np.ndarray, grad: np.ndarray, ax: np.ndarray, *, eta: float, mu: float, lambd: float,
               weight_decay: float, maximize: bool = False, scratch=None) -> None:
    """Same contract as `asgd_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, a = flat_views("asgd", param, grad, ax)
    dt = param.dtype.type
    _update(p, g, a, dt(-1.0 if maximize else 1.0), dt(weight_decay), dt(1 - lambd * eta), dt(-eta), mu != 1,
            dt(mu))


register("asgd", "reference", asgd_reference)
register("asgd", "fused", asgd_fused)
