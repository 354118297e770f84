"""Where one-thread MKL calls, one per core, beat MKL's own threads: wide products and small ones.

kernels.gemm runs most products as one MKL call on MKL's threads. Two kinds go here instead, as jobs
for a Numba parallel loop that calls MKL by symbol (kernels.mkl_numba), one thread per job:
- A wide product (more output columns than rows, e.g. ViT-Base's batch-1 forward: 197 tokens by 768
  to 3072 features) is cut into one band of columns per core. MKL's two threads here split such a
  product by rows, so each packs the whole right operand (7 MB for ViT-Base's qkv weight); a column
  band packs only its own part. ViT-Base batch-1 fused training step on 2 cores, these routes on
  against off, taking turns in one process (`python bench/gemm.py --steps base --routes`, medians):
  0.920x and 0.923x (e.g. 545 -> 501 ms); in an earlier A/B all its GEMMs went 496 -> 447 ms. ViT-Tiny
  (batch 8: tall products, only its head and its MLP's dw products change route): 1.047x, 0.996x,
  0.987x, noise.
- A small product (under SPLIT_MIN_MACS multiply-adds: a classifier head, a small MLP) runs as one
  job on one core: ~6-8 us for 8 x 192 x 10, where the ctypes call to MKL's threads took ~20 us.
- On OpenBLAS (kernels.gemm_library picks the library these calls go to) a tall product is cut by rows,
  one band per core ("row_cut"): OpenBLAS runs here only as one-thread calls on the loop's threads, never
  on a thread pool of its own beside libgomp's.
Tried and not kept (on MKL): the same cut by rows for tall products (what MKL's threads do already: no
change in a ViT-Tiny step), and a layer's dx and dw products side by side, one core each (7-23% faster
alone, repeated on the same operands; no change in a ViT-Tiny step, 102-110 ms both ways).

A job is one row of int64s (JOB_FIELDS): transposes, sizes, addresses and leading dimensions of op(a)
(m, k), op(b) (k, n) and the row-major output c (m, n), and whether c accumulates. kernels.gemm
checks shapes, dtypes and layouts and keeps the arrays alive while jobs run. A cut only changes which
core computes which block of the output; each block is MKL's product as before.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import dispatch_changed
from .blas_threads import one_thread as openblas_one_thread
from .gemm_library import OPENBLAS
from .mkl_numba import NO_TRANS, gemm_call, set_local_threads

JOB_FIELDS = ("ta", "tb", "m", "n", "k", "a", "lda", "b", "ldb", "c", "ldc", "accumulate")
_TA, _TB, _M, _N, _K, _A, _LDA, _B, _LDB, _C, _LDC, _ACC = range(len(JOB_FIELDS))
# Under this many multiply-adds a product runs as one job: waking a second core costs more than it saves.
SPLIT_MIN_MACS = 1 << 17
# Column bands are at least this wide and start on multiples of it (a 64-byte line of float32).
BAND = 16
_enabled = True  # use_jobs(False) sends every product to MKL's own threads


@numba.njit(cache=True, parallel=True)
def _run(jobs, f32, lib):
    for j in numba.prange(jobs.shape[0]):
        saved = set_local_threads(1)
        d = jobs[j]
        gemm_call(lib, f32, d[_TA], d[_TB], d[_M], d[_N], d[_K], d[_A], d[_LDA], d[_B], d[_LDB], d[_C], d[_LDC],
                  d[_ACC] != 0)
        set_local_threads(saved)


def run(jobs: list[tuple[int, ...]], dtype: np.dtype, lib: int) -> None:
    """Run the jobs over Numba's threads, one library thread each (lib: gemm_library.MKL or OPENBLAS);
    float32 or float64 operands."""
    run_table(table(jobs), np.dtype(dtype) == np.float32, lib)


def table(jobs: list[tuple[int, ...]]) -> np.ndarray:
    """The jobs as the int64 table the loop reads (built once for a prepared call: kernels.gemm)."""
    return np.array(jobs, np.int64)


def run_table(jobs: np.ndarray, f32: bool, lib: int) -> None:
    """`run` on a table already built."""
    if lib == OPENBLAS:
        with openblas_one_thread():  # its count is process-wide: set here, not per loop thread
            _run(jobs, f32, lib)
    else:
        _run(jobs, f32, lib)


def macs(job: tuple[int, ...]) -> int:
    return job[_M] * job[_N] * job[_K]


def column_bands(job: tuple[int, ...], parts: int, itemsize: int) -> list[tuple[int, ...]]:
    """`job` as up to `parts` jobs, each over one band of the output's columns (BAND-aligned cuts)."""
    ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc = job
    parts = max(1, min(parts, n // BAND))
    cuts = [0] + [min(n, -(-(n * i // parts) // BAND) * BAND) for i in range(1, parts)] + [n]
    col = (1 if tb == NO_TRANS else ldb) * itemsize  # bytes from one column of op(b) to the next
    return [(ta, tb, m, hi - lo, k, a, lda, b + lo * col, ldb, c + lo * itemsize, ldc, acc)
            for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def row_bands(job: tuple[int, ...], parts: int, itemsize: int) -> list[tuple[int, ...]]:
    """`job` as up to `parts` jobs, each over one band of the output's rows."""
    ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc = job
    parts = max(1, min(parts, m))
    cuts = [m * i // parts for i in range(parts + 1)]
    row = (lda if ta == NO_TRANS else 1) * itemsize  # bytes from one row of op(a) to the next
    return [(ta, tb, hi - lo, n, k, a + lo * row, lda, b, ldb, c + lo * ldc * itemsize, ldc, acc)
            for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def enabled() -> bool:
    """Whether these routes are on (`use_jobs`); part of kernels.dispatch_key."""
    return _enabled


def use_jobs(flag: bool) -> None:
    """Turn these routes on (default) or off, process-wide: off, every product is one call on MKL's
    threads (whichever library gemm_library chose), as before they existed (`python bench/gemm.py --steps base
    --routes` alternates the two)."""
    global _enabled
    if bool(flag) != _enabled:
        dispatch_changed()  # a captured step's GEMMs were planned (prepare_gemm_mkl) under the old setting
    _enabled = bool(flag)


def plan(job: tuple[int, ...], itemsize: int, threads: int, lib: int) -> tuple[list[tuple[int, ...]] | None, str]:
    """(jobs, route) for one product on `threads` cores; jobs None means one call on MKL's own threads.
    On OpenBLAS (lib) a tall product is cut by rows instead: OpenBLAS runs only as one-thread jobs here."""
    if not _enabled:
        return None, "mkl_threads"
    if macs(job) < SPLIT_MIN_MACS:
        return [job], "one_core"
    if threads >= 2 and job[_N] > job[_M] and job[_N] >= 2 * BAND:
        return column_bands(job, threads, itemsize), "column_cut"
    if lib == OPENBLAS:
        return row_bands(job, threads, itemsize), "row_cut"
    return None, "mkl_threads"
