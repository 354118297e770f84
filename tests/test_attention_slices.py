"""kernels.attention_heads: attention a (batch, head) slice at a time, MKL's GEMMs called from Numba.

The fused attention kernels take this path whenever MKL is the GEMM backend; without MKL they keep
the batched one. Both are checked against the NumPy reference twin here, and against each other.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from tensorarena import kernels
from tensorarena.kernels import attention, attention_heads, gemm
from tests.gemm_libraries import LIBRARIES, library  # noqa: F401 - library is a fixture

pytestmark = pytest.mark.skipif(not gemm.mkl_symbols_loaded(), reason="MKL (the mkl wheel) is not installed")

TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}
SLICES = ("attention_slices", "mkl")


def _inputs(dt, b, h, t, s, hs, hv, packed, seed=0):
    rng = np.random.default_rng(seed)
    if packed:  # ops.packed_self_attention's layout: strided views of one (B, T, 3, H, hs) projection
        x = rng.standard_normal((b, t, 3, h, hs)).astype(dt)
        q, k, v = (x[:, :, j].transpose(0, 2, 1, 3) for j in range(3))
    else:
        q = rng.standard_normal((b, h, t, hs)).astype(dt)
        k = rng.standard_normal((b, h, s, hs)).astype(dt)
        v = rng.standard_normal((b, h, s, hv)).astype(dt)
    g = rng.standard_normal((b, h, t, v.shape[-1])).astype(dt)
    pad = rng.random((b, s)) < 0.3
    pad[:, 0] = False
    return q, k, v, g, pad


def _run(impl, q, k, v, g, pad, causal, dropout):
    b, h, t, _ = q.shape
    out = np.empty((b, t, h, v.shape[-1]), q.dtype).transpose(0, 2, 1, 3)  # ops' (B, T, H, hv) output view
    probs = np.empty((b, h, t, k.shape[2]), q.dtype)
    kernels.kernel("attention_forward", impl)(q, k, v, pad, causal, None, out, probs, dropout)
    grads = [np.empty(a.shape, a.dtype) for a in (q, k, v)]
    kernels.kernel("attention_backward", impl)(q, k, v, probs, g, None, *grads, dropout)
    return [out, probs, *grads]


CASES = {  # (B, H, T, S, hs, hv, packed, padding, causal, dropout)
    "vit-like packed": (2, 3, 17, 17, 8, 8, True, False, False, False),
    "padding and causal": (2, 2, 9, 9, 4, 4, True, True, True, False),
    "dropout": (2, 3, 11, 11, 8, 8, True, True, False, True),
    "one slice": (1, 1, 13, 13, 8, 8, False, False, False, False),
    "cross shapes": (3, 1, 5, 12, 4, 6, False, True, False, True),
}


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_slices_match_the_reference_twin_and_the_slice_path_ran(dt, case, library):
    b, h, t, s, hs, hv, packed, padding, causal, dropout = CASES[case]
    q, k, v, g, pad = _inputs(dt, b, h, t, s, hs, hv, packed)
    pad = pad if padding else None
    drop = (987654321, 2**32 // 5, 1.25) if dropout else None
    ref = _run("reference", q, k, v, g, pad, causal, drop)
    before, on_library = kernels.calls[SLICES], kernels.calls[("attention_library", library)]
    ours = _run("fused", q, k, v, g, pad, causal, drop)
    assert kernels.calls[SLICES] == before + 2  # forward and backward both took the slice path
    assert kernels.calls[("attention_library", library)] == on_library + 2  # their products on this library
    for name, a, r in zip(("out", "probs", "dq", "dk", "dv"), ours, ref):
        np.testing.assert_allclose(a, r, **TOL[dt], err_msg=name)


@pytest.mark.parametrize("path", ["slices", "batched"])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [0.3, 40.0, -0.5, 0.0])
def test_any_scale_with_masks_matches_the_reference_twin(dt, scale, path, monkeypatch):
    # softmax_row (both paths use it) folds a positive scale into its exp pass (max of the raw scores
    # times the scale); zero and negative scales take the multiply-first branch, where a -inf mask must
    # stay -inf. 40 makes raw exp(scale * score) overflow float32: the max must be taken after the scale.
    # Checked once (with kernels/__pycache__/attention._masked_softmax* deleted, see softmax_row): folding
    # every scale fails the 0 and -0.5 cases on both paths; no max subtraction fails at 40.
    q, k, v, g, pad = _inputs(dt, 2, 2, 9, 9, 4, 4, True, seed=3)
    ref = _run_scaled("reference", q, k, v, g, pad, scale)
    if path == "batched":
        monkeypatch.setattr(attention_heads, "usable", lambda *arrays: False)
    before = kernels.calls[SLICES]
    ours = _run_scaled("fused", q, k, v, g, pad, scale)
    assert kernels.calls[SLICES] == before + (2 if path == "slices" else 0)
    for name, a, r in zip(("out", "probs", "dq", "dk", "dv"), ours, ref):
        assert np.isfinite(a).all(), name
        with np.errstate(under="ignore"):  # scale 40 leaves probabilities near float32's smallest normal
            np.testing.assert_allclose(a, r, **TOL[dt], err_msg=name)


def _run_scaled(impl, q, k, v, g, pad, scale):
    b, h, t, _ = q.shape
    out = np.empty((b, h, t, v.shape[-1]), q.dtype)
    probs = np.empty((b, h, t, k.shape[2]), q.dtype)
    kernels.kernel("attention_forward", impl)(q, k, v, pad, True, scale, out, probs, None)
    grads = [np.empty(a.shape, a.dtype) for a in (q, k, v)]
    kernels.kernel("attention_backward", impl)(q, k, v, probs, g, scale, *grads, None)
    return [out, probs, *grads]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_slices_and_batched_paths_agree(dt, monkeypatch):
    q, k, v, g, pad = _inputs(dt, 2, 3, 21, 21, 8, 8, True, seed=1)
    drop = (42, 2**32 // 10, 1 / 0.9)
    slices = _run("fused", q, k, v, g, pad, True, drop)
    monkeypatch.setattr(attention_heads, "usable", lambda *arrays: False)
    before = kernels.calls[SLICES]
    batched = _run("fused", q, k, v, g, pad, True, drop)
    assert kernels.calls[SLICES] == before
    for a, r in zip(slices, batched):
        np.testing.assert_allclose(a, r, **TOL[dt])


def test_numpy_gemm_backend_keeps_the_batched_path():
    q, k, v, g, pad = _inputs(np.float32, 2, 2, 7, 7, 4, 4, True)
    ref = _run("reference", q, k, v, g, pad, False, None)
    before = kernels.calls[SLICES]
    gemm.use_backend("numpy")
    try:
        assert not attention_heads.usable(q, k, v)
        ours = _run("fused", q, k, v, g, pad, False, None)
    finally:
        gemm.use_backend("mkl")
    assert kernels.calls[SLICES] == before
    for a, r in zip(ours, ref):
        np.testing.assert_allclose(a, r, **TOL[np.float32])


def test_operands_without_a_blas_layout_and_strided_outputs_round_trip():
    # v's last axis has stride 2 (no BLAS layout: copied in); out, probs and dq are written through
    # temporaries and copied back (out transposed, probs non-contiguous, dq column-major slices).
    rng = np.random.default_rng(3)
    b, h, t, hs = 2, 2, 6, 4
    q = rng.standard_normal((b, h, t, hs))
    k = rng.standard_normal((b, h, t, hs))
    v = rng.standard_normal((b, h, t, 2 * hs))[..., ::2]
    g = rng.standard_normal((b, h, t, hs))
    ref_out, ref_probs = np.empty((b, h, t, hs)), np.empty((b, h, t, t))
    attention.attention_forward_reference(q, k, v, None, False, None, ref_out, ref_probs)
    ref_grads = [np.empty((b, h, t, hs)) for _ in range(3)]
    attention.attention_backward_reference(q, k, v, ref_probs, g, None, *ref_grads)

    out = np.empty((b, h, hs, t)).swapaxes(-1, -2)
    probs = np.empty((b, h, t, 2 * t))[..., ::2]
    before = kernels.calls[SLICES]
    attention.attention_forward_fused(q, k, v, None, False, None, out, probs)
    grads = [np.empty((b, h, hs, t)).swapaxes(-1, -2), np.empty((b, h, t, hs)), np.empty((b, h, t, hs))]
    attention.attention_backward_fused(q, k, v, probs, g, None, *grads)
    assert kernels.calls[SLICES] == before + 2
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-12, atol=1e-13)
    for a, r in zip(grads, ref_grads):
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-13)


_CHILD = """
import numpy as np
from tensorarena.kernels import attention, attention_heads
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 3, 5, 4)).astype(np.float32) for _ in range(3))
out, probs = np.empty((2, 3, 5, 4), np.float32), np.empty((2, 3, 5, 5), np.float32)
ref_out, ref_probs = np.empty_like(out), np.empty_like(probs)
attention.attention_forward_fused(q, k, v, None, True, None, out, probs)
attention.attention_forward_reference(q, k, v, None, True, None, ref_out, ref_probs)
assert np.allclose(out, ref_out, rtol=2e-5, atol=2e-6), "wrong result"
import os
from tensorarena import kernels
assert kernels.calls[("attention_library", os.environ["TENSORARENA_GEMM_KERNELS"])] == 1, dict(kernels.calls)
print(sum(attention_heads._forward.stats.cache_hits.values()))
"""


@pytest.mark.parametrize("gemm_kernels", LIBRARIES)
def test_kernel_cached_on_disk_finds_mkl_in_a_fresh_process(gemm_kernels):
    # The compiled code names cblas_sgemm (and OpenBLAS's, by the names gemm_library binds) by symbol: a
    # process that loads it from Numba's disk cache (not compiling it) must still find them, and run the
    # products on the library chosen. The first child compiles or loads; the second loads.
    env = dict(os.environ, TENSORARENA_KERNELS="", TENSORARENA_GEMM_KERNELS=gemm_kernels)
    for _ in range(2):
        child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=300)
        assert child.returncode == 0, child.stderr
    assert int(child.stdout.split()[-1]) >= 1, "the second process compiled the kernel again instead of loading it"
