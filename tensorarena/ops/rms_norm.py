"""rms_norm: scale each vector over the trailing dims to unit root mean square (torch.nn.functional.rms_norm).

    y = x / sqrt(mean(x**2 over normalized_shape) + eps) * weight

It is a composition of differentiable ops (as torch's own CPU rms_norm is), so its gradient is theirs and the
fused route traces it like any other step. eps=None takes the machine epsilon of the input's dtype, as torch does.
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._base import as_tensor
from .linalg import _check_float_pair


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """torch.nn.functional.rms_norm. Shape: (..., *normalized_shape) -> same; weight of shape normalized_shape."""
    from .arith import add, mul
    from .pointwise import rsqrt
    from .reduce import mean

    norm_shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
    input = as_tensor(input)
    if input.dtype.kind != "f":  # torch refuses an integer input too: the mean would be truncated
        raise TypeError(f"rms_norm: the input must be floating point, got dtype {input.dtype}; cast it first "
                        f"(e.g. x.float())")
    k = len(norm_shape)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != norm_shape:
        raise ValueError(f"rms_norm: normalized_shape {norm_shape} must equal the trailing dims of the input "
                         f"shape {tuple(input.shape)}")
    if weight is not None:
        weight = as_tensor(weight)
        if tuple(weight.shape) != norm_shape:
            raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} must equal normalized_shape "
                             f"{norm_shape}")
        _check_float_pair(input, weight, "rms_norm", "the input", "the weight")
    if eps is None:
        eps = float(np.finfo(input.dtype).eps)
    elif isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)) or not 0.0 <= eps:
        raise ValueError(f"rms_norm: eps must be a number >= 0 (or None for the dtype's epsilon), got {eps!r}")
    dims = tuple(range(input.ndim - k, input.ndim))
    out = mul(input, rsqrt(add(mean(mul(input, input), dims, keepdim=True), float(eps))))
    return out if weight is None else mul(out, weight)
