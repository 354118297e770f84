"""Dtype conversions: float() double() long() int() bool() type_as() to(), as torch's Tensor methods."""

from __future__ import annotations

import numpy as np

from ..device import check_cpu
from ..tape import host
from ..tensor import Tensor
from ._base import as_dtype, as_tensor, new


def to_dtype(a: Tensor, dtype) -> Tensor:
    """`a` converted to `dtype`: `a` itself if it already is (as torch); float to float keeps the gradient
    (handed back in a's dtype), a result that is no float has none (torch: an integer tensor has no gradient)."""
    dtype = np.dtype(dtype)
    ad = a.data
    if ad.dtype == dtype:
        return a
    out = new(ad.shape, dtype)
    host(_convert, out, ad)
    if dtype.kind != "f":
        return Tensor._make(out)
    source = ad.dtype

    def backward(g):
        return (as_dtype(g, source),)

    return Tensor._make(out, (a,), backward)  # records nothing unless `a` requires grad (a float)


def to_float(a: Tensor) -> Tensor:
    """a as float32 (torch's Tensor.float)."""
    return to_dtype(a, np.float32)


def to_double(a: Tensor) -> Tensor:
    """a as float64 (torch's Tensor.double)."""
    return to_dtype(a, np.float64)


def to_long(a: Tensor) -> Tensor:
    """a as int64 (torch's Tensor.long), truncated toward zero."""
    return to_dtype(a, np.int64)


def to_int(a: Tensor) -> Tensor:
    """a as int32 (torch's Tensor.int), truncated toward zero."""
    return to_dtype(a, np.int32)


def to_bool(a: Tensor) -> Tensor:
    """a != 0 as a bool tensor (torch's Tensor.bool)."""
    return to_dtype(a, np.bool_)


def type_as(a: Tensor, other: Tensor) -> Tensor:
    """a in other's dtype (torch's Tensor.type_as): a itself if it already is, else a converted copy."""
    return to_dtype(a, as_tensor(other).dtype)

def float_input(a: Tensor) -> Tensor:
    """`a` for a float-valued function (exp, log, sqrt, tanh, sigmoid): a bool or integer tensor is first
    converted to float32, torch's default dtype, as torch does for these (torch.arange(3).exp() is float32).
    A NumPy array is taken as a tensor, as Linear takes one."""
    a = as_tensor(a)
    return to_float(a) if a.data.dtype.kind in "biu" else a


def refuse_integers(a: Tensor, op: str) -> Tensor:
    """`a` (a NumPy array taken as a tensor) for an op torch has no integer kernel for (gelu, softmax,
    log_softmax); a TypeError for an integer one instead of results truncated from floats or a raw kernel
    typing error."""
    a = as_tensor(a)
    if a.data.dtype.kind in "biu":
        raise TypeError(f"{op}: the tensor has dtype {a.data.dtype}; {op} needs a floating-point tensor (as torch): "
                        f"convert it first (t.float())")
    return a


def _convert(out: np.ndarray, ad: np.ndarray) -> None:
    # float64 -> float32 rounds a tiny value to 0 and a huge one to inf: torch's answer, not an error (NumPy's
    # seterr would raise on it). Float to int truncates toward zero, as torch; NaN to int stays NumPy's error.
    with np.errstate(under="ignore", over="ignore"):
        np.copyto(out, ad, casting="unsafe")


def to(a: Tensor, *args, dtype=None, device=None, copy: bool = False, non_blocking: bool = False) -> Tensor:
    """torch's Tensor.to: to(dtype), to(device), to(device, dtype), to(other) (other's dtype), or keywords.
    The device must be the CPU (the only one there is); `a` itself comes back when nothing changes and not copy."""
    for arg in args:
        if isinstance(arg, Tensor):
            dtype = arg.dtype
        elif isinstance(arg, str) or type(arg).__name__ == "device":  # "cpu", or a torch.device
            device = arg
        else:
            dtype = arg
    check_cpu(device, "to")
    out = a if dtype is None else to_dtype(a, dtype)
    if copy and out is a:
        from .shape import clone  # shape imports index, which imports this module: imported when needed

        out = clone(a)
    return out
