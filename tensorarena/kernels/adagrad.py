"""Adagrad update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.Adagrad's dense single-tensor step (Duchi, Hazan & Singer 2011), in torch's
operation order: g = -grad if maximize else grad; g += wd * p; clr = lr / (1 + (t - 1) * lr_decay);
s += g * g; p -= clr * g / (sqrt(s) + eps). The fused twin does it in one pass over memory.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import effective_grad, flat_views, underflow_is_zero


def _clr(lr: float, lr_decay: float, step: float) -> float:
    return lr / (1 + (step - 1) * lr_decay)


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def adagrad_reference(param: np.ndarray, grad: np.ndarray, state_sum: np.ndarray, *, step: float, lr: float,
                      lr_decay: float, weight_decay: float, eps: float, maximize: bool = False,
                      scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place Adagrad step of `param` at (already incremented) step `step` (plain NumPy).

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified.
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    g = effective_grad(param, grad, weight_decay, maximize, a, b)
    np.multiply(g, g, out=b)
    np.add(state_sum, b, out=state_sum)
    np.sqrt(state_sum, out=b)
    np.add(b, dt(eps), out=b)
    np.multiply(g, dt(-_clr(lr, lr_decay, step)), out=a)
    np.divide(a, b, out=a)
    np.add(param, a, out=param)


@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, s, sign, wd, eps, neg_clr):
    for i in numba.prange(p.size):
        gi = sign * g[i]
        gi = gi + wd * p[i]
        si = s[i] + gi * gi
        s[i] = si
        p[i] = p[i] + neg_clr * gi / (np.sqrt(si) + eps)


def adagrad_fused(param: np.ndarray, grad: np.ndarray, state_sum: np.ndarray, *, step: float, lr: float,
                  lr_decay: float, weight_decay: float, eps: float, maximize: bool = False, scratch=None) -> None:
    """Same contract as `adagrad_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, s = flat_views("adagrad", param, grad, state_sum)
    dt = param.dtype.type
    _update(p, g, s, dt(-1.0 if maximize else 1.0), dt(weight_decay), dt(eps), dt(-_clr(lr, lr_decay, step)))


register("adagrad", "reference", adagrad_reference)
register("adagrad", "fused", adagrad_fused)
