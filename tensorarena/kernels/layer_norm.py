"""Layer normalisation over the last dim of an (N, D) array: a NumPy reference and a fused Numba twin.

Forward (torch.nn.functional.layer_norm semantics, biased variance):
mean = x.mean(-1), rstd = 1 / sqrt(var(x) + eps), y = (x - mean) * rstd * weight + bias.
Backward, with xhat = (x - mean) * rstd and gw = g * weight:
dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), dweight = sum_rows(g * xhat), dbias = sum_rows(g).
The reference twin does everything in float64 and rounds once into the caller's arrays; so does
the fused forward. The fused backward computes in dx's precision, guarded where float32 would lose
digits (see `_backward`): it stays within a few float32 ulps of the reference. The fused twin makes
three passes over each (cache-resident) row instead of ~10 NumPy passes over the whole array, and
reduces dweight/dbias into one partial row per chunk of rows, so no two threads write one slot.
Those rows, and the stand-ins for an absent weight or bias, come from the step's arena
(elementwise_fused.partial_rows, memory.arena.empty): a fused step plans them into its slab.
"""

from __future__ import annotations

import math

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
del _cpu  # imported for that side effect only
import numba
import numpy as np

from ..memory.arena import empty
from . import fastmath as fm
from . import register
from .elementwise_fused import partial_rows, sum_partials

# Results that underflow to (sub)normal zero are right, not errors: keep np.seterr(under="raise")
# callers (the tests) from tripping over them in the NumPy parts.
_quiet_underflow = np.errstate(under="ignore")


@_quiet_underflow
def layer_norm_forward_reference(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float,
                                 out: np.ndarray, mean: np.ndarray, rstd: np.ndarray) -> None:
    """Normalise each row of x (N, D) into `out`; save mean and rstd (N,) for backward (plain NumPy)."""
    d = x.shape[1]
    if d == 0:  # no features: an empty output (torch's) and NaN statistics (0 / 0), as the fused twin's
        mean.fill(np.nan)
        rstd.fill(np.nan)
        return
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
    """Gradients of layer_norm_forward w.r.t. x, weight and bias from the saved mean/rstd (plain NumPy); dx may be g."""
    d = x.shape[1]
    if d == 0:  # dx, dweight and dbias are all empty: nothing to write (the row means below would be 0 / 0)
        return
    rs = rstd.astype(np.float64)[:, None]
    xhat = (x - mean.astype(np.float64)[:, None]) * rs  # (N, D) float64
    gw = g.astype(np.float64)
    if weight is not None:
        gw = gw * weight
    m1 = gw.sum(axis=1, keepdims=True) / d
    m2 = (gw * xhat).sum(axis=1, keepdims=True) / d
    # dweight and dbias first: dx may be g itself (in place), and they read g
    if dweight is not None:
        np.copyto(dweight, (g * xhat).sum(axis=0), casting="same_kind")
    if dbias is not None:
        np.copyto(dbias, g.sum(axis=0, dtype=np.float64), casting="same_kind")
    np.copyto(dx, rs * (gw - m1 - xhat * m2), casting="same_kind")


# The forward's: "reassoc" lets LLVM split the float64 row sums into packed partial sums; the sums
# stay in float64, so only their last bits move. No other licence: nnan/ninf would let NaN inputs vanish.
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


# The backward runs in dx's precision (float32 for float32 x and weight): its float64 version spent
# ~4 cycles per element converting (0.35 ms on a (1576, 192) float32 block, 2 threads; this one 0.12 ms, PyTorch's
# 0.24 ms). What keeps it accurate: x - mean is taken against mean split into x-precision high and low
# parts (exact where it matters, when |mean| >> std), the row sums are fastmath.radd partial sums,
# and dweight/dbias add _FLUSH_ROWS rows in that precision before each goes into a float64 partial row.
# No fastmath licence beyond radd's: "reassoc" on every add would let LLVM fold (x - hi) - lo back
# into x - (hi + lo), and "contract" would fuse g * w - mean(g * w) into one FMA whose unrounded
# product leaves a rounding residual where the exact answer is 0 (D = 1: dx = rstd * residual).
_FLUSH_ROWS = 32


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _backward(g, x, w, mean, rstd, dx, part, acc, flush_rows):
    # Arithmetic in dx's precision: x's, unless a float64 weight made the result float64.
    # part (2, chunks, D) float64: each chunk's dweight (0) and dbias (1) sums; acc (chunks, 2, >= D)
    # in dx's dtype: the rows added since the last flush. Both the caller's scratch, zeroed here (an
    # np.zeros per chunk would be Numba's heap, outside a fused step's plan).
    n, d = x.shape
    nchunks = part.shape[1]
    for c in numba.prange(nchunks):
        c64 = np.int64(c)  # prange's index is unsigned: keep the row arithmetic in int64
        pw = part[0, c]
        pb = part[1, c]
        acc_w = acc[c, 0]
        acc_b = acc[c, 1]
        pw[:] = 0.0
        pb[:] = 0.0
        acc_w[:] = 0
        acc_b[:] = 0
        r0, r1 = c64 * n // nchunks, (c64 + 1) * n // nchunks
        for r in range(r0, r1):
            xr, gr, dxr = x[r], g[r], dx[r]
            t = dxr[0]  # only its type matters below
            mu_hi = fm.like(t, mean[r])
            mu_lo = fm.like(t, mean[r] - mu_hi)
            rs = fm.like(t, rstd[r])
            s1 = fm.like(t, 0.0)
            s2 = fm.like(t, 0.0)
            for j in range(d):
                gw = fm.like(t, gr[j]) * fm.like(t, w[j])
                s1 = fm.radd(s1, gw)
                s2 = fm.radd(s2, gw * (((fm.like(t, xr[j]) - mu_hi) - mu_lo) * rs))
            m1 = s1 / fm.like(t, d)
            m2 = s2 / fm.like(t, d)
            for j in range(d):
                xh = ((fm.like(t, xr[j]) - mu_hi) - mu_lo) * rs
                gj = fm.like(t, gr[j])
                acc_w[j] += gj * xh
                acc_b[j] += gj
                dxr[j] = rs * (gj * fm.like(t, w[j]) - m1 - xh * m2)
            if (r - r0 + 1) % flush_rows == 0 or r == r1 - 1:
                for j in range(d):
                    pw[j] += acc_w[j]
                    pb[j] += acc_b[j]
                    acc_w[j] = 0
                    acc_b[j] = 0


def _flush_rows(nchunks: int, d: int, dtype) -> np.ndarray:
    """_backward's acc: (chunks, 2, D rounded up to a cache line) in dx's dtype, from the arena. Each
    chunk's two rows are written on every row of x: padded so that no two threads write one cache line,
    whatever D (heap rows without the padding, 16-byte aligned, measured up to 35% slower on 2 threads)."""
    per_line = max(1, 64 // np.dtype(dtype).itemsize)
    return empty((nchunks, 2, -(-d // per_line) * per_line), dtype)


def _filler(a: np.ndarray | None, d: int, value: float, dtype) -> np.ndarray:
    # Stands in for an absent weight (ones) or bias (zeros): the same arithmetic, exact, one signature.
    # From the arena, as the partial rows: np.full was a heap array every call of a fused step.
    if a is not None:
        return a
    filler = empty((d,), dtype)
    filler.fill(value)
    return filler


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
    # (chunks, D) float64 partial sums: one row per thread, not an (N, D) temporary. Both are
    # always summed (two adds per element) so the loop has no branch.
    part = partial_rows(n, d, planes=2)
    acc = _flush_rows(part.shape[1], d, dx.dtype)
    _backward(g, x, _filler(weight, d, 1.0, x.dtype), mean, rstd, dx, part, acc, _FLUSH_ROWS)
    if dweight is not None:
        sum_partials(part[0], dweight)
    if dbias is not None:
        sum_partials(part[1], dbias)


register("layer_norm_forward", "reference", layer_norm_forward_reference)
register("layer_norm_forward", "fused", layer_norm_forward_fused)
register("layer_norm_backward", "reference", layer_norm_backward_reference)
register("layer_norm_backward", "fused", layer_norm_backward_fused)
