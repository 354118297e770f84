"""clamp (and its alias clip) out of place, with torch's gradients; the in-place clamp_ is in arith.py.

torch's rule, bounds included: the input's gradient flows where min <= x <= max (so at a bound too, and nowhere
when min > max, where every output is max); a tensor bound gets the gradient where it was the answer: min where
x < min and min < max, max where x > max or max < min. A NaN input passes through with no gradient (no comparison
with NaN holds). Every array write goes through tape.host, so the op replays on the fused and captured routes.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import (as_tensor, check_number_fits, grad_dtype, new, promote_types, result_dtype, unbroadcast,
                    weak_operand)


def clamp(input, min=None, max=None) -> Tensor:  # noqa: A002 - torch's names
    """Each element of `input` raised to `min`, then lowered to `max` (numbers or tensors, broadcasting);
    torch.clamp. Either bound may be None, not both."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of 'min' or 'max' must not be None (torch's rule); pass a bound, "
                         "e.g. clamp(x, min=0.0)")
    a = as_tensor(input)
    check_number_fits(min, a.dtype, "clamp (min)")
    check_number_fits(max, a.dtype, "clamp (max)")
    lo = None if min is None else as_tensor(min, like=a)
    hi = None if max is None else as_tensor(max, like=a)
    bounds = [b for b in (lo, hi) if b is not None]
    dtype = a.dtype
    for b in bounds:  # each bound against the input, as torch's result_type over the three
        dtype = promote_types(dtype, result_dtype(a, b))
    # A 0-d bound the input's dtype won over goes in that dtype (an int64 () bound of a uint8 input failed in
    # NumPy's same_kind cast; torch wraps it).
    lo, hi = (None if b is None else weak_operand(b, dtype) for b in (lo, hi))
    bounds = [b for b in (lo, hi) if b is not None]
    ad = a.data
    lod, hid = (None if b is None else b.data for b in (lo, hi))  # .data: a stale bound raises here
    try:
        shape = np.broadcast_shapes(ad.shape, *(b.data.shape for b in bounds))
    except ValueError:
        raise ValueError(f"clamp: the input's shape {ad.shape} and the bounds' shapes "
                         f"{[b.data.shape for b in bounds]} do not broadcast") from None
    out = new(shape, dtype)
    host(_clamp_forward, ad, lod, hid, out)
    if dtype.kind != "f":
        return Tensor._make(out)  # integer results have no gradient
    # The parents and, for each, when it gets the gradient; only those that require grad keep their (shape, dtype).
    parts = [(t, rule) for t, rule in ((a, _input_gets), (lo, _min_gets), (hi, _max_gets)) if t is not None]
    wanted = [((t.shape, t.dtype) if t.requires_grad else None, rule) for t, rule in parts]

    def backward(g):
        return tuple(None if meta is None else _grad(g, meta, rule, ad, lod, hid) for meta, rule in wanted)

    return Tensor._make(out, tuple(t for t, _ in parts), backward, saved=(a, *bounds))


def _grad(g: np.ndarray, meta, rule, ad, lod, hid) -> np.ndarray:
    shape, dtype = meta
    out = new(g.shape, grad_dtype(g, shape, dtype))
    host(_masked_grad, rule, ad, lod, hid, g, out)
    return unbroadcast(out, shape, dtype)


def _clamp_forward(ad, lod, hid, out) -> None:
    # max first, then min: with min > max every element comes out max, as torch's
    if lod is None:
        np.minimum(ad, hid, out=out, casting="same_kind")
        return
    np.maximum(ad, lod, out=out, casting="same_kind")
    if hid is not None:
        np.minimum(out, hid, out=out)


def _masked_grad(rule, ad, lod, hid, g, out) -> None:
    out.fill(0)
    np.copyto(out, g, casting="same_kind", where=rule(ad, lod, hid))


def _input_gets(ad, lod, hid):
    if lod is None:
        return ad <= hid
    if hid is None:
        return ad >= lod
    return (ad >= lod) & (ad <= hid)


def _min_gets(ad, lod, hid):
    return ad < lod if hid is None else (ad < lod) & (lod < hid)


def _max_gets(ad, lod, hid):
    return ad > hid if lod is None else (ad > hid) | (hid < lod)
