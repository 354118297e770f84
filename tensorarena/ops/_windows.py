"""Sliding-window geometry that unfold/fold (ops/conv.py) and pooling (ops/pool.py) share.

A window op here loops over the kernel's offsets, not over the output positions: for offset (i, j) every output
position reads one input element, x[o_h * stride - before + i * dilation, ...], so the offset's work is one strided
slab of the input against one slab of the output, both basic-index views (no index arrays, nothing allocated). An
offset whose input index falls in the padding for some outputs covers only the rest: `span` cuts both slabs to
the outputs whose element lies inside the input, so padding never needs a padded copy of the input.
"""

from __future__ import annotations

from typing import NamedTuple

from ._base import is_int


class Axis(NamedTuple):
    """One spatial dimension of a window op: input size, kernel, stride, dilation, padding before, output size."""

    size: int
    kernel: int
    stride: int
    dilation: int
    before: int
    out: int


def pair(value, what: str, n: int = 2) -> tuple[int, ...]:
    """An int or a sequence of `n` ints (torch's _pair), each an int (a float or bool is refused as torch does)."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    if len(values) != n or not all(is_int(v) for v in values):
        raise TypeError(f"{what} must be an int or a tuple of {n} ints, got {value!r}")
    return tuple(int(v) for v in values)


def positive(values: tuple[int, ...], what: str, op: str) -> None:
    """Refuse a kernel size, stride or dilation that is not positive, naming the op."""
    if any(v <= 0 for v in values):
        raise ValueError(f"{op}: {what} must be positive, got {values}")


def conv_axis(size: int, kernel: int, stride: int, dilation: int, before: int, after: int) -> Axis:
    """A convolution's (or unfold's) axis: floor((size + before + after - extent) / stride) + 1 outputs."""
    extent = dilation * (kernel - 1) + 1
    return Axis(size, kernel, stride, dilation, before, (size + before + after - extent) // stride + 1)


def pool_axis(size: int, kernel: int, stride: int, dilation: int, padding: int, ceil_mode: bool) -> Axis:
    """A pooling axis as torch sizes it: with ceil_mode a last, partial window counts if it starts inside the input
    or its left padding (one that would start in the right padding is dropped)."""
    extent = dilation * (kernel - 1) + 1
    span = size + 2 * padding - extent
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return Axis(size, kernel, stride, dilation, padding, out)


def span(axis: Axis, i: int) -> tuple[slice, slice] | None:
    """(the outputs, their input elements) of kernel offset i along `axis`, or None when every output's element
    for this offset is padding: the outputs o with 0 <= o * stride - before + i * dilation < size."""
    shift = i * axis.dilation - axis.before
    lo = max(0, -(shift // axis.stride))  # ceil(-shift / stride): the first output past the left padding
    hi = min(axis.out, (axis.size - 1 - shift) // axis.stride + 1) if axis.size - 1 - shift >= 0 else 0
    if hi <= lo:
        return None
    start = lo * axis.stride + shift
    return slice(lo, hi), slice(start, start + (hi - lo - 1) * axis.stride + 1, axis.stride)


class Offset(NamedTuple):
    """Kernel offset (i, j), flat number k = i * kw + j, and its output and input slabs (None: all padding)."""

    i: int
    j: int
    k: int
    out: tuple[slice, slice] | None
    inp: tuple[slice, slice] | None
    whole: bool  # the slab covers every output position


def offsets(h: Axis, w: Axis) -> tuple[Offset, ...]:
    """Every kernel offset of a 2-D window op, row-major (torch's order within a window)."""
    found = []
    for i in range(h.kernel):
        for j in range(w.kernel):
            sh, sw = span(h, i), span(w, j)
            if sh is None or sw is None:
                found.append(Offset(i, j, i * w.kernel + j, None, None, False))
                continue
            whole = sh[0].stop - sh[0].start == h.out and sw[0].stop - sw[0].start == w.out
            found.append(Offset(i, j, i * w.kernel + j, (sh[0], sw[0]), (sh[1], sw[1]), whole))
    return tuple(found)


def counts(axis: Axis, padded: bool) -> tuple[int, ...]:
    """How many elements each output's window holds along `axis` (for average pooling's divisor): inside the
    input only, or also the padding (never past it: a ceil_mode window that runs beyond is cut, as in torch)."""
    sizes = []
    for o in range(axis.out):
        start = o * axis.stride - axis.before
        end = min(start + axis.kernel, axis.size + axis.before)
        if not padded:
            start, end = max(start, 0), min(end, axis.size)
        sizes.append(end - start)
    return tuple(sizes)


def describe(shape: tuple[int, ...]) -> str:
    """A shape as torch prints it in these messages: [2, 3, 5, 5]."""
    return "[" + ", ".join(str(n) for n in shape) + "]"


def extent(axis: Axis) -> int:
    """How many input elements one window spans along `axis`, dilation included."""
    return axis.dilation * (axis.kernel - 1) + 1


__all__ = ["Axis", "Offset", "conv_axis", "pool_axis", "offsets", "counts", "pair", "positive", "span", "describe",
           "extent"]
