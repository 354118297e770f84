"""Optimizers and clipping against torch.optim step for step; state_dict; validation; memory behaviour."""

from __future__ import annotations

import copy
import json
import math
import re
import tracemalloc
import weakref

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import kernels
from tensorarena import optim
from tensorarena.nn import Parameter

SHAPES = [(7,), (4, 5), (3, 2, 6), ()]
TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}
TOL = {np.float64: 1e-10, np.float32: 2e-6}
# torch fuses multiply-adds (FMA) where NumPy rounds twice, and the fused Adam kernel computes in
# float64 before rounding to float32, so float32 results differ by a few ulps now and then.
# 2e-6 absolute is a few ulps only while |p| stays O(1): float32 runs use smaller grads.
GRAD_SCALE = {np.float64: 1.0, np.float32: 0.1}
STEPS = 50


def _params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in SHAPES]
    ours = [Parameter(a, dtype=dtype) for a in arrays]
    theirs = [torch.tensor(a, dtype=TORCH_DTYPE[dtype], requires_grad=True) for a in arrays]
    return ours, theirs


def _grouped(params, lrs):
    """Two groups: the first two params at lrs[0], the rest at lrs[1]."""
    return [{"params": params[:2], "lr": lrs[0]}, {"params": params[2:], "lr": lrs[1]}]


def _set_grads(rng, step, ours, theirs, dtype):
    for i, (p, t) in enumerate(zip(ours, theirs)):
        if (step + i) % 7 == 3:  # now and then a parameter has no gradient: both sides skip it
            p.grad, t.grad = None, None
            continue
        g = np.asarray(GRAD_SCALE[dtype] * rng.standard_normal(p.shape), dtype=dtype)
        p.grad = g.copy()
        t.grad = torch.from_numpy(g.copy())


def _max_diff(ours, theirs):
    return max(float(np.max(np.abs(p.data - t.detach().numpy()), initial=0.0)) for p, t in zip(ours, theirs))


def _run_against_torch(ours_cls, torch_cls, kwargs, dtype, *, group_lrs=None, steps=STEPS):
    ours, theirs = _params(dtype)
    if group_lrs is None:
        opt, topt = ours_cls(ours, **kwargs), torch_cls(theirs, foreach=False, **_torch_kwargs(kwargs))
    else:
        opt, topt = ours_cls(_grouped(ours, group_lrs), **kwargs), torch_cls(_grouped(theirs, group_lrs),
                                                                               foreach=False, **_torch_kwargs(kwargs))
    rng = np.random.default_rng(1)
    for step in range(steps):
        _set_grads(rng, step, ours, theirs, dtype)
        opt.step()
        topt.step()
        diff = _max_diff(ours, theirs)
        assert diff <= TOL[dtype], f"step {step}: max |ours - torch| = {diff:.3g}"
        assert all(p.dtype == np.dtype(dtype) for p in ours)
    return opt, topt


SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.1, momentum=0.9, dampening=0.5),
    dict(lr=0.1, momentum=0.9, nesterov=True),
    dict(lr=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True),
    dict(lr=0.1, maximize=True),
    dict(lr=0.1, momentum=0.5, dampening=0.1, weight_decay=0.05, maximize=True),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02, maximize=True),
]
ADAM_CASES = [
    dict(),
    dict(lr=0.01, amsgrad=True),
    dict(lr=0.01, weight_decay=0.1),
    dict(lr=0.01, maximize=True),
    dict(lr=0.02, weight_decay=0.1, amsgrad=True, maximize=True),
    dict(lr=0.01, betas=(0.3, 0.6), eps=1e-6),  # lerp weight >= 0.5: torch's other lerp branch
]
ADAMW_CASES = [
    dict(),
    dict(lr=0.01, weight_decay=0.1, amsgrad=True),
    dict(lr=0.01, maximize=True, betas=(0.8, 0.99)),
]
CASES = ([(optim.SGD, torch.optim.SGD, dict(kw, fused=fused)) for fused in (True, False) for kw in SGD_CASES]
         + [(optim.Adam, torch.optim.Adam, kw) for kw in ADAM_CASES]
         + [(optim.AdamW, torch.optim.AdamW, kw) for kw in ADAMW_CASES])


def _case_id(case):
    cls, _, kw = case
    return cls.__name__ + "-" + ("-".join(f"{k}={v}" for k, v in kw.items()) or "defaults")


def _torch_kwargs(kwargs):
    # `fused` picks our kernel twin; torch's own fused SGD/Adam are a different (CUDA-first) thing.
    return {k: v for k, v in kwargs.items() if k != "fused"}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_matches_torch_step_for_step(case, dtype):
    ours_cls, torch_cls, kwargs = case
    _run_against_torch(ours_cls, torch_cls, kwargs, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("ours_cls, torch_cls, kwargs", [
    (optim.SGD, torch.optim.SGD, dict(momentum=0.9, weight_decay=0.01)),
    (optim.Adam, torch.optim.Adam, dict(amsgrad=True)),
    (optim.AdamW, torch.optim.AdamW, dict(weight_decay=0.05)),
], ids=["SGD", "Adam", "AdamW"])
def test_two_param_groups_with_different_lrs_match_torch(ours_cls, torch_cls, kwargs, dtype):
    opt, _ = _run_against_torch(ours_cls, torch_cls, kwargs, dtype, group_lrs=(0.1, 0.003))
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.003]


def test_per_group_hyperparameter_overrides_match_torch():
    ours, theirs = _params(np.float64)
    opt = optim.SGD([{"params": ours[:2], "momentum": 0.5, "nesterov": True}, {"params": ours[2:]}], lr=0.1,
                    momentum=0.9)
    topt = torch.optim.SGD([{"params": theirs[:2], "momentum": 0.5, "nesterov": True}, {"params": theirs[2:]}],
                           lr=0.1, momentum=0.9)
    rng = np.random.default_rng(3)
    for step in range(20):
        _set_grads(rng, step, ours, theirs, np.float64)
        opt.step()
        topt.step()
        assert _max_diff(ours, theirs) <= 1e-10


def test_state_layout_matches_torch():
    ours, theirs = _params(np.float64)
    opt, topt = optim.Adam(ours, amsgrad=True), torch.optim.Adam(theirs, amsgrad=True)
    rng = np.random.default_rng(2)
    for step in range(5):
        _set_grads(rng, step, ours, theirs, np.float64)
        opt.step()
        topt.step()
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for index, entry in sd["state"].items():
        assert set(entry) == set(tsd["state"][index])
        assert float(entry["step"]) == float(tsd["state"][index]["step"])
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            np.testing.assert_allclose(entry[key], tsd["state"][index][key].numpy(), rtol=1e-12, atol=1e-14)
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    assert set(sd["param_groups"][0]) <= set(tsd["param_groups"][0])
    # SGD keeps no momentum buffer without momentum (as torch); only our uniform step count
    sgd = optim.SGD(ours, lr=0.1)
    sgd.step()
    assert all(set(s) == {"step"} for s in sgd.state_dict()["state"].values())


# -- state_dict round trip ---------------------------------------------------------------------

ROUND_TRIP = {
    "SGD": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "SGD-dampening": lambda ps: optim.SGD(_grouped(ps, (0.1, 0.01)), momentum=0.8, dampening=0.3),
    "Adam": lambda ps: optim.Adam(ps, lr=0.01, amsgrad=True, weight_decay=0.01),
    "AdamW": lambda ps: optim.AdamW(_grouped(ps, (0.01, 0.002)), amsgrad=True, maximize=True),
    "NAdam": lambda ps: optim.NAdam(ps, lr=0.01, weight_decay=0.01),
    "NAdam-decoupled": lambda ps: optim.NAdam(_grouped(ps, (0.01, 0.002)), weight_decay=0.1,
                                              decoupled_weight_decay=True),
    "RMSprop": lambda ps: optim.RMSprop(_grouped(ps, (0.01, 0.002)), centered=True, momentum=0.9),
    "Adagrad": lambda ps: optim.Adagrad(ps, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
    "Lion": lambda ps: optim.Lion(_grouped(ps, (1e-3, 3e-4)), weight_decay=0.1),
    "LAMB": lambda ps: optim.LAMB(ps, lr=0.01, weight_decay=0.01),
    "SGD-momentum": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.2),
    "Adamax": lambda ps: optim.Adamax(_grouped(ps, (0.01, 0.002)), weight_decay=0.01),
    "RAdam": lambda ps: optim.RAdam(ps, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
    "Adadelta": lambda ps: optim.Adadelta(_grouped(ps, (1.0, 0.5)), rho=0.8, maximize=True),
    "Rprop": lambda ps: optim.Rprop(_grouped(ps, (0.01, 0.002)), etas=(0.4, 1.3), step_sizes=(1e-4, 1.0)),
    "ASGD": lambda ps: optim.ASGD(_grouped(ps, (0.05, 0.01)), lambd=0.01, t0=5, weight_decay=0.01),
}
# per-parameter numbers (NAdam keeps mu_product too, ASGD eta and mu)
SCALAR_STATE = ("step", "mu_product", "eta", "mu")


def _grad_stream(n, seed=5):
    rng = np.random.default_rng(seed)
    return [[None if (step + i) % 6 == 2 else np.asarray(rng.standard_normal(s)) for i, s in enumerate(SHAPES)]
            for step in range(n)]


def _train(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else g.copy()
        opt.step()


@pytest.mark.parametrize("name", list(ROUND_TRIP))
@pytest.mark.parametrize("via_json", [False, True], ids=["direct", "json-like"])
def test_state_dict_round_trip_is_exact(name, via_json):
    make = ROUND_TRIP[name]
    grads = _grad_stream(20)
    ref_params, _ = _params(np.float64)
    _train(make(ref_params), ref_params, grads)

    params_a, _ = _params(np.float64)
    opt_a = make(params_a)
    _train(opt_a, params_a, grads[:10])
    sd = opt_a.state_dict()
    if via_json:  # what a checkpoint does: scalars and hyperparameters through JSON, arrays as arrays
        sd = {"state": {str(i): {k: (float(v) if k in SCALAR_STATE else v) for k, v in e.items()}
                        for i, e in sd["state"].items()},
              "param_groups": json.loads(json.dumps(sd["param_groups"]))}
    params_b = [Parameter(p.data, dtype=np.float64) for p in params_a]
    opt_b = make(params_b)
    opt_b.load_state_dict(sd)
    for s in opt_b.state.values():
        for key in SCALAR_STATE:
            if key in s:
                assert isinstance(s[key], np.ndarray) and s[key].shape == () and s[key].dtype == np.float64
    _train(opt_a, params_a, grads[10:])  # the source keeps training: the loaded copy must not alias it
    _train(opt_b, params_b, grads[10:])
    for ref, a, b in zip(ref_params, params_a, params_b):
        np.testing.assert_array_equal(b.data, ref.data)
        np.testing.assert_array_equal(a.data, ref.data)


def test_load_state_dict_reuses_existing_state_buffers():
    params, _ = _params(np.float64)
    opt = optim.Adam(params)
    _train(opt, params, _grad_stream(3))
    buffers = {p: dict(s) for p, s in opt.state.items()}
    snapshot = copy.deepcopy(opt.state_dict())
    _train(opt, params, _grad_stream(2, seed=9))
    opt.load_state_dict(snapshot)
    for p, s in opt.state.items():
        assert s["exp_avg"] is buffers[p]["exp_avg"]
        np.testing.assert_array_equal(s["exp_avg"], snapshot["state"][[id(q) for q in params].index(id(p))]["exp_avg"])
        assert float(s["step"]) == float(snapshot["state"][[id(q) for q in params].index(id(p))]["step"]) > 0


def _trained_adam():
    params, _ = _params(np.float64)
    opt = optim.Adam(_grouped(params, (0.1, 0.2)))
    _train(opt, params, _grad_stream(2))
    return params, opt


@pytest.mark.parametrize("mutate, message", [
    (lambda sd: sd.pop("state"), "no 'state' entry"),
    (lambda sd: sd["param_groups"].pop(), "1 parameter groups but the optimizer has 2"),
    (lambda sd: sd["param_groups"][1]["params"].pop(), "parameter group 1 of the loaded state dict has 1 parameters "
                                                       "but the optimizer's group 1 has 2"),
    (lambda sd: sd["state"][1].__setitem__("exp_avg", np.zeros((5, 4))),
     "state 'exp_avg' of parameter 1 has shape (5, 4) but the parameter has shape (4, 5)"),
    (lambda sd: sd["state"].__setitem__(9, {}), "parameter index 9, which is in no parameter group"),
    (lambda sd: sd["param_groups"][0].__setitem__("lr", -1.0), "Invalid learning rate: -1.0"),
    (lambda sd: sd["state"][0].__setitem__("step", -2), "non-negative whole number, got -2"),
])
def test_load_state_dict_validates_and_leaves_optimizer_untouched(mutate, message):
    params, opt = _trained_adam()
    before = copy.deepcopy(opt.state_dict())
    sd = copy.deepcopy(opt.state_dict())
    mutate(sd)
    with pytest.raises(ValueError, match=re.escape(message)):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert [{k: v for k, v in g.items()} for g in after["param_groups"]] == before["param_groups"]
    for index, entry in before["state"].items():
        for key, value in entry.items():
            np.testing.assert_array_equal(after["state"][index][key], value)


# -- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, kwargs, bad", [
    (optim.SGD, dict(lr=-0.1), "-0.1"),
    (optim.SGD, dict(momentum=-0.5), "-0.5"),
    (optim.SGD, dict(weight_decay=-1e-4), "-0.0001"),
    (optim.SGD, dict(lr=float("nan")), "nan"),
    (optim.SGD, dict(nesterov=True), "momentum=0.0"),
    (optim.SGD, dict(nesterov=True, momentum=0.9, dampening=0.1), "dampening=0.1"),
    (optim.Adam, dict(lr=-1e-3), "-0.001"),
    (optim.Adam, dict(eps=-1e-8), "-1e-08"),
    (optim.Adam, dict(betas=(1.0, 0.999)), "1.0"),
    (optim.Adam, dict(betas=(0.9, -0.1)), "-0.1"),
    (optim.Adam, dict(betas=(0.9,)), "(0.9,)"),
    (optim.Adam, dict(weight_decay=-0.1), "-0.1"),
    (optim.AdamW, dict(betas=(0.9, 1.5)), "1.5"),
    (optim.AdamW, dict(weight_decay=-0.01), "-0.01"),
    (optim.NAdam, dict(lr=-1e-3), "Invalid learning rate: -0.001"),
    (optim.NAdam, dict(betas=(0.9, 1.0)), "Invalid beta parameter at index 1: 1.0"),
    (optim.NAdam, dict(momentum_decay=-1.0), "Invalid momentum_decay value: -1.0"),
    (optim.NAdam, dict(eps=-1.0), "Invalid epsilon value: -1.0"),
    (optim.RMSprop, dict(alpha=-0.5), "Invalid alpha value: -0.5"),
    (optim.RMSprop, dict(momentum=-0.5), "Invalid momentum value: -0.5"),
    (optim.RMSprop, dict(weight_decay=-0.5), "Invalid weight_decay value: -0.5"),
    (optim.Adagrad, dict(lr_decay=-0.1), "Invalid lr_decay value: -0.1"),
    (optim.Adagrad, dict(initial_accumulator_value=-0.1), "Invalid initial_accumulator_value value: -0.1"),
    (optim.Adagrad, dict(eps=float("nan")), "nan"),
    (optim.Lion, dict(lr=-1.0), "Invalid learning rate: -1.0"),
    (optim.Lion, dict(betas=(1.5, 0.99)), "Invalid beta parameter at index 0: 1.5"),
    (optim.Lion, dict(weight_decay=-0.1), "Invalid weight_decay value: -0.1"),
    (optim.LAMB, dict(betas=(0.9,)), "(0.9,)"),
    (optim.LAMB, dict(eps=-1e-6), "Invalid epsilon value: -1e-06"),
])
def test_invalid_hyperparameters_raise_naming_the_value(cls, kwargs, bad):
    params, _ = _params(np.float64)
    with pytest.raises(ValueError, match=re.escape(bad)):
        cls(params, **kwargs)
    with pytest.raises(ValueError, match=re.escape(bad)):  # per-group overrides are checked too
        cls([{"params": params[:1]}, {"params": params[1:], **kwargs}])


def test_invalid_params_arguments():
    params, _ = _params(np.float64)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.SGD(params[0], lr=0.1)
    with pytest.raises(TypeError, match="only optimize Tensors"):
        optim.SGD([params[0], np.zeros(3)], lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD([{"params": set(params)}], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": params[:2]}, {"params": params[1:]}], lr=0.1)
    with pytest.raises(ValueError, match="duplicate"):
        optim.SGD([params[0], params[0]], lr=0.1)
    # A gradient of the wrong shape is refused where it is assigned (as torch does), naming both shapes.
    with pytest.raises(ValueError, match=re.escape("assigned grad has shape (3, 3), but the tensor has shape (7,)")):
        params[0].grad = np.zeros((3, 3))


def test_add_param_group_fills_defaults_and_trains_the_new_group():
    params, _ = _params(np.float64)
    opt = optim.SGD(params[:2], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": params[2:], "lr": 0.5})
    assert opt.param_groups[1]["momentum"] == 0.9 and opt.param_groups[1]["lr"] == 0.5
    before = params[2].data.copy()
    params[2].grad = np.ones(params[2].shape)
    opt.step()
    np.testing.assert_allclose(params[2].data, before - 0.5)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [params[0]]})
    with pytest.raises(ValueError, match="Invalid learning rate: -2"):
        opt.add_param_group({"params": [Parameter(np.zeros(2))], "lr": -2})


# -- gradients, closure, functional layer ----------------------------------------------------------

def test_zero_grad_keeps_the_grad_buffer():
    p = Parameter(np.arange(6.0).reshape(2, 3), dtype=np.float64)
    opt = optim.SGD([p], lr=0.1)
    (p * p).sum().backward()
    np.testing.assert_array_equal(p.grad, 2 * np.arange(6.0).reshape(2, 3))
    buffer = weakref.ref(p.grad)  # not a name: a gradient the caller holds is not refilled (Tensor._release_grad)
    opt.zero_grad()
    assert p.grad is None
    (p * p).sum().backward()
    assert p.grad is buffer()  # the next backward refills the same heap buffer: no churn
    opt.zero_grad(set_to_none=False)
    assert p.grad is buffer() and not p.grad.any()
    (p * 3.0).sum().backward()
    np.testing.assert_array_equal(p.grad, np.full((2, 3), 3.0))


def test_step_with_closure_returns_its_loss():
    p = Parameter(np.array([1.0, -2.0]), dtype=np.float64)
    opt = optim.SGD([p], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss.item()

    assert opt.step(closure) == 5.0
    np.testing.assert_array_equal(p.data, [0.5, -1.0])


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_functional_updates_match_the_classes_exactly(impl):
    params, _ = _params(np.float64)
    grads = _grad_stream(8)
    opt = optim.Adam(params, lr=0.01, amsgrad=True, weight_decay=0.1, fused=impl == "fused")
    _train(opt, params, grads)
    mirror, _ = _params(np.float64)
    state = [dict(m=np.zeros(s), v=np.zeros(s), vmax=np.zeros(s), step=0) for s in SHAPES]
    update = kernels.kernel("adam", impl)
    for step_grads in grads:
        for p, g, st in zip(mirror, step_grads, state):
            if g is None:
                continue
            st["step"] += 1
            update(p.data, g, st["m"], st["v"], st["vmax"], step=st["step"], lr=0.01, weight_decay=0.1)
    for a, b in zip(params, mirror):
        np.testing.assert_array_equal(a.data, b.data)



@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_sgd_functional_and_single_tensor_forms_match_the_class_exactly(impl):
    kw = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False, maximize=True)
    params, _ = _params(np.float64)
    grads = _grad_stream(8)
    _train(optim.SGD(params, fused=impl == "fused", **kw), params, grads)
    mirror, _ = _params(np.float64)
    bufs = [None] * len(mirror)
    for step_grads in grads:
        for i, (p, g) in enumerate(zip(mirror, step_grads)):
            if g is not None:
                bufs[i] = optim.sgd_update(p.data, g, bufs[i], fused=impl == "fused", **kw)
    for a, b in zip(params, mirror):
        np.testing.assert_array_equal(a.data, b.data)

    p = np.ones(3)
    buf = optim.sgd_update(p, np.full(3, 2.0), None, lr=0.5, momentum=0.9, fused=impl == "fused")
    np.testing.assert_array_equal(p, np.zeros(3))
    np.testing.assert_array_equal(buf, np.full(3, 2.0))  # torch: the first buffer is the gradient itself
    assert optim.sgd_update(p, np.full(3, 2.0), None, lr=0.5) is None  # no momentum, no buffer


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sgd_fused_kernel_matches_its_reference_twin_through_the_class(dtype):
    kw = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02)
    runs = {}
    for fused in (True, False):
        params, _ = _params(dtype)
        _train(optim.SGD(params, fused=fused, **kw), params, _grad_stream(20))
        runs[fused] = [p.data for p in params]
    for a, b in zip(runs[True], runs[False]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("amsgrad, decoupled, maximize", [(False, False, False), (True, True, True),
                                                          (True, False, True), (False, True, False)])
def test_adam_fused_kernel_matches_its_reference_twin(dtype, tol, amsgrad, decoupled, maximize):
    rng = np.random.default_rng(3)
    shape = (37, 5)
    arrays = {impl: [rng.standard_normal(shape).astype(dtype)] for impl in ("reference", "fused")}
    arrays["fused"] = [arrays["reference"][0].copy()]
    for impl in arrays:
        arrays[impl] += [np.zeros(shape, dtype) for _ in range(3)]
    for step in range(1, 31):
        g = rng.standard_normal(shape).astype(dtype)
        for impl, (p, m, v, vmax) in arrays.items():
            kernels.kernel("adam", impl)(p, g, m, v, vmax if amsgrad else None, step=step, lr=0.01, weight_decay=0.1,
                                         maximize=maximize, decoupled_weight_decay=decoupled)
    for ref, fused in zip(arrays["reference"], arrays["fused"]):
        np.testing.assert_allclose(fused, ref, rtol=0, atol=tol)


@pytest.fixture
def unforced_kernels():
    """Nothing forced (whatever TENSORARENA_KERNELS says) for the test; the previous choice afterwards."""
    saved = kernels._force_reference
    kernels.use_reference(False)
    yield
    kernels.use_reference(saved)


def test_sgd_route_is_recorded_and_can_be_forced(unforced_kernels):
    params, _ = _params(np.float64)
    before = dict(kernels.calls)
    _train(optim.SGD(params, lr=0.01, momentum=0.9), params, _grad_stream(2))
    assert kernels.calls[("sgd", "fused")] > before.get(("sgd", "fused"), 0)
    kernels.use_reference(True)
    _train(optim.SGD(params, lr=0.01, momentum=0.9), params, _grad_stream(2))
    kernels.use_reference(False)
    assert kernels.calls[("sgd", "reference")] > before.get(("sgd", "reference"), 0)
    _train(optim.SGD(params, lr=0.01, fused=False), params, _grad_stream(1))  # explicit beats the default
    assert kernels.calls[("sgd", "reference")] > before.get(("sgd", "reference"), 0) + 1


def test_adam_route_is_recorded_and_can_be_forced(unforced_kernels):
    params, _ = _params(np.float64)
    before = dict(kernels.calls)
    opt = optim.AdamW(params, lr=0.01)
    _train(opt, params, _grad_stream(2))
    assert kernels.calls[("adam", "fused")] > before.get(("adam", "fused"), 0)
    kernels.use_reference(True)
    try:
        _train(optim.AdamW(params, lr=0.01), params, _grad_stream(2))
    finally:
        kernels.use_reference(False)
    assert kernels.calls[("adam", "reference")] > before.get(("adam", "reference"), 0)


# -- memory ----------------------------------------------------------------------------------------

MAKERS = {
    "SGD": lambda ps: optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True),
    "Adam": lambda ps: optim.Adam(ps, lr=1e-3, amsgrad=True, weight_decay=0.01, maximize=True),
    "AdamW": lambda ps: optim.AdamW(ps, lr=1e-3, amsgrad=True),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_parameters_keep_identity_and_address(name):
    params, _ = _params(np.float32)
    arrays = [p.data for p in params]
    addresses = [a.ctypes.data for a in arrays]
    opt = MAKERS[name](params)
    _train(opt, params, _grad_stream(20))
    for p, a, addr in zip(params, arrays, addresses):
        assert p.data is a and p.data.ctypes.data == addr
        assert p.dtype == np.float32


@pytest.mark.parametrize("name", list(MAKERS))
def test_state_is_heap_memory_when_stepping_inside_an_arena(name):
    params, _ = _params(np.float64)
    opt = MAKERS[name](params)
    grads = _grad_stream(3)
    with ta.Arena() as arena:
        for step_grads in grads:
            loss = sum(((p * p).sum() for p in params[:3]), start=ta.tensor(0.0, dtype=np.float64))
            opt.zero_grad()
            loss.backward()  # real gradients, created while the arena is open
            for p, g in zip(params[3:], step_grads[3:]):
                p.grad = g
            opt.step()
        assert arena.stats.allocations > 0
    assert opt.state, "the optimizer created no state"
    snapshot = {p: {k: np.array(v, copy=True) for k, v in s.items()} for p, s in opt.state.items()}
    values = [p.data.copy() for p in params]
    for s in opt.state.values():
        for value in s.values():
            if isinstance(value, np.ndarray):
                assert value.base is None and value.flags.owndata  # not a view into an arena block
    # Recycle the arena's blocks and scribble over them: the state and the params must not change.
    with ta.Arena() as again:
        for _ in range(8):
            again.alloc((1 << 16,), np.float64).fill(123.0)
    for p, s in opt.state.items():
        for key, value in s.items():
            np.testing.assert_array_equal(value, snapshot[p][key])
    for p, v in zip(params, values):
        np.testing.assert_array_equal(p.data, v)  # p.data is readable (not stale) and unchanged


@pytest.mark.parametrize("name", list(MAKERS))
def test_steps_allocate_no_array_memory(name):
    rng = np.random.default_rng(0)
    params = [Parameter(rng.standard_normal(s), dtype=np.float64) for s in [(256, 256), (256,), (64, 300)]]
    for p in params:
        p.grad = rng.standard_normal(p.shape)
    opt = MAKERS[name](params)
    for _ in range(3):  # warm-up: state and scratch are created here
        opt.step()
    param_bytes = sum(p.data.nbytes for p in params)
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(300):
            opt.step()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current - start < 16 * 1024, f"memory grew by {current - start} bytes over 300 steps"
    assert peak - start < 64 * 1024 < param_bytes // 8, f"a step allocated {peak - start} bytes"


# -- clipping --------------------------------------------------------------------------------------

def _grad_pair(dtype, scale=3.0, seed=4):
    rng = np.random.default_rng(seed)
    ours, theirs = _params(dtype)
    for i, (p, t) in enumerate(zip(ours, theirs)):
        if i == 1:
            continue  # no gradient: skipped by both
        g = np.asarray(scale * rng.standard_normal(p.shape), dtype=dtype)
        p.grad = g.copy()
        t.grad = torch.from_numpy(g.copy())
    return ours, theirs


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e4])
def test_clip_grad_norm_matches_torch(dtype, norm_type, max_norm):
    ours, theirs = _grad_pair(dtype)
    total = optim.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type, foreach=False)
    rtol = 1e-12 if dtype == np.float64 else 2e-6
    assert isinstance(total, ta.Tensor) and total.shape == () and total.dtype == np.dtype(dtype)  # as torch's
    assert total.item() == pytest.approx(ttotal.item(), rel=rtol)
    for p, t in zip(ours, theirs):
        if t.grad is None:
            assert p.grad is None
            continue
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=rtol, atol=0)
        assert p.grad.dtype == np.dtype(dtype)


def test_clip_grad_norm_nonfinite_and_edge_cases():
    ours, theirs = _grad_pair(np.float64)
    ours[0].grad[2] = np.nan
    with pytest.raises(RuntimeError, match="non-finite"):
        optim.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    for bad in (np.nan, np.inf):
        ours, theirs = _grad_pair(np.float64)
        ours[2].grad[0, 1] = bad
        theirs[2].grad[0, 1] = bad
        total = optim.clip_grad_norm_(ours, 1.0)
        ttotal = torch.nn.utils.clip_grad_norm_(theirs, 1.0, foreach=False)
        assert (math.isnan(total) and math.isnan(float(ttotal))) or total == float(ttotal)
        for p, t in zip(ours, theirs):
            if p.grad is not None:
                np.testing.assert_array_equal(p.grad, t.grad.numpy())  # NaN where torch has NaN
    p = Parameter(np.array([3.0, 4.0]), dtype=np.float64)
    p.grad = np.array([3.0, 4.0])
    assert optim.clip_grad_norm_(p, 10.0) == 5.0  # a single tensor is accepted; no clipping needed
    np.testing.assert_array_equal(p.grad, [3.0, 4.0])
    p.grad = None
    assert optim.clip_grad_norm_([p], 1.0) == 0.0
    for kwargs, bad in ((dict(max_norm=1.0, norm_type=-1.0), "-1.0"), (dict(max_norm=-1.0), "-1.0")):
        with pytest.raises(ValueError, match=re.escape(bad)):
            optim.clip_grad_norm_([p], **kwargs)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_clip_grad_value_matches_torch(dtype):
    ours, theirs = _grad_pair(dtype)
    buffers = [p.grad for p in ours]
    optim.clip_grad_value_(ours, 1.5)
    torch.nn.utils.clip_grad_value_(theirs, 1.5, foreach=False)
    for p, t, buf in zip(ours, theirs, buffers):
        assert p.grad is buf
        if t.grad is not None:
            np.testing.assert_array_equal(p.grad, t.grad.numpy())
    with pytest.raises(ValueError, match="-1.0"):
        optim.clip_grad_value_(ours, -1.0)


def test_exports():
    for name in ("Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler", "clip_grad_norm_", "clip_grad_value_"):
        assert hasattr(optim, name)
    assert issubclass(optim.AdamW, optim.Optimizer) and issubclass(optim.SGD, optim.Optimizer)


@pytest.mark.parametrize("make", [
    lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=0.1),
    lambda ps: optim.AdamW(ps, lr=1e-2, amsgrad=True),
    lambda ps: optim.AdamW(ps, lr=1e-2, maximize=True, fused=False),  # the reference kernel: update_flat each call
    lambda ps: optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),  # Optimizer's default prepare_flat
], ids=["adam_l2", "adamw_amsgrad", "adamw_reference", "sgd_nesterov"])
def test_prepare_flat_updates_as_update_flat_and_reads_the_groups_lr_live(make):
    # What a captured fused step runs for each parameter (compile/flat.FlatGroup.prepare_param): bound once
    # to the arrays, it must give update_flat's results bit for bit, with a learning rate changed between
    # steps (a schedule) taking effect.
    rng = np.random.default_rng(5)
    param = rng.standard_normal((6, 7)).astype(np.float32)
    grad = np.empty_like(param)
    prepared_opt, plain_opt = make([Parameter(param.copy())]), make([Parameter(param.copy())])
    arrays = {}
    for opt in (prepared_opt, plain_opt):
        p = opt.param_groups[0]["params"][0]
        arrays[id(opt)] = p.data, opt._init_state(p, opt.param_groups[0])
    p1, s1 = arrays[id(prepared_opt)]
    p2, s2 = arrays[id(plain_opt)]
    update = prepared_opt.prepare_flat(prepared_opt.param_groups[0], p1, grad, s1)
    for step in range(1, 6):
        grad[...] = rng.standard_normal(grad.shape)
        if step == 3:
            for opt in (prepared_opt, plain_opt):
                opt.param_groups[0]["lr"] = 3e-3
        update(float(step))
        plain_opt.update_flat(plain_opt.param_groups[0], p2, grad, s2, float(step), None)
        np.testing.assert_array_equal(p1, p2)
        for key in s1:
            np.testing.assert_array_equal(s1[key], s2[key])
    assert not np.array_equal(p1, param)
