"""Convolutions (torch's F.conv1d / F.conv2d, nn.Conv1d / nn.Conv2d): im2col, then one matrix product.

A convolution is the weight seen as a matrix (O, C/groups * kh * kw) times ops/conv.py's im2col matrix (every block
of every image a column: (C * kh * kw, N * L)), one 2-D product through the engine's matmul (its fast GEMM route, and
bfloat16 products when asked for), plus the bias; groups multiply their own rows of the matrix by their own slice of
the weight in one batched product. (Multiplying torch's (N, C * kh * kw, L) unfold image by image on NumPy's matmul
took 0.2 s where the one product takes 0.03 s: a 3x3, 64-channel layer on 32 images of 32x32, one thread.)
Every step is a differentiable op, so the gradients (input, weight, bias) are theirs and a fused step replays them.
A 1-D convolution is a 2-D one over a height of 1.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..device import check_cpu
from ..ops._base import as_tensor, is_int
from ..ops._windows import conv_axis, describe, extent, pair, positive
from ..ops.conv import blocks
from ..tensor import Tensor
from . import init
from .layers import _empty_param, _size
from .module import Module

PADDING_STRINGS = ("valid", "same")


def _padding(op: str, padding, kernel, dilation, stride, n: int) -> tuple[tuple[int, int], ...]:
    """(before, after) per spatial dim; "same" puts the odd element of an even kernel's padding after, as torch."""
    if isinstance(padding, str):
        if padding not in PADDING_STRINGS:
            raise ValueError(f"{op}: invalid padding string {padding!r}, should be one of {set(PADDING_STRINGS)}")
        if padding == "valid":
            return ((0, 0),) * n
        if any(s != 1 for s in stride):
            raise ValueError(f"{op}: padding='same' is not supported for strided convolutions (stride {stride}); "
                             f"give the padding as numbers")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    pads = pair(padding, f"{op}: padding", n)
    if any(p < 0 for p in pads):
        raise ValueError(f"{op}: padding must be non-negative, got {pads}")
    return tuple((p, p) for p in pads)


def _conv(op: str, n: int, input, weight, bias, stride, padding, dilation, groups) -> Tensor:
    """conv1d (n = 1) or conv2d (n = 2): checks named for `op`, then a 2-D convolution of the input as
    (N, C, H, W) (a 1-D one with H = 1)."""
    x, w = as_tensor(input), as_tensor(weight)
    b = None if bias is None else as_tensor(bias)
    if x.ndim not in (n + 1, n + 2):
        raise ValueError(f"{op}: expected an unbatched ({n + 1}-D) or batched ({n + 2}-D) input, got shape "
                         f"{describe(x.shape)}")
    if w.ndim != n + 2:
        raise ValueError(f"{op}: the weight must be {n + 2}-D (out_channels, in_channels / groups, *kernel_size), got "
                         f"shape {describe(w.shape)}")
    if not is_int(groups) or groups <= 0:
        raise ValueError(f"{op}: groups must be a positive integer, got {groups!r}")
    out_ch, group_ch = w.shape[:2]
    channels = x.shape[-n - 1]
    if out_ch % groups:
        raise ValueError(f"{op}: the weight's {out_ch} output channels (shape {describe(w.shape)}) must be divisible "
                         f"by groups={groups}")
    if channels != group_ch * groups:
        raise ValueError(f"{op}: the input of shape {describe(x.shape)} has {channels} channels, but the weight of "
                         f"shape {describe(w.shape)} with groups={groups} expects {group_ch * groups} "
                         f"(in_channels / groups = {group_ch}); check the layer's in_channels or the input's layout "
                         f"(channels first: (N, C, ...))")
    if b is not None and tuple(b.shape) != (out_ch,):
        raise ValueError(f"{op}: the bias of shape {describe(b.shape)} must be ({out_ch},), one per output channel "
                         f"of the weight of shape {describe(w.shape)}")
    if x.dtype.kind != "f":
        raise TypeError(f"{op}: the input must be a float tensor, got {x.dtype_description()}; convert it, e.g. "
                        f"x.float()")
    for what, t in (("weight", w), ("bias", b)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{op}: the input is {x.dtype_description()} but the {what} is "
                            f"{t.dtype_description()}; both must be the same float dtype. Convert the data (e.g. "
                            f"x.astype(np.float32)) or the model (model.double() / model.float())")
    kernel = w.shape[2:]
    step, dil = pair(stride, f"{op}: stride", n), pair(dilation, f"{op}: dilation", n)
    positive(step, "stride", op)
    positive(dil, "dilation", op)
    pads = _padding(op, padding, kernel, dil, step, n)
    spatial = x.shape[-n:]
    axes = [conv_axis(size, k, s, d, lo, hi) for size, k, s, d, (lo, hi) in zip(spatial, kernel, step, dil, pads)]
    if any(a.out <= 0 for a in axes):
        padded = tuple(size + lo + hi for size, (lo, hi) in zip(spatial, pads))
        raise ValueError(f"{op}: the kernel {tuple(kernel)} (dilation {dil}, spanning "
                         f"{tuple(extent(a) for a in axes)}) is larger than the padded input {padded} (input of shape "
                         f"{describe(x.shape)}, padding {tuple(pads)}); use a smaller kernel or more padding")
    if n == 1:  # a height of 1: the 2-D geometry's first axis, one row, no padding
        axes.insert(0, conv_axis(1, 1, 1, 1, 0, 0))
    batched = x.ndim == n + 2
    x4 = x if batched else x.unsqueeze(0)
    if n == 1:
        x4 = x4.unsqueeze(2)  # (N, C, 1, L)
    h, wa = axes
    batch, blocks_n = x4.shape[0], x4.shape[0] * h.out * wa.out
    cols = blocks(x4, h, wa, matrix=True)  # (C * kh * kw, N * oh * ow): every image's blocks side by side
    if groups == 1:  # one 2-D product, the engine's fast one: (O, K) @ (K, N * L)
        out = ops.matmul(w.reshape(out_ch, -1), cols)
    else:  # each group's (O/g, K/g) weight times its own rows of the matrix, as one batched product
        grouped = cols.reshape(groups, -1, blocks_n)  # (g, K/g, N * L)
        out = ops.matmul(w.reshape(groups, out_ch // groups, -1), grouped).reshape(out_ch, blocks_n)
    if b is not None:
        out = out + b.reshape(out_ch, 1)
    spatial_out = tuple(a.out for a in axes[2 - n:])
    # (O, N, *spatial) -> (N, O, *spatial), made contiguous as torch's output is (a later .view() works on it)
    out = out.reshape((out_ch, batch) + spatial_out).transpose(0, 1).contiguous()
    return out if batched else out.squeeze(0)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:  # noqa: A002
    """torch.nn.functional.conv2d. Shape: (N, C, H, W) with weight (O, C / groups, kh, kw) -> (N, O, oh, ow);
    padding an int, a pair, "valid" or "same" (stride 1)."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:  # noqa: A002
    """torch.nn.functional.conv1d. Shape: (N, C, L) with weight (O, C / groups, k) -> (N, O, out_length)."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


class _ConvNd(Module):
    """torch's _ConvNd: arguments, attributes, weight (out, in / groups, *kernel_size), bias (out,) and init."""

    _n = 2
    _functional = staticmethod(conv2d)

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None, *,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        name, n = type(self).__name__, self._n
        check_cpu(device, name)
        self.in_channels = _size(name, "in_channels", in_channels)
        self.out_channels = _size(name, "out_channels", out_channels)
        if not is_int(groups) or groups <= 0:
            raise ValueError(f"{name}: groups must be a positive integer, got {groups!r}")
        if in_channels % groups or out_channels % groups:
            which = "in_channels" if in_channels % groups else "out_channels"
            raise ValueError(f"{name}: {which} ({in_channels if which == 'in_channels' else out_channels}) must be "
                             f"divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{name}: padding_mode {padding_mode!r} is not supported; only 'zeros' is "
                                      f"(pad the input yourself with F.pad for another mode)")
        self.kernel_size = pair(kernel_size, f"{name}: kernel_size", n)
        self.stride = pair(stride, f"{name}: stride", n)
        self.dilation = pair(dilation, f"{name}: dilation", n)
        for what, values in (("kernel_size", self.kernel_size), ("stride", self.stride),
                             ("dilation", self.dilation)):
            positive(values, what, name)
        if isinstance(padding, str):
            _padding(name, padding, self.kernel_size, self.dilation, self.stride, n)  # the checks, at construction
            self.padding = padding
        else:
            self.padding = pair(padding, f"{name}: padding", n)
        self.output_padding, self.transposed = (0,) * n, False
        self.groups, self.padding_mode = int(groups), padding_mode
        shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        self.weight = _empty_param(shape, dtype or np.float32)
        self.register_parameter("bias", _empty_param((self.out_channels,), dtype or np.float32) if bias else None)
        self.reset_parameters(rng=rng)

    def reset_parameters(self, *, rng: np.random.Generator | None = None) -> None:
        """torch's default: kaiming_uniform(a=sqrt(5)) for the weight, U(+-1/sqrt(fan_in)) for the bias."""
        rng = init.get_generator(rng)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5), rng=rng)
        if self.bias is not None:
            fan_in = (self.in_channels // self.groups) * math.prod(self.kernel_size)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            init.uniform_(self.bias, -bound, bound, rng=rng)

    def forward(self, x) -> Tensor:
        return self._functional(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * self._n:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._n:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class Conv2d(_ConvNd):
    """torch.nn.Conv2d. Shape: (N, C_in, H, W) -> (N, C_out, oh, ow); weight (C_out, C_in / groups, kh, kw)."""

    _n = 2
    _functional = staticmethod(conv2d)


class Conv1d(_ConvNd):
    """torch.nn.Conv1d. Shape: (N, C_in, L) -> (N, C_out, out_length); weight (C_out, C_in / groups, k)."""

    _n = 1
    _functional = staticmethod(conv1d)
