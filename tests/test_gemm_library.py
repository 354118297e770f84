"""kernels.gemm_library: which library's one-thread GEMMs the per-core products call, and how it is bound.

The products themselves are checked on both libraries against float64 products in test_gemm_jobs.py and
test_kernel_gemm.py, attention's slices in test_attention_slices.py, and a switch between steps in
test_captured_dispatch.py (its "gemm_library_switched" case fails when use_library does not count as a
change of dispatch: the captured steps went on calling the old library). Here: the choice, its errors,
and the fallback binding where numpy's OpenBLAS is missing.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from tensorarena.kernels import blas_threads, cpu, gemm as G
from tensorarena.kernels import gemm_library as L
from tensorarena.kernels.mkl_numba import NO_TRANS, gemm_call, set_local_threads

pytestmark = pytest.mark.skipif(not G.mkl_symbols_loaded(), reason="MKL (the mkl wheel) is not installed")


def test_auto_takes_openblas_on_any_cpu_but_intel_and_only_where_it_is_available():
    assert L.pick("auto", "", "AuthenticAMD") == L.OPENBLAS
    assert L.pick("auto", "", "") == L.OPENBLAS  # unknown vendor: not Intel's fast paths either
    assert L.pick("auto", "", "GenuineIntel") == L.MKL
    assert L.pick("auto", "numpy's BLAS is not an OpenBLAS", "AuthenticAMD") == L.MKL
    assert L.pick("mkl", "", "AuthenticAMD") == L.MKL
    assert L.pick("openblas", "", "GenuineIntel") == L.OPENBLAS
    with pytest.raises(RuntimeError, match="TENSORARENA_GEMM_KERNELS=openblas, but no such library"):
        L.pick("openblas", "no such library", "AuthenticAMD")


def test_this_process_made_the_auto_choice_and_says_so():
    if os.environ.get("TENSORARENA_GEMM_KERNELS", "auto") != "auto":
        pytest.skip("the environment chose the library")
    want = L.pick("auto", L.why_not(), L.cpu_vendor())
    assert L.current() == want
    assert ("per-core products on OpenBLAS" if want == L.OPENBLAS else "per-core products on MKL") in G.backend()


def test_numpy_2_and_numpy_1_26_openblas_names_are_found_and_an_lp64_build_is_not_taken():
    from types import SimpleNamespace

    scipy = ["scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_"]
    numpy126 = ["cblas_sgemm64_", "cblas_dgemm64_"]
    lp64 = ["cblas_sgemm", "cblas_dgemm"]
    for names, want in ((scipy, tuple(scipy)), (numpy126, tuple(numpy126)), (lp64, None), (scipy[:1], None)):
        assert L.openblas_names(SimpleNamespace(**dict.fromkeys(names))) == want


def test_a_bad_setting_names_the_variable_and_the_choices():
    out = subprocess.run([sys.executable, "-c", "import tensorarena"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TENSORARENA_GEMM_KERNELS="blis"))
    assert out.returncode != 0
    assert "TENSORARENA_GEMM_KERNELS must be one of auto, mkl, openblas, got 'blis'" in out.stderr


def test_use_library_refuses_a_name_it_does_not_know():
    with pytest.raises(ValueError, match="'mkl' or 'openblas', got 'atlas'"):
        L.use_library("atlas")


@numba.njit
def _product_by_name(lib, a, b, c):
    # Compiled (not cached) after the binding under test: it links to whatever the names are bound to now.
    saved = set_local_threads(1)
    gemm_call(lib, True, NO_TRANS, NO_TRANS, a.shape[0], b.shape[1], a.shape[1], a.ctypes.data, a.shape[1],
              b.ctypes.data, b.shape[1], c.ctypes.data, c.shape[1], False)
    set_local_threads(saved)


def test_without_numpys_openblas_the_names_bind_to_mkls_and_openblas_is_never_chosen(monkeypatch):
    # The kernels name OpenBLAS's GEMM whatever the library: where it is missing, the names must still
    # link, to MKL's ILP64 entry points (same signatures), so a product through them is still right.
    mkl = ctypes.CDLL(G._mkl.path)
    saved = L.NAMES[L.current()]
    monkeypatch.setattr(cpu, "_loaded_openblas", lambda: None)
    monkeypatch.setenv("TENSORARENA_GEMM_KERNELS", "auto")
    try:
        L.bind(mkl)
        assert not L.available() and "not an OpenBLAS" in L.why_not()
        assert L.current() == L.MKL
        with pytest.raises(RuntimeError, match="'openblas' is not available: numpy's BLAS is not an OpenBLAS"):
            L.use_library("openblas")
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
        c = np.zeros((7, 3), np.float32)
        _product_by_name(L.OPENBLAS, a, b, c)  # through the OpenBLAS names, bound to MKL's cblas_sgemm_64
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
        monkeypatch.setenv("TENSORARENA_GEMM_KERNELS", "openblas")
        with pytest.raises(RuntimeError, match="TENSORARENA_GEMM_KERNELS=openblas, but numpy's BLAS"):
            L.bind(mkl)
    finally:
        monkeypatch.undo()
        L.bind(mkl)  # numpy's OpenBLAS again, for every kernel linked from here on
        L.use_library(saved)
    assert L.available() == (cpu._loaded_openblas() is not None and not L.why_not())


def _openblas_thread_count():
    """(get, set) of numpy's OpenBLAS global thread count, bound here (not gemm_library's own binding)."""
    lib = ctypes.CDLL(cpu._loaded_openblas())
    get, put = lib.scipy_openblas_get_num_threads64_, lib.scipy_openblas_set_num_threads64_
    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
    return get, put


needs_openblas = pytest.mark.skipif(not L.available(), reason=f"no OpenBLAS for the per-core products: {L.why_not()}")


@needs_openblas
def test_products_on_openblas_leave_its_thread_count_as_they_found_it():
    # Regression: the loop threads set OpenBLAS's count themselves (its "local" setter, which sets the
    # global count in numpy's build) and raced: it was left at 1, and every later np.matmul ran on one core.
    # On the commit that brought OpenBLAS in (e8d3514) this failed at its first assert (1 == 2):
    #   git worktree add /tmp/wt-ob e8d3514 && cp tests/test_gemm_library.py /tmp/wt-ob/tests/ && cd /tmp/wt-ob
    #   PYTHONPATH=/tmp/wt-ob python -m pytest -q -p no:cacheprovider tests/test_gemm_library.py
    from tests.test_attention_slices import _inputs, _run

    saved = L.NAMES[L.current()]
    get, put = _openblas_thread_count()
    before = get()
    try:
        L.use_library("openblas")
        put(2)
        rng = np.random.default_rng(0)
        for m, k, n in ((601, 130, 40), (40, 130, 601), (9, 40, 30)):  # row cut, column cut, one core
            a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            G.gemm_mkl(a, b, out)
            assert get() == 2
            G.prepare_gemm_mkl(a, b, out)()
            assert get() == 2
        q, k, v, g, pad = _inputs(np.float32, 2, 3, 17, 17, 8, 8, True)
        _run("fused", q, k, v, g, pad, False, None)  # attention's slices, forward and backward
        assert get() == 2
    finally:
        put(before)
        L.use_library(saved)


@needs_openblas
def test_openblas_is_held_at_one_thread_inside_and_nested_or_concurrent_holders_restore_once():
    import threading

    get, put = _openblas_thread_count()
    before = get()
    try:
        put(3)
        with blas_threads.one_thread():
            assert get() == 1
            with blas_threads.one_thread():  # nested: still 1, and the inner exit does not restore
                assert get() == 1
            assert get() == 1
        assert get() == 3
        inside, leave = threading.Barrier(3), threading.Event()

        def hold():
            with blas_threads.one_thread():
                inside.wait()
                leave.wait()
                assert get() == 1

        threads = [threading.Thread(target=hold) for _ in range(2)]
        for t in threads:
            t.start()
        inside.wait()  # both hold it now
        assert get() == 1
        leave.set()
        for t in threads:
            t.join()
        assert get() == 3
    finally:
        put(before)
