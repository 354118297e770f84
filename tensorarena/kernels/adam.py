"""Adam/AdamW update of one parameter tensor: a NumPy reference and a fused Numba twin.

The update follows torch.optim.Adam/AdamW (single-tensor form, same operation order in
the reference): optional L2 decay
folded into the gradient (Adam) or decoupled decay of the weights (AdamW),
first moment m.lerp_(g, 1 - beta1) (torch's two-sided lerp), second moment v = beta2 * v + (1 - beta2) * g^2,
bias corrections, optional AMSGrad max, then p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
The fused twin does all of that in one pass over memory instead of ~10 NumPy passes.
"""

from __future__ import annotations

import math

import numpy as np

from . import register
from .optim_arrays import effective_grad, flat_views, lerp_, second_moment_, underflow_is_zero


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def adam_reference(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
                max_exp_avg_sq: np.ndarray | None, *, step: float, lr: float, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0, maximize: bool = False,
                decoupled_weight_decay: bool = False,
                scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place Adam(W) step of `param` at (already incremented) step count `step`.

    Pass `max_exp_avg_sq` for AMSGrad. `scratch` is two arrays shaped like `param`
    that the update overwrites (allocated here when not given); `grad` is never modified.
    Operation order follows torch's single-tensor Adam so results agree to rounding.
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    g = effective_grad(param, grad, 0.0 if decoupled_weight_decay else weight_decay, maximize, a, b)
    if weight_decay != 0 and decoupled_weight_decay:
        np.multiply(param, 1 - lr * weight_decay, out=param)
    lerp_(exp_avg, g, 1 - beta1, b)  # exp_avg.lerp_(g, 1 - beta1)
    second_moment_(exp_avg_sq, g, beta2, b)

    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    step_size = lr / bias_correction1
    second = exp_avg_sq
    if max_exp_avg_sq is not None:
        np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second = max_exp_avg_sq
    # denom = sqrt(v) / sqrt(bc2) + eps ;  p += (-step_size * m) / denom   (torch's addcdiv order)
    np.sqrt(second, out=b)
    np.divide(b, bias_correction2_sqrt, out=b)
    np.add(b, eps, out=b)
    np.multiply(exp_avg, -step_size, out=a)  # g (possibly in `a`) is no longer needed
    np.divide(a, b, out=a)
    np.add(param, a, out=param)


_fused_cache = {}


def _compile():
    import numba

    # Every scalar arrives already cast to the parameter dtype and the body has no float
    # literals, so float32 parameters are updated in float32 arithmetic like torch's (a
    # float64 intermediate would round differently, e.g. in 1 - lr * weight_decay).
    @numba.njit(parallel=True, fastmath=False, cache=True)
    def kernel(p, g, m, v, vmax, use_max, sign, decay, l2, low, one_minus_beta1, one_minus_w, beta2, one_minus_beta2,
               step_size, bc2_sqrt, eps):
        for i in numba.prange(p.size):
            gi = sign * g[i]
            pi = p[i] * decay  # decay is 1 unless AdamW
            gi = gi + l2 * pi  # l2 is 0 unless Adam with weight decay
            d = gi - m[i]
            if low:  # torch's two-sided lerp (m.lerp_(g, 1 - beta1)), exact at both ends: beta1 = 0 gives m = g
                mi = m[i] + one_minus_beta1 * d
            else:
                mi = gi - d * one_minus_w  # 1 - (1 - beta1), as the reference's lerp_ rounds it
            vi = v[i] * beta2 + one_minus_beta2 * gi * gi
            m[i] = mi
            v[i] = vi
            if use_max:
                # torch.maximum / np.maximum: a NaN in either wins (`vi > vmax` alone would drop a NaN vi)
                if vi > vmax[i] or vi != vi:
                    vmax[i] = vi
                vi = vmax[i]
            p[i] = pi - step_size * mi / (np.sqrt(vi) / bc2_sqrt + eps)

    return kernel


def adam_fused(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
               max_exp_avg_sq: np.ndarray | None, *, step: float, lr: float, beta1: float = 0.9,
               beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0, maximize: bool = False,
               decoupled_weight_decay: bool = False, scratch=None) -> None:
    """Same contract as `adam_reference`, in one parallel pass over memory (needs no scratch)."""
    bind_adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)(
        step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, maximize=maximize,
        decoupled_weight_decay=decoupled_weight_decay)


def bind_adam(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
              max_exp_avg_sq: np.ndarray | None):
    """adam_fused on these arrays, checked and flattened once: a function of the step's scalars (keywords as
    adam_fused's). Optimizer.prepare_flat binds each parameter's update so for a captured fused step."""
    kernel = _fused_cache.get("adam")
    if kernel is None:
        kernel = _fused_cache["adam"] = _compile()
    cast = param.dtype.type
    # Checked views, never reshape copies: a non-contiguous moment's copy would be updated and lost.
    *flat, vmax = flat_views("adam", param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    use_max = max_exp_avg_sq is not None

    def update(*, step: float, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.0, maximize: bool = False, decoupled_weight_decay: bool = False) -> None:
        decoupled = decoupled_weight_decay and weight_decay != 0.0
        kernel(*flat, vmax, use_max, cast(-1.0 if maximize else 1.0),
               cast(1.0 - lr * weight_decay if decoupled else 1.0),
               cast(0.0 if decoupled_weight_decay else weight_decay),
               abs(1.0 - beta1) < 0.5, cast(1.0 - beta1), cast(1.0 - (1.0 - beta1)), cast(beta2),
               cast(1.0 - beta2), cast(lr / (1.0 - beta1**step)),
               cast(math.sqrt(1.0 - beta2**step)), cast(eps))
    return update


adam_fused.bind = bind_adam


register("adam", "reference", adam_reference)
register("adam", "fused", adam_fused)
