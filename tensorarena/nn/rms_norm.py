"""RMSNorm: torch.nn.RMSNorm's layer over F.rms_norm (ops/rms_norm.py)."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import normalized_shape_of
from .module import Module
from .parameter import Parameter


class RMSNorm(Module):
    """Scale each vector over the trailing `normalized_shape` dims to unit root mean square, then by `weight`
    (ones at first). eps=None takes the input dtype's machine epsilon, as torch's."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, *,
                 dtype=np.float32) -> None:
        super().__init__()
        self.normalized_shape = normalized_shape_of("RMSNorm", normalized_shape)
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating))
                                or not 0.0 <= eps < float("inf")):
            raise ValueError(f"RMSNorm: eps must be a finite number >= 0 or None, got {eps!r}")
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = elementwise_affine
        # Registered even when None, as LayerNorm's: a slot that takes only a Parameter, as torch's
        self.register_parameter("weight", init.ones_(Parameter.empty(self.normalized_shape, dtype))
                                if elementwise_affine else None)

    def forward(self, x) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
