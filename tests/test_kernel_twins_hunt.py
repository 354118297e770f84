"""Bug hunt: every fused kernel against its NumPy reference twin (and torch) on edge inputs.

Edge inputs: size 0 and 1 dimensions, one row, fewer rows than threads, rows not divisible by the
thread split, transposed / negative-stride / Fortran views, outputs aliasing inputs, float32 and
float64, extreme values (huge, +-inf, NaN, subnormal), class labels at their bounds and ignore_index,
dropout at p = 0 / 1, fully masked attention rows, bfloat16 rounding, the GEMM routes at their
thresholds. Each test names the route it expects and checks kernels.calls where the code counts one.

Tolerances: float64 1e-12 relative; float32 1e-6 relative where both twins evaluate the same formula
(a looser bar, where used, says why next to it). NaN positions must match (assert_allclose does).
Run with NUMBA_NUM_THREADS=2 so the thread-split edges (rows < threads, odd splits) are real.

20 of these 219 tests failed on 04a3a9b, before the fixes (each under a "Regression (fixed)" comment saying what
was wrong). With this file copied into a worktree of 04a3a9b (git worktree add /tmp/old 04a3a9b), run in /tmp/old:
`NUMBA_NUM_THREADS=2 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_kernel_twins_hunt.py`.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorarena import kernels
from tensorarena.kernels import elementwise, gemm as G, gemm_jobs
from tensorarena.kernels.dropout import keep_mask_reference, keep_threshold
from tests.gemm_libraries import library, route_on  # noqa: F401 - library is a fixture

kernels._load()

F32, F64 = np.float32, np.float64
DTYPES = [F32, F64]
TOL = {F64: dict(rtol=1e-12, atol=1e-300), F32: dict(rtol=1e-6, atol=1e-30)}
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
needs_mkl = pytest.mark.skipif(G._mkl is None, reason="MKL is not this process's GEMM backend")


def ref(name):
    return kernels.kernel(name, "reference")


def fus(name):
    return kernels.kernel(name, "fused")


@np.errstate(all="ignore")
def close(a, b, tol, msg=""):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), **tol, err_msg=msg)


def extremes(dt):
    """Values every elementwise kernel must get right: signed zeros, subnormals, huge, +-inf, NaN."""
    fi = np.finfo(dt)
    return np.array([0.0, -0.0, fi.smallest_subnormal, -fi.smallest_subnormal, fi.tiny, -fi.tiny, 1e-30, 0.5,
                     -0.75, 1.0, -3.0, 7.5, -9.0, 30.0, -30.0, 45.0, -45.0, 1e4, -1e4, fi.max, -fi.max,
                     np.inf, -np.inf, np.nan], dt)


# ---------------------------------------------------------------- elementwise: add, bias_add, column_sum

BIG = elementwise.PARALLEL_MIN  # the dispatchers' threshold


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(1, BIG), (BIG, 1), (3, BIG // 3 + 1), (BIG + 1,)])
def test_add_twins_with_aliasing_and_extremes(dt, shape):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape).astype(dt)
    b = rng.standard_normal(shape).astype(dt)
    e = extremes(dt)
    a.reshape(-1)[: e.size] = e
    b.reshape(-1)[1: e.size + 1] = e
    with np.errstate(all="ignore"):
        want = a + b
    for alias in ("none", "a", "b"):
        aa, bb = a.copy(), b.copy()
        out = {"none": np.empty_like(a), "a": aa, "b": bb}[alias]
        before = kernels.calls[("add", "fused")]
        with np.errstate(all="ignore"):
            elementwise.add(aa, bb, out)  # the dispatcher: it fits, so the fused twin must run
        assert kernels.calls[("add", "fused")] == before + 1
        np.testing.assert_array_equal(out, want, err_msg=f"out is {alias}")  # one IEEE add: bit for bit


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 7])  # one row; rows not divisible by 2 threads
def test_bias_add_and_column_sum_edge_rows(dt, n):
    rng = np.random.default_rng(n)
    d = -(-BIG // n)
    x = rng.standard_normal((n, d)).astype(dt)
    bias = rng.standard_normal(d).astype(dt)
    bias[:3] = [np.inf, np.nan, -0.0]
    got = x.copy()
    before = kernels.calls[("bias_add", "fused")]
    with np.errstate(all="ignore"):
        elementwise.bias_add(got, bias)
        want = x + bias
    assert kernels.calls[("bias_add", "fused")] == before + 1
    np.testing.assert_array_equal(got, want)
    outs = [np.empty(d, dt), np.empty(d, dt)]
    ref("column_sum")(x, outs[0])
    before = kernels.calls[("column_sum", "fused")]
    elementwise.column_sum(x, outs[1])
    assert kernels.calls[("column_sum", "fused")] == before + 1
    # both sum in float64, in another order (per-thread partial rows): a few 1e-16 of sum |x|, then
    # one rounding into out's dtype (one float32 ulp when that lands on a tie's other side)
    mag = np.abs(x).sum(axis=0, dtype=F64)
    err = np.abs(outs[0].astype(F64) - outs[1])
    assert np.all(err <= (1e-14 * mag if dt is F64 else 1.2e-7 * np.abs(outs[0]) + 1e-14 * mag))


def test_small_or_strided_arrays_stay_on_numpy():
    a = np.ones((4, 5), F32)
    before = (kernels.calls[("add", "fused")], kernels.calls[("add", "reference")])
    elementwise.add(a, a, np.empty_like(a))  # small
    big = np.ones((2, BIG), F32)
    elementwise.add(big.T, big.T, np.empty((BIG, 2), F32))  # strided
    assert (kernels.calls[("add", "fused")], kernels.calls[("add", "reference")]) == before


# Regression (fixed): elementwise.bias_add's dispatcher hands a 3-D x (with bias of shape x.shape[1:]) to the fused
# kernel, which only compiles for 2-D x: a Numba TypingError instead of NumPy's broadcasting add (`fits` checks size,
# dtype and contiguity, never x.ndim == 2; column_sum's dispatcher does check it). Fixed: the dispatcher requires x.ndim
# == 2.
def test_bias_add_dispatcher_with_3d_x():
    x = np.ones((2, 128, 128), F32)
    bias = np.arange(128 * 128, dtype=F32).reshape(128, 128)
    elementwise.bias_add(x, bias)
    # expectation fixed: assert_array_equal does not broadcast, so the (1, 128, 128) expectation always failed on shape
    np.testing.assert_array_equal(x, np.broadcast_to(1 + bias, x.shape))


# ---------------------------------------------------------------- gelu and erf

def _gelu_pair(name, args_fn, out_fn, approximate):
    results = []
    for fn in (ref(name), fus(name)):
        outs = out_fn()
        fn(*args_fn(), *outs, approximate=approximate)
        results.append(outs)
    return results


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_extremes_views_and_aliasing(dt, approximate):
    rng = np.random.default_rng(2)
    x = np.concatenate([extremes(dt), rng.standard_normal(40).astype(dt) * 4]).astype(dt)
    g = rng.standard_normal(x.size).astype(dt)
    # float32: the fused twin computes in float32 (a few ulps, module docstring); near gelu's zeros
    # (x ~ 0, gelu'(x) ~ 0 at x ~ -0.75) the absolute error of a few ulps of the terms counts.
    tol = TOL[dt] if dt is F64 else dict(rtol=2e-6, atol=2e-7)
    tol = dict(rtol=max(tol["rtol"], 1e-14), atol=1e-15) if dt is F64 else tol
    # NumPy flags inf * 0 in the reference (np.seterr raise in conftest); the value (NaN / 0) is torch's
    with np.errstate(invalid="ignore", over="ignore"):
        fwd = _gelu_pair("gelu_forward", lambda: (x,), lambda: [np.empty_like(x)], approximate)
        bwd = _gelu_pair("gelu_backward", lambda: (x, g), lambda: [np.empty_like(x)], approximate)
    close(fwd[0][0], fwd[1][0], tol, "forward")
    close(bwd[0][0], bwd[1][0], tol, "backward")
    # torch on the finite values
    fin = np.isfinite(x)
    tx = torch.tensor(x[fin].astype(F64), requires_grad=True)
    ty = F.gelu(tx, approximate=approximate)
    ty.backward(torch.tensor(g[fin].astype(F64)))
    # atol: torch's 1 + erf / 1 + tanh cancel in the far left tail (gelu(-9) = -1e-18 is -0 in torch), and
    # fastmath flushes results below ~1.5 * float32's tiny to 0 (documented): only the absolute error counts there
    close(fwd[1][0][fin], ty.detach().numpy(), dict(rtol=1e-5 if dt is F32 else 1e-12, atol=1e-15), "torch fwd")
    # NaN in, NaN out; +inf -> inf; -inf -> NaN (-inf * 0), as torch's float64 gelu
    ne = extremes(dt).size  # ..., +inf, -inf, NaN at its end
    assert np.isnan(fwd[1][0][ne - 1]) and fwd[1][0][ne - 3] == np.inf and np.isnan(fwd[1][0][ne - 2])
    # transposed (non-contiguous) input and output, and out aliasing x
    xm = rng.standard_normal((5, 7)).astype(dt)
    r = _gelu_pair("gelu_forward", lambda: (xm.T,), lambda: [np.empty((5, 7), dt).T], approximate)
    close(r[0][0], r[1][0], tol, "transposed")
    for fn in (ref("gelu_forward"), fus("gelu_forward")):
        y = xm.copy()
        fn(y, y, approximate=approximate)
        close(y, r[0][0].T, tol, "out is x")
    # size 0
    for fn in (ref("gelu_forward"), fus("gelu_forward")):
        fn(np.empty((0, 3), dt), np.empty((0, 3), dt), approximate=approximate)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [1, 3])  # one row; fewer rows than threads / odd split
def test_bias_gelu_backward_recompute_in_place_edges(dt, n):
    rng = np.random.default_rng(n)
    d = 9
    pre = (rng.standard_normal((n, d)) * 3).astype(dt)
    pre[0, :3] = [50.0, -50.0, 0.0]
    g = rng.standard_normal((n, d)).astype(dt)
    tol = TOL[dt] if dt is F64 else dict(rtol=2e-6, atol=2e-7)
    tol = dict(rtol=1e-13, atol=1e-15) if dt is F64 else tol
    res = []
    for fn in (ref("bias_gelu_backward_recompute"), fus("bias_gelu_backward_recompute")):
        gdx = g.copy()
        dbias, act = np.empty(d, dt), np.empty((n, d), dt)
        fn(pre, gdx, gdx, dbias, act, approximate="none")  # dx is g itself
        res.append((gdx, dbias, act))
    for a, b in zip(*res):
        close(a, b, tol)


@pytest.mark.parametrize("dt", DTYPES)
def test_erf_twins_extremes_and_torch(dt):
    x = extremes(dt)
    a, b = ref("erf")(x), fus("erf")(x)
    assert a.dtype == b.dtype == dt
    close(a, b, dict(rtol=3e-7 if dt is F32 else 2e-15, atol=1e-300))  # fastmath erf: <= 2 ulp float32
    close(b, torch.erf(torch.tensor(x)).numpy(), dict(rtol=3e-7 if dt is F32 else 2e-15, atol=1e-300))
    # out aliasing a negative-stride view of x
    y = x.copy()
    fus("erf")(y[::-1], y[::-1])
    close(y, b, dict(rtol=0, atol=0))


# Regression (fixed): erf's fused twin returns float64 for a float16 input (it widens x to float64 and allocates out in
# that dtype), where the reference twin returns float16 (out takes x's float dtype): the twins' results differ in dtype,
# so a caller relying on `out=None` gets a different array type by route. Fixed: the fused twin allocates out in x's
# float dtype before widening x.
def test_erf_float16_result_dtype_matches_between_twins():
    x = np.array([0.5, -1.0, 2.0], np.float16)
    assert fus("erf")(x).dtype == ref("erf")(x).dtype


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5])  # one row, rows <= threads, rows not divisible by 2
def test_softmax_extreme_rows_and_torch(dt, rows):
    rng = np.random.default_rng(rows)
    d = 6
    x = (rng.standard_normal((rows, d)) * 3).astype(dt)
    specials = [[1e30, -1e30, 0, 1, 2, 3], [-np.inf] * d, [np.inf, 0, 1, 2, 3, 4], [np.nan, 0, 1, 2, 3, 4],
                [-np.inf, 0, -np.inf, 1, -np.inf, 2]]
    for i in range(min(rows, len(specials))):
        x[i] = specials[i]
    outs = []
    for fn in (ref("softmax_forward"), fus("softmax_forward")):
        o = np.full_like(x, 7)
        with np.errstate(invalid="ignore"):  # inf - inf in the reference: NaN, as torch
            fn(x, None, o)
        outs.append(o)
    close(outs[0], outs[1], TOL[dt])
    with torch.no_grad():
        want = torch.softmax(torch.tensor(x), dim=-1).numpy()
    masked = np.all(np.isneginf(x), axis=-1)  # fully masked rows are zeros here, NaN in torch (documented)
    live = ~masked & ~np.any(np.isposinf(x), axis=-1)  # a +inf logit: test_softmax_positive_inf_logit_row_is_nan_like_torch
    close(outs[1][live], want[live], dict(rtol=2e-6 if dt is F32 else 1e-13, atol=1e-30))
    assert np.all(outs[1][masked] == 0)
    # in place (out is x): the fused twin's own code path
    for fn, o in zip((ref("softmax_forward"), fus("softmax_forward")), outs):
        y = x.copy()
        with np.errstate(invalid="ignore"):
            fn(y, None, y)
        close(y, o, TOL[dt])


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_masks_views_and_backward(dt):
    rng = np.random.default_rng(3)
    B, H, T, S = 2, 3, 4, 5
    x = rng.standard_normal((B, H, T, S)).astype(dt)
    pad = np.where(rng.random((B, 1, 1, S)) < 0.4, -np.inf, 0.0)
    pad[1, ..., :] = -np.inf  # batch 1 fully masked
    masks = [pad, pad.astype(F32), np.ascontiguousarray(np.broadcast_to(pad, (B, 1, T, S)))[..., ::-1],
             np.full((S,), -1e30), np.zeros((1,)), rng.standard_normal((H, 1, S)).T.copy().T]
    for m in masks:
        got = []
        for fn in (ref("softmax_forward"), fus("softmax_forward")):
            o = np.full_like(x, 7)
            fn(x, m, o)
            got.append(o)
        close(got[0], got[1], TOL[dt], f"mask {m.shape} {m.dtype} {m.strides}")
    # transposed input, Fortran-ordered output
    xt = rng.standard_normal((S, 7)).astype(dt).T
    got = []
    for fn in (ref("softmax_forward"), fus("softmax_forward")):
        o = np.asfortranarray(np.full((7, S), 7, dt))
        fn(xt, None, o)
        got.append(o)
    close(got[0], got[1], TOL[dt])
    # backward with out aliasing g, on a negative-stride y
    y = got[0][::-1]
    g = rng.standard_normal(y.shape).astype(dt)
    res = []
    for fn in (ref("softmax_backward"), fus("softmax_backward")):
        gg = g.copy()
        fn(y, gg, gg)
        res.append(gg)
    close(res[0], res[1], dict(rtol=1e-12, atol=1e-15) if dt is F64 else dict(rtol=1e-6, atol=1e-7))


# Regression (fixed): a row holding a +inf logit comes out [NaN at the inf, 0 elsewhere] from both twins; torch gives
# the whole row NaN (exp(inf - inf) = NaN makes the row sum NaN). Both twins turn a NaN sum into a 0 scale:
# softmax.py:57 `where=s > 0` and softmax.py:120 `1 / s if s > 0 else 0` (meant for the fully masked row, whose sum is
# 0). attention_heads.softmax_row inherits it. Fix: zero only when s == 0. Done in both (softmax_row included).
@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_positive_inf_logit_row_is_nan_like_torch(dt):
    x = np.array([[np.inf, 0.0, 1.0, 2.0]], dt)
    with torch.no_grad():
        want = torch.softmax(torch.tensor(x), dim=-1).numpy()
    assert np.all(np.isnan(want))
    for fn in (fus("softmax_forward"), ref("softmax_forward")):
        o = np.empty_like(x)
        with np.errstate(invalid="ignore"):
            fn(x, None, o)
        np.testing.assert_array_equal(o, want, err_msg=fn.__name__)


# Regression (fixed): softmax's fused twin crashes (Numba NotImplementedError: float16) on a float16 additive mask,
# which _check_mask accepts (any float kind) and the reference twin adds in float64 as any other. Fixed: _mask_layout
# hands the fused twin a float64 copy of such a (mask-sized) mask.
def test_softmax_float16_mask():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(F32)
    m = np.array([0, -np.inf, 0, 0], np.float16)
    want, got = np.empty_like(x), np.empty_like(x)
    ref("softmax_forward")(x, m, want)
    fus("softmax_forward")(x, m, got)
    close(want, got, TOL[F32])


# ---------------------------------------------------------------- layer_norm

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n,d", [(1, 1), (1, 17), (3, 5), (5, 1)])
@pytest.mark.parametrize("layout", ["c", "t"])
def test_layer_norm_edges(dt, n, d, layout):
    rng = np.random.default_rng(n * 10 + d)
    x = (rng.standard_normal((n, d)) + 1e3).astype(dt)  # large mean offset: the backward's hi/lo split
    x[0] = 4.0  # a constant row: variance 0, rstd = 1/sqrt(eps)
    if layout == "t":
        x = np.ascontiguousarray(x.T).T
    w, b = rng.standard_normal(d).astype(dt), rng.standard_normal(d).astype(dt)
    g = rng.standard_normal((n, d)).astype(dt)
    outs = []
    for fn in (ref("layer_norm_forward"), fus("layer_norm_forward")):
        o = (np.empty((n, d), dt), np.empty(n, F64), np.empty(n, F64))
        fn(x, w, b, 1e-5, *o)
        outs.append(o)
    for a, c in zip(*outs):
        close(a, c, TOL[dt] if dt is F64 else dict(rtol=1e-6, atol=1e-6))  # float64 math, rounded once
    with torch.no_grad():
        want = F.layer_norm(torch.tensor(x.astype(F64)), (d,), torch.tensor(w.astype(F64)),
                            torch.tensor(b.astype(F64)), 1e-5).numpy()
    close(outs[1][0], want, dict(rtol=2e-6, atol=2e-6) if dt is F32 else dict(rtol=1e-10, atol=1e-10))
    _, mean, rstd = outs[0]
    grads = []
    for fn in (ref("layer_norm_backward"), fus("layer_norm_backward")):
        o = (np.empty((n, d), dt), np.empty(d, dt), np.empty(d, dt))
        fn(g, x, w, mean, rstd, *o)
        grads.append(o)
    # float32: the fused backward runs in float32 with cancellation in gw - mean(gw) - xhat * m2 and
    # rstd up to 316 (the constant row): compare against the result's scale, a few ulps of it.
    for a, c in zip(*grads):
        scale = np.max(np.abs(a)) if a.size else 1.0
        close(a, c, dict(rtol=1e-12, atol=1e-12 * scale) if dt is F64 else dict(rtol=1e-5, atol=1e-5 * scale))


# Regression (fixed): layer_norm_backward's reference twin gives wrong dweight and dbias when dx is g (in place): it
# writes dx into g first (layer_norm.py:65) and then sums g * xhat and g (lines 66-69) from the overwritten values. The
# fused twin reads each g before writing dx and gets them right, so the twins disagree. (ops.layer_norm passes a fresh
# dx today; bias_gelu_backward_recompute documents "dx may be g itself", this kernel says nothing.) Fix: compute
# dweight/dbias before the copyto into dx. Done.
@pytest.mark.parametrize("dt", DTYPES)
def test_layer_norm_backward_dx_aliasing_g(dt):
    rng = np.random.default_rng(11)
    n, d = 3, 5
    x, g, w = (rng.standard_normal(s).astype(dt) for s in ((n, d), (n, d), (d,)))
    mean, rstd = x.mean(axis=1, dtype=F64), 1 / np.sqrt(x.astype(F64).var(axis=1) + 1e-5)
    apart = (np.empty((n, d), dt), np.empty(d, dt), np.empty(d, dt))
    ref("layer_norm_backward")(g, x, w, mean, rstd, *apart)
    for fn in (fus("layer_norm_backward"), ref("layer_norm_backward")):
        gg = g.copy()
        o = (gg, np.empty(d, dt), np.empty(d, dt))
        fn(gg, x, w, mean, rstd, *o)
        for a, c in zip(apart, o):
            close(a, c, dict(rtol=1e-12, atol=1e-12) if dt is F64 else dict(rtol=1e-5, atol=1e-5), fn.__name__)


# ---------------------------------------------------------------- cross_entropy

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("tdt", [np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_bounds_ignore_extremes_and_torch(dt, tdt, smoothing):
    rng = np.random.default_rng(4)
    n, c = 7, 5
    logits = np.asfortranarray((rng.standard_normal((n, c)) * 2).astype(dt))  # Fortran order
    logits[0] = [1e30, -1e30, 0, 1, 2] if dt is F64 else [3e38, -3e38, 0, 1, 2]
    logits[1, 2] = -50.0
    ignore = 3 if tdt is np.uint8 else -100
    target = np.array([0, c - 1, ignore, 2, c - 1, 0, ignore], tdt)
    res = []
    for fn in (ref("cross_entropy_forward"), fus("cross_entropy_forward")):
        losses, lse = np.full(n, 7, dt), np.full(n, 7, F64)
        count = fn(logits, target, ignore, smoothing, losses, lse)
        res.append((count, losses, lse))
    assert res[0][0] == res[1][0] == 5
    finite = np.isfinite(res[0][1])
    close(res[0][1], res[1][1], TOL[dt])
    close(res[0][2], res[1][2], TOL[F64])
    dls = []
    for fn in (ref("cross_entropy_backward"), fus("cross_entropy_backward")):
        d = np.full((n, c), 7, dt)
        fn(logits, target, res[0][2], ignore, smoothing, 0.5, d)
        dls.append(d)
    close(dls[0], dls[1], TOL[dt] if dt is F64 else dict(rtol=1e-6, atol=1e-7))
    assert np.all(dls[1][target == ignore] == 0)
    keep = finite & np.isfinite(logits).all(axis=1)
    tl = torch.tensor(logits[keep].astype(F64))
    tt = torch.tensor(target[keep].astype(np.int64))
    want = F.cross_entropy(tl, tt, ignore_index=ignore, label_smoothing=smoothing, reduction="none").numpy()
    close(res[1][1][keep], want, dict(rtol=1e-6 if dt is F32 else 1e-12, atol=1e-12))


# Regression (fixed): a -inf logit (a masked class) that is not the target makes the loss NaN in both twins without
# label smoothing, where torch gives the finite -log_softmax[target]: the row loss always adds eps * (lse - mean(x)),
# and with eps = 0 that is 0 * inf = NaN (the reference also raises FloatingPointError under
# np.seterr(invalid="raise")). cross_entropy.py:65 and :116. Fix: add the smoothing term only when eps != 0 (torch
# computes it only then). Done in both twins.
@pytest.mark.parametrize("dt", DTYPES)
def test_cross_entropy_masked_logit_without_smoothing_like_torch(dt):
    logits = np.array([[0.0, -np.inf, 1.0], [2.0, 0.5, -np.inf]], dt)
    target = np.array([0, 1])
    want = F.cross_entropy(torch.tensor(logits), torch.tensor(target), reduction="none").numpy()
    for fn in (fus("cross_entropy_forward"), ref("cross_entropy_forward")):
        losses, lse = np.empty(2, dt), np.empty(2)
        with np.errstate(invalid="ignore"):
            fn(logits, target, -100, 0.0, losses, lse)
        close(losses, want, dict(rtol=1e-6, atol=1e-7), fn.__name__)


@pytest.mark.parametrize("bad", [5, -1])
def test_cross_entropy_bad_targets_raise_in_both_and_empty_batch(bad):
    logits = np.zeros((3, 5), F32)
    target = np.array([0, bad, 1])
    for fn in (ref("cross_entropy_forward"), fus("cross_entropy_forward")):
        with pytest.raises(IndexError, match=f"target {bad} is out of range"):
            fn(logits, target, -100, 0.0, np.empty(3, F32), np.empty(3))
    for fn in (ref("cross_entropy_backward"), fus("cross_entropy_backward")):
        with pytest.raises(IndexError):
            fn(logits, target, np.zeros(3), -100, 0.0, 1.0, np.empty((3, 5), F32))
    for fn in (ref("cross_entropy_forward"), fus("cross_entropy_forward")):
        assert fn(np.zeros((0, 5), F32), np.zeros(0, np.int64), -100, 0.0, np.empty(0, F32), np.empty(0)) == 0
        assert fn(logits, np.full(3, -100), -100, 0.0, np.empty(3, F32), np.empty(3)) == 0


# ---------------------------------------------------------------- dropout

@given(seed=st.integers(0, 2**64 - 1), p=st.floats(1e-6, 1 - 1e-6), start=st.integers(0, 2**40),
       n=st.integers(0, 300))
@HYP
def test_dropout_twins_agree_for_any_seed_p_and_start(seed, p, start, n):
    threshold = keep_threshold(p)
    x = np.linspace(-2, 2, n).astype(F32)
    x[: min(n, 3)] = [np.nan, np.inf, -np.inf][: min(n, 3)]
    scale = F32(1) / F32(1 - p)
    outs = []
    for fn in (ref("dropout_apply"), fus("dropout_apply")):
        o = np.empty_like(x)
        fn(x, o, seed, threshold, scale, start)
        outs.append(o)
        y = x.copy()
        fn(y, y, seed, threshold, scale, start)  # out is x
        np.testing.assert_array_equal(y, o)
    np.testing.assert_array_equal(outs[0], outs[1])
    # a chunk at `start` is the whole mask's slice
    whole = keep_mask_reference(seed, start + n, threshold)[start:] if start < 5000 else None
    if whole is not None:
        np.testing.assert_array_equal(keep_mask_reference(seed, n, threshold, start), whole)


@pytest.mark.parametrize("dt", DTYPES)
def test_dropout_op_p0_identity_and_seed_determinism(dt):
    from tensorarena import tensor
    from tensorarena.ops.nn_ops import dropout

    x = np.random.default_rng(5).standard_normal((4, 33)).astype(dt)
    a = tensor(x)
    assert dropout(a, 0.0) is a
    r1 = dropout(tensor(x), 0.3, rng=np.random.default_rng(9)).data.copy()
    r2 = dropout(tensor(x), 0.3, rng=np.random.default_rng(9)).data.copy()
    np.testing.assert_array_equal(r1, r2)
    seed = np.random.default_rng(9).integers(0, 2**64, dtype=np.uint64)
    keep = keep_mask_reference(int(seed), x.size, keep_threshold(0.3)).reshape(x.shape)
    np.testing.assert_array_equal(r1, np.where(keep, x * (dt(1) / dt(0.7)), 0))


# Regression (fixed): dropout(p=1) fills its output (and gradient) with zeros, so a NaN or inf input comes out 0; torch
# computes input * 0 there (aten Dropout.cpp), NaN for NaN and inf, as this module's own p < 1 path does ("a dropped NaN
# or inf becomes NaN, as x * 0 makes it"). ops/nn_ops.py:36 (out.fill(0)) and :48 (ga.fill(0)). Fixed: both multiply by
# 0.
def test_dropout_p1_propagates_nan_like_torch():
    from tensorarena import tensor
    from tensorarena.ops.nn_ops import dropout

    x = np.array([np.nan, np.inf, 1.0], F32)
    with torch.no_grad():
        want = F.dropout(torch.tensor(x), p=1.0, training=True).numpy()
    got = dropout(tensor(x), 1.0, rng=np.random.default_rng(0)).data
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- embedding_backward

@pytest.mark.parametrize("dt", DTYPES)
def test_embedding_backward_bounds_repeats_and_views(dt):
    rng = np.random.default_rng(6)
    V, d = 5, 4
    ids = np.array([0, V - 1, 0, 2, V - 1, -1, 0])  # class bounds, repeats, a negative (NumPy wraps it)
    g = np.asfortranarray(rng.standard_normal((ids.size, d)).astype(dt))
    outs = []
    for fn in (ref("embedding_backward"), fus("embedding_backward")):
        gw = np.full((V, d), 7, dt)
        fn(ids, g, gw)
        outs.append(gw)
    np.testing.assert_array_equal(outs[0], outs[1])  # same adds in the same order
    for fn in (ref("embedding_backward"), fus("embedding_backward")):
        gw = np.full((V, d), 7, dt)
        fn(np.zeros(0, np.int64), np.zeros((0, d), dt), gw)
        assert np.all(gw == 0)


# Regression (fixed): embedding_backward's fused twin never checks ids: an id == num_embeddings makes the reference
# (np.add.at) raise IndexError, while the Numba loop (no bounds check) adds the row past the end of gw, silently writing
# memory it does not own (here: the guard row of a larger buffer). embedding.py:30. Fixed: the loop checks each id and
# the wrapper raises IndexError, as cross_entropy does for its targets.
def test_embedding_backward_out_of_range_id_raises_like_the_reference():
    for fn in (ref("embedding_backward"), fus("embedding_backward")):
        buf = np.zeros((4, 3))
        gw = buf[:3]
        with pytest.raises(IndexError):
            fn(np.array([3]), np.ones((1, 3)), gw)
        assert np.all(buf[3] == 0)


# ---------------------------------------------------------------- attention

SLICES = ("attention_slices", "mkl")


def _attn(impl, q, k, v, pad, causal, dropout=None, scale=None):
    fwd, bwd = kernels.kernel("attention_forward", impl), kernels.kernel("attention_backward", impl)
    B, H, T, _ = q.shape
    S, hv = k.shape[2], v.shape[3]
    out, probs = np.full((B, H, T, hv), 7, q.dtype), np.full((B, H, T, S), 7, q.dtype)
    fwd(q, k, v, pad, causal, scale, out, probs, dropout)
    g = np.random.default_rng(7).standard_normal(out.shape).astype(q.dtype)
    dq, dk, dv = np.full_like(q, 7), np.full_like(k, 7), np.full_like(v, 7)
    bwd(q, k, v, probs, g, scale, dq, dk, dv, dropout)
    return out, probs, dq, dk, dv


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", [
    # (B, H, T, S, causal, padding) -- B*H < threads, causal with T = 1, fully masked batch rows
    (1, 1, 1, 1, True, "none"), (1, 1, 1, 3, True, "none"), (1, 1, 4, 4, True, "all"), (3, 1, 3, 3, False, "first"),
    (2, 3, 5, 5, True, "first"),
])
@pytest.mark.parametrize("dropout", [None, (1234567, keep_threshold(0.3), 1 / 0.7)])
def test_attention_edges_match_reference(dt, case, dropout):
    B, H, T, S, causal, padding = case
    rng = np.random.default_rng(8)
    packed = rng.standard_normal((B, max(T, S), 3, H, 4)).astype(dt)  # (B, T, 3, H, hs): strided heads
    q = packed[:, :T, 0].transpose(0, 2, 1, 3)
    k = packed[:, :S, 1].transpose(0, 2, 1, 3)[..., ::-1, :]  # negative stride over keys
    v = packed[:, :S, 2].transpose(0, 2, 1, 3)
    pad = None if padding == "none" else np.zeros((B, S), bool)
    if padding == "all":
        pad[:] = True
    elif padding == "first":
        pad[0] = True
        if B > 1:
            pad[1, -1] = True
    drop = None if dropout is None else (dropout[0], dropout[1], dt(dropout[2]))
    want = _attn("reference", q, k, v, pad, causal, drop)
    before = kernels.calls[SLICES]
    got = _attn("fused", q, k, v, pad, causal, drop)
    if G._mkl is not None and S > 0:
        assert kernels.calls[SLICES] == before + 2
    tol = dict(rtol=1e-12, atol=1e-12) if dt is F64 else dict(rtol=2e-5, atol=2e-6)  # GEMM sum order in float32
    for name, a, b in zip(["out", "probs", "dq", "dk", "dv"], want, got):
        close(a, b, tol, name)
    if padding == "all":
        assert np.all(got[0] == 0) and np.all(got[1] == 0) and np.all(got[2] == 0)
    if dropout is None and padding != "all" and S > 0:  # torch, its boolean mask True = attend
        tq, tk, tv = (torch.tensor(np.ascontiguousarray(a).astype(F64)) for a in (q, k, v))
        attn_mask = None
        if pad is not None:
            attn_mask = torch.tensor(~pad)[:, None, None, :]
        if causal:
            tri = torch.ones(T, S, dtype=torch.bool).tril()
            attn_mask = tri if attn_mask is None else attn_mask & tri
        with torch.no_grad():
            o = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=attn_mask).numpy()
        rows = np.ones(o.shape[:3], bool) if pad is None else ~pad.all(axis=1)[:, None, None].repeat(H, 1).repeat(T, 2)
        close(got[0][rows], o[rows], dict(rtol=1e-5, atol=1e-6) if dt is F32 else dict(rtol=1e-10, atol=1e-12))


# Regression (fixed): attention_backward's fused twin crashes with ZeroDivisionError when there are no keys (S = 0):
# such arrays are empty, so attention_heads.usable() sends them to the batched path, whose _softmax_grad does
# p.reshape(-1, s) with s = 0 (attention.py:171). The forward handles S = 0 (out = 0), the reference backward returns
# zeros, and softmax_backward_fused guards `if y.size == 0: return`. Fixed: the fused backward returns zero gradients at
# once when P is empty.
@pytest.mark.parametrize("dt", DTYPES)
def test_attention_backward_with_no_keys(dt):
    q = np.ones((1, 2, 3, 4), dt)
    k, v = np.ones((1, 2, 0, 4), dt), np.ones((1, 2, 0, 5), dt)
    want = _attn("reference", q, k, v, None, False)
    got = _attn("fused", q, k, v, None, False)
    for a, b in zip(want, got):
        close(a, b, TOL[dt])


# ---------------------------------------------------------------- gemm, its routes and jobs

def _gemm_both(a, b, out_fn, accumulate=False):
    res = []
    for fn in (ref("gemm"), fus("gemm")):
        o = out_fn()
        fn(a, b, o, accumulate)
        res.append(o)
    return res


@needs_mkl
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("m,k,n", [(0, 3, 4), (3, 0, 4), (3, 4, 0), (1, 1, 1), (1, 5, 1), (1, 7, 9), (9, 7, 1)])
@pytest.mark.parametrize("layout", ["c", "f", "neg"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_degenerate_shapes_and_layouts(dt, m, k, n, layout, accumulate):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    mk = {"c": lambda r, c: rng.standard_normal((r, c)).astype(dt),
          "f": lambda r, c: np.asfortranarray(rng.standard_normal((r, c)).astype(dt)),
          "neg": lambda r, c: rng.standard_normal((r, c)).astype(dt)[::-1, ::-1]}[layout]
    a, b = mk(m, k), mk(k, n)
    base = rng.standard_normal((m, n)).astype(dt)
    r, f = _gemm_both(a, b, lambda: base.copy(), accumulate)
    close(r, f, dict(rtol=1e-12, atol=1e-12) if dt is F64 else dict(rtol=1e-5, atol=1e-5))


@needs_mkl
@pytest.mark.parametrize("dt", DTYPES)
def test_gemm_routes_at_their_thresholds(dt, library):
    threads = numba.get_num_threads()
    split, band = gemm_jobs.SPLIT_MIN_MACS, gemm_jobs.BAND
    threaded = route_on(library, "mkl_threads")  # what is not cut by columns: MKL's threads, or OpenBLAS's rows
    cases = [  # (m, k, n, route)
        (8, split // (8 * 64) - 1, 64, "one_core"),  # just under SPLIT_MIN_MACS
        (8, split // (8 * 64), 64, "column_cut" if threads >= 2 else threaded),  # exactly at it
        (64, split // (64 * (2 * band - 1)) + 1, 2 * band - 1, threaded),  # n < 2 * BAND: no cut
        (16, 512, 2 * band + 3, "column_cut" if threads >= 2 else threaded),  # n not a multiple of BAND
        (40, 256, 33, threaded),  # tall: n <= m
    ]
    rng = np.random.default_rng(9)
    for m, k, n, route in cases:
        assert (gemm_jobs.macs((0, 0, m, n, k)) < split) == (route == "one_core")
        a = rng.standard_normal((k, m)).astype(dt).T  # transposed operand
        b = rng.standard_normal((k, n)).astype(dt)
        out0 = rng.standard_normal((m, n)).astype(dt)
        for accumulate in (False, True):
            before = kernels.calls[("gemm_route", route)]
            r, f = _gemm_both(a, b, lambda: out0.copy(), accumulate)
            assert kernels.calls[("gemm_route", route)] == before + 1, (m, k, n, route)
            close(r, f, dict(rtol=1e-12, atol=1e-12) if dt is F64 else dict(rtol=1e-5, atol=1e-5 * np.sqrt(k)))
            prepared = G.prepare_gemm_mkl(a, b, o := out0.copy(), accumulate)
            before = kernels.calls[("gemm_route", route)]
            prepared()
            assert kernels.calls[("gemm_route", route)] == before + 1
            close(r, o, dict(rtol=1e-12, atol=1e-12) if dt is F64 else dict(rtol=1e-5, atol=1e-5 * np.sqrt(k)))


@given(n=st.integers(1, 400), parts=st.integers(1, 5))
@HYP
def test_column_bands_tile_the_columns_exactly(n, parts):
    job = (111, 111, 3, n, 4, 1000, 4, 2000, n, 3000, n, 0)
    bands = gemm_jobs.column_bands(job, parts, 4)
    cols = []
    for bj in bands:
        lo = (bj[9] - 3000) // 4
        assert bj[7] == 2000 + lo * 4 and bj[3] > 0
        cols.extend(range(lo, lo + bj[3]))
    assert cols == list(range(n))
    assert len(bands) <= max(1, min(parts, n // gemm_jobs.BAND))


# Regression (fixed): gemm's fused (MKL) twin raises ValueError when out aliases an operand, with or without accumulate,
# where its twin np.matmul (which buffers overlapping operands) returns out = a @ b or out += a @ b. gemm.py:167
# (_product_job) raises instead of copying the overlapping operand (as _blas_view already copies operands BLAS cannot
# read in place). Fixed: _product_job reads an operand out overlaps from an arena copy.
@needs_mkl
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_out_aliasing_an_operand(accumulate):
    a = np.arange(9.0).reshape(3, 3) / 7
    b = np.arange(9.0)[::-1].reshape(3, 3).copy() / 5
    want = a @ b + (a if accumulate else 0)
    res = []
    for fn in (ref("gemm"), fus("gemm")):
        x = a.copy()
        fn(x, b, x, accumulate)  # out is a
        res.append(x)
    close(res[0], want, TOL[F64])
    close(res[1], want, TOL[F64])


# Regression (fixed): gemm's fused twin refuses a one-row out whose row stride is 0 (out = y[None, :] over a 1-D y:
# NumPy gives a new axis stride 0): _slice_layout (gemm.py:119) wants s0 > 0 even when there is one row, so
# _row_major_ld raises "must be row-major rows"; np.matmul writes it. With one row any ld >= n is valid. Fixed:
# _slice_layout takes any row stride for one row (ld = n).
@needs_mkl
def test_gemm_one_row_out_with_zero_row_stride():
    a, b = np.ones((1, 3), F32), np.arange(15, dtype=F32).reshape(3, 5)
    y = np.empty(5, F32)
    fus("gemm")(a, b, y[None, :])
    np.testing.assert_array_equal(y, (a @ b)[0])


# ---------------------------------------------------------------- bfloat16 rounding and products

def _bf16_torch(x):
    return torch.tensor(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_to_bfloat16_round_to_nearest_even_like_torch():
    bits = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                     0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x80000000, 0x7F7F8000,
                     0x7FC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF], np.uint32)
    x = bits.view(F32)
    want = _bf16_torch(x)
    nan = np.isnan(x)
    for fn in (ref("to_bfloat16"), fus("to_bfloat16")):
        got = fn(x, np.empty(x.shape, np.uint16))
        np.testing.assert_array_equal(got[~nan], want[~nan])
        assert np.all((got[nan] & 0x7F80) == 0x7F80) and np.all(got[nan] & 0x7F)  # NaN stays NaN
        assert np.all((got[nan] & 0x40) != 0)  # quiet


@given(seed=st.integers(0, 2**32 - 1), shape=st.sampled_from([(0,), (1,), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 5)]),
       view=st.sampled_from(["c", "t", "neg"]))
@HYP
def test_to_bfloat16_twins_on_views(seed, shape, view):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    x = bits.view(F32)
    if view == "t":
        x = x.T
    elif view == "neg":
        x = x[(slice(None, None, -1),) * x.ndim]
    before = kernels.calls[("to_bfloat16", "fused")]
    a = ref("to_bfloat16")(x, np.empty(x.shape, np.uint16))
    b = fus("to_bfloat16")(x, np.empty(x.shape, np.uint16))
    assert kernels.calls[("to_bfloat16", "fused")] == before + 1
    np.testing.assert_array_equal(a, b)
    finite = np.isfinite(x)
    np.testing.assert_array_equal(b[finite], _bf16_torch(x.copy())[finite])


@pytest.mark.skipif("fused" not in kernels.implementations("gemm_bf16"), reason="no MKL bf16 GEMM here")
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 64, 3), (17, 33, 40), (5, 0, 3)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_bf16_twins_and_float32_within_bf16_tolerance(m, k, n, accumulate):
    rng = np.random.default_rng(m + k + n)
    a32, b32 = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((n, k)).astype(F32).T
    a16 = ref("to_bfloat16")(a32, np.empty(a32.shape, np.uint16))
    b16 = fus("to_bfloat16")(b32, np.empty(b32.shape, np.uint16))  # a transposed view
    base = rng.standard_normal((m, n)).astype(F32)
    res = []
    for fn in (ref("gemm_bf16"), fus("gemm_bf16")):
        o = base.copy()
        fn(a16, b16, o, accumulate)
        res.append(o)
    # same bfloat16 operands, float32 sums: only the sum order differs
    close(res[0], res[1], dict(rtol=1e-5, atol=1e-6 * max(k, 1)))
    # against the unrounded float32 product: each operand off by <= 2^-8 relative (8 significant bits,
    # round to nearest), so |error| <= (2 * 2^-8 + 2^-16) * sum |a||b| (plus float32 sums)
    exact = a32.astype(F64) @ b32.astype(F64) + (base if accumulate else 0)
    bound = (2 * 2.0**-8 + 2.0**-16) * (np.abs(a32).astype(F64) @ np.abs(b32).astype(F64)) + 1e-5
    assert np.all(np.abs(res[1] - exact) <= bound)


# ---------------------------------------------------------------- optimizers

def _opt_pair(name, n, dt, state_count, seed=0, **kw):
    """Run the reference and fused `name` on identical arrays; returns their (param, *state) after the step."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(n).astype(dt)
    g = rng.standard_normal(n).astype(dt)
    states = [np.abs(rng.standard_normal(n)).astype(dt) for _ in range(state_count)]
    return p, g, states


def _run_opt(name, p, g, states, **kw):
    out = []
    for fn in (ref(name), fus(name)):
        pp, ss = p.copy(), [s.copy() if s is not None else None for s in states]
        fn(pp, g, *ss, **kw)
        out.append([pp] + [s for s in ss if s is not None])
    return out


def _close_opt(out, dt, rtol=None):
    tol = dict(rtol=rtol or (1e-12 if dt is F64 else 1e-6), atol=1e-30)
    for a, b in zip(*out):
        close(a, b, tol)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 3])
def test_optimizers_twins_small_sizes(dt, n):
    p, g, s = _opt_pair("x", n, dt, 3)
    _close_opt(_run_opt("sgd", p, g, [s[0]], lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=True,
                        maximize=False, first_step=False), dt)
    _close_opt(_run_opt("adam", p, g, [s[0], s[1], s[2]], step=3, lr=1e-2, weight_decay=0.1,
                        decoupled_weight_decay=True), dt)
    _close_opt(_run_opt("nadam", p, g, [s[0], s[1]], step=3, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
                        weight_decay=0.1, mu=0.9, mu_next=0.91, mu_product=0.7), dt)
    _close_opt(_run_opt("rmsprop", p, g, [s[0] + 1, s[1] * 0.1, s[2]], lr=1e-2, alpha=0.99, eps=1e-8,
                        weight_decay=0.1, momentum=0.9), dt)
    _close_opt(_run_opt("adagrad", p, g, [s[0]], step=3, lr=1e-2, lr_decay=0.1, weight_decay=0.1, eps=1e-10), dt)
    _close_opt(_run_opt("lion", p, g, [s[0]], lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1, maximize=True), dt)
    _close_opt(_run_opt("lamb", p, g, [s[0], s[1]], step=3, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6,
                        weight_decay=0.01), dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_optimizers_with_beta_below_half_follow_torchs_two_sided_lerp(dt):
    # beta1 (alpha) < 0.5: torch's lerp takes its `end - (end - start) * (1 - w)` branch; nadam and rmsprop do
    p, g, s = _opt_pair("x", 5, dt, 3)
    s[0][:] = 1e8  # |m| >> |g|: the one-sided formula m + w (g - m) loses g entirely
    _close_opt(_run_opt("nadam", p, g, [s[0], s[1]], step=2, lr=1e-2, beta1=0.0, beta2=0.999, eps=1e-8,
                        weight_decay=0.0, mu=0.5, mu_next=0.5, mu_product=0.25), dt)
    _close_opt(_run_opt("rmsprop", p, g, [s[1] + dt(4e16), s[0], None], lr=1e-2, alpha=0.2, eps=1e-8,
                        weight_decay=0.0, momentum=0.0), dt)


# Regression (fixed): adam's fused twin always computes m + (1 - beta1) * (g - m), the low branch of torch's lerp, where
# the reference (and torch's exp_avg.lerp_(g, 1 - beta1)) takes g - (g - m) * beta1 when 1 - beta1 >= 0.5. With beta1 =
# 0 (a common GAN setting) m must be g exactly; the fused twin gives m + (g - m), which is 0 for m = 1e8, g = 1 in
# float32 (and float64 for m = 1e17): wrong moment, wrong step. adam.py:72; nadam.py/rmsprop.py already pass `low` and
# take both branches.
@pytest.mark.parametrize("dt", DTYPES)
def test_adam_beta1_below_half_matches_reference(dt):
    p, g, s = _opt_pair("x", 4, dt, 2)
    g[:] = 1.0
    s[0][:] = 1e8 if dt is F32 else 1e17
    _close_opt(_run_opt("adam", p, g, [s[0], s[1], None], step=2, lr=0.1, beta1=0.0, beta2=0.999), dt)


# Regression (fixed): with AMSGrad, adam's fused twin keeps max_exp_avg_sq when v is NaN (`if vi > vmax[i]` is false for
# NaN), while the reference's np.maximum -- and torch.maximum in torch's Adam -- propagates the NaN into max_exp_avg_sq.
# The state then differs between routes for every later step. adam.py:77-78.
def test_adam_amsgrad_nan_gradient_propagates_into_max_state():
    p, g, s = _opt_pair("x", 3, F64, 3)
    g[0] = np.nan
    out = _run_opt("adam", p, g, s, step=1, lr=0.1, beta1=0.9, beta2=0.999)
    for a, b in zip(*out):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))


# Regression (fixed): adam's fused twin checks only param and grad for C-contiguity; a non-contiguous exp_avg,
# exp_avg_sq or max_exp_avg_sq is flattened by reshape(-1) into a copy, so the kernel updates the copy and the caller's
# moment is silently left unchanged (the reference updates it). adam.py:105; the other optimizer kernels refuse such
# arrays through optim_arrays.flat_views. Fixed: the fused twin refuses them through flat_views too.
def test_adam_fused_non_contiguous_moment_is_updated_or_refused():
    p = np.zeros((3, 4), F32)
    g = np.ones((3, 4), F32)
    m, v = np.asfortranarray(np.zeros((3, 4), F32)), np.zeros((3, 4), F32)
    ref_m, ref_v, ref_p = m.copy(order="F"), v.copy(), p.copy()
    ref("adam")(ref_p, g, ref_m, ref_v, None, step=1, lr=0.1)
    try:
        fus("adam")(p, g, m, v, None, step=1, lr=0.1)
    except ValueError:
        return  # refusing is fine too
    np.testing.assert_allclose(m, ref_m, rtol=1e-6)


@pytest.mark.parametrize("dt", DTYPES)
def test_optimizers_nan_inf_and_zero_gradients(dt):
    p, g, s = _opt_pair("x", 6, dt, 3)
    g[:4] = [np.nan, np.inf, -np.inf, 0.0]
    s[2][:] = s[1]  # AMSGrad max starts at v: no NaN in it either way
    with np.errstate(invalid="ignore", over="ignore"):
        for name, states, kw in [
            ("sgd", [s[0]], dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False,
                                 maximize=False, first_step=True)),
            ("nadam", [s[0], s[1]], dict(step=1, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                                         mu=0.9, mu_next=0.9, mu_product=0.9)),
            ("adagrad", [s[0]], dict(step=1, lr=1e-2, lr_decay=0.0, weight_decay=0.0, eps=1e-10)),
            ("lion", [s[0]], dict(lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.0)),
            ("rmsprop", [s[0], s[1], None], dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0)),
        ]:
            out = _run_opt(name, p, g, states, **kw)
            for a, b in zip(*out):
                close(a, b, dict(rtol=1e-12 if dt is F64 else 1e-6, atol=1e-30), name)


@pytest.mark.parametrize("dt", DTYPES)
def test_lamb_segments_with_empty_and_tiny_segments(dt):
    rng = np.random.default_rng(10)
    n = 9
    p = rng.standard_normal(n).astype(dt)
    p[3:5] = 0  # a zero parameter: trust ratio 1
    g = rng.standard_normal(n).astype(dt)
    g[5:9] = 0
    m, v = np.zeros(n, dt), np.zeros(n, dt)
    m[5:9] = 1e-20  # tiny r: the float32 dot would underflow
    v[5:9] = 1e-30
    seg = np.array([0, 3, 3, 5, 9], np.int64)  # an empty segment
    out = _run_opt("lamb", p, g, [m, v], step=4, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0,
                   segments=seg)
    _close_opt(out, dt, rtol=1e-12 if dt is F64 else 2e-6)  # float32: lr * trust rounded once more in the reference
