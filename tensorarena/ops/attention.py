"""Transformer ops: scaled dot-product attention and bias+GELU, on the fused kernels."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: np.ndarray | None = None,
                                 causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(scale * q k^T + masks) v. Shape: q (B, H, T, hs), k (B, H, S, hs), v (B, H, S, hv) -> (B, H, T, hv).

    key_padding_mask: bool (B, S), True marks padding keys that must not be attended to.
    causal: query i attends to keys j <= i. scale defaults to 1/sqrt(hs).
    """
    raise NotImplementedError


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + bias) in one fused pass. Shape: (..., D) and (D,) -> (..., D)."""
    raise NotImplementedError
