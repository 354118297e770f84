"""Which library's one-thread GEMM kernels the per-core products call: MKL's or OpenBLAS's.

Most products run as one-thread GEMM calls, one per core, from a Numba parallel loop (kernels.gemm_jobs,
and attention's per-(batch, head) slices in kernels.attention_heads). Which library those calls go to
is this module's choice, process-wide:
- "mkl": MKL's cblas_?gemm. MKL picks its fastest kernels by Intel CPU features.
- "openblas": the OpenBLAS inside numpy's wheel (ILP64 `scipy_cblas_?gemm64_`, numpy 1.26's `cblas_?gemm64_`). On an
  AMD EPYC (Zen 4, 2 cores; this project's machines) its Haswell kernels ran ViT's linear products at
  104-110 GFLOP/s on one core, the core's FMA peak, where MKL's ran 88-95; two one-thread calls side
  by side 215-233 GFLOP/s against 177-199 for the same products on MKL's own threads, and attention's
  slices 197-207 against 166-185 (python bench/gemm.py --libraries tiny|base times them in whole
  fused steps).
`auto` (the default) takes OpenBLAS where the CPU is not an Intel one and numpy's OpenBLAS has what the
loop needs, else MKL; TENSORARENA_GEMM_KERNELS=mkl|openblas|auto sets it, `use_library` switches it
(a change of dispatch: captured steps record again). bfloat16 products stay on MKL (only it has them).

How kernels reach OpenBLAS: by names of our own (SGEMM, DGEMM below), bound with llvmlite's add_symbol
to the addresses in the OpenBLAS numpy loaded, so code Numba compiled and cached links to exactly that
library. Where that OpenBLAS is missing, the names are bound to MKL's ILP64 entry points, which have the
same signatures: kernels still link, `available()` says why not, and "openblas" is never chosen.

One thread per call: OpenBLAS's thread count is process-wide (its "local" setter sets the global count
in numpy's 0.3.31 build), so the Python code that starts a loop of OpenBLAS calls holds the count at 1
for the loop (kernels.blas_threads.one_thread: the first holder saves it, the last restores it). Setting it from
inside the loop, per thread, raced: the count was left at 1 (every later np.matmul ran on one core, at
half speed), and a call that started after the other thread restored 2 ran OpenBLAS's own threads
inside the loop ("OpenBLAS Warning : Detect OpenMP Loop", seen in benchmark runs). While a loop runs,
a matmul another thread of the program makes also gets one thread.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("tensorarena")

SGEMM, DGEMM = "tensorarena_openblas_sgemm", "tensorarena_openblas_dgemm"  # ILP64 CBLAS signatures
MKL, OPENBLAS = 0, 1  # the codes kernels take
NAMES = {MKL: "mkl", OPENBLAS: "openblas"}
CHOICES = ("auto", "mkl", "openblas")

# numpy's OpenBLAS builds, all ILP64: scipy-openblas (numpy 2) prefixes its names, numpy 1.26's only suffixes them.
_OPENBLAS_NAMES = [("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_"), ("cblas_sgemm64_", "cblas_dgemm64_")]
_MKL_SYMBOLS = ("cblas_sgemm_64", "cblas_dgemm_64")

_current = MKL
_why_not_openblas = "not bound yet (kernels.gemm binds it when it loads MKL)"
_openblas_path: str | None = None


def wanted() -> str:
    """TENSORARENA_GEMM_KERNELS, checked: "auto" (default), "mkl" or "openblas"."""
    value = os.environ.get("TENSORARENA_GEMM_KERNELS", "auto").lower()
    if value not in CHOICES:
        raise ValueError(f"TENSORARENA_GEMM_KERNELS must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


def cpu_vendor() -> str:
    """The CPU's vendor string (/proc/cpuinfo vendor_id, e.g. GenuineIntel, AuthenticAMD), or "" if unknown."""
    from .cpu import cpuinfo_field

    return cpuinfo_field("vendor_id")


def bind(mkl: ctypes.CDLL) -> None:
    """Bind SGEMM and DGEMM (to numpy's OpenBLAS, else to `mkl`'s same-signature entry points),
    then make the `wanted()` choice. Called once, by kernels.gemm, before any kernel calling them runs."""
    global _why_not_openblas, _openblas_path
    import llvmlite.binding as llvm

    from . import blas_threads
    from .cpu import _loaded_openblas

    path = _loaded_openblas()
    functions, why = None, ""
    if path is None:
        why = "numpy's BLAS is not an OpenBLAS this process can find"
    elif blas_threads._control is None:  # its count cannot be held at one thread (blas_threads.one_thread)
        why = blas_threads._why_not
    else:
        lib = ctypes.CDLL(path)  # already loaded by numpy: the same library, not a second copy
        names = openblas_names(lib)
        if names is None:  # an LP64 OpenBLAS (plain cblas_sgemm: 32-bit ints), or another build's names
            why = f"{os.path.basename(path)} has none of the ILP64 GEMMs {[n[0] for n in _OPENBLAS_NAMES]}"
        else:
            functions = [getattr(lib, name) for name in names]
    if functions is None:
        functions = [getattr(mkl, name) for name in _MKL_SYMBOLS]
    for ours, function in zip((SGEMM, DGEMM), functions):
        llvm.add_symbol(ours, ctypes.cast(function, ctypes.c_void_p).value)
    _why_not_openblas, _openblas_path = why, (path if not why else None)
    _set(pick(wanted(), why, cpu_vendor()))


def openblas_names(lib) -> tuple[str, ...] | None:
    """(sgemm, dgemm): the names `lib` (an OpenBLAS) has them under, or None."""
    return next((names for names in _OPENBLAS_NAMES if all(hasattr(lib, name) for name in names)), None)


def pick(choice: str, why_not_openblas: str, vendor: str) -> int:
    """MKL or OPENBLAS for a TENSORARENA_GEMM_KERNELS `choice`: "auto" takes OpenBLAS on any CPU but an
    Intel one (MKL's fast kernels are chosen by Intel features), where it is available."""
    if choice == "openblas" and why_not_openblas:
        raise RuntimeError(f"TENSORARENA_GEMM_KERNELS=openblas, but {why_not_openblas}; unset it or set it to "
                           f"mkl or auto")
    if choice == "auto":
        choice = "openblas" if not why_not_openblas and vendor != "GenuineIntel" else "mkl"
    return OPENBLAS if choice == "openblas" else MKL


def available() -> bool:
    """Whether the per-core products can run on OpenBLAS in this process."""
    return not _why_not_openblas


def why_not() -> str:
    return _why_not_openblas


def current() -> int:
    """MKL or OPENBLAS: the library the per-core products call now (part of kernels.dispatch_key)."""
    return _current


def describe() -> str:
    """For kernels.gemm.backend(): which library's kernels the per-core products run, and why."""
    if _current == OPENBLAS:
        return f"per-core products on OpenBLAS ({os.path.basename(_openblas_path or '')})"
    vendor = cpu_vendor() or "unknown CPU"
    reason = _why_not_openblas or f"{wanted()} on {vendor}"
    return f"per-core products on MKL ({reason})"


def use_library(name: str) -> None:
    """Send the per-core products to "mkl" or "openblas" from now on (benchmarks alternate the two)."""
    from . import dispatch_changed

    if name not in ("mkl", "openblas"):
        raise ValueError(f"gemm library must be 'mkl' or 'openblas', got {name!r}")
    if name == "openblas" and not available():
        raise RuntimeError(f"gemm library 'openblas' is not available: {_why_not_openblas}")
    code = OPENBLAS if name == "openblas" else MKL
    if code != _current:
        dispatch_changed()  # prepared products (captured steps) were planned for the other library
    _set(code)


def _set(code: int) -> None:
    global _current
    _current = code
    log.debug("GEMM kernels: per-core products call %s", NAMES[code])
