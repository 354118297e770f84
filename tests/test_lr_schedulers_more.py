"""MultiStepLR, PolynomialLR, MultiplicativeLR, CosineAnnealingWarmRestarts and OneCycleLR against
torch.optim.lr_scheduler: every group's lr (and momentum / betas, which OneCycleLR cycles) after construction and
after every step, equal to torch's bit for bit (`==`: the same float operations), alone, with an lr edited by hand
mid-run, chained with a second scheduler and inside SequentialLR; state_dict round trips, resuming with
last_epoch=k, argument checks, and a Trainer driving a schedule on the eager and fused routes.
"""

from __future__ import annotations

import copy
import math
import re
import warnings

import numpy as np
import pytest
import torch

from tensorarena import optim
from tensorarena.nn import Parameter
from tensorarena.optim import lr_scheduler

from test_lr_chainable import LRS, TLS, _Lib as _ChainableLib, _run as _chainable_run

STEPS = 60


class _Lib(_ChainableLib):
    """test_lr_chainable's pair of libraries, with Adam beside SGD (momentum 0.9): OneCycleLR cycles either."""

    def opt(self, kind="sgd", lrs=LRS):
        groups = [{"params": [self.param()], "lr": lr} for lr in lrs]
        if kind == "sgd":
            return optim.SGD(groups, momentum=0.9) if self.ours else torch.optim.SGD(groups, momentum=0.9)
        return optim.Adam(groups) if self.ours else torch.optim.Adam(groups)


OURS, THEIRS = _Lib(True), _Lib(False)


class Halving:
    """A callable object with state: torch's state_dict keeps its __dict__ (a plain function is saved as None)."""

    def __init__(self, every):
        self.every = every

    def __call__(self, epoch):
        return 0.5 if epoch % self.every == 0 else 1.0


# Each builder takes (library, optimizer) and returns the schedulers to step, in order.
SINGLE = {
    "MultiStepLR": lambda L, o: [L.m.MultiStepLR(o, milestones=[5, 12, 30], gamma=0.5)],
    "MultiStepLR-repeated-unsorted": lambda L, o: [L.m.MultiStepLR(o, milestones=[30, 5, 12, 5, 30, 30])],
    "MultiStepLR-at-0-growing": lambda L, o: [L.m.MultiStepLR(o, milestones=[0, 10, 10, 40], gamma=1.7)],
    "PolynomialLR-defaults": lambda L, o: [L.m.PolynomialLR(o)],
    "PolynomialLR-square": lambda L, o: [L.m.PolynomialLR(o, total_iters=40, power=2.0)],
    "PolynomialLR-sqrt": lambda L, o: [L.m.PolynomialLR(o, total_iters=25, power=0.5)],
    "PolynomialLR-zero-iters": lambda L, o: [L.m.PolynomialLR(o, total_iters=0)],
    "MultiplicativeLR": lambda L, o: [L.m.MultiplicativeLR(o, lambda e: 0.97)],
    "MultiplicativeLR-per-group": lambda L, o: [L.m.MultiplicativeLR(
        o, [lambda e: 1.01 if e < 10 else 0.95, Halving(7)])],
    "CosineAnnealingWarmRestarts": lambda L, o: [L.m.CosineAnnealingWarmRestarts(o, T_0=7)],
    "CosineAnnealingWarmRestarts-mult": lambda L, o: [L.m.CosineAnnealingWarmRestarts(o, 3, T_mult=2, eta_min=1e-3)],
    "CosineAnnealingWarmRestarts-T1": lambda L, o: [L.m.CosineAnnealingWarmRestarts(o, T_0=1, eta_min=1e-4)],
    "OneCycleLR": lambda L, o: [L.m.OneCycleLR(o, max_lr=0.5, total_steps=STEPS)],
    "OneCycleLR-per-group-linear": lambda L, o: [L.m.OneCycleLR(
        o, max_lr=[1.0, 0.2], epochs=6, steps_per_epoch=10, anneal_strategy="linear", pct_start=0.25,
        base_momentum=[0.8, 0.7], max_momentum=(0.95, 0.9))],
    "OneCycleLR-three-phase": lambda L, o: [L.m.OneCycleLR(
        o, max_lr=0.3, total_steps=STEPS, three_phase=True, div_factor=10.0, final_div_factor=100.0)],
    "OneCycleLR-no-momentum": lambda L, o: [L.m.OneCycleLR(o, max_lr=0.3, total_steps=STEPS, cycle_momentum=False,
                                                           pct_start=0.5)],
}
CHAINED = {
    "MultiStep+Exponential": lambda L, o: [L.m.MultiStepLR(o, [10, 25], gamma=0.3), L.m.ExponentialLR(o, 0.98)],
    "Constant+Polynomial": lambda L, o: [L.m.ConstantLR(o, factor=0.5, total_iters=15),
                                         L.m.PolynomialLR(o, total_iters=50, power=1.5)],
    "Multiplicative+Step": lambda L, o: [L.m.MultiplicativeLR(o, lambda e: 0.99), L.m.StepLR(o, 9, gamma=0.5)],
    "WarmRestarts+Exponential": lambda L, o: [L.m.CosineAnnealingWarmRestarts(o, T_0=10),
                                              L.m.ExponentialLR(o, gamma=0.95)],
    "Exponential+WarmRestarts": lambda L, o: [L.m.ExponentialLR(o, gamma=0.95),
                                              L.m.CosineAnnealingWarmRestarts(o, T_0=4, T_mult=3)],
    "OneCycle+MultiStep": lambda L, o: [L.m.OneCycleLR(o, max_lr=0.4, total_steps=STEPS),
                                        L.m.MultiStepLR(o, [20, 40], gamma=0.5)],
}
SEQUENTIAL = {
    "Sequential-Linear-MultiStep": lambda L, o: [L.m.SequentialLR(o, [
        L.m.LinearLR(o, start_factor=0.1, total_iters=10), L.m.MultiStepLR(o, [0, 5, 20], gamma=0.5)],
        milestones=[10])],
    "Sequential-Constant-Polynomial": lambda L, o: [L.m.SequentialLR(o, [
        L.m.ConstantLR(o, factor=0.25, total_iters=8), L.m.PolynomialLR(o, total_iters=30, power=2.0)],
        milestones=[8])],
    "Sequential-Exponential-Multiplicative": lambda L, o: [L.m.SequentialLR(o, [
        L.m.ExponentialLR(o, gamma=0.9), L.m.MultiplicativeLR(o, lambda e: 0.5 if e == 0 else 0.98)],
        milestones=[15])],
    "Sequential-Linear-WarmRestarts": lambda L, o: [L.m.SequentialLR(o, [
        L.m.LinearLR(o, start_factor=0.1, total_iters=5), L.m.CosineAnnealingWarmRestarts(o, T_0=6, T_mult=2)],
        milestones=[5])],
    "Sequential-Linear-OneCycle": lambda L, o: [L.m.SequentialLR(o, [
        L.m.LinearLR(o, start_factor=0.5, total_iters=10), L.m.OneCycleLR(o, max_lr=0.6, total_steps=STEPS - 10)],
        milestones=[10])],
    "Sequential-OneCycle-Exponential": lambda L, o: [L.m.SequentialLR(o, [
        L.m.OneCycleLR(o, max_lr=0.6, total_steps=30), L.m.ExponentialLR(o, gamma=0.9)], milestones=[30])],
}
EVERY = {**SINGLE, **CHAINED, **SEQUENTIAL}


def _groups(opt):
    """What the schedules set in every group: lr, and the momentum or the betas (a tuple, as torch keeps it)."""
    return [(g["lr"], g.get("momentum"), g.get("betas")) for g in opt.param_groups]


def _run(lib, build, *, kind="sgd", steps=STEPS, **kw):
    """test_lr_chainable's run, observing every group's lr and momentum or betas (_groups), on `kind`'s optimizer."""
    return _chainable_run(lib, build, steps=steps, observe=_groups, opt_args=(kind,), **kw)


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"step {step}: ours {a}, torch's {b}"
        for (_, _, betas), _ in zip(a, b):
            assert betas is None or type(betas) is tuple, f"step {step}: betas {betas!r} is not a tuple"


def _set_lr(group, lr=None, times=None, key="lr"):
    def event(lib, opt):
        g = opt.param_groups[group]
        g[key] = lr if lr is not None else g[key] * times
    return event


# -- the same lrs (and momentums) as torch's -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(EVERY))
def test_every_step_matches_torch(name, kind):
    _assert_same(_run(OURS, EVERY[name], kind=kind), _run(THEIRS, EVERY[name], kind=kind))


# Chainable schedules (MultiStepLR, PolynomialLR, MultiplicativeLR) go on from the edited lr, as torch's; the
# others (CosineAnnealingWarmRestarts, OneCycleLR) overwrite it at the next step, as torch's.
@pytest.mark.parametrize("name", sorted(EVERY))
def test_an_lr_edited_by_hand_mid_run_follows_torch(name):
    events = {20: _set_lr(0, lr=0.07), 41: _set_lr(1, times=3.0)}
    _assert_same(_run(OURS, EVERY[name], events=events), _run(THEIRS, EVERY[name], events=events))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_one_cycle_follows_its_group_values_edited_mid_run_as_torchs(kind):
    # torch's OneCycleLR reads max_lr, min_lr and the momentums from the groups at every step
    events = {15: _set_lr(0, times=2.0, key="max_lr"), 30: _set_lr(1, lr=1e-5, key="min_lr"),
              35: _set_lr(0, lr=0.8, key="base_momentum")}
    build = SINGLE["OneCycleLR"]
    _assert_same(_run(OURS, build, kind=kind, events=events), _run(THEIRS, build, kind=kind, events=events))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_one_cycle_writes_torchs_group_values(kind):
    opt, topt = OURS.opt(kind), THEIRS.opt(kind)
    build = SINGLE["OneCycleLR-per-group-linear"]
    build(OURS, opt)
    build(THEIRS, topt)
    keys = ["lr", "initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum",
            "betas" if kind == "adam" else "momentum"]
    for group, tgroup in zip(opt.param_groups, topt.param_groups):
        assert {k: group[k] for k in keys} == {k: tgroup[k] for k in keys}
    if kind == "adam":
        assert opt.param_groups[0]["betas"] == (0.95, 0.999) and opt.param_groups[1]["betas"] == (0.9, 0.999)


@pytest.mark.parametrize("name", ["MultiStepLR", "PolynomialLR-square", "MultiplicativeLR"])
def test_a_param_group_added_mid_run_follows_torch(name):
    # The added group goes on from its lr. torch's MultiplicativeLR has no function for it ("zip() argument 2 is
    # longer than argument 1"); ours applies the one function given for all, as torch does with it appended.
    scheds = []

    def build(lib, opt):
        scheds[:] = SINGLE[name](lib, opt)
        return list(scheds)

    def add(lib, opt):
        opt.add_param_group({"params": [lib.param()], "lr": 0.05})
        if not lib.ours and name == "MultiplicativeLR":
            scheds[0].lr_lambdas.append(scheds[0].lr_lambdas[0])

    _assert_same(_run(OURS, build, events={20: add}), _run(THEIRS, build, events={20: add}))


def test_a_param_group_added_to_a_one_cycle_needs_its_cycle_values():
    # torch fails with a KeyError ('initial_lr') at the next step; here too, naming all the group lacks, before
    # anything changes. A group added with the values follows the cycle, as torch's.
    for lib in (OURS, THEIRS):
        opt = lib.opt("sgd")
        sched = lib.m.OneCycleLR(opt, max_lr=0.5, total_steps=20)
        opt.step()
        sched.step()
        opt.add_param_group({"params": [lib.param()], "lr": 0.05})
        before = _groups(opt)
        with pytest.raises(KeyError, match="initial_lr"):
            sched.step()
        if lib.ours:
            assert _groups(opt) == before and sched.last_epoch == 1
            with pytest.raises(KeyError, match=r"param_groups\[2\] has no initial_lr, max_lr, min_lr, max_momentum"):
                sched.step()
    values = {"lr": 0.02, "initial_lr": 0.02, "max_lr": 0.4, "min_lr": 1e-6, "max_momentum": 0.9,
              "base_momentum": 0.8}

    def add(lib, opt):
        opt.add_param_group({"params": [lib.param()], **values})

    build = SINGLE["OneCycleLR"]
    _assert_same(_run(OURS, build, events={10: add}), _run(THEIRS, build, events={10: add}))


def test_a_group_added_mid_run_to_per_group_multiplicative_lambdas_is_refused():
    opt = OURS.opt()
    sched = lr_scheduler.MultiplicativeLR(opt, [lambda e: 0.9, lambda e: 0.8])
    opt.add_param_group({"params": [OURS.param()], "lr": 0.05})
    with pytest.raises(ValueError, match=r"one lr_lambda per param group \(2\), and 1 group\(s\) were added"):
        sched.step()


# -- OneCycleLR at and past the end of its cycle ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_one_cycle_past_total_steps_raises_as_torch_and_changes_nothing(kind):
    opt, topt = OURS.opt(kind), THEIRS.opt(kind)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=12)
    tsched = TLS.OneCycleLR(topt, max_lr=0.5, total_steps=12)
    for _ in range(12):  # to last_epoch == total_steps: allowed, as in torch
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
    assert _groups(opt) == _groups(topt) and sched.last_epoch == tsched.last_epoch == 12
    before = _groups(opt)
    with pytest.raises(ValueError, match="tried to step 13 times; the specified number of total steps is 12"):
        sched.step()
    with pytest.raises(ValueError, match="Tried to step 13 times"):
        tsched.step()
    # torch has counted the refused step (its last_epoch is 13); this one has not
    assert sched.last_epoch == 12 and _groups(opt) == before and sched.get_last_lr() == [g[0] for g in before]


def test_one_cycle_with_a_fall_of_no_steps_ends_at_min_lr_where_torch_divides_by_zero():
    opt, topt = OURS.opt(), THEIRS.opt()
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=10, pct_start=1.0)
    tsched = TLS.OneCycleLR(topt, max_lr=0.5, total_steps=10, pct_start=1.0)
    for _ in range(9):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert _groups(opt) == _groups(topt)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.5]  # the peak, at the last step of the rise
    with pytest.raises(ZeroDivisionError):
        tsched.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == [g["min_lr"] for g in opt.param_groups]
    assert [g["momentum"] for g in opt.param_groups] == [0.95, 0.95]


# -- state_dict round trips ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(EVERY))
def test_a_state_dict_round_trip_mid_run_follows_torch(name):
    kind = "adam" if "OneCycle" in name else "sgd"
    events = {12: _set_lr(0, times=0.5)}
    ours = _run(OURS, EVERY[name], kind=kind, events=events, save_at=25)
    _assert_same(ours, _run(THEIRS, EVERY[name], kind=kind, events=events, save_at=25))
    _assert_same(ours, _run(OURS, EVERY[name], kind=kind, events=events))  # the round trip changed nothing


def test_multiplicative_state_dict_keeps_callable_objects_not_functions():
    opt = OURS.opt()
    halving = Halving(7)
    sched = lr_scheduler.MultiplicativeLR(opt, [lambda e: 0.9, halving])
    state = sched.state_dict()
    tstate = TLS.MultiplicativeLR(THEIRS.opt(), [lambda e: 0.9, Halving(7)]).state_dict()
    assert state["lr_lambdas"] == tstate["lr_lambdas"] == [None, {"every": 7}]
    state["lr_lambdas"][1] = {"every": 3}
    fresh = Halving(7)
    lr_scheduler.MultiplicativeLR(OURS.opt(), [lambda e: 0.9, fresh]).load_state_dict(state)
    assert fresh.every == 3


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_torchs_state_dict_loads_and_goes_on_as_torch(name):
    # torch's state (MultiStepLR's milestones a Counter, its private bookkeeping keys) loads into ours
    goes_on_as_torch_from_its_state(SINGLE[name], "adam" if "OneCycle" in name else "sgd")


def goes_on_as_torch_from_its_state(make, kind: str) -> None:
    """Schedulers `make` builds, ours and torch's: torch's stepped 17 times, its state (and its optimizer's
    group values) loaded into ours, then both stepped 20 more with the same group values at every step."""
    opt, topt = OURS.opt(kind), THEIRS.opt(kind)
    (sched,), (tsched,) = make(OURS, opt), make(THEIRS, topt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(17):
            topt.step()
            tsched.step()
        opt.load_state_dict(_torch_optimizer_state(topt))
        sched.load_state_dict(copy.deepcopy(tsched.state_dict()))
        for step in range(20):
            topt.step()
            tsched.step()
            sched.step()
            assert _groups(opt) == _groups(topt), f"step {step + 1}"


def _torch_optimizer_state(topt):
    """torch's optimizer state_dict as ours takes it: the group values (lrs, schedule keys), no tensors."""
    state = topt.state_dict()
    groups = [{k: v for k, v in g.items() if k not in ("foreach", "differentiable", "fused", "capturable",
                                                         "decoupled_weight_decay")}
              for g in state["param_groups"]]
    return {"state": {}, "param_groups": groups}


# -- resuming with last_epoch=k --------------------------------------------------------------------------------

# Where torch's resumed run is not where an uninterrupted one is (ours is: the lrs of epoch k + 1 of a run):
# - CosineAnnealingWarmRestarts counts T_cur from k against T_0 alone, wrong past a restart that lengthened the
#   cycle (T_mult > 1);
# - PolynomialLR and MultiplicativeLR keep the group's lr at construction (their initial step changes nothing),
#   so they stay one step's factor behind (as ExponentialLR in test_lr_scheduler.py's module notes).
TORCH_RESUMES_ELSEWHERE = {"CosineAnnealingWarmRestarts-mult", "PolynomialLR-defaults", "PolynomialLR-square",
                           "PolynomialLR-sqrt", "MultiplicativeLR", "MultiplicativeLR-per-group"}


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_resume_with_last_epoch_matches_an_uninterrupted_run(name):
    kind = "adam" if "OneCycle" in name else "sgd"
    k = 23
    libs = (OURS, THEIRS) if name not in TORCH_RESUMES_ELSEWHERE else (OURS,)
    for lib in libs:
        reference = lib.opt(kind)
        (sched,) = SINGLE[name](lib, reference)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(k):
                reference.step()
                sched.step()
            saved = lib.state(reference) if lib.ours else _torch_optimizer_state(reference)
            resumed = lib.opt(kind, lrs=(5.0, 7.0))
            resumed.load_state_dict(saved)  # the groups' initial_lr (and OneCycleLR's values), and lrs
            sched.step()
            (again,) = _rebuild(lib, name, resumed, last_epoch=k)
            assert again.last_epoch == sched.last_epoch == k + 1
            for step in range(STEPS - k - 1):
                assert _groups(resumed) == _groups(reference), f"{'ours' if lib.ours else 'torch'}: step {step}"
                sched.step()
                again.step()
            assert _groups(resumed) == _groups(reference)


def _rebuild(lib, name, opt, last_epoch):
    """SINGLE[name]'s scheduler built with last_epoch (each builder's arguments, given again here)."""
    m = lib.m
    kw = {"last_epoch": last_epoch}
    return {
        "MultiStepLR": lambda: [m.MultiStepLR(opt, milestones=[5, 12, 30], gamma=0.5, **kw)],
        "MultiStepLR-repeated-unsorted": lambda: [m.MultiStepLR(opt, milestones=[30, 5, 12, 5, 30, 30], **kw)],
        "MultiStepLR-at-0-growing": lambda: [m.MultiStepLR(opt, milestones=[0, 10, 10, 40], gamma=1.7, **kw)],
        "PolynomialLR-defaults": lambda: [m.PolynomialLR(opt, **kw)],
        "PolynomialLR-square": lambda: [m.PolynomialLR(opt, total_iters=40, power=2.0, **kw)],
        "PolynomialLR-sqrt": lambda: [m.PolynomialLR(opt, total_iters=25, power=0.5, **kw)],
        "PolynomialLR-zero-iters": lambda: [m.PolynomialLR(opt, total_iters=0, **kw)],
        "MultiplicativeLR": lambda: [m.MultiplicativeLR(opt, lambda e: 0.97, **kw)],
        "MultiplicativeLR-per-group": lambda: [m.MultiplicativeLR(
            opt, [lambda e: 1.01 if e < 10 else 0.95, Halving(7)], **kw)],
        "CosineAnnealingWarmRestarts": lambda: [m.CosineAnnealingWarmRestarts(opt, T_0=7, **kw)],
        "CosineAnnealingWarmRestarts-mult": lambda: [m.CosineAnnealingWarmRestarts(opt, 3, T_mult=2, eta_min=1e-3,
                                                                                   **kw)],
        "CosineAnnealingWarmRestarts-T1": lambda: [m.CosineAnnealingWarmRestarts(opt, T_0=1, eta_min=1e-4, **kw)],
        "OneCycleLR": lambda: [m.OneCycleLR(opt, max_lr=0.5, total_steps=STEPS, **kw)],
        "OneCycleLR-per-group-linear": lambda: [m.OneCycleLR(
            opt, max_lr=[1.0, 0.2], epochs=6, steps_per_epoch=10, anneal_strategy="linear", pct_start=0.25,
            base_momentum=[0.8, 0.7], max_momentum=(0.95, 0.9), **kw)],
        "OneCycleLR-three-phase": lambda: [m.OneCycleLR(
            opt, max_lr=0.3, total_steps=STEPS, three_phase=True, div_factor=10.0, final_div_factor=100.0, **kw)],
        "OneCycleLR-no-momentum": lambda: [m.OneCycleLR(opt, max_lr=0.3, total_steps=STEPS, cycle_momentum=False,
                                                        pct_start=0.5, **kw)],
    }[name]()


def test_warm_restarts_resume_past_a_lengthened_cycle_is_where_the_run_is():
    # T_0=3, T_mult=2: cycles of 3, 6, 12, 24 epochs from epochs 0, 3, 9, 21: epoch 24 is 3 into the fourth
    opt = OURS.opt()
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    sched = lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2, last_epoch=23)
    assert (sched.last_epoch, sched.T_cur, sched.T_i) == (24, 3, 24)
    assert sched.get_last_lr() == [lr * (1 + math.cos(math.pi * 3 / 24)) / 2 for lr in LRS]


def test_resume_without_the_optimizers_state_is_refused_naming_what_is_missing():
    opt = OURS.opt()
    with pytest.raises(KeyError, match="initial_lr"):
        lr_scheduler.PolynomialLR(opt, total_iters=10, last_epoch=4)
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    with pytest.raises(KeyError, match=r"param_groups\[0\] has no max_lr, min_lr, max_momentum, base_momentum"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20, last_epoch=4)
    opt = OURS.opt()
    lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20)
    with pytest.raises(ValueError, match="tried to step 21 times; the specified number of total steps is 20"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20, last_epoch=20)


# -- argument checks -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("build, error, bad", [
    (lambda o: lr_scheduler.MultiStepLR(o, milestones=5), TypeError, "got 5"),
    (lambda o: lr_scheduler.MultiStepLR(o, milestones="5,10"), TypeError, "'5,10'"),
    (lambda o: lr_scheduler.MultiStepLR(o, milestones=[3, -1]), ValueError, "-1"),
    (lambda o: lr_scheduler.MultiStepLR(o, milestones=[2.5]), ValueError, "2.5"),
    (lambda o: lr_scheduler.MultiStepLR(o, milestones=[3], gamma=-0.5), ValueError, "-0.5"),
    (lambda o: lr_scheduler.PolynomialLR(o, total_iters=-1), ValueError, "-1"),
    (lambda o: lr_scheduler.PolynomialLR(o, total_iters=2.5), ValueError, "2.5"),
    (lambda o: lr_scheduler.PolynomialLR(o, power=-1.0), ValueError, "-1.0"),
    (lambda o: lr_scheduler.PolynomialLR(o, power=float("nan")), ValueError, "nan"),
    (lambda o: lr_scheduler.MultiplicativeLR(o, 0.9), TypeError, "got a float"),
    (lambda o: lr_scheduler.MultiplicativeLR(o, [lambda e: 0.9]), ValueError, "expected 2 lr_lambdas"),
    (lambda o: lr_scheduler.MultiplicativeLR(o, [lambda e: 0.9, None]), TypeError, "lr_lambda [1]"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=0), ValueError, "T_0 must be an integer >= 1, got 0"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2.0), ValueError, "2.0"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=0), ValueError, "T_mult"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=1.5), ValueError, "1.5"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=5, eta_min=-1e-3), ValueError, "-0.001"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=5, last_epoch=-2), ValueError, "-2"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1), ValueError, "total_steps, or epochs and steps_per_epoch"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, epochs=3), ValueError, "steps_per_epoch=None"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=0), ValueError, "total_steps must be an integer"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, epochs=0, steps_per_epoch=10), ValueError, "epochs"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, epochs=2, steps_per_epoch=-3), ValueError, "-3"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, pct_start=1.5), ValueError, "1.5"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, anneal_strategy="exp"), ValueError, "'exp'"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=[0.1], total_steps=10), ValueError,
     "max_lr has 1 values, but the optimizer has 2 param groups"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=-1.0, total_steps=10), ValueError, "-1.0"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, div_factor=0), ValueError, "div_factor"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, final_div_factor=-2.0), ValueError, "-2.0"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, base_momentum=1.5), ValueError, "1.5"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, max_momentum=[0.9, 2.0]), ValueError,
     "max_momentum[1] must be a finite number >= 0.0 and <= 1.0, got 2.0"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, cycle_momentum="yes"), TypeError, "'yes'"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, three_phase=1), TypeError, "three_phase"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10, last_epoch=-3), ValueError, "-3"),
    (lambda o: lr_scheduler.OneCycleLR(optim.Adagrad([Parameter(np.zeros(2))]), max_lr=0.1, total_steps=10),
     ValueError, "Adagrad has neither"),
    (lambda o: lr_scheduler.OneCycleLR(object(), max_lr=0.1, total_steps=10), TypeError, "not an Optimizer"),
    (lambda o: lr_scheduler.MultiStepLR(object(), milestones=[3]), TypeError, "not an Optimizer"),
    (lambda o: lr_scheduler.MultiplicativeLR(object(), lambda e: 0.9), TypeError, "not an Optimizer"),
])
def test_invalid_arguments_raise_naming_the_value(build, error, bad):
    opt = OURS.opt()
    before = [dict(g) for g in opt.param_groups]
    with pytest.raises(error, match=re.escape(bad)):
        build(opt)
    assert [dict(g) for g in opt.param_groups] == before  # checked before any group changed


# -- with the Trainer ------------------------------------------------------------------------------------------

TRAINER_CASES = {
    "OneCycleLR-SGD": (lambda groups: optim.SGD(groups, momentum=0.9),
                       lambda groups: torch.optim.SGD(groups, momentum=0.9),
                       lambda m, o: m.OneCycleLR(o, max_lr=[0.2, 0.05], total_steps=12)),
    "OneCycleLR-Adam": (lambda groups: optim.Adam(groups), lambda groups: torch.optim.Adam(groups),
                        lambda m, o: m.OneCycleLR(o, max_lr=0.02, total_steps=12, three_phase=True)),
    "WarmRestarts-SGD": (lambda groups: optim.SGD(groups, momentum=0.5),
                         lambda groups: torch.optim.SGD(groups, momentum=0.5),
                         lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2)),
    "MultiStep-Adam": (lambda groups: optim.Adam(groups), lambda groups: torch.optim.Adam(groups),
                       lambda m, o: m.MultiStepLR(o, milestones=[2, 5, 5], gamma=0.5)),
}


@pytest.mark.parametrize("name", sorted(TRAINER_CASES))
def test_the_trainer_steps_the_schedule_alike_on_the_eager_and_fused_routes(name):
    from mlp_cases import labelled_rows, small_mlp
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    make, tmake, build = TRAINER_CASES[name]
    batches = labelled_rows(dtype=np.float64)
    steps = 12

    def run(route):
        model = small_mlp(dtype=np.float64)
        params = list(model.parameters())
        opt = make([{"params": params[:2], "lr": 0.05}, {"params": params[2:], "lr": 0.01}])
        trainer = Trainer(model, opt, cross_entropy, scheduler=build(lr_scheduler, opt), route=route)
        losses, seen = [], []
        for i in range(steps):
            report = trainer.step(*batches[i % len(batches)])
            assert report.route == route
            losses.append(report.loss)
            seen.append(_groups(opt))
        return model, losses, seen

    eager, eager_losses, eager_seen = run("eager")
    fused, fused_losses, fused_seen = run("fused")
    assert fused_losses == pytest.approx(eager_losses, rel=1e-10, abs=1e-12)
    assert eager_losses[-1] < eager_losses[0]  # it trained
    assert fused_seen == eager_seen
    for p, q in zip(eager.parameters(), fused.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10)
    # the schedule the trainer stepped (once after each update) is torch's
    topt = tmake([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in (0.05, 0.01)])
    tsched = build(TLS, topt)
    for step in range(steps):
        topt.step()
        tsched.step()
        assert eager_seen[step] == _groups(topt), f"step {step + 1}"
