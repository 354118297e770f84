"""Bug hunt: optimizers, LR schedules and clipping against torch.optim, beyond test_optim / test_optimizers_more /
test_lr_scheduler: porting state dicts both ways, option combinations, per-group options, zero_grad modes, zero
gradients, validation, scheduler resume / state / dtypes, schedules on the fused Trainer, clip_grad_norm_.

60 of these 222 tests fail on 4139106, before the fixes (each under a "Regression (fixed)" comment saying what was
wrong): the 18 of the hunt's 185 it wrote as BUG, the 7 torch-to-ours port tests (their filterwarnings mark for the
first fix's DeprecationWarning is gone), 34 of the 36 tests added with the fixes, and
the Module.zero_grad one. With this file copied into a
worktree of 4139106 (git worktree add /tmp/old 4139106), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_optim_hunt.py`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import weakref

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import optim
from tensorarena.nn import Parameter
from tensorarena.optim import lr_scheduler as ls

TLS = torch.optim.lr_scheduler
TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}
TOL = {np.float64: 1e-10, np.float32: 1e-5}
SHAPES = [(3,), (2, 4), ()]


@contextlib.contextmanager
def _torch_default(dtype):
    """torch keeps step counts (and NAdam's mu_product) in the default dtype: float64 for float64 comparisons."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(TORCH_DTYPE[dtype])
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _pair(dtype=np.float64, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    ours = [Parameter(a, dtype=dtype) for a in arrays]
    theirs = [torch.tensor(a, dtype=TORCH_DTYPE[dtype], requires_grad=True) for a in arrays]
    return ours, theirs


def _grads(n, dtype=np.float64, seed=1, shapes=SHAPES, scale=1.0, none_every=5, zero_rows=False):
    """n steps of gradients; now and then None (no gradient), optionally with all-zero rows (sparse-like)."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(n):
        row = []
        for i, s in enumerate(shapes):
            if none_every and (step + i) % none_every == 2:
                row.append(None)
                continue
            g = np.asarray(scale * rng.standard_normal(s), dtype=dtype)
            if zero_rows and g.ndim == 2:
                g[step % g.shape[0]] = 0.0  # an embedding row that was not looked up
            if zero_rows and g.ndim == 1 and step % 3 == 0:
                g[...] = 0.0
            row.append(g)
        out.append(row)
    return out


def _apply(opt, params, grads, torch_side):
    for row in grads:
        for p, g in zip(params, row):
            if torch_side:
                p.grad = None if g is None else torch.from_numpy(g.copy())
            else:
                p.grad = None if g is None else g.copy()
        opt.step()


def _max_diff(ours, theirs):
    return max(float(np.max(np.abs(p.data - t.detach().numpy()), initial=0.0)) for p, t in zip(ours, theirs))


def _groups(params, *overrides):
    """Split params into len(overrides) consecutive groups, each with its own options."""
    n = len(overrides)
    cut = [round(i * len(params) / n) for i in range(n + 1)]
    return [{"params": params[cut[i]:cut[i + 1]], **overrides[i]} for i in range(n)]


# -- porting optimizer state: torch -> ours and ours -> torch -----------------------------------------------------

PORT_CASES = {
    "SGD-momentum": (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.2)),
    "SGD-nesterov": (optim.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "Adam-amsgrad": (optim.Adam, torch.optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    "AdamW": (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.05, maximize=True)),
    "NAdam": (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, momentum_decay=0.01)),
    "RMSprop": (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    "Adagrad": (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
}


def _two_group(params, kw):
    return _groups(params, {"lr": kw["lr"]}, {"lr": kw["lr"] / 3})


@pytest.mark.parametrize("name", list(PORT_CASES))
def test_torch_optimizer_state_dict_loads_into_ours_and_training_continues_like_torch(name):
    ours_cls, torch_cls, kw = PORT_CASES[name]
    grads = _grads(14)
    with _torch_default(np.float64):
        _, tparams = _pair()
        topt = torch_cls(_two_group(tparams, kw), foreach=False, **kw)
        _apply(topt, tparams, grads[:7], True)
        saved = copy.deepcopy(topt.state_dict())  # what torch.load of a torch checkpoint gives: tensors
        params = [Parameter(t.detach().numpy().copy(), dtype=np.float64) for t in tparams]
        opt = ours_cls(_two_group(params, dict(kw, lr=123.0)), **dict(kw, lr=123.0))  # lr must come from the dict
        opt.load_state_dict(saved)
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
        for t, p in zip(tparams, params):  # every state entry is now a heap NumPy array, never a torch tensor
            assert all(isinstance(v, np.ndarray) for v in opt.state[p].values())
        _apply(opt, params, grads[7:], False)
        _apply(topt, tparams, grads[7:], True)
    assert _max_diff(params, tparams) <= 1e-10


# Regression (fixed): loading a torch optimizer's state_dict (torch tensors, as torch.load gives them) into a
# fresh optimizer emitted NumPy 2's DeprecationWarning "__array__ implementation doesn't accept a copy keyword, so
# passing copy=False failed" -- an error under this project's filterwarnings = ["error"], and a failure in a NumPy
# to come. Cause: optimizer.py _copy_param_state, `np.array(value, dtype=p.dtype, copy=True)` handed copy= to
# torch.Tensor.__array__, which does not take it. Fixed: np.asarray(value) first, then the copy.
def test_loading_a_torch_optimizer_state_dict_emits_no_warning():
    _, tparams = _pair()
    topt = torch.optim.Adam(tparams, lr=0.01, foreach=False)
    _apply(topt, tparams, _grads(2, none_every=0), True)
    params = [Parameter(t.detach().numpy().copy(), dtype=np.float64) for t in tparams]
    opt = optim.Adam(params, lr=0.01)
    opt.load_state_dict(topt.state_dict())  # warnings are errors here (pyproject.toml)
    for p, t in zip(params, tparams):
        np.testing.assert_array_equal(opt.state[p]["exp_avg"], topt.state[t]["exp_avg"].numpy())


@pytest.mark.parametrize("name", list(PORT_CASES))
def test_our_state_dict_as_tensors_loads_into_torch_and_training_continues_like_ours(name):
    ours_cls, torch_cls, kw = PORT_CASES[name]
    grads = _grads(14, seed=4)
    params, _ = _pair()
    opt = ours_cls(_two_group(params, kw), **kw)
    _apply(opt, params, grads[:7], False)
    sd = opt.state_dict()
    as_tensors = {"state": {i: {k: torch.from_numpy(np.array(v)) for k, v in e.items()}
                            for i, e in sd["state"].items()},
                  "param_groups": json.loads(json.dumps(sd["param_groups"]))}  # plain JSON hyperparameters
    with _torch_default(np.float64):
        tparams = [torch.tensor(p.data.copy(), requires_grad=True) for p in params]
        topt = torch_cls(_two_group(tparams, dict(kw, lr=5.0)), foreach=False, **dict(kw, lr=5.0))
        topt.load_state_dict(as_tensors)
        _apply(topt, tparams, grads[7:], True)
    _apply(opt, params, grads[7:], False)
    assert _max_diff(params, tparams) <= 1e-10


# -- options and combinations not covered elsewhere ---------------------------------------------------------------

OPTION_CASES = [
    (optim.Adam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    (optim.Adam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, amsgrad=True,
                                        maximize=True)),
    (optim.Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.0, 0.0))),
    (optim.Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.0, 0.5), eps=0.1)),
    (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.0)),
    (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=1.5, betas=(0.5, 0.5))),
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, momentum_decay=0.0)),
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, betas=(0.0, 0.9))),
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, eps=0.5, weight_decay=0.2, decoupled_weight_decay=True,
                                          maximize=True)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01, eps=1e-3, alpha=0.0)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01, alpha=1.0, eps=0.1)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01, momentum=0.9, weight_decay=0.1, maximize=True)),
    (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.1, eps=1e-3, initial_accumulator_value=2.0)),
    (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.1, lr_decay=1.0)),
    (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=-0.5)),  # torch accepts any dampening
    (optim.SGD, torch.optim.SGD, dict(lr=0.1, dampening=0.5)),  # dampening without momentum: no effect
]


def _option_id(case):
    cls, _, kw = case
    return cls.__name__ + "-" + "-".join(f"{k}={v}" for k, v in kw.items())


def _run_both(ours_cls, torch_cls, make_groups, kw, dtype, grads, fused=None):
    ours, theirs = _pair(dtype)
    extra = {} if fused is None else {"fused": fused}
    opt = ours_cls(make_groups(ours), **kw, **extra)
    with _torch_default(dtype):
        topt = torch_cls(make_groups(theirs), foreach=False, **kw)
        for step, row in enumerate(grads):
            _apply(opt, ours, [row], False)
            _apply(topt, theirs, [row], True)
            diff = _max_diff(ours, theirs)
            assert diff <= TOL[dtype], f"step {step}: max |ours - torch| = {diff:.3g}"
    return opt, topt


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", OPTION_CASES, ids=[_option_id(c) for c in OPTION_CASES])
def test_option_combinations_match_torch(case, dtype, fused):
    ours_cls, torch_cls, kw = case
    scale = 1.0 if dtype == np.float64 else 0.1
    _run_both(ours_cls, torch_cls, list, kw, dtype, _grads(30, dtype, scale=scale), fused=fused)


PER_GROUP = {
    "Adam": (optim.Adam, torch.optim.Adam, dict(lr=0.01),
             ({"amsgrad": True, "weight_decay": 0.1}, {"maximize": True, "betas": (0.5, 0.9)},
              {"decoupled_weight_decay": True, "weight_decay": 0.2, "lr": 0.003})),
    "NAdam": (optim.NAdam, torch.optim.NAdam, dict(lr=0.01),
              ({"decoupled_weight_decay": True, "weight_decay": 0.1}, {"momentum_decay": 0.05},
               {"maximize": True, "lr": 0.02})),
    "RMSprop": (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01),
                ({"centered": True}, {"momentum": 0.9, "alpha": 0.5}, {"weight_decay": 0.1, "eps": 1e-3})),
    # (not initial_accumulator_value per group: torch's Adagrad fills its state from the constructor's value and
    # ignores a group's own; ours honours the group's, see the next test)
    "Adagrad": (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.1),
                ({"lr_decay": 0.1}, {"weight_decay": 0.05}, {"maximize": True, "eps": 1e-3})),
    "SGD": (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9),
            ({"nesterov": True}, {"momentum": 0.0}, {"dampening": 0.5, "maximize": True})),
}


@pytest.mark.parametrize("name", list(PER_GROUP))
def test_per_group_options_match_torch(name):
    ours_cls, torch_cls, kw, overrides = PER_GROUP[name]
    opt, topt = _run_both(ours_cls, torch_cls, lambda ps: _groups(ps, *overrides), kw, np.float64, _grads(25))
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert set(tsd["state"]) <= set(sd["state"])  # ours also keeps a step count where torch's SGD keeps nothing
    for index, entry in tsd["state"].items():
        assert set(entry) <= set(sd["state"][index]), f"param {index}: torch keeps {sorted(entry)}"
        for key, value in entry.items():
            np.testing.assert_allclose(sd["state"][index][key], value.numpy(), rtol=1e-10, atol=1e-12, err_msg=key)


def test_adagrad_honours_a_groups_own_initial_accumulator_value():
    # torch.optim.Adagrad fills "sum" from the constructor's initial_accumulator_value even for a group that sets
    # its own; the group's value is what a user asks for, so the reference is a torch Adagrad built with it.
    ours, theirs = _pair()
    opt = optim.Adagrad([{"params": ours[:1]}, {"params": ours[1:], "initial_accumulator_value": 0.5}], lr=0.1)
    with _torch_default(np.float64):
        topts = [torch.optim.Adagrad(theirs[:1], lr=0.1, foreach=False),
                 torch.optim.Adagrad(theirs[1:], lr=0.1, initial_accumulator_value=0.5, foreach=False)]
        for row in _grads(10):
            _apply(opt, ours, [row], False)
            for t, g in zip(theirs, row):
                t.grad = None if g is None else torch.from_numpy(g.copy())
            for topt in topts:
                topt.step()
    assert _max_diff(ours, theirs) <= 1e-10


@pytest.mark.parametrize("name", ["Adam-amsgrad", "RMSprop", "Adagrad", "NAdam", "SGD-momentum"])
def test_sparse_like_zero_gradients_and_float32_match_torch(name):
    ours_cls, torch_cls, kw = PORT_CASES[name]
    grads = _grads(30, np.float32, scale=0.1, zero_rows=True, none_every=0)
    _run_both(ours_cls, torch_cls, list, kw, np.float32, grads)


@pytest.mark.parametrize("name", ["Adam-amsgrad", "SGD-momentum", "RMSprop"])
def test_zero_grad_both_modes_match_torch(name):
    # set_to_none=True: the next step skips every parameter (state and step count stay); set_to_none=False:
    # zero gradients, so momentum-like state still moves the parameters. torch does both.
    ours_cls, torch_cls, kw = PORT_CASES[name]
    ours, theirs = _pair()
    opt = ours_cls(ours, **kw)
    with _torch_default(np.float64):
        topt = torch_cls(theirs, foreach=False, **kw)
        grads = _grads(12, none_every=0)
        for step, row in enumerate(grads):
            _apply(opt, ours, [row], False)
            _apply(topt, theirs, [row], True)
            set_to_none = step % 2 == 0
            opt.zero_grad(set_to_none=set_to_none)
            topt.zero_grad(set_to_none=set_to_none)
            for p, t in zip(ours, theirs):
                assert (p.grad is None) == (t.grad is None)
                if p.grad is not None:
                    np.testing.assert_array_equal(p.grad, t.grad.numpy())
            opt.step()
            topt.step()
            assert _max_diff(ours, theirs) <= 1e-10, f"step {step}"
    for p, t in zip(ours, theirs):
        if "step" in topt.state[t]:
            assert float(opt.state[p]["step"]) == float(topt.state[t]["step"])


def test_an_empty_param_group_is_accepted_like_torch():
    ours, theirs = _pair()
    opt = optim.Adam([{"params": ours}, {"params": [], "lr": 0.5}], lr=0.01)
    with _torch_default(np.float64):
        topt = torch.optim.Adam([{"params": theirs}, {"params": [], "lr": 0.5}], lr=0.01, foreach=False)
        sched, tsched = ls.StepLR(opt, step_size=2), TLS.StepLR(topt, step_size=2)
        for row in _grads(6):
            _apply(opt, ours, [row], False)
            _apply(topt, theirs, [row], True)
            sched.step()
            tsched.step()
    assert _max_diff(ours, theirs) <= 1e-10
    assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), abs=1e-15)
    assert [g["params"] for g in opt.state_dict()["param_groups"]] == [g["params"] for g in
                                                                         topt.state_dict()["param_groups"]]


def test_a_parameter_given_twice_is_refused_clearly():
    # torch warns ("in future, this will cause an error") and then updates the parameter twice per step;
    # refusing up front is the safer reading, as long as the message says what is wrong.
    ours, _ = _pair()
    with pytest.raises(ValueError, match="duplicate parameters"):
        optim.SGD([ours[0], ours[1], ours[0]], lr=0.1)
    opt = optim.SGD(ours[:2], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [ours[2], ours[0]]})
    assert len(opt.param_groups) == 1


BAD_VALUES = [  # (torch's SGD lets a NaN lr/momentum/weight_decay through (`lr < 0.0`); ours refuses it: better)
    (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)),
    (optim.Adam, torch.optim.Adam, dict(betas=(float("nan"), 0.9))),
    (optim.Adam, torch.optim.Adam, dict(betas=(0.9, 1.0 + 1e-12))),
    (optim.Adam, torch.optim.Adam, dict(eps=float("nan"))),
    (optim.AdamW, torch.optim.AdamW, dict(lr=-1e-9)),
    (optim.NAdam, torch.optim.NAdam, dict(weight_decay=float("nan"))),
    (optim.NAdam, torch.optim.NAdam, dict(momentum_decay=float("nan"))),
    (optim.RMSprop, torch.optim.RMSprop, dict(eps=-1e-12)),
    (optim.RMSprop, torch.optim.RMSprop, dict(alpha=float("nan"))),
    (optim.Adagrad, torch.optim.Adagrad, dict(lr=-0.1)),
    (optim.Adagrad, torch.optim.Adagrad, dict(weight_decay=-1.0)),
]


@pytest.mark.parametrize("case", BAD_VALUES, ids=[_option_id(c) for c in BAD_VALUES])
def test_bad_hyperparameters_raise_value_error_as_torch(case):
    ours_cls, torch_cls, kw = case
    with pytest.raises(ValueError):
        torch_cls([torch.zeros(2, requires_grad=True)], **kw)
    with pytest.raises(ValueError):
        ours_cls([Parameter(np.zeros(2))], **kw)
    # the same value set later by hand is caught when a state dict carrying it is loaded
    opt = ours_cls([Parameter(np.zeros(2))])
    sd = opt.state_dict()
    sd["param_groups"][0].update(kw)
    with pytest.raises(ValueError):
        opt.load_state_dict(sd)


# Regression (fixed): a parameter's .grad may be set to an array of another float dtype (tensor.py accepts it; torch
# refuses it at assignment). SGD and Adam then updated with it on both kernels, and so did the *reference* kernels of
# NAdam, RMSprop, Adagrad, Lion and LAMB, but their default *fused* kernels raised "nadam: array float32[5] does not
# match param float64[5]" (kernels/optim_arrays.py flat_views): the two twins of one optimizer disagreed, and which
# optimizers trained depended on the kernel. Adagrad's reference squared the float32 gradient in float32 (2e-9 off).
# Fixed in one place, Optimizer._grad_of: the gradient is cast to the parameter's dtype (into a persistent buffer)
# for every optimizer and kernel (chosen over refusing: SGD and Adam already trained so, and
# tests/test_mixed_dtype_grads.py is unaffected either way, since autograd always casts into .grad itself).
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("make", [
    lambda ps, f: optim.SGD(ps, lr=0.1, momentum=0.9, fused=f),
    lambda ps, f: optim.Adam(ps, lr=0.1, fused=f),
    lambda ps, f: optim.NAdam(ps, lr=0.1, fused=f),
    lambda ps, f: optim.RMSprop(ps, lr=0.1, fused=f),
    lambda ps, f: optim.Adagrad(ps, lr=0.1, fused=f),
    lambda ps, f: optim.Lion(ps, lr=0.1, fused=f),
    lambda ps, f: optim.LAMB(ps, lr=0.1, fused=f),
], ids=["SGD", "Adam", "NAdam", "RMSprop", "Adagrad", "Lion", "LAMB"])
def test_a_gradient_of_another_dtype_is_handled_alike_by_both_kernels(make, fused):
    grad = np.linspace(0.1, 0.5, 5, dtype=np.float32)
    expected = Parameter(np.linspace(1, 2, 5), dtype=np.float64)
    ref = make([expected], fused)
    expected.grad = grad.astype(np.float64)
    ref.step()
    p = Parameter(np.linspace(1, 2, 5), dtype=np.float64)
    opt = make([p], fused)
    p.grad = grad
    opt.step()
    np.testing.assert_allclose(p.data, expected.data, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("make", [
    lambda ps, f: optim.NAdam(ps, lr=0.1, fused=f),
    lambda ps, f: optim.Adagrad(ps, lr=0.1, fused=f),
    lambda ps, f: optim.LAMB(ps, lr=0.1, fused=f),
], ids=["NAdam", "Adagrad", "LAMB"])
def test_a_non_contiguous_or_uncastable_gradient_is_handled_alike_by_both_kernels(make, fused):
    grad = np.arange(12.0).reshape(3, 4) / 10
    expected = Parameter(np.ones((4, 3)))
    ref = make([expected], fused)
    expected.grad = np.ascontiguousarray(grad.T)
    ref.step()
    p = Parameter(np.ones((4, 3)))
    opt = make([p], fused)
    p.grad = grad.T  # a transposed view, as a hand-written gradient may be
    opt.step()
    np.testing.assert_array_equal(p.data, expected.data)
    # Assigning it is refused since the autograd hunt (test_autograd_edges_hunt.py); the optimizer's own check, for
    # a gradient that reaches it otherwise, is exercised through the private slot.
    with pytest.raises(TypeError, match="assigned grad has dtype complex128"):
        p.grad = np.ones((4, 3), dtype=np.complex128)
    p._grad = np.ones((4, 3), dtype=np.complex128)
    before = p.data.copy()
    with pytest.raises(TypeError, match=r"gradient of a float64 parameter of shape \(4, 3\) is complex128"):
        opt.step()
    np.testing.assert_array_equal(p.data, before)


# Regression (fixed): under np.seterr(all="raise") (DESIGN.md's house rule for tests; also what a user hunting NaNs
# turns on) the reference optimizer kernels raised FloatingPointError "underflow encountered in multiply" on
# legitimate values: a float32 gradient of 1e-25 (g*g underflows to 0 in Adam/NAdam/RMSprop/Adagrad/LAMB), or a
# momentum buffer decaying under zero gradients into subnormals (SGD after ~90 steps from 1e-30, Adam/NAdam after
# ~700 steps from 1e-3). torch (and our fused twins) give the zero/subnormal result silently. Cause: the reference
# kernels (kernels/optim_arrays.py second_moment_ and lerp_, sgd.py `buf *= momentum`, ...) ran NumPy ufuncs without
# np.errstate(under="ignore"), which softmax, gelu, layer_norm and clip.py already use. Fixed: every reference
# update runs under np.errstate(under="ignore") (optim_arrays.underflow_is_zero).
@pytest.mark.parametrize("name, ours_cls, torch_cls, kw", [
    ("Adam", optim.Adam, torch.optim.Adam, dict(lr=0.1)),
    ("NAdam", optim.NAdam, torch.optim.NAdam, dict(lr=0.1)),
    ("RMSprop", optim.RMSprop, torch.optim.RMSprop, dict(lr=0.1)),
    ("Adagrad", optim.Adagrad, torch.optim.Adagrad, dict(lr=0.1)),
    ("LAMB", optim.LAMB, None, dict(lr=0.1)),
], ids=["Adam", "NAdam", "RMSprop", "Adagrad", "LAMB"])
def test_reference_kernels_do_not_raise_on_underflow_of_tiny_float32_gradients(name, ours_cls, torch_cls, kw):
    assert np.geterr()["under"] == "raise"  # tests/conftest.py
    start = np.array([1.0, -2.0, 0.5])
    grad = np.full(3, 1e-25, dtype=np.float32)
    p = Parameter(start, dtype=np.float32)
    opt = ours_cls([p], fused=False, **kw)
    if torch_cls is None:  # no torch LAMB: the fused twin is the reference here
        t = Parameter(start, dtype=np.float32)
        topt = ours_cls([t], fused=True, **kw)
        t.grad = grad.copy()
        topt.step()
        want = t.data
    else:
        t = torch.tensor(start, dtype=torch.float32, requires_grad=True)
        topt = torch_cls([t], foreach=False, **kw)
        t.grad = torch.from_numpy(grad.copy())
        topt.step()
        want = t.detach().numpy()
    p.grad = grad.copy()
    opt.step()
    np.testing.assert_allclose(p.data, want, rtol=0, atol=1e-5)


# Regression (fixed): (same cause as above) SGD's reference kernel raised FloatingPointError once a momentum buffer
# fed zero gradients decayed below float32's smallest normal number (here after ~150 steps) (kernels/sgd.py:
# `buf *= dt(momentum)`); torch keeps going with subnormals and then zeros.
def test_reference_sgd_momentum_decaying_under_zero_gradients_keeps_going():
    p = Parameter(np.array([1.0, 2.0]), dtype=np.float32)
    t = torch.tensor([1.0, 2.0], dtype=torch.float32, requires_grad=True)
    opt = optim.SGD([p], lr=0.1, momentum=0.9, fused=False)
    topt = torch.optim.SGD([t], lr=0.1, momentum=0.9, foreach=False)
    for step in range(250):
        g = np.full(2, 1e-30 if step == 0 else 0.0, dtype=np.float32)  # one tiny gradient, then an unused row
        p.grad, t.grad = g.copy(), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(opt.state[p]["momentum_buffer"], topt.state[t]["momentum_buffer"].numpy(),
                               rtol=0, atol=1e-44)


# Every reference kernel, Lion's too, decays its state into subnormals under zero gradients as the fused twin does
# (no torch Lion/LAMB: the fused twin is the reference there), with underflow raising everywhere else.
@pytest.mark.parametrize("make", [
    lambda ps, f: optim.SGD(ps, lr=0.1, momentum=0.5, fused=f),
    lambda ps, f: optim.Adam(ps, lr=0.1, betas=(0.5, 0.5), fused=f),
    lambda ps, f: optim.NAdam(ps, lr=0.1, betas=(0.5, 0.5), fused=f),
    lambda ps, f: optim.RMSprop(ps, lr=0.1, alpha=0.5, centered=True, momentum=0.5, fused=f),
    lambda ps, f: optim.Adagrad(ps, lr=0.1, fused=f),
    lambda ps, f: optim.Lion(ps, lr=0.1, betas=(0.5, 0.5), fused=f),
    lambda ps, f: optim.LAMB(ps, lr=0.1, betas=(0.5, 0.5), fused=f),
], ids=["SGD", "Adam", "NAdam", "RMSprop", "Adagrad", "Lion", "LAMB"])
def test_reference_state_decaying_into_subnormals_matches_the_fused_twin(make):
    assert np.geterr()["under"] == "raise"
    ps = {f: Parameter(np.array([1.0, -2.0, 0.5]), dtype=np.float32) for f in (True, False)}
    opts = {f: make([p], f) for f, p in ps.items()}
    for step in range(200):  # 0.5 ** 200 takes 1e-20 through float32's subnormals to 0
        for f, p in ps.items():
            p.grad = np.full(3, 1e-20 if step == 0 else 0.0, dtype=np.float32)
            opts[f].step()
    np.testing.assert_allclose(ps[False].data, ps[True].data, rtol=1e-6)
    with np.errstate(under="ignore"):  # assert_allclose's own rtol * |subnormal|
        for key, value in opts[True].state[ps[True]].items():
            np.testing.assert_allclose(opts[False].state[ps[False]][key], value, rtol=1e-6, atol=1e-44, err_msg=key)


# Regression (fixed): after optimizer.zero_grad() (set_to_none=True) a gradient array the user still held was
# overwritten by the next backward: zero_grad set p.grad = None but Tensor kept the same array as _grad_buffer and
# the next backward wrote into it. In torch the held gradient keeps its values (a new one is allocated), which is
# what gradient surgery / accumulation by hand / logging grads of the previous step rely on. Fixed:
# zero_grad(set_to_none=True) (and Tensor.zero_grad) drop the buffer when anything else still references it
# (Tensor._release_grad, by reference count); nobody else holding it, the next backward still reuses it (below).
def test_a_held_gradient_survives_zero_grad_and_the_next_backward():
    p = Parameter(np.array([1.0, 2.0, 3.0]))
    opt = optim.SGD([p], lr=0.1)
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    topt = torch.optim.SGD([t], lr=0.1)
    (p * ta.Tensor(np.array([1.0, 1.0, 1.0]))).sum().backward()
    (t * 1.0).sum().backward()
    held, theld = p.grad, t.grad
    opt.zero_grad()
    topt.zero_grad()
    (p * 3.0).sum().backward()
    (t * 3.0).sum().backward()
    np.testing.assert_array_equal(p.grad, t.grad.numpy())
    np.testing.assert_array_equal(held, theld.numpy())  # [1, 1, 1]; ours became [3, 3, 3]



def test_a_held_gradient_survives_module_zero_grad_as_in_torch():
    # Module.zero_grad set p.grad = None and kept the array as the next backward's buffer (fixed with
    # Optimizer.zero_grad's Tensor._release_grad): the held array became the new gradient.
    from tensorarena.nn import Linear

    layer = Linear(3, 2, rng=np.random.default_rng(0))
    x = ta.Tensor(np.ones((4, 3), np.float32))
    layer(x).sum().backward()
    held = layer.weight.grad
    first = held.copy()
    layer.zero_grad()
    (layer(x) * 3.0).sum().backward()
    np.testing.assert_array_equal(held, first)
    np.testing.assert_allclose(layer.weight.grad, 3 * first, rtol=1e-6)


def test_zero_grad_still_reuses_a_gradient_buffer_nobody_else_holds():
    # The eager route's zero_grad + backward refills the same heap buffer every step (no parameter-sized
    # allocation); a weakref watches the array without holding it.
    p = Parameter(np.arange(6.0).reshape(2, 3))
    opt = optim.Adam([p], lr=0.1)
    (p * p).sum().backward()
    buffer = weakref.ref(p.grad)
    for _ in range(3):
        opt.step()
        opt.zero_grad()
        assert p.grad is None
        (p * p).sum().backward()
        assert p.grad is buffer()


@pytest.mark.parametrize("hold", [
    lambda g: g[0],  # a view: its base is the gradient
    lambda g: [g],
    lambda g: torch.from_numpy(g),
], ids=["view", "list", "torch.from_numpy"])
@pytest.mark.parametrize("zero", [lambda opt, p: opt.zero_grad(), lambda opt, p: p.zero_grad()],
                         ids=["Optimizer.zero_grad", "Tensor.zero_grad"])
def test_a_gradient_held_in_any_form_keeps_its_values(hold, zero):
    p = Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
    opt = optim.SGD([p], lr=0.1)
    (p * 2.0).sum().backward()
    held = hold(p.grad)
    zero(opt, p)
    (p * 5.0).sum().backward()
    np.testing.assert_array_equal(p.grad, np.full((2, 2), 5.0))
    values = held[0] if isinstance(held, list) else held
    np.testing.assert_array_equal(np.asarray(values), np.full(np.shape(values), 2.0))


def test_zero_grad_without_set_to_none_zeroes_a_held_gradient_in_place_as_torch():
    p = Parameter(np.array([1.0, 2.0]))
    t = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    opt, topt = optim.SGD([p], lr=0.1), torch.optim.SGD([t], lr=0.1)
    (p * 2.0).sum().backward()
    (t * 2.0).sum().backward()
    held, theld = p.grad, t.grad
    opt.zero_grad(set_to_none=False)
    topt.zero_grad(set_to_none=False)
    (p * 3.0).sum().backward()
    (t * 3.0).sum().backward()
    assert p.grad is held and t.grad is theld
    np.testing.assert_array_equal(held, theld.numpy())


# Regression (fixed): torch's implementation flags foreach=, capturable=False, differentiable=False were a TypeError
# ("unexpected keyword argument") on every optimizer here, so torch-written construction code did not run. Now
# accepted (foreach any value: it only picks torch's implementation); capturable=True / differentiable=True are
# refused with a message saying they have no meaning here.
ALL_OPTIMIZERS = [optim.SGD, optim.Adam, optim.AdamW, optim.NAdam, optim.RMSprop, optim.Adagrad, optim.Lion,
                  optim.LAMB]


@pytest.mark.parametrize("cls", ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_torchs_implementation_flags_are_accepted_or_clearly_refused(cls):
    for foreach in (None, False, True):
        p = Parameter(np.ones(3))
        opt = cls([p], lr=0.1, foreach=foreach, capturable=False, differentiable=False)
        p.grad = np.full(3, 0.5)
        opt.step()
        assert not np.array_equal(p.data, np.ones(3))
        assert not {"foreach", "capturable", "differentiable"} & set(opt.param_groups[0])
    for flag in ("capturable", "differentiable"):
        with pytest.raises(ValueError, match=re.escape(f"{cls.__name__}({flag}=True) has no meaning here")):
            cls([Parameter(np.ones(3))], lr=0.1, **{flag: True})


# Regression (fixed): torch (2.6+) takes model.named_parameters() as params, (name, parameter) pairs, and keeps the
# names in each group's "param_names"; here it was "TypeError: optimizer can only optimize Tensors, but param 0 of
# the group is tuple".
def test_named_parameters_are_accepted_like_torch():
    from mlp_cases import small_mlp

    model = small_mlp(dtype=np.float64)
    tmodel = [torch.tensor(p.data.copy(), requires_grad=True) for p in model.parameters()]
    tnamed = [(name, t) for (name, _), t in zip(model.named_parameters(), tmodel)]
    opt = optim.Adam(model.named_parameters(), lr=0.01)
    with _torch_default(np.float64):
        topt = torch.optim.Adam(tnamed, lr=0.01, foreach=False)
        shapes = [p.shape for p in model.parameters()]
        for row in _grads(5, shapes=shapes, none_every=0):
            _apply(opt, list(model.parameters()), [row], False)
            _apply(topt, tmodel, [row], True)
    assert _max_diff(list(model.parameters()), tmodel) <= 1e-10
    names = [name for name, _ in model.named_parameters()]
    assert opt.param_groups[0]["param_names"] == names == topt.param_groups[0]["param_names"]
    assert opt.state_dict()["param_groups"][0]["param_names"] == topt.state_dict()["param_groups"][0]["param_names"]
    opt.load_state_dict(topt.state_dict())  # names and all
    with pytest.raises(ValueError, match="with/without names"):
        opt.add_param_group({"params": [Parameter(np.ones(2))]})
    with pytest.raises(ValueError, match="some param names are missing"):
        optim.SGD([("a", Parameter(np.ones(2))), Parameter(np.ones(2))], lr=0.1)


def test_named_parameters_train_on_the_fused_route_as_on_eager():
    from mlp_cases import labelled_rows, small_mlp
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    batches = labelled_rows(dtype=np.float64)
    models = {}
    for route in ("eager", "fused"):
        model = small_mlp(dtype=np.float64)
        trainer = Trainer(model, optim.AdamW(model.named_parameters(), lr=0.01, foreach=False), cross_entropy,
                          route=route)
        for i in range(6):
            assert trainer.step(*batches[i % len(batches)]).route == route
        models[route] = model
    for p, q in zip(models["eager"].parameters(), models["fused"].parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10)

# -- LR schedules -----------------------------------------------------------------------------------------------

LRS = (0.1, 0.02, 0.5)


def _opts(lrs=LRS):
    ours = optim.SGD([{"params": [Parameter(np.zeros(2))], "lr": lr} for lr in lrs])
    theirs = torch.optim.SGD([{"params": [torch.zeros(2, requires_grad=True)], "lr": lr} for lr in lrs])
    return ours, theirs


SCHEDULES = {  # each runs unchanged on (our module, optimizer) and (torch's module, optimizer)
    "ConstantLR-torch-defaults": lambda m, o, **k: m.ConstantLR(o, factor=1 / 3, total_iters=5, **k),
    "LinearLR": lambda m, o, **k: m.LinearLR(o, start_factor=0.2, end_factor=0.7, total_iters=12, **k),
    "LinearLR-down": lambda m, o, **k: m.LinearLR(o, start_factor=1.0, end_factor=0.25, total_iters=9, **k),
    "CosineAnnealingLR": lambda m, o, **k: m.CosineAnnealingLR(o, T_max=13, eta_min=0.01, **k),
    "CosineAnnealingLR-eta_min-above-a-base": lambda m, o, **k: m.CosineAnnealingLR(o, T_max=10, eta_min=0.2, **k),
    "StepLR": lambda m, o, **k: m.StepLR(o, step_size=4, gamma=0.7, **k),
    "StepLR-growing": lambda m, o, **k: m.StepLR(o, step_size=3, gamma=1.5, **k),
    "StepLR-gamma0": lambda m, o, **k: m.StepLR(o, step_size=5, gamma=0.0, **k),
    "ExponentialLR": lambda m, o, **k: m.ExponentialLR(o, gamma=0.9, **k),
}
SEQUENTIAL = {
    "SequentialLR-linear-exp-cosine": lambda m, o: m.SequentialLR(o, [
        m.LinearLR(o, start_factor=0.1, total_iters=5), m.ExponentialLR(o, gamma=0.9),
        m.CosineAnnealingLR(o, T_max=15, eta_min=1e-4)], milestones=[5, 15]),
    "SequentialLR-step-then-constant": lambda m, o: m.SequentialLR(o, [
        m.StepLR(o, step_size=3, gamma=0.5), m.ConstantLR(o, factor=0.5, total_iters=6)], milestones=[10]),
}


def _same_lrs(sched, tsched, opt, topt, where, tol=1e-12):
    ours, theirs = sched.get_last_lr(), [float(x) for x in tsched.get_last_lr()]
    assert np.max(np.abs(np.subtract(ours, theirs))) <= tol, f"{where}: {ours} vs {theirs}"
    groups, tgroups = [g["lr"] for g in opt.param_groups], [g["lr"] for g in topt.param_groups]
    assert np.max(np.abs(np.subtract(groups, tgroups))) <= tol, f"{where}: groups {groups} vs {tgroups}"


@pytest.mark.parametrize("name", list(SCHEDULES) + list(SEQUENTIAL))
def test_schedule_over_40_steps_with_three_groups_matches_torch(name):
    build = SCHEDULES.get(name) or SEQUENTIAL[name]
    opt, topt = _opts()
    sched, tsched = build(ls, opt), build(TLS, topt)
    _same_lrs(sched, tsched, opt, topt, "construction")
    for step in range(40):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        _same_lrs(sched, tsched, opt, topt, f"step {step + 1}")


@pytest.mark.parametrize("k", [0, 3, 12])
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_resume_with_last_epoch_continues_an_uninterrupted_torch_run(name, k):
    # The optimizer state (lrs, initial_lr) of a run stopped after k scheduler steps, a new scheduler with
    # last_epoch=k: every lr from then on is the uninterrupted torch run's. (torch's own resume differs by a step for
    # LinearLR/Cosine/Exponential: documented in lr_scheduler.py; the uninterrupted run is the reference.)
    build = SCHEDULES[name]
    opt, topt = _opts()
    sched, tsched = build(ls, opt), build(TLS, topt)
    for _ in range(k):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
    resumed_opt, _ = _opts(lrs=(9.0, 9.0, 9.0))
    resumed_opt.load_state_dict(opt.state_dict())
    resumed = build(ls, resumed_opt, last_epoch=k)
    topt.step()
    tsched.step()
    assert resumed.last_epoch == tsched.last_epoch == k + 1
    _same_lrs(resumed, tsched, resumed_opt, topt, "resumed")
    for step in range(30):
        resumed_opt.step()
        topt.step()
        resumed.step()
        tsched.step()
        _same_lrs(resumed, tsched, resumed_opt, topt, f"step {k + step + 2}")


def test_constant_lr_with_factor_zero_is_exact():
    # torch's recursive ConstantLR divides by the factor at total_iters (ZeroDivisionError for factor=0);
    # the closed form gives 0 until total_iters, then the base lr.
    opt, _ = _opts()
    sched = ls.ConstantLR(opt, factor=0.0, total_iters=4)
    seen = [sched.get_last_lr()]
    for _ in range(6):
        opt.step()
        sched.step()
        seen.append(sched.get_last_lr())
    assert seen == [[0.0, 0.0, 0.0]] * 4 + [list(LRS)] * 3


@pytest.mark.parametrize("name", ["StepLR", "CosineAnnealingLR", "LinearLR", "SequentialLR-linear-exp-cosine"])
def test_our_scheduler_state_dict_loads_into_torch(name):
    build = SCHEDULES.get(name) or SEQUENTIAL[name]
    opt, topt = _opts()
    sched, tsched = build(ls, opt), build(TLS, topt)
    for _ in range(9):
        opt.step()
        sched.step()
    tsched.load_state_dict(json.loads(json.dumps(sched.state_dict())))
    topt.load_state_dict(opt.state_dict() | {"state": {}})
    for step in range(25):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        _same_lrs(sched, tsched, opt, topt, f"step {step + 10}")


# Regression (fixed): a torch scheduler's state_dict could not be loaded into ours: torch's (2.13) has the private
# keys "_is_initial" and "_get_lr_called_within_step", and LRScheduler.load_state_dict (optim/lr_scheduler.py,
# the `unknown` check) raised "scheduler state has keys ['_get_lr_called_within_step', '_is_initial'] that StepLR
# does not have; was it saved from a different scheduler?". A user porting a torch run could not bring the schedule
# along. Fixed: a private ("_") key the scheduler lacks is dropped; an unknown public one is still refused (below).
@pytest.mark.parametrize("name", ["StepLR", "CosineAnnealingLR", "SequentialLR-linear-exp-cosine"])
def test_torch_scheduler_state_dict_loads_into_ours(name):
    build = SCHEDULES.get(name) or SEQUENTIAL[name]
    opt, topt = _opts()
    sched, tsched = build(ls, opt), build(TLS, topt)
    for _ in range(9):
        topt.step()
        tsched.step()
    opt.load_state_dict({"state": {}, "param_groups": copy.deepcopy(topt.state_dict()["param_groups"])})
    sched.load_state_dict(copy.deepcopy(tsched.state_dict()))
    assert sched.last_epoch == tsched.last_epoch
    for step in range(25):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        _same_lrs(sched, tsched, opt, topt, f"step {step + 10}")


# Regression (fixed): the schedulers refused NumPy integers for step counts: CosineAnnealingLR(opt,
# T_max=np.int64(10)) raised "ValueError: T_max must be an integer >= 1, got np.int64(10)"; the same for StepLR
# step_size, LinearLR/ConstantLR total_iters, SequentialLR milestones and warmup_cosine's step counts, and
# ExponentialLR/StepLR gamma=np.float32(0.9) ("must be a finite number"). In a NumPy engine these come straight
# from array arithmetic (np.ceil(n / batch).astype(int) * epochs); torch accepts them all. Cause:
# optim/lr_scheduler.py _check_int used isinstance(value, int) and _check_float isinstance(value, (int, float)).
# Fixed: numbers.Integral / numbers.Real (not bool), stored as plain int / float.
def test_schedulers_accept_numpy_numbers_like_torch():
    cases = [
        lambda m, o: m.CosineAnnealingLR(o, T_max=np.int64(10)),
        lambda m, o: m.StepLR(o, step_size=np.int64(3), gamma=np.float32(0.5)),
        lambda m, o: m.LinearLR(o, start_factor=0.25, total_iters=np.int64(5)),
        lambda m, o: m.ExponentialLR(o, gamma=np.float32(0.9)),
        lambda m, o: m.SequentialLR(o, [m.ExponentialLR(o, gamma=0.9), m.StepLR(o, step_size=2)],
                                    milestones=[np.int64(3)]),
    ]
    for build in cases:
        opt, topt = _opts()
        sched, tsched = build(ls, opt), build(TLS, topt)
        for step in range(12):
            opt.step()
            topt.step()
            sched.step()
            tsched.step()
            _same_lrs(sched, tsched, opt, topt, f"step {step + 1}", tol=1e-7)  # float32 gamma
    opt, _ = _opts()
    sched = ls.warmup_cosine(opt, np.int64(3), np.int64(10))
    assert sched.get_last_lr()[0] == pytest.approx(LRS[0] * 1e-3, rel=1e-12)


def test_numpy_numbers_are_kept_as_plain_python_numbers():
    # so that a scheduler's state_dict stays JSON-serialisable (json.dumps refuses np.int64)
    opt, _ = _opts()
    sched = ls.StepLR(opt, step_size=np.int64(3), gamma=np.float32(0.5), last_epoch=-1)
    assert type(sched.step_size) is int and type(sched.gamma) is float and sched.gamma == 0.5
    json.dumps(sched.state_dict())
    with pytest.raises(ValueError, match="step_size must be an integer"):
        ls.StepLR(opt, step_size=np.True_)
    with pytest.raises(ValueError, match="step_size must be an integer"):
        ls.StepLR(opt, step_size=True)


def test_loading_scheduler_state_refuses_an_unknown_public_key_and_ignores_unknown_private_ones():
    opt, _ = _opts()
    sched = ls.StepLR(opt, step_size=3)
    state = sched.state_dict()
    with pytest.raises(ValueError, match=re.escape("['gamma_typo']")):
        sched.load_state_dict(state | {"gamma_typo": 0.5})
    sched.load_state_dict(state | {"_some_torch_bookkeeping": True, "last_epoch": 4})
    assert sched.last_epoch == 4 and not hasattr(sched, "_some_torch_bookkeeping")


# Regression (fixed): ConstantLR(opt) defaulted to factor=1.0, total_iters=0 (a constant schedule); torch's are
# factor=1/3 for total_iters=5. Code written for torch that relies on the defaults got a different schedule.
# Now torch's defaults (every caller in the repo passes both explicitly).
def test_constant_lr_defaults_are_torchs():
    opt, topt = _opts()
    sched, tsched = ls.ConstantLR(opt), TLS.ConstantLR(topt)
    assert (sched.factor, sched.total_iters) == (tsched.factor, tsched.total_iters)
    for step in range(8):
        _same_lrs(sched, tsched, opt, topt, f"step {step}")
        opt.step()
        topt.step()
        sched.step()
        tsched.step()


# Regression (fixed): StepLR / ExponentialLR with gamma > 1 raised OverflowError ("(34, 'Numerical result out of
# range')") from the closed form's gamma ** n once it passed the float range; torch's recursive lr * gamma becomes
# inf and goes on. Now inf too (and 0 for a base lr of 0, where the closed form would give 0 * inf = nan).
@pytest.mark.parametrize("build", [
    lambda m, o: m.StepLR(o, step_size=2, gamma=10.0),
    lambda m, o: m.ExponentialLR(o, gamma=3.0),
], ids=["StepLR", "ExponentialLR"])
def test_a_growing_gamma_reaches_inf_like_torch(build):
    opt, topt = _opts(lrs=(0.1, 0.0, 5.0))
    sched, tsched = build(ls, opt), build(TLS, topt)
    for step in range(800):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        for ours, theirs in zip(sched.get_last_lr(), tsched.get_last_lr()):
            assert ours == pytest.approx(theirs, rel=1e-12), f"step {step + 1}"
    assert sched.get_last_lr() == [math.inf, 0.0, math.inf]


def test_schedules_drive_the_fused_trainer_with_per_group_lrs_as_eager():
    from mlp_cases import labelled_rows, small_mlp
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    batches = labelled_rows(dtype=np.float64)

    def run(route):
        model = small_mlp(dtype=np.float64)
        params = list(model.parameters())
        opt = optim.Adam([{"params": params[:2], "lr": 0.02}, {"params": params[2:], "lr": 0.005}],
                         amsgrad=True)
        sched = SEQUENTIAL["SequentialLR-linear-exp-cosine"](ls, opt)
        trainer = Trainer(model, opt, cross_entropy, scheduler=sched, route=route)
        lrs = []
        for i in range(35):
            report = trainer.step(*batches[i % len(batches)])
            assert report.route == route
            lrs.append([g["lr"] for g in opt.param_groups] + [report.lr])
        return model, lrs, trainer

    eager, eager_lrs, _ = run("eager")
    fused, fused_lrs, trainer = run("fused")
    assert trainer.fused.traces == 1
    assert fused_lrs == eager_lrs
    # and the lrs are torch's
    topt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in (0.02, 0.005)])
    tsched = SEQUENTIAL["SequentialLR-linear-exp-cosine"](TLS, topt)
    for step in range(35):
        topt.step()
        tsched.step()
        assert fused_lrs[step][:2] == pytest.approx([g["lr"] for g in topt.param_groups], abs=1e-12)
    for p, q in zip(eager.parameters(), fused.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10)


# -- clip_grad_norm_ ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("norm_type", [2, 1, math.inf, "inf", 0.5])
def test_clip_grad_norm_with_missing_grads_and_zero_grads_matches_torch(norm_type, dtype):
    rng = np.random.default_rng(7)
    shapes = [(3,), (2, 2), (4,), ()]
    ours, theirs = _pair(dtype, shapes=shapes)
    for i, (p, t) in enumerate(zip(ours, theirs)):
        if i == 2:
            continue  # no gradient at all: skipped, as torch
        g = np.zeros(p.shape, dtype) if i == 3 else (3 * rng.standard_normal(p.shape)).astype(dtype)
        p.grad, t.grad = g.copy(), torch.from_numpy(g.copy())
    total = optim.clip_grad_norm_(iter(ours), 0.7, norm_type=norm_type)  # a generator, like model.parameters()
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, 0.7, norm_type=norm_type, foreach=False)
    assert isinstance(total, ta.Tensor) and total.shape == () and total.dtype == np.dtype(dtype)  # as torch's
    assert total.item() == pytest.approx(ttotal.item(), rel=TOL[dtype])
    for p, t in zip(ours, theirs):
        assert (p.grad is None) == (t.grad is None)
        if p.grad is not None:
            np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=TOL[dtype], atol=TOL[dtype] * 1e-3)
    for bad in (math.inf, math.nan):
        p = Parameter(np.ones(2), dtype=dtype)
        p.grad = np.array([bad, 1.0], dtype=dtype)
        with pytest.raises(RuntimeError, match=re.escape("non-finite")):
            optim.clip_grad_norm_([p], 1.0, norm_type=norm_type, error_if_nonfinite=True)
        np.testing.assert_array_equal(p.grad, np.array([bad, 1.0], dtype=dtype))  # untouched when it raises
