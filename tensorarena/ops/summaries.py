"""Reductions and scans beside reduce.py's: logsumexp, amax / amin, norm, prod and cumsum, as torch's.

Tie rules follow torch: amax / amin and the inf-norm split the gradient evenly among the tied extremes; prod's
gradient is the product of the other elements, exact where an element is 0 (no division by it). Integer and
bool inputs to prod and cumsum give int64, with no gradient. All array work runs in tape.host calls.
"""

from __future__ import annotations

import math

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, new, normalize_axes, reshaped
from .reduce import _expand_grad, _reduce_axes, _reduced_shape


def logsumexp(input: Tensor, dim, keepdim: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """log(sum(exp(x))) over `dim`, max-shifted so it never overflows (torch.logsumexp); its gradient is
    softmax(x) * g."""
    ad = input.data
    _need_float(ad, "logsumexp")
    axes = _reduce_axes(dim, ad.ndim)
    out = new(_reduced_shape(ad.shape, axes, keepdim), ad.dtype)
    host(_logsumexp_forward, ad, axes, keepdim, out)

    def backward(g):
        ga = new(ad.shape, ad.dtype)
        host(_logsumexp_grad, ad, _expand_grad(out, ad.shape, axes), _expand_grad(g, ad.shape, axes), ga)
        return (ga,)

    return Tensor._make(out, (input,), backward, saved=(input,), saved_output=True)


def amax(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """Maximum over `dim` (an int, a tuple; () for all), values only; ties share the gradient evenly."""
    return _extreme(input, dim, keepdim, np.max, "amax")


def amin(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """Minimum over `dim` (an int, a tuple; () for all), values only; ties share the gradient evenly."""
    return _extreme(input, dim, keepdim, np.min, "amin")


def _extreme(a: Tensor, dim, keepdim: bool, fn, what: str) -> Tensor:
    ad = a.data
    axes = _reduce_axes(dim, ad.ndim)
    if any(ad.shape[ax] == 0 for ax in axes):
        raise IndexError(f"{what}: reducing over a dimension of size 0 (shape {ad.shape}, dim {dim}) has no "
                         f"{what[1:]}imum; pick a non-empty dimension")
    out = new(_reduced_shape(ad.shape, axes, keepdim), ad.dtype)
    host(fn, ad, axis=axes, keepdims=keepdim, out=out)

    def backward(g):
        ga = new(ad.shape, ad.dtype)
        host(_even_split_grad, ad, _expand_grad(out, ad.shape, axes), _expand_grad(g, ad.shape, axes), axes, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,), saved_output=True)


def norm(input: Tensor, p="fro", dim=None, keepdim: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """The vector p-norm over `dim` (None: all elements), torch.norm: p = 2 or "fro", 1, inf, -inf or any
    positive number. The 2-norm's gradient is 0 where the norm is 0, as torch's."""
    input = as_tensor(input)  # noqa: A001 - an array taken as a tensor (its .data is a memoryview)
    ad = input.data
    _need_float(ad, "norm")
    if p == "fro":
        p = 2.0
    if isinstance(p, str) or not isinstance(p, (int, float, np.integer, np.floating)) or isinstance(p, bool):
        raise ValueError(f"norm: p must be a number or 'fro', got {p!r} (matrix norms such as 'nuc' are not "
                         f"supported)")
    p = float(p)
    if not (p > 0 or math.isinf(p)):
        raise ValueError(f"norm: p must be positive or +-inf, got {p}")
    axes = _reduce_axes(dim, ad.ndim)
    if math.isinf(p) and any(ad.shape[ax] == 0 for ax in axes):
        raise ValueError(f"norm: the {p} norm of an empty slice has no value (max and min have no identity); the "
                         f"tensor's shape is {ad.shape}, reduced over dims {axes}")
    out = new(_reduced_shape(ad.shape, axes, keepdim), ad.dtype)
    host(_norm_forward, ad, p, axes, keepdim, out)

    def backward(g):
        ga = new(ad.shape, ad.dtype)
        host(_norm_grad, ad, p, _expand_grad(out, ad.shape, axes), _expand_grad(g, ad.shape, axes), axes, ga)
        return (ga,)

    return Tensor._make(out, (input,), backward, saved=(input,), saved_output=True)


def prod(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002 - torch's name
    """Product over `dim` (an int, or None for all elements), torch.prod."""
    ad = input.data
    out_dtype = _accumulated_dtype(ad.dtype, dtype)
    if dim is None:
        if keepdim:
            raise TypeError("prod: keepdim needs an int dim; prod over all elements returns a 0-d tensor")
        axis, src, shape = 0, reshaped(ad, (-1,)), ()  # reshaped: a copy, if one is needed, in the arena
    else:
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
            raise TypeError(f"prod: dim must be an int (or None for all elements), got {dim!r}")
        src = ad if ad.ndim else ad.reshape(1)
        (axis,) = normalize_axes(int(dim), src.ndim)
        shape = () if ad.ndim == 0 else _reduced_shape(ad.shape, (axis,), keepdim)
    out = new(shape, out_dtype)
    host(np.prod, src, axis=axis, out=out.reshape(_reduced_shape(src.shape, (axis,), keepdim=False)),
         dtype=out_dtype)
    if out_dtype.kind != "f":
        return Tensor._make(out)

    def backward(g):
        ga = new(src.shape, ad.dtype)  # the input's dtype, also when `dtype` asked for a wider product
        host(_prod_grad, src, axis, g.reshape(_reduced_shape(src.shape, (axis,), True)), ga)
        return (ga.reshape(ad.shape),)

    return Tensor._make(out, (input,), backward, saved=(input,))


def cumsum(input: Tensor, dim: int, *, dtype=None) -> Tensor:  # noqa: A002 - torch's name
    """Running sum along `dim` (torch.cumsum); its gradient is the reversed running sum of g."""
    ad = input.data
    out_dtype = _accumulated_dtype(ad.dtype, dtype)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"cumsum: dim must be an int, got {dim!r}")
    src = ad if ad.ndim else ad.reshape(1)
    (axis,) = normalize_axes(int(dim), src.ndim)
    out = new(ad.shape, out_dtype)
    host(_cumsum, src, axis, out.reshape(src.shape))
    if out_dtype.kind != "f":
        return Tensor._make(out)

    def backward(g):
        ga = new(src.shape, ad.dtype)  # the input's dtype, also when `dtype` asked for a wider sum
        host(_reverse_cumsum, g.reshape(src.shape), axis, ga)
        return (ga.reshape(ad.shape),)

    return Tensor._make(out, (input,), backward)


def _accumulated_dtype(dtype: np.dtype, asked) -> np.dtype:
    """torch's: bool and integer inputs accumulate in int64 unless a dtype is given."""
    if asked is not None:
        return np.dtype(asked)
    return np.dtype(np.int64) if dtype.kind in "biu" else dtype


def _need_float(ad: np.ndarray, what: str) -> None:
    if ad.dtype.kind != "f":
        raise TypeError(f"{what}: the tensor has dtype {ad.dtype}; {what} needs a floating-point tensor: convert "
                        f"it first (t.float())")


# The NumPy work, one function per host call: a captured step replays each with the arrays' new values.

def _logsumexp_forward(ad, axes, keepdim, out) -> None:
    # asarray: on a 0-d tensor np.max gives a NumPy scalar, which the masked write below cannot change
    m = np.asarray(np.max(ad, axis=axes, keepdims=True)) if ad.size else np.zeros(
        _reduced_shape(ad.shape, axes, True), ad.dtype)
    m[~np.isfinite(m)] = 0  # all -inf (or an inf) along a slice: shift by 0 so no inf - inf makes a NaN
    with np.errstate(under="ignore", divide="ignore"):
        s = np.sum(np.exp(ad - m), axis=axes, keepdims=True)
        np.copyto(out, (np.log(s) + m).reshape(out.shape))


def _logsumexp_grad(ad, out, g, ga) -> None:
    with np.errstate(under="ignore", invalid="ignore"):
        np.subtract(ad, out, out=ga)
        np.exp(ga, out=ga)
    ga *= g


def _even_split_grad(ad, out, g, axes, ga) -> None:
    # torch's amax / amin backward: g / (how many elements equal the extreme), to each of them
    np.equal(ad, out, out=ga)
    count = np.sum(ga, axis=axes, keepdims=True)
    with np.errstate(invalid="ignore"):  # a NaN extreme equals nothing: 0 / 0, NaN as torch's
        np.divide(ga, count, out=ga)
    ga *= g


def _norm_forward(ad, p, axes, keepdim, out) -> None:
    a = np.abs(ad)
    if p == math.inf:
        r = np.max(a, axis=axes, keepdims=keepdim, initial=0)
    elif p == -math.inf:
        r = np.min(a, axis=axes, keepdims=keepdim)
    elif p == 1:
        r = np.sum(a, axis=axes, keepdims=keepdim)
    elif p == 2:
        r = np.sqrt(np.sum(a * a, axis=axes, keepdims=keepdim))
    else:
        with np.errstate(under="ignore"):
            r = np.sum(a ** p, axis=axes, keepdims=keepdim) ** (1 / p)
    np.copyto(out, r, casting="same_kind")


def _norm_grad(ad, p, out, g, axes, ga) -> None:
    sign = np.sign(ad)
    if math.isinf(p):  # torch: sign(x) where |x| is the norm, g split evenly among those ties
        hit = np.abs(ad) == out
        count = np.sum(hit, axis=axes, keepdims=True)
        np.multiply(sign, hit, out=ga)
        with np.errstate(invalid="ignore", divide="ignore"):
            ga /= count
    elif p == 1:
        np.copyto(ga, sign)
    elif p == 2:  # x / norm, 0 where the norm is 0 (torch's masked form)
        np.divide(ad, out, out=ga, where=out != 0)
        ga[np.broadcast_to(out == 0, ga.shape)] = 0
    else:  # x |x|^(p-2) / norm^(p-1) = sign(x) |x|^(p-1) / norm^(p-1), 0 where the norm is 0
        with np.errstate(under="ignore", divide="ignore", invalid="ignore"):
            np.multiply(sign, (np.abs(ad) / out) ** (p - 1), out=ga)
        ga[np.broadcast_to(out == 0, ga.shape)] = 0
        ga[ad == 0] = 0  # p < 1: 0 ** (p - 1) is inf, times sign 0; torch's gradient there is 0
    ga *= g


def _prod_grad(src, axis, g, ga) -> None:
    # The product of the others: exclusive running products from the left and from the right, so a zero
    # element is never divided by (torch's prod_safe_zeros_backward gives the same values).
    n = src.shape[axis]
    if n == 0:
        return  # nothing to differentiate
    ones = np.ones(_reduced_shape(src.shape, (axis,), True), src.dtype)
    left = np.cumprod(np.concatenate([ones, np.take(src, range(n - 1), axis=axis)], axis=axis), axis=axis)
    flipped = np.flip(src, axis=axis)
    right = np.flip(np.cumprod(np.concatenate([ones, np.take(flipped, range(n - 1), axis=axis)], axis=axis),
                               axis=axis), axis=axis)
    np.multiply(left, right, out=ga, casting="same_kind")
    np.multiply(ga, g, out=ga, casting="same_kind")


def _cumsum(src, axis, out) -> None:
    # A float32 running sum is carried in float64 and rounded once per element, as torch's CPU cumsum: carried
    # in float32 its error grows with the length (9e-3 after 1e6 standard normals, against torch's 2e-5).
    wide = np.float64 if out.dtype == np.float32 else out.dtype
    if wide == out.dtype:
        np.cumsum(src, axis=axis, dtype=wide, out=out)
    else:
        np.copyto(out, np.cumsum(src, axis=axis, dtype=wide), casting="same_kind")


def _reverse_cumsum(g, axis, ga) -> None:
    wide = np.float64 if ga.dtype == np.float32 else None  # as _cumsum
    np.copyto(ga, np.flip(np.cumsum(np.flip(g, axis=axis), axis=axis, dtype=wide), axis=axis), casting="same_kind")


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:  # noqa: A002
    """input / max(norm(input, p, dim, keepdim), eps) (torch's F.normalize, the same composition, so the same
    gradient)."""
    from .arith import div
    from .clamping import clamp

    return div(input, clamp(norm(input, p, dim, keepdim=True), min=eps))


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps)) over `dim`, torch's F.cosine_similarity (2.x): each norm is
    clamped on its own, and the two inputs are broadcast together first (so a norm is taken of the broadcast
    tensor, as torch's). As torch, the clamp is invisible to the gradient (torch clamps the norms in place under
    no_grad): the gradient flows through each norm as if it were not clamped."""
    from .arith import div, mul
    from .cast import float_input
    from .reduce import sum as total
    from .shape import expand

    x1, x2 = float_input(x1), float_input(x2)
    try:
        shape = np.broadcast_shapes(x1.shape, x2.shape)
    except ValueError:
        raise ValueError(f"cosine_similarity: x1 of shape {x1.shape} and x2 of shape {x2.shape} do not "
                         f"broadcast") from None
    x1, x2 = (x if x.shape == shape else expand(x, shape) for x in (x1, x2))
    n1 = _clamped_value_only(norm(x1, 2, dim, keepdim=True), eps)
    n2 = _clamped_value_only(norm(x2, 2, dim, keepdim=True), eps)
    return total(mul(div(x1, n1), div(x2, n2)), dim)


def _clamped_value_only(t: Tensor, low: float) -> Tensor:
    """max(t, low) in value, while the gradient passes through unchanged (torch's in-place clamp under no_grad)."""
    td = t.data
    out = new(td.shape, td.dtype)
    host(np.maximum, td, td.dtype.type(low), out=out)

    def backward(g):
        return (g,)

    return Tensor._make(out, (t,), backward)
