"""Bug hunt: the fused route (Trainer(route="fused"), compile_step) on unusual user programs, against eager and torch.

Trainable parameters in no optimizer group (an optimizer over the head only, the body not frozen): values and
.grad as torch keeps them, every byte the step holds in memory_report(); loss functions with extra terms (an L2
penalty over the parameters, two losses summed, a scale that changes between steps); models returning tuples or
dicts; detach() and no_grad() inside forward; a parameter used twice or not at all; integer inputs; batches of
other sizes; float64; dropout; bool inputs; inputs the fused route cannot hold (a dict batch); a loss_fn returning
no Tensor; a new loss_fn between steps; a flat layout built while an older one is garbage-collected.

13 of its 34 tests failed on 2db448b, before the fixes (each under a "Regression (fixed)" comment; the 13th, the
Trainer.loss_fn setter, was fixed in train/trainer.py after this file was written). To see them fail:
`git worktree add /tmp/old-programs 2db448b`, copy this file into /tmp/old-programs/tests/, then in /tmp/old-programs:
    PYTHONPATH=/tmp/old-programs NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider \
        tests/test_fused_programs_hunt.py
(PYTHONPATH: the editable install would import /work/main's package), and `git worktree remove` it after.
"""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import kernels, optim
from tensorarena.compile import compile_step
from tensorarena.compile.trace import UnsupportedOpError
from tensorarena.compile.flat import FlatState
from tensorarena.nn import Dropout, Embedding, Linear, Module, Parameter, ParameterList
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer
from mlp_cases import HeadOnly

REPLAYS = ("python", "captured")


def _rows(n=3, rows=8, dtype=np.float32, seed=5):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, 12)).astype(dtype), rng.integers(0, 4, rows)) for _ in range(n)]


def _torch_twin(model: Module) -> torch.nn.Module:
    """torch's Linear-ReLU-Linear with `model`'s weights (float64 copies of the same values, as float32)."""
    net = torch.nn.Sequential(torch.nn.Linear(12, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        for (_, p), q in zip(model.named_parameters(), net.parameters()):
            q.copy_(torch.from_numpy(p.data.copy()))
    return net


# -- trainable parameters outside the optimizer -----------------------------------------------------------------

def test_head_only_optimizer_keeps_the_body_grads_as_torch_on_every_route():
    """torch's loop (opt.zero_grad(); loss.backward(); opt.step()) with an optimizer over the head: the body's
    .grad accumulates over the steps (zero_grad clears the optimizer's parameters only), the body never moves."""
    data = _rows()
    model0 = HeadOnly()
    net = _torch_twin(model0)
    topt = torch.optim.AdamW(net[2].parameters(), lr=0.01)
    for x, y in data:
        topt.zero_grad()
        torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        topt.step()
    expected = [q.detach().numpy() for q in net.parameters()]
    body_grads = [net[0].weight.grad.numpy(), net[0].bias.grad.numpy()]
    for route, replay in [("eager", "auto"), ("fused", "python"), ("fused", "auto")]:
        model = HeadOnly()
        trainer = Trainer(model, optim.AdamW(model.head.parameters(), lr=0.01), cross_entropy, route=route,
                          fused_replay=replay)
        reports = [trainer.step(x, y) for x, y in data]
        assert {r.route for r in reports} == {route}
        for p, want in zip(model.parameters(), expected):
            np.testing.assert_allclose(p.data, want, rtol=1e-5, atol=1e-6, err_msg=f"{route}/{replay}")
        for p, want in zip(model.body.parameters(), body_grads):
            assert p.grad is not None
            np.testing.assert_allclose(p.grad, want, rtol=1e-5, atol=1e-6, err_msg=f"{route}/{replay}")


# Regression (fixed): the fused step's memory_report() left out the .grad arrays it keeps for trainable parameters
# in no optimizer group (3328 B here: the body's weight and bias), so predicted_peak was below what training holds;
# the route plan counts them as "grads outside the optimizer" and so does the report now.
@pytest.mark.parametrize("replay", REPLAYS)
def test_memory_report_counts_the_grads_outside_the_optimizer(replay):
    x, y = _rows(1)[0]
    model = HeadOnly()
    fused = compile_step(model, cross_entropy, optim.AdamW(model.head.parameters()), (x, y), replay=replay)
    body = model.body.weight.data.nbytes + model.body.bias.data.nbytes
    assert body == 3328
    report = fused.memory_report()
    assert report.get("grads outside the optimizer") == body
    fused.step(x, y)
    held = sum(p.grad.nbytes for p in model.body.parameters())
    assert held == body
    parts = ("params", "grads", "scalars", "params_not_trained", "grads outside the optimizer", "inputs")
    assert report["persistent_total"] == sum(report.get(k, 0) for k in parts) + sum(
        v for k, v in report.items() if k.startswith("state."))
    assert report["predicted_peak"] == report["persistent_total"] + report["slab"] + report["libraries_measured"]
    # The body's gradients are new arrays: what training adds to the process counts them.
    assert report["predicted_growth"] == report["predicted_peak"] - report["params"] - report["params_not_trained"]


def test_an_optimizer_over_every_parameter_reports_no_grads_outside_it():
    x, y = _rows(1)[0]
    model = HeadOnly()
    fused = compile_step(model, cross_entropy, optim.AdamW(model.parameters()), (x, y))
    assert "grads outside the optimizer" not in fused.memory_report()


def test_grads_outside_the_optimizer_do_not_lengthen_any_slab_lifetime():
    """Their gradients go to .grad (a heap array) the moment they complete: the slab is the one an optimizer over
    every parameter gets, buffer for buffer."""
    x, y = _rows(1)[0]
    plans = []
    for head_only in (True, False):
        model = HeadOnly()
        params = model.head.parameters() if head_only else model.parameters()
        plans.append(compile_step(model, cross_entropy, optim.SGD(params, lr=0.1), (x, y)).plan)
    assert [(b.shape, b.death) for b in plans[0].buffers] == [(b.shape, b.death) for b in plans[1].buffers]
    assert plans[0].memory.slab_bytes == plans[1].memory.slab_bytes


def test_flat_gradients_with_grads_outside_the_optimizer_refuse_clearly_or_fall_back_when_allowed(caplog):
    data = _rows(2)
    model = HeadOnly()
    trainer = Trainer(model, optim.SGD(model.head.parameters(), lr=0.1), cross_entropy, route="fused",
                      clip_grad_norm=1.0)
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(UnsupportedOpError, match=r"body\.weight.*not in the optimizer"):
        trainer.step(*data[0])
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))
    eager = HeadOnly()
    eager_trainer = Trainer(eager, optim.SGD(eager.head.parameters(), lr=0.1), cross_entropy, route="eager",
                            clip_grad_norm=1.0)
    model = HeadOnly()
    trainer = Trainer(model, optim.SGD(model.head.parameters(), lr=0.1), cross_entropy, route="fused",
                      clip_grad_norm=1.0, fallback_to_eager=True)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        routes = [trainer.step(x, y).route for x, y in data]
    assert routes == ["eager", "eager"] and "not in the optimizer" in trainer.fallback_reason
    assert any("fused route unavailable" in r.message for r in caplog.records)
    for x, y in data:
        eager_trainer.step(x, y)
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
        np.testing.assert_array_equal(p.grad, q.grad)


# -- what the fused route cannot take ---------------------------------------------------------------------------

class _DictIn(Module):
    """A model that takes a dict batch (as a PyTorch collate_fn may give): the eager route hands it over as it is."""

    def __init__(self):
        super().__init__()
        self.a = Linear(12, 4, rng=np.random.default_rng(0))

    def forward(self, batch):
        return self.a(ta.Tensor(batch["x"]))


# Regression (fixed): a batch the fused plan cannot hold (a dict) raised a bare TypeError from Tensor() even with
# fallback_to_eager=True, so the fallback the user allowed never happened; it is an UnsupportedOpError (and still
# a TypeError) now: refused clearly without the fallback, trained on eager with it, the reason logged.
def test_a_dict_batch_is_refused_clearly_or_falls_back_to_eager_when_allowed(caplog):
    data = [({"x": x}, y) for x, y in _rows(2)]
    model = _DictIn()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused")
    with pytest.raises(TypeError, match=r"fused route .* batch of type dict.*route='eager'") as err:
        trainer.step(*data[0])
    assert isinstance(err.value, UnsupportedOpError)
    model, eager = _DictIn(), _DictIn()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                      fallback_to_eager=True)
    eager_trainer = Trainer(eager, optim.SGD(eager.parameters(), lr=0.1), cross_entropy, route="eager")
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        reports = [trainer.step(x, y) for x, y in data]
    assert [r.route for r in reports] == ["eager", "eager"]
    assert "batch of type dict" in trainer.fallback_reason
    assert any("fused route unavailable" in r.message for r in caplog.records)
    assert [r.loss for r in reports] == [eager_trainer.step(x, y).loss for x, y in data]
    np.testing.assert_array_equal(model.a.weight.data, eager.a.weight.data)


def test_inputs_of_an_array_like_the_eager_route_rejects_too_stay_a_plain_type_error():
    model = HeadOnly()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                      fallback_to_eager=True)
    with pytest.raises((TypeError, ValueError)) as err:  # ragged rows: no array on any route, so no fallback
        trainer.step([[1.0, 2.0], [3.0]], np.zeros(2, np.int64))
    assert not isinstance(err.value, UnsupportedOpError) and trainer.route == "fused"


# Regression (fixed): a loss_fn returning a number (a float, a NumPy scalar) failed the trace with "'float' object
# has no attribute 'data'" ('memoryview' object has no attribute 'size' for np.float32); now a TypeError says what
# loss_fn must return, before anything is updated.
@pytest.mark.parametrize("value", [1.0, np.float32(1.0)], ids=["float", "np.float32"])
def test_a_loss_fn_returning_a_number_is_a_clear_error(value):
    x, y = _rows(1)[0]
    model = HeadOnly()
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(TypeError, match=r"loss_fn must return the loss as a scalar Tensor.*got (float|float32)"):
        compile_step(model, lambda out, t: value, optim.SGD(model.parameters(), lr=0.1), (x, y))
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))


# -- loss functions --------------------------------------------------------------------------------------------

class _Net(Module):
    """Linear-ReLU-Linear whose forward returns the logits, (logits, hidden) or {"logits", "hidden"}, and may
    detach a branch or compute a factor under no_grad."""

    def __init__(self, out="plain", extra=None):
        super().__init__()
        self.a = Linear(12, 16, rng=np.random.default_rng(0))
        self.b = Linear(16, 4, rng=np.random.default_rng(1))
        self.out, self.extra = out, extra

    def forward(self, x):
        h = self.a(x).relu()
        if self.extra == "detach":
            h = h + self.a(x).detach() * 0.5
        if self.extra == "no_grad":
            with ta.no_grad():
                s = self.a(x).tanh().mean()
            h = h * (s + 1.0)  # a factor without a graph: no gradient flows through it
        o = self.b(h)
        if self.out == "tuple":
            return o, h
        if self.out == "dict":
            return {"logits": o, "hidden": h}
        return o


def _train(make, loss_fn, route, data, *, replay="auto", before_step=None, opt=optim.Adam, **kw):
    model = make()
    optimizer = opt(model.parameters(), lr=0.01)
    trainer = Trainer(model, optimizer, loss_fn, route=route, fused_replay=replay, **kw)
    losses = []
    for i, (x, y) in enumerate(data):
        if before_step is not None:
            before_step(i, trainer)
        report = trainer.step(x, y)
        assert report.route == route
        losses.append(report.loss)
    return model, optimizer, trainer, losses


def _assert_same_run(make, loss_fn, data=None, replays=REPLAYS, before_step=None, **kw):
    """Fused (each replay) against eager, bit for bit: the same ops on the same values in the same order."""
    data = data or _rows()
    eager, _, _, eager_losses = _train(make, loss_fn, "eager", data, before_step=before_step, **kw)
    for replay in replays:
        calls = dict(kernels.calls)
        model, _, trainer, losses = _train(make, loss_fn, "fused", data, replay=replay, before_step=before_step, **kw)
        ran = {k: kernels.calls[k] - calls.get(k, 0) for k in (("fused_replay", "python"), ("fused_replay", "captured"))}
        assert ran[("fused_replay", trainer.fused.replay)] == len(data), (replay, ran)
        assert losses == eager_losses, replay
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            np.testing.assert_array_equal(p.data, q.data, err_msg=f"{replay}: {name}")
    return eager


_L2_MODEL: list[Module] = []


def _l2_model():
    _L2_MODEL[:] = [_Net()]
    return _L2_MODEL[0]


def _l2_loss(out, y):
    """cross entropy + 1e-3 * the sum of squares of every parameter (the model built last by _l2_model)."""
    penalty = None
    for p in _L2_MODEL[0].parameters():
        term = (p * p).sum()
        penalty = term if penalty is None else penalty + term
    return cross_entropy(out, y) + penalty * 1e-3


@pytest.mark.parametrize("case", ["l2_penalty", "two_losses_of_a_tuple", "dict_output"])
def test_losses_with_extra_terms_and_structured_outputs_match_eager(case):
    if case == "l2_penalty":  # every parameter used twice: in forward and in the penalty
        _assert_same_run(_l2_model, _l2_loss)
    elif case == "two_losses_of_a_tuple":
        _assert_same_run(lambda: _Net("tuple"), lambda out, y: cross_entropy(out[0], y) + (out[1] * out[1]).mean() * 0.1)
    else:
        _assert_same_run(lambda: _Net("dict"), lambda out, y: cross_entropy(out["logits"], y))


def test_an_l2_penalty_matches_torch():
    data = _rows()
    model = _l2_model()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), _l2_loss, route="fused")
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p, q in zip(model.parameters(), net.parameters()):
            q.copy_(torch.from_numpy(p.data.copy()))
    topt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data:
        report = trainer.step(x, y)
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)) + 1e-3 * sum(
            (q * q).sum() for q in net.parameters())
        loss.backward()
        topt.step()
        assert report.route == "fused"
        assert report.loss == pytest.approx(loss.item(), rel=1e-5)
    for p, q in zip(model.parameters(), net.parameters()):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-5, atol=1e-6)


_SCALE = {"value": 1.0}


def _scaled_loss(out, y):
    return cross_entropy(out, y) * _SCALE["value"]


def _ramp_scale(i, trainer):
    _SCALE["value"] = 1.0 + 0.5 * i


def test_a_loss_scale_changed_between_steps_is_followed_on_the_python_replay():
    """A loss of the user's own keeps the Python replay (replay="auto"), which runs the loss each step."""
    eager = _assert_same_run(_Net, _scaled_loss, replays=("python", "auto"), before_step=_ramp_scale)
    assert eager is not None


class _ScaledLoss:
    """A loss object whose scale the training loop sets between steps."""

    def __init__(self):
        self.scale = 1.0

    def __call__(self, out, y):
        return cross_entropy(out, y) * self.scale


def _closure_loss():
    scale = 1.0

    def loss(out, y):
        return cross_entropy(out, y) * scale

    def ramp(i, trainer):
        nonlocal scale
        scale = 1.0 + 0.5 * i
    return loss, ramp


# Regression (fixed): on the captured replay (asked for: a loss of the user's own), a recording holds the numbers the
# loss computed with as constants, so a scale changed between steps (a global, a closure variable, a loss object's
# attribute) was silently replayed at its recorded value: the losses went 1.37, 1.37, 1.31... where eager's went
# 1.37, 2.06, 2.62... Now the loss function's state is watched (watched_state.LossState) and a change records the step
# again; a state that does not change keeps the one recording.
@pytest.mark.parametrize("kind", ["global", "closure", "loss_object"])
def test_a_loss_scale_changed_between_steps_is_followed_on_the_captured_replay(kind, caplog):
    if kind == "global":
        loss_fn, ramp = _scaled_loss, _ramp_scale
    elif kind == "closure":
        loss_fn, ramp = _closure_loss()
    else:
        loss_fn = _ScaledLoss()

        def ramp(i, trainer):
            loss_fn.scale = 1.0 + 0.5 * i
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        _assert_same_run(_Net, loss_fn, data=_rows(4), replays=("captured",), before_step=ramp)
    again = [r for r in caplog.records if "loss function's state changed" in r.getMessage()]
    assert len(again) == 3  # steps 2, 3 and 4 each set a new scale: one recording each
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tensorarena"):  # an unchanged scale: recorded once
        _assert_same_run(_Net, loss_fn, data=_rows(3), replays=("captured",))
    assert not [r for r in caplog.records if "loss function's state changed" in r.getMessage()]


# Regression (fixed): FusedStep.loss_fn set anew between steps was replayed against the old loss's plan: on the
# Python replay a PlanMismatchError (or the old plan's buffers for the new loss's ops), on the captured replay the
# old loss, silently. Setting it now drops the plans (traced with the old loss) and chooses the replay again.
@pytest.mark.parametrize("replay", ["python", "captured", "auto"])
def test_a_new_loss_fn_on_the_fused_step_takes_effect_at_the_next_step(replay):
    data = _rows(4)

    def new_loss(out, y):
        return cross_entropy(out, y) * 3.0

    def make():  # tensorarena's own modules: replay="auto" captures
        return ta.nn.Sequential(Linear(12, 16, rng=np.random.default_rng(0)), ta.nn.ReLU(),
                                Linear(16, 4, rng=np.random.default_rng(1)))

    eager, fused_model = make(), make()
    eager_opt, fused_opt = optim.SGD(eager.parameters(), lr=0.1), optim.SGD(fused_model.parameters(), lr=0.1)
    fused = compile_step(fused_model, cross_entropy, fused_opt, data[0], replay=replay)
    assert fused.replay == ("python" if replay == "python" else "captured")
    for i, (x, y) in enumerate(data):
        loss_fn = cross_entropy if i < 2 else new_loss
        if i == 2:
            fused.loss_fn = new_loss
            assert not fused.plans
            assert fused.replay == ("captured" if replay == "captured" else "python")  # auto: the user's loss
        eager_opt.zero_grad()
        loss = loss_fn(eager(ta.Tensor(x)), y)
        loss.backward()
        eager_opt.step()
        assert fused.step(x, y)[0] == loss.item()
    for p, q in zip(fused_model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        fused.loss_fn = None


# Regression (fixed): `trainer.loss_fn = new` was ignored on the fused route (the FusedStep kept the old loss);
# Trainer.loss_fn is now a property passing the new loss on to the fused and streaming routes.
def test_a_new_trainer_loss_fn_takes_effect_on_the_fused_route():
    def swap(i, trainer):
        if i == 2:
            trainer.loss_fn = lambda out, y: cross_entropy(out, y) * 3.0

    _assert_same_run(_Net, cross_entropy, data=_rows(4), replays=("python",), before_step=swap, opt=optim.SGD)


# -- model structures ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", ["detach", "no_grad"])
def test_detach_and_no_grad_inside_forward_match_eager_and_torch(extra):
    data = _rows()
    model = _assert_same_run(lambda: _Net(extra=extra), cross_entropy, opt=optim.SGD)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p, q in zip(_Net().parameters(), net.parameters()):
            q.copy_(torch.from_numpy(p.data.copy()))
    topt = torch.optim.SGD(net.parameters(), lr=0.01)
    for x, y in data:
        xt = torch.from_numpy(x)
        h = torch.relu(net[0](xt))
        if extra == "detach":
            h = h + net[0](xt).detach() * 0.5
        else:
            with torch.no_grad():
                s = torch.tanh(net[0](xt)).mean()
            h = h * (s + 1.0)
        topt.zero_grad()
        torch.nn.functional.cross_entropy(net[1](h), torch.from_numpy(y)).backward()
        topt.step()
    for p, q in zip(model.parameters(), net.parameters()):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-5, atol=1e-6)


class _WithSpare(_Net):
    """A layer the forward never uses: no gradient, so torch's optimizers skip it and make it no state."""

    def __init__(self):
        super().__init__()
        self.spare = Linear(4, 4, rng=np.random.default_rng(2))


@pytest.mark.parametrize("replay", REPLAYS)
def test_an_unused_parameter_gets_no_grad_no_state_and_never_moves(replay):
    data = _rows()
    model = _WithSpare()
    spare = [p.data.copy() for p in model.spare.parameters()]
    opt = optim.AdamW(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay=replay)
    assert [trainer.step(x, y).route for x, y in data] == ["fused"] * len(data)
    for p, before in zip(model.spare.parameters(), spare):
        assert p.grad is None and p not in opt.state
        np.testing.assert_array_equal(p.data, before)
    used = [p for name, p in model.named_parameters() if not name.startswith("spare")]
    assert all(float(opt.state[p]["step"]) == len(data) for p in used)
    torch_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01)
    torch_opt.step()  # no gradient: torch makes no state either
    assert not torch_opt.state


class _Embed(Module):
    def __init__(self):
        super().__init__()
        self.e = Embedding(20, 8, rng=np.random.default_rng(0))
        self.a = Linear(8, 4, rng=np.random.default_rng(1))

    def forward(self, ids):
        return self.a(self.e(ids).mean(1))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_integer_inputs_of_any_width_match_eager(dtype):
    rng = np.random.default_rng(3)
    data = [(rng.integers(0, 20, (8, 5)).astype(dtype), rng.integers(0, 4, 8)) for _ in range(3)]
    _assert_same_run(_Embed, cross_entropy, data=data)


@pytest.mark.parametrize("replay", REPLAYS)
def test_bool_inputs_to_a_float_layer_fail_as_on_eager_and_update_nothing(replay):
    rng = np.random.default_rng(3)
    x, y = rng.random((8, 12)) > 0.5, rng.integers(0, 4, 8)
    for route in ("eager", "fused"):
        model = _Net()
        before = [p.data.copy() for p in model.parameters()]
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route,
                          fused_replay=replay)
        with pytest.raises(TypeError, match=r"linear: the input is bool but the weight is float32"):
            trainer.step(x, y)
        assert trainer.step_count == 0
        assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))


def test_batches_of_other_sizes_retrace_into_the_lru_and_float64_match_eager():
    data = _rows(2, dtype=np.float64) + _rows(2, rows=5, dtype=np.float64, seed=6) + _rows(1, dtype=np.float64, seed=7)
    model, _, trainer, _ = _train(lambda: _Net().double(), cross_entropy, "fused", data, replay="python")
    assert trainer.fused.traces == 2 and len(trainer.fused.plans) == 2
    _assert_same_run(lambda: _Net().double(), cross_entropy, data=data)


class _Drop(_Net):
    def __init__(self):
        super().__init__()
        self.drop = Dropout(0.3)

    def forward(self, x):
        return self.b(self.drop(self.a(x).relu()))


def _seeded_drop():
    ta.manual_seed(7)
    return _Drop()


def test_dropout_draws_the_eager_routes_masks_from_the_same_seed():
    _assert_same_run(_seeded_drop, cross_entropy)


# -- a layout built while an older one is collected ---------------------------------------------------------------

class _CollectingAdam(optim.Adam):
    """Adam whose state_init runs a garbage collection, as one may run at any allocation while a layout is built."""

    def state_init(self, group):
        gc.collect()
        return super().state_init(group)


def _params():
    rng = np.random.default_rng(0)
    return ParameterList([Parameter(rng.standard_normal(shape)) for shape in [(4, 3), (3,), (5, 2)]])


# Regression (fixed): FlatState noted the bounds of every older layout alive, then built its own buffers, then
# detached whatever lay inside those bounds (_let_go). An older layout kept only by a reference cycle and collected
# in between freed its buffers, the new layout's were allocated at the same addresses, and the new layout detached
# its own parameters (copies: the updates no longer reached the model) and gradient buffers (20 of 20 tries here).
def test_a_layout_built_while_an_older_one_is_collected_keeps_its_parameters_bound():
    for _ in range(5):
        old_model = _params()
        cycle = [FlatState(old_model, optim.Adam(old_model.parameters(), lr=1e-2))]
        cycle.append(cycle)  # the old layout now lives in a cycle that only the collector frees
        del cycle, old_model
        model = _params()
        flat = FlatState(model, _CollectingAdam(model.parameters(), lr=1e-2))
        for g in flat.groups:
            for i, p in enumerate(g.params):
                assert p._data is g._param_views[i] and p._grad_buffer is g._grad_views[i]
        before = model[0].data.copy()
        for p in model.parameters():
            np.copyto(p._grad_buffer, np.ones(p.shape))
        flat.update()
        assert not np.array_equal(model[0].data, before)  # the update reaches the model
