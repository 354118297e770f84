"""Losses: cross_entropy (ignore_index, label_smoothing) and mse_loss."""

from __future__ import annotations

from ..tensor import Tensor


def cross_entropy(logits: Tensor, target, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> Tensor:
    """torch.nn.functional.cross_entropy for class-index targets. Shape: (N, C) or (N, C, d...) and (N,) / (N, d...)."""
    raise NotImplementedError


def mse_loss(input: Tensor, target, reduction: str = "mean") -> Tensor:  # noqa: A002 - torch's name
    """Mean squared error."""
    raise NotImplementedError
