"""Elementwise functions and activations: exp log sqrt tanh relu gelu sigmoid."""

from __future__ import annotations

from ..tensor import Tensor


def exp(a: Tensor) -> Tensor:
    """e ** a."""
    raise NotImplementedError


def log(a: Tensor) -> Tensor:
    """Natural log."""
    raise NotImplementedError


def sqrt(a: Tensor) -> Tensor:
    """Square root."""
    raise NotImplementedError


def tanh(a: Tensor) -> Tensor:
    """Hyperbolic tangent."""
    raise NotImplementedError


def relu(a: Tensor) -> Tensor:
    """max(a, 0); gradient 0 at 0, as torch."""
    raise NotImplementedError


def sigmoid(a: Tensor) -> Tensor:
    """1 / (1 + e^-a), computed stably for large |a|."""
    raise NotImplementedError


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """GELU; approximate="none" (erf form) or "tanh", as torch.nn.functional.gelu."""
    raise NotImplementedError
