"""The fused route's extra runs of a step leave nothing behind, and a recording follows a frozen parameter's new
array (a hunt of 2026-12-07).

The fused trace, route="auto"'s planning trace (also any route given memory_limit=) and a recording's checking
passes each run the step's Python once more than eager does. Before: the planning trace and a refused recording's
passes kept what the forward set (a count of its calls ran ahead of eager's); every extra run kept a forward's
in-place write to a parameter (a mean teacher's moving average got extra updates), the loss function's own state
(a call count for a warm-up) and NumPy's global generator's draws (a VAE's noise); and the captured replay read a
frozen parameter's old array after `p.data = new` (the default route for a model of tensorarena's modules). Each
test compares the losses, step by step, and the state with route="eager". Run on the commit before the one that
added this file (a worktree of it first on PYTHONPATH), 12 of its 14 cases failed; the 2 that passed are the
counting model's eager and fused/python cases (the fused trace's own put-back, from 19d8d37): controls. The
last test came a commit later (one model state for all plans); before it, it failed with 20 traces, not 4.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import kernels, optim
from tensorarena.nn import Linear, Module, ReLU, Sequential
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

ROUTES = [("fused", "python", {}), ("fused", "captured", {}), ("auto", "auto", {}),
          ("eager", "auto", {"memory_limit": "4G"})]
IDS = ["fused-python", "fused-captured", "auto", "eager-memory_limit"]


def _replays(run):
    before = dict(kernels.calls)
    result = run()
    return result, {k[1]: kernels.calls[k] - before.get(k, 0) for k in kernels.calls
                    if k[0] == "fused_replay" and kernels.calls[k] != before.get(k, 0)}


class _Counting(Module):
    """A warm-up the forward counts itself."""

    def __init__(self):
        super().__init__()
        self.layer = Linear(4, 3, dtype=np.float64, rng=np.random.default_rng(0))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.layer(x) * min(1.0, self.calls / 10)


def _counting_run(route, replay, kw):
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((5, 4)), rng.integers(0, 3, 5)) for _ in range(4)]
    model = _Counting()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route,
                      fused_replay=replay, **kw)
    return [trainer.step(x, y).loss for x, y in data], model.calls


@pytest.mark.parametrize("route, replay, kw", [("eager", "auto", {}), *ROUTES], ids=["eager", *IDS])
def test_a_forward_that_counts_its_calls_counts_the_steps(route, replay, kw):
    want, calls = _counting_run("eager", "auto", {})
    assert calls == 4
    (losses, calls), _ = _replays(lambda: _counting_run(route, replay, kw))
    assert calls == 4  # 5 after route="auto"'s planning trace, 7 after a refused recording's passes
    np.testing.assert_allclose(losses, want, rtol=1e-12)


def _mlp(seed):
    return Sequential(Linear(12, 16, rng=np.random.default_rng(seed)), ReLU(),
                      Linear(16, 8, rng=np.random.default_rng(seed + 1)))


class _MeanTeacher(Module):
    """A target network moved towards the student in the forward, in place under no_grad (BYOL, mean teacher)."""

    def __init__(self):
        super().__init__()
        self.student, self.teacher = _mlp(0), _mlp(10)
        self.teacher.requires_grad_(False)
        self.head = Linear(8, 4, rng=np.random.default_rng(2))

    def forward(self, x):
        if self.training:
            with ta.no_grad():
                for t, s in zip(self.teacher.parameters(), self.student.parameters()):
                    t.mul_(0.5).add_(s * 0.5)
        z = self.student(x)
        with ta.no_grad():
            zt = self.teacher(x)
        return self.head(z), ((z - zt) ** 2).mean()


def _teacher_loss(out, y):
    logits, consistency = out
    return cross_entropy(logits, y) + consistency


def _teacher_run(route, replay, kw):
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 4, 8)) for _ in range(4)]
    model = _MeanTeacher()
    trainer = Trainer(model, optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1), _teacher_loss,
                      route=route, fused_replay=replay, **kw)
    return [trainer.step(x, y).loss for x, y in data], [p.data.copy() for p in model.teacher.parameters()]


@pytest.mark.parametrize("route, replay, kw", ROUTES, ids=IDS)
def test_a_forward_s_in_place_parameter_write_is_made_once_per_step(route, replay, kw):
    want, want_teacher = _teacher_run("eager", "auto", {})
    (losses, teacher), replays = _replays(lambda: _teacher_run(route, replay, kw))
    if replay == "captured":
        assert replays == {"captured": 4}  # the recording writes the moving average each step
    np.testing.assert_allclose(losses, want, rtol=1e-6)
    for got, expected in zip(teacher, want_teacher):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


class _AnnealedLoss:
    """A loss object weighting a penalty by how often it was called (a KL warm-up)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, out, y):
        self.calls += 1
        return cross_entropy(out, y) + min(1.0, self.calls / 10) * (out * out).mean()


@pytest.mark.parametrize("route, replay", [("fused", "python"), ("fused", "captured"), ("auto", "auto")])
def test_the_loss_function_s_own_state_counts_the_steps(route, replay):
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 4, 8)) for _ in range(4)]
    runs = {}
    for name, (r, rp) in {"eager": ("eager", "auto"), "other": (route, replay)}.items():
        model = Sequential(Linear(12, 16, rng=np.random.default_rng(0)), ReLU(),
                           Linear(16, 4, rng=np.random.default_rng(1)))
        loss_fn = _AnnealedLoss()
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), loss_fn, route=r, fused_replay=rp)
        runs[name] = ([trainer.step(x, y).loss for x, y in data], loss_fn.calls)
    assert runs["other"][1] == runs["eager"][1] == 4
    np.testing.assert_allclose(runs["other"][0], runs["eager"][0], rtol=1e-6)


class _NoisyEncoder(Module):
    """A VAE-like forward drawing its noise from NumPy's global generator."""

    def __init__(self):
        super().__init__()
        self.enc, self.dec = Linear(12, 8, rng=np.random.default_rng(0)), Linear(4, 12, rng=np.random.default_rng(1))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = h[:, :4], h[:, 4:]
        eps = ta.tensor(np.random.standard_normal(mu.shape).astype(np.float32))
        return ((self.dec(mu + (logvar * 0.5).exp() * eps) - x) ** 2).mean() + (mu * mu).mean() * 0.1


def test_a_forward_drawing_from_numpy_s_global_generator_draws_what_eager_draws():
    rng = np.random.default_rng(1)
    data = [rng.standard_normal((8, 12)).astype(np.float32) for _ in range(4)]
    runs = {}
    for route in ("eager", "fused"):
        np.random.seed(0)
        model = _NoisyEncoder()
        trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), lambda out, _: out, route=route)
        runs[route] = [trainer.step(x, None).loss for x in data]
        runs[route + " after"] = np.random.standard_normal()  # where each left the generator
    np.testing.assert_allclose(runs["fused"], runs["eager"], rtol=1e-6)
    assert runs["fused after"] == runs["eager after"]


def test_the_recording_follows_a_frozen_parameter_s_new_array():
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 4, 8)) for _ in range(5)]

    def run(route):
        model = Sequential(Linear(12, 8, rng=np.random.default_rng(0)), ReLU(),
                           Linear(8, 4, rng=np.random.default_rng(1)))
        model[0].requires_grad_(False)  # a frozen, pretrained body
        trainer = Trainer(model, optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
                          cross_entropy, route=route)
        losses = []
        for i, (x, y) in enumerate(data):
            if i == 2:
                model[0].weight.data = np.full((8, 12), 0.05, np.float32)  # new body weights, torch style
            losses.append(trainer.step(x, y).loss)
        return losses, model[2].weight.data.copy()

    want, want_head = run("eager")
    (losses, head), replays = _replays(lambda: run("fused"))
    assert replays == {"captured": 5}  # the default replay for tensorarena's modules, recorded again at step 3
    np.testing.assert_allclose(losses, want, rtol=1e-6)
    np.testing.assert_allclose(head, want_head, rtol=1e-6, atol=1e-7)


class _Scaled(_Counting):
    """The counting model with a flag the user sets between steps."""

    def __init__(self):
        super().__init__()
        self.double = False

    def forward(self, x):
        out = super().forward(x)
        return out * 2.0 if self.double else out


def test_a_forward_s_own_writes_do_not_retrace_the_other_batch_shape_but_a_user_s_change_does():
    # 40 steps alternating two batch shapes traced 40 times when the forward counted its calls (each plan's own
    # state went stale whenever the other plan's step ran): now 2, and a flag set between steps still reaches
    # both shapes' plans (compared with eager step by step).
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((n, 4)), rng.integers(0, 3, n)) for n in (5, 7) * 10]
    runs = {}
    for route in ("eager", "fused"):
        model = _Scaled()
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.05), cross_entropy, route=route)
        losses = []
        for i, (x, y) in enumerate(data):
            if i == 11:
                model.double = True
            losses.append(trainer.step(x, y).loss)
        runs[route] = (losses, model.calls, trainer.fused.traces if trainer.fused is not None else 0)
    assert runs["fused"][1] == runs["eager"][1] == 20
    np.testing.assert_allclose(runs["fused"][0], runs["eager"][0], rtol=1e-12)
    assert runs["fused"][2] == 2 + 2  # each shape once, and again after the flag changed
