"""Pooling layers with torch.nn's names, arguments, defaults and reprs, over ops/pool.py's functional forms."""

from __future__ import annotations

from ..ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from ..tensor import Tensor
from .module import Module


class MaxPool2d(Module):
    """torch.nn.MaxPool2d: the maximum of each window. Shape: (N, C, H, W) -> (N, C, oh, ow); stride defaults to
    kernel_size."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices:
            raise NotImplementedError("MaxPool2d: return_indices=True is not supported (there is no MaxUnpool2d "
                                      "here)")
        self.kernel_size, self.stride = kernel_size, kernel_size if stride is None else stride
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = False, ceil_mode

    def forward(self, x) -> Tensor:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """torch.nn.AvgPool2d: the mean of each window, the zero padding counted unless count_include_pad=False.
    Shape: (N, C, H, W) -> (N, C, oh, ow); stride defaults to kernel_size."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, kernel_size if stride is None else stride
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x) -> Tensor:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                          self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """torch.nn.AdaptiveAvgPool2d: averages over windows that split the input into output_size cells (None keeps
    that size). Shape: (N, C, H, W) -> (N, C, *output_size); AdaptiveAvgPool2d(1) is global average pooling."""

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x) -> Tensor:
        return adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
