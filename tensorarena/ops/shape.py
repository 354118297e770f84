"""Shape ops (views where NumPy gives one): reshape transpose permute and friends."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._base import new


def reshape(a: Tensor, *shape) -> Tensor:
    """Same data, new shape (one dim may be -1). Copies only if `a` is not contiguous."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    ad = a.data
    try:
        view = ad.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot view shape {ad.shape} ({ad.size} elements) as {tuple(shape)}") from None
    if not np.shares_memory(view, ad):  # NumPy had to copy: keep the copy in the arena
        copy = new(view.shape, view.dtype)
        np.copyto(copy, view)
        view, view_of = copy, None
    else:
        view_of = a

    def backward(g):
        return (g.reshape(ad.shape),)

    return Tensor._make(view, (a,), backward, view_of=view_of)


def transpose(a: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dimensions (a view)."""
    raise NotImplementedError


def permute(a: Tensor, *dims) -> Tensor:
    """Reorder dimensions (a view)."""
    raise NotImplementedError


def unsqueeze(a: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dimension at `dim`."""
    raise NotImplementedError


def squeeze(a: Tensor, dim=None) -> Tensor:
    """Drop size-1 dimensions (all, or only `dim`)."""
    raise NotImplementedError


def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one."""
    raise NotImplementedError


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate along an existing dim (torch.cat / concat)."""
    raise NotImplementedError


def stack(tensors, dim: int = 0) -> Tensor:
    """Stack along a new dim."""
    raise NotImplementedError
