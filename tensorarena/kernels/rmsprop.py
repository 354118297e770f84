"""RMSprop update of one array (a parameter or a flat buffer): a NumPy reference and a fused Numba twin.

torch.optim.RMSprop's single-tensor step (Hinton, Coursera lecture 6e; centered form after
Graves 2013), in torch's operation order: g = -grad if maximize else grad; g += wd * p;
v = alpha * v + (1 - alpha) * g * g; centered: a.lerp_(g, 1 - alpha), avg = sqrt(v - a * a),
else avg = sqrt(v); avg += eps; with momentum b = momentum * b + g / avg, p -= lr * b,
else p -= lr * g / avg. The fused twin does it in one pass over memory.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import effective_grad, flat_views, lerp_, underflow_is_zero


def _check(grad_avg, momentum_buffer, momentum: float) -> None:
    if momentum > 0 and momentum_buffer is None:
        raise ValueError("rmsprop: momentum > 0 needs a momentum_buffer array")


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def rmsprop_reference(param: np.ndarray, grad: np.ndarray, square_avg: np.ndarray, grad_avg: np.ndarray | None,
                      momentum_buffer: np.ndarray | None, *, lr: float, alpha: float, eps: float,
                      weight_decay: float, momentum: float, maximize: bool = False,
                      scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place RMSprop step of `param` (plain NumPy); centered when `grad_avg` is given.

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified.
    """
    _check(grad_avg, momentum_buffer, momentum)
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    g = effective_grad(param, grad, weight_decay, maximize, a, b)
    np.multiply(square_avg, dt(alpha), out=square_avg)
    np.multiply(g, dt(1 - alpha), out=b)
    np.multiply(b, g, out=b)
    np.add(square_avg, b, out=square_avg)
    if grad_avg is not None:
        lerp_(grad_avg, g, 1 - alpha, b)
        np.multiply(grad_avg, grad_avg, out=b)
        np.subtract(square_avg, b, out=b)
        np.sqrt(b, out=b)
    else:
        np.sqrt(square_avg, out=b)
    np.add(b, dt(eps), out=b)  # b = avg
    if momentum > 0:
        np.multiply(momentum_buffer, dt(momentum), out=momentum_buffer)
        np.divide(g, b, out=a)
        np.add(momentum_buffer, a, out=momentum_buffer)
        np.multiply(momentum_buffer, dt(-lr), out=a)
    else:
        np.multiply(g, dt(-lr), out=a)
        np.divide(a, b, out=a)
    np.add(param, a, out=param)


@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, v, ga, buf, centered, has_buf, sign, wd, alpha, one_minus_alpha, low, w, one_minus_w,
            eps, momentum, neg_lr):
    for i in numba.prange(p.size):
        gi = sign * g[i]
        gi = gi + wd * p[i]
        vi = v[i] * alpha + one_minus_alpha * gi * gi
        v[i] = vi
        if centered:
            d = gi - ga[i]
            if low:  # torch's two-sided lerp
                ai = ga[i] + w * d
            else:
                ai = gi - d * one_minus_w
            ga[i] = ai
            avg = np.sqrt(vi - ai * ai) + eps
        else:
            avg = np.sqrt(vi) + eps
        if has_buf:
            bi = buf[i] * momentum + gi / avg
            buf[i] = bi
            p[i] = p[i] + neg_lr * bi
        else:
            p[i] = p[i] + neg_lr * gi / avg


def rmsprop_fused(param: np.ndarray, grad: np.ndarray, square_avg: np.ndarray, grad_avg: np.ndarray | None,
                  momentum_buffer: np.ndarray | None, *, lr: float, alpha: float, eps: float, weight_decay: float,
                  momentum: float, maximize: bool = False, scratch=None) -> None:
    """Same contract as `rmsprop_reference`, in one parallel pass over C-contiguous arrays (no scratch)."""
    _check(grad_avg, momentum_buffer, momentum)
    has_buf = momentum > 0
    p, g, v, ga, buf = flat_views("rmsprop", param, grad, square_avg, grad_avg,
                                  momentum_buffer if has_buf else None)
    dt = param.dtype.type
    w = 1 - alpha
    _update(p, g, v, ga, buf, grad_avg is not None, has_buf, dt(-1.0 if maximize else 1.0), dt(weight_decay),
            dt(alpha), dt(w), abs(w) < 0.5, dt(w), dt(1 - w), dt(eps), dt(momentum), dt(-lr))


register("rmsprop", "reference", rmsprop_reference)
register("rmsprop", "fused", rmsprop_fused)
