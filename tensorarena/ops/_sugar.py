"""Operators and methods on Tensor, each a one-line forward to an op function."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from . import arith, cast, clamping, compare, index, inplace, linalg, pointwise, reduce, shape, sorting, unary


def install() -> None:
    """Attach the operators and methods to Tensor (ops/__init__ calls it)."""
    T = Tensor
    T.__add__ = lambda a, b: arith.add(a, b)
    T.__radd__ = lambda a, b: arith.add(b, a)
    T.__sub__ = lambda a, b: arith.sub(a, b)
    T.__rsub__ = lambda a, b: arith.sub(b, a)
    T.__mul__ = lambda a, b: arith.mul(a, b)
    T.__rmul__ = lambda a, b: arith.mul(b, a)
    T.__truediv__ = lambda a, b: arith.div(a, b)
    T.__rtruediv__ = lambda a, b: arith.div(b, a)
    T.__iadd__ = lambda a, b: arith.iadd(a, b)
    T.__isub__ = lambda a, b: arith.isub(a, b)
    T.__imul__ = lambda a, b: arith.imul(a, b)
    T.__itruediv__ = lambda a, b: arith.idiv(a, b)
    T.__ipow__ = lambda a, b: arith.ipow(a, b)
    T.__iand__ = lambda a, b: compare.inplace_bitwise(a, b, np.bitwise_and, "&")
    T.__ior__ = lambda a, b: compare.inplace_bitwise(a, b, np.bitwise_or, "|")
    T.__ixor__ = lambda a, b: compare.inplace_bitwise(a, b, np.bitwise_xor, "^")
    T.__neg__ = lambda a: arith.neg(a)
    T.__pos__ = T.positive = _positive
    T.__pow__ = lambda a, p: arith.pow(a, p)
    T.__rpow__ = lambda a, b: arith.pow(b, a)
    T.__matmul__ = lambda a, b: linalg.matmul(a, b)
    T.__rmatmul__ = lambda a, b: linalg.matmul(b, a)
    T.__getitem__ = lambda a, idx: index.getitem(a, idx)
    T.__setitem__ = lambda a, idx, value: inplace.setitem(a, idx, value)
    T.__abs__ = lambda a: unary.abs(a)
    # Elementwise, as torch's; Python reflects `1 < t` to `t > 1` itself. __hash__ stays identity (tensor.py).
    T.__eq__, T.__ne__ = compare.comparison_operator(compare.eq), compare.comparison_operator(compare.ne)
    T.__lt__, T.__le__ = compare.comparison_operator(compare.lt), compare.comparison_operator(compare.le)
    T.__gt__, T.__ge__ = compare.comparison_operator(compare.gt), compare.comparison_operator(compare.ge)
    T.eq, T.ne, T.lt, T.le, T.gt, T.ge = compare.eq, compare.ne, compare.lt, compare.le, compare.gt, compare.ge
    T.equal, T.allclose = compare.equal, compare.allclose
    T.isnan, T.isinf, T.isfinite = compare.isnan, compare.isinf, compare.isfinite
    T.__and__, T.__rand__ = compare.bitwise_and, lambda a, b: compare.bitwise_and(b, a)
    T.__or__, T.__ror__ = compare.bitwise_or, lambda a, b: compare.bitwise_or(b, a)
    T.__xor__, T.__rxor__ = compare.bitwise_xor, lambda a, b: compare.bitwise_xor(b, a)
    T.__invert__ = compare.bitwise_not
    T.add, T.sub, T.mul, T.div = arith.add, arith.sub, arith.mul, arith.div
    T.neg, T.pow, T.matmul = arith.neg, arith.pow, linalg.matmul
    # In place, as torch's methods of these names: each returns the tensor and counts one write.
    T.add_, T.mul_, T.clamp_ = arith.add_, arith.mul_, arith.clamp_
    T.clamp = T.clip = clamping.clamp
    T.zero_, T.fill_, T.copy_ = inplace.zero_, inplace.fill_, inplace.copy_
    T.exp, T.log, T.sqrt, T.tanh = unary.exp, unary.log, unary.sqrt, unary.tanh
    T.relu, T.sigmoid, T.gelu, T.abs = unary.relu, unary.sigmoid, unary.gelu, unary.abs
    T.sin, T.cos, T.square, T.rsqrt = pointwise.sin, pointwise.cos, pointwise.square, pointwise.rsqrt
    T.sign, T.round = pointwise.sign, pointwise.round
    T.sum, T.mean, T.max, T.var = reduce.sum, reduce.mean, reduce.max, reduce.var
    T.argmax, T.argmin, T.all, T.any = reduce.argmax, reduce.argmin, reduce.all, reduce.any
    T.softmax, T.log_softmax = reduce.softmax, reduce.log_softmax
    T.float, T.double, T.long, T.int, T.bool = cast.to_float, cast.to_double, cast.to_long, cast.to_int, cast.to_bool
    T.type_as = cast.type_as
    T.reshape, T.view = shape.reshape, shape.view
    T.clone = shape.clone
    T.transpose, T.permute, T.flatten = shape.transpose, shape.permute, shape.flatten
    T.unsqueeze, T.squeeze, T.expand = shape.unsqueeze, shape.squeeze, shape.expand
    T.T = property(lambda a: shape.permute(a, *reversed(range(a.ndim))))
    T.min, T.std = reduce.min, reduce.std
    T.gather, T.argsort, T.sort, T.topk = sorting.gather, sorting.argsort, sorting.sort, sorting.topk
    T.t = _t
    T.masked_fill = index.masked_fill
    T.split, T.chunk, T.contiguous = shape.split, shape.chunk, shape.contiguous
    T.repeat, T.unbind = shape.repeat, shape.unbind
    T.expand_as = lambda a, other: shape.expand(a, other.shape)
    T.reshape_as = lambda a, other: shape.reshape(a, other.shape)
    T.view_as = lambda a, other: shape.view(a, other.shape)
    T.to = cast.to
    T.dim = lambda a: a.ndim
    T.is_contiguous = lambda a: bool(a.data.flags.c_contiguous)
    T.cpu = lambda a: a  # the only device there is
    T.device = property(lambda a: "cpu")


def _positive(a):
    """+a: a itself, as torch's (torch.positive returns its input, no copy); a bool tensor is refused, as torch's."""
    if a.dtype == np.bool_:
        raise TypeError("the + operator on a bool tensor is not supported (as torch's); convert it first (t.long())")
    return a


def _t(a):
    """torch's t(): the transpose of a 2-D tensor, a 0-d or 1-D one as it is; more dims are refused."""
    from . import shape

    if a.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, got shape {a.shape}; use transpose(a, dim0, "
                         f"dim1) or permute for more")
    return a if a.ndim < 2 else shape.transpose(a, 0, 1)

