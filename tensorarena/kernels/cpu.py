"""How our kernels use the CPU: 512-bit vectors on AVX-512 cores, and OpenBLAS threads that sleep.

Vectors. LLVM's tuning for Intel server cores prefers 256-bit vectors (older Xeons clocked down on 512-bit
code), so Numba's loops ran 8 float32 lanes wide even where 16 fit. Our kernels are short,
compute-bound loops (the erf and exp polynomials of kernels.fastmath); on this machine's Emerald
Rapids cores 512-bit code measured, on ViT-Tiny shapes (1576 x 768 float32, 2 threads): GELU
forward 1.7 -> 1.1 ms, bias-GELU backward 2.3 -> 1.5 ms, masked softmax 2.0 -> 1.6 ms.

The choice must be made before Numba builds its target machine (when the first kernel is
decorated), so every kernel module imports this one before `import numba`. A NUMBA_CPU_FEATURES
the user set wins, and nothing changes on cores without AVX-512. Numba's on-disk cache keys on
the feature string, so kernels cached under other settings are recompiled, not reused.

OpenBLAS's threads. After each matmul, OpenBLAS's worker threads busy-wait (sched_yield in a
loop) for 2**28 cycles, ~0.1 s, before they sleep: exactly when our next fused kernel starts its
own threads, so on 2 cores those ran at half speed (in-step profile of a fused ViT-Tiny step:
the GELU and softmax kernels took 2x their isolated time, 190 vs 95 ms per 4 steps). A timeout of
2**4 cycles makes them sleep at once; the price is a wake-up per matmul, which no GEMM timing
showed. Measured in one process, alternating the two settings every 4 steps (`python
bench/openblas_spin.py [--model base] [--route eager]`, medians over 15-20 steps): fused ViT-Tiny
b8 640-672 vs 702-723 ms, eager 656 vs 710 ms, fused ViT-Base b1 1020 vs 1064 ms. The timeout is
read when OpenBLAS starts its threads, and numpy started them at import, so this sets
OPENBLAS_THREAD_TIMEOUT and restarts the pool (it comes back at the next matmul). An
OPENBLAS_THREAD_TIMEOUT the user set wins. The pool is restarted only when the importing thread is the
process's only Python thread: restarting it under a matmul running on another thread deadlocked both (an
import from a notebook's or a server's worker thread hung for good); with other threads it is left alone
and the log says how to get the timeout anyway (OPENBLAS_THREAD_TIMEOUT=4 in the environment).

Both choices are made by setting NUMBA_CPU_FEATURES and OPENBLAS_THREAD_TIMEOUT in os.environ,
so child processes the program starts inherit them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

log = logging.getLogger("tensorarena")
OPENBLAS_TIMEOUT_EXPONENT = "4"  # OpenBLAS's minimum: 2**4 cycles of spinning before a worker sleeps


def _prefer_512_bit_vectors() -> None:
    if "NUMBA_CPU_FEATURES" in os.environ:
        return
    import llvmlite.binding as llvm  # Numba imports it anyway

    try:
        features = llvm.get_host_cpu_features()
    except RuntimeError:  # LLVM cannot read this host's features: leave Numba's defaults
        return
    if not features.get("avx512f"):
        return
    wanted = features.flatten() + ",-prefer-256-bit"
    os.environ["NUMBA_CPU_FEATURES"] = wanted
    if "numba" in sys.modules:  # already imported: its config re-reads the environment only when compiling
        sys.modules["numba"].core.config.CPU_FEATURES = wanted


def vector_width_bits() -> int:
    """The widest vectors Numba's compiled kernels use in this process: 512, 256 or 128 bits."""
    from numba.core.registry import cpu_target

    features = cpu_target.target_context.codegen()._tm_features
    if "+avx512f" in features and "-prefer-256-bit" in features:
        return 512
    return 256 if "+avx" in features else 128


def cpuinfo_field(key: str) -> str:
    """The first `key` line's value in /proc/cpuinfo ("vendor_id", "model name", ...), or "" where unknown."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _loaded_openblas() -> str | None:
    """Path of numpy's OpenBLAS among the libraries this process has loaded (/proc/self/maps).

    SciPy bundles an OpenBLAS of its own; the one in numpy's wheel directory is preferred.
    """
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps}
    except OSError:
        return None
    blas = sorted(p for p in paths if "openblas" in os.path.basename(p).lower() and ".so" in p)
    numpys = [p for p in blas if "numpy" in p]
    return (numpys or blas or [None])[0]


def _quiet_openblas_threads() -> str:
    """Make OpenBLAS's idle workers sleep at once instead of spinning; says what was done."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return f"left alone: OPENBLAS_THREAD_TIMEOUT={os.environ['OPENBLAS_THREAD_TIMEOUT']} was set by the user"
    import numpy  # noqa: F401 - its BLAS must be loaded to be found

    path = _loaded_openblas()
    if path is None:
        return "left alone: numpy's BLAS is not an OpenBLAS this process can find"
    lib = ctypes.CDLL(path)
    shutdown = getattr(lib, "blas_thread_shutdown_", None)
    if shutdown is None:
        return f"left alone: {os.path.basename(path)} has no blas_thread_shutdown_ to restart its threads with"
    if threading.active_count() > 1:  # one of them may be inside a matmul: the restart would deadlock
        return (f"left alone: {threading.active_count() - 1} other thread(s) are running and one may be inside a "
                f"matmul, where restarting OpenBLAS's pool deadlocks; set OPENBLAS_THREAD_TIMEOUT="
                f"{OPENBLAS_TIMEOUT_EXPONENT} in the environment before Python starts to have its threads sleep")
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_TIMEOUT_EXPONENT
    read_env = getattr(lib, "openblas_read_env", None)
    if read_env is not None:  # releases that read the timeout with the other settings
        read_env()
    shutdown()
    return f"OpenBLAS threads restarted with OPENBLAS_THREAD_TIMEOUT={OPENBLAS_TIMEOUT_EXPONENT} ({path})"


_prefer_512_bit_vectors()
openblas_threads = _quiet_openblas_threads()  # what was done, for reports and tests
if not openblas_threads.startswith("OpenBLAS threads restarted"):
    log.info("OpenBLAS worker threads %s; fused kernels may run slower right after a matmul", openblas_threads)

# Not about the CPU, but this module runs before any kernel is defined: from here on, Numba's cache of
# a kernel also notices edits to the sibling modules it inlines (kernels/numba_cache.py).
from . import numba_cache as _numba_cache  # noqa: E402

_numba_cache.install()
