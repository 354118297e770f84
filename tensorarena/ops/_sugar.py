"""Operators and methods on Tensor, each a one-line forward to an op function."""

from __future__ import annotations

from ..tensor import Tensor
from . import arith, index, linalg, reduce, shape, unary


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
    T.__neg__ = lambda a: arith.neg(a)
    T.__pow__ = lambda a, p: arith.pow(a, p)
    T.__rpow__ = lambda a, b: arith.pow(b, a)
    T.__matmul__ = lambda a, b: linalg.matmul(a, b)
    T.__rmatmul__ = lambda a, b: linalg.matmul(b, a)
    T.__getitem__ = lambda a, idx: index.getitem(a, idx)
    T.add, T.sub, T.mul, T.div = arith.add, arith.sub, arith.mul, arith.div
    T.neg, T.pow, T.matmul = arith.neg, arith.pow, linalg.matmul
    T.exp, T.log, T.sqrt, T.tanh = unary.exp, unary.log, unary.sqrt, unary.tanh
    T.relu, T.sigmoid, T.gelu = unary.relu, unary.sigmoid, unary.gelu
    T.sum, T.mean, T.max, T.var = reduce.sum, reduce.mean, reduce.max, reduce.var
    T.softmax, T.log_softmax = reduce.softmax, reduce.log_softmax
    T.reshape = T.view = shape.reshape
    T.clone = shape.clone
    T.transpose, T.permute, T.flatten = shape.transpose, shape.permute, shape.flatten
    T.unsqueeze, T.squeeze, T.expand = shape.unsqueeze, shape.squeeze, shape.expand
    T.T = property(lambda a: shape.permute(a, *reversed(range(a.ndim))))

