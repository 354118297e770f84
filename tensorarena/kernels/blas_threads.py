"""Many small independent matrix products, split over the cores with one BLAS thread each.

Attention does one (T x hs) @ (hs x T) product per (batch, head) slice: 24 of ~5 MFLOP each on
ViT-Tiny batch 8. One such product is too small for OpenBLAS to share well between its own
threads; measured here (2 cores): the 24 q k^T slices took 1.66 ms one after another with
OpenBLAS's 2 threads per call, 1.08 ms as two halves on two Python threads, each held to one
BLAS thread. NumPy releases the GIL inside matmul, so plain Python threads do run in parallel.
OpenBLAS (0.3.27 on) has `openblas_set_num_threads_local`, which sets the BLAS thread count of the
calling thread only, so no other caller's setting changes.

Where that symbol is not found (another BLAS, an older OpenBLAS) the products run one after
another: `parallel_available()` says so, the reason is logged once, and `calls` counts which
way each split ran.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

log = logging.getLogger("tensorarena")

calls: Counter = Counter()  # "parallel" / "serial" -> splits run that way


def _find_set_num_threads_local():
    """numpy's OpenBLAS `openblas_set_num_threads_local`, or None (with the reason)."""
    root = os.path.dirname(np.__file__)
    libs = glob.glob(os.path.join(root + ".libs", "*openblas*")) + glob.glob(os.path.join(root, ".dylibs", "*openblas*"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: the same library, not a second copy
        except OSError:
            continue
        fn = getattr(lib, "openblas_set_num_threads_local", None)
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            return fn, ""
    return None, f"no openblas_set_num_threads_local in numpy's BLAS ({libs or 'no bundled OpenBLAS found'})"


_set_local, _why_not = _find_set_num_threads_local()
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_pool: ThreadPoolExecutor | None = None
_warned = False


def parallel_available() -> bool:
    """Whether `run_split` can spread work over the cores (a BLAS thread-count control and >= 2 cores)."""
    return _set_local is not None and _cores >= 2


def _on_one_blas_thread(work: Callable[[int, int], None], lo: int, hi: int) -> None:
    previous = _set_local(1)
    try:
        work(lo, hi)
    finally:
        _set_local(previous)


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
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_cores - 1, thread_name_prefix="tensorarena-blas")
    bounds = [n * i // parts for i in range(parts + 1)]
    futures = [_pool.submit(_on_one_blas_thread, work, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    try:
        _on_one_blas_thread(work, bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()  # re-raises a worker's error here
    calls["parallel"] += 1
