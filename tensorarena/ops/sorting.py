"""Order and selection by value: gather, argsort, sort, topk (torch's names and results).

sort and topk are argsort's (or a partition's) indices plus a gather: the values' gradient goes back through
the gather to where each value came from, as torch's does. The indices are written through tape.host, so they
are computed again on every replay of a fused step.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_count, new, normalize_axes


class ValuesIndices(NamedTuple):
    """sort's and topk's result, as torch's: the values and their int64 indices along the dim."""

    values: Tensor
    indices: Tensor


def gather(input: Tensor, dim: int, index) -> Tensor:  # noqa: A002 - torch's name
    """out[i][j] = input[i][index[i][j]] for dim 1 (torch.gather): out has index's shape; index is no larger than
    input in the other dims. Repeated indices add their gradients."""
    ad = input.data
    ids = index.data if isinstance(index, Tensor) else np.asarray(index)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"gather: index must be an integer tensor (torch: int64), got dtype {ids.dtype}")
    if ids.ndim != ad.ndim:
        raise ValueError(f"gather: index has {ids.ndim} dims but input has {ad.ndim}; they must have as many "
                         f"(index of shape {ids.shape}, input of shape {ad.shape})")
    axis = _axis(dim, ad.ndim)
    if any(n > m for i, (n, m) in enumerate(zip(ids.shape, ad.shape)) if i != axis):
        raise ValueError(f"gather: index of shape {ids.shape} is larger than input of shape {ad.shape} outside "
                         f"dim {axis}")
    out = new(ids.shape, ad.dtype)
    host(_gather_forward, ad, ids, axis, out)
    a_shape = ad.shape

    def backward(g):
        ga = new(a_shape, g.dtype)
        host(_gather_backward, ga, ids, axis, g)
        return (ga,)

    return Tensor._make(out, (input,), backward, saved=(index if isinstance(index, Tensor) else None,))


def argsort(a: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """Indices that sort `a` along `dim` (int64), torch.argsort; ties keep their order (a stable sort)."""
    ad = a.data
    out = new(ad.shape, np.int64)
    host(_argsort, ad, _axis(dim, ad.ndim), bool(descending), out)
    return Tensor._make(out)


def sort(a: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
    """(values, indices) of `a` sorted along `dim`, torch.sort; the values carry the gradient."""
    indices = argsort(a, dim, descending)
    return ValuesIndices(gather(a, _axis(dim, a.ndim), indices), indices)


def topk(a: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:  # noqa: A002
    """The k largest (or smallest) values along `dim` and their indices, torch.topk, best first."""
    k = as_count(k, "topk: k")
    axis = _axis(dim, a.ndim)
    n = a.shape[axis] if a.ndim else 1
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for dim {dim} of size {n} (shape {a.shape})")
    order = argsort(a, dim, descending=largest)
    indices = Tensor._make(order.data[(slice(None),) * axis + (slice(0, int(k)),)] if a.ndim else order.data)
    return ValuesIndices(gather(a, axis, indices), indices)


def _axis(dim: int, ndim: int) -> int:
    """`dim` made non-negative; a 0-d tensor takes 0 or -1, as in torch."""
    axes = normalize_axes(dim, ndim)
    return axes[0] if axes else 0


def _full_index(ids: np.ndarray, axis: int) -> tuple:
    """The fancy index that reads input at `ids` along axis and at each element's own position elsewhere."""
    grid = list(np.indices(ids.shape, sparse=True))
    grid[axis] = ids
    return tuple(grid)


def _gather_forward(ad, ids, axis, out):
    n = ad.shape[axis] if ad.ndim else 1
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = ids[(ids < 0) | (ids >= n)].flat[0]
        raise IndexError(f"gather: index {bad} is out of bounds for dimension {axis} with size {n}")
    if ad.ndim == 0:
        out[...] = ad
        return
    out[...] = ad[_full_index(ids, axis)]


def _gather_backward(ga, ids, axis, g):
    ga.fill(0)
    if ga.ndim == 0:
        ga[...] = g.sum()
        return
    np.add.at(ga, _full_index(ids, axis), g)  # repeated indices add up


def _argsort(ad, axis, descending, out):
    if ad.ndim == 0:
        out[...] = 0
        return
    if not descending:
        out[...] = np.argsort(ad, axis=axis, kind="stable")
        return
    # Descending with ties in first-come order (and NaN first, as torch's): a stable ascending sort of the
    # reversed array, read backwards, with its positions mapped back to the original's.
    n = ad.shape[axis]
    order = np.argsort(np.flip(ad, axis=axis), axis=axis, kind="stable")
    out[...] = np.flip(n - 1 - order, axis=axis)
