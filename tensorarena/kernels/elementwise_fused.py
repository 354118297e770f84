"""The fused (Numba) twins of kernels.elementwise: add, bias_add and column_sum on both cores.

Apart from kernels.elementwise so that the ops, which call its dispatchers, do not import Numba
with tensorarena; kernels._load imports this file with the other kernels.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register

_JIT = dict(cache=True, error_model="numpy")


@numba.njit(parallel=True, **_JIT)
def _add(a, b, out):
    for i in numba.prange(out.shape[0]):
        out[i] = a[i] + b[i]


@numba.njit(parallel=True, **_JIT)
def _accumulate(acc, b):
    # acc += b: one array read and written (an out that merely aliased a would fail LLVM's overlap
    # check and run the scalar loop)
    for i in numba.prange(acc.shape[0]):
        acc[i] = acc[i] + b[i]


@numba.njit(parallel=True, **_JIT)
def _bias(x, bias):
    n, d = x.shape
    for r in numba.prange(n):
        row = x[r]
        for j in range(d):
            row[j] = row[j] + bias[j]


@numba.njit(parallel=True, **_JIT)
def _column_sum(x, part, nchunks):
    n, d = x.shape
    for c in numba.prange(nchunks):  # one float64 partial row per chunk: no two threads share a slot
        c64 = np.int64(c)  # prange's index is unsigned: keep the row arithmetic in int64
        acc = part[c]
        for r in range(c64 * n // nchunks, (c64 + 1) * n // nchunks):
            row = x[r]
            for j in range(d):
                acc[j] += row[j]


def add_fused(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """Same contract as `add_reference`; a, b, out one float dtype and shape, C-contiguous."""
    if out is b:
        a, b = b, a
    if out is a:
        _accumulate(out.reshape(-1), b.reshape(-1))
    else:
        _add(a.reshape(-1), b.reshape(-1), out.reshape(-1))


def bias_add_fused(x: np.ndarray, bias: np.ndarray) -> None:
    """Same contract as `bias_add_reference`; x C-contiguous (N, D), bias (D,) of x's dtype."""
    _bias(x, bias)


def column_sum_fused(x: np.ndarray, out: np.ndarray) -> None:
    """Same contract as `column_sum_reference`; x C-contiguous (N, D)."""
    n, d = x.shape
    nchunks = max(1, min(n, numba.get_num_threads()))
    part = np.zeros((nchunks, d))
    _column_sum(x, part, nchunks)
    np.copyto(out, part.sum(axis=0), casting="same_kind")


register("add", "fused", add_fused)
register("bias_add", "fused", bias_add_fused)
register("column_sum", "fused", column_sum_fused)
