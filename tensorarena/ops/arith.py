"""Elementwise arithmetic with broadcasting: add sub mul div neg pow."""

from __future__ import annotations

import numpy as np

from ..kernels import elementwise
from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, grad_dtype, new, new_like, result_dtype, unbroadcast


def _binary_out(a: Tensor, b: Tensor) -> np.ndarray:
    # Touch .data first: a stale operand must raise before we allocate anything.
    try:
        shape = np.broadcast_shapes(a.data.shape, b.data.shape)
    except ValueError:
        raise ValueError(f"shapes {a.shape} and {b.shape} do not broadcast") from None
    return new(shape, result_dtype(a, b))


# Every binary op's backward hands each parent its gradient in the parent's own dtype (unbroadcast's
# `dtype`), as torch does: after float32 + float64 promotes, the float32 side still gets a float32
# gradient, which its own backward (a float32 GEMM) needs. When the dtypes agree nothing is cast.

def add(a, b) -> Tensor:
    """a + b, broadcasting."""
    a, b = _pair(a, b)
    out = _binary_out(a, b)
    elementwise.add(a.data, b.data, out)
    a_meta, b_meta = _meta(a), _meta(b)  # not a, b: the closure would keep their memory alive

    def backward(g):
        return unbroadcast(g, *a_meta), unbroadcast(g, *b_meta)

    return Tensor._make(out, (a, b), backward)


def sub(a, b) -> Tensor:
    """a - b, broadcasting."""
    a, b = _pair(a, b)
    out = _binary_out(a, b)
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
    a, b = _pair(a, b)
    out = _binary_out(a, b)
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

    return Tensor._make(out, (a, b), backward)


def div(a, b) -> Tensor:
    """a / b, broadcasting."""
    a, b = _pair(a, b)
    out = _binary_out(a, b)
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

    return Tensor._make(out, (a, b), backward)


def neg(a: Tensor) -> Tensor:
    """-a."""
    out = new_like(a.data)
    host(np.negative, a.data, out=out)

    def backward(g):
        ga = new_like(g)
        host(np.negative, g, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def pow(a, exponent) -> Tensor:  # noqa: A001 - torch's name
    """a ** exponent; exponent a Python number or a tensor (broadcasting)."""
    if not isinstance(exponent, Tensor):
        return _pow_scalar(as_tensor(a), float(exponent))
    a, b = _pair(a, exponent)
    out = _binary_out(a, b)
    ad, bd = a.data, b.data
    host(np.power, ad, bd, out=out)
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

    return Tensor._make(out, (a, b), backward)


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

    return Tensor._make(out, (a,), backward)


def _meta(t: Tensor) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of an input: what unbroadcast needs to hand it its gradient."""
    return t.shape, t.dtype


def _pair(a, b) -> tuple[Tensor, Tensor]:
    if isinstance(a, Tensor):
        return a, as_tensor(b, like=a)
    b = as_tensor(b)
    return as_tensor(a, like=b), b


# The NumPy work of the backward passes above, one function each: tape.host records a call as one
# entry of a captured step (compile/captured.py), so a multi-line computation goes in as one function,
# and every value it derives from an array is derived again on each replay.

def _div_grad_b(g, quotient, bd, gb):
    # d(a/b)/db = -(a/b)/b = -out/b
    np.multiply(g, quotient, out=gb)
    np.divide(gb, bd, out=gb)
    np.negative(gb, out=gb)


def _pow_grad_a(ad, bd, g, ga):
    # b * a^(b-1)
    np.power(ad, bd - 1, out=ga)
    ga *= bd
    ga *= g


def _pow_grad_b(ad, bd, g, out, gb):
    # a^b * log(a); torch defines it as 0 where a == 0 and b >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        full = np.where((ad == 0) & (bd >= 0), 0.0, g * out * np.log(ad))
    np.copyto(gb, full, casting="same_kind")


def _pow_scalar_grad(ad, p, g, ga):
    if p == 2.0:
        np.multiply(ad, 2.0, out=ga)
    else:
        np.power(ad, p - 1.0, out=ga)
        ga *= p
    ga *= g
