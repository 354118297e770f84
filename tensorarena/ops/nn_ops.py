"""Layer-level ops: dropout and layer_norm."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor


def dropout(a: Tensor, p: float = 0.5, *, training: bool = True, rng: np.random.Generator | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (inverted dropout)."""
    raise NotImplementedError


def layer_norm(a: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing `normalized_shape` dims, then scale and shift."""
    raise NotImplementedError
