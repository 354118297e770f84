"""RAdam update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.RAdam's dense single-tensor step (Liu et al. 2020, "On the Variance of the Adaptive
Learning Rate and Beyond"), in torch's operation order: g = -grad if maximize else grad;
decoupled decay p *= 1 - lr * wd, or L2 decay g += wd * p; m.lerp_(g, 1 - beta1);
v = beta2 * v + (1 - beta2) * g * g. With rho_inf = 2 / (1 - beta2) - 1 and
rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t), the variance of the adaptive step is tractable
only once rho_t > 5: then p -= (m / bc1 * lr) * (sqrt(bc2) / (sqrt(v) + eps)) * r_t with the
rectification r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t)),
else p -= m / bc1 * lr (SGD with momentum). rho_t and r_t depend on the step count alone, so
they are scalars the caller's step decides, the same for every element of a flat group.
The fused twin does it in one pass over memory.
"""

from __future__ import annotations

import math

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import effective_grad, flat_views, lerp_, second_moment_, underflow_is_zero


def rectification(beta1: float, beta2: float, step: float) -> tuple[float, float, float | None]:
    """(1 - beta1^t, 1 - beta2^t, r_t), r_t None while rho_t <= 5 (the unrectified, momentum-only step)."""
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
    if not rho_t > 5.0:
        return bias_correction1, bias_correction2, None
    rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
    return bias_correction1, bias_correction2, rect


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def radam_reference(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
                    step: float, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                    decoupled_weight_decay: bool = False, maximize: bool = False,
                    scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place RAdam step of `param` at (already incremented) step `step` (plain NumPy).

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified.
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    if weight_decay != 0 and decoupled_weight_decay:
        np.multiply(param, dt(1 - lr * weight_decay), out=param)
    g = effective_grad(param, grad, 0.0 if decoupled_weight_decay else weight_decay, maximize, a, b)
    lerp_(exp_avg, g, 1 - beta1, b)
    second_moment_(exp_avg_sq, g, beta2, b)
    bias_correction1, bias_correction2, rect = rectification(beta1, beta2, step)
    np.divide(exp_avg, dt(bias_correction1), out=a)  # g (possibly in `a`) is no longer needed
    np.multiply(a, dt(lr), out=a)
    if rect is not None:
        np.sqrt(exp_avg_sq, out=b)
        np.add(b, dt(eps), out=b)
        np.reciprocal(b, out=b)  # torch evaluates `number / tensor` as tensor.reciprocal() * number
        np.multiply(b, dt(math.sqrt(bias_correction2)), out=b)
        np.multiply(a, b, out=a)
        np.multiply(a, dt(rect), out=a)
    np.subtract(param, a, out=param)


# Every scalar arrives cast to the parameter dtype and the body has no float literals, so
# float32 parameters are updated in float32 arithmetic, as torch's are.
@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, m, v, sign, decay, l2, low, w, one_minus_w, beta2, one_minus_beta2, bc1, lr, rectified, one,
            eps, sqrt_bc2, rect):
    for i in numba.prange(p.size):
        gi = sign * g[i]
        pi = p[i] * decay  # decay is 1 unless decoupled weight decay
        gi = gi + l2 * pi  # l2 is 0 unless L2 weight decay
        d = gi - m[i]
        if low:  # torch's two-sided lerp
            mi = m[i] + w * d
        else:
            mi = gi - d * one_minus_w
        vi = v[i] * beta2 + one_minus_beta2 * gi * gi
        m[i] = mi
        v[i] = vi
        step = mi / bc1 * lr
        if rectified:
            step = step * (one / (np.sqrt(vi) + eps) * sqrt_bc2) * rect
        p[i] = pi - step


def radam_fused(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *, step: float,
                lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                decoupled_weight_decay: bool = False, maximize: bool = False, scratch=None) -> None:
    """Same contract as `radam_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, m, v = flat_views("radam", param, grad, exp_avg, exp_avg_sq)
    dt = param.dtype.type
    decoupled = decoupled_weight_decay and weight_decay != 0
    bias_correction1, bias_correction2, rect = rectification(beta1, beta2, step)
    w = 1 - beta1
    _update(p, g, m, v, dt(-1.0 if maximize else 1.0), dt(1 - lr * weight_decay if decoupled else 1.0),
            dt(0.0 if decoupled_weight_decay else weight_decay), abs(w) < 0.5, dt(w), dt(1 - w), dt(beta2),
            dt(1 - beta2), dt(bias_correction1), dt(lr), rect is not None, dt(1.0), dt(eps),
            dt(math.sqrt(bias_correction2)), dt(1.0 if rect is None else rect))


register("radam", "reference", radam_reference)
register("radam", "fused", radam_fused)
