"""The fused (Numba) twins of kernels.elementwise: add, bias_add and column_sum on both cores.

Apart from kernels.elementwise so that the ops, which call its dispatchers, do not import Numba
with tensorarena; kernels._load imports this file with the other kernels.

Also the scratch of every kernel that sums a gradient over rows (column_sum here, bias_gelu_backward
and layer_norm_backward): `partial_rows` takes its float64 per-chunk rows from the step's arena, so a
fused step plans them into its slab like any other buffer (a replayed step allocates no array memory;
np.zeros here made (threads, D) float64 on the heap on every call), and `sum_partials` adds them
into the output inside Numba, without the (D,) float64 temporary that part.sum(axis=0) made.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
del _cpu  # imported for that side effect only
import numba
import numpy as np

from ..memory.arena import empty
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


def partial_rows(n: int, d: int, dtype=np.float64, planes: int = 0) -> np.ndarray:
    """Uninitialised per-chunk partial rows for a kernel that sums n rows of width d: (chunks, d), or
    (planes, chunks, d) for several sums, with one chunk per thread (at most n), from the current
    arena: a fused step plans them into its slab; with no arena open (a standalone call), the heap.
    The kernel zeroes the rows it uses; the chunk count is the rows' first (or second) dimension."""
    chunks = max(1, min(n, numba.get_num_threads()))
    return empty((planes, chunks, d) if planes else (chunks, d), dtype)


@numba.njit(cache=True, error_model="numpy")
def sum_partials(part, out):
    """out = part.sum(axis=0), rounded once into out's dtype; part (chunks, D) float64 is overwritten.
    The rows are added in chunk order into part[0], as NumPy's axis-0 sum adds them, so the result
    is the one `np.copyto(out, part.sum(axis=0), casting="same_kind")` gave, bit for bit, with no
    (D,) temporary (and a float32 overflow is inf, as that cast made it, but without NumPy's warning)."""
    total = part[0]
    for c in range(1, part.shape[0]):
        row = part[c]
        for j in range(total.shape[0]):
            total[j] += row[j]
    for j in range(total.shape[0]):
        out[j] = total[j]


@numba.njit(parallel=True, **_JIT)
def _column_sum(x, part, nchunks):
    n, d = x.shape
    for c in numba.prange(nchunks):  # one float64 partial row per chunk: no two threads share a slot
        c64 = np.int64(c)  # prange's index is unsigned: keep the row arithmetic in int64
        acc = part[c]
        acc[:] = 0.0  # the rows are the arena's, uninitialised (partial_rows)
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
    part = partial_rows(*x.shape)
    _column_sum(x, part, part.shape[0])
    sum_partials(part, out)


register("add", "fused", add_fused)
register("bias_add", "fused", bias_add_fused)
register("column_sum", "fused", column_sum_fused)
