"""Bug hunt: optimizers across routes (eager, fused with both replays, streaming) and dtype changes mid-run.

Beyond test_optim_hunt / test_fused_user_changes: model.double() / float() between steps with optimizer state,
schedules over 100 steps against torch, add_param_group under a running schedule on every route, parameters
without a gradient on some steps (a data-dependent branch), optimizer state dicts loaded into a model on another
route (and in another dtype), maximize / weight decay / state kinds switched by hand mid-run on every route.

20 of these 89 tests fail on 499de7f, before the fixes (each under a "Regression (fixed)" comment): the 12
eager-vs-torch and 5 every-route model.double() tests, the streaming one, the error-message one and the
tiny-moments load. With this file
copied into a worktree of 499de7f (git worktree add /tmp/old-optim-routes 499de7f), run in /tmp/old-optim-routes:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_optim_routes_hunt.py`.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from tensorarena import nn, optim
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer
from mlp_cases import labelled_rows, small_mlp

F32, F64 = np.float32, np.float64
TORCH_DTYPE = {F32: torch.float32, F64: torch.float64}
ROUTES = ("eager", "python", "captured")
LS, TLS = optim.lr_scheduler, torch.optim.lr_scheduler


def _trainer(model, opt, route, **kw):
    if route in ("python", "captured"):
        kw.update(route="fused", fused_replay=route)
    else:
        kw.update(route=route)
    return Trainer(model, opt, cross_entropy, **kw)


def _params(model):
    return [p.data.copy() for p in model.parameters()]


def _max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def _batches(dtype=F32, n=6):
    return labelled_rows(n=n, dtype=dtype)


# -- model.double() / float() between steps, with optimizer state ---------------------------------------------

OPTIMIZERS = {
    "adam": lambda ps: optim.Adam(ps, lr=1e-2),
    "adamw-amsgrad": lambda ps: optim.AdamW(ps, lr=1e-2, amsgrad=True, weight_decay=0.1),
    "nadam": lambda ps: optim.NAdam(ps, lr=1e-2, weight_decay=0.01),
    "sgd-momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "rmsprop-centered": lambda ps: optim.RMSprop(ps, lr=1e-2, centered=True, momentum=0.5),
    "adagrad": lambda ps: optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.1),
    "lion": lambda ps: optim.Lion(ps, lr=1e-3, weight_decay=0.1),
    "lamb": lambda ps: optim.LAMB(ps, lr=1e-2, weight_decay=0.01),
}
TORCH_OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw-amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, weight_decay=0.1),
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=1e-2, weight_decay=0.01),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "rmsprop-centered": lambda ps: torch.optim.RMSprop(ps, lr=1e-2, centered=True, momentum=0.5),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.1),
}


# Regression (fixed): after model.double() (or float()) between steps, the eager optimizer refused its own state
# ("ValueError: Adam: state 'exp_avg' is float32[4, 3] but param is float64[4, 3]") while the fused route's new
# layout casts the state to the new dtype and trains on, so the same script trained or died by route. torch's own
# step raises too ("expected dtype float for `end` but got dtype double"), but torch's load_state_dict casts state to
# its parameter's dtype, which is what a torch user does next. Optimizer._init_state now casts a state array whose
# dtype is no longer its parameter's, so eager trains as torch after opt.load_state_dict(opt.state_dict()).
@pytest.mark.parametrize("frm,to", [(F32, F64), (F64, F32)], ids=["double", "float"])
@pytest.mark.parametrize("name", sorted(TORCH_OPTIMIZERS))
def test_eager_optimizer_state_follows_model_double_as_torch_after_a_state_dict_round_trip(name, frm, to):
    rng = np.random.default_rng(0)
    ours = nn.Linear(3, 4, rng=rng, dtype=frm)
    theirs = torch.nn.Linear(3, 4).to(TORCH_DTYPE[frm])
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.data.copy()))
        theirs.bias.copy_(torch.from_numpy(ours.bias.data.copy()))
    opt, topt = OPTIMIZERS[name](ours.parameters()), TORCH_OPTIMIZERS[name](theirs.parameters())
    grads = [[rng.standard_normal(p.shape) for p in ours.parameters()] for _ in range(6)]
    for i, row in enumerate(grads):
        if i == 3:
            ours.to(to)
            theirs.to(TORCH_DTYPE[to])
            topt.load_state_dict(topt.state_dict())  # torch casts the moments to the parameters' new dtype here
        dtype = frm if i < 3 else to
        for p, q, g in zip(ours.parameters(), theirs.parameters(), row):
            p.grad = g.astype(dtype)
            q.grad = torch.from_numpy(g.astype(dtype))
        opt.step()
        topt.step()
    tol = 1e-5 if F32 in (frm, to) else 1e-12
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert p.dtype == to
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=tol, atol=tol)
        for key, value in opt.state[p].items():
            if key not in ("step", "mu_product"):
                assert value.dtype == to, key
                np.testing.assert_allclose(value, topt.state[q][key].numpy(), rtol=tol, atol=tol, err_msg=key)
        assert float(opt.state[p]["step"]) == 6.0
        if "step" in topt.state[q]:  # torch's SGD keeps no count
            assert float(topt.state[q]["step"]) == 6.0


# Regression (fixed): the same change on the Trainer: eager raised at step 3 where both fused replays trained on.
# Every route now trains the converted model alike, its state cast and its step counts going on.
@pytest.mark.parametrize("name", ["adam", "nadam", "lamb", "sgd-momentum", "rmsprop-centered"])
def test_every_route_trains_alike_after_model_double_mid_run(name):
    results = {}
    for route in ROUTES:
        model = small_mlp(dtype=F32)
        opt = OPTIMIZERS[name](model.parameters())
        trainer = _trainer(model, opt, route)
        for b in _batches(F32)[:3]:
            trainer.step(*b)
        model.double()
        losses = [trainer.step(*b).loss for b in _batches(F64)[3:6]]
        for p in model.parameters():
            assert p.dtype == F64 and float(opt.state[p]["step"]) == 6.0, route
            assert {v.dtype for k, v in opt.state[p].items() if k != "step"} == {np.dtype(F64)}, route
        results[route] = _params(model), losses
    for route in ROUTES[1:]:
        assert _max_diff(results[route][0], results["eager"][0]) <= 1e-12, route
        np.testing.assert_allclose(results[route][1], results["eager"][1], rtol=0, atol=1e-12)


# Regression (fixed): the streaming route casts Adam's state into its new store after model.double() (and
# test_precision_hunt checks it with SGD, which has no state); eager refused. Now both train alike.
def test_streaming_and_eager_train_adam_alike_after_model_double(tmp_path):
    from tests.test_precision_hunt import _vit, _vit_batches

    results = {}
    for route in ("eager", "streaming"):
        model = _vit(F32)
        opt = optim.Adam(model.parameters(), lr=1e-3)
        kw = {"store_dir": tmp_path / "store"} if route == "streaming" else {}
        trainer = _trainer(model, opt, route, **kw)
        for b in _vit_batches(F32)[:2]:
            trainer.step(*b)
        if trainer.stream is not None:
            trainer.stream.to_memory()
        model.double()
        losses = [trainer.step(*b).loss for b in _vit_batches(F64)[2:4]]
        if trainer.stream is not None:
            trainer.stream.to_memory()
        assert {str(v.dtype) for s in opt.state.values() for v in s.values()} == {"float64"}, route
        results[route] = _params(model), losses
    assert _max_diff(results["streaming"][0], results["eager"][0]) <= 1e-10
    np.testing.assert_allclose(results["streaming"][1], results["eager"][1], rtol=0, atol=1e-10)


# Regression (fixed): update_flat called with state of another dtype said what was wrong but not what to do.
def test_update_flat_with_state_of_another_dtype_says_what_to_do():
    opt = optim.Adam([nn.Parameter(np.zeros(3))], lr=0.1)
    group = opt.param_groups[0]
    state = {"exp_avg": np.zeros(3, F32), "exp_avg_sq": np.zeros(3)}
    with pytest.raises(ValueError, match=r"state 'exp_avg' is float32\[3\] but param is float64\[3\].*dtype"):
        opt.update_flat(group, np.zeros(3), np.ones(3), state, 1.0)
    np.testing.assert_array_equal(state["exp_avg"], 0.0)  # refused before any update


# -- schedules against torch over 100 steps ----------------------------------------------------------------

SCHEDULES = {
    "cosine-periodic": (lambda o: LS.CosineAnnealingLR(o, 7, eta_min=0.01),
                        lambda o: TLS.CosineAnnealingLR(o, 7, eta_min=0.01)),
    "linear": (lambda o: LS.LinearLR(o, 0.1, 0.5, 37), lambda o: TLS.LinearLR(o, 0.1, 0.5, 37)),
    "linear-to-zero": (lambda o: LS.LinearLR(o, 1.0, 0.0, 50), lambda o: TLS.LinearLR(o, 1.0, 0.0, 50)),
    "step": (lambda o: LS.StepLR(o, 7, 0.7), lambda o: TLS.StepLR(o, 7, 0.7)),
    "exponential": (lambda o: LS.ExponentialLR(o, 0.97), lambda o: TLS.ExponentialLR(o, 0.97)),
    "constant": (lambda o: LS.ConstantLR(o, 0.25, 13), lambda o: TLS.ConstantLR(o, 0.25, 13)),
    "sequential-3": (
        lambda o: LS.SequentialLR(o, [LS.LinearLR(o, 0.01, 1.0, 10), LS.ConstantLR(o, 0.5, 20),
                                      LS.CosineAnnealingLR(o, 60, 1e-4)], [10, 40]),
        lambda o: TLS.SequentialLR(o, [TLS.LinearLR(o, 0.01, 1.0, 10), TLS.ConstantLR(o, 0.5, 20),
                                       TLS.CosineAnnealingLR(o, 60, 1e-4)], [10, 40])),
    "sequential-exp-step": (
        lambda o: LS.SequentialLR(o, [LS.ExponentialLR(o, 0.9), LS.StepLR(o, 5, 0.5)], [25]),
        lambda o: TLS.SequentialLR(o, [TLS.ExponentialLR(o, 0.9), TLS.StepLR(o, 5, 0.5)], [25])),
    "warmup-cosine": (lambda o: LS.warmup_cosine(o, 10, 100, eta_min=1e-5),
                      lambda o: TLS.SequentialLR(o, [TLS.LinearLR(o, 1e-3, 1.0, 10),
                                                     TLS.CosineAnnealingLR(o, 90, 1e-5)], [10])),
    "warmup-0-cosine": (lambda o: LS.warmup_cosine(o, 0, 30),
                        lambda o: TLS.SequentialLR(o, [TLS.LinearLR(o, 1e-3, 1.0, 0), TLS.CosineAnnealingLR(o, 30)],
                                                   [0])),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_over_100_steps_with_three_groups_matches_torch(name):
    lrs = (0.1, 0.03, 0.0)
    opt = optim.SGD([{"params": [nn.Parameter(np.zeros(2))], "lr": lr} for lr in lrs], lr=0.1)
    topt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs], lr=0.1)
    make, tmake = SCHEDULES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's SequentialLR / step-order notes
        sched, tsched = make(opt), tmake(topt)
        got, want = [], []
        for _ in range(100):
            opt.step()
            topt.step()
            sched.step()
            tsched.step()
            got.append([g["lr"] for g in opt.param_groups])
            want.append([g["lr"] for g in topt.param_groups])
    # torch's recursive forms drift by a few ulps (and to -1e-17 for a zero lr); the closed form does not.
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert sched.get_last_lr() == got[-1]


# -- add_param_group under a running schedule, on every route -------------------------------------------------

def _add_group_run(route, make_opt, make_sched, clip):
    model = small_mlp()
    params = list(model.parameters())
    for p in params[2:]:
        p.requires_grad_(False)
    opt = make_opt(params[:2])
    sched = make_sched(opt)
    trainer = _trainer(model, opt, route, scheduler=sched, clip_grad_norm=clip)
    lrs = []
    for i in range(8):
        if i == 3:
            for p in params[2:]:
                p.requires_grad_(True)
            opt.add_param_group({"params": params[2:], "lr": 0.05})
        report = trainer.step(*_batches()[i % 6])
        assert report.route == ("eager" if route == "eager" else "fused")
        lrs.append([g["lr"] for g in opt.param_groups])
    return model, opt, sched, lrs


@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
@pytest.mark.parametrize("sched_name", ["step", "warmup-cosine"])
@pytest.mark.parametrize("opt_name", ["adam", "lamb", "sgd-momentum"])
def test_add_param_group_under_a_schedule_trains_alike_on_every_route(opt_name, sched_name, clip):
    make_sched = {"step": lambda o: LS.StepLR(o, 2, 0.5), "warmup-cosine": lambda o: LS.warmup_cosine(o, 2, 8)}
    runs = {route: _add_group_run(route, OPTIMIZERS[opt_name], make_sched[sched_name], clip) for route in ROUTES}
    want_params, want_lrs = _params(runs["eager"][0]), runs["eager"][3]
    for route in ROUTES[1:]:
        assert runs[route][3] == want_lrs, route
        assert _max_diff(_params(runs[route][0]), want_params) <= 1e-6, route
    _, opt, sched, lrs = runs["eager"]
    # The added group trained from its first step (its weights moved) and counts its own steps: 5 of 8.
    assert [float(opt.state[p]["step"]) for p in opt.param_groups[1]["params"]] == [5.0, 5.0]
    # Every group follows torch's chainable schedule: the added one goes on from the lr it was added with (each
    # step scales the lr a group has). Torch's schedulers track only the groups present at construction
    # (base_lrs), which a milestone or a restart reads: the added group's base lr is appended there by hand, as
    # tensorarena adopts it (its lr when added), where torch would fail or skip it.
    w0, w1 = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    topt = torch.optim.SGD([w0], lr=opt.param_groups[0]["initial_lr"])
    tsched = {"step": lambda o: TLS.StepLR(o, 2, 0.5),
              "warmup-cosine": lambda o: TLS.SequentialLR(o, [TLS.LinearLR(o, 1e-3, 1.0, 2),
                                                              TLS.CosineAnnealingLR(o, 6)], [2])}[sched_name](topt)
    want = []
    for i in range(8):
        if i == 3:
            topt.add_param_group({"params": [w1], "lr": 0.05})
            for inner in getattr(tsched, "_schedulers", (tsched,)):  # SequentialLR keeps none of its own
                inner.base_lrs.append(0.05)
        topt.step()
        tsched.step()
        want.append([g["lr"] for g in topt.param_groups])
    np.testing.assert_allclose([row[0] for row in lrs], [row[0] for row in want], rtol=1e-12, atol=0)
    assert opt.param_groups[1]["initial_lr"] == 0.05
    np.testing.assert_allclose([row[1] for row in lrs[3:]], [row[1] for row in want[3:]], rtol=1e-12, atol=0)


# -- parameters with no gradient on some steps ---------------------------------------------------------------

class _Branchy(nn.Module):
    """Uses `extra` only for batches of 16 rows: on the other steps it gets no gradient (torch skips it)."""

    def __init__(self, dtype=F32):
        super().__init__()
        rng = np.random.default_rng(0)
        self.a = nn.Linear(12, 4, rng=rng, dtype=dtype)
        self.extra = nn.Linear(12, 4, rng=rng, dtype=dtype)

    def forward(self, x):
        y = self.a(x)
        if x.shape[0] == 16:
            y = y + self.extra(x)
        return y


def _branchy_batches(dtype=F32):
    rng = np.random.default_rng(2)
    out = []
    for n in (16, 8, 16, 8, 8, 16, 8, 16):
        out.append((rng.standard_normal((n, 12)).astype(dtype), rng.integers(0, 4, n)))
    return out


@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
@pytest.mark.parametrize("name", ["adam", "adamw-amsgrad", "nadam", "sgd-momentum", "lamb", "lion"])
def test_a_parameter_without_gradient_on_some_steps_is_skipped_on_every_route(name, clip):
    results = {}
    for route in ROUTES:
        model = _Branchy()
        opt = OPTIMIZERS[name](model.parameters())
        trainer = _trainer(model, opt, route, clip_grad_norm=clip)
        for b in _branchy_batches():
            trainer.step(*b)
        results[route] = _params(model), [float(opt.state[p]["step"]) for p in model.parameters()]
    assert results["eager"][1] == [8.0, 8.0, 4.0, 4.0]  # `extra` stepped only on its 4 steps
    for route in ROUTES[1:]:
        assert results[route][1] == results["eager"][1], route
        assert _max_diff(results[route][0], results["eager"][0]) <= 1e-6, route


@pytest.mark.parametrize("name", ["adam", "nadam", "sgd-momentum", "rmsprop-centered"])
def test_a_parameter_without_gradient_on_some_steps_matches_torch(name):
    model = _Branchy(F64)
    opt = OPTIMIZERS[name](model.parameters())
    trainer = _trainer(model, opt, "captured")
    tlin = {k: torch.nn.Linear(12, 4).double() for k in ("a", "extra")}
    with torch.no_grad():
        for k, lin in tlin.items():
            lin.weight.copy_(torch.from_numpy(getattr(model, k).weight.data.copy()))
            lin.bias.copy_(torch.from_numpy(getattr(model, k).bias.data.copy()))
    tparams = [tlin["a"].weight, tlin["a"].bias, tlin["extra"].weight, tlin["extra"].bias]
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # torch keeps step counts and NAdam's mu_product in the default dtype
    try:
        topt = TORCH_OPTIMIZERS[name](tparams)
        for x, y in _branchy_batches(F64):
            trainer.step(x, y)
            topt.zero_grad()  # set_to_none: `extra` has grad None on the steps it is not used
            xt = torch.from_numpy(x)
            out = tlin["a"](xt) + (tlin["extra"](xt) if x.shape[0] == 16 else 0)
            torch.nn.functional.cross_entropy(out, torch.from_numpy(y)).backward()
            topt.step()
    finally:
        torch.set_default_dtype(saved)
    for p, q in zip(model.parameters(), tparams):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-10, atol=1e-10)
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == [8.0, 8.0, 4.0, 4.0]
    if name != "sgd-momentum":  # torch's SGD keeps no count
        assert [float(topt.state[q]["step"]) for q in tparams] == [8.0, 8.0, 4.0, 4.0]


# -- optimizer state dicts loaded into a model on another route ------------------------------------------------

@pytest.mark.parametrize("name", ["adamw-amsgrad", "nadam", "lamb", "rmsprop-centered"])
@pytest.mark.parametrize("saved_on,loaded_on", [("eager", "captured"), ("captured", "eager"), ("python", "captured")])
def test_optimizer_state_dict_loads_into_a_model_on_another_route(name, saved_on, loaded_on):
    make = OPTIMIZERS[name]
    model = small_mlp()
    trainer = _trainer(model, make(model.parameters()), "eager")
    for b in _batches():
        trainer.step(*b)
    want = _params(model)

    first = small_mlp()
    opt1 = make(first.parameters())
    t1 = _trainer(first, opt1, saved_on)
    for b in _batches()[:3]:
        t1.step(*b)
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt1.state_dict())
    second = small_mlp(seed=5)
    opt2 = make(second.parameters())
    t2 = _trainer(second, opt2, loaded_on)
    t2.step(*_batches()[5])  # state exists (and on the fused route is laid out flat) before the load
    second.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    for b in _batches()[3:]:
        t2.step(*b)
    assert _max_diff(_params(second), want) <= 1e-6
    assert all(float(opt2.state[p]["step"]) == 6.0 for p in second.parameters())


@pytest.mark.parametrize("route", ROUTES)
def test_float32_optimizer_state_loads_into_a_float64_model_as_torch_casts_it(route):
    # torch's load_state_dict casts the saved moments to the parameter's dtype; ours does on every route.
    first = small_mlp(dtype=F32)
    opt1 = optim.Adam(first.parameters(), lr=1e-2)
    t1 = _trainer(first, opt1, "eager")
    for b in _batches(F32)[:3]:
        t1.step(*b)
    second = small_mlp(dtype=F64)
    opt2 = optim.Adam(second.parameters(), lr=1e-2)
    t2 = _trainer(second, opt2, route)
    t2.step(*_batches(F64)[5])
    second.load_state_dict({k: np.asarray(v, F64) for k, v in first.state_dict().items()})
    opt2.load_state_dict(copy.deepcopy(opt1.state_dict()))
    for p, q in zip(second.parameters(), first.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt2.state[p][key].dtype == F64
            np.testing.assert_array_equal(opt2.state[p][key], opt1.state[q][key].astype(F64))
    losses = [t2.step(*b).loss for b in _batches(F64)[3:6]]
    assert all(np.isfinite(losses)) and all(float(opt2.state[p]["step"]) == 6.0 for p in second.parameters())


# Regression (fixed): Optimizer.load_state_dict narrowing a float64 state with tiny moments into a float32 model
# raised FloatingPointError (underflow, under the suite's np.seterr(all="raise")) part way through the entries;
# torch's cast flushes them to 0. The step is still exact and the large moments cast as torch casts them.
def test_float64_state_with_tiny_moments_loads_into_a_float32_model_as_torch_casts_it():
    model = small_mlp(dtype=F32)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    tmodel_params = [torch.tensor(np.asarray(p.data), requires_grad=True) for p in model.parameters()]
    topt = torch.optim.Adam(tmodel_params, lr=1e-2)
    saved = {"state": {}, "param_groups": copy.deepcopy(opt.state_dict()["param_groups"])}
    tsaved = {"state": {}, "param_groups": copy.deepcopy(topt.state_dict()["param_groups"])}
    for i, p in enumerate(model.parameters()):
        moments = np.full(p.shape, 1e-300)  # below float32's smallest subnormal: flushes to 0
        moments.flat[0] = 0.25
        entry = {"step": 3.0, "exp_avg": moments, "exp_avg_sq": moments * 2}
        saved["state"][i] = entry
        tsaved["state"][i] = {"step": torch.tensor(3.0), "exp_avg": torch.tensor(entry["exp_avg"]),
                              "exp_avg_sq": torch.tensor(entry["exp_avg_sq"])}
    opt.load_state_dict(saved)
    topt.load_state_dict(tsaved)
    for i, p in enumerate(model.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            want = topt.state[tmodel_params[i]][key].numpy()
            assert opt.state[p][key].dtype == F32 and want.dtype == np.float32
            np.testing.assert_array_equal(opt.state[p][key], want)


# -- maximize, weight decay and state kinds switched by hand, on every route ---------------------------------------

SWITCHES = {
    "adam": (lambda ps: optim.Adam(ps, lr=1e-2),
             [dict(weight_decay=0.1), dict(maximize=True), dict(decoupled_weight_decay=True), dict(amsgrad=True)]),
    "nadam": (lambda ps: optim.NAdam(ps, lr=1e-2),
              [dict(weight_decay=0.1), dict(maximize=True, momentum_decay=0.01), dict(decoupled_weight_decay=True)]),
    "sgd": (lambda ps: optim.SGD(ps, lr=0.1),
            [dict(weight_decay=0.1), dict(maximize=True, momentum=0.9), dict(nesterov=True, lr=0.01)]),
    "rmsprop": (lambda ps: optim.RMSprop(ps, lr=1e-2),
                [dict(weight_decay=0.1), dict(maximize=True, centered=True), dict(momentum=0.5)]),
    "adagrad": (lambda ps: optim.Adagrad(ps, lr=0.1), [dict(weight_decay=0.1), dict(maximize=True, lr_decay=0.1)]),
    "lion": (lambda ps: optim.Lion(ps, lr=1e-3), [dict(weight_decay=0.5), dict(maximize=True)]),
    "lamb": (lambda ps: optim.LAMB(ps, lr=1e-2), [dict(weight_decay=0.1), dict(maximize=True)]),
}


@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_maximize_weight_decay_and_state_kinds_switched_per_group_train_alike_on_every_route(name, clip):
    make, changes = SWITCHES[name]
    results = {}
    for route in ROUTES:
        model = small_mlp()
        params = list(model.parameters())
        opt = make([{"params": params[:2]}, {"params": params[2:]}])
        trainer = _trainer(model, opt, route, clip_grad_norm=clip)
        trainer.step(*_batches()[0])
        for k, change in enumerate(changes):
            opt.param_groups[k % 2].update(change)
            trainer.step(*_batches()[(k + 1) % 6])
            trainer.step(*_batches()[(k + 2) % 6])
        results[route] = _params(model)
    for route in ROUTES[1:]:
        assert _max_diff(results[route], results["eager"]) <= 1e-6, route


@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_torchs_cast_idiom_after_model_double_trains_alike_on_every_route(clip):
    # What a torch user writes after model.double(): opt.load_state_dict(opt.state_dict()) casts the state. On the
    # fused route the live state is views of float32 flat buffers; the load must cast them, not write into them.
    results = {}
    for route in ROUTES:
        model = small_mlp()
        opt = optim.NAdam(model.parameters(), lr=1e-2)
        trainer = _trainer(model, opt, route, clip_grad_norm=clip)
        for b in _batches(F32)[:3]:
            trainer.step(*b)
        model.double()
        opt.load_state_dict(opt.state_dict())
        assert {v.dtype for s in opt.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")} == {
            np.dtype(F64)}, route
        for b in _batches(F64)[3:6]:
            trainer.step(*b)
        results[route] = _params(model)
    for route in ROUTES[1:]:
        assert _max_diff(results[route], results["eager"]) <= 1e-12, route
