"""Elementwise arithmetic with broadcasting: add sub mul div neg pow, and the in-place `+= -= *= /=`."""

from __future__ import annotations

import numpy as np

from ..autograd import is_grad_enabled
from ..kernels import elementwise
from ..journal import note_write
from ..tape import host
from ..tensor import Tensor
from ._base import (_CATEGORY, _constant, as_tensor, check_number_fits, grad_dtype, new, new_like, result_dtype,
                    unbroadcast, weak_operand)


def _binary_out(a: Tensor, b: Tensor, dtype=None) -> np.ndarray:
    # Touch .data first: a stale operand must raise before we allocate anything.
    try:
        shape = np.broadcast_shapes(a.data.shape, b.data.shape)
    except ValueError:
        raise ValueError(f"shapes {a.shape} and {b.shape} do not broadcast") from None
    return new(shape, result_dtype(a, b) if dtype is None else dtype)


# Every binary op's backward hands each parent its gradient in the parent's own dtype (unbroadcast's
# `dtype`), as torch does: after float32 + float64 promotes, the float32 side still gets a float32
# gradient, which its own backward (a float32 GEMM) needs. When the dtypes agree nothing is cast.

def add(a, b) -> Tensor:
    """a + b, broadcasting."""
    a, b, dtype = _operands(a, b, np.add)
    out = _binary_out(a, b, dtype)
    elementwise.add(a.data, b.data, out)
    a_meta, b_meta = _meta(a), _meta(b)  # not a, b: the closure would keep their memory alive

    def backward(g):
        return unbroadcast(g, *a_meta), unbroadcast(g, *b_meta)

    return Tensor._make(out, (a, b), backward)


def sub(a, b) -> Tensor:
    """a - b, broadcasting."""
    _refuse_bool_subtraction(a, b)
    a, b, dtype = _operands(a, b, np.subtract)
    out = _binary_out(a, b, dtype)
    host(np.subtract, a.data, b.data, out=out)
    a_meta, b_meta, b_needs_grad = _meta(a), _meta(b), b.requires_grad

    def backward(g):
        gb = None
        if b_needs_grad:
            gb = new(g.shape, grad_dtype(g, *b_meta))
            host(np.negative, g, out=gb)
            gb = unbroadcast(gb, *b_meta)
        return unbroadcast(g, *a_meta), gb

    return Tensor._make(out, (a, b), backward)


def mul(a, b) -> Tensor:
    """a * b, broadcasting."""
    a, b, dtype = _operands(a, b, np.multiply)
    out = _binary_out(a, b, dtype)
    host(np.multiply, a.data, b.data, out=out)
    # Keep only what backward reads: b for a's gradient, a for b's (a * constant keeps no a).
    a_meta, b_meta = _meta(a), _meta(b)
    ad = a.data if b.requires_grad else None
    bd = b.data if a.requires_grad else None

    def backward(g):
        ga = gb = None
        if bd is not None:
            ga = new(g.shape, grad_dtype(g, *a_meta))
            host(np.multiply, g, bd, out=ga)
            ga = unbroadcast(ga, *a_meta)
        if ad is not None:
            gb = new(g.shape, grad_dtype(g, *b_meta))
            host(np.multiply, g, ad, out=gb)
            gb = unbroadcast(gb, *b_meta)
        return ga, gb

    return Tensor._make(out, (a, b), backward, saved=(b if bd is not None else None, a if ad is not None else None))


def div(a, b) -> Tensor:
    """a / b, broadcasting; true division, as torch's: integer / integer is float32."""
    a, b, dtype = _operands(a, b, np.true_divide)
    out = _binary_out(a, b, dtype)
    bd = b.data
    host(np.divide, a.data, bd, out=out)
    # Backward never reads a; it reads the quotient only for b's gradient.
    a_meta, b_meta, a_needs_grad = _meta(a), _meta(b), a.requires_grad
    quotient = out if b.requires_grad else None

    def backward(g):
        ga = gb = None
        if a_needs_grad:
            ga = new(g.shape, grad_dtype(g, *a_meta))
            host(np.divide, g, bd, out=ga)
            ga = unbroadcast(ga, *a_meta)
        if quotient is not None:
            # Three in-place steps: in g's dtype, so a narrower b's gradient is rounded once, at the end.
            gb = new(g.shape, g.dtype)
            host(_div_grad_b, g, quotient, bd, gb)
            gb = unbroadcast(gb, *b_meta)
        return ga, gb

    # Besides b and the quotient it reads, the dividend counts for b's gradient as in torch (which reads it there).
    return Tensor._make(out, (a, b), backward, saved=(b, a if quotient is not None else None),
                        saved_output=quotient is not None)


def neg(a: Tensor) -> Tensor:
    """-a."""
    _refuse_bool_subtraction(a)
    out = new_like(a.data)
    host(np.negative, a.data, out=out)

    def backward(g):
        ga = new_like(g)
        host(np.negative, g, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def pow(a, exponent) -> Tensor:  # noqa: A001 - torch's name
    """a ** exponent; exponent a Python number or a tensor (broadcasting)."""
    if not isinstance(exponent, (Tensor, np.ndarray)):
        a = as_tensor(a)
        if a.dtype.kind != "f":
            return _pow_integer_tensor(a, exponent)
        return _pow_scalar(a, float(exponent))
    a, b, dtype = _operands(a, exponent, np.power)
    out = _binary_out(a, b, dtype)
    ad, bd = a.data, b.data
    host(np.power if out.dtype.kind == "f" else _integer_power, ad, bd, out=out)
    a_meta, b_meta = _meta(a), _meta(b)  # not a, b: the closure would keep their memory alive
    a_needs_grad, b_needs_grad = a.requires_grad, b.requires_grad

    def backward(g):
        # Each gradient is computed in g's dtype (several in-place steps) and rounded once into its parent's.
        ga = gb = None
        if a_needs_grad:
            ga = new(g.shape, g.dtype)
            host(_pow_grad_a, ad, bd, g, ga)
            ga = unbroadcast(ga, *a_meta)
        if b_needs_grad:
            gb = new(g.shape, g.dtype)
            host(_pow_grad_b, ad, bd, g, out, gb)
            gb = unbroadcast(gb, *b_meta)
        return ga, gb

    return Tensor._make(out, (a, b), backward, saved=(a, b), saved_output=b_needs_grad)


def _integer_power(base: np.ndarray, exponent: np.ndarray, out: np.ndarray) -> None:
    """base ** exponent into the integer `out`, as torch computes it for integer tensors: a negative exponent gives
    1 for base 1, 1 or -1 for base -1 (the exponent's parity) and 0 for any other base (NumPy refuses it)."""
    negative = exponent < 0
    if not negative.any():
        np.power(base, exponent, out=out)
        return
    np.power(base, np.where(negative, 0, exponent), out=out)
    reciprocal = np.where(base == 1, 1, np.where(base == -1, 1 - 2 * (exponent % 2), 0))
    np.copyto(out, reciprocal, where=negative, casting="unsafe")  # values in {-1, 0, 1}: any integer dtype holds them


def _pow_integer_tensor(a: Tensor, exponent) -> Tensor:
    """An integer (or bool) tensor to a number, with torch's dtypes: an integer power keeps the integers (int64
    for bool), a float one is float32 (a Python float's default dtype). No gradient: integers never need one."""
    ad = a.data
    if isinstance(exponent, (int, np.integer)):
        if exponent < 0:  # torch's refusal too: the result would not be an integer
            raise ValueError(f"pow: integers to negative integer powers are not allowed (exponent {exponent}, "
                             f"tensor dtype {ad.dtype}); use a float tensor or a float exponent")
        out = new(ad.shape, ad.dtype if ad.dtype.kind in "iu" else np.int64)
        host(np.power, ad, out.dtype.type(exponent), out=out)
    else:
        out = new(ad.shape, np.float32)
        host(np.power, ad, float(exponent), out=out, casting="same_kind")
    return Tensor._make(out)


def _pow_scalar(a: Tensor, p: float) -> Tensor:
    ad = a.data
    out = new_like(ad)
    if p == 2.0:
        host(np.multiply, ad, ad, out=out)  # exact and faster than power
    else:
        host(np.power, ad, p, out=out)

    def backward(g):
        ga = new_like(g)
        host(_pow_scalar_grad, ad, p, g, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,))


# -- in place: x += y, x -= y, x *= y, x /= y ------------------------------------------------------------------
# Without these Python would run `x = x + y`: the name is rebound to a new tensor and the tensor a model or a
# view's base holds keeps its values (`with no_grad(): w -= lr * w.grad` silently trained nothing). They write
# into the tensor's own array, so a view writes through to its base, as in NumPy and torch.
#
# Autograd records no op for them (no rewriting of a view's base history as torch's CopySlices), so they are
# refused where they would have to be differentiated: on a leaf that requires grad (torch's own error) and on a
# non-leaf, while grad is enabled. Under no_grad() they are the user's update step, as in torch. A tensor that
# does not require grad may be written with grad enabled. Each write bumps the tensor's version counter (shared
# with its views): backward through an op that saved the tensor before the write then raises, as torch does,
# instead of reading the new values (autograd.check_saved).

def iadd(a: Tensor, b) -> Tensor:
    """a += b in place (b broadcasts to a's shape); returns a."""
    return _inplace(a, b, np.add, "+")


def isub(a: Tensor, b) -> Tensor:
    """a -= b in place (b broadcasts to a's shape); returns a."""
    return _inplace(a, b, np.subtract, "-")


def imul(a: Tensor, b) -> Tensor:
    """a *= b in place (b broadcasts to a's shape); returns a."""
    return _inplace(a, b, np.multiply, "*")


def idiv(a: Tensor, b) -> Tensor:
    """a /= b in place (b broadcasts to a's shape); returns a."""
    return _inplace(a, b, np.divide, "/")


def ipow(a: Tensor, b) -> Tensor:
    """a **= b in place (b broadcasts to a's shape); returns a. (Python rebound the name to a new tensor before.)"""
    return _inplace(a, b, np.power, "**")


def _inplace(a: Tensor, b, ufunc: np.ufunc, symbol: str) -> Tensor:
    return binary_inplace(a, b, ufunc, f"{symbol}=", f"`x = x {symbol} y`")


def add_(a: Tensor, other, *, alpha=1) -> Tensor:
    """torch's a.add_(other, alpha=alpha): a += alpha * other in place (other broadcasts to a's shape); returns a."""
    return binary_inplace(a, other, np.add, "add_()", "`x = x + alpha * y`", alpha=alpha)


def mul_(a: Tensor, other) -> Tensor:
    """torch's a.mul_(other): a *= other in place (other broadcasts to a's shape); returns a."""
    return binary_inplace(a, other, np.multiply, "mul_()", "`x = x * y`")


def clamp_(a: Tensor, min=None, max=None) -> Tensor:
    """torch's a.clamp_(min, max): each element raised to min, then lowered to max (so min > max gives max)."""
    if min is None and max is None:
        raise ValueError("clamp_() needs min or max (or both); with neither there is nothing to clamp")
    # One write as torch counts it: the checks for both bounds run before either is applied.
    check_number_fits(min, a.dtype, "clamp_() (min)")
    check_number_fits(max, a.dtype, "clamp_() (max)")
    bounds = [(np.maximum, min), (np.minimum, max)]
    checked = [(ufunc, _inplace_operand(a, bound, "clamp_()", "`ops.where(x < lo, lo, x)`"))
               for ufunc, bound in bounds if bound is not None]
    ad = a.data
    for ufunc, bd in checked:
        host(ufunc, ad, bd, out=ad, casting="unsafe")  # (categories checked by _inplace_operand)
    a._version_counter[0] += 1
    return a


def binary_inplace(a: Tensor, b, ufunc: np.ufunc, what: str, instead: str, *, alpha=1) -> Tensor:
    """a = ufunc(a, alpha * b) written into a's memory; one version bump; returns a. `what` names the operation
    in errors and `instead` the out-of-place way to write it."""
    bd = _inplace_operand(a, b, what, instead, alpha=alpha, divide=ufunc is np.divide)
    ad = a.data
    host(ufunc, ad, bd, out=ad, casting="unsafe")  # (the categories were checked: within one, wrapping as torch)
    a._version_counter[0] += 1  # after the write: a refused one changed nothing
    return a


def _inplace_operand(a: Tensor, b, what: str, instead: str, *, alpha=1, divide=False) -> np.ndarray:
    """b's array (times alpha) for an in-place write into a, after every check: nothing is written yet."""
    check_inplace_graph(a, b, what, instead)
    b = as_tensor(b, like=a)
    ad, bd = writable(a, what, instead), b.data  # both through .data: a stale operand raises here
    if not broadcasts_to(bd.shape, ad.shape):
        raise ValueError(f"in-place {what}: shape {bd.shape} does not broadcast to the tensor's shape {ad.shape}")
    refuse_overlap(ad, bd, f"in-place {what}")
    dtype = _true_divide_dtype(a, b) if divide else result_dtype(a, b)
    if alpha != 1:
        if isinstance(alpha, (float, np.floating)) and ad.dtype.kind != "f":
            raise TypeError(f"in-place {what}: a floating-point alpha ({alpha}) with a tensor of dtype {ad.dtype}; "
                            f"torch refuses it too (pass an integer alpha, or use a float tensor)")
        scaled = new(bd.shape, dtype)
        host(np.multiply, bd, np.asarray(alpha, dtype), out=scaled, casting="same_kind")
        bd = scaled
    # torch's rule: a result of a higher category (a float into an integer tensor, an integer into a bool one) is
    # refused; within one it is cast, wrapping as torch's (uint8 += an int64 tensor was refused here).
    if _CATEGORY[dtype.kind] > _CATEGORY[ad.dtype.kind]:
        raise TypeError(f"in-place {what}: the result type {dtype} can't be cast to the tensor's dtype {ad.dtype}")
    return bd


OVERLAP_MESSAGE = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                   "single memory location. Please clone() the tensor before performing the operation.")


def refuse_overlap(dst: np.ndarray, src: np.ndarray, what: str, *, identical_ok: bool = True) -> None:
    """Refuse, with torch's error, a write into `dst` that reads `src` sharing some of dst's memory.

    NumPy copies such a source first and answers as if it had been cloned (`t[1:] = t[:-1]` shifts); torch raises
    instead (and where its check gives up, on strided views, writes in place and smears the values). A source
    that is exactly the destination (`t[:] = t`, `t.add_(t)`: each element reads only itself) is fine, as in
    torch, unless `identical_ok` is False (an indexed write, which torch refuses even then).
    """
    if not np.may_share_memory(dst, src):  # bounds only: the common case, no shared buffer at all, is cheap
        return
    if identical_ok and _same_elements(dst, src):
        return
    try:
        shared = np.shares_memory(dst, src, max_work=_OVERLAP_WORK)
    except np.exceptions.TooHardError:
        shared = True  # undecided within the bound: refuse rather than guess
    if shared:
        raise RuntimeError(f"{OVERLAP_MESSAGE} ({what}: the value is a view of the tensor's own memory, e.g. "
                           f"`t[1:] = t[:-1]`; write `t[1:] = t[:-1].clone()`)")


_OVERLAP_WORK = 1 << 20  # np.shares_memory's search bound; slices of a few dims decide in far fewer steps


def _same_elements(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a and b are the same elements in the same order (one start, shape and stride for every dim that
    has more than one element)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.__array_interface__["data"][0] != b.__array_interface__["data"][0]:
        return False
    return all(n <= 1 or sa == sb for n, sa, sb in zip(a.shape, a.strides, b.strides))


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an operand of `shape` broadcasts to `target` without changing it (what an in-place write needs)."""
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:  # NumPy's message would name neither side as the write's operand and target
        return False


def check_inplace_graph(a: Tensor, value, what: str, instead: str) -> None:
    """Refuse an in-place write autograd cannot record, while grad is enabled (every in-place op's first check).

    A leaf that requires grad is refused as torch refuses it. torch records a write into a graph tensor, or of a
    value that requires grad, as an op; the engine records none, and the gradient would be lost or wrong, so
    those are refused too, naming the out-of-place way (`instead`) to write the same thing.
    """
    if not is_grad_enabled():
        return
    if a.requires_grad and a.is_leaf:
        raise RuntimeError(f"a leaf tensor that requires grad is being used in an in-place operation ({what}); "
                           f"update it under `with no_grad():`, as an optimizer step does")
    if a.requires_grad:
        raise RuntimeError(
            f"in-place {what} on a tensor that is part of the graph (a non-leaf) while grad is enabled: autograd "
            f"cannot record it (ops may have saved its values for backward); write {instead} instead, or "
            f"do it under `with no_grad():` if it is not meant to be differentiated")
    if isinstance(value, Tensor) and value.requires_grad:
        raise RuntimeError(
            f"in-place {what} with a value that requires grad into a tensor that does not, while grad is enabled: "
            f"autograd cannot record it and the gradient through the value would be lost; write {instead} instead "
            f"(a new tensor in the graph), or do it under `with no_grad():` if it is not meant to be differentiated")


def writable(a: Tensor, what: str, instead: str) -> np.ndarray:
    """a's array, refused when it is read-only (several elements share memory, or a constant)."""
    ad = a.data
    if not ad.flags.writeable:
        raise RuntimeError(f"in-place {what} on a read-only tensor (an expand() view or a constant): its "
                           f"elements share memory; write {instead} for a new tensor")
    note_write(a, ad)  # an extra run of a step (a trace) writes back what it changed (journal.py)
    return ad


def _true_divide_dtype(a: Tensor, b: Tensor) -> np.dtype:
    # `/` is true division: int / int is a float, so an integer tensor cannot be divided in place (as in torch).
    dtype = result_dtype(a, b)
    return dtype if dtype.kind == "f" else np.dtype(np.float32)


def _meta(t: Tensor) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of an input: what unbroadcast needs to hand it its gradient."""
    return t.shape, t.dtype


def _array_operand(x: np.ndarray) -> Tensor:
    """An ndarray operand as a tensor of its own dtype: a 0-d one copied into a constant, as a number is (a
    captured step replays it as the constant it is; see _base._constant), a larger one as it is (no copy)."""
    return Tensor(_constant(x.copy())) if x.ndim == 0 else Tensor(x)


def _operands(a, b, ufunc: np.ufunc) -> tuple[Tensor, Tensor, np.dtype]:
    """Both operands of a binary op as tensors, and the result's dtype.

    Numbers (Python's and NumPy's scalars) are weak (as_tensor) and tensors meet by torch's rule (result_dtype).
    An ndarray with a tensor is neither: torch hands `tensor * ndarray` to NumPy (torch's operator gives up and the
    array's ufunc takes over), so the result has NumPy's dtype: float32 (3,) * np.array(2.0) is float64, where a
    0-d float64 *tensor* leaves float32. The array keeps its own dtype and is not copied.
    """
    arrays = isinstance(a, np.ndarray) or isinstance(b, np.ndarray)
    if arrays and (isinstance(a, Tensor) or isinstance(b, Tensor)):
        a, b = (x if isinstance(x, Tensor) else _array_operand(x) for x in (a, b))
        return a, b, ufunc.resolve_dtypes((a.dtype, b.dtype, None))[-1]
    numbers = (not isinstance(a, Tensor), not isinstance(b, Tensor))
    given = (a, b)
    if isinstance(a, Tensor):
        b = as_tensor(b, like=a)
    else:
        b = as_tensor(b)
        a = as_tensor(a, like=b)
    if ufunc is np.true_divide:
        dtype = _true_divide_dtype(a, b)
        # A number met an integer tensor in its dtype (uint8 / -3 divided by 253, int32 / 2**40 by 0): in true
        # division it goes into the float result's dtype instead, as torch's.
        a, b = (Tensor(_constant(np.asarray(x, dtype=dtype))) if number and t.dtype.kind in "biu" else t
                for x, t, number in zip(given, (a, b), numbers))
        return a, b, dtype
    dtype = result_dtype(a, b)
    # A 0-d tensor that result_dtype lets the other's dtype win over goes in that dtype (uint8 + int64 () failed
    # in NumPy's "same_kind" cast; torch wraps it).
    return weak_operand(a, dtype), weak_operand(b, dtype), dtype


def _refuse_bool_subtraction(a, b=None) -> None:
    """torch's refusal of `-` with a bool tensor (a mask's `1 - m` or `-m` is `~m`), before NumPy's raw one."""
    bools = [x for x in (a, b) if isinstance(x, (Tensor, np.ndarray)) and x.dtype == np.bool_]
    if not bools:
        return
    if b is None:
        raise TypeError("Negation, the `-` operator, on a bool tensor is not supported (as in torch); to invert a "
                        "mask use `~` or logical_not()")
    raise TypeError("Subtraction, the `-` operator, with a bool tensor is not supported (as in torch); to invert a "
                    "mask use `~` or logical_not(), or cast it first (e.g. m.long())")


# The NumPy work of the backward passes above, one function each: tape.host records a call as one
# entry of a captured step (compile/captured.py), so a multi-line computation goes in as one function,
# and every value it derives from an array is derived again on each replay.

def _div_grad_b(g, quotient, bd, gb):
    # d(a/b)/db = -(a/b)/b = -out/b
    np.multiply(g, quotient, out=gb)
    np.divide(gb, bd, out=gb)
    np.negative(gb, out=gb)


def _pow_grad_a(ad, bd, g, ga):
    # b * a^(b-1), and 0 where b == 0 as torch defines it: there b * a^(b-1) would be 0 * inf = NaN at a = 0
    # (and a divide-by-zero under np.seterr(all="raise")), so those elements are never computed
    nonzero = np.broadcast_to(bd != 0, ga.shape)
    ga.fill(0)
    np.power(ad, bd - 1, out=ga, where=nonzero)
    np.multiply(ga, bd, out=ga, where=nonzero)
    np.multiply(ga, g, out=ga, where=nonzero)


def _pow_grad_b(ad, bd, g, out, gb):
    # a^b * log(a); torch defines it as 0 where a == 0 and b >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        full = np.where((ad == 0) & (bd >= 0), 0.0, g * out * np.log(ad))
    np.copyto(gb, full, casting="same_kind")


def _pow_scalar_grad(ad, p, g, ga):
    if p == 0.0:  # torch: the gradient of a ** 0 is 0 everywhere (0 * a^-1 would be NaN at a = 0)
        ga.fill(0)
    elif p == 2.0:
        np.multiply(ad, 2.0, out=ga)
    else:
        np.power(ad, p - 1.0, out=ga)
        ga *= p
    if p != 0.0:
        ga *= g
