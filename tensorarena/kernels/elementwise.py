"""The plain adds and sums around the GEMMs, on both cores: a NumPy reference and a fused Numba twin.

`add`: out = a + b over arrays of one shape (residual connections, gradient accumulation);
`bias_add`: x += bias over the rows of a 2-D x (a linear layer's output); `column_sum`:
out = x.sum(axis=0) of a 2-D x (a bias's gradient), summed in float64 and rounded once.

Why: NumPy runs each of these on one thread. On ViT-Tiny's (1576, 192..768) float32 arrays the
fused twins are 2-5x faster on 2 cores (measured, median of 200: add 0.19 -> 0.04 ms at (1576, 192),
bias_add 0.25 -> 0.05 ms at (1576, 576), column_sum 0.20 -> 0.14 ms at (1576, 576)), ~40 such calls
per step. Arrays under PARALLEL_MIN (2**15) elements stay on NumPy: waking the second thread costs
~3 us, more than such an add takes on one (measured: NumPy 1.5 us for 4096 float32s). The
results are NumPy's bit for bit for add and bias_add (one IEEE add per element either way);
column_sum's float64 partial sums differ from a float32 np.sum in the last bits (they are closer
to the exact sum).

The dispatchers (`add`, `bias_add`, `column_sum`) take the kernel when `fits` says so; anything
else (small, broadcasting, strided, integer) is the op's own NumPy code, as before these kernels.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from . import kernel, register

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
PARALLEL_MIN = 1 << 15  # elements: smaller arrays stay on NumPy (the module docstring says why)


def fits(*arrays: np.ndarray) -> bool:
    """Whether the dispatchers hand these arrays to the kernels: one float dtype, one shape, all
    C-contiguous, at least PARALLEL_MIN elements."""
    first = arrays[0]
    return first.dtype in _FLOATS and first.size >= PARALLEL_MIN and all(
        a.dtype == first.dtype and a.shape == first.shape and a.flags.c_contiguous for a in arrays)


def add_reference(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a + b (out may be a or b)."""
    np.add(a, b, out=out)


def bias_add_reference(x: np.ndarray, bias: np.ndarray) -> None:
    """x (N, D) += bias (D,), in place."""
    x += bias


def column_sum_reference(x: np.ndarray, out: np.ndarray) -> None:
    """out (D,) = x (N, D) summed over its rows, in float64, rounded once into out's dtype."""
    np.copyto(out, x.sum(axis=0, dtype=np.float64), casting="same_kind")


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a + b for the ops: the `add` kernel when the arrays `fit` it, else NumPy's broadcasting add."""
    if fits(a, b, out):
        kernel("add")(a, b, out)
    else:
        host(np.add, a, b, out=out)


def bias_add(x: np.ndarray, bias: np.ndarray) -> None:
    """x (N, D) += bias (D,) for the ops: the `bias_add` kernel when they fit it, else NumPy's."""
    # x.ndim == 2: the kernel compiles for (N, D) only; a 3-D x with a (T, D) bias is NumPy's add
    if fits(x) and x.ndim == 2 and bias.dtype == x.dtype and bias.shape == x.shape[1:] and bias.flags.c_contiguous:
        kernel("bias_add")(x, bias)
    else:
        host(np.add, x, bias, out=x)


def column_sum(x: np.ndarray, out: np.ndarray) -> None:
    """out (D,) = x (N, D) summed over rows for the ops: the `column_sum` kernel when x fits it, else NumPy's."""
    if fits(x) and x.ndim == 2 and out.shape == x.shape[1:]:
        kernel("column_sum")(x, out)
    else:
        host(np.sum, x, axis=0, out=out)


register("add", "reference", add_reference)
register("bias_add", "reference", bias_add_reference)
register("column_sum", "reference", column_sum_reference)
