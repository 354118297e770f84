"""The ops' array work is all in the captured replay's recording (compile/captured.py, tensorarena/tape.py).

Each model below uses one op so that it affects the loss, trains on the captured replay and on the Python
replay with the same seeds over three different batches, and must (a) really replay its recording and
(b) train bit for bit as the Python replay. An op that writes an array with plain NumPy outside a kernel
or `tape.host`, or reads a value from the data outside them, has its capture refused, and (a) fails.

Without the host() calls in ops/reduce.py, ops/index.py, ops/shape.py, ops/linalg.py and mse_loss these
failed, each with its capture refused ("the recording's loss differ from the Python replay's"), checked with
`python -m pytest -q -p no:cacheprovider tests/test_captured_ops.py` (24 failed, 1 passed: only "control"):
every case of test_the_op_is_captured_and_trains_bit_for_bit_as_the_python_replay but "control" (sum, sum_all,
mean, mean_all, max_all, max_dim, var, softmax_moved, log_softmax, stack, batched_matmul, getitem_take_columns,
getitem_advanced, where_fixed, where_scalar, where_input, embedding, getitem_take_rows, mse_loss_mean,
mse_loss_sum), and all four cases of test_an_out_of_range_id_raises_on_a_captured_replay.
"embedding_strided_ids" was added after the conversion: with embedding's backward still passing
ids.reshape(-1) (a heap copy for a strided view of the batch) it failed too, refused as "a recorded call
reads an array made outside the plan's buffers".
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy, embedding, log_softmax, mse_loss, softmax
from tensorarena.nn.parameter import Parameter
from tensorarena.ops import stack, where
from tensorarena.train.trainer import Trainer

STEPS, BATCH, VOCAB, TOKENS = 6, 8, 10, 5


def _floats(seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        x = rng.standard_normal((BATCH, 12)).astype(np.float32)
        out.append((x, x[:, :4].argmax(axis=1).astype(np.int64)))
    return out


def _regression(seed=3):
    return [(x, (x[:, :4] * 0.5).astype(np.float32)) for x, _ in _floats(seed)]


def _tokens(seed=4):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        x = rng.integers(0, VOCAB, (BATCH, TOKENS)).astype(np.int64)
        out.append((x, (x[:, 0] % 4).astype(np.int64)))
    return out


def _token_pairs(seed=6):
    """(B, 2, TOKENS) ids: a model reading one of the two rows gets a strided view of the batch."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        x = rng.integers(0, VOCAB, (BATCH, 2, TOKENS)).astype(np.int64)
        out.append((x, (x[:, 1, 0] % 4).astype(np.int64)))
    return out


def _bools(seed=5):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        x = rng.random((BATCH, 16)) < 0.5
        out.append((x, x[:, :4].sum(axis=1).astype(np.int64) % 4))
    return out


class _Net(Module):
    """x (B, 12) -> Linear -> h (B, 16) -> `mid` (B, width) -> Linear -> (B, 4)."""

    width = 16

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.l1 = Linear(12, 16, rng=rng)
        self.l2 = Linear(self.width, 4, rng=rng)
        self.setup(rng)

    def setup(self, rng) -> None:
        pass

    def forward(self, x):
        h = self.l1(x)
        return self.l2(self.mid(h, h.shape[0]))


class _Tokens(Module):
    """Integer x (B, TOKENS) -> rows of a (VOCAB, 6) table -> Linear -> (B, 16) -> Linear -> (B, 4)."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.table = Parameter(rng.standard_normal((VOCAB, 6)).astype(np.float32))
        self.l1 = Linear(TOKENS * 6, 16, rng=rng)
        self.l2 = Linear(16, 4, rng=rng)

    def forward(self, x):
        rows = self.lookup(x)  # (B, TOKENS, 6)
        return self.l2(self.l1(rows.reshape(x.shape[0], TOKENS * 6)).tanh())


class Sum(_Net):
    width = 4

    def mid(self, h, b):
        return h.reshape(b, 4, 4).sum(dim=1)


class SumAll(_Net):
    def mid(self, h, b):
        return h * h.sum()


class Mean(_Net):
    width = 4

    def mid(self, h, b):
        return h.reshape(b, 4, 4).mean(dim=-1)


class MeanAll(_Net):
    def mid(self, h, b):
        return h * h.mean()


class MaxAll(_Net):
    def mid(self, h, b):
        return h * h.max()


class MaxDim(_Net):
    width = 4

    def mid(self, h, b):
        return h.reshape(b, 4, 4).max(dim=1).values


class Var(_Net):
    width = 4

    def mid(self, h, b):
        return h.reshape(b, 4, 4).var(dim=-1)


class SoftmaxMoved(_Net):  # not the last dim: the moved-axis copies
    def mid(self, h, b):
        return softmax(h.reshape(b, 4, 4), dim=1).reshape(b, 16)


class LogSoftmax(_Net):
    def mid(self, h, b):
        return log_softmax(h.reshape(b, 4, 4), dim=1).reshape(b, 16)


class Stack(_Net):
    width = 32

    def mid(self, h, b):
        return stack([h, h.tanh()], dim=1).reshape(b, 32)


class BatchedMatmul(_Net):  # matmul's batched products, forward and backward (transposed views)
    def mid(self, h, b):
        m = h.reshape(b, 4, 4)
        return (m @ m.transpose(1, 2)).reshape(b, 16)


class TakeColumns(_Net):  # getitem's np.take path along axis 1, with repeated ids (the gradient accumulates)
    def setup(self, rng):
        self.register_buffer("cols", np.array([0, 0, 3, 5, 5, 5, 1, 2, 15, 14, 9, 9, 8, 7, 6, 4]))

    def mid(self, h, b):
        return h[:, self.cols]


class PickPairs(_Net):  # getitem's general advanced-index path
    width = 6

    def setup(self, rng):
        self.register_buffer("i", np.array([0, 1, 1, 3, 2, 0]))
        self.register_buffer("j", np.array([2, 1, 1, 0, 3, 2]))

    def mid(self, h, b):
        return h.reshape(b, 4, 4)[:, self.i, self.j]


class WhereFixed(_Net):
    def setup(self, rng):
        self.register_buffer("mask", rng.random(16) < 0.5)

    def mid(self, h, b):
        return where(self.mask, h, h.tanh())


class WhereScalar(WhereFixed):
    def mid(self, h, b):
        return where(self.mask, h, 0.0)


class WhereInput(Module):
    """The condition is the (bool) batch itself: it changes with every batch."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.on = Parameter(rng.standard_normal(16).astype(np.float32))
        self.off = Parameter(rng.standard_normal(16).astype(np.float32))
        self.l2 = Linear(16, 4, rng=rng)

    def forward(self, x):
        return self.l2(where(x, self.on, self.off))


class Embed(_Tokens):
    def lookup(self, x):
        return embedding(x, self.table)


class EmbedStrided(_Tokens):  # ids that are a non-contiguous view of the batch
    def lookup(self, x):
        return embedding(x[:, 1], self.table)


class TakeRows(_Tokens):  # getitem's np.take path along axis 0 with the batch's ids
    def lookup(self, x):
        return self.table[x]


class Plain(_Net):
    def mid(self, h, b):
        return h.tanh()


def _mse_sum(out, y):
    return mse_loss(out, y, reduction="sum")


CASES = {
    "control": (Plain, _floats, cross_entropy),  # no op of this file: captured before the conversion too
    "sum": (Sum, _floats, cross_entropy),
    "sum_all": (SumAll, _floats, cross_entropy),
    "mean": (Mean, _floats, cross_entropy),
    "mean_all": (MeanAll, _floats, cross_entropy),
    "max_all": (MaxAll, _floats, cross_entropy),
    "max_dim": (MaxDim, _floats, cross_entropy),
    "var": (Var, _floats, cross_entropy),
    "softmax_moved": (SoftmaxMoved, _floats, cross_entropy),
    "log_softmax": (LogSoftmax, _floats, cross_entropy),
    "stack": (Stack, _floats, cross_entropy),
    "batched_matmul": (BatchedMatmul, _floats, cross_entropy),
    "getitem_take_columns": (TakeColumns, _floats, cross_entropy),
    "getitem_advanced": (PickPairs, _floats, cross_entropy),
    "where_fixed": (WhereFixed, _floats, cross_entropy),
    "where_scalar": (WhereScalar, _floats, cross_entropy),
    "where_input": (WhereInput, _bools, cross_entropy),
    "embedding": (Embed, _tokens, cross_entropy),
    "embedding_strided_ids": (EmbedStrided, _token_pairs, cross_entropy),
    "getitem_take_rows": (TakeRows, _tokens, cross_entropy),
    "mse_loss_mean": (Plain, _regression, mse_loss),
    "mse_loss_sum": (Plain, _regression, _mse_sum),
}


def _captured_count():
    return kernels.calls[("fused_replay", "captured")]


def _train(make_model, batches, loss_fn, replay, steps=STEPS):
    model = make_model()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), loss_fn, route="fused", fused_replay=replay)
    reports = [trainer.step(*batches[i % len(batches)]) for i in range(steps)]
    return model, trainer, reports


@pytest.mark.parametrize("case", list(CASES))
def test_the_op_is_captured_and_trains_bit_for_bit_as_the_python_replay(case):
    make_model, make_batches, loss_fn = CASES[case]
    batches = make_batches()
    p_model, _, p_reports = _train(make_model, batches, loss_fn, "python")
    before = _captured_count()
    c_model, c_trainer, c_reports = _train(make_model, batches, loss_fn, "captured")
    capture = c_trainer.fused.plan.capture
    assert capture.tape is not None, capture.note
    assert _captured_count() - before == STEPS  # every step replayed the recording
    assert [r.loss for r in c_reports] == [r.loss for r in p_reports]
    assert len({r.loss for r in p_reports}) > 1  # the batches (and updates) really differ
    for p, q in zip(p_model.parameters(), c_model.parameters()):
        np.testing.assert_array_equal(q.data, p.data)


@pytest.mark.parametrize("make_model, bad, message", [
    (Embed, VOCAB, rf"embedding: index {VOCAB} is out of range for num_embeddings={VOCAB}"),
    (Embed, -1, rf"embedding: index -1 is out of range for num_embeddings={VOCAB}"),
    (TakeRows, VOCAB, rf"index {VOCAB} is out of bounds for dimension 0 with size {VOCAB}"),
    (TakeRows, -VOCAB - 1, rf"index {-VOCAB - 1} is out of bounds for dimension 0 with size {VOCAB}"),
])
def test_an_out_of_range_id_raises_on_a_captured_replay(make_model, bad, message):
    # The bounds check reads the batch's ids: it must run on every replay, not only while recording.
    model, trainer, _ = _train(make_model, _tokens(), cross_entropy, "captured", steps=2)
    assert trainer.fused.plan.capture.tape is not None, trainer.fused.plan.capture.note
    before = [p.data.copy() for p in model.parameters()]
    x, y = _tokens(seed=9)[0]
    x[3, 2] = bad
    with pytest.raises(IndexError, match=message):
        trainer.step(x, y)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
    trainer.step(*_tokens(seed=9)[1])  # and the next good batch trains on the recording again
    assert trainer.fused.plan.capture.tape is not None
