"""2-D matrix products (the linear layers' GEMMs): Intel MKL when the `mkl` wheel is installed, else NumPy.

Why a second BLAS. GEMMs are 55-75% of a transformer training step here (cProfile of fused ViT-Tiny
and ViT-Base steps), and NumPy's bundled OpenBLAS runs the transformer shapes 15-25% slower than
MKL, the library PyTorch ships inside its CPU wheel. `python bench/gemm.py` times the twelve GEMMs of one ViT-Tiny block
(1576 tokens x 192/768 features, forward, dx and dW) on both backends and on torch.mm in one process.

How. `pip install "tensorarena[mkl]"` brings MKL's single dynamic library, libmkl_rt; this module
loads it with ctypes and calls cblas_sgemm / cblas_dgemm directly on the arrays' memory (row-major,
a transpose flag for transposed views, so no operand is copied). MKL runs on the GNU OpenMP
threading layer: the libgomp thread pool Numba's kernels already use (NUMBA_THREADING_LAYER=omp),
so GEMMs and fused kernels take turns on one pool of threads instead of two pools contending for
the cores; its idle threads spin ~2-3 ms before they sleep (kernels/__init__ says why). Wide
products (more output columns than rows) and small ones run instead as one-thread MKL calls side by
side, from a Numba loop (kernels.gemm_jobs says where that measured faster); those one-thread calls,
and attention's, go to MKL or to numpy's OpenBLAS, whichever kernels.gemm_library chose (OpenBLAS on
CPUs that are not Intel's, where its kernels are the faster ones). A
threading layer the user chose with MKL_THREADING_LAYER wins. Attention's per-(batch, head)
products go to one cblas_?gemm_batch call (`batched_gemm_mkl`, used by kernels.attention).

The route is never silent: `kernel("gemm")` hands out "fused" (MKL) or "reference" (np.matmul, the
twin), `kernels.calls` counts which ran, `backend()` says which one this process uses and why, and a
process without MKL logs that once. TENSORARENA_GEMM=numpy (or `use_backend("numpy")`) keeps NumPy's
BLAS even when MKL is installed; TENSORARENA_GEMM=mkl makes a missing MKL an error.
"""

from __future__ import annotations

import ctypes
import logging
import os

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import calls, gemm_jobs, gemm_library, kernel, register, unregister
from .mkl_lib import find_mkl_rt, wanted_backend
from ..memory.arena import empty

log = logging.getLogger("tensorarena")

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS enum values
_MKL_THREADING_GNU = 3  # mkl_set_threading_layer's MKL_THREADING_GNU
_LAYER_NAMES = {0: "Intel OpenMP", 1: "sequential", 2: "PGI OpenMP", 3: "GNU OpenMP", 4: "TBB"}
_MKL_INTERFACE_LP64 = 0  # 32-bit MKL_INT, as the ctypes signatures below declare
_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def gemm_reference(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False) -> np.ndarray:
    """out = a @ b, or out += a @ b with accumulate (NumPy's BLAS): the twin of the MKL kernel."""
    if accumulate:
        out += np.matmul(a, b)
    else:
        np.matmul(a, b, out=out)
    return out


class _Mkl:
    """libmkl_rt's CBLAS GEMMs through ctypes (ctypes releases the GIL for the call)."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        # Both must precede every other MKL call. The interface is not the user's choice: an
        # MKL_INTERFACE_LAYER=ILP64 in the environment would make MKL read our 32-bit ints as 64-bit.
        lib.MKL_Set_Interface_Layer.argtypes = [ctypes.c_int]
        lib.MKL_Set_Interface_Layer(_MKL_INTERFACE_LP64)
        if "MKL_THREADING_LAYER" in os.environ:
            self.threading = os.environ["MKL_THREADING_LAYER"]
        else:
            lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
            layer = lib.MKL_Set_Threading_Layer(_MKL_THREADING_GNU)  # returns the layer in force
            self.threading = _LAYER_NAMES.get(layer, f"threading layer {layer}")
            if layer != _MKL_THREADING_GNU:  # something in this process ran MKL before us and chose
                log.warning("MKL's threading layer is %s, not GNU OpenMP (MKL was already in use in this "
                            "process): its GEMMs run on a thread pool beside the Numba kernels' one", self.threading)
        lib.MKL_Get_Max_Threads.restype = ctypes.c_int
        self.threads = lib.MKL_Get_Max_Threads()
        self.path = path
        # Numba kernels call cblas_?gemm by name (kernels.attention_heads): register this library with
        # LLVM's JIT linker, so compiled and disk-cached code finds them. (Here the symbols were already
        # visible to it after ctypes' RTLD_LOCAL load, by grace of how libmkl_rt loads itself; this does
        # not rely on that.)
        try:
            import llvmlite.binding

            llvmlite.binding.load_library_permanently(path)
            self.in_llvm = True
        except (ImportError, RuntimeError) as exc:
            self.in_llvm = False
            log.warning("MKL's GEMMs are not callable from Numba kernels (%s): attention runs its batched path", exc)
        if self.in_llvm:  # the library of the products run one thread per core (kernels.gemm_library)
            gemm_library.bind(lib)
        i, vp = ctypes.c_int, ctypes.c_void_p
        self.fn, self.batch_fn, self.real = {}, {}, {}
        for dtype, prefix, real in ((np.float32, "cblas_s", ctypes.c_float), (np.float64, "cblas_d", ctypes.c_double)):
            dtype = np.dtype(dtype)
            fn = getattr(lib, prefix + "gemm")
            fn.restype = None
            fn.argtypes = [i, i, i, i, i, i, real, vp, i, vp, i, real, vp, i]
            self.fn[dtype] = fn
            # The grouped batch API: every argument an array with one entry per group (one group here).
            batch = getattr(lib, prefix + "gemm_batch")
            batch.restype = None
            batch.argtypes = [i, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, i, vp]
            self.batch_fn[dtype] = batch
            self.real[dtype] = real
        # bfloat16 operands, float32 output and sums (kernels.gemm_bf16); None in an MKL older than them.
        self.bf16_fn = getattr(lib, "cblas_gemm_bf16bf16f32", None)
        if self.bf16_fn is not None:
            self.bf16_fn.restype = None
            self.bf16_fn.argtypes = [i, i, i, i, i, i, ctypes.c_float, vp, i, vp, i, ctypes.c_float, vp, i]


def _slice_layout(x: np.ndarray, rows: int, cols: int) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) under which BLAS reads every 2-D slice of x in place, or None.

    Row-major with unit column stride is NoTrans; a transposed view (unit row stride) is Trans of its
    base. Sliced-out columns, negative or zero (broadcast) strides have no such layout.
    """
    item = x.itemsize
    s0, s1 = x.strides[-2:]
    rows_apart = s0 > 0 and s0 % item == 0 and s0 // item >= max(1, cols)
    # One row: its stride is never used, so any one (0 for y[None, :]) is fine and any ld >= cols is valid.
    if (s1 == item or cols == 1) and (rows_apart or rows == 1):
        return _NO_TRANS, s0 // item if rows_apart else max(1, cols)
    if (s0 == item or rows == 1) and s1 > 0 and s1 % item == 0 and s1 // item >= max(1, rows):
        return _TRANS, s1 // item
    return None


def _blas_view(x: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, tuple[int, int]]:
    """x (or a copy of it in the current arena, when its slices have no BLAS layout) and that layout."""
    layout = _slice_layout(x, rows, cols)
    if layout is not None:
        return x, layout
    return _arena_copy(x), (_NO_TRANS, max(1, cols))


def _arena_copy(x: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of x in the current arena (the step's, or a fused plan's slab)."""
    copy = empty(x.shape, x.dtype)
    np.copyto(copy, x)
    return copy


def _row_major_ld(out: np.ndarray, rows: int, cols: int, what: str) -> int:
    """Leading dimension of out's row-major slices; ValueError if BLAS cannot write them in place."""
    layout = _slice_layout(out, rows, cols)
    if layout is None or layout[0] != _NO_TRANS:
        raise ValueError(f"{what}: out {out.shape} must be row-major rows (unit column stride), got strides {out.strides}")
    return layout[1]


def _product_job(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool, *, bf16: bool = False
                 ) -> tuple[tuple[int, ...], tuple[np.ndarray, np.ndarray]] | None:
    """Check out = a @ b for MKL and describe it as one job (kernels.gemm_jobs' row) and the arrays it
    reads (a copy when an operand has no BLAS layout: keep them alive until the job has run).
    None when there is nothing to multiply (an empty output, or k = 0: out is zeroed unless accumulating).
    bf16: operands are bfloat16 bit patterns (uint16) and out float32 (kernels.gemm_bf16)."""
    dtype = out.dtype
    what = "gemm_bf16" if bf16 else "gemm"
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or a.shape[1] != b.shape[0] or out.shape != (a.shape[0], b.shape[1]):
        raise ValueError(f"{what}: shapes {a.shape} @ {b.shape} -> {out.shape} do not chain as "
                         f"(m, k) @ (k, n) -> (m, n)")
    if bf16:
        if a.dtype != np.uint16 or b.dtype != np.uint16 or dtype != np.float32:
            raise TypeError(f"gemm_bf16: needs uint16 (bfloat16) operands and a float32 out, got "
                            f"{a.dtype} @ {b.dtype} -> {dtype}")
    elif a.dtype != dtype or b.dtype != dtype or dtype not in _mkl.fn:
        raise TypeError(f"gemm: MKL takes one float32 or float64 dtype for all three arrays, got "
                        f"{a.dtype} @ {b.dtype} -> {dtype}; use gemm_reference")
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return None
    ldc = _row_major_ld(out, m, n, what)
    if k == 0:
        if not accumulate:
            out.fill(0)
        return None
    # An operand out overlaps is read from a copy (BLAS would read what it already overwrote), as np.matmul
    # buffers it: out = a @ b (or out += a @ b) with out a itself gives the twin's answer.
    if np.may_share_memory(out, a):
        a = _arena_copy(a)
    if np.may_share_memory(out, b):
        b = _arena_copy(b)
    a, (ta, lda) = _blas_view(a, m, k)
    b, (tb, ldb) = _blas_view(b, k, n)
    return (ta, tb, m, n, k, a.ctypes.data, lda, b.ctypes.data, ldb, out.ctypes.data, ldc, int(accumulate)), (a, b)


def gemm_mkl(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False) -> np.ndarray:
    """out = a @ b, or out += a @ b with accumulate, by MKL. a (m, k), b (k, n), out (m, n) one float dtype.

    One call on MKL's threads, except where kernels.gemm_jobs measured better: a small product on one
    core, a wide one (more columns than rows) cut by columns, a one-thread MKL call per core.
    `calls[("gemm_route", "mkl_threads" | "one_core" | "column_cut")]` counts which ran.
    """
    prepared = _product_job(a, b, out, accumulate)
    if prepared is None:
        return out
    job, _keep = prepared  # _keep: operand copies (if any) stay alive until MKL has read them
    lib = gemm_library.current()
    if _mkl.in_llvm:
        jobs, route = gemm_jobs.plan(job, out.itemsize, numba.get_num_threads(), lib)
    else:  # Numba cannot call MKL by name (kernels.gemm logged why): MKL's threads, through ctypes
        jobs, route = None, "mkl_threads"
    calls[("gemm_route", route)] += 1
    if jobs is None:
        ta, tb, m, n, k, pa, lda, pb, ldb, pc, ldc, acc = job
        _mkl.fn[out.dtype](_ROW_MAJOR, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, 1.0 if acc else 0.0, pc, ldc)
    else:
        calls[("gemm_library", gemm_library.NAMES[lib])] += 1
        gemm_jobs.run(jobs, out.dtype, lib)
    return out


def prepare_gemm_mkl(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False):
    """gemm_mkl's call on these arrays, checked and planned once (tape.recorded: a captured step replays it):
    a zero-argument function, or None when each call must copy an operand BLAS cannot read in place (or
    there is nothing to multiply)."""
    prepared = _product_job(a, b, out, accumulate)
    if prepared is None or prepared[1][0] is not a or prepared[1][1] is not b:
        return None
    job = prepared[0]
    lib = gemm_library.current()  # a switch (use_library) is a change of dispatch: the step is prepared again
    jobs, route = (gemm_jobs.plan(job, out.itemsize, numba.get_num_threads(), lib) if _mkl.in_llvm
                   else (None, "mkl_threads"))
    key = ("gemm_route", route)
    # The functions below keep a, b and out (by `_arrays`) alive: MKL reads and writes them by address.
    if jobs is None:
        ta, tb, m, n, k, pa, lda, pb, ldb, pc, ldc, acc = job
        args = (_ROW_MAJOR, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, 1.0 if acc else 0.0, pc, ldc)
        threaded = _mkl.fn[out.dtype]

        def run(_arrays=(a, b, out)) -> np.ndarray:
            calls[key] += 1
            threaded(*args)
            return out
    else:
        table, f32 = gemm_jobs.table(jobs), out.dtype == np.float32
        library = ("gemm_library", gemm_library.NAMES[lib])

        def run(_arrays=(a, b, out)) -> np.ndarray:
            calls[key] += 1
            calls[library] += 1
            gemm_jobs.run_table(table, f32, lib)
            return out
    return run


gemm_mkl.prepare = prepare_gemm_mkl


def batched_gemm_reference(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[...] = a[...] @ b[...] over equal leading (batch) axes: np.matmul, the twin of the MKL kernel."""
    return np.matmul(a, b, out=out)


_pointer_cache: dict[tuple, np.ndarray] = {}
_POINTER_CACHE_SIZE = 1024


def _slice_pointers(x: np.ndarray) -> np.ndarray:
    """Address of every 2-D slice of x, in C order of its leading axes.

    Kept by (address, shape, strides): a step's buffers sit at the same addresses every step (the
    fused plan's slab, the eager route's reset arena), and building the arrays anew cost ~7 ms per
    ViT-Tiny step (216 attention products x 3 operands).
    """
    key = (x.ctypes.data, x.shape, x.strides)
    pointers = _pointer_cache.get(key)
    if pointers is None:
        offsets = np.zeros(1, np.int64)
        for length, stride in zip(x.shape[:-2], x.strides[:-2]):
            offsets = (offsets[:, None] + np.arange(length, dtype=np.int64) * stride).ravel()
        pointers = (offsets + key[0]).astype(np.uint64)
        if len(_pointer_cache) >= _POINTER_CACHE_SIZE:
            _pointer_cache.clear()
        _pointer_cache[key] = pointers
    return pointers


def batched_gemm_mkl(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[...] = a[...] @ b[...] in one MKL call (cblas_?gemm_batch), MKL's threads spread over the slices.

    a (..., m, k), b (..., k, n), out (..., m, n) with the same leading axes and one float dtype.
    Each operand may be a strided view (heads of a packed projection, a swapaxes transpose): a slice
    is read in place when one of its last two axes has unit stride, else the operand is copied.
    """
    lead = out.shape[:-2]
    if a.ndim < 3 or a.shape[:-2] != lead or b.shape[:-2] != lead or a.shape[-1] != b.shape[-2] \
            or out.shape[-2:] != (a.shape[-2], b.shape[-1]):
        raise ValueError(f"batched_gemm: shapes {a.shape} @ {b.shape} -> {out.shape} need equal leading axes "
                         f"and (..., m, k) @ (..., k, n) -> (..., m, n)")
    dtype = out.dtype
    if a.dtype != dtype or b.dtype != dtype or dtype not in _mkl.batch_fn:
        raise TypeError(f"batched_gemm: MKL takes one float32 or float64 dtype for all three arrays, got "
                        f"{a.dtype} @ {b.dtype} -> {dtype}; use batched_gemm_reference")
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if out.size == 0:
        return out
    if k == 0:
        out.fill(0)
        return out
    if np.may_share_memory(out, a) or np.may_share_memory(out, b):
        raise ValueError("batched_gemm: out overlaps an operand; BLAS would read what it already overwrote")
    ldc = _row_major_ld(out, m, n, "batched_gemm")
    a, (ta, lda) = _blas_view(a, m, k)
    b, (tb, ldb) = _blas_view(b, k, n)
    ints = (ctypes.c_int * 8)(ta, tb, m, n, k, lda, ldb, ldc)
    size = ctypes.c_int(int(np.prod(lead)))
    real = _mkl.real[dtype]
    one, zero = real(1.0), real(0.0)
    pa, pb, pc = _slice_pointers(a), _slice_pointers(b), _slice_pointers(out)
    at = ctypes.addressof
    step = ctypes.sizeof(ctypes.c_int)
    base = at(ints)
    _mkl.batch_fn[dtype](_ROW_MAJOR, base, base + step, base + 2 * step, base + 3 * step, base + 4 * step, at(one),
                         pa.ctypes.data, base + 5 * step, pb.ctypes.data, base + 6 * step, at(zero), pc.ctypes.data,
                         base + 7 * step, 1, at(size))
    return out


def _choose() -> tuple[_Mkl | None, str]:
    wanted = wanted_backend()
    if wanted == "numpy":
        return None, "TENSORARENA_GEMM=numpy"
    path, why = find_mkl_rt()
    if path is not None:
        try:
            return _Mkl(path), ""
        except (OSError, AttributeError) as exc:
            why = f"libmkl_rt at {path} did not load: {exc}"
    if wanted == "mkl":
        raise RuntimeError(f"TENSORARENA_GEMM=mkl, but {why}")
    return None, why


_mkl, _why_not = _choose()
register("gemm", "reference", gemm_reference)
register("batched_gemm", "reference", batched_gemm_reference)
if _mkl is not None:
    register("gemm", "fused", gemm_mkl)
    register("batched_gemm", "fused", batched_gemm_mkl)
else:
    log.info("GEMMs run on NumPy's BLAS, not MKL: %s", _why_not)


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False) -> np.ndarray:
    """out = a @ b (out += a @ b with accumulate) on this process's GEMM backend.

    float32/float64 go to MKL when it is the backend; other dtypes (float16) to NumPy, which
    `kernels.calls[("gemm", "reference")]` records like any other reference call.
    """
    impl = None if out.dtype in _BLAS_DTYPES else "reference"
    return kernel("gemm", impl)(a, b, out, accumulate)


def mkl_symbols_loaded() -> bool:
    """Whether MKL loaded and Numba kernels can call its GEMMs by name (kernels.attention_heads)."""
    return _mkl is not None and _mkl.in_llvm


def backend() -> str:
    """Which library runs this process's GEMMs, and why, for reports and logs."""
    from . import choose

    if choose("gemm") == "fused":
        return (f"MKL ({_mkl.threads} threads, {_mkl.threading} threading layer; "
                f"{gemm_library.describe() if _mkl.in_llvm else 'MKL threads only'})")
    return f"NumPy's BLAS ({_why_not or 'reference kernels forced'})"


def use_backend(name: str) -> None:
    """Switch this process's GEMMs to "mkl" or "numpy" (benchmarks alternate the two in one process)."""
    global _why_not
    if name == "numpy":
        unregister("gemm", "fused")  # each a change of dispatch (kernels.generation) if it was there
        unregister("batched_gemm", "fused")
        _why_not = "use_backend('numpy')"
    elif name == "mkl":
        if _mkl is None:
            raise RuntimeError(f"gemm: MKL is not available: {_why_not}")
        register("gemm", "fused", gemm_mkl)  # a change of dispatch when it puts MKL's back (kernels.register)
        register("batched_gemm", "fused", batched_gemm_mkl)
        _why_not = ""
    else:
        raise ValueError(f"gemm backend must be 'mkl' or 'numpy', got {name!r}")
