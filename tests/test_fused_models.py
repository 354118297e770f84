"""The user's own model structures and gradient features on the fused route, both replays and "auto", against the
eager route and (where the model has a torch twin) torch: weight tying, a Linear called twice, residuals, detach,
parameters that get no gradient on some steps, mixed float32/float64 parameters, many small and one huge
parameter, clipping of zero and non-finite gradients, every optimizer with per-group lr and weight decay, and a
schedule over groups of different base lr.

11 of these 59 tests failed on d412136, before the fixes (all under a "Regression" comment). With this file copied
into a worktree of d412136 (git worktree add /tmp/old d412136), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_fused_models.py`.
"""

from __future__ import annotations

import math

import logging

import numpy as np
import pytest
import torch

from tensorarena import optim
from tensorarena.nn import Embedding, LayerNorm, Linear, Module, Parameter
from tensorarena.nn.functional import cross_entropy, linear, relu
from tensorarena.ops import sqrt
from tensorarena.train.trainer import Trainer
from mlp_cases import labelled_rows as _rows

TOL = {np.float32: 1e-5, np.float64: 1e-10}
REPLAYS = ("python", "captured", "auto")


# -- helpers ---------------------------------------------------------------------------------------

def _tokens(n, batch=8, length=5, vocab=20, seed=4):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(0, vocab, (batch, length))
        out.append((ids, (ids[:, 0] + ids[:, -1]) % vocab))
    return out


def _run(make_model, make_opt, batches, steps, *, route="fused", replay="auto", loss_fn=cross_entropy,
         make_sched=None, **kw):
    model = make_model()
    opt = make_opt(model)
    sched = make_sched(opt) if make_sched is not None else None
    trainer = Trainer(model, opt, loss_fn, route=route, fused_replay=replay, scheduler=sched, **kw)
    reports = [trainer.step(*batches[i % len(batches)]) for i in range(steps)]
    return model, trainer, reports


def _params(model):
    return {name: p.data.copy() for name, p in model.named_parameters()}


def _assert_params_close(got, want, tol, what=""):
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=f"{what} {name}")


def _fused_vs_eager(make_model, make_opt, batches, steps, tol, *, captured=True, replays=("python", "captured"),
                    **kw):
    """Train on eager and on the fused route with each replay; fused params within `tol` of eager's, the python
    and captured replays bit for bit equal (and "auto", if asked, too: a user's Module runs the python replay).
    `captured`: whether the captured replay must really have captured. Returns the eager run's (params, reports)."""
    eager_model, _, er = _run(make_model, make_opt, batches, steps, route="eager", **kw)
    want = _params(eager_model)
    runs = {}
    for replay in replays:
        model, trainer, reports = _run(make_model, make_opt, batches, steps, replay=replay, **kw)
        assert {r.route for r in reports} == {"fused"}
        assert trainer.fused.replay == ("python" if replay == "auto" else replay)
        runs[replay] = (_params(model), reports, trainer)
        _assert_params_close(runs[replay][0], want, tol, f"fused {replay} vs eager:")
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in er], rtol=tol, atol=tol)
        if kw.get("clip_grad_norm") is not None:
            np.testing.assert_allclose([r.grad_norm for r in reports], [r.grad_norm for r in er], rtol=1e-5)
    capture = runs["captured"][2].fused.plan.capture
    assert (capture is not None and capture.tape is not None) == captured, capture and capture.note
    for other in (r for r in replays if r != "python"):  # the replays run the same calls on the same buffers
        for name in want:
            np.testing.assert_array_equal(runs[other][0][name], runs["python"][0][name], err_msg=f"{other} {name}")
        assert [r.loss for r in runs[other][1]] == [r.loss for r in runs["python"][1]]
    return want, er


def _to_torch(model, tmodel):
    """Copy `model`'s values into the torch twin `tmodel` (same state_dict keys)."""
    sd = {k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()}
    tmodel.load_state_dict(sd)
    return tmodel


def _torch_train(tmodel, topt, batches, steps, *, loss_fn=None, clip=None, sched=None):
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    losses = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        topt.zero_grad(set_to_none=True)
        loss = loss_fn(tmodel(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(tmodel.parameters(), clip)
        topt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return {k: v.detach().numpy().copy() for k, v in tmodel.named_parameters()}, losses


# -- weight tying ------------------------------------------------------------------------------------

class TiedLM(Module):
    """Embedding and output projection share one Parameter (the torch idiom head.weight = emb.weight)."""

    def __init__(self, dtype=np.float32, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.emb = Embedding(20, 16, rng=rng, padding_idx=0, dtype=dtype)
        self.norm = LayerNorm(16, dtype=dtype)
        self.head = Linear(16, 20, rng=rng, dtype=dtype)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.norm(self.emb(ids).mean(dim=1)))


class TorchTiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16, padding_idx=0)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 20)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.norm(self.emb(ids).mean(dim=1)))


def test_tied_embedding_and_output_projection_match_eager_on_every_replay():
    model = TiedLM()
    assert len(list(model.parameters())) == 4  # the shared weight once
    assert model.state_dict().keys() == {"emb.weight", "norm.weight", "norm.bias", "head.weight", "head.bias"}
    assert any((ids == 0).any() for ids, _ in _tokens(3))  # the padding row is read, and tied to the head
    _fused_vs_eager(TiedLM, lambda m: optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1), _tokens(3), 12,
                    TOL[np.float32], replays=REPLAYS)
    # flat gradients (clipping): the tied weight's two contributions summed into its one flat gradient
    _fused_vs_eager(TiedLM, lambda m: optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1), _tokens(3), 6,
                    TOL[np.float32], clip_grad_norm=0.5)


def test_tied_weights_on_the_fused_route_match_torch():
    batches = _tokens(3)
    make_opt = lambda m: optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)  # noqa: E731
    model, trainer, reports = _run(lambda: TiedLM(np.float64), make_opt, batches, 12, replay="captured")
    assert trainer.fused.plan.capture.tape is not None
    tmodel = _to_torch(TiedLM(np.float64), TorchTiedLM().double())
    assert tmodel.head.weight is tmodel.emb.weight
    want, losses = _torch_train(tmodel, torch.optim.AdamW(tmodel.parameters(), lr=1e-2, weight_decay=0.1), batches, 12)
    got = _params(model)
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-10, err_msg=name)
    np.testing.assert_allclose([r.loss for r in reports], losses, rtol=1e-10)
    # the tie survives training: both modules still hold the one (flattened) parameter
    assert model.head.weight is model.emb.weight
    np.testing.assert_array_equal(model.state_dict()["head.weight"], model.state_dict()["emb.weight"])


class TwiceLinear(Module):
    """One Linear applied twice, and a residual that reads its input twice (x + f(x))."""

    def __init__(self, dtype=np.float32, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.inp = Linear(12, 16, rng=rng, dtype=dtype)
        self.shared = Linear(16, 16, rng=rng, dtype=dtype)
        self.out = Linear(16, 4, rng=rng, dtype=dtype)

    def forward(self, x):
        h = relu(self.inp(x))
        h = h + relu(self.shared(h))  # residual: h read twice
        h = h + relu(self.shared(h))  # the same Linear again
        return self.out(h * h + h)  # and a product of a tensor with itself


class TorchTwiceLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.shared, self.out = torch.nn.Linear(12, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        h = h + torch.relu(self.shared(h))
        h = h + torch.relu(self.shared(h))
        return self.out(h * h + h)


@pytest.mark.parametrize("update_in_backward", [None, False], ids=["in_backward", "flat"])
def test_a_linear_called_twice_and_residuals_match_eager(update_in_backward):
    _fused_vs_eager(TwiceLinear, lambda m: optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
                    _rows(3), 20, TOL[np.float32], update_in_backward=update_in_backward)


def test_a_linear_called_twice_matches_torch():
    batches = _rows(3, dtype=np.float64)
    model, trainer, reports = _run(lambda: TwiceLinear(np.float64),
                                   lambda m: optim.Adam(m.parameters(), lr=1e-2, weight_decay=1e-2), batches, 20,
                                   replay="captured")
    assert trainer.fused.plan.capture.tape is not None
    tmodel = _to_torch(TwiceLinear(np.float64), TorchTwiceLinear().double())
    want, losses = _torch_train(tmodel, torch.optim.Adam(tmodel.parameters(), lr=1e-2, weight_decay=1e-2), batches, 20)
    _assert_params_close(_params(model), want, 1e-10)
    np.testing.assert_allclose([r.loss for r in reports], losses, rtol=1e-10)


# -- detach ---------------------------------------------------------------------------------------------

class Detached(Module):
    """An auxiliary head reads the trunk through detach(): the trunk learns only from the main head."""

    def __init__(self, dtype=np.float32, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.trunk = Linear(12, 16, rng=rng, dtype=dtype)
        self.main = Linear(16, 4, rng=rng, dtype=dtype)
        self.aux = Linear(16, 4, rng=rng, dtype=dtype)

    def forward(self, x):
        h = relu(self.trunk(x))
        return self.main(h) + 0.5 * self.aux(h.detach())


class TorchDetached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.main, self.aux = torch.nn.Linear(12, 16), torch.nn.Linear(16, 4), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return self.main(h) + 0.5 * self.aux(h.detach())


def test_detach_stops_the_gradient_on_every_replay_as_in_torch():
    make_opt = lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.5)  # noqa: E731
    _fused_vs_eager(Detached, make_opt, _rows(3), 20, TOL[np.float32])
    batches = _rows(3, dtype=np.float64)
    model, trainer, reports = _run(lambda: Detached(np.float64), make_opt, batches, 20, replay="captured")
    tmodel = _to_torch(Detached(np.float64), TorchDetached().double())
    want, losses = _torch_train(tmodel, torch.optim.SGD(tmodel.parameters(), lr=0.1, momentum=0.5), batches, 20)
    _assert_params_close(_params(model), want, 1e-10)
    np.testing.assert_allclose([r.loss for r in reports], losses, rtol=1e-10)


class OnlyDetached(Detached):
    def forward(self, x):
        return self.main(relu(self.trunk(x)).detach())  # the trunk gets no gradient at all


@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_a_parameter_cut_off_by_detach_is_left_alone_as_on_eager(clip, caplog):
    # The trunk gets no gradient at all: eager's optimizer (as torch's) skips it, and so does the fused step,
    # which leaves it out of its layout. Regression (failed on d412136): the fused route refused the model with
    # UnsupportedOpError "parameters ['trunk.weight', ...] received no gradient in the traced step".
    make_opt = lambda m: optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.1)  # noqa: E731
    before = _params(OnlyDetached())
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        want, _ = _fused_vs_eager(OnlyDetached, make_opt, _rows(3), 6, TOL[np.float32], clip_grad_norm=clip)
    assert "trunk.weight" in caplog.text and "left out of the fused update" in caplog.text
    for name in ("trunk.weight", "trunk.bias"):
        np.testing.assert_array_equal(want[name], before[name])  # not even weight decay touched it


# -- parameters without a gradient on some steps only ----------------------------------------------------

class Freezable(Module):
    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.a = Linear(12, 16, rng=rng)
        self.b = Linear(16, 16, rng=rng)
        self.head = Linear(16, 4, rng=rng)

    def forward(self, x):
        return self.head(relu(self.b(relu(self.a(x)))))


# Regression (failed on d412136): freezing a layer mid-run (layer.requires_grad_(False), the usual fine-tuning
# move; eager and torch then skip its update) made the next fused step on the default update_in_backward fail
# *after* it had already updated `head` (RuntimeError "step 4 failed inside backward after 2 of 6 parameters were
# already updated ... partly applied ... Restore the last checkpoint"), on both replays: the plan, keyed by the
# batch signature only, replayed the trace made with `a` trainable and diverged inside backward, and the error
# blamed "control flow [that] depends on the data". Now the flat layout is rebuilt (FlatState.stale) and the step
# retraces: it trains like eager (no exception).
@pytest.mark.parametrize("replay", ("python", "captured"))
def test_freezing_a_layer_mid_run_trains_like_eager_or_fails_before_any_update(replay):
    batches = _rows(3)
    runs = {}
    for route in ("eager", "fused"):
        model = Freezable()
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route,
                          fused_replay=replay)
        for i in range(3):
            trainer.step(*batches[i])
        model.a.requires_grad_(False)
        before = _params(model)
        try:
            trainer.step(*batches[0])
            runs[route] = _params(model)
        except Exception as exc:  # noqa: BLE001 - either outcome is acceptable, a half-applied step is not
            assert route == "fused"
            changed = [n for n, v in _params(model).items() if not np.array_equal(v, before[n])]
            assert not changed, f"the failed step already updated {changed}: {exc}"
            assert "data" not in str(exc), f"the error blames the data for a requires_grad change: {exc}"
            return
    _assert_params_close(runs["fused"], runs["eager"], TOL[np.float32])


class ConfigBranch(Freezable):
    """A branch chosen by the configuration (not the data): `b` is used only while use_b is set."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.use_b = True

    def forward(self, x):
        h = relu(self.a(x))
        if self.use_b:
            h = h + relu(self.b(h))
        return self.head(h)


# Regression (failed on d412136, every replay): switching off a config flag that drops a layer from the forward
# failed the next fused step with PlanMismatchError "... The step's control flow depends on the data; use
# route='eager'", although the data had not changed (nothing was updated, but the message sent the user to their
# batches). Now the plan's ModelState sees the attribute change and the plan is traced again, `b` (no gradient)
# left out of the layout: the step trains, `b` untouched (no exception).
@pytest.mark.parametrize("replay", REPLAYS)
def test_a_config_branch_switched_off_mid_run_gives_a_clear_error_or_trains(replay):
    batches = _rows(3)
    model = ConfigBranch()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                      fused_replay=replay)
    for i in range(3):
        trainer.step(*batches[i])
    model.use_b = False
    before = _params(model)
    try:
        trainer.step(*batches[0])
    except Exception as exc:  # noqa: BLE001
        for name, v in _params(model).items():
            np.testing.assert_array_equal(v, before[name], err_msg=f"updated by a failed step: {name}")
        assert "depends on the data" not in str(exc), f"blames the data for a config change: {exc}"
        return
    # trained: `b` got no gradient, so (as on eager and in torch) it must be untouched
    np.testing.assert_array_equal(model.b.weight.data, before["b.weight"])


class ClassDefaultBranch(Freezable):
    """The same branch, its flag a class-level default the user overrides on the instance later."""

    use_b = True

    def forward(self, x):
        h = relu(self.a(x))
        if self.use_b:
            h = h + relu(self.b(h))
        return self.head(h)


class DictConfigBranch(Freezable):
    """The same branch, its flag in a config dict held by the module."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.cfg = {"use_b": True}

    def forward(self, x):
        h = relu(self.a(x))
        if self.cfg["use_b"]:
            h = h + relu(self.b(h))
        return self.head(h)


def _switch_off(model):
    if isinstance(model, DictConfigBranch):
        model.cfg["use_b"] = False
    else:
        model.use_b = False


# Regression (failed on d412136): on fused_replay="captured", a config flag that was not an instance attribute of a
# plain type when the step was recorded (a class-level default later set on the instance, or a value in a dict)
# was not watched by watched_state.ModelState, so after the flag was switched off the recording kept replaying the old
# forward: `b` went on being trained and the loss was the old branch's, with no error and no log. Now ModelState
# watches the attribute set, values nested in dicts/lists/tuples and config objects, and swapped layers; the
# change retraces the plan and the step trains like eager (no exception).
@pytest.mark.parametrize("make_model", [ClassDefaultBranch, DictConfigBranch], ids=["class_default", "dict"])
def test_a_captured_step_follows_a_config_flag_switched_off_mid_run(make_model):
    batches = _rows(3)
    results = {}
    for route in ("eager", "fused"):
        model = make_model()
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route,
                          fused_replay="captured")
        for i in range(3):
            trainer.step(*batches[i])
        if route == "fused":
            assert trainer.fused.plan.capture.tape is not None
        _switch_off(model)
        before = _params(model)
        try:
            report = trainer.step(*batches[0])
        except Exception:  # noqa: BLE001 - a clear refusal before any update would be acceptable
            assert route == "fused"
            for name, v in _params(model).items():
                np.testing.assert_array_equal(v, before[name], err_msg=f"updated by a failed step: {name}")
            return
        results[route] = (report.loss, _params(model), before)
    eager_loss, eager_params, _ = results["eager"]
    fused_loss, fused_params, fused_before = results["fused"]
    np.testing.assert_array_equal(fused_params["b.weight"], fused_before["b.weight"],
                                  err_msg="the captured step trained a layer the forward no longer uses")
    np.testing.assert_allclose(fused_loss, eager_loss, rtol=1e-5)
    _assert_params_close(fused_params, eager_params, TOL[np.float32])


def test_a_config_branch_on_eager_skips_the_unused_layer():
    # the reference behaviour the fused route is measured against above
    batches = _rows(3)
    model = ConfigBranch()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9), cross_entropy, route="eager")
    for i in range(3):
        trainer.step(*batches[i])
    model.use_b = False
    before = _params(model)
    trainer.step(*batches[0])
    np.testing.assert_array_equal(model.b.weight.data, before["b.weight"])
    assert not np.array_equal(model.a.weight.data, before["a.weight"])


# -- float32 and float64 parameters in one model ----------------------------------------------------------

class MixedScale(Module):
    """A float64 trunk with a float32 per-class scale: the scale's gradient arrives as float64."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.trunk = Linear(12, 16, rng=rng, dtype=np.float64)
        self.head = Linear(16, 4, rng=rng, dtype=np.float64)
        self.scale = Parameter(np.linspace(0.5, 1.5, 4), dtype=np.float32)

    def forward(self, x):
        return self.head(relu(self.trunk(x))) * self.scale


def _mixed_groups(m):
    return optim.Adam([{"params": [m.trunk.weight, m.trunk.bias, m.head.weight, m.head.bias]},
                       {"params": [m.scale], "lr": 3e-2, "weight_decay": 0.0}], lr=1e-2, weight_decay=1e-2)


def test_float32_and_float64_parameters_in_separate_groups_match_eager():
    _fused_vs_eager(MixedScale, _mixed_groups, _rows(3, dtype=np.float64), 20, TOL[np.float32])


def test_float32_and_float64_parameters_in_one_group_match_eager():
    # One flat group per dtype (compile/flat.py, FlatState._split): the fused route trains what eager (and torch)
    # do. It refused this before 8021a54 ("a fused param group must hold one dtype ... separate groups").
    _fused_vs_eager(MixedScale, lambda m: optim.Adam(m.parameters(), lr=1e-2), _rows(3, dtype=np.float64), 20,
                    TOL[np.float32], replays=REPLAYS)


class MixedAdd(Module):
    """A float32 layer whose output is added to a float64 bias Parameter (promotes to float64, as in torch)."""

    def __init__(self, seed=0):
        super().__init__()
        self.lin = Linear(12, 4, rng=np.random.default_rng(seed))
        self.bias64 = Parameter(np.linspace(-0.1, 0.1, 4), dtype=np.float64)

    def forward(self, x):
        return self.lin(x) + self.bias64


# Regression (failed on d412136, both routes): float32 activations + a float64 parameter promote to float64 (as
# torch), but add's backward handed the float32 parent a float64 gradient, so the float32 Linear's backward called
# gemm with float64 @ float32 and failed ("gemm: MKL takes one float32 or float64 dtype ... use gemm_reference").
# Now binary ops hand each input its gradient in its own dtype (ops/arith.py), as torch does.
@pytest.mark.parametrize("route", ["eager", "fused"])
def test_float32_activations_plus_a_float64_parameter_train_as_in_torch(route):
    batches = _rows(2)
    make_opt = lambda m: optim.SGD([{"params": list(m.lin.parameters())}, {"params": [m.bias64]}], lr=0.1)  # noqa
    model, _, reports = _run(MixedAdd, make_opt, batches, 3, route=route, replay="python")
    ref = MixedAdd()
    lin = torch.nn.Linear(12, 4)
    lin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ref.lin.state_dict().items()})
    bias = torch.nn.Parameter(torch.from_numpy(ref.bias64.data.copy()))
    topt = torch.optim.SGD([{"params": list(lin.parameters())}, {"params": [bias]}], lr=0.1)
    for i in range(3):
        x, y = batches[i % 2]
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lin(torch.from_numpy(x)) + bias, torch.from_numpy(y))
        loss.backward()
        topt.step()
    np.testing.assert_allclose(model.lin.weight.data, lin.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bias64.data, bias.detach().numpy(), rtol=1e-6, atol=1e-7)


# -- many small parameters, one huge one -----------------------------------------------------------------

class ManyNorms(Module):
    """50 LayerNorms (100 small parameters) between two Linears."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.inp = Linear(12, 8, rng=rng)
        self.norms = [LayerNorm(8) for _ in range(50)]
        self.out = Linear(8, 4, rng=rng)

    def forward(self, x):
        h = self.inp(x)
        for norm in self.norms:
            h = norm(h) + 0.1 * h
        return self.out(h)


def test_fifty_layer_norms_match_eager_on_every_replay():
    assert len(list(ManyNorms().parameters())) == 104
    # distinct lr and weight decay for the norms, so every small parameter's update really is checked
    make_opt = lambda m: optim.AdamW(  # noqa: E731
        [{"params": [p for n in m.norms for p in n.parameters()], "lr": 5e-3, "weight_decay": 0.0},
         {"params": [*m.inp.parameters(), *m.out.parameters()]}], lr=1e-2, weight_decay=0.05)
    _fused_vs_eager(ManyNorms, make_opt, _rows(3, batch=4), 8, TOL[np.float32])


class OneHuge(Module):
    """A single (4, 2**18) parameter: 1 Mi elements, no bias."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.weight = Parameter(rng.standard_normal((4, 1 << 18)).astype(np.float32) * 1e-3)

    def forward(self, x):
        return linear(x, self.weight)


def test_a_single_huge_parameter_matches_eager_on_every_replay():
    batches = _rows(2, batch=4, features=1 << 18)
    for clip in (None, 0.5):
        _fused_vs_eager(OneHuge, lambda m: optim.Adam(m.parameters(), lr=1e-3, weight_decay=1e-2), batches, 5,
                        TOL[np.float32], clip_grad_norm=clip)


# -- clipping of zero and non-finite gradients -----------------------------------------------------------------

def _mlp_model(seed=0, dtype=np.float32):
    from tensorarena.models import MLP, MLPConfig

    return MLP(MLPConfig(in_features=12, hidden=(16,), out_features=4, dtype=dtype), rng=np.random.default_rng(seed))


def _zero_loss(out, y):
    return cross_entropy(out, y) * 0.0


def test_clipping_all_zero_gradients_reports_norm_zero_and_only_decays():
    # Every gradient is exactly 0: the norm is 0, nothing is scaled (no 0/0), AdamW only decays the weights.
    # The captured replay refuses (both checking batches give the same loss and gradients) and keeps Python.
    batches = _rows(3)
    make_opt = lambda m: optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)  # noqa: E731
    want, er = _fused_vs_eager(_mlp_model, make_opt, batches, 5, TOL[np.float32], captured=False,
                               clip_grad_norm=1.0, loss_fn=_zero_loss)
    assert [r.grad_norm for r in er] == [0.0] * 5
    start = _params(_mlp_model())
    for name in want:
        np.testing.assert_allclose(want[name], start[name] * (1 - 1e-2 * 0.1) ** 5, rtol=1e-6, atol=1e-7)
    for replay in REPLAYS:
        _, trainer, reports = _run(_mlp_model, make_opt, batches, 5, replay=replay, clip_grad_norm=1.0,
                                   loss_fn=_zero_loss)
        assert [r.grad_norm for r in reports] == [0.0] * 5
        assert all(np.array_equal(p.grad, np.zeros_like(p.data)) for p in trainer.model.parameters())


class SqrtPenalty(Module):
    """An MLP plus sqrt(s) with s = 0: the loss is finite, d/ds is +inf, so the global norm is inf."""

    def __init__(self, seed=0, dtype=np.float32):
        super().__init__()
        self.inner = _mlp_model(seed, dtype)
        self.s = Parameter(np.zeros(1), dtype=dtype)

    def forward(self, x):
        return self.inner(x) + sqrt(self.s)


class TorchSqrtPenalty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        self.s = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.inner(x) + torch.sqrt(self.s)


def test_clipping_an_infinite_norm_matches_eager_and_torch():
    # torch: clip_coef = max_norm / (inf + 1e-6) = 0, every gradient times 0 (inf * 0 = nan for s), then the
    # update: SGD leaves the finite parameters in place and makes s nan. The reported norm is inf.
    batches = _rows(1)
    make_opt = lambda m: optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):  # d sqrt(s)/ds at 0 = 1/0, as torch computes it
        eager, _, er = _run(SqrtPenalty, make_opt, batches, 1, route="eager", clip_grad_norm=1.0)
        results = {}
        for replay in REPLAYS:
            model, _, reports = _run(SqrtPenalty, make_opt, batches, 1, replay=replay, clip_grad_norm=1.0)
            results[replay] = (_params(model), reports)
    assert er[0].grad_norm == math.inf
    tmodel = TorchSqrtPenalty()
    tmodel.inner.load_state_dict({k.removeprefix("net."): torch.from_numpy(v.copy())
                                  for k, v in SqrtPenalty().inner.state_dict().items()})
    tmodel.s.data.zero_()
    tmodel.inner.zero_grad()
    x, y = batches[0]
    torch.nn.functional.cross_entropy(tmodel(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    tnorm = torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 1.0)
    torch.optim.SGD(tmodel.parameters(), lr=0.1).step()
    assert math.isinf(float(tnorm))
    # torch's keys: inner.0.weight ...; ours: inner.net.0.weight ...
    want = {k.replace("inner.", "inner.net.") if k != "s" else k: p.detach().numpy() for k, p in
            tmodel.named_parameters()}
    _assert_params_close(_params(eager), want, 1e-6, "eager vs torch:")
    for replay, (got, reports) in results.items():
        assert reports[0].grad_norm == math.inf, replay
        _assert_params_close(got, _params(eager), TOL[np.float32], f"fused {replay} vs eager:")


class NanGrad(SqrtPenalty):
    """0 * sqrt(s) at s = 0: the loss is finite, but d/ds = 0 / (2 sqrt(0)) = nan, so the global norm is nan."""

    def forward(self, x):
        return self.inner(x) + 0.0 * sqrt(self.s)


class TorchNanGrad(TorchSqrtPenalty):
    def forward(self, x):
        return self.inner(x) + 0.0 * torch.sqrt(self.s)


def test_clipping_a_nan_norm_matches_eager_and_torch():
    # torch: clip_coef = max_norm / (nan + 1e-6) = nan, clamped to nan, every gradient times nan: after the SGD
    # step every parameter is nan, and the returned norm is nan. The loss itself is finite, so nothing skips it.
    batches = _rows(1)
    make_opt = lambda m: optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        eager, _, er = _run(NanGrad, make_opt, batches, 1, route="eager", clip_grad_norm=1.0)
        results = {}
        for replay in REPLAYS:
            model, _, reports = _run(NanGrad, make_opt, batches, 1, replay=replay, clip_grad_norm=1.0)
            results[replay] = (_params(model), reports)
    assert math.isfinite(er[0].loss) and math.isnan(er[0].grad_norm)
    tmodel = TorchNanGrad()
    tmodel.inner.load_state_dict({k.removeprefix("net."): torch.from_numpy(v.copy())
                                  for k, v in NanGrad().inner.state_dict().items()})
    x, y = batches[0]
    torch.nn.functional.cross_entropy(tmodel(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    assert math.isnan(float(torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 1.0)))
    torch.optim.SGD(tmodel.parameters(), lr=0.1).step()
    want = {k.replace("inner.", "inner.net.") if k != "s" else k: p.detach().numpy() for k, p in
            tmodel.named_parameters()}
    _assert_params_close(_params(eager), want, 1e-6, "eager vs torch:")
    for replay, (got, reports) in results.items():
        assert math.isnan(reports[0].grad_norm), replay
        _assert_params_close(got, _params(eager), TOL[np.float32], f"fused {replay} vs eager:")


# -- the user's own edits around the step ------------------------------------------------------------------------

@pytest.mark.parametrize("replay", ("python", "captured"))
def test_a_loss_with_a_weight_penalty_and_in_place_edits_between_steps_match_eager(replay):
    # The loss reads a weight again (an L2 penalty on head.weight: two uses of one parameter, one of them in the
    # loss), and between steps the user edits parameters in place (clamping, as a WGAN critic) and rebinds one
    # (p.data = ...): the fused route must train on the edited values, as eager does.
    batches = _rows(3)
    results = {}
    for route in ("eager", "fused"):
        model = TwiceLinear()
        loss_fn = lambda out, y, m=model: cross_entropy(out, y) + 1e-2 * (m.out.weight * m.out.weight).sum()  # noqa
        trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), loss_fn, route=route,
                          fused_replay=replay)
        losses = []
        for i in range(12):
            losses.append(trainer.step(*batches[i % 3]).loss)
            np.clip(model.shared.weight.data, -0.2, 0.2, out=model.shared.weight.data)
            if i % 4 == 1:
                model.inp.bias.data = model.inp.bias.data * 0.5
        if route == "fused":
            capture = trainer.fused.plan.capture
            assert (capture is not None and capture.tape is not None) == (replay == "captured")
            assert model.inp.bias.data.base is not None  # re-adopted: a view of the flat buffer again
        results[route] = (_params(model), losses)
    _assert_params_close(results["fused"][0], results["eager"][0], TOL[np.float32])
    np.testing.assert_allclose(results["fused"][1], results["eager"][1], rtol=1e-5)
    assert np.abs(results["fused"][0]["shared.weight"]).max() <= 0.2


# -- every optimizer with weight decay and per-group options -----------------------------------------------------

class TwoPart(Module):
    """A user's model of two parts, for two param groups."""

    def __init__(self, seed=0, dtype=np.float32):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.body = Linear(12, 16, rng=rng, dtype=dtype)
        self.norm = LayerNorm(16, dtype=dtype)
        self.head = Linear(16, 4, rng=rng, dtype=dtype)

    def forward(self, x):
        return self.head(relu(self.norm(self.body(x))))


def _groups(m, lr, wd):
    return [{"params": list(m.body.parameters()), "lr": lr, "weight_decay": wd},
            {"params": [*m.norm.parameters(), *m.head.parameters()]}]


GROUPED = {
    "sgd": (lambda m: optim.SGD(_groups(m, 0.02, 1e-2), lr=0.05, weight_decay=1e-3, momentum=0.9),
            lambda m: torch.optim.SGD(_groups(m, 0.02, 1e-2), lr=0.05, weight_decay=1e-3, momentum=0.9)),
    "sgd_nesterov": (lambda m: optim.SGD(_groups(m, 0.02, 0.0), lr=0.05, weight_decay=1e-2, momentum=0.9,
                                         nesterov=True),
                     lambda m: torch.optim.SGD(_groups(m, 0.02, 0.0), lr=0.05, weight_decay=1e-2, momentum=0.9,
                                               nesterov=True)),
    "adam": (lambda m: optim.Adam(_groups(m, 3e-3, 0.1), lr=1e-2, weight_decay=1e-3),
             lambda m: torch.optim.Adam(_groups(m, 3e-3, 0.1), lr=1e-2, weight_decay=1e-3)),
    "adamw_amsgrad": (lambda m: optim.AdamW(_groups(m, 3e-3, 0.0), lr=1e-2, weight_decay=0.1, amsgrad=True),
                      lambda m: torch.optim.AdamW(_groups(m, 3e-3, 0.0), lr=1e-2, weight_decay=0.1, amsgrad=True)),
    "nadam": (lambda m: optim.NAdam(_groups(m, 3e-3, 0.05), lr=1e-2, weight_decay=1e-3),
              lambda m: torch.optim.NAdam(_groups(m, 3e-3, 0.05), lr=1e-2, weight_decay=1e-3)),
    "nadamw": (lambda m: optim.NAdam(_groups(m, 3e-3, 0.05), lr=1e-2, weight_decay=1e-3, decoupled_weight_decay=True),
               lambda m: torch.optim.NAdam(_groups(m, 3e-3, 0.05), lr=1e-2, weight_decay=1e-3,
                                           decoupled_weight_decay=True)),
    "rmsprop": (lambda m: optim.RMSprop(_groups(m, 3e-3, 0.05), lr=1e-2, weight_decay=1e-3, momentum=0.5,
                                        centered=True),
                lambda m: torch.optim.RMSprop(_groups(m, 3e-3, 0.05), lr=1e-2, weight_decay=1e-3, momentum=0.5,
                                              centered=True)),
    "adagrad": (lambda m: optim.Adagrad(_groups(m, 3e-2, 0.05), lr=5e-2, weight_decay=1e-3, lr_decay=1e-2),
                lambda m: torch.optim.Adagrad(_groups(m, 3e-2, 0.05), lr=5e-2, weight_decay=1e-3, lr_decay=1e-2)),
    "lion": (lambda m: optim.Lion(_groups(m, 3e-4, 0.3), lr=1e-3, weight_decay=0.1), None),
    "lamb": (lambda m: optim.LAMB(_groups(m, 3e-3, 0.1), lr=1e-2, weight_decay=1e-2), None),
}


@pytest.mark.parametrize("update_in_backward", [None, False], ids=["in_backward", "flat"])
@pytest.mark.parametrize("name", sorted(GROUPED))
def test_every_optimizer_with_per_group_lr_and_weight_decay_matches_eager(name, update_in_backward):
    _fused_vs_eager(TwoPart, GROUPED[name][0], _rows(4), 20, TOL[np.float32], update_in_backward=update_in_backward)


@pytest.mark.parametrize("name", sorted(k for k, v in GROUPED.items() if v[1] is not None))
def test_every_optimizer_with_per_group_options_on_the_fused_route_matches_torch(name):
    batches = _rows(4, dtype=np.float64)
    model, trainer, reports = _run(lambda: TwoPart(dtype=np.float64), GROUPED[name][0], batches, 20,
                                   replay="captured")
    assert trainer.fused.plan.capture.tape is not None

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.norm, self.head = torch.nn.Linear(12, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.head(torch.relu(self.norm(self.body(x))))

    tmodel = _to_torch(TwoPart(dtype=np.float64), Twin().double())
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # torch keeps NAdam's mu_product in the default dtype, ours in float64
    try:
        want, losses = _torch_train(tmodel, GROUPED[name][1](tmodel), batches, 20)
    finally:
        torch.set_default_dtype(default)
    _assert_params_close(_params(model), want, 1e-9, name)
    np.testing.assert_allclose([r.loss for r in reports], losses, rtol=1e-10)


# -- a schedule over groups of different base lr -------------------------------------------------------------

def _two_lr_adamw(m):
    return optim.AdamW(_groups(m, 1e-3, 0.0), lr=1e-2, weight_decay=0.05)


def _sched(o):
    return optim.lr_scheduler.warmup_cosine(o, warmup_steps=4, total_steps=20)


@pytest.mark.parametrize("update_in_backward", [None, False], ids=["in_backward", "flat"])
def test_warmup_cosine_over_two_groups_of_different_base_lr(update_in_backward):
    batches = _rows(3)
    _fused_vs_eager(TwoPart, _two_lr_adamw, batches, 20, TOL[np.float32], make_sched=_sched,
                    update_in_backward=update_in_backward)
    # each group follows its own base lr, step for step, on every replay, as torch's schedule does
    tmodel = torch.nn.Linear(2, 2)
    topt = torch.optim.AdamW([{"params": [tmodel.weight], "lr": 1e-3}, {"params": [tmodel.bias]}], lr=1e-2)
    tsched = torch.optim.lr_scheduler.SequentialLR(
        topt, [torch.optim.lr_scheduler.LinearLR(topt, start_factor=1e-3, end_factor=1.0, total_iters=4),
               torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=16)], milestones=[4])
    want = []
    for _ in range(20):
        want.append([g["lr"] for g in topt.param_groups])
        topt.step()
        tsched.step()
    want.append([g["lr"] for g in topt.param_groups])
    for replay in REPLAYS:
        model = TwoPart()
        opt = _two_lr_adamw(model)
        trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay=replay, scheduler=_sched(opt),
                          update_in_backward=update_in_backward)
        got = []
        for i in range(20):
            got.append([g["lr"] for g in opt.param_groups])
            report = trainer.step(*batches[i % 3])
            assert report.lr == got[-1][0]
        got.append([g["lr"] for g in opt.param_groups])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=replay)
        assert trainer.fused.traces == 1
