"""NAdam update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.NAdam's single-tensor step (Dozat 2016, "Incorporating Nesterov Momentum into
Adam"), in torch's operation order: g = -grad if maximize else grad; decoupled decay
p *= 1 - lr * wd, or L2 decay g += wd * p; m.lerp_(g, 1 - beta1); v = beta2 * v + (1 - beta2) * g * g;
denom = sqrt(v / (1 - beta2^t)) + eps; p += c1 * g / denom; p += c2 * m / denom with
c1 = -lr (1 - mu_t) / (1 - prod mu) and c2 = -lr mu_{t+1} / (1 - prod mu * mu_{t+1}).
The momentum schedule mu_t and the running product (a scalar state the optimizer keeps)
are the caller's: the kernel takes mu, mu_next and the product with this step's mu in.
The fused twin does it in one pass over memory instead of ~12 NumPy passes.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import corrected_rms, effective_grad, flat_views, lerp_, second_moment_, underflow_is_zero


def _coefficients(lr: float, mu: float, mu_next: float, mu_product: float) -> tuple[float, float]:
    return -lr * (1.0 - mu) / (1.0 - mu_product), (-lr * mu_next) / (1.0 - mu_product * mu_next)


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def nadam_reference(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
                    step: float, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                    mu: float, mu_next: float, mu_product: float, decoupled_weight_decay: bool = False,
                    maximize: bool = False, scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place NAdam step of `param` at (already incremented) step `step` (plain NumPy).

    `mu_product` is the product of mu over steps 1..step (this step's `mu` included).
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
    corrected_rms(exp_avg_sq, beta2, step, eps, b)  # torch divides before the root here, unlike Adam
    c1, c2 = _coefficients(lr, mu, mu_next, mu_product)
    np.multiply(g, dt(c1), out=a)  # g may live in `a`: it is read before it is overwritten
    np.divide(a, b, out=a)
    np.add(param, a, out=param)
    np.multiply(exp_avg, dt(c2), out=a)
    np.divide(a, b, out=a)
    np.add(param, a, out=param)


# Every scalar arrives cast to the parameter dtype and the body has no float literals, so
# float32 parameters are updated in float32 arithmetic, as torch's are.
@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, m, v, sign, decay, l2, low, w, one_minus_w, beta2, one_minus_beta2, bc2, eps, c1, c2):
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
        denom = np.sqrt(vi / bc2) + eps
        pi = pi + c1 * gi / denom
        p[i] = pi + c2 * mi / denom


def nadam_fused(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
                step: float, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                mu: float, mu_next: float, mu_product: float, decoupled_weight_decay: bool = False,
                maximize: bool = False, scratch=None) -> None:
    """Same contract as `nadam_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    p, g, m, v = flat_views("nadam", param, grad, exp_avg, exp_avg_sq)
    dt = param.dtype.type
    decoupled = decoupled_weight_decay and weight_decay != 0
    c1, c2 = _coefficients(lr, mu, mu_next, mu_product)
    w = 1 - beta1
    _update(p, g, m, v, dt(-1.0 if maximize else 1.0), dt(1 - lr * weight_decay if decoupled else 1.0),
            dt(0.0 if decoupled_weight_decay else weight_decay), abs(w) < 0.5, dt(w), dt(1 - w), dt(beta2),
            dt(1 - beta2), dt(1 - beta2**step), dt(eps), dt(c1), dt(c2))


register("nadam", "reference", nadam_reference)
register("nadam", "fused", nadam_fused)
