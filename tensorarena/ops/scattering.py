"""scatter and scatter_add out of place, gather's inverses, with torch's index rules and gradients.

For dim 0: out[index[i][j]][j] = src[i][j] (scatter; of repeated positions the last write wins, where torch
leaves the order undefined) or += src[i][j] (scatter_add), out starting as a copy of input. index has as many
dims as input and src, is no larger than src in any dim and no larger than input outside `dim`; only its
positions of src are read. Gradients as torch's: input gets g, with the scattered positions zeroed for scatter;
src gets g gathered at index. torch's backward raises where index is smaller than src; here src's gradient is
0 outside index's positions instead, the exact gradient. Every array write goes through tape.host.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import _constant, as_tensor, check_number_fits, new
from .sorting import _axis, _full_index


def scatter(input: Tensor, dim: int, index, src=None, *, value=None) -> Tensor:  # noqa: A002 - torch's names
    """A copy of `input` with src's values (a tensor, or one number) written at `index` along `dim`, torch's
    Tensor.scatter: scatter(dim, index, src) or scatter(dim, index, value)."""
    if src is None and value is None:
        raise TypeError("scatter: pass src (a tensor or a number) or value=")
    return _scatter(input, dim, index, value if src is None else src, accumulate=False)


def scatter_add(input: Tensor, dim: int, index, src: Tensor) -> Tensor:  # noqa: A002 - torch's names
    """A copy of `input` with src's values added at `index` along `dim` (repeated positions add up), torch's
    Tensor.scatter_add."""
    if not isinstance(src, (Tensor, np.ndarray)):
        raise TypeError(f"scatter_add: src must be a tensor, got {type(src).__name__}")
    return _scatter(input, dim, index, src, accumulate=True)


def _scatter(input, dim, index, src, *, accumulate: bool) -> Tensor:
    what = "scatter_add" if accumulate else "scatter"
    a = as_tensor(input)
    ad = a.data
    if ad.ndim == 0:
        raise ValueError(f"{what}: input is 0-d; scatter along a dim needs at least one (reshape it to (1,))")
    ids = _index_array(index, what)
    axis = _axis(dim, ad.ndim)
    number = isinstance(src, numbers.Number) or (isinstance(src, np.ndarray) and src.ndim == 0)
    if number:
        check_number_fits(src, ad.dtype, what, floats=True)
        s, sd = None, _constant(np.asarray(src).astype(ad.dtype))  # input's dtype, as torch's (2.7 -> 2)
    else:
        s = as_tensor(src)
        sd = s.data
        if sd.dtype != ad.dtype:
            raise TypeError(f"{what}: input is {ad.dtype} but src is {sd.dtype}; they must have the same dtype (as "
                            f"torch): convert one (e.g. src.to(input.dtype))")
    _check_shapes(what, ad.shape, ids.shape, None if number else sd.shape, axis)
    out = new(ad.shape, ad.dtype)
    host(_scatter_forward, ad, ids, sd, axis, accumulate, out)
    if ad.dtype.kind != "f":
        return Tensor._make(out)  # an integer result has no gradient
    parents = (a,) if s is None else (a, s)
    src_shape = None if s is None else sd.shape
    src_wanted = s is not None and s.requires_grad

    def backward(g):
        ga = g
        if not accumulate:  # positions scatter overwrote owe input nothing
            ga = new(g.shape, g.dtype)
            host(_zero_at, g, ids, axis, ga)
        if s is None:
            return (ga,)
        gs = None
        if src_wanted:
            gs = new(src_shape, g.dtype)
            host(_gather_into, g, ids, axis, gs)
        return ga, gs

    return Tensor._make(out, parents, backward, saved=(index if isinstance(index, Tensor) else None,))


def _index_array(index, what: str) -> np.ndarray:
    ids = index.data if isinstance(index, Tensor) else np.asarray(index)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{what}: index must be an integer tensor (torch: int64 or int32), got dtype {ids.dtype}")
    return ids


def _check_shapes(what: str, shape, index_shape, src_shape, axis: int) -> None:
    if len(index_shape) != len(shape) or (src_shape is not None and len(src_shape) != len(shape)):
        raise ValueError(f"{what}: index of shape {index_shape} must have as many dims as input of shape {shape}"
                         + ("" if src_shape is None else f" and src of shape {src_shape}"))
    too_big = any(n > m for i, (n, m) in enumerate(zip(index_shape, shape)) if i != axis)
    if too_big or (src_shape is not None and any(n > m for n, m in zip(index_shape, src_shape))):
        raise ValueError(f"{what}: index of shape {index_shape} must be no larger than input of shape {shape} apart "
                         f"from dim {axis}" + ("" if src_shape is None else f", and no larger than src of shape "
                                                                             f"{src_shape}"))


def _corner(shape) -> tuple:
    """The slices that read src (or g) at index's positions: src may be larger than index in any dim."""
    return tuple(slice(0, n) for n in shape)


def _scatter_forward(ad, ids, sd, axis, accumulate, out):
    np.copyto(out, ad)
    if ids.size == 0:
        return
    n = ad.shape[axis]
    if ids.min() < 0 or ids.max() >= n:
        bad = ids[(ids < 0) | (ids >= n)].flat[0]
        raise IndexError(f"scatter: index {bad} is out of bounds for dimension {axis} with size {n}")
    values = sd if sd.ndim == 0 else sd[_corner(ids.shape)]
    where = _full_index(ids, axis)
    if accumulate:
        np.add.at(out, where, values)  # repeated positions add up
    else:
        out[where] = values


def _zero_at(g, ids, axis, ga):
    np.copyto(ga, g)
    if ids.size:
        ga[_full_index(ids, axis)] = 0


def _gather_into(g, ids, axis, gs):
    gs.fill(0)  # src's elements outside index's positions were never read
    if ids.size:
        gs[_corner(ids.shape)] = g[_full_index(ids, axis)]
