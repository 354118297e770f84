"""torch's loss modules (nn.MSELoss ... nn.BCEWithLogitsLoss) on the fused route's captured replay, against torch.

Every loss module of tensorarena/nn/layers.py, with and without its class weight / pos_weight, trains a small MLP for
four fused steps with fused_replay="auto"; each step must run the captured replay (kernels.calls counts which replay
ran) and match torch's loss per step and weights after, within float32 tolerances. Then the user changes a weight
between steps, in place and by assignment, and the next step must use the new values.

What failed before (the fixes: compile/captured.py, nn/layers.py):
- a class weight (NLLLoss(weight=w), BCELoss(weight=w), BCEWithLogitsLoss(weight=w / pos_weight=p)) is a buffer of
  the loss module, outside the arrays a recording was allowed to read: the capture was refused ("a recorded call
  reads an array made outside the plan's buffers") and every such loss stayed on the Python replay;
- BCELoss with targets from the batch: the capture's second checking batch scaled them to [0.25, 1.75], where
  binary_cross_entropy rightly refuses a target, so the recording was never checked (the Python replay, for good,
  after three batches);
- nn.CrossEntropyLoss took no weight (torch's does);
- a buffer assigned anew after recording (the loss's weight, or the model's own on replay="captured") was
  replayed at its old array, silently.

29 of these 37 tests fail on 676a83e, the commit this work started from: `git worktree add /tmp/wt-capbuf 676a83e`,
copy this file into /tmp/wt-capbuf/tests/, and from inside /tmp/wt-capbuf run
`PYTHONPATH=/tmp/wt-capbuf python -m pytest -q -p no:cacheprovider tests/test_captured_loss_modules.py`
(then `git worktree remove --force /tmp/wt-capbuf`).
Run: NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_captured_loss_modules.py
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import kernels
from tensorarena.compile.batches import second_batch
from tensorarena.train.trainer import Trainer

W = np.array([0.5, 2.0, 1.0, 3.0], np.float32)  # a class weight over the 4 outputs
P = np.array([3.0, 0.5, 1.0, 2.0], np.float32)  # a pos_weight
LOSS_RTOL = 1e-5  # float32: the same ops in another order of rounding than torch's
WEIGHTS = dict(rtol=1e-4, atol=1e-6)

# (module name, keyword arguments, targets, the model's last layer); "probabilities" are raw targets in [0, 1]
# from the batch, as a user's labels would be (not made from the batch by an op).
CASES = [
    ("MSELoss", {}, "regression", None),
    ("L1Loss", {"reduction": "sum"}, "regression", None),
    ("SmoothL1Loss", {"beta": 0.5}, "regression", None),
    ("HuberLoss", {"delta": 0.5}, "regression", None),
    ("CrossEntropyLoss", {}, "classes", None),
    ("CrossEntropyLoss", {"label_smoothing": 0.1, "ignore_index": 3}, "classes", None),
    ("CrossEntropyLoss", {"weight": W}, "classes", None),
    ("CrossEntropyLoss", {"weight": W, "reduction": "sum", "ignore_index": 1}, "classes", None),
    ("CrossEntropyLoss", {"weight": W, "label_smoothing": 0.1, "ignore_index": 3}, "classes", None),
    ("NLLLoss", {}, "classes", "LogSoftmax"),
    ("NLLLoss", {"weight": W}, "classes", "LogSoftmax"),
    ("NLLLoss", {"weight": W, "ignore_index": 2}, "classes", "LogSoftmax"),
    ("BCELoss", {}, "probabilities", "Sigmoid"),
    ("BCELoss", {"weight": W, "reduction": "sum"}, "probabilities", "Sigmoid"),
    ("BCEWithLogitsLoss", {}, "probabilities", None),
    ("BCEWithLogitsLoss", {"weight": W}, "probabilities", None),
    ("BCEWithLogitsLoss", {"pos_weight": P}, "probabilities", None),
    ("BCEWithLogitsLoss", {"weight": W, "pos_weight": P, "reduction": "sum"}, "probabilities", None),
]


def _case_id(case) -> str:
    name, kwargs, _, _ = case
    return name + "".join(f"-{k}" for k in kwargs)


def _batches(kind: str, n: int = 4, rows: int = 6) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    for _ in range(n):
        x = rng.standard_normal((rows, 5)).astype(np.float32)
        if kind == "classes":
            y = rng.integers(0, 4, rows)
        elif kind == "probabilities":
            y = rng.uniform(0, 1, (rows, 4)).astype(np.float32)
            y[0, :2] = (0.0, 1.0)  # hard labels too: the ends of [0, 1]
        else:
            y = rng.standard_normal((rows, 4)).astype(np.float32)
        out.append((x, y))
    return out


def _models(final: str | None):
    """Ours and torch's Linear-Tanh-Linear(-final), with the same weights."""
    rng = np.random.default_rng(0)
    ours = [ta.nn.Linear(5, 8, rng=rng), ta.nn.Tanh(), ta.nn.Linear(8, 4, rng=rng)]
    theirs = [torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)]
    with torch.no_grad():
        for a, b in zip(ours[::2], theirs[::2]):
            b.weight.copy_(torch.from_numpy(a.weight.numpy()))
            b.bias.copy_(torch.from_numpy(a.bias.numpy()))
    if final is not None:
        extra = {"dim": 1} if final == "LogSoftmax" else {}
        ours.append(getattr(ta.nn, final)(**extra))
        theirs.append(getattr(torch.nn, final)(**extra))
    return ta.nn.Sequential(*ours), torch.nn.Sequential(*theirs)


def _losses(name: str, kwargs: dict):
    """The loss module of ours and of torch's, each holding its own copy of the weights."""
    ours = getattr(ta.nn, name)(**{k: v.copy() if isinstance(v, np.ndarray) else v for k, v in kwargs.items()})
    theirs = getattr(torch.nn, name)(**{k: torch.tensor(v) if isinstance(v, np.ndarray) else v
                                        for k, v in kwargs.items()})
    return ours, theirs


def _replays() -> dict[str, int]:
    return {r: kernels.calls[("fused_replay", r)] for r in ("captured", "python")}


def _train_both(name, kwargs, kind, final, *, between=None, replay="auto", steps=4):
    """`steps` fused steps of ours against torch's loop; `between(i, ours_loss, torch_loss, ours_model)` runs
    before step i. Asserts each step's loss and the final weights; returns (the trainer, the replay of each step)."""
    model, tmodel = _models(final)
    loss, tloss = _losses(name, kwargs)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), loss, route="fused", fused_replay=replay)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1)
    ran = []
    for i, (x, y) in enumerate(_batches(kind, steps)):
        if between is not None:
            between(i, loss, tloss, model)
        before = _replays()
        report = trainer.step(x, y)
        after = _replays()
        ran.append([r for r in after if after[r] != before[r]])
        assert report.route == "fused"
        topt.zero_grad()
        want = tloss(tmodel(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        topt.step()
        assert report.loss == pytest.approx(want.item(), rel=LOSS_RTOL), (i, name, kwargs)
    for ours, theirs in zip(model.parameters(), tmodel.parameters()):
        np.testing.assert_allclose(ours.data, theirs.detach().numpy(), **WEIGHTS)
    return trainer, ran


# -- every loss module, with and without its weights, runs captured -----------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_each_loss_module_trains_captured_as_torch(case, caplog):
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        trainer, ran = _train_both(*case)
    # Step 1 records and checks the step, then replays the recording; so do steps 2..4, without recording again.
    assert ran == [["captured"]] * 4, (ran, trainer.fused.plan.capture.note)
    assert trainer.fused.plan.capture.tape is not None
    assert not [r for r in caplog.records if "Python replay" in r.getMessage()]


def test_the_loss_modules_buffers_are_its_weights_as_torch_keeps_them():
    loss = ta.nn.BCEWithLogitsLoss(weight=W, pos_weight=P)
    assert sorted(loss.state_dict()) == ["pos_weight", "weight"] == sorted(torch.nn.BCEWithLogitsLoss(
        weight=torch.tensor(W), pos_weight=torch.tensor(P)).state_dict())
    assert [n for n, _ in loss.named_parameters()] == []
    assert sorted(ta.nn.CrossEntropyLoss(weight=W).state_dict()) == ["weight"]


# -- the user changes a weight between steps -------------------------------------------------------------------------

WEIGHTED = [("NLLLoss", {"weight": W}, "classes", "LogSoftmax", "weight"),
            ("CrossEntropyLoss", {"weight": W}, "classes", None, "weight"),
            ("BCELoss", {"weight": W}, "probabilities", "Sigmoid", "weight"),
            ("BCEWithLogitsLoss", {"pos_weight": P}, "probabilities", None, "pos_weight"),
            ("BCEWithLogitsLoss", {"weight": W, "pos_weight": P}, "probabilities", None, "weight")]
NEW = np.array([2.0, 0.25, 4.0, 1.5], np.float32)


def _change(how: str, attr: str, at: int = 2):
    """A `between` that changes `attr` of both losses before step `at` to NEW (torch's: the same way)."""
    def between(i, loss, tloss, model):
        if i != at:
            return
        if how == "in place":
            getattr(loss, attr).data[...] = NEW
            with torch.no_grad():
                getattr(tloss, attr).copy_(torch.from_numpy(NEW))
        elif how == "assigned":
            setattr(loss, attr, ta.Tensor(NEW.copy()))
            setattr(tloss, attr, torch.from_numpy(NEW.copy()))
        else:  # the Tensor kept, its array replaced (torch: .data = ...)
            getattr(loss, attr).data = NEW.copy()
            getattr(tloss, attr).data = torch.from_numpy(NEW.copy())
    return between


@pytest.mark.parametrize("case", WEIGHTED, ids=[f"{c[0]}-{c[4]}" for c in WEIGHTED])
def test_a_weight_written_in_place_is_read_by_the_next_captured_step(case, caplog):
    # The recording holds the buffer's array itself, so the write is seen without recording again.
    name, kwargs, kind, final, attr = case
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        trainer, ran = _train_both(name, kwargs, kind, final, between=_change("in place", attr))
    assert ran == [["captured"]] * 4
    assert len([r for r in caplog.records if "captured the step" in r.getMessage()]) == 1


@pytest.mark.parametrize("how", ["assigned", "array replaced"])
@pytest.mark.parametrize("case", WEIGHTED, ids=[f"{c[0]}-{c[4]}" for c in WEIGHTED])
def test_a_weight_assigned_anew_records_the_step_again(case, how, caplog):
    name, kwargs, kind, final, attr = case
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        trainer, ran = _train_both(name, kwargs, kind, final, between=_change(how, attr))
    assert ran == [["captured"]] * 4
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "captured the step" in m]) == 2  # step 1, and step 3 under the new weight
    assert len([m for m in messages if f"the loss function's buffer {attr!r} was assigned another array" in m]) == 1


def test_a_model_buffer_assigned_anew_records_the_captured_step_again(caplog):
    """The same watch for the model's own buffer (replay="captured": a model class of the user's own)."""

    class Scaled(ta.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = ta.nn.Linear(5, 4, rng=np.random.default_rng(0))
            self.register_buffer("scale", ta.Tensor(np.ones(4, np.float32)))

        def forward(self, x):
            return self.lin(x) * self.scale

    def run(replay):
        model = Scaled()
        trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), ta.nn.MSELoss(), route="fused",
                          fused_replay=replay)
        losses = []
        for i, (x, y) in enumerate(_batches("regression")):
            if i == 2:
                model.scale = ta.Tensor(NEW.copy())
            losses.append(trainer.step(x, y).loss)
        return model, losses

    with caplog.at_level(logging.INFO, logger="tensorarena"):
        before = _replays()
        captured_model, captured = run("captured")
        assert _replays()["captured"] - before["captured"] == 4
    assert "the model's buffer 'scale' was assigned another array" in caplog.text
    python_model, python = run("python")
    assert captured == python  # bit for bit: the same calls on the same arrays
    np.testing.assert_array_equal(captured_model.lin.weight.data, python_model.lin.weight.data)


# -- the capture's second batch keeps a probability a probability --------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_second_batch_keeps_floats_of_zero_to_one_within_it_and_still_changes_them(dtype):
    a = np.array([[0.0, 1.0, 0.5, 0.2], [1.0, 1.0, 0.0, 0.75]], dtype)
    b = second_batch(a)
    assert b.min() >= 0 and b.max() <= 1
    np.testing.assert_array_equal(b, np.roll(a, 1, axis=-1) * dtype(0.5) + dtype(0.5))
    assert b.mean() != a.mean() and b.std() != a.std()  # a number the step computed from either would be seen
    out = np.full_like(a, 9)
    np.testing.assert_array_equal(second_batch(a, out=out), b)  # made into the plan's buffer: the same values
    # just outside [0, 1], or NaN: moved as before
    c = a.copy()
    c[0, 0] = -0.5
    np.testing.assert_array_equal(second_batch(c), np.roll(c, 1, axis=-1) * dtype(1.5) + dtype(0.25))
    c[0, 0] = np.nan
    assert np.nanmax(second_batch(c)) > 1
