"""Reductions over axes (keepdim as in torch): sum mean max var argmax argmin all any, and softmax / log_softmax."""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np

from ..kernels import kernel
from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, contiguous, new, new_like, normalize_axes, reshaped
from .cast import refuse_integers, to_dtype
from .unary import sqrt_of_variance


class MaxResult(NamedTuple):
    """torch.max(a, dim)'s result: the maxima and the int64 index of the first one along dim."""

    values: Tensor
    indices: Tensor


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _reduce_axes(dim, ndim: int) -> tuple[int, ...]:
    # torch reads an empty dim tuple as "all dims", and lets a 0-d tensor be reduced over
    # dim 0/-1 (a no-op); NumPy would do nothing for () and reject axis 0 of a scalar.
    if isinstance(dim, (tuple, list)) and len(dim) == 0:
        dim = None
    if ndim == 0:
        for ax in (() if dim is None else (dim,) if isinstance(dim, (int, np.integer)) else dim):
            if ax not in (0, -1):
                raise IndexError(f"dimension {ax} is out of range for a tensor with 0 dimensions")
        return ()
    return normalize_axes(dim, ndim)


def _expand_grad(g: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray:
    """View of `g` (reduced over `axes`) broadcast back to the input `shape`."""
    return np.broadcast_to(reshaped(g, _reduced_shape(shape, axes, True)), shape)


def _accumulator(ad: np.ndarray, axes: tuple[int, ...]) -> np.dtype | None:
    """The dtype a float32 reduction over `axes` adds in: NumPy sums pairwise only over contiguous memory (the
    trailing axes of a C-contiguous array); along any other axis it adds slice after slice in float32, and a sum,
    mean or var over the 1e6 rows of a (1e6, 4) array was 2.7e-5 to 3.7e-4 off (torch's: ~1e-7; a helper's
    hunt). Those add in float64 (no copy of the input: NumPy casts it in small buffers) and round once. None: the
    input's own dtype (float64, or float32 summed pairwise)."""
    if ad.dtype != np.float32 or not axes:
        return None
    if ad.flags.c_contiguous and axes == tuple(range(ad.ndim - len(axes), ad.ndim)):
        return None
    return np.dtype(np.float64)


def sum(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    """Sum over `dim` (int, tuple or None for all)."""
    ad = a.data
    axes = _reduce_axes(dim, ad.ndim)
    # torch sums bool and integer tensors into int64: NumPy would keep the input's dtype for `out` (a bool
    # sum would be True, not a count, and an int32 sum would wrap)
    dtype = np.dtype(np.int64) if ad.dtype.kind in "bi" or (ad.dtype.kind == "u" and ad.dtype.itemsize < 8) \
        else ad.dtype
    out = new(_reduced_shape(ad.shape, axes, keepdim), dtype)
    host(np.sum, ad, axis=axes, keepdims=keepdim, out=out, dtype=_accumulator(ad, axes) or dtype)
    a_shape = ad.shape  # not ad: backward reads no values, and would keep `a`'s memory alive

    def backward(g):
        ga = new(a_shape, g.dtype)
        host(np.copyto, ga, _expand_grad(g, a_shape, axes))
        return (ga,)

    return Tensor._make(out, (a,), backward)


def mean(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Mean over `dim` (int, tuple or None for all); NaN over no elements, as in torch."""
    ad = a.data
    _need_float(ad, "mean")
    axes = _reduce_axes(dim, ad.ndim)
    count = 1
    for ax in axes:
        count *= ad.shape[ax]
    out = new(_reduced_shape(ad.shape, axes, keepdim), ad.dtype)
    host(_mean_forward, ad, axes, keepdim, count, out)
    a_shape = ad.shape  # not ad: backward reads no values

    def backward(g):
        ga = new(a_shape, g.dtype)
        host(np.divide, _expand_grad(g, a_shape, axes), count, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def max(a: Tensor, dim=None, keepdim: bool = False):  # noqa: A001 - torch's name
    """Max over all elements (a Tensor), or over `dim` (a MaxResult(values, indices)), as torch.max."""
    return _extreme(a, dim, keepdim, "max")


def min(a: Tensor, dim=None, keepdim: bool = False):  # noqa: A001 - torch's name
    """Min over all elements (a Tensor), or over `dim` (a MaxResult(values, indices)), as torch.min."""
    return _extreme(a, dim, keepdim, "min")


# The NumPy reduction and its index twin for each extreme: both pick the first extreme (the first NaN if any).
_EXTREMES = {"max": (np.max, np.argmax), "min": (np.min, np.argmin)}


def _extreme(a: Tensor, dim, keepdim: bool, op: str):
    if dim is None:
        if keepdim:
            raise TypeError(f"{op}: keepdim needs an int dim; {op} over all elements returns a 0-d tensor")
        return _extreme_all(a, op)
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int (or None for all elements), got {dim!r}")
    return _extreme_dim(a, int(dim), keepdim, op)


def _extreme_all(a: Tensor, op: str) -> Tensor:
    ad = a.data
    if ad.size == 0:  # torch's refusal; NumPy's ("zero-size array to reduction operation") names no way out
        raise RuntimeError(f"{op}: the tensor of shape {ad.shape} has no elements, so it has no "
                           f"{op}imum; give a dim to reduce along a non-empty dimension")
    out = new((), ad.dtype)
    host(_EXTREMES[op][0], ad, out=out)

    def backward(g):
        ga = new(ad.shape, ad.dtype)
        host(_max_all_grad, ad, out, g, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,), saved_output=True)


def _extreme_dim(a: Tensor, dim: int, keepdim: bool, op: str) -> MaxResult:
    ad = a.data
    if ad.ndim == 0:  # torch allows dim 0/-1 on a scalar: it is its own extreme at index 0
        _reduce_axes(dim, 0)
        ad = ad.reshape(1)
    (axis,) = normalize_axes(dim, ad.ndim)
    if ad.shape[axis] == 0:  # as torch's IndexError; NumPy's says "attempt to get argmax of an empty sequence"
        raise IndexError(f"{op}: dim {axis} has size 0 in shape {ad.shape}: there is no {op}imum along it")
    keep_shape = _reduced_shape(ad.shape, (axis,), True)
    shape = a.shape if a.ndim == 0 else _reduced_shape(ad.shape, (axis,), keepdim)
    idx = new(keep_shape, np.int64)
    values = new(keep_shape, ad.dtype)
    host(_extreme_along, _EXTREMES[op], ad, axis, idx, values)
    in_shape = ad.shape

    a_shape, a_dtype = a.shape, ad.dtype
    del ad

    def backward(g):
        ga = new(in_shape, a_dtype)
        host(_scatter_along, ga, idx, reshaped(g, keep_shape), axis)
        return (ga.reshape(a_shape),)

    # The indices are returned as a tensor and read by backward: a write to them is refused, as in torch.
    indices_t = Tensor._make(idx.reshape(shape))
    values_t = Tensor._make(values.reshape(shape), (a,), backward, saved=(indices_t,))
    return MaxResult(values_t, indices_t)


def argmax(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """int64 index of the first maximum (the first NaN if any), of the flattened tensor or along `dim` (torch's)."""
    return _arg_extreme(a, dim, keepdim, np.argmax, "argmax")


def argmin(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """int64 index of the first minimum (the first NaN if any), of the flattened tensor or along `dim` (torch's)."""
    return _arg_extreme(a, dim, keepdim, np.argmin, "argmin")


def _arg_extreme(a: Tensor, dim, keepdim: bool, fn, op: str) -> Tensor:
    # An index has no gradient: the result is outside the graph whatever `a` is.
    ad = a.data
    if ad.dtype == np.bool_:  # as torch, which refuses bool here
        raise TypeError(f"{op}: the tensor is bool; convert it first (t.long())")
    if dim is None:
        if ad.size == 0:  # torch's IndexError; NumPy's "attempt to get argmax of an empty sequence" names no way out
            raise IndexError(f"{op}: the tensor of shape {ad.shape} has no elements; give a dim to reduce along a "
                             f"non-empty dimension")
        out = new((1,) * ad.ndim if keepdim else (), np.int64)  # keepdim: every dimension kept as 1, as torch
        host(fn, ad, axis=None, out=out, keepdims=keepdim)
        return Tensor._make(out)
    dim = _int_dim(dim, op)
    if ad.ndim == 0:  # torch allows dim 0/-1 on a scalar: it is its own extreme, at index 0
        _reduce_axes(dim, 0)
        out = new((), np.int64)
        host(np.copyto, out, 0)
        return Tensor._make(out)
    (axis,) = normalize_axes(dim, ad.ndim)
    if ad.shape[axis] == 0:
        raise IndexError(f"{op}: dim {axis} has size 0 in shape {ad.shape}: there is no extreme along it")
    out = new(_reduced_shape(ad.shape, (axis,), keepdim), np.int64)
    host(fn, ad, axis=axis, out=out, keepdims=keepdim)
    return Tensor._make(out)


def all(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    """Whether every element (over `dim`) is nonzero: bool (uint8 for a uint8 tensor, as torch)."""
    return _logical(a, dim, keepdim, np.all)


def any(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    """Whether some element (over `dim`) is nonzero: bool (uint8 for a uint8 tensor, as torch)."""
    return _logical(a, dim, keepdim, np.any)


def _logical(a: Tensor, dim, keepdim: bool, fn) -> Tensor:
    ad = a.data
    axes = _reduce_axes(dim, ad.ndim)
    out = new(_reduced_shape(ad.shape, axes, keepdim), np.uint8 if ad.dtype == np.uint8 else np.bool_)
    host(fn, ad, axis=axes, out=out, keepdims=keepdim)
    return Tensor._make(out)  # a truth value has no gradient


def var(a: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *, correction: int | None = None
        ) -> Tensor:
    """Variance with Bessel's correction by default (torch.var); torch's older `unbiased=False` is correction=0."""
    return _variance(a, dim, unbiased, keepdim, correction, "var", a.dtype)


def _variance(a: Tensor, dim, unbiased, keepdim: bool, correction, what: str, squares_dtype) -> Tensor:
    """The variance with its squared deviations (and the result) in `squares_dtype`."""
    correction = _correction(unbiased, correction, what)
    ad = a.data
    _need_float(ad, what)
    axes = _reduce_axes(dim, ad.ndim)
    count = 1
    for ax in axes:
        count *= ad.shape[ax]
    dof = count - correction
    if dof <= 0:
        warnings.warn(f"{what}: degrees of freedom <= 0 ({count} elements, correction={correction}); "
                      f"the result is inf or nan, as in torch", RuntimeWarning, stacklevel=3)
    # The mean is kept in float64 for float32 input (one value per slice): rounded to float32 first, every
    # deviation carried its error (7.8e-5 relative off a row of 100 values near 3e4; torch 5.8e-8).
    mu = new(_reduced_shape(ad.shape, axes, True), np.float64 if ad.dtype == np.float32 else ad.dtype)
    sq = new(ad.shape, squares_dtype)
    out = new(_reduced_shape(ad.shape, axes, keepdim), squares_dtype)
    host(_var_forward, ad, axes, keepdim, count, dof, mu, sq, out)
    scale = 2.0 / dof if dof > 0 else math.inf

    def backward(g):
        ga = new(ad.shape, ad.dtype)
        host(_var_grad, ad, mu, _expand_grad(g, ad.shape, axes), scale, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,))


def std(a: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *, correction: int | None = None
        ) -> Tensor:
    """Standard deviation, the square root of `var` with the same arguments (torch.std); its gradient is 0
    where the deviation is (a constant slice), as torch's.

    float32 input squares its deviations in float64 and rounds only the root: squared in float32, deviations
    past 1.8e19 overflowed to an inf std where torch's (and the true) deviation is finite."""
    wide = np.float64 if a.dtype == np.float32 else a.dtype
    return to_dtype(sqrt_of_variance(_variance(a, dim, unbiased, keepdim, correction, "std", wide)), a.dtype)


def _correction(unbiased: bool | None, correction: int | None, op: str) -> int:
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}: pass unbiased or correction, not both (unbiased=False is correction=0)")
    if unbiased is not None:
        if not isinstance(unbiased, (bool, np.bool_)):  # var(x, 0, 1) would read a dim as unbiased
            raise TypeError(f"{op}: unbiased must be True or False, got {unbiased!r}")
        return int(bool(unbiased))
    return 1 if correction is None else correction


def _dim_given(dim, op: str) -> None:
    """softmax and log_softmax need their dim, as nn.Softmax does here: torch, given none, picks one (dim 0 for 0-,
    1- and 3-D input, 1 otherwise) with a deprecation warning, and a default of -1 gave other values silently."""
    if dim is None:
        raise TypeError(f"{op}() needs dim (torch's implicit choice is deprecated: dim 0 for 0-, 1- and 3-D input, "
                        f"1 otherwise); pass it, e.g. {op}(x, dim=-1) for the last dim")


def softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """Softmax along `dim` on the softmax kernels (max-subtracted, float64 inside)."""
    _dim_given(dim, "softmax")
    if dtype is not None:  # torch's: the input cast to it first (an integer input becomes a float one)
        input = to_dtype(as_tensor(input), dtype)
    input = refuse_integers(input, "softmax")
    ad = input.data
    if ad.ndim == 0:  # torch allows dim 0/-1 on a scalar: softmax of one element is 1
        _reduce_axes(_int_dim(dim, "softmax"), 0)
        return _softmax_last(input, ad.reshape(1), input.shape)
    (axis,) = normalize_axes(_int_dim(dim, "softmax"), ad.ndim)
    if axis == ad.ndim - 1:
        return _softmax_last(input, ad, ad.shape)
    # The kernels reduce over the last dim: run them on a contiguous copy with `dim` moved last and
    # copy the result back, so the output has the input's layout like every other op's.
    moved = contiguous(np.moveaxis(ad, axis, -1))  # (..., n_dim)
    y = new_like(moved)  # kept for backward, in the moved layout
    kernel("softmax_forward")(moved, None, y)
    out = new_like(ad)
    host(np.copyto, out, np.moveaxis(y, -1, axis))

    def backward(g):
        gy = new_like(y)
        kernel("softmax_backward")(y, contiguous(np.moveaxis(g, axis, -1)), gy)
        ga = new_like(out)
        host(np.copyto, ga, np.moveaxis(gy, -1, axis))
        return (ga,)

    # Backward reads y, a copy made here; the output counts as in torch, which saves it.
    return Tensor._make(out, (input,), backward, saved_output=True)


def _softmax_last(a: Tensor, x: np.ndarray, shape: tuple[int, ...]) -> Tensor:
    x = contiguous(x)
    out = new_like(x)  # kept for backward
    kernel("softmax_forward")(x, None, out)

    del x  # backward needs only the output

    def backward(g):
        ga = new_like(out)
        kernel("softmax_backward")(out, contiguous(g).reshape(out.shape), ga)
        return (ga.reshape(shape),)

    return Tensor._make(out.reshape(shape), (a,), backward, saved_output=True)


def log_softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """log(softmax(a)) along `dim`, computed without forming softmax's log."""
    _dim_given(dim, "log_softmax")
    if dtype is not None:  # torch's: the input cast to it first (an integer input becomes a float one)
        input = to_dtype(as_tensor(input), dtype)
    input = refuse_integers(input, "log_softmax")
    ad = input.data
    a_shape = ad.shape
    if ad.ndim == 0:  # torch allows dim 0/-1 on a scalar: log_softmax of one element is 0
        _reduce_axes(_int_dim(dim, "log_softmax"), 0)
        ad, axis = ad.reshape(1), 0
    else:
        (axis,) = normalize_axes(_int_dim(dim, "log_softmax"), ad.ndim)
    keep = _reduced_shape(ad.shape, (axis,), True)
    out = new_like(ad)
    m = new(keep, ad.dtype)
    lse = new(keep, ad.dtype)
    if ad.size:  # an empty input has an empty result (NumPy's max over an empty dim would raise)
        host(_log_softmax_forward, ad, axis, m, lse, out)

    def backward(g):
        ga = new_like(out)
        s = new(keep, out.dtype)
        if ga.size:
            host(_log_softmax_grad, out, reshaped(g, out.shape), axis, s, ga)
        return (ga.reshape(a_shape),)

    return Tensor._make(out.reshape(a_shape), (input,), backward, saved_output=True)


def _need_float(ad: np.ndarray, op: str) -> None:
    # As torch: an integer mean has no dtype to be in (NumPy would fail casting its float result into `out`).
    if ad.dtype.kind != "f":
        raise TypeError(f"{op}: the tensor has dtype {ad.dtype}; {op} needs a floating-point tensor: convert it "
                        f"first (e.g. ta.Tensor(x.numpy().astype(np.float32)))")


def _int_dim(dim, op: str) -> int:
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    return int(dim)


# The NumPy work of the ops above, one function each: tape.host records a call as one entry of a
# captured step (compile/captured.py), so a multi-line computation goes in as one function, and every
# value it reads from an array (a NaN test, a count) is read again on each replay.

def _mean_forward(ad, axes, keepdim, count, out):
    np.sum(ad, axis=axes, keepdims=keepdim, out=out, dtype=_accumulator(ad, axes))
    with np.errstate(invalid="ignore"):  # over no elements: 0 / 0 = NaN, torch's answer, not an error
        out /= count


def _max_all_grad(ad, out, g, ga):
    # (min's too) Tied maxima share the gradient evenly, as torch's full reduction does; a NaN max
    # sends it to the NaNs, which are what produced that max.
    if np.isnan(out):
        np.isnan(ad, out=ga)
    else:
        np.equal(ad, out, out=ga)
    count = np.count_nonzero(ga)
    ga *= g / count


def _extreme_along(fns, ad, axis, idx, values):
    # argmax / argmin return the first extreme (the first NaN if any), matching torch's index choice.
    reduce, arg = fns
    arg(ad, axis=axis, keepdims=True, out=idx)
    reduce(ad, axis=axis, keepdims=True, out=values)


def _scatter_along(ga, idx, g, axis):
    ga.fill(0)
    np.put_along_axis(ga, idx, g, axis=axis)


def _var_forward(ad, axes, keepdim, count, dof, mu, sq, out):
    np.sum(ad, axis=axes, keepdims=True, out=mu, dtype=mu.dtype)
    with np.errstate(invalid="ignore"):  # over no elements: NaN (var warned about dof <= 0)
        mu /= count
    np.subtract(ad, mu, out=sq)
    np.square(sq, out=sq)
    np.sum(sq, axis=axes, keepdims=keepdim, out=out, dtype=_accumulator(sq, axes))
    with np.errstate(divide="ignore", invalid="ignore"):  # dof <= 0 was warned about by var
        out /= np.maximum(dof, 0)


def _var_grad(ad, mu, g, scale, ga):
    # d var / dx = 2 (x - mean) / dof; (x - mean) is recomputed so forward saves only the mean.
    np.subtract(ad, mu, out=ga)
    ga *= g
    with np.errstate(invalid="ignore"):  # dof <= 0: inf * 0 = nan, as torch
        ga *= scale


def _log_softmax_forward(ad, axis, m, lse, out):
    np.max(ad, axis=axis, keepdims=True, out=m)
    # (x - m) is formed twice rather than keeping a second full-size buffer alive for the step.
    np.subtract(ad, m, out=out)
    with np.errstate(under="ignore"):
        np.exp(out, out=out)
    np.sum(out, axis=axis, keepdims=True, out=lse)
    np.log(lse, out=lse)
    np.subtract(ad, m, out=out)
    out -= lse


def _log_softmax_grad(out, g, axis, s, ga):
    # g - softmax * sum(g), with softmax = exp(log_softmax)
    np.sum(g, axis=axis, keepdims=True, out=s)
    with np.errstate(under="ignore"):
        np.exp(out, out=ga)
        ga *= s
    np.subtract(g, ga, out=ga)
