"""Selection: indexing (basic, slices, integer arrays), where, embedding lookup."""

from __future__ import annotations

from ..tensor import Tensor


def getitem(a: Tensor, index) -> Tensor:
    """a[index]: ints, slices, None, Ellipsis, integer/bool arrays or Tensors (NumPy rules)."""
    raise NotImplementedError


def where(condition, a, b) -> Tensor:
    """Elementwise `a if condition else b`, broadcasting all three."""
    raise NotImplementedError


def embedding(indices, weight: Tensor) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) picked by integer `indices`. Shape: (...) -> (..., dim)."""
    raise NotImplementedError
