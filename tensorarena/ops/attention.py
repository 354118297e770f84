"""Transformer ops: scaled dot-product attention and bias+GELU, on the fused kernels."""

from __future__ import annotations

import numpy as np

from ..kernels import kernel
from ..tensor import Tensor
from ._base import as_dtype, as_tensor, contiguous, grad_out, new


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: np.ndarray | None = None,
                                 causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(scale * q k^T + masks) v. Shape: q (B, H, T, hs), k (B, H, S, hs), v (B, H, S, hv) -> (B, H, T, hv).

    key_padding_mask: bool (B, S), True marks padding keys that must not be attended to.
    causal: query i attends to keys j <= i. scale defaults to 1/sqrt(hs).
    A query with no key left to attend to gets zeros (and zero gradients), not NaN.
    """
    q, k, v = as_tensor(q), as_tensor(k), as_tensor(v)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    # The kernels walk contiguous rows in one dtype; copies (arena) only when needed.
    qd, kd, vd = (contiguous(t.data, dtype) for t in (q, k, v))
    kpm = key_padding_mask.data if isinstance(key_padding_mask, Tensor) else key_padding_mask
    if qd.ndim != 4 or kd.ndim != 4 or vd.ndim != 4:
        raise ValueError(f"scaled_dot_product_attention: q, k, v must be 4-D (B, H, T, hs); got shapes "
                         f"{qd.shape}, {kd.shape}, {vd.shape} (unbatched or 3-D inputs: unsqueeze first)")
    out = new(qd.shape[:3] + vd.shape[3:], dtype)  # (B, H, T, hv)
    probs = new(qd.shape[:3] + kd.shape[2:3], dtype)  # (B, H, T, S), kept for backward
    kernel("attention_forward")(qd, kd, vd, kpm, bool(causal), scale, out, probs)

    def backward(g):
        g = contiguous(g, dtype)
        # The kernel computes all three; a grad nobody asked for lands in arena scratch.
        dq, dk, dv = (grad_out(t, t.shape, dtype) if t.requires_grad else new(t.shape, dtype) for t in (q, k, v))
        kernel("attention_backward")(qd, kd, vd, probs, g, scale, dq, dk, dv)
        return tuple(as_dtype(d, t.dtype) if t.requires_grad else None for d, t in ((dq, q), (dk, k), (dv, v)))

    return Tensor._make(out, (q, k, v), backward)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + bias) in one fused pass. Shape: (..., D) and (D,) -> (..., D)."""
    x, bias = as_tensor(x), as_tensor(bias)
    if x.ndim == 0 or bias.shape != x.shape[-1:]:
        raise ValueError(f"bias_gelu: bias shape {bias.shape} must be (D,) for input shape {x.shape} (..., D)")
    dtype = np.result_type(x.dtype, bias.dtype)
    d = x.shape[-1]
    x2 = contiguous(x.data, dtype).reshape(-1, d)  # (N, D)
    b = contiguous(bias.data, dtype)
    pre = new(x2.shape, dtype)  # x + bias, kept for backward
    out = new(x.shape, dtype)
    kernel("bias_gelu_forward")(x2, b, pre, out.reshape(x2.shape), approximate)

    def backward(g):
        dx = new(x2.shape, dtype)
        # dbias is a column sum of dx; a bias used once gets it written into its persistent buffer.
        db = grad_out(bias, bias.shape, bias.dtype) if bias.requires_grad else new(bias.shape, dtype)
        kernel("bias_gelu_backward")(pre, contiguous(g).reshape(x2.shape), dx, db, approximate)
        gx = as_dtype(dx.reshape(x.shape), x.dtype) if x.requires_grad else None
        return gx, db if bias.requires_grad else None

    return Tensor._make(out, (x, bias), backward)
