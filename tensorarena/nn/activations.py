"""Activation modules beside layers.py's, torch.nn's names and arguments: ReLU6, Hardtanh, LogSigmoid, Mish.

`inplace=True` is accepted, as in layers.py, for ported models; the output is the same and the input is left as
it is (ops here never write their input).
"""

from __future__ import annotations

from ..tensor import Tensor
from . import functional as F
from .module import Module


class Hardtanh(Module):
    """min(max(x, min_val), max_val); torch's nn.Hardtanh, which also refuses max_val <= min_val."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        if not max_val > min_val:
            raise ValueError(f"Hardtanh: max_val must be greater than min_val, got min_val={min_val}, "
                             f"max_val={max_val}")
        self.min_val, self.max_val, self.inplace = float(min_val), float(max_val), inplace

    def forward(self, x) -> Tensor:
        return F.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class ReLU6(Hardtanh):
    """min(max(x, 0), 6): Hardtanh(0, 6), as torch's nn.ReLU6 is."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class LogSigmoid(Module):
    """log(sigmoid(x)), computed stably."""

    def forward(self, x) -> Tensor:
        return F.logsigmoid(x)


class Mish(Module):
    """x * tanh(softplus(x))."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x) -> Tensor:
        return F.mish(x)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class CosineSimilarity(Module):
    """F.cosine_similarity along `dim` (torch's nn.CosineSimilarity)."""

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2) -> Tensor:
        return F.cosine_similarity(x1, x2, dim=self.dim, eps=self.eps)
