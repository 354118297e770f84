"""Adamax, RAdam, Adadelta, Rprop and ASGD: torch.optim step for step, and full citizens of every route.

Each is checked against torch.optim (its dense single-tensor form: foreach=False) over 50 steps with
weight decay, maximize, two param groups of different lr, float32 and float64, with its state_dict;
its fused kernel against its NumPy twin; one flat update per group (the fused route's way) against the
eager per-tensor step; update_flat without allocation; the Trainer's fused and streaming routes against
its eager route; torch's hyperparameter errors; a state_dict round trip, ours and torch's.
"""

from __future__ import annotations

import copy
import re
import tracemalloc

import numpy as np
import pytest
import torch

from tensorarena import kernels, optim
from tensorarena.kernels import warmup
from tensorarena.nn import Parameter
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer
from tests.test_fused import _batches, _max_param_diff, _mlp, _mlp_batches, _two_groups, _vit
from tests.test_fused import _train as _train_route
from tests.test_optim import SHAPES, STEPS, _grad_stream, _grouped, _max_diff, _params, _set_grads, _train
from tests.test_optimizers_more import DTYPE_IDS, DTYPES, KERNEL_TOL, _flat_setup, _torch_scalars_in

TOL = {np.float64: 1e-10, np.float32: 1e-5}  # max |ours - torch| over every parameter element
NAMES = ["Adamax", "RAdam", "Adadelta", "Rprop", "ASGD"]
KERNEL = {"Adamax": "adamax", "RAdam": "radam", "Adadelta": "adadelta", "Rprop": "rprop", "ASGD": "asgd"}
SCALARS = ("step", "eta", "mu")  # per-parameter numbers in these optimizers' state (ASGD keeps eta and mu)

# -- eager step and state_dict against torch.optim -------------------------------------------------------

TORCH_CASES = {
    "Adamax": [dict(lr=0.01), dict(lr=0.01, weight_decay=0.1),
               dict(lr=0.01, betas=(0.3, 0.6), eps=1e-6, maximize=True)],  # lerp weight >= 0.5: the other branch
    "RAdam": [dict(lr=0.01), dict(lr=0.01, weight_decay=0.1),
              dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
              dict(lr=0.01, betas=(0.3, 0.9)),  # rectified from step 6 on, and the other lerp branch
              dict(lr=0.01, betas=(0.9, 0.5))],  # rho_inf = 3: never rectified, momentum steps only
    "Adadelta": [dict(), dict(lr=0.5, rho=0.5, weight_decay=0.1), dict(lr=0.5, eps=1e-4, maximize=True)],
    "Rprop": [dict(), dict(lr=0.05, etas=(0.3, 1.7), step_sizes=(1e-3, 0.2)),  # both clamps are hit
              dict(lr=0.02, maximize=True), dict(lr=0.02, step_sizes=(0.1, 0.05))],  # min > max: torch gives max
    "ASGD": [dict(), dict(lr=0.05, lambd=0.01, alpha=0.5, t0=10, weight_decay=0.1),  # averaging from step 11
             dict(lr=0.05, lambd=1e-3, t0=0, maximize=True)],  # mu = 1 / t from the first step
}
CASES = [(name, kw) for name, cases in TORCH_CASES.items() for kw in cases]


def _case_id(case):
    name, kw = case
    return name + "-" + ("-".join(f"{k}={v}" for k, v in kw.items()) or "defaults")


def _against_torch(name, kwargs, dtype, *, fused, grouped, steps=STEPS):
    """Step ours and torch's on the same gradients (some steps give a parameter none); max diff <= TOL each step."""
    ours, theirs = _params(dtype)
    if grouped:
        ours, theirs = _grouped(ours, (0.02, 0.005)), _grouped(theirs, (0.02, 0.005))
    opt = getattr(optim, name)(ours, fused=fused, **kwargs)
    topt = getattr(torch.optim, name)(theirs, foreach=False, **kwargs)
    params = [p for g in opt.param_groups for p in g["params"]]
    tparams = [t for g in topt.param_groups for t in g["params"]]
    rng = np.random.default_rng(1)
    key = (KERNEL[name], "fused" if fused else "reference")
    before = kernels.calls[key]
    for step in range(steps):
        _set_grads(rng, step, params, tparams, dtype)
        opt.step()
        topt.step()
        diff = _max_diff(params, tparams)
        assert diff <= TOL[dtype], f"step {step}: max |ours - torch| = {diff:.3g}"
        assert all(p.dtype == np.dtype(dtype) for p in params)
    # the twin asked for ran once per parameter that had a gradient (_set_grads leaves one out now and then)
    updates = sum((step + i) % 7 != 3 for step in range(steps) for i in range(len(params)))
    assert kernels.calls[key] - before == updates
    return opt, topt


def _assert_state_dicts_match(sd, tsd, dtype):
    """Same parameter indices, keys and values (arrays in the parameter dtype, scalars as 0-d float64)."""
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for index, entry in sd["state"].items():
        theirs = tsd["state"][index]
        assert set(entry) == set(theirs), index
        for key, value in entry.items():
            expected = theirs[key].numpy()
            if key in SCALARS:
                assert value.shape == () and value.dtype == np.float64, key
                # torch keeps them in its default dtype: float64 for the float64 runs, float32 otherwise
                np.testing.assert_allclose(value, expected, rtol=1e-12 if dtype == np.float64 else 1e-7,
                                           err_msg=key)
            else:
                assert value.dtype == np.dtype(dtype) and value.shape == expected.shape, key
                np.testing.assert_allclose(value, expected, rtol=10 * TOL[dtype], atol=TOL[dtype], err_msg=key)
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    for ours, theirs in zip(sd["param_groups"], tsd["param_groups"]):
        assert set(ours) - {"fused"} <= set(theirs)  # "fused" picks our kernel twin; torch has none of these
        assert {k: v for k, v in ours.items() if k != "fused"} == {k: theirs[k] for k in ours if k != "fused"}


@pytest.mark.parametrize("grouped", [False, True], ids=["one-group", "two-groups"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_eager_step_and_state_dict_match_torch(case, dtype, fused, grouped):
    name, kwargs = case
    with _torch_scalars_in(dtype):
        opt, topt = _against_torch(name, kwargs, dtype, fused=fused, grouped=grouped)
        _assert_state_dicts_match(opt.state_dict(), topt.state_dict(), dtype)


def test_radam_and_asgd_cases_reach_the_branches_they_are_meant_to():
    # The cases above only test the rectified step / the averaging if the runs get there.
    from tensorarena.kernels.radam import rectification

    for beta2 in (0.999, 0.9):  # rho_t > 5 from step 6 on
        assert rectification(0.9, beta2, 5)[2] is None and rectification(0.9, beta2, 6)[2] is not None
    assert all(rectification(0.9, 0.5, t)[2] is None for t in range(1, STEPS + 1))
    params, _ = _params(np.float64)
    opt = optim.ASGD(params, lr=0.05, t0=10)
    _train(opt, params, [[np.ones(s) for s in SHAPES]] * 12)
    assert float(opt.state[params[0]]["mu"]) == 0.5 and float(opt.state[params[0]]["eta"]) < 0.05


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
def test_rprop_nan_gradient_is_handled_as_torch(fused):
    # torch.sign(NaN) is 0: the coordinate does not move, its step size stays, prev keeps the NaN.
    ours, theirs = _params(np.float64)
    opt, topt = optim.Rprop(ours, fused=fused), torch.optim.Rprop(theirs, foreach=False)
    rng = np.random.default_rng(2)
    for step in range(4):
        for p, t in zip(ours, theirs):
            g = rng.standard_normal(p.shape)
            if step == 1 and g.ndim:
                g.reshape(-1)[0] = np.nan
            p.grad, t.grad = g.copy(), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        for p, t in zip(ours, theirs):
            np.testing.assert_array_equal(p.data, t.detach().numpy())
            for key in ("prev", "step_size"):  # NaN where torch has NaN, too
                np.testing.assert_array_equal(opt.state[p][key], topt.state[t][key].numpy())
        if step == 1:  # the NaN gradients are kept in prev for one step (the case under test happened)
            assert sum(int(np.isnan(s["prev"]).sum()) for s in opt.state.values()) == 3
    assert all(np.isfinite(p.data).all() for p in ours)


def test_defaults_and_signatures_follow_torch():
    import inspect

    params, _ = _params(np.float64)
    flags = {"foreach", "capturable", "differentiable", "fused"}
    for name in NAMES:
        ours, theirs = getattr(optim, name), getattr(torch.optim, name)
        t = theirs([torch.zeros(2, requires_grad=True)])
        defaults = ours(params).defaults
        assert {k: v for k, v in defaults.items() if k != "fused"} == {k: t.defaults[k] for k in defaults
                                                                       if k != "fused"}, name
        assert set(defaults) - {"fused"} == set(t.defaults) - flags, name
        our_sig, torch_sig = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        assert [p for p in our_sig if p != "fused"] == list(torch_sig), name
        # positional or keyword-only exactly where torch has them
        assert all(our_sig[p].kind == torch_sig[p].kind for p in torch_sig), name
        assert name in optim.__all__ and issubclass(ours, optim.Optimizer)
        assert kernels.implementations(KERNEL[name]) == ["fused", "reference"]


# -- fused kernel twins against their references ---------------------------------------------------------

KERNEL_CASES = {
    "adamax": (("exp_avg", "exp_inf"), [
        dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0),
        dict(lr=0.01, beta1=0.3, beta2=0.6, eps=1e-6, weight_decay=0.1, maximize=True),
    ]),
    "radam": (("exp_avg", "exp_avg_sq"), [
        dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1),  # rectified from step 6 on
        dict(lr=0.01, beta1=0.3, beta2=0.9, eps=1e-8, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
        dict(lr=0.01, beta1=0.9, beta2=0.5, eps=1e-8, weight_decay=0.0),  # never rectified
    ]),
    "adadelta": (("square_avg", "acc_delta"), [
        dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0),
        dict(lr=0.5, rho=0.5, eps=1e-4, weight_decay=0.1, maximize=True),
    ]),
    "rprop": (("prev", "step_size"), [
        dict(etaminus=0.5, etaplus=1.2, step_size_min=1e-6, step_size_max=50.0),
        dict(etaminus=0.3, etaplus=1.7, step_size_min=1e-3, step_size_max=0.2, maximize=True),
        dict(etaminus=0.5, etaplus=1.2, step_size_min=0.1, step_size_max=0.05),
    ]),
    "asgd": (("ax",), [
        dict(lr=0.01, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0),
        dict(lr=0.05, lambd=0.01, alpha=0.5, t0=5, weight_decay=0.1, maximize=True),
    ]),
}


def _call_kernel(name, impl, p, g, state, kw, step):
    """One call of kernel `name`, with the per-step scalars the optimizer would pass (ASGD's eta and mu)."""
    kw = dict(kw)
    fn = kernels.kernel(name, impl)
    if name == "asgd":  # torch's schedule: step t uses the eta and mu computed at the end of step t - 1
        lr, alpha, t0 = kw.pop("lr"), kw.pop("alpha"), kw.pop("t0")
        last = step - 1
        kw.update(eta=lr / (1 + kw["lambd"] * lr * last) ** alpha, mu=1 / max(1, last - t0))
        fn(p, g, state["ax"], **kw)
        return
    if name in ("adamax", "radam"):
        kw["step"] = float(step)
    a, b = KERNEL_CASES[name][0]
    fn(p, g, state[a], state[b], **kw)


def _kernel_start(keys, shape, rng, dtype):
    """State as an update would find it: Rprop's step sizes start at a positive lr; the rest random or zero."""
    start = {}
    for k in keys:
        if k == "step_size":
            start[k] = np.full(shape, 0.01)
        elif k in ("exp_inf", "square_avg", "acc_delta"):
            start[k] = np.abs(rng.standard_normal(shape))
        else:
            start[k] = np.zeros(shape)
    return {k: v.astype(dtype) for k, v in start.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name, case", [(n, i) for n, (_, cases) in KERNEL_CASES.items() for i in range(len(cases))])
def test_fused_kernel_matches_its_reference_twin(name, case, dtype):
    keys, cases = KERNEL_CASES[name]
    rng = np.random.default_rng(case)
    p0 = rng.standard_normal(185).astype(dtype)
    init = _kernel_start(keys, p0.shape, rng, dtype)
    runs = {impl: (p0.copy(), {k: v.copy() for k, v in init.items()}) for impl in ("reference", "fused")}
    for step in range(1, 21):
        g = rng.standard_normal(p0.shape).astype(dtype)
        g[step % 7] = 0.0  # a zero gradient: Rprop's "no sign" case
        for impl, (p, state) in runs.items():
            _call_kernel(name, impl, p, g, state, cases[case], step)
    (p_ref, s_ref), (p_fused, s_fused) = runs["reference"], runs["fused"]
    np.testing.assert_allclose(p_fused, p_ref, **KERNEL_TOL[dtype])
    for k in keys:
        np.testing.assert_allclose(s_fused[k], s_ref[k], **KERNEL_TOL[dtype], err_msg=k)
    assert not np.array_equal(p_ref, p0)


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_rprop_kernel_nan_and_sign_change_are_per_element(impl):
    # Exact expected values: growth, shrink (and no move, a stored 0), no product (stay), NaN (no move).
    p = np.zeros(5)
    prev = np.array([1.0, 1.0, 0.0, 1.0, 2.0])
    size = np.full(5, 0.1)
    grad = np.array([2.0, -3.0, 4.0, np.nan, 0.0])
    kernels.kernel("rprop", impl)(p, grad, prev, size, etaminus=0.5, etaplus=1.2, step_size_min=1e-6,
                                  step_size_max=50.0)
    np.testing.assert_array_equal(size, [0.1 * 1.2, 0.1 * 0.5, 0.1, 0.1, 0.1])
    np.testing.assert_array_equal(prev, [2.0, 0.0, 4.0, np.nan, 0.0])
    np.testing.assert_array_equal(p, [-(0.1 * 1.2), 0.0, -0.1, 0.0, 0.0])


@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_fused_kernels_refuse_mismatched_or_strided_state(name):
    keys, cases = KERNEL_CASES[name]
    p, g = np.ones(8), np.ones(8)
    bad_states = [{k: np.zeros(7 if i == 0 else 8) for i, k in enumerate(keys)},
                  {k: np.zeros(16)[::2] if i == 0 else np.zeros(8) for i, k in enumerate(keys)}]
    for state in bad_states:
        with pytest.raises(ValueError, match="does not match|C-contiguous"):
            _call_kernel(name, "fused", p, g, state, cases[-1], 1)


# -- one update_flat per group == the eager step, and no allocation: tests/test_optimizers_more.py's, whose
# FLAT_MAKERS list these optimizers too

def test_the_allocation_bound_catches_a_reference_kernel_without_scratch(monkeypatch):
    # Proof test_optimizers_more's allocation check can fail: its measurement when update_flat hands the reference
    # no scratch.
    _, _, flat_opt, groups = _flat_setup("Adadelta", np.float64, False, [(64, 33), (100,), ()])
    monkeypatch.setattr(flat_opt, "_scratch_like", lambda param, count: None)
    fg = groups[0]
    fg.update(flat_opt, [np.ones((64, 33)), np.ones(100)])
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        flat_opt.update_flat(fg.group, fg.param, fg.grad, fg.state, 2.0, fg.segments)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - start >= 3 * fg.param.nbytes


def test_eager_step_allocates_no_array_memory():
    rng = np.random.default_rng(0)
    for name in NAMES:
        params = [Parameter(rng.standard_normal(s), dtype=np.float64) for s in [(256, 256), (256,), (64, 300)]]
        for p in params:
            p.grad = rng.standard_normal(p.shape)
        opt = getattr(optim, name)(params, lr=1e-3, fused=False)  # the reference twins: the scratch path
        for _ in range(3):  # warm-up: state and scratch are created here
            opt.step()
        tracemalloc.start()
        try:
            start, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            for _ in range(50):
                opt.step()
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert current - start < 16 * 1024, f"{name}: memory grew by {current - start} bytes over 50 steps"
        assert peak - start < 64 * 1024, f"{name}: a step allocated {peak - start} bytes"


# -- the Trainer's fused and streaming routes against its eager route -------------------------------------

ROUTE_OPTIMIZERS = {
    "adamax": lambda m: optim.Adamax(_two_groups(m, lr=3e-3), lr=1e-2, weight_decay=1e-3),
    "radam": lambda m: optim.RAdam(_two_groups(m, lr=3e-3), lr=1e-2, weight_decay=1e-2, decoupled_weight_decay=True),
    "adadelta": lambda m: optim.Adadelta(_two_groups(m, lr=0.5), lr=1.0, weight_decay=1e-3),
    "rprop": lambda m: optim.Rprop(_two_groups(m, lr=3e-3), lr=1e-2, etas=(0.4, 1.3)),
    "asgd": lambda m: optim.ASGD(_two_groups(m, lr=3e-2), lr=5e-2, lambd=1e-2, t0=10, weight_decay=1e-3),
}


def _exponential(opt):  # a schedule, so the fused route must read each group's lr as it changes (ASGD's eta)
    return optim.lr_scheduler.ExponentialLR(opt, gamma=0.97)


def _assert_same_state(o1, o2, m1, m2, tol):
    for (pname, p), q in zip(m1.named_parameters(), m2.parameters()):
        s1, s2 = o1.state.get(p, {}), o2.state.get(q, {})
        assert sorted(s1) == sorted(s2) and s1, pname
        for key in s1:
            np.testing.assert_allclose(np.asarray(s2[key]), np.asarray(s1[key]), rtol=0, atol=tol,
                                       err_msg=f"{pname} {key}")


@pytest.mark.parametrize("replay", ["captured", "python"])
@pytest.mark.parametrize("update_in_backward", [False, True], ids=["flat", "in_backward"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(ROUTE_OPTIMIZERS))
def test_fused_route_matches_eager_over_50_steps(name, dtype, update_in_backward, replay):
    batches = _mlp_batches(dtype)
    kw = dict(make_model=lambda: _mlp(dtype), make_opt=ROUTE_OPTIMIZERS[name], batches=batches, steps=50,
              make_sched=_exponential)
    eager, eager_trainer, _ = _train_route("eager", **kw)
    before = kernels.calls.copy()
    fused, trainer, reports = _train_route("fused", update_in_backward=update_in_backward, fused_replay=replay,
                                           **kw)
    assert {r.route for r in reports} == {"fused"} and trainer.fused.update_in_backward == update_in_backward
    assert trainer.fused.traces == 1
    replays = kernels.calls - before
    assert replays[("fused_replay", replay)] == 50  # every step on the replay asked for (none fell back)
    assert _max_param_diff(eager, fused) <= TOL[dtype], name
    _assert_same_state(eager_trainer.optimizer, trainer.optimizer, eager, fused, 10 * TOL[dtype])
    calls = kernels.calls - before
    optimizer_calls = sum(n for (kname, _), n in calls.items() if kname == name)
    assert optimizer_calls == sum(n for (kname, _), n in calls.items() if kname in KERNEL.values())
    if not update_in_backward:
        assert optimizer_calls == 50 * 2  # one kernel call per group per step (eager: one per parameter)
        return
    assert optimizer_calls == 50 * len(list(fused.parameters()))  # in backward: one per parameter per step
    assert all(g.grad is None for g in trainer.fused.flat.groups)


STREAM_OPTIMIZERS = {
    "adamax": lambda m: optim.Adamax(_grouped(list(m.parameters()), (3e-3, 1e-2)), weight_decay=1e-2),
    "radam": lambda m: optim.RAdam(_grouped(list(m.parameters()), (3e-3, 1e-2)), weight_decay=1e-2),
    "adadelta": lambda m: optim.Adadelta(_grouped(list(m.parameters()), (0.5, 1.0)), rho=0.8),
    "rprop": lambda m: optim.Rprop(_grouped(list(m.parameters()), (3e-3, 1e-2)), step_sizes=(1e-4, 0.05)),
    "asgd": lambda m: optim.ASGD(_grouped(list(m.parameters()), (3e-2, 5e-2)), lambd=1e-2, t0=2,
                                 weight_decay=1e-3),
}


@pytest.mark.parametrize("name", list(STREAM_OPTIMIZERS))
def test_streaming_route_matches_eager(tmp_path, name):
    batches = _batches(3, batch=3, dtype=np.float64) * 2  # 6 steps over 3 batches, so the loss can fall
    runs = {}
    for route in ("eager", "streaming"):
        model = _vit(np.float64)
        opt = STREAM_OPTIMIZERS[name](model)
        trainer = Trainer(model, opt, cross_entropy, scheduler=_exponential(opt), route=route,
                          store_dir=tmp_path / route)
        before = kernels.calls.copy()
        reports = [trainer.step(x, y) for x, y in batches]
        assert {r.route for r in reports} == {route}
        assert sum(n for (kname, _), n in (kernels.calls - before).items() if kname == name) > 0
        if trainer.stream is not None:
            trainer.stream.to_memory()  # the state comes back from the store into optimizer.state
        runs[route] = model, opt, [r.loss for r in reports]
    (m1, o1, l1), (m2, o2, l2) = runs["eager"], runs["streaming"]
    np.testing.assert_allclose(l2, l1, rtol=0, atol=1e-10)
    assert _max_param_diff(m1, m2) <= 1e-10
    _assert_same_state(o1, o2, m1, m2, 1e-10)
    assert l1[-1] != l1[0]  # it trained


# -- hyperparameter validation --------------------------------------------------------------------------

TORCH_CHECKED = [
    ("Adamax", dict(lr=-1e-3)), ("Adamax", dict(eps=-1.0)), ("Adamax", dict(betas=(1.0, 0.999))),
    ("Adamax", dict(betas=(0.9, -0.1))), ("Adamax", dict(weight_decay=-0.1)), ("Adamax", dict(lr=float("nan"))),
    ("RAdam", dict(lr=-1.0)), ("RAdam", dict(eps=-1e-8)), ("RAdam", dict(betas=(0.9, 1.0))),
    ("RAdam", dict(weight_decay=-0.5)),
    ("Adadelta", dict(lr=-1.0)), ("Adadelta", dict(rho=-0.1)), ("Adadelta", dict(rho=1.1)),
    ("Adadelta", dict(eps=-1.0)), ("Adadelta", dict(weight_decay=-1.0)),
    ("Rprop", dict(lr=-0.1)), ("Rprop", dict(etas=(1.0, 1.2))), ("Rprop", dict(etas=(0.5, 1.0))),
    ("Rprop", dict(etas=(0.0, 1.2))), ("Rprop", dict(etas=(float("nan"), 1.2))),
    ("ASGD", dict(lr=-0.01)), ("ASGD", dict(weight_decay=-1e-4)),
]


@pytest.mark.parametrize("name, kwargs", TORCH_CHECKED, ids=[f"{n}-{kw}" for n, kw in TORCH_CHECKED])
def test_invalid_hyperparameters_raise_torchs_error(name, kwargs):
    with pytest.raises(ValueError) as theirs:
        getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], **kwargs)
    params, _ = _params(np.float64)
    with pytest.raises(ValueError, match=f"^{re.escape(str(theirs.value))}$"):
        getattr(optim, name)(params, **kwargs)
    with pytest.raises(ValueError, match=f"^{re.escape(str(theirs.value))}$"):  # per-group overrides too
        getattr(optim, name)([{"params": params[:1]}, {"params": params[1:], **kwargs}])


@pytest.mark.parametrize("name, kwargs, message", [
    ("Rprop", dict(etas=(0.5,)), "Invalid etas: (0.5,) (expected a pair (etaminus, etaplus) of numbers)"),
    ("Rprop", dict(step_sizes=(1e-6,)), "Invalid step_sizes: (1e-06,)"),
    ("Rprop", dict(step_sizes=(1e-6, "50")), "Invalid step_sizes: (1e-06, '50')"),
    ("Rprop", dict(step_sizes=(float("nan"), 50.0)), "Invalid step_sizes: (nan, 50.0) (NaN)"),
    ("ASGD", dict(lambd=float("nan")), "Invalid lambd value: nan"),
    ("ASGD", dict(alpha="0.75"), "Invalid alpha value: '0.75' (expected a number)"),
    ("ASGD", dict(t0=None), "Invalid t0 value: None"),
    ("Adamax", dict(betas=(0.9,)), "Invalid betas: (0.9,)"),
    ("RAdam", dict(capturable=True), "RAdam(capturable=True) has no meaning here"),
    ("Adadelta", dict(differentiable=True), "Adadelta(differentiable=True) has no meaning here"),
])
def test_what_torch_does_not_check_is_refused_clearly(name, kwargs, message):
    # torch raises IndexError for a short pair, or fails (or trains on NaN) at the first step.
    params, _ = _params(np.float64)
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(optim, name)(params, **kwargs)


def test_what_torch_accepts_is_accepted():
    params, _ = _params(np.float64)
    optim.Adadelta(params, rho=1.0)
    optim.Rprop(params, step_sizes=(1.0, 0.5))  # min > max: every step size becomes max, as torch.clamp does
    optim.ASGD(params, lambd=-1e-6, alpha=-1.0, t0=-5.0)
    optim.Adamax(params, foreach=True)  # foreach only picks torch's loop: nothing to do here


def test_asgd_step_size_schedule_without_a_real_value_is_refused_before_any_change():
    p = Parameter(np.ones(3), dtype=np.float64)
    opt = optim.ASGD([p], lr=1.0, lambd=-1.0)  # 1 + lambd * lr * t = 0 at t = 1
    p.grad = np.ones(3)
    with pytest.raises(ValueError, match=re.escape("ASGD: 1 + lambd * lr * step = 0.0 at step 1")):
        opt.step()
    np.testing.assert_array_equal(p.data, np.ones(3))
    state = opt.state[p]
    assert float(state["step"]) == 0 and float(state["eta"]) == 1.0 and float(state["mu"]) == 1.0


# -- state_dict round trips: tests/test_optim.py's test_state_dict_round_trip_is_exact, whose ROUND_TRIP lists these
# optimizers too

@pytest.mark.parametrize("name", NAMES)
def test_torch_state_dict_loads_and_training_goes_on_as_torchs(name):
    kwargs = dict(TORCH_CASES[name][1])  # weight decay, Rprop's clamps, ASGD's averaging
    with _torch_scalars_in(np.float64):
        ours, theirs = _params(np.float64)
        topt = getattr(torch.optim, name)(_grouped(theirs, (0.02, 0.005)), foreach=False, **kwargs)
        rng = np.random.default_rng(4)
        for step in range(10):  # torch trains alone; ours takes over its weights and state
            _set_grads(rng, step, ours, theirs, np.float64)
            topt.step()
        tsd = topt.state_dict()
        sd = {"state": {i: {k: v.numpy() for k, v in s.items()} for i, s in tsd["state"].items()},
              "param_groups": copy.deepcopy(tsd["param_groups"])}
        opt = getattr(optim, name)(_grouped(ours, (0.02, 0.005)), **kwargs)
        for p, t in zip(ours, theirs):
            p.data[...] = t.detach().numpy()
        opt.load_state_dict(sd)
        for step in range(10, 30):
            _set_grads(rng, step, ours, theirs, np.float64)
            opt.step()
            topt.step()
            assert _max_diff(ours, theirs) <= TOL[np.float64], f"step {step}"
        _assert_state_dicts_match(opt.state_dict(), topt.state_dict(), np.float64)


def test_loaded_asgd_scalars_are_validated():
    params, _ = _params(np.float64)
    opt = optim.ASGD(params)
    _train(opt, params, _grad_stream(2))
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["eta"] = np.ones(3)
    with pytest.raises(ValueError, match=re.escape("state 'eta' must be a single number, got shape (3,)")):
        opt.load_state_dict(sd)
    sd["state"][0]["eta"] = 0.01
    sd["state"][0]["mu"] = float("inf")
    with pytest.raises(ValueError, match="'mu' must be a finite number"):
        opt.load_state_dict(sd)


def test_compile_all_warms_the_new_kernels():
    calls = warmup._tiny_calls(np.float32)
    assert set(KERNEL.values()) <= set(calls)
    assert not set(KERNEL.values()) & set(warmup.not_covered())
    for name in KERNEL.values():
        calls[name]()  # runs each optimizer's fused update once on tiny arrays
