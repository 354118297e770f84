"""Many small independent matrix products, split over the cores with one BLAS thread each.

Attention does one (T x hs) @ (hs x T) product per (batch, head) slice: 24 of ~5 MFLOP each on
ViT-Tiny batch 8. One such product is too small for OpenBLAS to share well between its own
threads; measured here (2 cores): the 24 q k^T slices took 1.66 ms one after another with
OpenBLAS's 2 threads per call, 1.08 ms as two halves on two Python threads, each product on one
BLAS thread. NumPy releases the GIL inside matmul, so plain Python threads do run in parallel.

How the BLAS is held to one thread matters. numpy's OpenBLAS (0.3.31) has
`openblas_set_num_threads_local`, but in this build it sets the *global* count and returns the
global one: two threads each saving and restoring "their" value raced, and the count was left at
1, so every later big matmul ran on one core (2.4x slower; that is what made an earlier version of
this split slower inside a training step). So the caller alone sets the global count to 1 for the
duration of the split and restores what it read, after every worker has finished (`one_thread`, which
kernels.gemm_jobs and kernels.attention_heads also hold around their loops of one-thread OpenBLAS calls:
the first holder saves the count, the last restores it, so holders in other threads never race).

Where OpenBLAS's get/set functions are not found (another BLAS) the products run one after
another: `parallel_available()` says so, the reason is logged once, and `calls` counts which way
each split ran. While a split runs, a matmul from another thread of the program also gets one
BLAS thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from .cpu import _loaded_openblas

log = logging.getLogger("tensorarena")

calls: Counter = Counter()  # "parallel" / "serial" -> splits run that way

# Exported names of OpenBLAS's global thread count, in numpy's scipy-openblas build and in a plain one.
_NAMES = [("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
          ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
          ("openblas_get_num_threads", "openblas_set_num_threads")]


def _find_thread_count_control():
    """(get, set) of numpy's OpenBLAS global thread count, or (None, reason)."""
    import numpy  # noqa: F401 - its BLAS must be loaded to be found

    path = _loaded_openblas()
    if path is None:
        return None, "numpy's BLAS is not an OpenBLAS this process can find"
    lib = ctypes.CDLL(path)  # already loaded by numpy: the same library, not a second copy
    for get_name, set_name in _NAMES:
        get, put = getattr(lib, get_name, None), getattr(lib, set_name, None)
        if get is not None and put is not None:
            get.argtypes, get.restype = [], ctypes.c_int
            put.argtypes, put.restype = [ctypes.c_int], None
            return (get, put), ""
    return None, f"no openblas_get/set_num_threads in {os.path.basename(path)}"


_control, _why_not = _find_thread_count_control()
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_pool: ThreadPoolExecutor | None = None
_warned = False
_split_lock = threading.Lock()  # one split at a time: they share the pool's workers
_hold_lock = threading.Lock()
_holders = 0  # code holding OpenBLAS at one thread now (one_thread)
_held_from = 1  # the count the first holder found, restored by the last


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Hold numpy's OpenBLAS at one thread (its count is process-wide, see the module docstring); nested and
    concurrent holders share one save and one restore. Without `_control` there is no count to hold (and
    kernels.gemm_library never sends products to OpenBLAS)."""
    global _holders, _held_from
    if _control is None:
        yield
        return
    get, put = _control
    with _hold_lock:
        if _holders == 0:
            _held_from = get()
            if _held_from != 1:
                put(1)
        _holders += 1
    try:
        yield
    finally:
        with _hold_lock:
            _holders -= 1
            if _holders == 0 and _held_from != 1:
                put(_held_from)


def parallel_available() -> bool:
    """Whether `run_split` can spread work over the cores (a BLAS thread-count control and >= 2 cores)."""
    return _control is not None and _cores >= 2


def run_split(work: Callable[[int, int], None], n: int) -> None:
    """work(lo, hi) over [0, n), split into one contiguous part per core, each on one BLAS thread.

    `work` must only run BLAS products into arrays it was given (no arena allocation: the step's
    arena belongs to the calling thread).
    """
    global _pool, _warned
    parts = min(n, _cores)
    if parts < 2 or not parallel_available():
        if not _warned and n >= 2 and not parallel_available():
            _warned = True
            log.info("small matmuls run one after another, not split over the cores: %s",
                     _why_not or f"{_cores} core(s)")
        calls["serial"] += 1
        work(0, n)
        return
    bounds = [n * i // parts for i in range(parts + 1)]
    with _split_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_cores - 1, thread_name_prefix="tensorarena-blas")
        with one_thread():  # released only after all workers are done
            futures = [_pool.submit(work, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
            try:
                work(bounds[0], bounds[1])
            finally:
                for f in futures:
                    f.result()  # waits for every worker; re-raises a worker's error here
        calls["parallel"] += 1
