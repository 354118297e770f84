"""The fused route's extra runs of the step's Python (the trace, a recording's checking passes) leave no trace: a
helper agent's hunt of user-written models, each compared step by step with route="eager" on the same batches.

1. A counter kept in a dict or list attribute, or in a loss closure's list, ran one ahead (a plain self.n += 1
   was put back; containers were not): step 1's loss 1.15496 against eager's 1.12098.
2. Random draws from a RandomState on the module, a Generator inside a dict attribute, a module-level Generator
   or Python's `random` moved one draw ahead (step 1 drew eager's step-2 noise); so did a module-level counter.
3. A parameter whose .data the forward rebinds (a max-norm constraint) never trained on the Python replay: the
   update went to the flat view it had left. The captured replay now refuses to record such a forward.
4. A step whose parameters' gradients depend on the data raised a PlanMismatchError saying the parameters that
   got one were "already updated" when none were, and naming no remedy.
5. fused_replay="captured" replayed values the forward read out of its tensors when it was recorded (a branch on
   x.sum().item(), a temperature read with float() from a buffer changed in place): parameters 0.21 off eager.
   A recording whose Python reads a tensor's value (item, float, bool, numpy, tolist) is refused now.

On 745266e (before the fix) 22 of this file's 23 tests fail; the python replay of a global the loop changes passed
there (the first version of this fix retraced it every step: the test fails on 5b7bbad); the hunt's controls,
which passed there, are in tests/test_fused_programs_hunt.py and tests/test_captured_*.py:
    git worktree add /tmp/wt 745266e && cp tests/test_fused_python_state_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_fused_python_state_hunt.py)
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import optim
from tensorarena.compile import PlanMismatchError
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

_RNG = np.random.default_rng(0)
BATCHES = [(_RNG.standard_normal((8, 6)).astype(np.float32), _RNG.integers(0, 3, 8)) for _ in range(3)]
NOISE = {}  # a script's generator, read by a forward as a global
STEP = [0]  # a script's step count, read by a forward as a global


class DictCounter(Module):
    def __init__(self):
        super().__init__()
        self.a, self.stats = Linear(6, 3), {"calls": 0}

    def forward(self, x):
        self.stats["calls"] += 1
        return self.a(x) * min(1.0, self.stats["calls"] / 4)


class ListCounter(Module):
    def __init__(self):
        super().__init__()
        self.a, self.seen = Linear(6, 3), []

    def forward(self, x):
        self.seen.append(x.shape[0])
        return self.a(x) * min(1.0, len(self.seen) / 4)


class HeldRandomState(Module):
    def __init__(self):
        super().__init__()
        self.a, self.rs = Linear(6, 3), np.random.RandomState(7)

    def forward(self, x):
        return self.a(x + ta.tensor(self.rs.standard_normal(x.shape).astype(np.float32)) * 0.5)


class GeneratorInDict(Module):
    def __init__(self):
        super().__init__()
        self.a, self.noise = Linear(6, 3), {"rng": np.random.default_rng(7), "std": 0.5}

    def forward(self, x):
        return self.a(x + ta.tensor(self.noise["rng"].standard_normal(x.shape).astype(np.float32)) * 0.5)


class GlobalNoise(Module):
    def __init__(self):
        super().__init__()
        self.a = Linear(6, 3)

    def forward(self, x):
        return self.a(x + ta.tensor(NOISE["rng"].standard_normal(x.shape).astype(np.float32)) * 0.5)


class PythonRandomScale(Module):
    def __init__(self):
        super().__init__()
        self.a = Linear(6, 3)

    def forward(self, x):
        return self.a(x) * (0.5 + random.random())


class GlobalStep(Module):
    def __init__(self):
        super().__init__()
        self.a = Linear(6, 3)

    def forward(self, x):
        STEP[0] += 1
        return self.a(x) * min(1.0, STEP[0] / 4)


class MaxNorm(Module):
    def __init__(self):
        super().__init__()
        self.a = Linear(6, 3)

    def forward(self, x):
        w = self.a.weight.data
        self.a.weight.data = w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1.0) * 0.9
        return self.a(x)


def _counting_loss():
    history = []

    def loss(out, y):
        history.append(1)
        return cross_entropy(out, y) * min(1.0, len(history) / 4)
    return loss


def _run(make, route, replay="auto", loss=None):
    ta.manual_seed(0)
    NOISE["rng"], STEP[0] = np.random.default_rng(123), 0
    random.seed(123)
    model = make()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), loss() if loss else cross_entropy, route=route,
                      fused_replay=replay)
    reports = [trainer.step(x, y) for x, y in BATCHES]
    assert {r.route for r in reports} == {route}
    return [r.loss for r in reports], [p.data.copy() for p in model.parameters()]


CASES = {"dict counter": (DictCounter, None), "list counter": (ListCounter, None),
         "loss closure counter": (lambda: Linear(6, 3), _counting_loss), "RandomState": (HeldRandomState, None),
         "Generator in a dict": (GeneratorInDict, None), "module-level Generator": (GlobalNoise, None),
         "Python random": (PythonRandomScale, None), "module-level counter": (GlobalStep, None),
         "max-norm .data": (MaxNorm, None)}


@pytest.mark.parametrize("replay", ["python", "captured"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_steps_equal_eager_steps(case, replay):
    make, loss = CASES[case]
    want_losses, want_params = _run(make, "eager", loss=loss)
    got_losses, got_params = _run(make, "fused", replay, loss=loss)
    np.testing.assert_allclose(got_losses, want_losses, rtol=0, atol=1e-6)
    for got, want in zip(got_params, want_params):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


class DataBranch(Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Linear(6, 3), Linear(6, 3)

    def forward(self, x):
        return self.a(x) if float(x.data.sum()) > 0 else self.b(x)


def test_a_data_dependent_gradient_names_the_cause_and_the_remedy():
    model = DataBranch()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                      fused_replay="python")
    x = np.ones((8, 6), np.float32)
    trainer.step(x, np.zeros(8, np.int64))
    with pytest.raises(PlanMismatchError, match=r"got no gradient .*depends on the data.*route='eager' \(nothing "
                                                 r"was updated\)"):
        trainer.step(-x, np.zeros(8, np.int64))


SIGNS = [(x + (1.0 if i % 2 == 0 else -1.0), y) for i, (x, y) in enumerate(BATCHES * 2)]  # the sum's sign alternates


class SignBranch(Module):
    def __init__(self):
        super().__init__()
        self.a = Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        return h * 2.0 if x.sum().item() > 0 else h * -1.0


class BufferTemperature(Module):
    def __init__(self):
        super().__init__()
        self.a = Linear(6, 3)
        self.register_buffer("temp", ta.tensor(2.0))

    def forward(self, x):
        return self.a(x) / float(self.temp)


def _run_changing(make, route, replay="auto"):
    ta.manual_seed(0)
    model = make()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route, fused_replay=replay)
    losses = []
    for i, (x, y) in enumerate(SIGNS):
        if i == 2 and hasattr(model, "temp"):
            model.temp.data[...] = 0.5  # in place, as temp.fill_(0.5) would
        losses.append(trainer.step(x, y).loss)
    return losses, [p.data.copy() for p in model.parameters()]


@pytest.mark.parametrize("make", [SignBranch, BufferTemperature])
def test_a_recording_refuses_a_forward_that_reads_its_tensors_values(make, caplog):
    want_losses, want_params = _run_changing(make, "eager")
    with caplog.at_level("INFO", logger="tensorarena"):
        got_losses, got_params = _run_changing(make, "fused", "captured")
    assert any("reads values out of the tensors it computes (item() of a () tensor)" in r.getMessage()
               for r in caplog.records)
    np.testing.assert_allclose(got_losses, want_losses, rtol=0, atol=1e-6)
    for got, want in zip(got_params, want_params):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


SCALE = [1.0]  # a schedule the training loop sets, read by a forward as a global


class GlobalScale(Module):
    def __init__(self):
        super().__init__()
        self.a = Linear(6, 3)

    def forward(self, x):
        return self.a(x) * SCALE[0]


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_a_global_the_loop_changes_is_followed_without_retracing(replay):
    # A review of the first version of this fix: the forwards' globals were part of the model's watched state,
    # so a loop setting one each step retraced every step (39 retraces in 40 steps). They are put back after a
    # trace but not watched for change; a captured recording (which holds the value read) records again.
    def run(route):
        ta.manual_seed(0)
        model = GlobalScale()
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route,
                          fused_replay=replay)
        losses = []
        for i in range(6):
            SCALE[0] = 1.0 + 0.25 * i
            losses.append(trainer.step(*BATCHES[i % 3]).loss)
        return losses, trainer
    want, _ = run("eager")
    got, trainer = run("fused")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert trainer.fused.traces == 1
