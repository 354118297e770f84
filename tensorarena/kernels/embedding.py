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
    """Returns the index of the first id out of range (n if none); rows before it are already added."""
    gw[:] = 0
    n, d = g.shape
    v = gw.shape[0]
    for i in range(n):
        k = ids[i]
        if k < -v or k >= v:  # Numba does not bound-check: gw[k] would write past the table
            return i
        row = gw[k]  # a negative id wraps, as np.add.at's index does
        src = g[i]
        for j in range(d):
            row[j] += src[j]
    return n


def embedding_backward_fused(ids: np.ndarray, g: np.ndarray, gw: np.ndarray) -> None:
    """Same contract as `embedding_backward_reference`: one serial pass over the tokens. An id out of range
    raises IndexError as the reference's np.add.at does (gw then holds the rows added before it)."""
    bad = _scatter_add(ids, g, gw)
    if bad < g.shape[0]:
        raise IndexError(f"index {int(ids[bad])} is out of bounds for axis 0 with size {gw.shape[0]} "
                         f"(embedding id {bad} of {g.shape[0]})")


register("embedding_backward", "reference", embedding_backward_reference)
register("embedding_backward", "fused", embedding_backward_fused)
