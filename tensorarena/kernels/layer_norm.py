"""Layer normalisation over the last dim of an (N, D) array: a NumPy reference and a fused Numba twin.

Forward (torch.nn.functional.layer_norm semantics, biased variance):
mean = x.mean(-1), rstd = 1 / sqrt(var(x) + eps), y = (x - mean) * rstd * weight + bias.
Backward, with xhat = (x - mean) * rstd and gw = g * weight:
dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), dweight = sum_rows(g * xhat), dbias = sum_rows(g).
Both twins do the row statistics and the per-element arithmetic in float64 and round once into
the caller's arrays, so float32 results are as accurate as the format allows. The fused twin makes
three passes over each (cache-resident) row instead of ~10 NumPy passes over the whole array, and
reduces dweight/dbias into one partial row per chunk of rows, so no two threads write one slot.
"""

from __future__ import annotations

import math

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register

# Results that underflow to (sub)normal zero are right, not errors: keep np.seterr(under="raise")
# callers (the tests) from tripping over them in the NumPy parts.
_quiet_underflow = np.errstate(under="ignore")


@_quiet_underflow
def layer_norm_forward_reference(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float,
                                 out: np.ndarray, mean: np.ndarray, rstd: np.ndarray) -> None:
    """Normalise each row of x (N, D) into `out`; save mean and rstd (N,) for backward (plain NumPy)."""
    d = x.shape[1]
    mu = x.sum(axis=1, dtype=np.float64) / d  # (N,)
    xc = x - mu[:, None]  # float64, (N, D)
    rs = 1.0 / np.sqrt((xc * xc).sum(axis=1) / d + eps)
    mean[...] = mu
    rstd[...] = rs
    y = xc * rs[:, None]
    if weight is not None:
        y *= weight
    if bias is not None:
        y += bias
    np.copyto(out, y, casting="same_kind")


@_quiet_underflow
def layer_norm_backward_reference(g: np.ndarray, x: np.ndarray, weight: np.ndarray | None, mean: np.ndarray,
                                  rstd: np.ndarray, dx: np.ndarray, dweight: np.ndarray | None,
                                  dbias: np.ndarray | None) -> None:
    """Gradients of layer_norm_forward w.r.t. x, weight and bias from the saved mean/rstd (plain NumPy)."""
    d = x.shape[1]
    rs = rstd.astype(np.float64)[:, None]
    xhat = (x - mean.astype(np.float64)[:, None]) * rs  # (N, D) float64
    gw = g.astype(np.float64)
    if weight is not None:
        gw = gw * weight
    m1 = gw.sum(axis=1, keepdims=True) / d
    m2 = (gw * xhat).sum(axis=1, keepdims=True) / d
    np.copyto(dx, rs * (gw - m1 - xhat * m2), casting="same_kind")
    if dweight is not None:
        np.copyto(dweight, (g * xhat).sum(axis=0), casting="same_kind")
    if dbias is not None:
        np.copyto(dbias, g.sum(axis=0, dtype=np.float64), casting="same_kind")


# "reassoc" lets LLVM split the float64 row sums into packed partial sums (4x faster backward,
# measured: 1.48 -> 0.39 ms on a (1576, 192) float32 row block, one thread); the sums stay in
# float64, so only their last bits move. No other licence: nnan/ninf would let NaN inputs vanish.
_JIT = dict(cache=True, parallel=True, error_model="numpy", fastmath={"reassoc", "contract"})


@numba.njit(**_JIT)
def _forward(x, w, b, eps, out, mean, rstd):
    # An absent weight or bias arrives as ones / zeros (exact): no branch inside the row loops.
    n, d = x.shape
    for r in numba.prange(n):
        s = 0.0
        for j in range(d):
            s += x[r, j]
        mu = s / d
        ss = 0.0
        for j in range(d):  # two passes: the one-pass E[x^2] - E[x]^2 cancels badly
            c = x[r, j] - mu
            ss += c * c
        rs = 1.0 / math.sqrt(ss / d + eps)
        mean[r] = mu
        rstd[r] = rs
        for j in range(d):
            out[r, j] = (x[r, j] - mu) * rs * w[j] + b[j]


@numba.njit(**_JIT)
def _backward(g, x, w, mean, rstd, dx, part_w, part_b, nchunks):
    n, d = x.shape
    for c in numba.prange(nchunks):
        c64 = np.int64(c)  # prange's index is unsigned: keep the row arithmetic in int64
        pw = part_w[c]
        pb = part_b[c]
        for r in range(c64 * n // nchunks, (c64 + 1) * n // nchunks):
            mu = np.float64(mean[r])
            rs = np.float64(rstd[r])
            s1 = 0.0
            s2 = 0.0
            for j in range(d):
                xh = (x[r, j] - mu) * rs
                gj = np.float64(g[r, j])
                gw = gj * w[j]
                s1 += gw
                s2 += gw * xh
                pw[j] += gj * xh
                pb[j] += gj
            m1 = s1 / d
            m2 = s2 / d
            for j in range(d):
                xh = (x[r, j] - mu) * rs
                dx[r, j] = rs * (g[r, j] * np.float64(w[j]) - m1 - xh * m2)


def _filler(a: np.ndarray | None, d: int, value: float, dtype) -> np.ndarray:
    # Stands in for an absent weight (ones) or bias (zeros): the same arithmetic, exact, one signature.
    return a if a is not None else np.full(d, value, dtype)


def layer_norm_forward_fused(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float,
                             out: np.ndarray, mean: np.ndarray, rstd: np.ndarray) -> None:
    """Same contract as `layer_norm_forward_reference`, one parallel pass per row."""
    d = x.shape[1]
    _forward(x, _filler(weight, d, 1.0, x.dtype), _filler(bias, d, 0.0, x.dtype), float(eps), out, mean, rstd)


@_quiet_underflow
def layer_norm_backward_fused(g: np.ndarray, x: np.ndarray, weight: np.ndarray | None, mean: np.ndarray,
                              rstd: np.ndarray, dx: np.ndarray, dweight: np.ndarray | None,
                              dbias: np.ndarray | None) -> None:
    """Same contract as `layer_norm_backward_reference`; dweight/dbias via per-chunk partial rows."""
    n, d = x.shape
    nchunks = max(1, min(n, numba.get_num_threads()))
    # (chunks, D) float64 partial sums: one row per thread, not an (N, D) temporary. Both are
    # always summed (two adds per element) so the loop has no branch.
    part_w = np.zeros((nchunks, d))
    part_b = np.zeros((nchunks, d))
    _backward(g, x, _filler(weight, d, 1.0, x.dtype), mean, rstd, dx, part_w, part_b, nchunks)
    if dweight is not None:
        np.copyto(dweight, part_w.sum(axis=0), casting="same_kind")
    if dbias is not None:
        np.copyto(dbias, part_b.sum(axis=0), casting="same_kind")


register("layer_norm_forward", "reference", layer_norm_forward_reference)
register("layer_norm_forward", "fused", layer_norm_forward_fused)
register("layer_norm_backward", "reference", layer_norm_backward_reference)
register("layer_norm_backward", "fused", layer_norm_backward_fused)
