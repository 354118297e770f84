"""Gradient clipping in place (torch.nn.utils.clip_grad_norm_ / clip_grad_value_)."""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from ..tensor import Tensor


def _grads(parameters: Tensor | Iterable[Tensor]) -> list[np.ndarray]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p.grad for p in params if p.grad is not None]


def _norm(g: np.ndarray, p: float) -> float:
    """The p-norm of one array, accumulated in float64, without array-sized temporaries for p in {2, inf}."""
    flat = g.reshape(-1)
    if p == 2.0:
        if flat.dtype == np.float64:
            return math.sqrt(float(np.dot(flat, flat)))
        # float64 accumulation through einsum's small fixed-size casting buffer, not a float64 copy.
        return math.sqrt(float(np.einsum("i,i->", flat, flat, dtype=np.float64)))
    if p == math.inf:
        if flat.size == 0:
            return 0.0
        return float(max(flat.max(), -flat.min()))
    return float(np.sum(np.abs(flat, dtype=np.float64) ** p) ** (1.0 / p))


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale all gradients in place so their global `norm_type`-norm is at most `max_norm`; returns the norm.

    As in torch the scale is max_norm / (total + 1e-6), applied when it is below 1
    (and also when the norm is NaN, which makes the gradients NaN as torch does). The norm comes back as
    torch's does: a 0-d tensor in the gradients' dtype (the widest of them; float32 when there are none), so
    `.item()`, float(), comparisons and f"{norm:.3f}" work on it. `foreach` is accepted for torch's signature
    only: there is one implementation, which accumulates each gradient's norm in float64.
    """
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"norm_type must be positive or inf, got {norm_type}")
    if math.isnan(max_norm) or max_norm < 0:
        raise ValueError(f"max_norm must be a non-negative number, got {max_norm}")
    grads = _grads(parameters)
    if not grads:
        return Tensor(np.zeros((), np.float32))  # torch's torch.tensor(0.0)
    # Overflow to inf and inf * 0 -> NaN are legitimate outcomes here (torch returns them too);
    # error_if_nonfinite is the switch for raising on them. Scaling a tiny gradient into subnormals is
    # legitimate too (torch does it silently); under np.seterr(all="raise") it raised.
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        norms = [_norm(g, norm_type) for g in grads]
        if norm_type == math.inf:
            total = max(norms) if not any(math.isnan(n) for n in norms) else math.nan
        else:
            try:
                total = math.fsum(n**norm_type for n in norms) ** (1.0 / norm_type)
            except OverflowError:
                total = math.inf
            if any(math.isnan(n) for n in norms):
                total = math.nan
        if error_if_nonfinite and not math.isfinite(total):
            raise RuntimeError(
                f"the total norm of order {norm_type} of the gradients is non-finite ({total}), so it cannot "
                f"be clipped. To disable this error and scale the gradients by the non-finite norm anyway, "
                f"set error_if_nonfinite=False")
        coef = max_norm / (total + 1e-6)
        if not coef >= 1.0:  # also true for NaN, as in torch
            for g in grads:
                np.multiply(g, coef, out=g)
        # The dtype torch's stack of per-dtype norms promotes to; float64 -> float32 may round a huge norm to inf.
        return Tensor(np.asarray(total, np.result_type(*{g.dtype for g in grads})))


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient in place to [-clip_value, clip_value]. `foreach` is torch's choice of kernel, taken and
    not needed: one NumPy clip per gradient either way."""
    clip_value = float(clip_value)
    if not clip_value >= 0:
        raise ValueError(f"clip_value must be a non-negative number, got {clip_value}")
    for g in _grads(parameters):
        np.clip(g, -clip_value, clip_value, out=g)
