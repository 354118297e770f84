"""Flatten and Unflatten as modules (torch.nn's names and defaults): reshapes a Sequential can hold."""

from __future__ import annotations

from ..ops.shape import flatten, unflatten
from ..tensor import Tensor
from .module import Module


class Flatten(Module):
    """Merge dims start_dim..end_dim into one; by default all but the batch dim, as torch's nn.Flatten.
    Shape: (N, *dims) -> (N, prod(dims))."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x) -> Tensor:
        return flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim `dim` into `unflattened_size` (torch's nn.Unflatten). Shape: (N, C*H*W) -> (N, C, H, W) for
    Unflatten(1, (C, H, W))."""

    def __init__(self, dim: int, unflattened_size) -> None:
        super().__init__()
        if not isinstance(unflattened_size, (tuple, list)):
            raise TypeError(f"Unflatten: unflattened_size must be a tuple or list of ints, got "
                            f"{type(unflattened_size).__name__}")
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x) -> Tensor:
        return unflatten(x, self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
