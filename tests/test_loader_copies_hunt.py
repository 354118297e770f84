"""BatchLoader.next() copies a batch straight into its buffers, and a draw that fails does not move the loader.

Found by a helper's hunt of tensorarena/data:
- np.take(..., out=) with its default mode="raise" fills `out` through a temporary of the batch's size (NumPy
  documents the buffering): 18.4 MiB a call for ViT inputs at 224 px and batch 32, which glibc kept resident, so
  RSS grew by one batch no plan counted, against the loader's "no per-step allocation".
- the cursor moved (and at an epoch's end a new shuffle was drawn) before the copy: a copy that raised (a
  memmap's I/O error, no memory) left the loader past a batch never returned, and the job's save after the
  error resumed one batch later than an uninterrupted run.

On 59aa01a both tests fail:
    git worktree add /tmp/wt 59aa01a && cp tests/test_loader_copies_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_loader_copies_hunt.py)
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tensorarena.data.loader import BatchLoader


def test_next_allocates_no_batch_sized_temporary():
    x = np.ones((64, 3, 64, 64), np.float32)  # 1.5 MiB a batch of 32
    y = np.zeros(64, np.int64)
    loader = BatchLoader(x, y, 32, rng=np.random.default_rng(0))
    batch_bytes = loader._x.nbytes + loader._y.nbytes
    loader.next()
    tracemalloc.start()
    try:
        for _ in range(6):
            got_x, got_y = loader.next()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < batch_bytes / 16, f"next() allocated {peak} bytes at its peak; a batch is {batch_bytes}"
    # And the rows are the shuffle's, unchanged by mode="clip".
    order = np.asarray(loader.state()["order"])
    cursor = loader.state()["cursor"]
    np.testing.assert_array_equal(got_x, x[order[cursor - 32:cursor]])
    np.testing.assert_array_equal(got_y, y[order[cursor - 32:cursor]])


class _FailingTake(np.ndarray):
    """Rows whose take() number `failing` raises, as a memmap's read or an allocation may."""

    calls = 0
    failing = 2

    def take(self, *args, **kwargs):
        type(self).calls += 1
        if type(self).calls == type(self).failing:
            raise MemoryError("simulated: the batch could not be copied")
        return np.ndarray.take(np.asarray(self), *args, **kwargs)


@pytest.mark.parametrize("batch, failing", [(3, 2), (5, 3)], ids=["mid_epoch", "new_epochs_shuffle"])
def test_a_failed_draw_leaves_the_position_before_the_batch(batch, failing):
    # 10 rows: batch 3's second draw is mid-epoch; batch 5's third draw starts the second epoch, shuffling anew.
    x = np.arange(20.0, dtype=np.float32).reshape(10, 2)
    y = np.arange(10, dtype=np.int64)
    reference = BatchLoader(x, y, batch, rng=np.random.default_rng(7))
    for _ in range(failing):
        expected = reference.next()[1].copy()
    _FailingTake.calls, _FailingTake.failing = 0, failing
    loader = BatchLoader(x.view(_FailingTake), y, batch, rng=np.random.default_rng(7))
    for _ in range(failing - 1):
        loader.next()
    with pytest.raises(MemoryError, match="simulated"):
        loader.next()
    state = loader.state()
    resumed = BatchLoader(x, y, batch, rng=np.random.default_rng(0))
    resumed.load_state(state)
    np.testing.assert_array_equal(resumed.next()[1], expected)
    # The loader itself goes on with that batch too.
    np.testing.assert_array_equal(loader.next()[1], expected)
