"""Softmax over the last dim, with an optional additive mask: a NumPy reference and a fused Numba twin.

Forward: out = exp(z - max(z)) / sum(exp(z - max(z))) with z = x + mask, where `mask` is None or
an additive float array broadcastable to x (e.g. (B, 1, 1, T) holding 0 and -inf, or a large
negative number, at padded keys). A row whose every z is -inf (fully masked) comes out as
zeros rather than torch's NaNs: a padded query then contributes nothing downstream and its
gradient is zero, instead of poisoning the whole batch. Backward: dx = y * (g - sum(g * y)).
The reference computes in float64 per element and rounds once into `out`. The fused twin forms
z - max(z) in float64 too (rounded once into out's precision), then takes kernels.fastmath's
vectorisable exp and the row sum in out's precision: float32 arithmetic for float32 arrays,
within ~1e-6 relative of the reference. It never materialises the broadcast mask: it maps each
row to its mask offset from the mask's strides.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
del _cpu  # imported for that side effect only
import numba
import numpy as np

from . import fastmath as fm
from . import register

# Results that underflow to (sub)normal zero are right, not errors: keep np.seterr(under="raise")
# callers (the tests) from tripping over them in the NumPy parts.
_quiet_underflow = np.errstate(under="ignore")


def _check_mask(x: np.ndarray, mask: np.ndarray | None) -> None:
    if mask is None:
        return
    if mask.dtype.kind != "f":
        raise TypeError(f"softmax mask must be an additive float array (0 / -inf), got dtype {mask.dtype}; "
                        f"turn a boolean 'pad' mask into np.where(pad, -np.inf, 0.0) first")
    try:
        shape = np.broadcast_shapes(mask.shape, x.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise ValueError(f"softmax mask of shape {mask.shape} does not broadcast to the input shape {x.shape}")


@_quiet_underflow
def softmax_forward_reference(x: np.ndarray, mask: np.ndarray | None, out: np.ndarray) -> None:
    """Softmax of x (+ mask) over the last dim into `out`; fully masked rows give zeros (plain NumPy)."""
    _check_mask(x, mask)
    if x.size == 0:
        return
    z = x.astype(np.float64)
    if mask is not None:
        z += mask
    mx = z.max(axis=-1, keepdims=True)
    mx[np.isneginf(mx)] = 0.0  # fully masked row: exp(-inf - 0) = 0 everywhere, no -inf - -inf
    with np.errstate(under="ignore"):  # exp of a very negative number is 0, not an error
        e = np.exp(z - mx)
    s = e.sum(axis=-1, keepdims=True)
    # Zero only a fully masked row (sum 0); a NaN sum (a +inf or NaN logit) makes the whole row NaN, as torch's
    inv = np.divide(1.0, s, out=np.zeros_like(s), where=s != 0)
    np.copyto(out, e * inv, casting="same_kind")


@_quiet_underflow
def softmax_backward_reference(y: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """Gradient of softmax w.r.t. its input, from its output y and upstream g (plain NumPy)."""
    y64 = y.astype(np.float64)
    dot = (g * y64).sum(axis=-1, keepdims=True)
    np.copyto(out, y64 * (g - dot), casting="same_kind")


# FMA contraction is the only fast-math licence the fused loops take; sums reassociate (so that
# they vectorise) through fastmath.radd, on their own additions only, where it cannot reach the
# exp's Cody-Waite reduction. error_model="numpy" drops the ZeroDivisionError check that would
# stop vectorisation.
_JIT = dict(cache=True, error_model="numpy", fastmath={"contract"})


@numba.njit(inline="always")
def _rowdot(a, b):
    # sum(a * b) in float64, vectorised (radd lets LLVM keep partial sums)
    s = 0.0
    for j in range(a.shape[0]):
        s = fm.radd(s, np.float64(a[j]) * b[j])
    return s


@numba.njit(inline="always")
def _rowmax(a):
    mx = a[0]
    for j in range(1, a.shape[0]):
        mx = fm.fmax(mx, a[j])  # NaN wins, as in np.max
    return mx


@numba.njit(cache=True, error_model="numpy", fastmath={"contract"})
def _exp_normalise(src, row, mx):
    # row = exp(src - mx) / sum(exp(src - mx)) in row's precision (src and row distinct). Functions
    # of their own, not inlined: Numba's inliner trips over fastmath.exp inlined at two call sites.
    s = fm.like(row[0], 0.0)
    for j in range(row.shape[0]):
        e = fm.like(row[0], fm.exp(src[j] - mx))  # a no-op conversion unless src and row differ in dtype
        row[j] = e
        s = fm.radd(s, e)  # partial sums in row's precision keep the loop 8 float32 lanes wide
    _scale_by_inverse(row, s)


@numba.njit(cache=True, error_model="numpy", fastmath={"contract"})
def _exp_fma_normalise(row, mul, shift):
    # row = exp(row * mul + shift) / its sum, the argument rounded once (fma); mul and shift in row's
    # dtype. One array, so no aliasing check sends LLVM to the scalar loop. mul = 1 and shift = -max
    # is x - max(x) rounded once, as a separate subtraction pass would round it.
    s = fm.like(row[0], 0.0)
    for j in range(row.shape[0]):
        e = fm.exp(row[j] * mul + shift)
        row[j] = e
        s = fm.radd(s, e)
    _scale_by_inverse(row, s)


@numba.njit(inline="always")
def _scale_by_inverse(row, s):
    # fully masked (s == 0): zeros; a NaN sum (a +inf or NaN logit) makes the whole row NaN, as in torch
    inv = fm.like(row[0], 1.0) / s if s != 0 else fm.like(row[0], 0.0)
    for j in range(row.shape[0]):
        row[j] = row[j] * inv


_BLOCK = 2048  # elements per block of rows: one float64 scratch row per block


@numba.njit(parallel=True, **_JIT)
def _forward(x, m, has_mask, lead_shape, lead_stride, last_stride, out, rows_per_block):
    n, d = x.shape
    nlead = lead_shape.shape[0]
    nblocks = (n + rows_per_block - 1) // rows_per_block
    for blk in numba.prange(nblocks):
        r0 = np.int64(blk) * rows_per_block  # prange's index is unsigned: keep the arithmetic in int64
        r1 = min(n, r0 + rows_per_block)
        z = np.empty(d)  # float64 z = x + mask, as the reference; out's precision starts at z - max(z)
        for r in range(r0, r1):
            xr, row = x[r], out[r]  # row may be xr itself (in place)
            if not has_mask:
                mx = _rowmax(xr)
                if mx == -np.inf:  # fully masked row: exp(-inf - 0) = 0 everywhere (as the reference)
                    mx = fm.like(mx, 0.0)
                if row is xr:  # identity, not equality: in place
                    _exp_fma_normalise(row, fm.like(mx, 1.0), -mx)
                else:
                    _exp_normalise(xr, row, mx)  # float32 x - mx is the float64 difference rounded once
                continue
            off = np.int64(0)
            rem = r
            for k in range(nlead - 1, -1, -1):  # row index -> multi-index -> offset into the mask
                off += (rem % lead_shape[k]) * lead_stride[k]
                rem //= lead_shape[k]
            if last_stride == 1:
                mr = m[off:off + d]  # a view indexed from 0: m[off + j] would make LLVM gather
                for j in range(d):
                    z[j] = np.float64(xr[j]) + mr[j]
            elif last_stride == 0:
                mj = np.float64(m[off])
                for j in range(d):
                    z[j] = xr[j] + mj
            else:
                for j in range(d):
                    z[j] = np.float64(xr[j]) + m[off + j * last_stride]
            mz = _rowmax(z)
            if mz == -np.inf:
                mz = 0.0
            for j in range(d):
                row[j] = z[j] - mz  # the float64 difference, rounded once into row's precision
            _exp_fma_normalise(row, fm.like(row[0], 1.0), fm.like(row[0], 0.0))


@numba.njit(parallel=True, **_JIT)
def _backward(y, g, out):
    n, d = y.shape
    for r in numba.prange(n):
        dot = _rowdot(g[r], y[r])  # float64
        for j in range(d):
            out[r, j] = y[r, j] * (g[r, j] - dot)


def rows_in(a: np.ndarray, d: int) -> np.ndarray:
    """`a` as C-contiguous (rows, d): a view when it is contiguous, else a copy."""
    return np.ascontiguousarray(a).reshape(-1, d)


def rows_out(a: np.ndarray, d: int) -> np.ndarray:
    """A C-contiguous (rows, d) array to write `a` through: a view, or scratch for `copy_back`."""
    return a.reshape(-1, d) if a.flags.c_contiguous else np.empty((a.size // max(d, 1), d), a.dtype)


def copy_back(a: np.ndarray, rows: np.ndarray) -> None:
    """Copy scratch from `rows_out` into `a` (nothing to do when `rows` already is a view of it)."""
    if not a.flags.c_contiguous:
        np.copyto(a, rows.reshape(a.shape))


def _mask_layout(x: np.ndarray, mask: np.ndarray):
    """The mask flattened, plus per-leading-dim element strides that broadcast it over x's rows."""
    m = np.ascontiguousarray(mask)  # mask-sized; the broadcast (x-sized) mask is never formed
    if m.dtype not in (np.float32, np.float64):  # Numba has no float16 or longdouble: float64, as the reference adds
        m = m.astype(np.float64)
    shape = (1,) * (x.ndim - m.ndim) + m.shape
    contiguous = np.cumprod((1,) + shape[:0:-1])[::-1]  # C strides in elements
    strides = np.where(np.array(shape) == 1, 0, contiguous).astype(np.int64)
    return m.reshape(-1), np.array(x.shape[:-1], np.int64), strides[:-1].copy(), np.int64(strides[-1])


def softmax_forward_fused(x: np.ndarray, mask: np.ndarray | None, out: np.ndarray) -> None:
    """Same contract as `softmax_forward_reference`, one parallel pass per row."""
    _check_mask(x, mask)
    if x.size == 0:
        return
    d = x.shape[-1]
    if mask is None:  # a stand-in of x's dtype keeps one compiled signature per dtype
        no_dims = np.zeros(0, np.int64)
        m, lead_shape, lead_stride, last_stride = np.zeros(1, x.dtype), no_dims, no_dims, np.int64(0)
    else:
        m, lead_shape, lead_stride, last_stride = _mask_layout(x, mask)
    o = rows_out(out, d)
    _forward(rows_in(x, d), m, mask is not None, lead_shape, lead_stride, last_stride, o,
             max(1, min(_BLOCK // max(d, 1), -(-o.shape[0] // numba.get_num_threads()))))
    copy_back(out, o)


def softmax_backward_fused(y: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """Same contract as `softmax_backward_reference`, one parallel pass per row."""
    if y.size == 0:
        return
    d = y.shape[-1]
    o = rows_out(out, d)
    _backward(rows_in(y, d), rows_in(g, d), o)
    copy_back(out, o)


register("softmax_forward", "reference", softmax_forward_reference)
register("softmax_forward", "fused", softmax_forward_fused)
register("softmax_backward", "reference", softmax_backward_reference)
register("softmax_backward", "fused", softmax_backward_fused)
