"""Reductions over axes (keepdim as in torch): sum mean max var."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._base import new, normalize_axes


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _expand_grad(g: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray:
    """View of `g` (reduced over `axes`) broadcast back to the input `shape`."""
    return np.broadcast_to(g.reshape(_reduced_shape(shape, axes, True)), shape)


def sum(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    """Sum over `dim` (int, tuple or None for all)."""
    ad = a.data
    axes = normalize_axes(dim, ad.ndim)
    out = new(_reduced_shape(ad.shape, axes, keepdim), ad.dtype)
    np.sum(ad, axis=axes, keepdims=keepdim, out=out)

    def backward(g):
        ga = new(ad.shape, g.dtype)
        np.copyto(ga, _expand_grad(g, ad.shape, axes))
        return (ga,)

    return Tensor._make(out, (a,), backward)


def mean(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Mean over `dim` (int, tuple or None for all)."""
    ad = a.data
    axes = normalize_axes(dim, ad.ndim)
    count = 1
    for ax in axes:
        count *= ad.shape[ax]
    out = new(_reduced_shape(ad.shape, axes, keepdim), ad.dtype)
    np.sum(ad, axis=axes, keepdims=keepdim, out=out)
    out /= count

    def backward(g):
        ga = new(ad.shape, g.dtype)
        np.divide(_expand_grad(g, ad.shape, axes), count, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def max(a: Tensor, dim=None, keepdim: bool = False):  # noqa: A001 - torch's name
    """Max over all elements (a Tensor), or over `dim` (a MaxResult(values, indices)), as torch.max."""
    raise NotImplementedError


def var(a: Tensor, dim=None, *, correction: int = 1, keepdim: bool = False) -> Tensor:
    """Variance with Bessel's correction by default (torch.var)."""
    raise NotImplementedError


def softmax(a: Tensor, dim: int = -1) -> Tensor:
    """Softmax along `dim`, max-subtracted for stability."""
    raise NotImplementedError


def log_softmax(a: Tensor, dim: int = -1) -> Tensor:
    """log(softmax(a)) along `dim`, computed without forming softmax's log."""
    raise NotImplementedError
