"""Micro-batches and evaluate() batches of tensorarena's class-index losses weigh their counted targets
(compile/loss_shares.py), found by a hunt of 2026-12-07.

Before: each piece weighed its rows, so a micro-batch whose targets were all ignore_index had a 0 / 0 = NaN loss
that stopped a batch that trains whole (NonFiniteLossError "lower the learning rate" on eager, fused and
streaming; with on_nonfinite='skip' the whole step was skipped), a micro-batched step with ignored targets or class
weights was another update than the whole batch's, and evaluate() gave NaN for a batch_size that cut out such a
piece, counting ignored labels as misses in its accuracy. Run on the commit before the one that added this file
(a worktree of it first on PYTHONPATH), 15 of its 17 cases failed; the 2 that passed are the controls: a batch
whose targets are all ignored stays a non-finite loss when micro-batched (eager, fused).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import nn, optim
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy, nll_loss
from tensorarena.train.trainer import Trainer

X = np.random.default_rng(0).standard_normal((8, 5))
# micro-batches of 3: rows 3..5 all ignored; the others count 3 and 2 targets (not 3 and 2 rows of 3)
Y = np.array([1, 2, 0, -100, -100, -100, 3, -100])


def _model(seed=0):
    return MLP(MLPConfig(5, (7,), 4, dtype=np.float64), rng=np.random.default_rng(seed))


IMAGES = np.random.default_rng(1).standard_normal((8, 3, 8, 8))


def _vit():
    cfg = ViTConfig(image_size=8, patch_size=4, num_classes=4, dim=16, depth=2, num_heads=2, dtype=np.float64)
    return ViT(cfg, rng=np.random.default_rng(0))  # streamable (MLP is not), so every route runs the same model


def _step(route, loss_fn, micro_batch, tmp_path=None, steps=3, make=_vit, x=IMAGES):
    model = make()
    # SGD: Adam would turn the key bias's zero gradient (softmax ignores it), float noise, into lr-sized steps
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.5), loss_fn, route=route,
                      micro_batch=micro_batch, store_dir=None if tmp_path is None else tmp_path / f"{route}")
    losses = [trainer.step(x, Y).loss for _ in range(steps)]
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return losses, {k: p.data.copy() for k, p in model.named_parameters()}


_LOSSES = {
    "cross_entropy": cross_entropy,
    "CrossEntropyLoss": nn.CrossEntropyLoss(),
    "CrossEntropyLoss(label_smoothing)": nn.CrossEntropyLoss(label_smoothing=0.2),
    "CrossEntropyLoss(weight)": nn.CrossEntropyLoss(weight=np.array([0.5, 2.0, 1.0, 3.0])),
    "partial(nll_loss, weight)": lambda out, y: nll_loss(ta.log_softmax(out, -1), y,
                                                        weight=ta.tensor(np.array([0.5, 2.0, 1.0, 3.0]))),
}


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
@pytest.mark.parametrize("name", ["cross_entropy", "CrossEntropyLoss", "CrossEntropyLoss(label_smoothing)",
                                  "CrossEntropyLoss(weight)"])
def test_micro_batches_of_a_class_index_loss_update_as_the_whole_batch(route, name, tmp_path):
    loss_fn = _LOSSES[name]
    whole_losses, whole = _step("eager", loss_fn, None)
    losses, params = _step(route, loss_fn, 3, tmp_path)  # one micro-batch has no counted target
    np.testing.assert_allclose(losses, whole_losses, rtol=1e-12, atol=1e-12)
    for key, value in whole.items():
        np.testing.assert_allclose(params[key], value, rtol=1e-10, atol=1e-12, err_msg=key)


def test_a_loss_of_one_s_own_is_weighed_by_rows_as_before():
    # Control: the lambda is no loss loss_shares knows, so its micro-batches weigh their rows (w = 3/8, 3/8, 2/8).
    from tensorarena.compile.loss_shares import piece_shares

    own = _LOSSES["partial(nll_loss, weight)"]
    assert piece_shares(own, [Y[:3], Y[3:6], Y[6:]]) is None
    assert piece_shares(functools.partial(nll_loss, weight=np.array([0.5, 2.0, 1.0, 3.0])),
                        [Y[:3], Y[3:6], Y[6:]]) == pytest.approx([(0.5 + 2.0 + 1.0) / 6.5, 0.0, 3.0 / 6.5])


def test_sum_reduction_adds_micro_batches():
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    whole_losses, whole = _step("eager", loss_fn, None, make=_model, x=X)
    for route in ("eager", "fused"):
        losses, params = _step(route, loss_fn, 3, make=_model, x=X)
        np.testing.assert_allclose(losses, whole_losses, rtol=1e-12)
        for key, value in whole.items():
            np.testing.assert_allclose(params[key], value, rtol=1e-10, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_a_batch_whose_targets_are_all_ignored_is_still_a_non_finite_loss(route):
    # The whole batch's mean is 0 / 0 too: the micro-batches keep the whole batch's verdict.
    model = _model()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route, micro_batch=3,
                      on_nonfinite="skip")
    report = trainer.step(X, np.full(8, -100))
    assert report.skipped and np.isnan(report.loss)


def test_evaluate_gives_the_whole_data_s_loss_and_leaves_ignored_labels_out_of_the_accuracy():
    model = _model()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(), route="eager")
    whole = trainer.evaluate(X, Y, batch_size=8)
    model.eval()
    logits = model(ta.tensor(X))
    want = cross_entropy(logits, Y).item()
    kept = Y != -100
    want_accuracy = float((logits.numpy().argmax(-1)[kept] == Y[kept]).mean())
    for batch_size in (8, 3, 2, 1):  # batch_size 3 and 1 cut out pieces with nothing counted
        got = trainer.evaluate(X, Y, batch_size=batch_size)
        assert got["loss"] == pytest.approx(want, rel=1e-12)
        assert got["accuracy"] == pytest.approx(want_accuracy)
    assert whole["accuracy"] == pytest.approx(want_accuracy)
