"""GELU and bias+GELU, forward and backward: NumPy references and fused Numba twins.

approximate="none" (exact): gelu(x) = x * Phi(x) = x * 0.5 * (1 + erf(x / sqrt(2))),
gelu'(x) = Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi).
approximate="tanh" (Hendrycks & Gimpel 2016): u = sqrt(2/pi) * (x + 0.044715 x^3),
gelu(x) = 0.5 x (1 + tanh u), gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
Both as torch.nn.functional.gelu, whose float64 derivative is NaN at +-inf in both forms (x times a
factor that is 0 there): so are the twins'. The twins evaluate the tanh form through the exact identity
0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) = s, so gelu = x s and 1 - tanh^2 u = 4 s (1 - s): one exp
instead of a tanh and no cancellation in 1 + tanh u for negative x. The bias variants fuse the
Linear's bias add into the activation (pre = x + bias is saved for backward) and reduce dbias
alongside dx, so an MLP block's activation costs one pass over memory each way.
bias_gelu_forward_with_grad writes the activation and the derivative gelu'(x + bias) instead, from
one erf, for ops.bias_gelu_linear to keep: its backward, bias_gelu_backward_stored, is then a product
and a column sum with no erf (one (N, D) buffer more kept than bias_gelu_backward_recompute needs;
a ViT-Tiny batch-8 step's GELU kernels took 7.2 + 9.4 ms that way, 8.0 + 3.5 ms this way).

The NumPy references evaluate the formulas in float64 and round once into the caller's arrays.
The fused twins compute in the input's precision (float32 arithmetic for float32 arrays) with
kernels.fastmath's vectorisable exp and normal CDF/density, so their loops run packed, 8 float32
lanes per instruction, instead of one libm call per element. The exact form takes Phi(x) =
erfc(-x / sqrt2) / 2 and its density from one exp, which keeps the lower tail's relative accuracy
(the reference's 1 + erf does not, below x ~ -5). Agreement with the references: a few float32
ulps, 1e-14 relative in float64 (tests/test_fastmath.py).
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
del _cpu  # imported for that side effect only
import numba
import numpy as np

from . import fastmath as fm
from . import register
from .elementwise_fused import partial_rows, sum_partials
from .erf import erf_reference
from .softmax import copy_back, rows_in, rows_out

_SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 pi)
_SQRT_2_PI = 0.7978845608028654  # sqrt(2 / pi)
_K = 0.044715
_GRAD_CLIP = 40.0

# Results that underflow to (sub)normal zero are right, not errors: keep np.seterr(under="raise")
# callers (the tests) from tripping over them in the NumPy parts.
_quiet_underflow = np.errstate(under="ignore")


def _tanh_flag(approximate: str) -> bool:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate == "tanh"


def _gelu_np(x: np.ndarray, tanh: bool) -> np.ndarray:
    if tanh:
        with np.errstate(over="ignore"):  # exp(-2u) = inf far left: x / inf = 0, the right answer
            return x / (1.0 + np.exp(-2.0 * _SQRT_2_PI * (x + _K * x * x * x)))
    return x * 0.5 * (1.0 + erf_reference(x * _SQRT1_2))


def _gelu_grad_np(x: np.ndarray, tanh: bool) -> np.ndarray:
    # gelu' is exactly 1 (0) in float64 beyond +40 (-40); clipping there keeps x**3 finite.
    unclipped, x = x, np.clip(x, -_GRAD_CLIP, _GRAD_CLIP)
    if tanh:
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(-2.0 * _SQRT_2_PI * (x + _K * x * x * x))
            s = 1.0 / (1.0 + e)
            one_minus_s = np.where(e < 1.0, e * s, 1.0 - s)  # e * s is inf * 0 where e overflows
            # The unclipped x times s (1 - s) (0 beyond the clip): the same value for every finite x, and
            # inf * 0 = NaN at +-inf, as torch's tanh-form derivative gives there (as the exact form's x * pdf)
            return s + unclipped * (s * one_minus_s) * (2.0 * _SQRT_2_PI) * (1.0 + 3.0 * _K * x * x)
    with np.errstate(under="ignore"):  # the density underflows to 0 for |x| > ~38: correct, not an error
        pdf = np.exp(-0.5 * x * x) * _INV_SQRT_2PI
    # The unclipped x times the density (0 beyond the clip): the same value for every finite x, and
    # inf * 0 = NaN at +-inf, as torch's cdf + x * pdf gives
    with np.errstate(invalid="ignore"):
        return 0.5 * (1.0 + erf_reference(x * _SQRT1_2)) + unclipped * pdf


@_quiet_underflow
def gelu_forward_reference(x: np.ndarray, out: np.ndarray, approximate: str = "none") -> None:
    """out = gelu(x), any shape (plain NumPy)."""
    tanh = _tanh_flag(approximate)
    np.copyto(out, _gelu_np(x.astype(np.float64), tanh), casting="same_kind")


@_quiet_underflow
def gelu_backward_reference(x: np.ndarray, g: np.ndarray, out: np.ndarray, approximate: str = "none") -> None:
    """out = g * gelu'(x), any shape (plain NumPy)."""
    tanh = _tanh_flag(approximate)
    np.copyto(out, g * _gelu_grad_np(x.astype(np.float64), tanh), casting="same_kind")


@_quiet_underflow
def bias_gelu_forward_reference(x: np.ndarray, bias: np.ndarray, pre: np.ndarray, out: np.ndarray,
                                approximate: str = "none") -> None:
    """pre = x + bias (saved for backward), out = gelu(pre); x (N, D), bias (D,) (plain NumPy)."""
    tanh = _tanh_flag(approximate)
    np.add(x, bias, out=pre)
    np.copyto(out, _gelu_np(pre.astype(np.float64), tanh), casting="same_kind")


@_quiet_underflow
def bias_gelu_backward_reference(pre: np.ndarray, g: np.ndarray, dx: np.ndarray, dbias: np.ndarray,
                                 approximate: str = "none") -> None:
    """dx = g * gelu'(pre), dbias = column sums of dx (plain NumPy)."""
    tanh = _tanh_flag(approximate)
    np.copyto(dx, g * _gelu_grad_np(pre.astype(np.float64), tanh), casting="same_kind")
    np.copyto(dbias, dx.sum(axis=0, dtype=np.float64), casting="same_kind")


# FMA contraction is the only fast-math licence the fused loops take (see fastmath's docstring for
# why no other); error_model="numpy" drops the ZeroDivisionError check that would stop vectorisation.
_JIT = dict(cache=True, error_model="numpy", fastmath={"contract"})


def _flat(a: np.ndarray) -> np.ndarray:
    """`a` as a C-contiguous 1-d array (a view when possible). Not `rows_in(a, 1)[:, 0]`: Numba
    types that column as any-layout and the loop then gathers and scatters instead of streaming."""
    return rows_in(a, 1).reshape(-1)


@_quiet_underflow
def bias_gelu_backward_recompute_reference(pre: np.ndarray, g: np.ndarray, dx: np.ndarray, dbias: np.ndarray,
                                           act: np.ndarray, approximate: str = "none") -> None:
    """bias_gelu_backward (dx = g * gelu'(pre), dbias = column sums of dx) plus act = gelu(pre), the
    activation a following Linear needs for its weight gradient. dx may be g itself (plain NumPy)."""
    tanh = _tanh_flag(approximate)
    p64 = pre.astype(np.float64)
    np.copyto(act, _gelu_np(p64, tanh), casting="same_kind")
    bias_gelu_backward_reference(pre, g, dx, dbias, approximate)


@_quiet_underflow
def bias_gelu_forward_with_grad_reference(x: np.ndarray, bias: np.ndarray, act: np.ndarray, dact: np.ndarray,
                                          approximate: str = "none") -> None:
    """act = gelu(x + bias) and dact = gelu'(x + bias), both kept for backward in place of x + bias
    (ops.bias_gelu_linear's default): the backward then needs no erf. x (N, D), bias (D,) (plain NumPy)."""
    tanh = _tanh_flag(approximate)
    pre = np.add(x, bias)  # in the input dtype, as bias_gelu_forward rounds it
    p64 = pre.astype(np.float64)
    np.copyto(act, _gelu_np(p64, tanh), casting="same_kind")
    np.copyto(dact, _gelu_grad_np(p64, tanh), casting="same_kind")


@_quiet_underflow
def bias_gelu_backward_stored_reference(dact: np.ndarray, g: np.ndarray, dx: np.ndarray, dbias: np.ndarray) -> None:
    """dx = g * dact (the derivative bias_gelu_forward_with_grad kept), dbias = column sums of dx, summed in
    float64. dx may be g itself (plain NumPy)."""
    np.multiply(g, dact, out=dx)
    np.copyto(dbias, dx.sum(axis=0, dtype=np.float64), casting="same_kind")


@numba.njit(inline="always")
def _chunk(c, n, nchunks):
    c64 = np.int64(c)  # prange's index is unsigned: keep the arithmetic in int64
    return c64 * n // nchunks, (c64 + 1) * n // nchunks


@numba.njit(inline="always")
def _chunk_and_partial(part, c, n):
    """Chunk c of n rows (lo, hi) and its float64 partial dbias row, zeroed: the rows are the arena's,
    uninitialised (partial_rows); one per chunk, so no two threads share a slot."""
    lo, hi = _chunk(c, n, part.shape[0])
    acc = part[c]
    acc[:] = 0.0
    return lo, hi, acc


@numba.njit(inline="always", error_model="numpy")
def _gelu_erf(x):
    cdf, _ = fm.ndtr_pdf(x)
    return x * cdf


@numba.njit(inline="always", error_model="numpy")
def _gelu_tanh(x):
    # x * 0.5 (1 + tanh u) = x / (1 + exp(-2u)); far left exp overflows to inf and x / inf = -0
    return x / (fm.like(x, 1.0) + fm.exp(fm.like(x, -2.0 * _SQRT_2_PI) * (x + fm.like(x, _K) * x * x * x)))


@numba.njit(inline="always", error_model="numpy")
def _gelu_grad_erf(x):
    lim = fm.like(x, _GRAD_CLIP)
    c = -lim if x < -lim else (lim if x > lim else x)  # as in _gelu_grad_np
    cdf, pdf = fm.ndtr_pdf(c)
    return cdf + x * pdf  # pdf is 0 beyond the clip: x * 0 = c * 0 for finite x, NaN at +-inf (torch's)


@numba.njit(inline="always", error_model="numpy")
def _gelu_grad_tanh(x):
    lim, one = fm.like(x, _GRAD_CLIP), fm.like(x, 1.0)
    c = -lim if x < -lim else (lim if x > lim else x)  # keeps x**3 finite
    e = fm.exp(fm.like(c, -2.0 * _SQRT_2_PI) * (c + fm.like(c, _K) * c * c * c))
    s = one / (one + e)
    one_minus_s = e * s if e < one else one - s  # both computed, one selected: e * s is inf * 0 = NaN far left
    # the unclipped x times s (1 - s), which is 0 beyond the clip: x * 0 = c * 0 for finite x, NaN at +-inf
    # (torch's), as _gelu_grad_erf's x * pdf
    return s + x * (s * one_minus_s) * fm.like(c, 2.0 * _SQRT_2_PI) * (one + fm.like(c, 3.0 * _K) * c * c)


@numba.njit(inline="always", error_model="numpy")
def _gelu_and_grad_erf(x):
    # One ndtr_pdf for both: gelu(x) = x Phi(x) and gelu'(x) = Phi(x) + x phi(x). Phi of the clipped
    # x equals Phi(x) (it is exactly 0 or 1 beyond |x| = 13), so act matches _gelu_erf bit for bit.
    lim = fm.like(x, _GRAD_CLIP)
    c = -lim if x < -lim else (lim if x > lim else x)
    cdf, pdf = fm.ndtr_pdf(c)
    return x * cdf, cdf + x * pdf  # x * pdf, as _gelu_grad_erf: NaN at +-inf, as torch's


@numba.njit(inline="always", error_model="numpy")
def _gelu_and_grad_tanh(x):
    # One exp for both, from the clipped x as _gelu_grad_tanh takes it. x / (1 + e) then equals
    # _gelu_tanh(x) bit for bit: beyond |x| = 40, e is ~0 (x / 1 = x) or inf (x / inf = -0) either way.
    lim, one = fm.like(x, _GRAD_CLIP), fm.like(x, 1.0)
    c = -lim if x < -lim else (lim if x > lim else x)
    e = fm.exp(fm.like(c, -2.0 * _SQRT_2_PI) * (c + fm.like(c, _K) * c * c * c))
    s = one / (one + e)
    one_minus_s = e * s if e < one else one - s  # as _gelu_grad_tanh
    # x, not c, times s (1 - s): NaN at +-inf, as _gelu_grad_tanh
    return x / (one + e), s + x * (s * one_minus_s) * fm.like(c, 2.0 * _SQRT_2_PI) * (one + fm.like(c, 3.0 * _K) * c * c)


# Each kernel comes in two forms, `_erf` and `_tanh`, rather than one taking the form as a flag: Numba compiles
# every branch of a kernel, so one with both forms cost the erf form's compile plus the tanh form's on every first
# call, where a model uses one. bias_gelu_forward_with_grad float32, cold (a fresh Numba cache): both forms in one
# kernel 2.0-2.4 s, the erf form alone 1.3-1.6 s, the tanh form alone 0.9 s (Zen 4); a first `tensorarena train
# --model vit-tiny` compiles four of these kernels. The forms are written out twice on purpose: a kernel made by a
# factory closure, or one taking the form's function as an argument, missed Numba's disk cache in every new
# process. Each form is one vectorised loop per row, as before: a prange over chunk indices with an inner range
# loop made LLVM gather/scatter in the flat kernels (_forward_*), so they keep a plain prange; in the row kernels
# the float64 dbias sums run in a loop of their own (_add_row), since in the activation's loop they would halve
# its width.
@numba.njit(parallel=True, **_JIT)
def _forward_erf(x, out):
    for i in numba.prange(x.shape[0]):
        out[i] = _gelu_erf(x[i])


@numba.njit(parallel=True, **_JIT)
def _forward_tanh(x, out):
    for i in numba.prange(x.shape[0]):
        out[i] = _gelu_tanh(x[i])


@numba.njit(parallel=True, **_JIT)
def _backward_erf(x, g, out):
    for i in numba.prange(x.shape[0]):
        out[i] = g[i] * _gelu_grad_erf(x[i])


@numba.njit(parallel=True, **_JIT)
def _backward_tanh(x, g, out):
    for i in numba.prange(x.shape[0]):
        out[i] = g[i] * _gelu_grad_tanh(x[i])


@numba.njit(parallel=True, **_JIT)
def _bias_forward_erf(x, bias, pre, out):
    n, d = x.shape
    for r in numba.prange(n):
        for j in range(d):
            p = x[r, j] + bias[j]  # in the input dtype, exactly as the reference's np.add
            pre[r, j] = p
            out[r, j] = _gelu_erf(p)


@numba.njit(parallel=True, **_JIT)
def _bias_forward_tanh(x, bias, pre, out):
    n, d = x.shape
    for r in numba.prange(n):
        for j in range(d):
            p = x[r, j] + bias[j]
            pre[r, j] = p
            out[r, j] = _gelu_tanh(p)


@numba.njit(inline="always")
def _add_row(acc, row):
    for j in range(row.shape[0]):
        acc[j] += row[j]


@numba.njit(parallel=True, **_JIT)
def _bias_backward_erf(pre, g, dx, part, nchunks):
    n, d = pre.shape
    for c in numba.prange(nchunks):
        lo, hi, acc = _chunk_and_partial(part, c, n)
        for r in range(lo, hi):
            dxr, gr, pr = dx[r], g[r], pre[r]
            for j in range(d):
                dxr[j] = gr[j] * _gelu_grad_erf(pr[j])
            _add_row(acc, dxr)


@numba.njit(parallel=True, **_JIT)
def _bias_backward_tanh(pre, g, dx, part, nchunks):
    n, d = pre.shape
    for c in numba.prange(nchunks):
        lo, hi, acc = _chunk_and_partial(part, c, n)
        for r in range(lo, hi):
            dxr, gr, pr = dx[r], g[r], pre[r]
            for j in range(d):
                dxr[j] = gr[j] * _gelu_grad_tanh(pr[j])
            _add_row(acc, dxr)


# The recompute kernels take g in gdx and leave dx there: one array read and written at the same index keeps the
# loop vectorised (a dx that merely aliased g failed LLVM's overlap check: 5x slower, scalar).
@numba.njit(parallel=True, **_JIT)
def _bias_backward_recompute_erf(pre, gdx, act, part, nchunks):
    n, d = pre.shape
    for c in numba.prange(nchunks):
        lo, hi, acc = _chunk_and_partial(part, c, n)
        for r in range(lo, hi):
            dxr, pr, ar = gdx[r], pre[r], act[r]
            for j in range(d):
                a, da = _gelu_and_grad_erf(pr[j])
                ar[j] = a
                dxr[j] = dxr[j] * da
            _add_row(acc, dxr)


@numba.njit(parallel=True, **_JIT)
def _bias_backward_recompute_tanh(pre, gdx, act, part, nchunks):
    n, d = pre.shape
    for c in numba.prange(nchunks):
        lo, hi, acc = _chunk_and_partial(part, c, n)
        for r in range(lo, hi):
            dxr, pr, ar = gdx[r], pre[r], act[r]
            for j in range(d):
                a, da = _gelu_and_grad_tanh(pr[j])
                ar[j] = a
                dxr[j] = dxr[j] * da
            _add_row(acc, dxr)


@numba.njit(parallel=True, **_JIT)
def _bias_forward_with_grad_erf(x, bias, act, dact):
    n, d = x.shape
    for r in numba.prange(n):
        xr, ar, dr = x[r], act[r], dact[r]
        for j in range(d):
            a, da = _gelu_and_grad_erf(xr[j] + bias[j])  # the sum in the input dtype, as _bias_forward_erf's
            ar[j] = a
            dr[j] = da


@numba.njit(parallel=True, **_JIT)
def _bias_forward_with_grad_tanh(x, bias, act, dact):
    n, d = x.shape
    for r in numba.prange(n):
        xr, ar, dr = x[r], act[r], dact[r]
        for j in range(d):
            a, da = _gelu_and_grad_tanh(xr[j] + bias[j])
            ar[j] = a
            dr[j] = da


@numba.njit(parallel=True, **_JIT)
def _backward_stored(dact, gdx, part, nchunks):
    # gdx holds g on entry and dx on exit (one array read and written at the same index: see the comment above
    # _bias_backward_recompute_erf); one float64 partial dbias row per chunk.
    n, d = dact.shape
    for c in numba.prange(nchunks):
        lo, hi, acc = _chunk_and_partial(part, c, n)
        for r in range(lo, hi):
            dxr, dr = gdx[r], dact[r]
            for j in range(d):
                dxr[j] = dxr[j] * dr[j]
            _add_row(acc, dxr)


def gelu_forward_fused(x: np.ndarray, out: np.ndarray, approximate: str = "none") -> None:
    """Same contract as `gelu_forward_reference`, one parallel pass."""
    tanh = _tanh_flag(approximate)
    o = rows_out(out, 1)
    (_forward_tanh if tanh else _forward_erf)(_flat(x), o.reshape(-1))
    copy_back(out, o)


def gelu_backward_fused(x: np.ndarray, g: np.ndarray, out: np.ndarray, approximate: str = "none") -> None:
    """Same contract as `gelu_backward_reference`, one parallel pass."""
    tanh = _tanh_flag(approximate)
    o = rows_out(out, 1)
    (_backward_tanh if tanh else _backward_erf)(_flat(x), _flat(g), o.reshape(-1))
    copy_back(out, o)


def bias_gelu_forward_fused(x: np.ndarray, bias: np.ndarray, pre: np.ndarray, out: np.ndarray,
                            approximate: str = "none") -> None:
    """Same contract as `bias_gelu_forward_reference`, one parallel pass."""
    (_bias_forward_tanh if _tanh_flag(approximate) else _bias_forward_erf)(x, bias, pre, out)


@_quiet_underflow
def bias_gelu_backward_fused(pre: np.ndarray, g: np.ndarray, dx: np.ndarray, dbias: np.ndarray,
                             approximate: str = "none") -> None:
    """Same contract as `bias_gelu_backward_reference`; dbias via per-chunk float64 partial rows
    (elementwise_fused.partial_rows: the step arena's, planned on the fused route)."""
    tanh = _tanh_flag(approximate)
    part = partial_rows(*pre.shape)
    (_bias_backward_tanh if tanh else _bias_backward_erf)(pre, g, dx, part, part.shape[0])
    sum_partials(part, dbias)


@_quiet_underflow
def bias_gelu_backward_recompute_fused(pre: np.ndarray, g: np.ndarray, dx: np.ndarray, dbias: np.ndarray,
                                       act: np.ndarray, approximate: str = "none") -> None:
    """Same contract as `bias_gelu_backward_recompute_reference`: one pass, one erf per element
    for both outputs (bias_gelu_linear's backward ran gelu_forward and bias_gelu_backward, two)."""
    tanh = _tanh_flag(approximate)
    if dx is not g:
        np.copyto(dx, g)  # the kernel works in place (see _bias_backward_recompute_erf)
    part = partial_rows(*pre.shape)
    (_bias_backward_recompute_tanh if tanh else _bias_backward_recompute_erf)(pre, dx, act, part, part.shape[0])
    sum_partials(part, dbias)


def bias_gelu_forward_with_grad_fused(x: np.ndarray, bias: np.ndarray, act: np.ndarray, dact: np.ndarray,
                                      approximate: str = "none") -> None:
    """Same contract as `bias_gelu_forward_with_grad_reference`: one pass, one erf (or exp) per element for
    both outputs."""
    (_bias_forward_with_grad_tanh if _tanh_flag(approximate) else _bias_forward_with_grad_erf)(
        x, bias, act, dact)


@_quiet_underflow
def bias_gelu_backward_stored_fused(dact: np.ndarray, g: np.ndarray, dx: np.ndarray, dbias: np.ndarray) -> None:
    """Same contract as `bias_gelu_backward_stored_reference`: one pass, no transcendental; dbias via
    per-chunk float64 partial rows (elementwise_fused.partial_rows)."""
    if dx is not g:
        np.copyto(dx, g)  # the kernel works in place (see _backward_stored)
    part = partial_rows(*dact.shape)
    _backward_stored(dact, dx, part, part.shape[0])
    sum_partials(part, dbias)


register("gelu_forward", "reference", gelu_forward_reference)
register("gelu_forward", "fused", gelu_forward_fused)
register("gelu_backward", "reference", gelu_backward_reference)
register("gelu_backward", "fused", gelu_backward_fused)
register("bias_gelu_forward", "reference", bias_gelu_forward_reference)
register("bias_gelu_forward", "fused", bias_gelu_forward_fused)
register("bias_gelu_backward", "reference", bias_gelu_backward_reference)
register("bias_gelu_backward", "fused", bias_gelu_backward_fused)
register("bias_gelu_backward_recompute", "reference", bias_gelu_backward_recompute_reference)
register("bias_gelu_backward_recompute", "fused", bias_gelu_backward_recompute_fused)
register("bias_gelu_forward_with_grad", "reference", bias_gelu_forward_with_grad_reference)
register("bias_gelu_forward_with_grad", "fused", bias_gelu_forward_with_grad_fused)
register("bias_gelu_backward_stored", "reference", bias_gelu_backward_stored_reference)
register("bias_gelu_backward_stored", "fused", bias_gelu_backward_stored_fused)
