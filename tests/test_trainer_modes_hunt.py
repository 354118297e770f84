"""Train/eval modes per module, a deferred model before step 1, and the digits split's seed: a helper's hunt.

1. A step set model.train() (every submodule) and evaluate() put back only the top-level flag (model.train(flag)
   hands it to every submodule): a part the user put in eval mode (a frozen backbone's dropout) trained with its
   dropout on again, so two steps at lr=0 gave 1.2241 and 1.1325. Now a step trains the model only when it is in
   eval mode, evaluate/plan/compile/predict put every module's mode back (nn/modes.py), and the fused route's
   plans are keyed by the modes (a change traces the step in the new modes; switching back replays the first).
2. Trainer.plan() and compile() left a model in eval mode in train mode.
3. evaluate() and save() before step 1 raised DeferredParameterError for a model built under nn.deferred_init()
   on route "streaming" or "auto" (the advice: "hand the model to a Trainer", as had been done); now the
   streaming route starts (making the model in its store) or the model is made in memory.
4. data.digits.train_test_split(seed=None) added 1_000_003 to None.

On 8de4784 (before the fix) 9 of this file's 13 tests fail; the controls (a step puts a model in eval mode back
in train mode, as before; dropout really draws masks in train mode) pass on both:
    git worktree add /tmp/wt 8de4784 && cp tests/test_trainer_modes_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=. python -m pytest -q -p no:cacheprovider tests/test_trainer_modes_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import kernels, nn, optim
from tensorarena.models import MLP, MLPConfig, ViT, ViTConfig
from tensorarena.train import Trainer

RNG = np.random.default_rng(0)
X = RNG.standard_normal((16, 8)).astype(np.float32)
Y = RNG.integers(0, 3, 16)
ROUTES = ["eager", "fused"]


def _trainer(route: str, lr: float = 0.0, dropout: float = 0.5):
    model = MLP(MLPConfig(8, (16,), 3, dropout=dropout), rng=np.random.default_rng(1))
    return model, Trainer(model, optim.SGD(model.parameters(), lr=lr), nn.functional.cross_entropy, route=route)


def _dropout(model) -> nn.Module:
    (found,) = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    return found


@pytest.mark.parametrize("route", ROUTES)
def test_a_submodule_in_eval_mode_stays_so_through_steps_and_evaluate(route):
    model, trainer = _trainer(route)
    model.train()
    _dropout(model).eval()  # kept off on purpose
    trainer.evaluate(X, Y, batch_size=8)
    assert not _dropout(model).training and model.training
    losses = [trainer.step(X, Y).loss for _ in range(3)]  # lr 0, dropout off: the same loss each step
    assert losses[0] == losses[1] == losses[2]
    assert not _dropout(model).training


@pytest.mark.parametrize("route", ROUTES)
def test_dropout_in_train_mode_draws_masks(route):  # control: the test above would see them
    model, trainer = _trainer(route)
    losses = [trainer.step(X, Y).loss for _ in range(3)]
    assert len(set(losses)) == 3 and _dropout(model).training


@pytest.mark.parametrize("route", ROUTES)
def test_a_step_trains_a_model_left_in_eval_mode(route):  # control: as before
    model, trainer = _trainer(route)
    model.eval()
    trainer.step(X, Y)
    assert model.training and _dropout(model).training


def test_the_fused_route_traces_again_when_a_mode_changes_and_finds_the_first_plan_back():
    model, trainer = _trainer("fused")
    reference_model, reference = _trainer("eager")
    for dropout_on in (True, False, True, False):
        for m in (model, reference_model):
            _dropout(m).train(dropout_on)
        assert trainer.step(X, Y).loss == pytest.approx(reference.step(X, Y).loss, rel=1e-6)
    assert trainer.fused.traces == 2  # one plan per set of modes; the switches back replay them
    assert kernels.calls[("fused_replay", "captured")] or kernels.calls[("fused_replay", "python")]


@pytest.mark.parametrize("call", ["plan", "compile"])
def test_plan_and_compile_leave_every_mode_as_it_was(call):
    model, trainer = _trainer("fused")
    model.eval()
    getattr(trainer, call)(X, Y)
    assert not model.training and not _dropout(model).training
    model.train()
    _dropout(model).eval()
    getattr(trainer, call)(X, Y)
    assert model.training and not _dropout(model).training


def test_evaluate_puts_every_mode_back_on_an_error_too():
    model, trainer = _trainer("eager")
    model.train()
    _dropout(model).eval()
    with pytest.raises(Exception):
        trainer.evaluate(X, np.full(16, 7), batch_size=8)  # class 7 of 3
    assert model.training and not _dropout(model).training


CFG = ViTConfig(image_size=8, patch_size=4, num_classes=3, dim=16, depth=2, num_heads=2)


@pytest.mark.parametrize("route", ["streaming", "auto"])
def test_a_deferred_model_evaluates_and_saves_before_step_1(route, tmp_path):
    x = np.random.default_rng(0).standard_normal((10, 3, 8, 8)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 3, 10)
    with nn.deferred_init():
        model = ViT(CFG, rng=np.random.default_rng(1))
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=0.01), nn.functional.cross_entropy, route=route,
                      store_dir=tmp_path / "store")
    plain = ViT(CFG, rng=np.random.default_rng(1))  # the same values, made at once
    expected = Trainer(plain, optim.Adam(plain.parameters(), lr=0.01), nn.functional.cross_entropy).evaluate(x, y)
    assert trainer.evaluate(x, y) == pytest.approx(expected, rel=1e-6)
    trainer.save(tmp_path / "c.st")
    from tensorarena.train.checkpoint import TensorFile

    with TensorFile(tmp_path / "c.st") as file:
        for name, value in plain.state_dict().items():
            assert np.array_equal(file.read(f"model.{name}"), value), name
    assert trainer.step(x[:4], y[:4]).loss > 0


def test_the_digits_split_takes_seed_none_as_make_digits_does():
    from tensorarena.data import digits

    (x_train, _), (x_test, _) = digits.train_test_split(10, 5, seed=None)
    assert x_train.shape[0] == 10 and x_test.shape[0] == 5
    (a, _), (b, _) = digits.train_test_split(10, 5, seed=3)
    (c, _), (d, _) = digits.train_test_split(10, 5, seed=3)
    assert np.array_equal(a, c) and np.array_equal(b, d) and not np.array_equal(a[:5], b)
