"""LAMB update of one array or of several parameters in one flat buffer: NumPy reference, fused Numba twin.

You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
Algorithm 2 (phi = identity): m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + wd * p;
p -= lr * (||p|| / ||r||) * r, the trust ratio taken per parameter tensor and 1 when either
norm is 0. Because the ratio is per tensor, a flat buffer of several parameters comes with
`segments`, the n+1 offsets delimiting them; None means the whole array is one tensor.

The trust ratio needs the norm of r before any element is updated, so no kernel can do it in
one pass: the fused twin makes two per segment (moments, r and both norms; then the update,
recomputing r from the stored moments rather than keeping an r buffer). Norms accumulate in
float64 in the fused twin; the reference scales by the largest element first, then uses np.dot in the array's
dtype (a plain float32 dot underflows or overflows where the float64 sum does not).
"""

from __future__ import annotations

import math

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register
from .optim_arrays import corrected_rms, flat_views, second_moment_, underflow_is_zero


def _segments(param: np.ndarray, segments: np.ndarray | None) -> np.ndarray:
    if segments is None:
        return np.array([0, param.size], dtype=np.int64)  # convenience for direct calls; optimizers pass their own
    if segments.ndim != 1 or segments.size < 2 or segments[0] != 0 or segments[-1] != param.size:
        raise ValueError(f"lamb: segments must be offsets from 0 to the array's size {param.size}, "
                         f"got {segments.size} values")
    return segments


def _norm_sq(x: np.ndarray, tmp: np.ndarray) -> float:
    """||x||^2 as a Python float, computed as max|x|^2 * ||x / max|x|||^2 (BLAS nrm2's scaling); `tmp` is scratch.

    np.dot(x, x) in float32 underflows to 0 for elements below ~1e-19 (r of a parameter whose moments decayed
    under zero gradients) and overflows above ~1e19, which turned the trust ratio into 1 (or 0) where the fused
    twin, accumulating in float64, gives ||p|| / ||r||. Scaled, the squares stay in [0, 1].
    """
    np.abs(x, out=tmp)
    scale = float(tmp.max(initial=0.0))
    if scale == 0.0 or not math.isfinite(scale):
        return scale  # all zeros: 0; an inf or nan: the same non-finite norm the plain sum would give
    np.divide(x, x.dtype.type(scale), out=tmp)
    return scale * scale * float(np.dot(tmp, tmp))


def _trust(p_norm_sq: float, r_norm_sq: float) -> float:
    return math.sqrt(p_norm_sq) / math.sqrt(r_norm_sq) if p_norm_sq > 0 and r_norm_sq > 0 else 1.0


@underflow_is_zero  # subnormal or 0 is the right result, as torch's and the fused twin's
def lamb_reference(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
                   step: float, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                   maximize: bool = False, segments: np.ndarray | None = None,
                   scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place LAMB step of C-contiguous `param` at (already incremented) step `step` (plain NumPy).

    `scratch` is two arrays shaped like `param` (allocated here when not given); `grad` is
    never modified.
    """
    segments = _segments(param, segments)
    if not param.flags.c_contiguous:
        raise ValueError("lamb: the parameter must be C-contiguous (its segments are flat offsets)")
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    dt = param.dtype.type
    sign = -1.0 if maximize else 1.0
    np.multiply(exp_avg, dt(beta1), out=exp_avg)
    np.multiply(grad, dt(sign * (1 - beta1)), out=a)
    np.add(exp_avg, a, out=exp_avg)
    second_moment_(exp_avg_sq, grad, beta2, a)  # g^2: the maximize sign does not matter
    corrected_rms(exp_avg_sq, beta2, step, eps, b)
    np.divide(exp_avg, dt(1 - beta1**step), out=a)
    np.divide(a, b, out=a)
    if weight_decay != 0:
        np.multiply(param, dt(weight_decay), out=b)
        np.add(a, b, out=a)  # a = r
    p, r, tmp = param.reshape(-1), a.reshape(-1), b.reshape(-1)
    for s in range(segments.size - 1):
        start, end = int(segments[s]), int(segments[s + 1])
        if end < start:
            raise ValueError("lamb: segments must not decrease")
        ps, rs = p[start:end], r[start:end]
        trust = _trust(_norm_sq(ps, tmp[start:end]), _norm_sq(rs, tmp[start:end]))
        factor = lr * trust
        if factor <= float(np.finfo(param.dtype).max):
            np.multiply(rs, dt(factor), out=rs)
        else:  # ||r|| so small that lr * trust passes float32's range: the product in float64, rounded once into
            # rs, as the fused twin's `scale * ri` (NumPy's casting buffer allocates a little: only in this case)
            np.multiply(rs, np.float64(factor), out=rs, dtype=np.float64, casting="same_kind")
        np.subtract(ps, rs, out=ps)


@numba.njit(cache=True, parallel=True, fastmath=False)
def _update(p, g, m, v, seg, beta1, c_beta1, beta2, c_beta2, bc1, bc2, eps, wd, lr):
    for s in range(seg.size - 1):
        start, end = seg[s], seg[s + 1]
        if end < start:
            raise ValueError("lamb: segments must not decrease")
        p_sq = 0.0
        r_sq = 0.0
        for i in numba.prange(start, end):
            gi = g[i]
            mi = m[i] * beta1 + c_beta1 * gi
            vi = v[i] * beta2 + c_beta2 * gi * gi
            m[i] = mi
            v[i] = vi
            ri = mi / bc1 / (np.sqrt(vi / bc2) + eps) + wd * p[i]
            pd = np.float64(p[i])
            rd = np.float64(ri)
            p_sq += pd * pd
            r_sq += rd * rd
        trust = 1.0
        if p_sq > 0.0 and r_sq > 0.0:
            trust = np.sqrt(p_sq) / np.sqrt(r_sq)
        scale = lr * trust  # float64: rounded once, with the product, when p is stored
        for i in numba.prange(start, end):
            ri = m[i] / bc1 / (np.sqrt(v[i] / bc2) + eps) + wd * p[i]  # bit-identical to the first pass
            p[i] = p[i] - scale * ri


def lamb_fused(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
               step: float, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
               maximize: bool = False, segments: np.ndarray | None = None, scratch=None) -> None:
    """Same contract as `lamb_reference`: two parallel passes per segment over C-contiguous arrays (no scratch)."""
    segments = _segments(param, segments)
    p, g, m, v = flat_views("lamb", param, grad, exp_avg, exp_avg_sq)
    dt = param.dtype.type
    sign = -1.0 if maximize else 1.0
    _update(p, g, m, v, segments, dt(beta1), dt(sign * (1 - beta1)), dt(beta2), dt(1 - beta2),
            dt(1 - beta1**step), dt(1 - beta2**step), dt(eps), dt(weight_decay), float(lr))


register("lamb", "reference", lamb_reference)
register("lamb", "fused", lamb_fused)
