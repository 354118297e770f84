"""kernels.blas.matmul keeps batched products on BLAS (NumPy's naive loop was ~400x slower).

The speed itself is a benchmark matter (timing np.matmul(q, k.swapaxes(-1, -2)) for q, k of shape
(19, 12, 142, 32) float32 gave ~3.5 s here, ~8 ms through this helper); these tests check the
route that avoids the slow loop, and the values.
"""

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.kernels import blas


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_match_numpy_for_every_layout(dtype):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 2, 5, 4)).astype(dtype)
    k = rng.standard_normal((3, 2, 6, 4)).astype(dtype)
    np.testing.assert_allclose(blas.matmul(q, k.swapaxes(-1, -2)), np.matmul(q, k.swapaxes(-1, -2)), rtol=1e-6)
    out = np.empty((3, 2, 4, 4), dtype)
    blas.matmul(q.swapaxes(-1, -2), q, out=out)
    np.testing.assert_allclose(out, np.matmul(q.swapaxes(-1, -2), q), rtol=1e-6)
    a2 = rng.standard_normal((5, 4)).astype(dtype)
    np.testing.assert_allclose(blas.matmul(a2.T, a2), a2.T @ a2, rtol=1e-6)


def test_only_batched_transposed_views_are_copied():
    x = np.zeros((2, 3, 4, 5), np.float32)
    assert blas._blasable(x) is x
    batches = x[1:]
    assert blas._blasable(batches) is batches  # a slice of whole batches keeps contiguous slices
    flat_t = x[0, 0].T
    assert blas._blasable(flat_t) is flat_t  # 2-D transposes go to BLAS with a transpose flag
    t = x.swapaxes(-1, -2)
    copy = blas._blasable(t)
    assert copy is not t and copy.flags.c_contiguous


def test_copies_go_to_the_open_arena():
    x = np.zeros((2, 3, 4, 5), np.float32)
    with ta.Arena() as arena:
        blas._blasable(x.swapaxes(-1, -2))
        assert arena.stats.allocations == 1
