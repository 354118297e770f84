"""GroupNorm (torch.nn's) over F.group_norm: the channels (axis 1) of an (N, C, ...) input split into groups, each
group of each sample normalised by its own mean and biased variance, then scaled and shifted per channel. A
composition of differentiable ops (its gradient is theirs), so it trains on every route; no running statistics.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..tensor import Tensor
from . import init
from .layers import _size
from .module import Module
from .parameter import Parameter


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.group_norm. Shape: (N, C, ...) -> the same; weight and bias of shape (C,)."""
    x = input if isinstance(input, Tensor) else Tensor(np.asarray(input))
    if x.ndim < 2:
        raise ValueError(f"group_norm expects an (N, C, ...) input, got shape {tuple(x.shape)}")
    n, channels = x.shape[:2]
    if num_groups <= 0 or channels % num_groups:
        raise ValueError(f"group_norm: the input's {channels} channels (axis 1 of shape {tuple(x.shape)}) must be "
                         f"divisible by num_groups ({num_groups})")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (channels,):
            raise ValueError(f"group_norm: {name} of shape {tuple(p.shape)} must have one value per channel of "
                             f"the input of shape {tuple(x.shape)}: ({channels},)")
    # (N, G, C/G * spatial), its last size spelled out: -1 cannot be inferred from an empty batch (torch's N = 0
    # gives an empty output)
    grouped = x.reshape(n, num_groups, channels // num_groups * math.prod(x.shape[2:]))
    mean = ops.mean(grouped, -1, keepdim=True)
    var = ops.var(grouped, -1, keepdim=True, correction=0)
    out = ((grouped - mean) * ops.rsqrt(var + float(eps))).reshape(x.shape)
    per_channel = (1, channels) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    return out


class GroupNorm(Module):
    """torch.nn.GroupNorm(num_groups, num_channels): weight ones and bias zeros of shape (num_channels,) when
    affine."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        from ..device import check_cpu

        check_cpu(device, "GroupNorm")
        self.num_groups = _size("GroupNorm", "num_groups", num_groups)
        self.num_channels = _size("GroupNorm", "num_channels", num_channels)
        if self.num_groups == 0 or self.num_channels % self.num_groups:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.eps, self.affine = float(eps), affine
        dtype = dtype or np.float32
        self.register_parameter("weight", init.ones_(Parameter.empty((num_channels,), dtype)) if affine else None)
        self.register_parameter("bias", init.zeros_(Parameter.empty((num_channels,), dtype))
                                if affine and bias else None)

    def forward(self, x) -> Tensor:
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")
