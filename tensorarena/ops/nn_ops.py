"""Layer-level ops: dropout and layer_norm."""

from __future__ import annotations

import numpy as np

from ..random import get_generator
from ..tensor import Tensor
from ._base import as_dtype, as_tensor, new, new_like

def dropout(a: Tensor, p: float = 0.5, *, training: bool = True, rng: np.random.Generator | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (inverted dropout).

    The keep mask is `u >= p` with `u = rng.random(a.shape, dtype=float32)`: one float32 draw per
    element in C order, whatever `a`'s dtype, so restoring a saved `rng.bit_generator.state`
    reproduces the same mask. Nothing is drawn when the call is an identity (training=False or
    p == 0) or when p == 1 (everything is dropped).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, got p={p}")
    if not training or p == 0.0:
        return a
    ad = a.data
    mask = new_like(ad)  # the scaled keep mask: exactly the gradient of out w.r.t. a
    if p == 1.0:
        mask.fill(0)
    else:
        rng = get_generator(rng)
        uniform = mask if ad.dtype == np.float32 else new(ad.shape, np.float32)
        rng.random(dtype=np.float32, out=uniform)
        np.greater_equal(uniform, np.float32(p), out=mask)
        mask /= ad.dtype.type(1.0 - p)  # torch divides the mask by (1 - p) too
    out = new_like(ad)
    np.multiply(ad, mask, out=out)

    def backward(g):
        ga = new_like(g)
        np.multiply(g, mask, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward)


def layer_norm(a: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing `normalized_shape` dims (biased variance), then scale and shift.

    As torch.nn.functional.layer_norm. Shape: (..., *normalized_shape) -> same; weight and bias
    have shape normalized_shape.
    """
    norm_shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
    ad = a.data
    k = len(norm_shape)
    if k == 0 or ad.ndim < k or ad.shape[ad.ndim - k :] != norm_shape:
        raise ValueError(f"layer_norm: normalized_shape {norm_shape} must equal the trailing dims of the "
                         f"input shape {ad.shape}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != norm_shape:
            raise ValueError(f"layer_norm: {name} shape {tuple(p.shape)} must equal normalized_shape {norm_shape}")
    weight = as_tensor(weight) if weight is not None else None
    bias = as_tensor(bias) if bias is not None else None
    wd = weight.data if weight is not None else None
    bd = bias.data if bias is not None else None
    dtype = np.result_type(ad.dtype, *(x.dtype for x in (wd, bd) if x is not None))

    axes = tuple(range(ad.ndim - k, ad.ndim))  # the normalised dims
    lead = tuple(range(ad.ndim - k))  # the dims weight/bias gradients sum over
    count = 1
    for n in norm_shape:
        count *= n
    stat_shape = ad.shape[: ad.ndim - k] + (1,) * k

    mean = new(stat_shape, dtype)
    np.sum(ad, axis=axes, keepdims=True, out=mean)
    mean /= count
    xhat = new(ad.shape, dtype)  # kept for backward: x - mean, then (x - mean) * rstd
    np.subtract(ad, mean, out=xhat)
    out = new(ad.shape, dtype)
    np.multiply(xhat, xhat, out=out)  # `out` doubles as scratch for the squares
    rstd = new(stat_shape, dtype)
    np.sum(out, axis=axes, keepdims=True, out=rstd)
    rstd /= count
    rstd += dtype.type(eps)
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    xhat *= rstd
    if wd is not None:
        np.multiply(xhat, wd, out=out)
    else:
        np.copyto(out, xhat)
    if bd is not None:
        out += bd

    parents = (a,) + tuple(x for x in (weight, bias) if x is not None)

    def backward(g):
        ga = gw = gb = None
        scratch = new(g.shape, dtype)
        if weight is not None and weight.requires_grad:
            gw = new(norm_shape, dtype)
            np.multiply(g, xhat, out=scratch)
            np.sum(scratch, axis=lead, out=gw)
            gw = as_dtype(gw, wd.dtype)
        if bias is not None and bias.requires_grad:
            gb = new(norm_shape, dtype)
            np.sum(g, axis=lead, out=gb)
            gb = as_dtype(gb, bd.dtype)
        if a.requires_grad:
            # dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w, means over normalised dims
            if wd is not None:
                gwt = new(g.shape, dtype)
                np.multiply(g, wd, out=gwt)
            else:
                gwt = g
            m1 = new(stat_shape, dtype)
            np.sum(gwt, axis=axes, keepdims=True, out=m1)
            m1 /= count
            m2 = new(stat_shape, dtype)
            np.multiply(gwt, xhat, out=scratch)
            np.sum(scratch, axis=axes, keepdims=True, out=m2)
            m2 /= count
            ga = new(ad.shape, ad.dtype)
            np.multiply(xhat, m2, out=scratch)
            np.subtract(gwt, scratch, out=scratch)
            scratch -= m1
            np.multiply(scratch, rstd, out=ga, casting="same_kind")
        result = (ga,)
        if weight is not None:
            result += (gw,)
        if bias is not None:
            result += (gb,)
        return result

    return Tensor._make(out, parents, backward)
