"""Writes that replace values in place, as torch code makes them on weights and buffers: `t[index] = value`,
zero_, fill_ and copy_ (the arithmetic ones, `+=` add_ mul_ clamp_, are in arith.py).

Each one writes the tensor's own memory (a view's writes reach its base), bumps the version counter its views
share once, after the write, and follows the graph rules of `+=` (arith.check_inplace_graph): autograd records
no in-place op, so while grad is enabled a write that it would have to record is refused, naming what to write
instead. Under `no_grad()` (an optimizer step, an init, an EMA of the weights) every one is allowed.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import check_number_fits
from .arith import broadcasts_to, check_inplace_graph, refuse_overlap, writable
from .index import _STAND_IN, _is_advanced, _normalize_index, torch_order

_WHERE = "`ops.where(mask, value, t)` (torch.where) for a new tensor"


def setitem(a: Tensor, index, value) -> None:
    """t[index] = value: ints, slices, None, Ellipsis, bool masks and integer arrays or Tensors (NumPy rules,
    an integer selecting first as torch's, as getitem); value a number, array or Tensor broadcast to the selected
    shape and cast to t's dtype (as torch, a float written into an integer tensor is truncated)."""
    what = "t[index] = value"
    check_inplace_graph(a, value, what, _WHERE)
    ad = writable(a, what, _WHERE)
    idx = _normalize_index(index)
    split = torch_order(idx)
    if split is not None:  # as getitem: the integers select first, then the arrays index that view
        basic, idx = split
        ad = ad[basic]
    check_number_fits(value, ad.dtype, what, floats=True)
    vd = _values(value, what)
    # The selected shape (and NumPy's IndexError for a bad index) from a stand-in with no bytes.
    selected = np.broadcast_to(_STAND_IN, ad.shape)[idx].shape
    fits = vd.shape[max(vd.ndim - len(selected), 0):]
    # Leading 1s of the value beyond the selection's dims are dropped, as by torch and NumPy.
    if any(n != 1 for n in vd.shape[:vd.ndim - len(fits)]) or not broadcasts_to(fits, selected):
        raise ValueError(f"{what}: value of shape {vd.shape} does not broadcast to the selected shape {selected} "
                         f"(of a tensor of shape {ad.shape})")
    vd = vd.reshape(fits)
    _refuse_setitem_overlap(ad, idx, vd, what)
    host(_assign, ad, idx, vd)
    a._version_counter[0] += 1


def _refuse_setitem_overlap(ad: np.ndarray, idx: tuple, vd: np.ndarray, what: str) -> None:
    """torch's overlap rules for `t[index] = value` where value views t's memory (arith.refuse_overlap).

    A 0-d value is a fill (torch's fill_ or masked_fill), read once before any write: fine with a slice or a
    mask. A slice index writes a view of t: only a partial overlap with it is refused (`t[:] = t` is fine). An
    integer-array index is torch's index_put_, which refuses any overlap of the value with t, even `t[i] = t`.
    """
    if not _is_advanced(idx):
        if vd.ndim:
            refuse_overlap(ad[idx], vd, what)  # ad[idx] is a view: no copy is made to check
        return
    integer = any(isinstance(x, np.ndarray) and x.dtype != np.bool_ for x in idx)
    if vd.ndim or integer:
        refuse_overlap(ad, vd, what, identical_ok=False)


def fill_(a: Tensor, value) -> Tensor:
    """torch's t.fill_(value): every element set to a number or a 0-d tensor's value (cast to t's dtype)."""
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ValueError(f"fill_() takes a number or a 0-d tensor, got a tensor of shape {value.shape}; "
                         f"use copy_() to write a tensor of values")
    check_number_fits(value, a.dtype, "fill_()", floats=True)
    return _copy(a, value, "fill_()", "`ops.where(...)` or a new tensor", reads_once=True)


def zero_(a: Tensor) -> Tensor:
    """torch's t.zero_(): every element set to 0."""
    return _copy(a, 0, "zero_()", "`x * 0` or a new tensor")


def copy_(a: Tensor, src, non_blocking: bool = False) -> Tensor:
    """torch's t.copy_(src): src's values written into t, src broadcast to t's shape and cast to t's dtype
    (a float into an integer tensor is truncated, as torch's). non_blocking means nothing on the CPU."""
    return _copy(a, src, "copy_()", "`src.clone()` (or `ops.where`) for a new tensor")


def _copy(a: Tensor, value, what: str, instead: str, *, reads_once: bool = False) -> Tensor:
    """The write of copy_, fill_ and zero_; `reads_once`: the value is one number, read before anything is written
    (torch's fill_(t[2]) is fine), so it may be an element of the tensor itself."""
    check_inplace_graph(a, value, what, instead)
    ad = writable(a, what, instead)
    vd = _values(value, what)
    if not broadcasts_to(vd.shape, ad.shape):
        raise ValueError(f"in-place {what}: shape {vd.shape} does not broadcast to the tensor's shape {ad.shape}")
    if not reads_once:
        refuse_overlap(ad, vd, f"in-place {what}")
    host(np.copyto, ad, vd, casting="unsafe")  # torch casts any dtype on a copy
    a._version_counter[0] += 1
    return a


def _values(value, what: str) -> np.ndarray:
    vd = value.data if isinstance(value, Tensor) else np.asarray(value)  # .data: a stale value raises here
    if vd.dtype == object or vd.dtype.kind in "cSUV":
        kind = "complex" if vd.dtype.kind == "c" else "non-numeric"
        raise TypeError(f"{what}: cannot write {kind} values (dtype {vd.dtype}) into a tensor; pass real numbers, "
                        f"an array of them or a Tensor")
    return vd


def _assign(ad: np.ndarray, idx: tuple, vd: np.ndarray) -> None:
    ad[idx] = vd  # NumPy casts unsafely here, as torch does (a float into an int tensor truncates)
