"""im2col and col2im as differentiable ops: torch's F.unfold and F.fold, each the other's gradient.

unfold copies every sliding block of an (N, C, H, W) input into a column of an (N, C * kh * kw, L) output, L the
number of blocks (oh * ow), its rows channel-major, then kernel row, then kernel column (torch's layout, so a
convolution is weight (O, C * kh * kw) @ columns: nn/conv.py). fold sums such columns back into an image, the
elements of overlapping blocks adding up. Both loop over the kernel's offsets (ops/_windows.py): one strided copy
or add per offset, inside one recorded host call, on views of arena buffers, so a fused replay allocates nothing.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, new, reshaped
from ._windows import conv_axis, describe, extent, offsets, pair, positive


def _gather(x: np.ndarray, cols: np.ndarray, offs) -> None:
    """cols (..., C, kh, kw, oh, ow) = the blocks of x (..., C, H, W); a position in the padding is 0."""
    for off in offs:
        dst = cols[..., off.i, off.j, :, :]
        if not off.whole:
            dst.fill(0)
        if off.out is not None:
            np.copyto(dst[(Ellipsis,) + off.out], x[(Ellipsis,) + off.inp])


def _scatter(cols: np.ndarray, x: np.ndarray, offs) -> None:
    """x (..., C, H, W) = the sum of the blocks in cols (..., C, kh, kw, oh, ow) at their places (padding dropped)."""
    x.fill(0)
    for off in offs:
        if off.out is not None:
            dst = x[(Ellipsis,) + off.inp]
            np.add(dst, cols[..., off.i, off.j, :, :][(Ellipsis,) + off.out], out=dst)


def _geometry(op: str, spatial: tuple[int, int], kernel_size, dilation, padding, stride):
    kernel, dil = pair(kernel_size, f"{op}: kernel_size"), pair(dilation, f"{op}: dilation")
    pad, step = pair(padding, f"{op}: padding"), pair(stride, f"{op}: stride")
    for name, values in (("kernel_size", kernel), ("dilation", dil), ("stride", step)):
        positive(values, name, op)
    if any(p < 0 for p in pad):
        raise ValueError(f"{op}: padding must be non-negative, got {pad}")
    axes = tuple(conv_axis(n, k, s, d, p, p) for n, k, s, d, p in zip(spatial, kernel, step, dil, pad))
    if any(a.out <= 0 for a in axes):
        padded = tuple(n + 2 * p for n, p in zip(spatial, pad))
        raise ValueError(f"{op}: the kernel {kernel} (dilation {dil}, spanning {tuple(extent(a) for a in axes)}) "
                         f"is larger than the padded input {padded} (input {spatial}, padding {pad}); use a smaller "
                         f"kernel or dilation, or more padding")
    return axes


def _float_input(x: Tensor, op: str, dims: str, ndims: tuple[int, ...]) -> None:
    if x.ndim not in ndims:
        raise ValueError(f"{op}: expected a {dims} input, got shape {x.shape}")
    if x.dtype.kind != "f":
        raise TypeError(f"{op}: the input must be a float tensor, got {x.dtype_description()}; convert it, e.g. "
                        f"x.float()")


def _as_blocks(cols: np.ndarray, n: int, c: int, h, w, matrix: bool) -> np.ndarray:
    """A view of unfold's output as (N, C, kh, kw, oh, ow), from torch's layout or the matrix one (blocks())."""
    if matrix:
        return cols.reshape(c, h.kernel, w.kernel, n, h.out, w.out).transpose(3, 0, 1, 2, 4, 5)
    return cols.reshape(n, c, h.kernel, w.kernel, h.out, w.out)


def blocks(x: Tensor, h, w, *, matrix: bool = False) -> Tensor:
    """The unfold op on a checked (N, C, H, W) input and its two Axis: (N, C * kh * kw, oh * ow) as torch lays it
    out, or with `matrix` the im2col matrix (C * kh * kw, N * oh * ow), every image's blocks side by side, which
    a convolution multiplies by its weight in one 2-D product (nn/conv.py); copying into either is as fast (each
    offset's slab keeps rows of ow elements contiguous)."""
    xd = x.data
    n, c = xd.shape[:2]
    offs = offsets(h, w)
    rows, length = c * h.kernel * w.kernel, h.out * w.out
    shape = (rows, n * length) if matrix else (n, rows, length)
    out = new(shape, xd.dtype)
    host(_gather, xd, _as_blocks(out, n, c, h, w, matrix), offs)

    def backward(g):
        gx = new(xd.shape, g.dtype)
        host(_scatter, _as_blocks(reshaped(g, shape), n, c, h, w, matrix), gx, offs)
        return (gx,)

    return Tensor._make(out, (x,), backward)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:  # noqa: A002 - torch's name
    """torch.nn.functional.unfold (im2col). Shape: (N, C, H, W) -> (N, C * kh * kw, L), L = oh * ow blocks;
    (C, H, W) -> (C * kh * kw, L)."""
    x = as_tensor(input)
    _float_input(x, "unfold", "(N, C, H, W) or unbatched (C, H, W)", (3, 4))
    x4 = x if x.ndim == 4 else x.unsqueeze(0)
    h, w = _geometry("unfold", x4.shape[2:], kernel_size, dilation, padding, stride)
    out = blocks(x4, h, w)
    return out if x.ndim == 4 else out.squeeze(0)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:  # noqa: A002
    """torch.nn.functional.fold (col2im), unfold's adjoint: blocks summed into an image. Shape: (N, C * kh * kw, L)
    -> (N, C, *output_size); (C * kh * kw, L) -> (C, *output_size)."""
    cols = as_tensor(input)
    _float_input(cols, "fold", "(N, C * kh * kw, L) or unbatched (C * kh * kw, L)", (2, 3))
    c3 = cols if cols.ndim == 3 else cols.unsqueeze(0)
    size = pair(output_size, "fold: output_size")
    h, w = _geometry("fold", size, kernel_size, dilation, padding, stride)
    n, rows, length = c3.shape
    per_block = h.kernel * w.kernel
    if rows % per_block:
        raise ValueError(f"fold: the input's dimension 1 ({rows}, shape {describe(cols.shape)}) must be divisible "
                         f"by the kernel's size {h.kernel} * {w.kernel} = {per_block}")
    if length != h.out * w.out:
        raise ValueError(f"fold: output_size {size} with kernel_size {(h.kernel, w.kernel)}, dilation "
                         f"{(h.dilation, w.dilation)}, padding {(h.before, w.before)} and stride "
                         f"{(h.stride, w.stride)} has {h.out} * {w.out} = {h.out * w.out} blocks, but the input "
                         f"(shape {describe(cols.shape)}) has {length}")
    c = rows // per_block
    cd = c3.data
    offs = offsets(h, w)
    out = new((n, c) + size, cd.dtype)
    host(_scatter, reshaped(cd, (n, c, h.kernel, w.kernel, h.out, w.out)), out, offs)

    def backward(g):
        gc = new(cd.shape, g.dtype)
        host(_gather, g, gc.reshape(n, c, h.kernel, w.kernel, h.out, w.out), offs)
        return (gc,)

    out = Tensor._make(out, (c3,), backward)
    return out if cols.ndim == 3 else out.squeeze(0)
