"""MKL's GEMMs as functions Numba-compiled kernels call by symbol name.

kernels.gemm registers libmkl_rt with LLVM's JIT linker (llvmlite's load_library_permanently), so
compiled code, and code loaded back from Numba's on-disk cache, finds cblas_sgemm / cblas_dgemm by
name instead of by an address baked into it (and cblas_gemm_bf16bf16f32, which only an MKL that has it
resolves: kernels.gemm_bf16.in_kernels()). Kernels that call these run inside a parallel loop,
one GEMM per core: each sets MKL's thread count for its own thread to 1 around the calls
(`set_local_threads`), since the cores are already divided by the loop. Only usable when
kernels.gemm.mkl_symbols_loaded().

`gemm_call` takes the library as its first argument (kernels.gemm_library: MKL or OPENBLAS); OpenBLAS's
GEMMs are reached by names gemm_library binds (ILP64: 64-bit ints). OpenBLAS's thread count is
process-wide (its "local" setter sets the global count in numpy's build: loop threads saving and restoring
it raced), so the Python caller holds it at 1 around the loop (blas_threads.one_thread).
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np
from numba import types

from .gemm_library import DGEMM, OPENBLAS, SGEMM

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS enum values
_i, _p = types.intc, types.int64  # MKL's LP64 ints; pointers passed as 64-bit integers (same registers)
_sgemm = types.ExternalFunction("cblas_sgemm", types.void(_i, _i, _i, _i, _i, _i, types.float32, _p, _i, _p, _i,
                                                          types.float32, _p, _i))
_dgemm = types.ExternalFunction("cblas_dgemm", types.void(_i, _i, _i, _i, _i, _i, types.float64, _p, _i, _p, _i,
                                                          types.float64, _p, _i))
set_local_threads = types.ExternalFunction("MKL_Set_Num_Threads_Local", types.intc(types.intc))
# OpenBLAS's, by the names kernels.gemm_library binds: sizes and leading dimensions 64-bit (ILP64), the enums int.
_l = types.int64
_ob_sgemm = types.ExternalFunction(SGEMM, types.void(types.intc, types.intc, types.intc, _l, _l, _l, types.float32,
                                                     _p, _l, _p, _l, types.float32, _p, _l))
_ob_dgemm = types.ExternalFunction(DGEMM, types.void(types.intc, types.intc, types.intc, _l, _l, _l, types.float64,
                                                     _p, _l, _p, _l, types.float64, _p, _l))


@numba.njit(inline="always")
def gemm_call(lib, f32, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate):
    """c (m, n) = op(a) @ op(b), or c += with accumulate; row-major, addresses as int64; float32 or float64;
    on MKL, or on OpenBLAS where lib is gemm_library.OPENBLAS."""
    if lib == OPENBLAS:
        if f32:
            _ob_sgemm(ROW_MAJOR, ta, tb, m, n, k, np.float32(1.0), a, lda, b, ldb,
                      np.float32(1.0) if accumulate else np.float32(0.0), c, ldc)
        else:
            _ob_dgemm(ROW_MAJOR, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 1.0 if accumulate else 0.0, c, ldc)
    elif f32:
        _sgemm(ROW_MAJOR, ta, tb, m, n, k, np.float32(1.0), a, lda, b, ldb,
               np.float32(1.0) if accumulate else np.float32(0.0), c, ldc)
    else:
        _dgemm(ROW_MAJOR, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 1.0 if accumulate else 0.0, c, ldc)
