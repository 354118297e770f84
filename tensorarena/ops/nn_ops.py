"""Layer-level ops: dropout and layer_norm (on the layer_norm kernels)."""

from __future__ import annotations

import math

import numpy as np

from ..kernels import kernel
from ..random import Seed
from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, contiguous, grad_out, leaf_or_none, new, new_like
from .linalg import _check_float_pair


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *,
            rng: np.random.Generator | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (inverted dropout).

    The mask is a hash of (seed, element index in C order) with seed =
    `rng.integers(0, 2**64, dtype=np.uint64)`, one draw per call whatever `a`'s shape or dtype
    (kernels/dropout.py: `keep_mask_reference(seed, a.size, keep_threshold(p))` says which elements
    are kept). Restoring a saved `rng.bit_generator.state` reproduces the same mask, and backward
    recomputes it from the seed, so no mask array is kept. Nothing is drawn when the call is an
    identity (training=False or p == 0) or when p == 1 (everything is dropped).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, got p={p}")
    if inplace:  # torch's argument; the ops here never write their input, and an ignored result would not drop
        raise ValueError("dropout: inplace=True is not supported (ops here return a new tensor); write "
                         "x = F.dropout(x, p) instead")
    input = as_tensor(input)  # a NumPy array too, as Linear takes one
    if not training or p == 0.0:
        return input
    if input.dtype.kind != "f":  # 1 / (1 - p) in an integer dtype: garbage or 0 / 0 (torch refuses it too)
        raise TypeError(f"dropout: the input must be floating point to be scaled by 1 / (1 - p), got dtype "
                        f"{input.dtype}; cast it first (e.g. x.float())")
    from ..kernels.dropout import keep_threshold  # here, not at import: it loads Numba

    ad = contiguous(input.data)  # the mask follows C order: a strided view is copied first
    dtype = ad.dtype
    if p == 1.0:
        out = new_like(ad)
        host(_times_zero, ad, out)  # not fill(0): a NaN or inf comes out NaN, as torch's input * 0
        seed, threshold, scale = None, 0, 0.0  # unused: backward multiplies by 0 too
    else:
        seed = Seed(rng)
        threshold = keep_threshold(p)
        scale = dtype.type(1.0) / dtype.type(1.0 - p)  # torch divides by (1 - p) in the input's dtype too
        out = new_like(ad)
        host(_apply, kernel("dropout_apply"), ad, out, seed, threshold, scale)

    def backward(g):
        ga = new_like(g)
        if p == 1.0:
            host(_times_zero, g, ga)
        else:
            host(_apply, kernel("dropout_apply"), contiguous(g, dtype), ga, seed, threshold, scale)
        return (ga,)

    return Tensor._make(out, (input,), backward)


def _times_zero(x: np.ndarray, out: np.ndarray) -> None:
    # dropout(p=1): torch's input * 0 (aten Dropout.cpp), so NaN and inf give NaN and finite values 0
    with np.errstate(invalid="ignore"):  # inf * 0 = NaN is the answer, as in the dropout kernels
        np.multiply(x, out.dtype.type(0), out=out)


def _apply(dropout_apply, x: np.ndarray, out: np.ndarray, seed: Seed, threshold: int, scale) -> None:
    # One recorded call that reads the seed when it runs: a captured replay uses each step's new draw.
    dropout_apply(x, out, seed.value, threshold, scale)


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing `normalized_shape` dims (biased variance), then scale and shift.

    As torch.nn.functional.layer_norm. Shape: (..., *normalized_shape) -> same; weight and bias
    have shape normalized_shape. Runs the layer_norm kernels on the input viewed as (N, D),
    D = prod(normalized_shape).
    """
    norm_shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
    input = as_tensor(input)  # a NumPy array too, as Linear takes one
    ad = input.data
    if ad.dtype.kind != "f":  # the mean and variance would be truncated to the integer dtype (torch refuses it)
        raise TypeError(f"layer_norm: the input must be floating point, got dtype {ad.dtype}; cast it first "
                        f"(e.g. x.float())")
    k = len(norm_shape)
    if k == 0 or ad.ndim < k or ad.shape[ad.ndim - k :] != norm_shape:
        raise ValueError(f"layer_norm: normalized_shape {norm_shape} must equal the trailing dims of the "
                         f"input shape {ad.shape}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != norm_shape:
            raise ValueError(f"layer_norm: {name} shape {tuple(p.shape)} must equal normalized_shape {norm_shape}")
    weight = as_tensor(weight) if weight is not None else None
    bias = as_tensor(bias) if bias is not None else None
    for name, p in (("the weight", weight), ("the bias", bias)):
        if p is not None:  # as torch and linear: a float32 batch through a float64 norm would silently widen
            _check_float_pair(input, p, "layer_norm", "the input", name)
    wd = weight.data if weight is not None else None
    bd = bias.data if bias is not None else None
    dtype = np.result_type(ad.dtype, *(x.dtype for x in (wd, bd) if x is not None))

    d = math.prod(norm_shape)
    n = math.prod(ad.shape[: ad.ndim - k])
    x2 = contiguous(ad).reshape(n, d)  # (N, D)
    w2 = contiguous(wd).reshape(d) if wd is not None else None  # (D,)
    b2 = contiguous(bd).reshape(d) if bd is not None else None
    out = new(ad.shape, dtype)
    # Row statistics in float64 whatever the input: N numbers, and backward re-derives xhat from them.
    mean, rstd = new((n,), np.float64), new((n,), np.float64)
    kernel("layer_norm_forward")(x2, w2, b2, float(eps), out.reshape(n, d), mean, rstd)

    parents = (input,) + tuple(x for x in (weight, bias) if x is not None)
    # Backward reads x2 (a view of `a`, or its contiguous copy) and the statistics; of the tensors
    # themselves it keeps metadata and leaves only, so a copied `a` is not held alive.
    a_shape, a_dtype, a_needs_grad = ad.shape, ad.dtype, input.requires_grad
    # (leaf or None, dtype) for a weight/bias that needs a gradient, else None.
    w_grad = (leaf_or_none(weight), wd.dtype) if weight is not None and weight.requires_grad else None
    b_grad = (leaf_or_none(bias), bd.dtype) if bias is not None and bias.requires_grad else None
    has_weight, has_bias = weight is not None, bias is not None
    del ad, bd

    def backward(g):
        g2 = contiguous(g).reshape(n, d)
        # dx is always computed by the kernel; when `a` needs no grad it is scratch.
        ga = new(a_shape, a_dtype)
        gw = grad_out(w_grad[0], norm_shape, w_grad[1]) if w_grad is not None else None
        gb = grad_out(b_grad[0], norm_shape, b_grad[1]) if b_grad is not None else None
        kernel("layer_norm_backward")(g2, x2, w2, mean, rstd, ga.reshape(n, d),
                                      gw.reshape(d) if gw is not None else None,
                                      gb.reshape(d) if gb is not None else None)
        result = (ga if a_needs_grad else None,)
        if has_weight:
            result += (gw,)
        if has_bias:
            result += (gb,)
        return result

    # Backward reads x2 (a or its copy) and the weight; the bias counts too, as torch saves all three.
    return Tensor._make(out, parents, backward, saved=parents)
