"""SGD update of one parameter tensor: a NumPy reference and a fused Numba twin.

Exactly torch.optim.SGD's single-tensor step: g = -grad if maximize else grad; g += weight_decay * p;
with momentum, buf = g on the first step and buf = momentum * buf + (1 - dampening) * g after;
g = g + momentum * buf (nesterov) or buf; then p -= lr * g. Arithmetic stays in the parameter's
dtype, as torch's does, so float32 trajectories track torch's step for step. The fused twin is
one pass over memory instead of up to six NumPy passes and their temporaries.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import effective_grad, underflow_is_zero


def _check(param: np.ndarray, grad: np.ndarray, momentum_buffer: np.ndarray | None, momentum: float) -> None:
    if grad.shape != param.shape:
        raise ValueError(f"sgd_update: grad shape {grad.shape} differs from param shape {param.shape}")
    if momentum != 0.0:
        if momentum_buffer is None:
            raise ValueError("sgd_update: momentum != 0 needs a momentum_buffer array (its contents are "
                             "overwritten when first_step=True)")
        if momentum_buffer.shape != param.shape:
            raise ValueError(f"sgd_update: momentum_buffer shape {momentum_buffer.shape} differs from param "
                             f"shape {param.shape}")


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def sgd_reference(param: np.ndarray, grad: np.ndarray, momentum_buffer: np.ndarray | None, *, lr: float,
                  momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
                  first_step: bool, scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """In-place SGD step of `param` (and `momentum_buffer` when momentum != 0) (plain NumPy).

    `scratch` is two persistent arrays shaped like `param` (allocated here when not given), so a
    training loop allocates nothing per step; `grad` is never modified.
    """
    _check(param, grad, momentum_buffer, momentum)
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type  # torch's scalars meet the tensors in the tensor's dtype
    g = effective_grad(param, grad, weight_decay, maximize, a, b)
    if momentum != 0.0:
        buf = momentum_buffer
        if first_step:
            np.copyto(buf, g)
        else:
            buf *= dt(momentum)
            np.multiply(g, dt(1.0 - dampening), out=b)
            buf += b
        if nesterov:
            np.multiply(buf, dt(momentum), out=b)
            np.add(g, b, out=a)
            g = a
        else:
            g = buf
    np.multiply(g, dt(lr), out=b)
    param -= b


@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, buf, has_buf, lr, momentum, damp1, weight_decay, nesterov, sign, first_step):
    for i in numba.prange(p.shape[0]):
        gi = sign * g[i]
        if weight_decay != 0.0:
            gi = gi + weight_decay * p[i]
        if has_buf:
            if first_step:
                b = gi
            else:
                b = momentum * buf[i] + damp1 * gi
            buf[i] = b
            if nesterov:
                gi = gi + momentum * b
            else:
                gi = b
        p[i] = p[i] - lr * gi


def sgd_fused(param: np.ndarray, grad: np.ndarray, momentum_buffer: np.ndarray | None, *, lr: float,
              momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
              first_step: bool, scratch=None) -> None:
    """Same contract as `sgd_reference`, in one parallel pass over memory (needs no scratch)."""
    _check(param, grad, momentum_buffer, momentum)
    has_buf = momentum != 0.0
    # The kernel walks flat views; a non-contiguous array goes through a contiguous copy and back.
    p = np.ascontiguousarray(param)
    b = np.ascontiguousarray(momentum_buffer) if has_buf else p  # p stands in for an absent buffer
    dt = param.dtype.type  # scalars in the parameter's dtype keep the arithmetic there, as in torch
    _update(p.reshape(-1), np.ascontiguousarray(grad).reshape(-1), b.reshape(-1), has_buf, dt(lr), dt(momentum),
            dt(1.0 - dampening), dt(weight_decay), bool(nesterov), dt(-1.0 if maximize else 1.0), bool(first_step))
    if p is not param:
        np.copyto(param, p)
    if has_buf and b is not momentum_buffer:
        np.copyto(momentum_buffer, b)


register("sgd", "reference", sgd_reference)
register("sgd", "fused", sgd_fused)
