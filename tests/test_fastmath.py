"""kernels.fastmath (vectorisable exp, erf, erfc, normal CDF/density) and the fused GELU and softmax
that use it.

Bars, measured over dense grids that include the extremes (float32 "ulp" is the spacing of the
float64 truth rounded to float32; results below the flush threshold, ~1.5x the smallest normal,
must be exactly 0):
  float32  exp <= 2 ulp (measured 1.04), erf <= 2 ulp (1.34), erfc and Phi <= 6 ulp (4.5, 4.7),
           phi <= 3 ulp (2.0);
  float64  exp, erf, erfc, Phi, phi <= 1e-14 relative (measured <= 6e-16).
The fused kernels compute in their input's precision; against their float64 NumPy twins the
GELUs must agree within 2e-6 relative + 5e-7 absolute (float32; ~8 ulp at O(1) values) and 1e-14
relative + 2e-15 absolute (float64), and the exact GELU must match mpmath to 8 float32 ulps /
1e-14 relative down its lower tail, where the references' 1 + erf cancels. Float32 softmax
probabilities must be within (8 + |z - max z|) ulps each (the exp's argument is rounded to
float32 first, as in torch), float64 ones within 1e-14. The kernels are also
checked to compile to packed (ymm/zmm) loops with no libm call and no gather.
"""

from __future__ import annotations

import math
import re

import numba
import numpy as np
import pytest

from tensorarena import kernels
from tensorarena.kernels import fastmath as fm
from tensorarena.kernels import attention, gelu, softmax

JIT = dict(error_model="numpy", fastmath={"contract"})  # the kernels' own flags
F32_ULPS = {"exp": 2.0, "erf": 2.0, "erfc": 6.0, "ndtr": 6.0, "pdf": 3.0}
F64_REL = 1e-14


@numba.njit(**JIT)
def _exp(x, out):
    for i in range(x.shape[0]):
        out[i] = fm.exp(x[i])


@numba.njit(**JIT)
def _erf(x, out):
    for i in range(x.shape[0]):
        out[i] = fm.erf(x[i])


@numba.njit(**JIT)
def _erfc(x, out):
    for i in range(x.shape[0]):
        out[i] = fm.erfc(x[i])


@numba.njit(**JIT)
def _ndtr_pdf(x, cdf, pdf):
    for i in range(x.shape[0]):
        cdf[i], pdf[i] = fm.ndtr_pdf(x[i])


def run(loop, x):
    out = np.empty_like(x)
    loop(x, out)
    return out


def ulps(got: np.ndarray, truth: np.ndarray, dt) -> np.ndarray:
    """|got - truth| in units of the spacing of truth rounded to dt (at least the smallest subnormal)."""
    with np.errstate(over="ignore", under="ignore"):
        spacing = np.spacing(np.abs(truth.astype(dt))).astype(np.float64)
    return np.abs(got.astype(np.float64) - truth) / np.maximum(spacing, np.finfo(dt).smallest_subnormal)


def rel(got: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.float64) - truth) / np.abs(truth)


def flush_floor(dt) -> float:
    return 1.6 * float(np.finfo(dt).tiny)


def grid(lo: float, hi: float, dt, n: int = 1_000_001) -> np.ndarray:
    """Dense linear grid plus both signs of a geometric one down to 1e-30 and the specials."""
    g = np.geomspace(1e-30, max(abs(lo), abs(hi)), 20001)
    x = np.concatenate([np.linspace(lo, hi, n), g, -g, [0.0, -0.0]])
    return x[(x >= lo) & (x <= hi)].astype(dt)


class _LazyMpmath:
    """mpmath (a sympy dependency, so there with torch); only the tests that use it skip without it."""

    def __getattr__(self, name):
        mp = pytest.importorskip("mpmath")
        mp.mp.dps = 40
        return getattr(mp, name)


mpmath = _LazyMpmath()


# ---------------------------------------------------------------- exp

def test_exp_float32():
    x = grid(-120.0, 120.0, np.float32, 2_000_001)
    got = run(_exp, x)
    with np.errstate(over="ignore", under="ignore"):
        truth = np.exp(x.astype(np.float64))
        overflow = truth.astype(np.float32) == np.inf
    normal = (truth >= flush_floor(np.float32)) & ~overflow
    assert ulps(got[normal], truth[normal], np.float32).max() <= F32_ULPS["exp"]
    assert (got[overflow] == np.inf).all()
    assert (got[x < -86.9] == 0).all()  # flushed, never subnormal
    assert got[~normal & ~overflow].max() < 2 * flush_floor(np.float32)


def test_exp_float64():
    x = grid(-760.0, 720.0, np.float64, 2_000_001)
    got = run(_exp, x)
    with np.errstate(over="ignore", under="ignore"):
        truth = np.exp(x)
    normal = (truth >= flush_floor(np.float64)) & (truth < np.inf)
    assert rel(got[normal], truth[normal]).max() <= F64_REL
    assert (got[truth == np.inf] == np.inf).all()
    assert (got[x < -708.0] == 0).all()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_specials(dt):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], dt)
    e, f, c = run(_exp, x), run(_erf, x), run(_erfc, x)
    cdf, pdf = np.empty_like(x), np.empty_like(x)
    _ndtr_pdf(x, cdf, pdf)
    np.testing.assert_array_equal(e, [np.inf, 0.0, np.nan, 1.0, 1.0])
    np.testing.assert_array_equal(f, [1.0, -1.0, np.nan, 0.0, -0.0])
    assert np.signbit(f[4]) and not np.signbit(f[3])  # erf(-0) = -0
    np.testing.assert_array_equal(c, [0.0, 2.0, np.nan, 1.0, 1.0])
    np.testing.assert_array_equal(cdf, [1.0, 0.0, np.nan, 0.5, 0.5])
    np.testing.assert_array_equal(pdf, [0.0, 0.0, np.nan, pdf[3], pdf[3]])
    assert abs(pdf[3] - 1 / math.sqrt(2 * math.pi)) <= 2 * np.finfo(dt).eps


# ---------------------------------------------------------------- erf, erfc

def test_erf_float32():
    x = grid(-12.0, 12.0, np.float32)
    truth = np.array([math.erf(v) for v in x.astype(np.float64).tolist()])
    assert ulps(run(_erf, x), truth, np.float32).max() <= F32_ULPS["erf"]


def test_erf_float64():
    x = grid(-8.0, 8.0, np.float64, 400_001)
    truth = np.array([math.erf(v) for v in x.tolist()])
    nonzero = truth != 0
    assert rel(run(_erf, x)[nonzero], truth[nonzero]).max() <= F64_REL
    assert (run(_erf, x)[~nonzero] == 0).all()


def test_erfc_float32():
    x = grid(-10.0, 10.0, np.float32)
    truth = np.array([math.erfc(v) for v in x.astype(np.float64).tolist()])  # libm's is fine to float32
    got = run(_erfc, x)
    kept = x <= np.float32(8.95)  # erfc(8.95) = 1.6e-36: flushed beyond
    assert ulps(got[kept], truth[kept], np.float32).max() <= F32_ULPS["erfc"]
    assert (got[~kept] == 0).all()


def test_erfc_float64_against_mpmath():
    x = np.concatenate([np.linspace(-6.0, 26.5, 6001), np.geomspace(1e-12, 0.75, 200)])
    truth = np.array([float(mpmath.erfc(v)) for v in x.tolist()])
    assert rel(run(_erfc, x), truth).max() <= F64_REL


def test_ndtr_pdf_float32():
    x = grid(-14.0, 9.0, np.float32)
    cdf, pdf = np.empty_like(x), np.empty_like(x)
    _ndtr_pdf(x, cdf, pdf)
    x64 = x.astype(np.float64)
    truth = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x64.tolist()])  # float64 x / sqrt2: exact enough
    kept = x >= -np.float32(8.95 * math.sqrt(2.0))  # Phi(-12.66) = 5e-37: flushed below
    assert ulps(cdf[kept], truth[kept], np.float32).max() <= F32_ULPS["ndtr"]
    assert (cdf[~kept] == 0).all()
    with np.errstate(under="ignore"):
        dens = np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)  # x64 * x64 is exact for float32 x
    assert ulps(pdf[kept], dens[kept], np.float32).max() <= F32_ULPS["pdf"]
    assert (pdf[~kept] == 0).all()


def test_ndtr_pdf_float64_against_mpmath():
    x = np.concatenate([np.linspace(-37.4, 9.0, 6001), np.geomspace(1e-12, 1.1, 200) * -1])
    cdf, pdf = np.empty_like(x), np.empty_like(x)
    _ndtr_pdf(x, cdf, pdf)
    assert rel(cdf, np.array([float(mpmath.ncdf(v)) for v in x.tolist()])).max() <= F64_REL
    assert rel(pdf, np.array([float(mpmath.npdf(v)) for v in x.tolist()])).max() <= F64_REL


def test_generic_names_promote_integers_and_refuse_python_calls():
    @numba.njit(**JIT)
    def f(i):
        return fm.exp(i), fm.erf(i)

    assert f(1) == pytest.approx((math.e, math.erf(1.0)), rel=1e-15)
    with pytest.raises(TypeError, match="Numba-compiled"):
        fm.exp(1.0)


# ---------------------------------------------------------------- fused GELU and softmax vs the reference twins

# float32: 5e-7 is ~8 ulp at O(1) values (gelu' crosses zero near -0.75, so no relative bar there);
# 2e-6 relative covers float32 exp's argument amplification in the tanh form's left tail
# (exp(-2u) at -2u ~ 17: 17 x 6e-8). float64: the reference's own 1 + erf(x / sqrt2) cancels in
# the lower tail to ~1e-16 absolute (the fused twin does not: see the mpmath test below).
GELU_TOL = {np.float32: dict(rtol=2e-6, atol=5e-7), np.float64: dict(rtol=F64_REL, atol=2e-15)}


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_fused_matches_reference_densely(dt, approximate):
    x = np.concatenate([np.linspace(-45.0, 45.0, 300_001), np.geomspace(1e-30, 1.0, 2001),
                        -np.geomspace(1e-30, 1.0, 2001)]).astype(dt)
    g = np.ones_like(x)
    outs = {}
    for impl in ("reference", "fused"):
        y, dy = np.empty_like(x), np.empty_like(x)
        kernels.kernel("gelu_forward", impl)(x, y, approximate)
        kernels.kernel("gelu_backward", impl)(x, g, dy, approximate)
        outs[impl] = y, dy
    with np.errstate(under="ignore"):
        for ref, fus, what in zip(outs["reference"], outs["fused"], ("forward", "backward")):
            np.testing.assert_allclose(fus, ref, **GELU_TOL[dt], err_msg=f"{what}, {approximate}")


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_fused_matches_reference(dt, approximate):
    rng = np.random.default_rng(7)
    x, b, g = (rng.standard_normal(s).astype(dt) * 3 for s in ((67, 96), (96,), (67, 96)))
    outs = {}
    for impl in ("reference", "fused"):
        pre, y, dx, db = np.empty_like(x), np.empty_like(x), np.empty_like(x), np.empty_like(b)
        kernels.kernel("bias_gelu_forward", impl)(x, b, pre, y, approximate)
        kernels.kernel("bias_gelu_backward", impl)(pre, g, dx, db, approximate)
        outs[impl] = pre, y, dx, db
    with np.errstate(under="ignore"):
        for ref, fus in zip(outs["reference"][:3], outs["fused"][:3]):
            np.testing.assert_allclose(fus, ref, **GELU_TOL[dt])
        # dbias: 67 terms of size ~3, each within the bar above
        np.testing.assert_allclose(outs["fused"][3], outs["reference"][3], rtol=GELU_TOL[dt]["rtol"],
                                   atol=67 * 3 * GELU_TOL[dt]["atol"])


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_gelu_lower_tail_keeps_relative_accuracy(dt):
    # gelu(x) = x Phi(x) through erfc: no 1 + erf cancellation, so tiny outputs stay accurate
    # (an erf with 3e-7 absolute error gave 1e-4 relative at x = -3 and failed the ViT parity test).
    x = -np.geomspace(0.5, 12.5 if dt == np.float32 else 37.0, 400).astype(dt)
    y, dy = np.empty_like(x), np.empty_like(x)
    kernels.kernel("gelu_forward", "fused")(x, y, "none")
    kernels.kernel("gelu_backward", "fused")(x, np.ones_like(x), dy, "none")
    xs = [mpmath.mpf(float(v)) for v in x]
    truth = np.array([float(v * mpmath.ncdf(v)) for v in xs])
    dtruth = np.array([float(mpmath.ncdf(v) + v * mpmath.npdf(v)) for v in xs])
    bar = 8 * np.finfo(np.float32).eps if dt == np.float32 else F64_REL
    assert rel(y, truth).max() <= bar
    far = x < -1.5  # away from gelu's zero crossing near -0.75
    assert rel(dy[far], dtruth[far]).max() <= bar


SOFTMAX_TOL = {np.float32: dict(rtol=3e-6, atol=1e-30), np.float64: dict(rtol=F64_REL, atol=1e-290)}


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("mask_dtype", [None, np.float32, np.float64])
def test_softmax_fused_matches_reference(dt, mask_dtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2, 3, 37, 197)) * 4).astype(dt)
    mask = None
    if mask_dtype is not None:
        mask = np.where(rng.random((2, 1, 1, 197)) < 0.2, -np.inf, 0.0).astype(mask_dtype)
        mask[1, ..., :] = -np.inf  # a fully masked batch element
    g = rng.standard_normal(x.shape).astype(dt)
    outs = {}
    for impl in ("reference", "fused"):
        y, dx = np.empty_like(x), np.empty_like(x)
        kernels.kernel("softmax_forward", impl)(x, mask, y)
        kernels.kernel("softmax_backward", impl)(y, g, dx)
        outs[impl] = y, dx
    with np.errstate(under="ignore"):
        np.testing.assert_allclose(outs["fused"][0], outs["reference"][0], **SOFTMAX_TOL[dt])
        np.testing.assert_allclose(outs["fused"][1], outs["reference"][1],
                                   rtol=SOFTMAX_TOL[dt]["rtol"], atol=1e-6 if dt == np.float32 else 1e-14)
    if dt == np.float32:  # the sharper per-element bar: z - max(z) is rounded to float32 before the exp,
        # which costs |z - max z| ulps of relative error (as in torch); plus a few for exp, sum and scale
        with np.errstate(invalid="ignore"):
            z = x.astype(np.float64) + (0.0 if mask is None else mask)
            zd = np.abs(z - np.max(np.where(np.isneginf(z), -1e300, z), axis=-1, keepdims=True))
        ref, fus = outs["reference"][0].astype(np.float64), outs["fused"][0].astype(np.float64)
        live = ref > 0
        assert (np.abs(fus - ref)[live] <= (8 + zd[live]) * 2.0 ** -24 * ref[live]).all()


def test_softmax_fused_nan_row_stays_nan_and_masked_tail_is_fast_path():
    x = np.zeros((3, 5), np.float32)
    x[1, 2] = np.nan
    x[2, :] = -np.inf
    y = np.empty_like(x)
    kernels.kernel("softmax_forward", "fused")(x, None, y)
    np.testing.assert_allclose(y[0], 0.2, rtol=1e-7)
    assert np.isnan(y[1]).all() and (y[2] == 0).all()


# ---------------------------------------------------------------- the loops really vectorise

_LIBM = re.compile(r"call [^@]*@(?:numba_)?(?:exp|expf|erf|erff|erfc|erfcf|tanh|tanhf)\b")
_PACKED = re.compile(r"\bv\w+p[sd]\s[^\n]*%[yz]mm")


def _asm_and_ir(dispatcher, *args, **flags):
    fn = numba.njit(**flags)(dispatcher.py_func if hasattr(dispatcher, "py_func") else dispatcher)
    fn(*args)
    sig = fn.signatures[0]
    return fn.inspect_asm(sig), fn.inspect_llvm(sig)


@pytest.mark.parametrize("loop", [_exp, _erf, _erfc])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_function_loops_are_packed_and_call_no_libm(loop, dt):
    x = np.linspace(-3, 3, 64).astype(dt)
    asm, llvm = _asm_and_ir(loop, x, np.empty_like(x), **JIT)
    assert not _LIBM.search(llvm)
    suffix = "ps" if dt == np.float32 else "pd"
    assert len([m for m in _PACKED.findall(asm) if suffix in m.split()[0]]) >= 20


def _kernel_flags(dispatcher):
    opts = dict(dispatcher.targetoptions)
    return dict(parallel=opts.get("parallel", False), error_model=opts["error_model"], fastmath=opts["fastmath"])


def _kernel_cases():
    x = np.linspace(-3, 3, 64 * 48).astype(np.float32).reshape(64, 48)
    flat = x.reshape(-1)
    # Each GELU kernel has an erf and a tanh form (kernels/gelu.py says why): both must be packed.
    gelu_args = {
        "forward": (flat, flat.copy()),
        "backward": (flat, flat, flat.copy()),
        "bias_forward": (x, x[0].copy(), x.copy(), x.copy()),
        "bias_backward": (x, x, x.copy(), np.zeros((2, 48)), 2),
        "bias_backward_recompute": (x, x.copy(), x.copy(), np.zeros((2, 48)), 2),
        "bias_forward_with_grad": (x, x[0].copy(), x.copy(), x.copy()),
    }
    m, lead_shape, lead_stride, last = softmax._mask_layout(x.reshape(4, 16, 48), np.zeros((4, 1, 48), np.float32))
    return {
        **{f"gelu._{kernel}_{form}": (getattr(gelu, f"_{kernel}_{form}"), args)
           for form in ("erf", "tanh") for kernel, args in gelu_args.items()},
        "gelu._backward_stored": (gelu._backward_stored, (x, x.copy(), np.zeros((2, 48)), 2)),
        "softmax._forward": (softmax._forward, (x, m, True, lead_shape, lead_stride, last, x.copy(), 8)),
        "softmax._exp_normalise": (softmax._exp_normalise, (x[0], x[1].copy(), x[0, 0])),
        "softmax._exp_fma_normalise": (softmax._exp_fma_normalise, (x[0].copy(), np.float32(0.125), np.float32(-1))),
        "attention._masked_softmax": (attention._masked_softmax,
                                      (x.reshape(2, 2, 16, 48).copy(), np.zeros((2, 48), bool), True, True, 0.125, 8)),
    }


@pytest.mark.parametrize("name", sorted(_kernel_cases()))
def test_fused_kernels_are_packed_without_libm_or_gathers(name):
    dispatcher, args = _kernel_cases()[name]
    asm, llvm = _asm_and_ir(dispatcher, *args, **_kernel_flags(dispatcher))
    assert not _LIBM.search(llvm), name
    assert "gather" not in asm and "scatter" not in asm, name
    assert len([m for m in _PACKED.findall(asm) if "ps" in m.split()[0]]) >= 20, name
