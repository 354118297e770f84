"""Adam/AdamW update of one parameter tensor: a NumPy reference and a fused Numba twin.

The update follows torch.optim.Adam/AdamW (single-tensor form): optional L2 decay
folded into the gradient (Adam) or decoupled decay of the weights (AdamW),
first moment m += (1 - beta1) * (g - m), second moment v = beta2 * v + (1 - beta2) * g^2,
bias corrections, optional AMSGrad max, then p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
The fused twin does all of that in one pass over memory instead of ~10 NumPy passes.
"""

from __future__ import annotations

import math

import numpy as np

from . import register


def adam_reference(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
                   max_exp_avg_sq: np.ndarray | None, *, lr: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float, step: int, decoupled: bool, maximize: bool) -> None:
    """In-place Adam(W) step of `param` and its moments (plain NumPy; clarity over speed)."""
    g = -grad if maximize else grad
    if weight_decay != 0.0:
        if decoupled:
            param *= 1.0 - lr * weight_decay
        else:
            g = g + weight_decay * param
    exp_avg += (1.0 - beta1) * (g - exp_avg)  # torch's lerp(g, 1 - beta1)
    exp_avg_sq *= beta2
    exp_avg_sq += (1.0 - beta2) * (g * g)
    bias_correction1 = 1.0 - beta1**step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
    second = exp_avg_sq
    if max_exp_avg_sq is not None:
        np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second = max_exp_avg_sq
    denom = np.sqrt(second) / bias_correction2_sqrt + eps
    param -= (lr / bias_correction1) * (exp_avg / denom)


_fused_cache = {}


def _compile():
    import numba

    @numba.njit(parallel=True, fastmath=False, cache=True)
    def kernel(p, g, m, v, vmax, use_max, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt, decoupled, sign):
        n = p.size
        decay = 1.0 - lr * wd
        step_size = lr / bc1
        for i in numba.prange(n):
            gi = sign * g[i]
            pi = p[i]
            if wd != 0.0:
                if decoupled:
                    pi = pi * decay
                else:
                    gi = gi + wd * pi
            mi = m[i] + (1.0 - beta1) * (gi - m[i])
            vi = beta2 * v[i] + (1.0 - beta2) * gi * gi
            m[i] = mi
            v[i] = vi
            if use_max:
                if vi > vmax[i]:
                    vmax[i] = vi
                vi = vmax[i]
            p[i] = pi - step_size * mi / (math.sqrt(vi) / bc2_sqrt + eps)

    return kernel


def adam_fused(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
               max_exp_avg_sq: np.ndarray | None, *, lr: float, beta1: float, beta2: float, eps: float,
               weight_decay: float, step: int, decoupled: bool, maximize: bool) -> None:
    """Same contract as `adam_reference`, in one parallel pass over memory."""
    kernel = _fused_cache.get("adam")
    if kernel is None:
        kernel = _fused_cache["adam"] = _compile()
    flat = [a.reshape(-1) for a in (param, grad, exp_avg, exp_avg_sq)]
    vmax = max_exp_avg_sq.reshape(-1) if max_exp_avg_sq is not None else flat[3]
    kernel(*flat, vmax, max_exp_avg_sq is not None, lr, beta1, beta2, eps, weight_decay,
           1.0 - beta1**step, math.sqrt(1.0 - beta2**step), decoupled, -1.0 if maximize else 1.0)


register("adam", "reference", adam_reference)
register("adam", "fused", adam_fused)
