"""Embedding backward (rows of g added into the rows of the weight gradient that the ids picked):
a NumPy reference and a fused Numba twin.

np.add.at is NumPy's only unbuffered scatter-add, and it is slow on rows: 35 ms for SimCSE's
4096 tokens x 384 into MiniLM's (30522, 384) table, three embeddings per step. The fused twin is a
plain serial loop (serial, so repeated ids need no atomics) adding each token's row in token
order, the order np.add.at adds them, so both twins give the same floats.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register


def embedding_backward_reference(ids: np.ndarray, g: np.ndarray, gw: np.ndarray) -> None:
    """gw = 0, then gw[ids[i]] += g[i] for every i in order; ids (N,) in range, g (N, dim) (plain NumPy)."""
    gw.fill(0)
    np.add.at(gw, ids, g)


@numba.njit(cache=True, error_model="numpy")
def _scatter_add(ids, g, gw):
    gw[:] = 0
    n, d = g.shape
    for i in range(n):
        row = gw[ids[i]]
        src = g[i]
        for j in range(d):
            row[j] += src[j]


def embedding_backward_fused(ids: np.ndarray, g: np.ndarray, gw: np.ndarray) -> None:
    """Same contract as `embedding_backward_reference`: one serial pass over the tokens."""
    _scatter_add(ids, g, gw)


register("embedding_backward", "reference", embedding_backward_reference)
register("embedding_backward", "fused", embedding_backward_fused)
