"""Ops that move or mask elements without arithmetic: flip, roll, tril, triu, diag, pad (constant) and outer.

Each result is a copy in the current arena (torch's flip and roll copy too), written by a tape.host call; each
gradient is the inverse movement (or the same mask) of g.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_count, as_tensor, is_int, new, normalize_axes
from .arith import mul
from .shape import reshape


def flip(input: Tensor, dims) -> Tensor:  # noqa: A002 - torch's name
    """`input` reversed along each of `dims` (an int or a tuple), torch.flip."""
    ad = input.data
    if isinstance(dims, (list, tuple)) and not dims:
        axes = ()  # torch.flip(x, ()) flips nothing (normalize_axes would read () as every dim)
    else:
        axes = normalize_axes(tuple(dims) if isinstance(dims, (list, tuple)) else dims, ad.ndim)
    out = new(ad.shape, ad.dtype)
    host(_flip_into, ad, axes, out)

    def backward(g):
        ga = new(g.shape, g.dtype)
        host(_flip_into, g, axes, ga)
        return (ga,)

    return Tensor._make(out, (input,), backward)


def roll(input: Tensor, shifts, dims=None) -> Tensor:  # noqa: A002 - torch's name
    """Elements shifted cyclically by `shifts` along `dims` (torch.roll); with dims None, over the flattened
    tensor, shape kept."""
    ad = input.data
    shifts_t = tuple(shifts) if isinstance(shifts, (list, tuple)) else (shifts,)
    if dims is None:
        if len(shifts_t) != 1:
            raise ValueError(f"roll: without dims, shifts must be one number, got {shifts!r}")
        axes = None
    else:
        dims_t = tuple(dims) if isinstance(dims, (list, tuple)) else (dims,)
        if len(dims_t) != len(shifts_t):
            raise ValueError(f"roll: shifts {shifts!r} and dims {dims!r} must have the same length")
        bound = max(ad.ndim, 1)
        for d in dims_t:
            if not is_int(d):  # a bool is an int to Python: roll(x, 1, True) rolled dim 1; torch refuses it
                raise TypeError(f"roll: dims must be ints, got {dims!r}")
            if not -bound <= d < bound:
                raise IndexError(f"roll: dimension {d} is out of range for a tensor with {ad.ndim} dimensions")
        axes = tuple(d % bound for d in dims_t)
    shifts_t = tuple(as_count(s, "roll: a shift") for s in shifts_t)
    back = tuple(-s for s in shifts_t)
    return _linear_map(input, _roll_into, (shifts_t, axes), (back, axes))


def tril(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002 - torch's name
    """The lower triangle of the last two dims (torch.tril), from `diagonal` down; the rest 0."""
    return _triangle(input, as_count(diagonal, "tril: diagonal"), lower=True)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002 - torch's name
    """The upper triangle of the last two dims (torch.triu), from `diagonal` up; the rest 0."""
    return _triangle(input, as_count(diagonal, "triu: diagonal"), lower=False)


def _triangle(a: Tensor, k: int, *, lower: bool) -> Tensor:
    ad = a.data
    what = "tril" if lower else "triu"
    if ad.ndim < 2:
        raise ValueError(f"{what}: input tensor must have at least 2 dimensions, got shape {ad.shape}")
    return _linear_map(a, _triangle_into, (k, lower), (k, lower))


def _linear_map(a: Tensor, into, forward_args: tuple, backward_args: tuple) -> Tensor:
    """A shape-keeping linear map of `a` whose gradient is the same kind of map: `into(x, *args, out)` writes it
    (roll's inverse is a roll back; a triangle mask is its own adjoint)."""
    ad = a.data
    out = new(ad.shape, ad.dtype)
    host(into, ad, *forward_args, out)

    def backward(g):
        ga = new(g.shape, g.dtype)
        host(into, g, *backward_args, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def diag(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002 - torch's name
    """torch.diag: a 1-D tensor becomes the `diagonal`-th diagonal of a square matrix; a 2-D one gives that
    diagonal as a 1-D tensor."""
    ad = input.data
    k = as_count(diagonal, "diag: diagonal")
    if ad.ndim == 1:
        n = ad.shape[0] + abs(k)
        out = new((n, n), ad.dtype)
        host(_vector_to_diag, ad, k, out)

        def backward(g):
            ga = new(ad.shape, g.dtype)
            host(_diag_to_vector, g, k, ga)
            return (ga,)
    elif ad.ndim == 2:
        rows, cols = ad.shape
        length = max(0, min(rows, cols - k) if k >= 0 else min(rows + k, cols))
        out = new((length,), ad.dtype)
        host(_diag_to_vector, ad, k, out)

        def backward(g):
            ga = new(ad.shape, g.dtype)
            host(_vector_to_diag, g, k, ga)
            return (ga,)
    else:
        raise ValueError(f"diag: input must be 1-D or 2-D, got shape {ad.shape}")
    return Tensor._make(out, (input,), backward)


def pad(input: Tensor, pad, mode: str = "constant", value: float | None = None) -> Tensor:  # noqa: A002
    """torch's F.pad in constant mode: pad = (left, right) for the last dim, then (top, bottom) for the one
    before, and so on; a negative amount crops. New elements hold `value` (default 0)."""
    if mode != "constant":
        raise NotImplementedError(f"pad: mode {mode!r} is not supported; only mode='constant' is")
    input = as_tensor(input)  # noqa: A001 - an array taken as a tensor (its .data is a memoryview)
    ad = input.data
    amounts = [as_count(v, "pad: each padding amount") for v in pad]
    if len(amounts) % 2 or len(amounts) // 2 > ad.ndim:
        raise ValueError(f"pad: the padding {tuple(pad)} must have an even length of at most 2 * {ad.ndim} (two "
                         f"per padded dimension, last dimension first) for a tensor of shape {ad.shape}")
    widths = [(0, 0)] * ad.ndim
    for i in range(len(amounts) // 2):
        widths[ad.ndim - 1 - i] = (amounts[2 * i], amounts[2 * i + 1])
    shape = tuple(n + lo + hi for n, (lo, hi) in zip(ad.shape, widths))
    if any(n < 0 for n in shape):
        raise ValueError(f"pad: the padding {tuple(pad)} crops shape {ad.shape} to {shape}, which is negative")
    for dim, (n, (lo, hi)) in enumerate(zip(ad.shape, widths)):
        # torch crops before it pads (narrow(): length must be non-negative): a crop past the edge is refused even
        # where the other side's padding makes the final size non-negative (it gave a tensor of fill values).
        if max(-lo, 0) + max(-hi, 0) > n:
            raise ValueError(f"pad: the padding {tuple(pad)} crops {max(-lo, 0) + max(-hi, 0)} elements from dim "
                             f"{dim} of size {n} (shape {ad.shape}); a crop cannot go past the tensor's edge")
    # The part of the input that survives (src) and where it lands in the output (dst).
    src = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(ad.shape, widths))
    dst = tuple(slice(max(lo, 0), max(lo, 0) + max(s.stop - s.start, 0)) for s, (lo, _) in zip(src, widths))
    out = new(shape, ad.dtype)
    fill = np.array(0 if value is None else value).astype(ad.dtype)[()]  # a NumPy scalar: a recorded constant
    host(_pad_into, ad, src, dst, fill, out)

    def backward(g):
        ga = new(ad.shape, g.dtype)
        host(_crop_into, g, src, dst, ga)
        return (ga,)

    return Tensor._make(out, (input,), backward)


def outer(input: Tensor, vec2: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """input[i] * vec2[j] for two 1-D tensors (torch.outer), as a broadcast product, whose gradients it has."""
    a, b = as_tensor(input), as_tensor(vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"outer: both inputs must be 1-D, got shapes {a.shape} and {b.shape}")
    return mul(reshape(a, (-1, 1)), reshape(b, (1, -1)))


def _flip_into(src, axes, out) -> None:
    np.copyto(out, np.flip(src, axis=axes) if axes else src)


def _roll_into(src, shifts, axes, out) -> None:
    np.copyto(out, np.roll(src, shifts if axes is not None else shifts[0], axis=axes))


def _triangle_into(src, k, lower, out) -> None:
    rows, cols = src.shape[-2:]
    keep = np.tri(rows, cols, k, dtype=bool) if lower else ~np.tri(rows, cols, k - 1, dtype=bool)
    out.fill(0)
    np.copyto(out, src, where=keep)


def _diag_index(n_rows: int, n_cols: int, k: int):
    i = np.arange(max(0, -k), min(n_rows, n_cols - k))
    return i, i + k


def _vector_to_diag(v, k, out) -> None:
    out.fill(0)
    out[_diag_index(*out.shape, k)] = v


def _diag_to_vector(m, k, out) -> None:
    out[...] = m[_diag_index(*m.shape, k)]


def _pad_into(ad, src, dst, fill, out) -> None:
    out.fill(fill)
    out[dst] = ad[src]


def _crop_into(g, src, dst, ga) -> None:
    ga.fill(0)  # cropped elements got no gradient
    ga[src] = g[dst]
