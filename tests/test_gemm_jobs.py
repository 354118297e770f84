"""kernels.gemm_jobs: the products kernels.gemm runs as one-thread GEMM calls side by side.

Each route (one call on MKL's threads, one job on one core, column bands one per core, and on OpenBLAS
row bands one per core) is checked against the float64 product on every operand layout the callers
hand over, on both libraries the per-core calls can go to (kernels.gemm_library), and the tests assert
which route and library ran. Checked once that they catch a wrong band offset: with `col` computed as if op(b)
were never transposed, the "t" layouts of b failed (49% of the elements wrong: the second band).
"""

import numba
import numpy as np
import pytest

from tensorarena import kernels
from tensorarena.kernels import gemm as G
from tensorarena.kernels import gemm_jobs as J
from tensorarena.kernels import gemm_library as L
from tensorarena.kernels.mkl_numba import NO_TRANS, TRANS
from tests.gemm_libraries import library, route_on  # noqa: F401 - library is a fixture
from tests.test_kernel_gemm import _operand

pytestmark = pytest.mark.skipif(not G.mkl_symbols_loaded(), reason="MKL (the mkl wheel) is not installed")
TOL = {np.float32: dict(rtol=3e-5, atol=3e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}
# (m, k, n) per route on 2 threads: a small product, a wide one, a tall one (on OpenBLAS: cut by rows).
SHAPES = {"one_core": (9, 40, 30), "column_cut": (40, 130, 601), "mkl_threads": (601, 130, 40)}


@pytest.fixture
def two_threads():
    saved = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield numba.get_num_threads()
    numba.set_num_threads(saved)


@pytest.mark.parametrize("route", list(SHAPES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_layout", ["c", "t", "copy"])
@pytest.mark.parametrize("b_layout", ["c", "t", "ld"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_every_route_matches_the_float64_product(two_threads, library, route, dtype, a_layout, b_layout,
                                                 accumulate):
    if two_threads < 2 and route == "column_cut":
        pytest.skip("needs two Numba threads")
    m, k, n = SHAPES[route]
    route = route_on(library, route)
    rng = np.random.default_rng(0)
    a, b = _operand(rng, m, k, dtype, a_layout), _operand(rng, k, n, dtype, b_layout)
    wide = rng.standard_normal((m, n + 24)).astype(dtype)  # out: columns 8..n+8 of a wider array
    out = wide[:, 8:8 + n]
    start = wide.copy()
    before = dict(kernels.calls)
    G.gemm_mkl(a, b, out, accumulate)
    assert kernels.calls[("gemm_route", route)] == before.get(("gemm_route", route), 0) + 1
    jobs = 0 if route == "mkl_threads" else 1  # MKL's own threads: no per-core call, no library counted
    assert kernels.calls[("gemm_library", library)] == before.get(("gemm_library", library), 0) + jobs
    exact = a.astype(np.float64) @ b.astype(np.float64) + (start[:, 8:8 + n] if accumulate else 0)
    np.testing.assert_allclose(out, exact, **TOL[dtype])
    np.testing.assert_array_equal(wide[:, :8], start[:, :8])  # nothing outside out touched
    np.testing.assert_array_equal(wide[:, 8 + n:], start[:, 8 + n:])


def _job(m, n, k, tb=NO_TRANS, ldb=None):
    return (NO_TRANS, tb, m, n, k, 1000, k, 2000, ldb or n, 3000, n, 0)


def test_the_plan_picks_the_route_by_size_shape_and_threads():
    assert J.plan(_job(8, 10, 192), 4, 2, L.MKL) == ([_job(8, 10, 192)], "one_core")
    assert J.plan(_job(1576, 576, 192), 4, 2, L.MKL) == (None, "mkl_threads")  # tall: MKL's own row split
    jobs, route = J.plan(_job(197, 2304, 768), 4, 2, L.MKL)
    assert route == "column_cut" and len(jobs) == 2
    assert J.plan(_job(197, 2304, 768), 4, 1, L.MKL) == (None, "mkl_threads")  # one thread: nothing to split
    # OpenBLAS runs only as one-thread jobs: a tall product is cut by rows, on one thread it is one job.
    assert J.plan(_job(1576, 576, 192), 4, 2, L.OPENBLAS) == (J.row_bands(_job(1576, 576, 192), 2, 4), "row_cut")
    assert J.plan(_job(1576, 576, 192), 4, 1, L.OPENBLAS) == ([_job(1576, 576, 192)], "row_cut")
    assert J.plan(_job(197, 2304, 768), 4, 2, L.OPENBLAS)[1] == "column_cut"


@pytest.mark.parametrize("m,parts", [(601, 2), (1576, 2), (197, 3), (3, 4), (1, 2)])
@pytest.mark.parametrize("ta", [NO_TRANS, TRANS])
def test_row_bands_tile_the_output_exactly(m, parts, ta):
    itemsize, lda, ldc, k, n = 4, 900, 700, 50, 40
    job = (ta, NO_TRANS, m, n, k, 1000, lda, 2000, n, 3000, ldc, 1)
    bands = J.row_bands(job, parts, itemsize)
    assert 1 <= len(bands) <= parts
    lo = 0
    for band in bands:
        rows = band[2]
        assert rows >= 1
        step = (lda if ta == NO_TRANS else 1) * itemsize  # op(a)'s row i: row i of a, or its column i
        assert band[5] == 1000 + lo * step and band[9] == 3000 + lo * ldc * itemsize
        assert band[:2] == job[:2] and band[3:5] == job[3:5] and band[6:9] == job[6:9] and band[10:] == job[10:]
        lo += rows
    assert lo == m


@pytest.mark.parametrize("n,parts", [(601, 2), (2304, 2), (2304, 3), (100, 4), (20, 2), (33, 2)])
@pytest.mark.parametrize("tb", [NO_TRANS, TRANS])
def test_column_bands_tile_the_output_exactly_on_aligned_cuts(n, parts, tb):
    itemsize, ldb, k = 4, 700, 50
    job = _job(40, n, k, tb, ldb)
    bands = J.column_bands(job, parts, itemsize)
    assert 1 <= len(bands) <= parts
    lo = 0
    for band in bands:
        width = band[3]
        assert width >= J.BAND or len(bands) == 1
        assert band[9] == 3000 + lo * itemsize  # output columns lo.. of the same rows
        step = (1 if tb == NO_TRANS else ldb) * itemsize  # b's column j: element j, or row j when transposed
        assert band[7] == 2000 + lo * step
        assert band[:3] == job[:3] and band[4:7] == job[4:7] and band[8] == job[8] and band[10:] == job[10:]
        assert lo % J.BAND == 0
        lo += width
    assert lo == n


def test_without_mkl_in_numba_every_product_is_one_call_on_mkls_threads(monkeypatch, two_threads):
    # llvmlite could not register libmkl_rt: no job may run (Numba would not find cblas_sgemm), and the
    # route counter says so.
    monkeypatch.setattr(G._mkl, "in_llvm", False)
    monkeypatch.setattr(J, "run", lambda *a: pytest.fail("gemm_jobs.run called without MKL in Numba"))
    rng = np.random.default_rng(2)
    for m, k, n in SHAPES.values():
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        out = np.empty((m, n))
        before = kernels.calls[("gemm_route", "mkl_threads")]
        G.gemm_mkl(a, b, out)
        assert kernels.calls[("gemm_route", "mkl_threads")] == before + 1
        np.testing.assert_allclose(out, a @ b, **TOL[np.float64])


def test_use_jobs_false_sends_every_product_to_mkls_threads_and_true_restores(two_threads):
    rng = np.random.default_rng(3)
    m, k, n = SHAPES["column_cut"]
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = np.empty((m, n), np.float32)
    try:
        J.use_jobs(False)
        before = dict(kernels.calls)
        G.gemm_mkl(a, b, out)
        assert kernels.calls[("gemm_route", "mkl_threads")] == before.get(("gemm_route", "mkl_threads"), 0) + 1
        assert kernels.calls[("gemm_route", "column_cut")] == before.get(("gemm_route", "column_cut"), 0)
    finally:
        J.use_jobs(True)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, **TOL[np.float32])
    if two_threads >= 2:
        G.gemm_mkl(a, b, out)
        assert J.plan((0, 0, m, n, k, 0, 0, 0, 0, 0, 0, 0), 4, 2, L.current())[1] == "column_cut"
