"""Elementwise binary ops beside arith.py's: maximum, minimum, remainder (%) and floor_divide (//), as torch's.

maximum / minimum hand each input the gradient where it is the answer and split it in half on a tie (torch's
rule); a NaN operand makes the result NaN and, as in torch, both inputs then get the whole gradient (no
comparison with NaN holds). remainder takes the divisor's sign (Python's and torch's rule) and sends
-floor(a / b) * g to the divisor. floor_divide has no derivative in torch: its result is in the graph, and
backward through it raises torch's error rather than quietly passing nothing.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import grad_dtype, new, unbroadcast
from .arith import _binary_out, _inplace_operand, _meta, _operands


def maximum(input, other) -> Tensor:  # noqa: A002 - torch's name
    """The larger of each pair, broadcasting (torch.maximum); NaN if either is NaN."""
    return _extreme(input, other, np.maximum, "maximum")


def minimum(input, other) -> Tensor:  # noqa: A002 - torch's name
    """The smaller of each pair, broadcasting (torch.minimum); NaN if either is NaN."""
    return _extreme(input, other, np.minimum, "minimum")


def _extreme(a, b, ufunc, what: str) -> Tensor:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):  # torch.maximum takes two tensors
        raise TypeError(f"{what}: both arguments must be tensors, got {type(a).__name__} and {type(b).__name__}; "
                        f"for a number use clamp (e.g. x.clamp(min=0.0))")
    a, b, dtype = _operands(a, b, ufunc)
    out = _binary_out(a, b, dtype)
    ad, bd = a.data, b.data
    host(ufunc, ad, bd, out=out, casting="same_kind")
    if dtype.kind != "f":
        return Tensor._make(out)
    a_meta, b_meta = _meta(a), _meta(b)
    wants = (a.requires_grad, b.requires_grad)
    larger = ufunc is np.maximum

    def backward(g):
        grads = []
        for side, (meta, wanted) in enumerate(zip((a_meta, b_meta), wants)):
            if not wanted:
                grads.append(None)
                continue
            full = new(g.shape, grad_dtype(g, *meta))
            host(_extreme_grad, ad, bd, g, larger, side == 0, full)
            grads.append(unbroadcast(full, *meta))
        return tuple(grads)

    return Tensor._make(out, (a, b), backward, saved=(a, b))


def remainder(input, other) -> Tensor:  # noqa: A002 - torch's name
    """input - floor(input / other) * other, broadcasting (torch.remainder, Python's %): the divisor's sign."""
    number_dividend = not isinstance(input, Tensor)
    a, b, dtype = _operands(input, other, np.remainder)
    _refuse_bool(dtype, "remainder")
    out = _binary_out(a, b, dtype)
    ad, bd = a.data, b.data
    host(_remainder_forward, ad, bd, out)
    if dtype.kind != "f":
        return Tensor._make(out)
    if number_dividend:  # torch's remainder(Scalar, Tensor) has no derivative: backward raises as there
        return Tensor._make(out, (b,), _no_number_remainder_derivative)
    a_meta, b_meta = _meta(a), _meta(b)
    wants_b = b.requires_grad

    def backward(g):
        gb = None
        if wants_b:
            full = new(g.shape, g.dtype)
            host(_remainder_grad_divisor, ad, bd, g, full)
            gb = unbroadcast(full, *b_meta)
        return unbroadcast(g, *a_meta), gb

    return Tensor._make(out, (a, b), backward, saved=(a, b) if wants_b else ())


def floor_divide(input, other) -> Tensor:  # noqa: A002 - torch's name
    """floor(input / other), broadcasting (torch.floor_divide, Python's //): integers stay integers."""
    a, b, dtype = _operands(input, other, np.floor_divide)
    _refuse_bool(dtype, "floor_divide")
    out = _binary_out(a, b, dtype)
    host(_floor_divide_forward, a.data, b.data, out)
    if dtype.kind != "f":
        return Tensor._make(out)
    return Tensor._make(out, (a, b), _no_derivative)


def _refuse_bool(dtype: np.dtype, what: str) -> None:
    if dtype == np.bool_:  # NumPy's raw UFuncTypeError otherwise
        raise TypeError(f"{what} is not implemented for bool tensors (as in torch); cast them first (e.g. m.long())")


def ifloor_divide(a: Tensor, b) -> Tensor:
    """a //= b in a's memory (Python rebound the name to a new tensor before: a view written through it did not
    change)."""
    return _inplace_division(a, b, np.floor_divide, "//")


def iremainder(a: Tensor, b) -> Tensor:
    """a %= b in a's memory."""
    return _inplace_division(a, b, np.remainder, "%")


def _inplace_division(a: Tensor, b, ufunc: np.ufunc, symbol: str) -> Tensor:
    _refuse_bool(a.dtype, "floor_divide" if ufunc is np.floor_divide else "remainder")
    bd = _inplace_operand(a, b, f"{symbol}=", f"`x = x {symbol} y`")
    ad = a.data
    host(_divide_into, ufunc, ad, bd)
    a._version_counter[0] += 1  # after the write: a refused one changed nothing
    return a


def _divide_into(ufunc, ad, bd) -> None:
    _check_integer_divisor(bd, ad)
    with np.errstate(invalid="ignore", divide="ignore"):  # a float by 0 is +-inf or NaN, as torch
        ufunc(ad, bd, out=ad, casting="unsafe")  # (_inplace_operand checked the categories)


def _no_derivative(g):
    raise RuntimeError("derivative for aten::floor_divide is not implemented (as in torch): a floor has no useful "
                       "gradient; detach the result (or compute it under no_grad) if it only indexes or counts")


def _no_number_remainder_derivative(g):
    raise RuntimeError("derivative for aten::remainder is not implemented for a number % a tensor (as in torch); "
                       "detach the tensor, or make the number a tensor: ta.full_like(t, 5.0) % t")


def _extreme_grad(ad, bd, g, larger, first, full) -> None:
    # torch: where(a == b, g / 2, g), zeroed where the other input is the answer
    mine, theirs = (ad, bd) if first else (bd, ad)
    np.copyto(full, g)
    np.multiply(full, 0.5, out=full, where=np.broadcast_to(ad == bd, full.shape))
    lost = mine < theirs if larger else mine > theirs
    np.copyto(full, 0, where=np.broadcast_to(lost, full.shape))


def _check_integer_divisor(bd, out) -> None:
    # The result's dtype decides, not the divisor's: a float divided by an integer 0 is inf or NaN, as torch's.
    if out.dtype.kind in "biu" and not np.all(bd):  # NumPy would warn and give 0; torch raises
        raise ZeroDivisionError("integer division or remainder by zero: the divisor tensor holds a 0")


def _remainder_forward(ad, bd, out) -> None:
    _check_integer_divisor(bd, out)
    with np.errstate(invalid="ignore", divide="ignore"):  # a float % 0 is NaN, as torch
        np.remainder(ad, bd, out=out, casting="same_kind")


def _remainder_grad_divisor(ad, bd, g, full) -> None:
    # torch: -g * floor(a / b)
    with np.errstate(invalid="ignore", divide="ignore"):
        np.floor_divide(ad, bd, out=full, casting="same_kind")
    np.negative(full, out=full)
    full *= g


def _floor_divide_forward(ad, bd, out) -> None:
    _check_integer_divisor(bd, out)
    with np.errstate(invalid="ignore", divide="ignore"):  # a float // 0 is +-inf or NaN, as torch
        np.floor_divide(ad, bd, out=out, casting="same_kind")
