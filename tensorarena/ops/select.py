"""Selection by index and by mask: index_select, masked_select and nonzero, as torch's.

index_select has a fixed output shape and runs on every route. masked_select and nonzero return as many
elements as the mask selects, which changes from batch to batch: a fused plan cannot hold them, so tracing one
raises UnsupportedOpError (the trainer's fallback_to_eager takes the eager route then, and says so).
"""

from __future__ import annotations

import numpy as np

from ..compile.trace import unsupported
from ..tape import host
from ..tensor import Tensor
from ._base import new, normalize_axes


def index_select(input: Tensor, dim: int, index) -> Tensor:  # noqa: A002 - torch's name
    """The slices of `input` along `dim` at the positions in the 1-D integer `index` (torch.index_select);
    repeated positions add their gradients."""
    ad = input.data
    ids = index.data if isinstance(index, Tensor) else np.asarray(index)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"index_select: index must be an integer tensor (torch: int64), got dtype {ids.dtype}")
    if ids.ndim > 1:
        raise ValueError(f"index_select: index must be 1-D (or 0-d), got shape {ids.shape}")
    if ad.ndim == 0 and ids.size != 1:  # the result would be 0-d: one value, so one index (torch's rule)
        raise IndexError(f"index_select: a 0-d tensor takes an index of exactly one value, got {ids.size} "
                         f"(shape {ids.shape})")
    src = ad if ad.ndim else ad.reshape(1)
    (axis,) = normalize_axes(dim, src.ndim)
    flat_ids = ids.reshape(-1)
    shape = src.shape[:axis] + flat_ids.shape + src.shape[axis + 1:]
    out = new(shape if ad.ndim else (), ad.dtype)
    host(_take, src, flat_ids, axis, out.reshape(shape))

    def backward(g):
        ga = new(src.shape, g.dtype)
        host(_take_grad, ga, flat_ids, axis, g.reshape(shape))
        return (ga.reshape(ad.shape),)

    return Tensor._make(out, (input,), backward, saved=(index if isinstance(index, Tensor) else None,))


def masked_select(input: Tensor, mask) -> Tensor:  # noqa: A002 - torch's name
    """The elements of `input` where the bool `mask` is True, as a 1-D tensor (both broadcast first, as torch's).
    Eager only: the result's length depends on the mask."""
    ad = input.data
    md = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if md.dtype != np.bool_:
        raise TypeError(f"masked_select: mask must be a bool tensor, got dtype {md.dtype}; compare first, "
                        f"e.g. `x.masked_select(x > 0)`")
    unsupported("masked_select", "its output's length depends on how many elements the mask selects")
    try:
        shape = np.broadcast_shapes(ad.shape, md.shape)
    except ValueError:
        raise ValueError(f"masked_select: the mask's shape {md.shape} and the input's shape {ad.shape} do not "
                         f"broadcast") from None
    full_mask = np.broadcast_to(md, shape)
    out = new((int(np.count_nonzero(full_mask)),), ad.dtype)
    host(_select, ad, full_mask, out)
    a_shape = ad.shape

    def backward(g):
        spread = new(shape, g.dtype)
        host(_spread, g, full_mask, spread)
        if shape == a_shape:
            return (spread,)
        ga = new(a_shape, g.dtype)  # the input was broadcast: its gradient sums over the copies
        lead = len(shape) - len(a_shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(a_shape) if n == 1 and shape[lead + i] != 1)
        host(np.sum, spread, axis=axes, out=ga.reshape((1,) * lead + a_shape), keepdims=True)
        return (ga,)

    return Tensor._make(out, (input,), backward, saved=(mask if isinstance(mask, Tensor) else None,))


def nonzero(input: Tensor, *, as_tuple: bool = False):  # noqa: A002 - torch's name
    """The int64 indices of the nonzero elements (torch.nonzero): an (n, ndim) tensor, or with as_tuple one 1-D
    tensor per dim. Eager only: n depends on the values."""
    ad = input.data
    unsupported("nonzero", "its output's length depends on how many elements are nonzero")
    found = np.nonzero(ad) if ad.ndim else np.nonzero(ad.reshape(1))
    if as_tuple:
        outs = []
        for ids in (found if ad.ndim else found[:1]):
            out = new(ids.shape, np.int64)
            host(np.copyto, out, ids)
            outs.append(Tensor._make(out))
        return tuple(outs)
    n = found[0].shape[0]
    out = new((n, ad.ndim), np.int64)
    if ad.ndim:
        host(_stack_columns, found, out)
    return Tensor._make(out)


def _take(src, ids, axis, out) -> None:
    n = src.shape[axis]
    if ids.size and (ids.min() < 0 or ids.max() >= n):  # torch refuses negative positions too
        bad = ids[(ids < 0) | (ids >= n)][0]
        raise IndexError(f"index_select: index {bad} is out of range for dimension {axis} with size {n} "
                         f"(positions must be in [0, {n}))")
    np.take(src, ids, axis=axis, out=out, mode="clip")  # checked above; "clip" writes straight into out


def _take_grad(ga, ids, axis, g) -> None:
    ga.fill(0)
    index = [slice(None)] * ga.ndim
    index[axis] = ids
    np.add.at(ga, tuple(index), g)  # repeated positions add up


def _select(ad, mask, out) -> None:
    out[...] = np.broadcast_to(ad, mask.shape)[mask]


def _spread(g, mask, spread) -> None:
    spread.fill(0)
    spread[mask] = g


def _stack_columns(found, out) -> None:
    for j, ids in enumerate(found):
        out[:, j] = ids
