"""Elementwise comparisons (== != < <= > >=) with broadcasting, and whole-tensor equal / allclose, as torch's.

The operands meet in torch's promoted dtype (`result_dtype`, numbers weak): a float32 tensor == 0.1 compares
against 0.1 rounded to float32, as torch does, where NumPy would widen to float64 and answer False. The
result is a bool tensor outside the graph: nothing of it has a gradient.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, new, result_dtype


def _is_operand(x: Any) -> bool:
    """What torch compares with a tensor: a tensor, or a number (bool included); an ndarray counts as a tensor."""
    return isinstance(x, (Tensor, np.ndarray, numbers.Number, np.generic))


def _compare(ufunc: np.ufunc, name: str, a: Any, b: Any) -> Tensor:
    for x in (a, b):
        if not _is_operand(x):
            raise TypeError(f"{name}: compares tensors, arrays and numbers, got {type(x).__name__}; convert it "
                            f"(e.g. ta.tensor(...)) or compare something else")
    # An array is a tensor of its own dtype (as torch.from_numpy's), not a weak number: as_tensor would cast an
    # integer array to the other side's dtype (a bool tensor == [2] would compare True == True).
    a, b = (Tensor(x) if isinstance(x, np.ndarray) else x for x in (a, b))
    if isinstance(a, Tensor):
        b = as_tensor(b, like=a)
    elif isinstance(b, Tensor):
        a = as_tensor(a, like=b)
    else:  # two numbers
        a, b = as_tensor(a), as_tensor(b)
    ad, bd = a.data, b.data  # a stale operand raises here, before anything is allocated
    try:
        shape = np.broadcast_shapes(ad.shape, bd.shape)
    except ValueError:
        raise ValueError(f"{name}: shapes {ad.shape} and {bd.shape} do not broadcast") from None
    dtype = result_dtype(a, b)
    out = new(shape, np.bool_)
    # The signature casts each operand to the promoted dtype as it reads it: no converted copies. "unsafe": a 0-d
    # int64 tensor meeting uint8 ones compares in uint8, wrapped as torch's cast (NumPy's same_kind refused it).
    host(ufunc, ad, bd, out=out, signature=(dtype, dtype, np.bool_), casting="unsafe")
    return Tensor._make(out)  # no parents: a comparison has no gradient and records nothing


def eq(a, b) -> Tensor:
    """a == b elementwise (broadcasting), a bool tensor."""
    return _compare(np.equal, "eq", a, b)


def ne(a, b) -> Tensor:
    """a != b elementwise (broadcasting), a bool tensor."""
    return _compare(np.not_equal, "ne", a, b)


def lt(a, b) -> Tensor:
    """a < b elementwise (broadcasting), a bool tensor."""
    return _compare(np.less, "lt", a, b)


def le(a, b) -> Tensor:
    """a <= b elementwise (broadcasting), a bool tensor."""
    return _compare(np.less_equal, "le", a, b)


def gt(a, b) -> Tensor:
    """a > b elementwise (broadcasting), a bool tensor."""
    return _compare(np.greater, "gt", a, b)


def ge(a, b) -> Tensor:
    """a >= b elementwise (broadcasting), a bool tensor."""
    return _compare(np.greater_equal, "ge", a, b)


def isnan(a: Tensor) -> Tensor:
    """Where `a` is NaN, a bool tensor (torch.isnan: all False for integers)."""
    return _classify(a, np.isnan)


def isinf(a: Tensor) -> Tensor:
    """Where `a` is +-inf, a bool tensor (torch.isinf)."""
    return _classify(a, np.isinf)


def isfinite(a: Tensor) -> Tensor:
    """Where `a` is neither NaN nor +-inf, a bool tensor (torch.isfinite: all True for integers)."""
    return _classify(a, np.isfinite)


def _classify(a: Tensor, ufunc: np.ufunc) -> Tensor:
    ad = _tensor_operand(a, ufunc.__name__).data
    out = new(ad.shape, np.bool_)
    host(ufunc, ad, out=out)  # NumPy's answers for integers and bools are torch's
    return Tensor._make(out)


def bitwise_and(a, b) -> Tensor:
    """a & b for bool or integer tensors (torch: `mask1 & mask2`); refused for floats, as torch refuses."""
    return _bitwise(np.bitwise_and, "&", a, b)


def bitwise_or(a, b) -> Tensor:
    """a | b for bool or integer tensors."""
    return _bitwise(np.bitwise_or, "|", a, b)


def bitwise_xor(a, b) -> Tensor:
    """a ^ b for bool or integer tensors."""
    return _bitwise(np.bitwise_xor, "^", a, b)


def bitwise_not(a: Tensor) -> Tensor:
    """~a: logical not of a bool tensor, bitwise not of an integer one (torch's ~)."""
    ad = _tensor_operand(a, "~").data
    _need_integral(ad.dtype, "~")
    out = new(ad.shape, ad.dtype)
    host(np.invert, ad, out=out)
    return Tensor._make(out)


def _bitwise(ufunc: np.ufunc, symbol: str, a: Any, b: Any) -> Tensor:
    a, b = (Tensor(x) if isinstance(x, np.ndarray) else x for x in (a, b))
    a, b = (a, as_tensor(b, like=a)) if isinstance(a, Tensor) else (as_tensor(a, like=b), b)
    ad, bd = a.data, b.data
    for d in (ad, bd):
        _need_integral(d.dtype, symbol)
    try:
        shape = np.broadcast_shapes(ad.shape, bd.shape)
    except ValueError:
        raise ValueError(f"{symbol}: shapes {ad.shape} and {bd.shape} do not broadcast") from None
    dtype = result_dtype(a, b)
    out = new(shape, dtype)
    host(ufunc, ad, bd, out=out, signature=(dtype, dtype, dtype), casting="unsafe")  # (as _compare's)
    return Tensor._make(out)  # bits have no gradient


def inplace_bitwise(a: Tensor, b: Any, ufunc: np.ufunc, symbol: str) -> Tensor:
    """a &= b, a |= b, a ^= b in a's memory (Python rebound the name to a new tensor before: a view or a parameter
    written through it did not change)."""
    from .arith import binary_inplace

    _need_integral(a.dtype, symbol)
    _need_integral(as_tensor(b, like=a).dtype, symbol)
    return binary_inplace(a, b, ufunc, f"{symbol}=", f"`x = x {symbol} y`")


def _need_integral(dtype: np.dtype, symbol: str) -> None:
    if dtype.kind not in "biu":
        example = "~(x > 0)" if symbol == "~" else f"(x > 0) {symbol} (x < 1)"
        raise TypeError(f"{symbol} takes bool or integer tensors, got dtype {dtype} (torch refuses floats too); "
                        f"compare first, e.g. `{example}`")


def comparison_operator(fn):
    """`fn` as a comparison operator: NotImplemented for what torch does not compare (None, a string, a list),
    so Python answers as for any object (`t == None` is False, `t < None` a TypeError), as it does for torch."""
    def op(a, b):
        return fn(a, b) if _is_operand(b) else NotImplemented
    op.__name__ = fn.__name__
    op.__doc__ = fn.__doc__
    return op


def equal(a, b) -> bool:
    """torch.equal: True if a and b have the same shape and the same values (NaN equals nothing)."""
    a_t, b_t = _tensor_operand(a, "equal"), _tensor_operand(b, "equal")
    if a_t.shape != b_t.shape:
        return False
    return bool(np.all(eq(a_t, b_t).data))


def allclose(a, b, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """torch.allclose: |a - b| <= atol + rtol * |b| everywhere (broadcasting); a and b of one dtype, as torch."""
    a_t, b_t = _tensor_operand(a, "allclose"), _tensor_operand(b, "allclose")
    if a_t.dtype != b_t.dtype:
        raise TypeError(f"allclose: the tensors have dtypes {a_t.dtype} and {b_t.dtype}; torch refuses to compare "
                        f"different dtypes here: convert one first (e.g. b.double() or a.float())")
    try:
        np.broadcast_shapes(a_t.shape, b_t.shape)
    except ValueError:
        raise ValueError(f"allclose: shapes {a_t.shape} and {b_t.shape} do not broadcast") from None
    return bool(np.allclose(a_t.data, b_t.data, rtol=rtol, atol=atol, equal_nan=equal_nan))


def _tensor_operand(x: Any, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return Tensor(x)
    raise TypeError(f"{name}: takes tensors (or arrays), got {type(x).__name__}")
