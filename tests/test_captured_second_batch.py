"""batches.second_batch on integer inputs that pack columns of different ranges, e.g. token ids and type ids.

The second checking batch used to roll an integer input along its last axis and swap the batch's global
smallest and largest values, moving ids of one column into another: the Python pass on it indexed past
the smaller table, and the capture was refused (safely, but the step then kept the slower Python replay).
Now each value stays within the values its own position held over the batch. Shown to fail before the change:
`python -m pytest -q -p no:cacheprovider tests/test_captured_second_batch.py` gave 2 failed, 1 passed
(the two-table model's capture was refused with "replaying the recording failed (IndexError: embedding:
index 36 is out of range for num_embeddings=2 ...)", and the unit test's columns took each other's values).
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.compile.batches import second_batch
from tensorarena.nn import Embedding, Linear, Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer
from test_captured_replay import _assert_same

TOKENS, TYPES = 50, 2


class _TwoTables(Module):
    """A (N, 2) int64 input: column 0 token ids in [0, 50), column 1 type ids in [0, 2), each looked up in its
    own table (as BERT's input ids and token type ids would be if packed into one array)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = Embedding(TOKENS, 8, rng=np.random.default_rng(0))
        self.types = Embedding(TYPES, 8, rng=np.random.default_rng(1))
        self.head = Linear(8, 3, rng=np.random.default_rng(2))

    def forward(self, x):
        return self.head(self.tokens(x.data[:, 0]) + self.types(x.data[:, 1]))


def _packed(n, batch=8, seed=4):
    rng = np.random.default_rng(seed)
    return [(np.stack([rng.integers(0, TOKENS, batch), rng.integers(0, TYPES, batch)], axis=1),
             rng.integers(0, 3, batch)) for _ in range(n)]


def test_an_input_packing_ids_of_two_tables_is_captured():
    batches = _packed(3)
    runs = []
    for replay in ("python", "captured"):
        model = _TwoTables()
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route="fused",
                          fused_replay=replay)
        before = kernels.calls[("fused_replay", "captured")]
        reports = [trainer.step(*batches[i % len(batches)]) for i in range(6)]
        runs.append((model, trainer, reports, kernels.calls[("fused_replay", "captured")] - before))
    python, captured = runs
    capture = captured[1].fused.plan.capture
    assert capture.tape is not None and capture.note == "captured", capture.note
    assert captured[3] == 6  # every step ran the recording
    _assert_same(python[:3], captured[:3])  # bit for bit


def test_second_batch_keeps_each_integer_column_within_its_own_values():
    rng = np.random.default_rng(5)
    a = np.stack([rng.integers(0, 30000, 16), rng.integers(0, 2, 16), np.full(16, 7)], axis=1)  # (16, 3)
    b = second_batch(a)
    assert b.shape == a.shape and b.dtype == a.dtype and not np.array_equal(b, a)
    for j in range(a.shape[1]):
        assert set(np.unique(b[:, j])) <= set(np.unique(a[:, j])), j
    # the values change, not only their order: a count the step took from the batch moves (as the std of
    # test_captured_replay's test_a_number_computed_from_the_batch_is_still_refused does for floats)
    assert (a[:, 1] == 1).sum() != 8 and (b[:, 1] == 1).sum() != (a[:, 1] == 1).sum()
    np.testing.assert_array_equal(b[:, 2], 7)  # a constant column stays what it is

    # 3-D (B, T, 2): columns along the last axis, the roll along the batch
    c = np.stack([rng.integers(0, 50, (4, 5)), rng.integers(0, 2, (4, 5))], axis=-1)
    d = second_batch(c)
    assert not np.array_equal(d, c)
    for j in range(2):
        assert set(np.unique(d[..., j])) <= set(np.unique(c[..., j]))
    # (B, 2, T): ids and mask packed along a middle axis (test_captured_replay's _MaskedBert). Taking the
    # ranges over the whole array but the last axis put ids into the mask's channel.
    e = np.stack([rng.integers(1, 40, (4, 7)), rng.integers(0, 2, (4, 7))], axis=1)
    f = second_batch(e)
    assert not np.array_equal(f, e)
    assert set(np.unique(f[:, 1])) <= {0, 1} and set(np.unique(f[:, 0])) <= set(np.unique(e[:, 0]))


def test_second_batch_of_two_rows_still_changes_within_columns():
    # Two rows: rolled, they swap; swapping each column's smallest and largest swaps them back. The swap
    # alone changes them, each column keeping its own values (before: the global change mixed them).
    a = np.array([[41, 1], [7, 0]])
    np.testing.assert_array_equal(second_batch(a), [[7, 0], [41, 1]])


def test_second_batch_falls_back_to_the_global_change_when_columns_cannot_change():
    # A batch of one row (nothing to roll, one value per column) or constant columns: kept within their
    # columns, B would equal A and the capture be refused; the global change still makes B differ.
    one = np.array([[41, 1, 5]])
    np.testing.assert_array_equal(second_batch(one), [[5, 1, 41]])  # rolled [5, 41, 1], then 1 <-> 41
    flat = np.tile([3, 0, 1], (4, 1))
    np.testing.assert_array_equal(second_batch(flat), np.tile([1, 0, 3], (4, 1)))  # [1, 3, 0], 0 <-> 3
    # and floats and 1-D integers are made as before
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(second_batch(x), np.roll(x, 1, axis=-1) * np.float32(1.5) + np.float32(0.25))
    y = np.array([2, 0, 1, 1])
    np.testing.assert_array_equal(second_batch(y), [1, 0, 2, 1])  # rolled [1, 2, 0, 1], then 0 <-> 2


@pytest.mark.parametrize("a", [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5,
    np.linspace(-1, 1, 5),  # float64, 1-D
    np.array(2.5, np.float32),  # 0-d
    np.array([[3, 0, 9], [1, 5, 2]], np.int64),
    np.array([4, 0, 7, 4], np.int32),
], ids=["f32-3d", "f64-1d", "f32-0d", "i64-2d", "i32-1d"])
def test_second_batch_made_into_a_buffer_equals_the_one_made_alone(a):
    # The capture makes B in the plan's own input buffer (batches.SecondOf), not as a copy beside it: the
    # same values, bit for bit, as second_batch(a) on its own, which the other tests here check.
    out = np.full_like(a, 99)
    assert second_batch(a, out=out) is out
    np.testing.assert_array_equal(out, second_batch(a))
