"""Helpers every op file shares: coercion, output allocation, broadcast reduction."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import direct_leaf_grad_buffer
from ..memory.arena import empty
from ..tape import host
from ..tensor import Tensor


def as_tensor(x: Any, like: Tensor | None = None) -> Tensor:
    """Tensor for an op input; Python/NumPy scalars take `like`'s dtype (torch promotion).

    A number is weak, as in torch: it takes `like`'s dtype unless it is of a higher category (a float with an
    int tensor: `i * 2.5` is float32, not 2). Then a Python number takes torch's default for its category
    (float32), a NumPy one keeps its own dtype; `result_dtype` ranks the two operands after that.
    """
    if isinstance(x, Tensor):
        return x
    dtype = like.dtype if like is not None else None
    arr = np.asarray(x)
    if arr.dtype.kind in "USOV":  # a string, bytes, None, an int beyond 64 bits: no number (KeyError 'U' before)
        if isinstance(x, int) and not isinstance(x, bool):
            raise OverflowError(f"the integer {x} is too big for any tensor dtype (64 bits at most)")
        raise TypeError(f"unsupported operand: a {type(x).__name__} ({x!r:.40}) is no number or tensor; ops take "
                        f"tensors, arrays and numbers")
    if like is not None and arr.dtype.kind in "iufb" and arr.ndim == 0:
        if _CATEGORY[arr.dtype.kind] > _CATEGORY[dtype.kind]:
            return Tensor(_constant(_own_category(x, arr)))
        return Tensor(_constant(arr.astype(dtype)))
    t = Tensor(arr, dtype=dtype if arr.dtype.kind in "iub" else None)
    if isinstance(x, (int, float, bool, np.generic)):
        _constant(t.data)
    return t


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}  # torch's promotion categories: bool < integer < floating


def _own_category(x: Any, arr: np.ndarray) -> np.ndarray:
    """A number of a higher category than the tensor it meets, in torch's default dtype for that category."""
    if isinstance(x, (bool, int, float)):  # Python numbers: float -> float32, int -> int64, as in torch
        return arr.astype(np.float32 if arr.dtype.kind == "f" else np.int64)
    return arr


def _constant(a: np.ndarray) -> np.ndarray:
    """A 0-d array this module made from a number in the op's arguments (x * 2.0), marked read-only: a captured
    fused step may replay it as the constant it is (compile/captured.py's check for heap arrays lets such
    arrays through; a number computed from the data would still differ between its two checking batches)."""
    if a.ndim == 0 and a.flags.owndata:
        a.flags.writeable = False
    return a


def is_constant(a: np.ndarray) -> bool:
    """Whether `a` is a number an op argument turned into a 0-d array (`_constant`)."""
    return a.ndim == 0 and a.flags.owndata and not a.flags.writeable


def result_dtype(a: Tensor, b: Tensor) -> np.dtype:
    """The dtype of a binary op's result, by torch's rule: a higher category (bool < int < float) wins
    (int64 * float32 -> float32, where NumPy says float64), and within one category a 0-d tensor does not
    widen a tensor with dimensions (float32 (N,) * float64 () -> float32); two of a kind: the wider."""
    da, db = a.dtype, b.dtype
    if da == db:  # nearly every call: no rule to apply
        return da
    zero_a, zero_b = a.ndim == 0, b.ndim == 0
    if zero_a == zero_b:
        return promote_types(da, db)
    dims, zero = (db, da) if zero_a else (da, db)
    if _CATEGORY[zero.kind] > _CATEGORY[dims.kind]:
        return promote_types(dims, zero)  # the 0-d one brings a higher category: it counts
    return dims


def weak_operand(t: Tensor, dtype: np.dtype) -> Tensor:
    """`t` in the result's `dtype` where result_dtype let the other operand's dtype win over it (a 0-d tensor within
    the same category: uint8 (N,) + int64 () is uint8) and NumPy would refuse the cast ("same_kind": int64 into
    uint8): converted by a recorded copy, wrapping as torch's cast does; else `t` itself."""
    if t.dtype == dtype or np.can_cast(t.dtype, dtype, casting="same_kind"):
        return t
    return Tensor(as_dtype(t.data, dtype))


def check_number_fits(value: Any, dtype: np.dtype, what: str, *, floats: bool = False) -> None:
    """Refuse, as torch does, a Python or NumPy number that an integer tensor's dtype cannot hold, where an op
    writes the number into such a tensor (fill_, t[i] = v, masked_fill, where, clamp): NumPy's cast wraps it
    (uint8 clamp(max=300) was max=44), and makes NaN, inf or 1e30 the dtype's minimum. torch lets an unsigned
    dtype take down to -max (-1 -> 255), and a float in range is truncated (2.7 -> 2). Arithmetic and comparisons
    wrap in torch too, so they do not check. `floats`: the op writes a float into the integer tensor as it is
    (fill_, t[i] = v, masked_fill); where and clamp promote to a float result instead, and clamp_ refuses it."""
    if isinstance(value, (bool, np.bool_)) or dtype.kind not in "iu":
        return
    if isinstance(value, (float, np.floating)) and floats:
        if not np.isfinite(value):
            raise OverflowError(f"{what}: the value {value} cannot be converted to the tensor's dtype {dtype} (an "
                                f"integer dtype has no {value}); use a float tensor, or a finite value")
    elif not isinstance(value, (int, np.integer)):
        return
    info = np.iinfo(dtype)
    low = -int(info.max) if dtype.kind == "u" else int(info.min)
    if not low <= int(value) <= int(info.max):  # (a float truncated by int(), as torch's cast truncates it)
        raise OverflowError(f"{what}: the value {value} cannot be converted to the tensor's dtype {dtype} without "
                            f"overflow (torch takes {low} to {info.max} for it); cast the tensor to a wider dtype "
                            f"first (e.g. .long()) or pass a value in range")


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype:
    """torch.promote_types: a float dtype beats any integer or bool one as it is (never widened by the int)."""
    if a.kind == "f" and b.kind != "f":
        return a
    if b.kind == "f" and a.kind != "f":
        return b
    return np.result_type(a, b)


def new(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Uninitialised output buffer from the current arena (heap if none is open)."""
    return empty(tuple(shape), dtype)


def count_up(out: np.ndarray) -> None:
    """out[i] = i for a 1-D array: with tape.host, index arrays (positions, labels) a captured step writes itself."""
    out[...] = np.arange(out.shape[0])


def grad_out(parent: Tensor | None, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Buffer for `parent`'s gradient: its persistent .grad buffer when autograd allows a
    direct write (a parameter used once), else a transient one from the arena. The backward
    must return this very array (not a view) for the direct write to count. `parent` None
    (an intermediate, see `leaf_or_none`) always gets a transient one."""
    buf = direct_leaf_grad_buffer(parent, tuple(shape), dtype) if parent is not None else None
    return buf if buf is not None else new(shape, dtype)


def leaf_or_none(t: Tensor) -> Tensor | None:
    """What a backward closure may keep of an input tensor for `grad_out`: a leaf, whose data
    persists anyway, never an intermediate: holding it would keep its memory alive until
    backward (the graph itself holds only nodes, see autograd)."""
    return t if t.is_leaf else None


def new_like(a: np.ndarray) -> np.ndarray:
    return empty(a.shape, a.dtype)


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...], dtype=None) -> np.ndarray:
    """Sum `grad` over the axes that broadcasting added or stretched to reach `shape`, into `dtype`.

    `dtype` (default grad's) is the parent's: after promotion (float32 + float64) a parent gets its
    gradient in its own dtype, as in torch. The sum runs in grad's precision and rounds once into the
    result; `grad` itself comes back, no copy, when neither the shape nor the dtype changes.
    """
    dtype = grad.dtype if dtype is None else np.dtype(dtype)
    if grad.shape == shape:
        return as_dtype(grad, dtype)
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1
    )
    out = new(shape, dtype)
    # keepdims keeps the leading axes as size 1, so a reshape of `out` is a valid target. NumPy would sum
    # in out's dtype: a cast names grad's, so the sum keeps its precision and rounds once at the end.
    precision = {} if dtype == grad.dtype else {"dtype": grad.dtype}
    host(np.sum, grad, axis=axes, keepdims=True, out=out.reshape((1,) * lead + tuple(shape)), **precision)
    return out


def grad_dtype(g: np.ndarray, shape: tuple[int, ...], dtype) -> np.dtype:
    """Dtype of the full-size buffer an elementwise backward writes a parent's gradient into, before
    `unbroadcast(buf, shape, dtype)`: the parent's own when no sum follows (NumPy rounds each element
    as it writes it, so no cast copy is needed), else g's, for the sum to run in g's precision."""
    return np.dtype(dtype) if g.shape == shape else g.dtype


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    """Sorted tuple of non-negative axes; None or () means all axes (torch's convention)."""
    if axis is None or (isinstance(axis, tuple) and not axis):
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):  # a NumPy integer too (a dim read from a shape array), as torch
        axis = (axis,)
    if not isinstance(axis, (tuple, list)) or not all(is_int(ax) for ax in axis):
        # a bool is an int to Python: sum(True) would reduce dim 1 where keepdim=True was meant; a float
        # would be truncated or fail inside NumPy. torch refuses both.
        raise TypeError(f"dim must be an int or a tuple of ints, got {axis!r}")
    bound = max(ndim, 1)  # a 0-d tensor accepts dim 0 and -1, as in torch
    out = []
    for ax in axis:
        if not -bound <= ax < bound:
            raise IndexError(f"dimension {ax} is out of range for a tensor with {ndim} dimensions")
        if ax % bound in out:
            # torch refuses (0, -2) on a 2-d tensor; reducing once would hide the caller's mistake
            raise ValueError(f"dim {ax % bound} appears more than once in the dims {tuple(axis)}; name each "
                             f"dimension once")
        out.append(ax % bound)
    return tuple(sorted(out)) if ndim else ()


def is_int(x) -> bool:
    """An int or NumPy integer, not a bool (an int to Python, but never a dim, a size or an index here)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def as_count(value, what: str) -> int:
    """A size, count or shift given as an int (a NumPy integer, or a one-element integer tensor, as torch takes).

    int() would truncate 2.7 to 2 and read True as 1, silently; torch refuses both, and so does this.
    """
    if isinstance(value, Tensor) and value.data.dtype.kind in "iu" and value.data.size == 1:
        return int(value)
    if is_int(value):
        return int(value)
    raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")


def as_dtype(g: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`g` in `dtype`: a parent's gradient keeps the parent's precision after promotion."""
    if g.dtype == dtype:
        return g
    out = new(g.shape, dtype)
    host(np.copyto, out, g, casting="unsafe")
    return out


def reshaped(a: np.ndarray, shape) -> np.ndarray:
    """`a.reshape(shape)`: a view when one exists, else a copy made in the current arena.

    NumPy's own reshape copies a non-contiguous array onto the heap, outside the step's
    arena and outside a fused plan, so the copy is made here instead.
    """
    try:
        return a.reshape(shape, copy=False)
    except ValueError:
        pass
    dense = new(a.shape, a.dtype)
    host(np.copyto, dense, a)
    return dense.reshape(shape)  # a C-contiguous array always reshapes as a view


def contiguous(a: np.ndarray, dtype=None) -> np.ndarray:
    """`a` as a C-contiguous array of `dtype`: itself when it already is one, else a copy in the arena.

    Kernels walk flat rows; np.ascontiguousarray would copy onto the heap, outside the step arena.
    """
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    if a.flags.c_contiguous and a.dtype == dtype:
        return a
    out = new(a.shape, dtype)
    host(np.copyto, out, a, casting="same_kind")
    return out
