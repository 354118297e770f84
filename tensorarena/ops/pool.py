"""2-D pooling as differentiable ops: torch's F.max_pool2d, F.avg_pool2d and F.adaptive_avg_pool2d.

max and average pooling loop over the kernel's offsets as unfold does (ops/_windows.py): one strided slab of the
input against the output per offset, inside one recorded host call, every temporary (max pooling's winning offset
per output, its masks; average pooling's divisor) an arena buffer, so a fused replay allocates nothing. Max pooling
keeps, per output, which offset won (the first maximum in the window's row-major order, or the last NaN, as
torch's CPU kernel picks), and its backward sends each gradient there.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, is_int, new
from ._windows import counts, describe, offsets, pair, pool_axis, positive


def _max_forward(x, offs, out, arg, mask, other) -> None:
    """out = the window maxima of x; arg = the winning offset's number (-1 before any offset was seen)."""
    out.fill(-np.inf if out.dtype.kind == "f" else np.iinfo(out.dtype).min)
    arg.fill(-1)
    covered = False  # every output has met an element of its window, so the fill value no longer wins by default
    seen = False  # an offset has been compared
    for off in offs:
        if off.out is None:
            continue
        at = (Ellipsis,) + off.out
        val, best, won, m, o = x[(Ellipsis,) + off.inp], out[at], arg[at], mask[at], other[at]
        if off.whole and not seen:
            np.copyto(out, val)  # the first element of every window: it wins outright
            arg.fill(off.k)
            covered = seen = True
            continue
        seen = True
        np.greater(val, best, out=m)
        if not covered:
            np.less(won, 0, out=o)  # the window's first element wins even when it is -inf
            np.logical_or(m, o, out=m)
        if val.dtype.kind == "f":
            np.isnan(val, out=o)
            np.logical_or(m, o, out=m)
        np.copyto(best, val, where=m)
        np.copyto(won, off.k, where=m)
        covered = covered or off.whole


def _max_backward(g, arg, offs, gx, mask) -> None:
    gx.fill(0)
    for off in offs:
        if off.out is not None:
            at, dst = (Ellipsis,) + off.out, gx[(Ellipsis,) + off.inp]
            np.equal(arg[at], off.k, out=mask[at])
            np.add(dst, g[at], out=dst, where=mask[at])


def _sum_windows(x, offs, out) -> None:
    out.fill(0)
    for off in offs:
        if off.out is not None:
            dst = out[(Ellipsis,) + off.out]
            np.add(dst, x[(Ellipsis,) + off.inp], out=dst)


def _spread(g, offs, gx) -> None:
    """gx = each output's gradient added to every input element of its window (the adjoint of _sum_windows)."""
    gx.fill(0)
    for off in offs:
        if off.out is not None:
            dst = gx[(Ellipsis,) + off.inp]
            np.add(dst, g[(Ellipsis,) + off.out], out=dst)


def _fill_divisor(out, rows: tuple[int, ...], cols: tuple[int, ...]) -> None:
    """out (oh, ow) = rows[i] * cols[j]: each output's window size (the arrays are oh and ow long, batch-free)."""
    np.multiply.outer(np.array(rows, out.dtype), np.array(cols, out.dtype), out=out)


def _pool_geometry(op: str, x: Tensor, kernel_size, stride, padding, dilation, ceil_mode: bool):
    if x.ndim not in (3, 4):
        raise ValueError(f"{op}: expected a (N, C, H, W) or unbatched (C, H, W) input, got shape {describe(x.shape)}")
    kernel = pair(kernel_size, f"{op}: kernel_size")
    step = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        pair(stride, f"{op}: stride")
    pad, dil = pair(padding, f"{op}: padding"), pair(dilation, f"{op}: dilation")
    for name, values in (("kernel_size", kernel), ("stride", step), ("dilation", dil)):
        positive(values, name, op)
    extents = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dil))
    if any(p < 0 or p > e // 2 for p, e in zip(pad, extents)):
        raise ValueError(f"{op}: padding {pad} must be non-negative and at most half the (dilated) kernel "
                         f"{extents}, as torch requires")
    axes = tuple(pool_axis(n, k, s, d, p, bool(ceil_mode)) for n, k, s, d, p in zip(x.shape[-2:], kernel, step, dil,
                                                                                    pad))
    if any(a.out <= 0 for a in axes):
        raise ValueError(f"{op}: the input of shape {describe(x.shape)} is too small for the kernel {kernel} "
                         f"(padding {pad}, dilation {dil}): the output would be {tuple(a.out for a in axes)}")
    return axes


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,  # noqa: A002
               return_indices: bool = False) -> Tensor:
    """torch.nn.functional.max_pool2d. Shape: (N, C, H, W) -> (N, C, oh, ow); stride defaults to kernel_size."""
    if return_indices:
        raise NotImplementedError("max_pool2d: return_indices=True is not supported (there is no MaxUnpool2d here)")
    x = as_tensor(input)
    h, w = _pool_geometry("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    xd, offs = x.data, offsets(h, w)
    shape = xd.shape[:-2] + (h.out, w.out)
    out = new(shape, xd.dtype)
    arg = new(shape, np.int32)  # which offset won, for backward: a quarter of a float64 output
    host(_max_forward, xd, offs, out, arg, new(shape, np.bool_), new(shape, np.bool_))

    def backward(g):
        gx = new(xd.shape, g.dtype)
        host(_max_backward, g, arg, offs, gx, new(shape, np.bool_))
        return (gx,)

    return Tensor._make(out, (x,), backward)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """torch.nn.functional.avg_pool2d. Shape: (N, C, H, W) -> (N, C, oh, ow); stride defaults to kernel_size; the
    divisor counts the zero padding unless count_include_pad=False (divisor_override replaces it)."""
    x = as_tensor(input)
    if x.dtype.kind != "f":
        raise TypeError(f"avg_pool2d: the input must be a float tensor, got {x.dtype_description()}")
    h, w = _pool_geometry("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode)
    if divisor_override is not None and (isinstance(divisor_override, bool) or divisor_override == 0):
        raise ValueError(f"avg_pool2d: divisor_override must be a non-zero number, got {divisor_override!r}")
    xd, offs = x.data, offsets(h, w)
    divisor = new((h.out, w.out), xd.dtype)
    if divisor_override is None:
        host(_fill_divisor, divisor, counts(h, count_include_pad), counts(w, count_include_pad))
    else:
        host(np.copyto, divisor, float(divisor_override))
    return _windowed_mean(x, offs, (h.out, w.out), divisor)


def _windowed_mean(x: Tensor, offs, out_hw: tuple[int, int], divisor: np.ndarray) -> Tensor:
    xd = x.data
    out = new(xd.shape[:-2] + out_hw, xd.dtype)
    host(_sum_windows, xd, offs, out)
    host(np.divide, out, divisor, out=out)

    def backward(g):
        share = new(g.shape, g.dtype)
        host(np.divide, g, divisor, out=share)
        gx = new(xd.shape, g.dtype)
        host(_spread, share, offs, gx)
        return (gx,)

    return Tensor._make(out, (x,), backward)


def _adaptive_sum(x, rows, cols, out) -> None:
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            np.sum(x[..., r0:r1, c0:c1], axis=(-2, -1), out=out[..., i, j])


def _adaptive_spread(share, rows, cols, gx) -> None:
    gx.fill(0)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            dst = gx[..., r0:r1, c0:c1]
            np.add(dst, share[..., i, j, None, None], out=dst)


def adaptive_avg_pool2d(input, output_size) -> Tensor:  # noqa: A002
    """torch.nn.functional.adaptive_avg_pool2d: output cell i of n averages input rows floor(i * H / n) to
    ceil((i + 1) * H / n) (likewise columns); None in output_size keeps that size. Shape: (N, C, H, W) -> (N, C,
    *output_size)."""
    x = as_tensor(input)
    if x.ndim not in (3, 4):
        raise ValueError(f"adaptive_avg_pool2d: expected a (N, C, H, W) or unbatched (C, H, W) input, got shape "
                         f"{describe(x.shape)}")
    if x.dtype.kind != "f":
        raise TypeError(f"adaptive_avg_pool2d: the input must be a float tensor, got {x.dtype_description()}")
    if 0 in x.shape[-2:]:
        raise ValueError(f"adaptive_avg_pool2d: the input of shape {describe(x.shape)} has no rows or columns to "
                         f"average")
    given = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    if len(given) != 2 or not all(s is None or is_int(s) for s in given):
        raise TypeError(f"adaptive_avg_pool2d: output_size must be an int or a pair of ints (None keeps the input's "
                        f"size), got {output_size!r}")
    sizes = tuple(n if s is None else int(s) for s, n in zip(given, x.shape[-2:]))
    if any(s < 0 for s in sizes):
        raise ValueError(f"adaptive_avg_pool2d: output_size must be non-negative, got {output_size!r}")
    (height, width), (oh, ow) = x.shape[-2:], sizes
    if oh and ow and height % oh == 0 and width % ow == 0:  # equal windows: an average pooling, offset by offset
        return avg_pool2d(x, (height // oh, width // ow))
    rows = tuple((i * height // oh, -(-(i + 1) * height // oh)) for i in range(oh))
    cols = tuple((j * width // ow, -(-(j + 1) * width // ow)) for j in range(ow))
    xd = x.data
    divisor = new((oh, ow), xd.dtype)
    host(_fill_divisor, divisor, tuple(r1 - r0 for r0, r1 in rows), tuple(c1 - c0 for c0, c1 in cols))
    out = new(xd.shape[:-2] + (oh, ow), xd.dtype)
    host(_adaptive_sum, xd, rows, cols, out)
    host(np.divide, out, divisor, out=out)

    def backward(g):
        share = new(g.shape, g.dtype)
        host(np.divide, g, divisor, out=share)
        gx = new(xd.shape, g.dtype)
        host(_adaptive_spread, share, rows, cols, gx)
        return (gx,)

    return Tensor._make(out, (x,), backward)
