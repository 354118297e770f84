"""The Tensor methods and operators of the ops added beside _sugar.py's (ops/__init__ installs both once)."""

from __future__ import annotations

from ..tensor import Tensor
from . import arrange, creation, pairwise, scattering, select, shape, summaries


def install() -> None:
    """Attach t.flip(...), t.cumsum(dim), x % y, x // y, t.scatter(...), t.new_zeros(...) and the rest to Tensor, as
    torch's methods."""
    T = Tensor
    T.flip = _flip_method
    T.roll = arrange.roll
    T.tril, T.triu, T.diag, T.outer = arrange.tril, arrange.triu, arrange.diag, arrange.outer
    T.maximum, T.minimum = pairwise.maximum, pairwise.minimum
    T.remainder, T.floor_divide = pairwise.remainder, pairwise.floor_divide
    T.__mod__ = lambda a, b: pairwise.remainder(a, b)
    T.__rmod__ = lambda a, b: pairwise.remainder(b, a)
    T.__floordiv__ = lambda a, b: pairwise.floor_divide(a, b)
    T.__rfloordiv__ = lambda a, b: pairwise.floor_divide(b, a)
    T.__imod__ = lambda a, b: pairwise.iremainder(a, b)
    T.__ifloordiv__ = lambda a, b: pairwise.ifloor_divide(a, b)
    T.cumsum, T.prod, T.norm = summaries.cumsum, summaries.prod, summaries.norm
    T.amax, T.amin, T.logsumexp = summaries.amax, summaries.amin, summaries.logsumexp
    T.index_select, T.masked_select, T.nonzero = select.index_select, select.masked_select, select.nonzero
    T.scatter, T.scatter_add = scattering.scatter, scattering.scatter_add
    T.unflatten = shape.unflatten
    T.new_zeros, T.new_ones, T.new_full, T.new_tensor = (creation.new_zeros, creation.new_ones, creation.new_full,
                                                          creation.new_tensor)


def _flip_method(a: Tensor, *dims, **keyword) -> Tensor:
    """t.flip(0, 1), t.flip((0, 1)) or t.flip(dims=(0, 1)), as torch's; t.flip() names no dims, which torch
    refuses too."""
    if keyword:
        if dims or set(keyword) != {"dims"}:
            raise TypeError(f"flip() takes dims once, positionally or as dims=, got {dims!r} and {keyword!r}")
        dims = (keyword["dims"],)
    if not dims:
        raise TypeError("flip() missing 1 required positional argument: 'dims' (e.g. t.flip(0) or t.flip((0, 1)))")
    return arrange.flip(a, dims[0] if len(dims) == 1 else dims)
