"""ReduceLROnPlateau, CyclicLR and ChainedScheduler against torch.optim.lr_scheduler: every group's lr (and the
momentum or betas CyclicLR cycles) after construction and after every step equal to torch's bit for bit (`==`),
ReduceLROnPlateau's counters (best, num_bad_epochs, cooldown_counter) too; state_dict round trips mid-run equal to
an uninterrupted run, torch's state loading here, torch's errors on bad arguments (and the checks added where torch
takes what gives no schedule), and the Trainer: CyclicLR and ChainedScheduler stepped by it on the eager and fused
routes and kept by its checkpoints, ReduceLROnPlateau stepped by the user after `trainer.evaluate(...)`.
"""

from __future__ import annotations

import copy
import json
import math
import re
import warnings

import numpy as np
import pytest
import torch

from tensorarena import optim
from tensorarena.optim import lr_scheduler

from test_lr_chainable import LRS, TLS
from test_lr_schedulers_more import (OURS, THEIRS, STEPS, _assert_same, _groups, _run, _set_lr, _torch_optimizer_state,
                                     goes_on_as_torch_from_its_state)


def _lrs(opt):
    return [g["lr"] for g in opt.param_groups]


# -- ReduceLROnPlateau against torch -----------------------------------------------------------------------------

def _metrics():
    """A validation loss as runs give one: falling, then flat stretches (some within the default rel threshold of
    the best: 1e-4), noise, a NaN and an inf (both bad steps in torch), then falling again."""
    values = [1.0, 1.0 - 1e-4, 1.0 - 2e-4, 0.9, 0.85, 0.85, 0.84999, 0.86, 0.9, 0.95]
    values += [0.8 + 0.01 * math.sin(i) for i in range(20)]
    values += [math.nan, math.inf, 0.7, 0.7, 0.7, 0.69995, 0.7, 0.71]
    values += [0.7 * 0.97**i for i in range(12)] + [0.45] * 15 + [0.3 + 0.02 * (i % 3) for i in range(15)]
    return values


METRICS = _metrics()
MAXIMISED = [-m for m in METRICS]  # an accuracy-like metric for mode="max" (NaN stays NaN)

# name -> (keyword arguments, metrics)
PLATEAU = {
    "defaults": ({}, METRICS),
    "patience-0": ({"patience": 0}, METRICS),
    "patience-cooldown-factor": ({"patience": 2, "cooldown": 3, "factor": 0.5}, METRICS),
    "abs-threshold": ({"threshold_mode": "abs", "threshold": 0.02, "patience": 1}, METRICS),
    "max-rel": ({"mode": "max", "patience": 1, "threshold": 1e-3}, MAXIMISED),
    "max-abs-cooldown": ({"mode": "max", "threshold_mode": "abs", "threshold": 0.05, "patience": 0, "cooldown": 2},
                         MAXIMISED),
    "min-lr-per-group": ({"patience": 0, "factor": 0.3, "min_lr": [0.02, 0.001]}, METRICS),
    "min-lr-one": ({"patience": 1, "factor": 0.5, "min_lr": 0.005}, METRICS),
    "eps-stops-small-reductions": ({"patience": 0, "factor": 0.9, "eps": 0.004}, METRICS),
    "factor-0": ({"patience": 3, "factor": 0.0, "min_lr": 1e-3}, METRICS),
    "threshold-0": ({"patience": 2, "threshold": 0.0}, METRICS),
}

COUNTERS = ("last_epoch", "best", "num_bad_epochs", "cooldown_counter", "min_lrs")


def _plateau_run(lib, kw, metrics, *, events=None, save_at=None):
    """Every group's lr and the scheduler's counters after construction and after each step(metric); `events[i]`
    runs before step i + 1. With `save_at`, the run is checkpointed after that step and resumed on a fresh optimizer
    (other lrs) and scheduler, their states loaded as a checkpoint restores them (ours through JSON)."""
    events = events or {}
    opt = lib.opt("sgd")
    sched = lib.m.ReduceLROnPlateau(opt, **kw)

    def seen():
        assert [float(x) for x in sched.get_last_lr()] == _lrs(opt)
        return _lrs(opt), [getattr(sched, k) for k in COUNTERS]

    out = [seen()]
    for i, metric in enumerate(metrics):
        if i in events:
            events[i](lib, opt)
        opt.step()
        sched.step(metric)
        out.append(seen())
        if i + 1 == save_at:
            saved_opt, saved = lib.state(opt), lib.state(sched)
            opt = lib.opt("sgd", lrs=(5.0, 7.0))
            for _ in range(len(saved_opt["param_groups"]) - len(opt.param_groups)):
                opt.add_param_group({"params": [lib.param()], "lr": 9.0})
            sched = lib.m.ReduceLROnPlateau(opt, **kw)
            opt.load_state_dict(saved_opt)
            sched.load_state_dict(saved)
    return out


@pytest.mark.parametrize("name", sorted(PLATEAU))
def test_plateau_lrs_and_counters_match_torch_step_by_step(name):
    kw, metrics = PLATEAU[name]
    ours, theirs = _plateau_run(OURS, kw, metrics), _plateau_run(THEIRS, kw, metrics)
    assert ours == theirs
    assert len({tuple(lrs) for lrs, _ in ours}) >= 2  # the lr was reduced: the run tested something


@pytest.mark.parametrize("name", sorted(PLATEAU))
def test_plateau_state_matches_torchs_and_a_resume_mid_run_equals_the_uninterrupted_run(name):
    kw, metrics = PLATEAU[name]
    uninterrupted = _plateau_run(OURS, kw, metrics)
    for save_at in (7, 33, 50):
        assert _plateau_run(OURS, kw, metrics, save_at=save_at) == uninterrupted, f"saved at {save_at}"
    assert _plateau_run(THEIRS, kw, metrics, save_at=33) == uninterrupted
    # the state itself is torch's: the same keys and values
    opt, topt = OURS.opt(), THEIRS.opt()
    sched, tsched = lr_scheduler.ReduceLROnPlateau(opt, **kw), TLS.ReduceLROnPlateau(topt, **kw)
    for metric in metrics[:40]:
        sched.step(metric)
        tsched.step(metric)
    assert sched.state_dict() == tsched.state_dict()


def test_torchs_plateau_state_loads_and_goes_on_as_torch():
    kw = {"patience": 1, "cooldown": 2, "factor": 0.5, "min_lr": [1e-3, 1e-4]}
    opt, topt = OURS.opt(), THEIRS.opt()
    sched, tsched = lr_scheduler.ReduceLROnPlateau(opt), TLS.ReduceLROnPlateau(topt, **kw)
    for metric in METRICS[:25]:
        topt.step()
        tsched.step(metric)
    opt.load_state_dict(_torch_optimizer_state(topt))
    sched.load_state_dict(copy.deepcopy(tsched.state_dict()))  # the settings come with it, as in torch
    for metric in METRICS[25:]:
        tsched.step(metric)
        sched.step(metric)
        assert _lrs(opt) == _lrs(topt) and sched.state_dict() == tsched.state_dict()


def test_plateau_reduces_from_an_lr_edited_by_hand_as_torch():
    events = {20: _set_lr(0, lr=0.5), 41: _set_lr(1, times=3.0)}
    kw = {"patience": 1, "factor": 0.5}
    assert _plateau_run(OURS, kw, METRICS, events=events) == _plateau_run(THEIRS, kw, METRICS, events=events)


@pytest.mark.parametrize("eps, want", [(0.05, [0.1, 0.03]), (0.0499, [0.05, 0.03])])
def test_plateau_makes_no_reduction_of_eps_or_less_as_torch(eps, want):
    # lr 0.1 halved is a reduction of exactly 0.05 (0.03's is 0.015): made only where it is more than eps
    kw = {"patience": 0, "factor": 0.5, "eps": eps}
    rising = [1.0 + i for i in range(6)]
    ours = _plateau_run(OURS, kw, rising)
    assert ours == _plateau_run(THEIRS, kw, rising)
    assert ours[-1][0] == want


def test_plateau_gives_a_group_added_mid_run_the_one_min_lr_as_torch():
    def add(lib, opt):
        opt.add_param_group({"params": [lib.param()], "lr": 0.5})

    kw = {"patience": 0, "min_lr": 0.004}
    ours = _plateau_run(OURS, kw, METRICS, events={12: add})
    assert ours == _plateau_run(THEIRS, kw, METRICS, events={12: add})
    assert len(ours[-1][0]) == 3 and ours[-1][0][2] < 0.5


def test_plateau_with_one_min_lr_per_group_refuses_an_added_group_before_anything_changes():
    # torch raises only when a reduction comes, with the step already counted; here at the next step
    opt, topt = OURS.opt(), THEIRS.opt()
    sched = lr_scheduler.ReduceLROnPlateau(opt, patience=0, min_lr=[0.01, 0.02])
    tsched = TLS.ReduceLROnPlateau(topt, patience=0, min_lr=[0.01, 0.02])
    for o, s in ((opt, sched), (topt, tsched)):
        s.step(1.0)
        o.add_param_group({"params": [OURS.param() if o is opt else THEIRS.param()], "lr": 0.5})
    before = sched.state_dict()
    with pytest.raises(RuntimeError, match=r"one min_lr per param group \(2\) and the optimizer has 3 groups"):
        sched.step(2.0)
    assert sched.state_dict() == before and _lrs(opt) == [0.1, 0.03, 0.5]
    with pytest.raises(RuntimeError, match="differs from when `ReduceLROnPlateau` was initialized"):
        tsched.step(2.0)
    assert tsched.last_epoch == 2  # torch counted the failed step
    sched.min_lrs.append(0.05)  # the fix the message names; torch's works the same way
    sched.step(2.0)
    assert _lrs(opt) == [0.010000000000000002, 0.02, 0.05]


def test_plateau_takes_the_metric_as_torch_does_and_refuses_what_is_no_number():
    from tensorarena import tensor

    opt, topt = OURS.opt(), THEIRS.opt()
    sched, tsched = lr_scheduler.ReduceLROnPlateau(opt, patience=0), TLS.ReduceLROnPlateau(topt, patience=0)
    for ours, theirs in ((np.float32(0.5), torch.tensor(0.5)), (tensor(np.array(0.75)), torch.tensor(0.75)),
                         (1, 1), (np.float64(0.25), 0.25)):
        sched.step(ours)
        tsched.step(theirs)
        assert _lrs(opt) == _lrs(topt) and sched.best == tsched.best
    before = sched.state_dict()
    for bad in ("0.1", None, [0.1], np.zeros(3)):
        with pytest.raises(TypeError, match="takes the metric as a number"):
            sched.step(bad)
    assert sched.state_dict() == before
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'metrics'"):
        sched.step()
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'metrics'"):
        tsched.step()


def test_plateau_construction_changes_no_group_and_has_no_closed_form_as_torch():
    opt, topt = OURS.opt(), THEIRS.opt()
    before = [dict(g) for g in opt.param_groups]
    sched, tsched = lr_scheduler.ReduceLROnPlateau(opt), TLS.ReduceLROnPlateau(topt)
    assert [dict(g) for g in opt.param_groups] == before and "initial_lr" not in topt.param_groups[0]
    assert sched.last_epoch == tsched.last_epoch == 0 and sched.get_last_lr() == tsched.get_last_lr() == list(LRS)
    with pytest.raises(NotImplementedError):
        tsched.get_lr()
    with pytest.raises(NotImplementedError, match="get_last_lr"):
        sched.get_lr()


def test_plateau_load_refuses_another_schedulers_state_and_bad_values_changing_nothing():
    opt = OURS.opt()
    sched = lr_scheduler.ReduceLROnPlateau(opt)
    sched.step(1.0)
    before = sched.state_dict()
    bad = [
        (lr_scheduler.StepLR(OURS.opt(), 3).state_dict(), "keys ['base_lrs', 'gamma', 'step_size']"),
        ({**before, "mode": "mean"}, "mode must be 'min'"),
        ({**before, "threshold_mode": "relative"}, "threshold_mode must be 'rel' or 'abs'"),
        ({**before, "min_lrs": [0.0, 0.0, 0.0]}, "3 min_lrs but the optimizer has 2 param groups"),
        ({**before, "optimizer": None}, "keys ['optimizer']"),
        ([1, 2], "must be a dict"),
    ]
    for state, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            sched.load_state_dict(state)
        assert sched.state_dict() == before and sched.optimizer is opt


# -- CyclicLR against torch --------------------------------------------------------------------------------------

class Decay:
    """A callable object with state: torch's CyclicLR saves its __dict__ (a plain function is saved as None)."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, x):
        return self.rate**x


# Each builder takes (library, optimizer) and returns the schedulers to step, in order.
CYCLIC = {
    "triangular": lambda L, o: [L.m.CyclicLR(o, 0.01, 0.1, step_size_up=4)],
    "triangular-up-down": lambda L, o: [L.m.CyclicLR(o, 0.01, 0.1, step_size_up=3, step_size_down=7)],
    "triangular2-per-group": lambda L, o: [L.m.CyclicLR(o, [0.01, 0.001], [0.2, 0.05], step_size_up=2,
                                                        step_size_down=3, mode="triangular2")],
    "exp_range": lambda L, o: [L.m.CyclicLR(o, 0.01, 0.1, step_size_up=5, mode="exp_range", gamma=0.97)],
    "sawtooth": lambda L, o: [L.m.CyclicLR(o, 0.01, 0.1, step_size_up=5, step_size_down=0)],
    "scale_fn-cycle": lambda L, o: [L.m.CyclicLR(o, 0.01, 0.1, step_size_up=3, scale_fn=lambda x: 1.0 / x)],
    "scale_fn-iterations-object": lambda L, o: [L.m.CyclicLR(o, 0.02, 0.3, step_size_up=4, mode="own",
                                                             scale_fn=Decay(0.98), scale_mode="iterations")],
    "momentums-per-group": lambda L, o: [L.m.CyclicLR(o, 0.01, 0.1, step_size_up=6, base_momentum=[0.85, 0.7],
                                                      max_momentum=(0.95, 0.9))],
    "no-momentum": lambda L, o: [L.m.CyclicLR(o, 0.001, 0.006, step_size_up=7, cycle_momentum=False)],
    "defaults": lambda L, o: [L.m.CyclicLR(o, 0.001, 0.006)],
    "inverted": lambda L, o: [L.m.CyclicLR(o, 0.1, 0.01, step_size_up=4, base_momentum=0.9, max_momentum=0.8)],
}
SEQUENTIAL_CYCLIC = {
    "Sequential-Linear-Cyclic": lambda L, o: [L.m.SequentialLR(o, [
        L.m.LinearLR(o, start_factor=0.1, total_iters=10), L.m.CyclicLR(o, 0.01, 0.1, step_size_up=4)],
        milestones=[10])],
    "Sequential-Cyclic-Exponential": lambda L, o: [L.m.SequentialLR(o, [
        L.m.CyclicLR(o, 0.01, 0.1, step_size_up=3, mode="triangular2"), L.m.ExponentialLR(o, gamma=0.9)],
        milestones=[20])],
}


def _chain(*make):
    return lambda L, o: [L.m.ChainedScheduler([m(L, o) for m in make])]


CHAINS = {
    "Exponential+Step": _chain(lambda L, o: L.m.ExponentialLR(o, 0.95), lambda L, o: L.m.StepLR(o, 7, gamma=0.5)),
    "Linear+MultiStep+Polynomial": _chain(lambda L, o: L.m.LinearLR(o, start_factor=0.2, total_iters=10),
                                          lambda L, o: L.m.MultiStepLR(o, [15, 30, 30], gamma=0.5),
                                          lambda L, o: L.m.PolynomialLR(o, total_iters=50, power=2.0)),
    "Cyclic+Exponential": _chain(lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, step_size_up=5),
                                 lambda L, o: L.m.ExponentialLR(o, 0.9)),
    "OneCycle+MultiStep": _chain(lambda L, o: L.m.OneCycleLR(o, max_lr=0.4, total_steps=STEPS),
                                 lambda L, o: L.m.MultiStepLR(o, [20, 40], gamma=0.5)),
    "WarmRestarts+Constant+Multiplicative": _chain(
        lambda L, o: L.m.CosineAnnealingWarmRestarts(o, T_0=8, T_mult=2),
        lambda L, o: L.m.ConstantLR(o, factor=0.5, total_iters=12),
        lambda L, o: L.m.MultiplicativeLR(o, lambda e: 0.99)),
    "Sequential+Exponential": _chain(
        lambda L, o: L.m.SequentialLR(o, [L.m.LinearLR(o, start_factor=0.1, total_iters=10),
                                          L.m.CosineAnnealingLR(o, T_max=50)], milestones=[10]),
        lambda L, o: L.m.ExponentialLR(o, 0.99)),
    "Chained+Multiplicative": lambda L, o: [L.m.ChainedScheduler(
        [L.m.ChainedScheduler([L.m.StepLR(o, 5, gamma=0.8), L.m.ExponentialLR(o, 0.97)]),
         L.m.MultiplicativeLR(o, lambda e: 0.99)], optimizer=o)],
}
EVERY = {**CYCLIC, **SEQUENTIAL_CYCLIC, **CHAINS}


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(EVERY))
def test_every_step_matches_torch(name, kind):
    ours = _run(OURS, EVERY[name], kind=kind)
    _assert_same(ours, _run(THEIRS, EVERY[name], kind=kind))
    assert len({step[0][0] for step in ours}) >= 5  # the lr moved


# CyclicLR sets its lr whatever the group had (an edit lasts one step); the chainable schedules of a chain go on
# from the edited lr: both as torch's.
@pytest.mark.parametrize("name", sorted(EVERY))
def test_an_lr_edited_by_hand_mid_run_follows_torch(name):
    events = {20: _set_lr(0, lr=0.07), 41: _set_lr(1, times=3.0)}
    _assert_same(_run(OURS, EVERY[name], events=events), _run(THEIRS, EVERY[name], events=events))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(EVERY))
def test_a_state_dict_round_trip_mid_run_follows_torch(name, kind):
    events = {12: _set_lr(0, times=0.5)}
    ours = _run(OURS, EVERY[name], kind=kind, events=events, save_at=25)
    _assert_same(ours, _run(THEIRS, EVERY[name], kind=kind, events=events, save_at=25))
    _assert_same(ours, _run(OURS, EVERY[name], kind=kind, events=events))  # the round trip changed nothing


@pytest.mark.parametrize("name", sorted({**CYCLIC, **CHAINS}))
def test_torchs_state_dict_loads_and_goes_on_as_torch(name):
    goes_on_as_torch_from_its_state(EVERY[name], "adam")


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_cyclic_writes_torchs_group_values(kind):
    opt, topt = OURS.opt(kind), THEIRS.opt(kind)
    CYCLIC["momentums-per-group"](OURS, opt)
    CYCLIC["momentums-per-group"](THEIRS, topt)
    keys = ["lr", "initial_lr", "max_momentum", "base_momentum", "betas" if kind == "adam" else "momentum"]
    for group, tgroup in zip(opt.param_groups, topt.param_groups):
        assert {k: group[k] for k in keys} == {k: tgroup[k] for k in keys}
    if kind == "adam":
        assert opt.param_groups[0]["betas"] == (0.95, 0.999) and opt.param_groups[1]["betas"] == (0.9, 0.999)


def test_cyclic_state_keeps_a_scale_fn_objects_attributes_not_a_functions():
    opt, topt = OURS.opt(), THEIRS.opt()
    decay = Decay(0.98)
    sched = lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=2, scale_fn=decay, scale_mode="iterations")
    tsched = TLS.CyclicLR(topt, 0.01, 0.1, step_size_up=2, scale_fn=Decay(0.98), scale_mode="iterations")
    state = json.loads(json.dumps(sched.state_dict()))
    assert state["_scale_fn_custom"] == tsched.state_dict()["_scale_fn_custom"] == {"rate": 0.98}
    assert lr_scheduler.CyclicLR(OURS.opt(), 0.01, 0.1, scale_fn=lambda x: 1.0).state_dict()["_scale_fn_custom"] is None
    state["_scale_fn_custom"] = {"rate": 0.5}
    fresh = Decay(0.98)
    again = lr_scheduler.CyclicLR(OURS.opt(), 0.01, 0.1, step_size_up=2, scale_fn=fresh, scale_mode="iterations")
    again.load_state_dict(state)
    assert fresh.rate == 0.5 and again.scale_mode == "iterations"
    # a state with attributes for a scale_fn this CyclicLR lacks (torch: AttributeError) changes nothing
    plain = lr_scheduler.CyclicLR(OURS.opt(), 0.01, 0.1, step_size_up=2)
    before = plain.state_dict()
    with pytest.raises(ValueError, match=r"scale_fn attributes \{'rate': 0.5\}"):
        plain.load_state_dict(state)
    assert plain.state_dict() == before


@pytest.mark.parametrize("name", ["triangular", "triangular2-per-group", "exp_range", "momentums-per-group",
                                  "scale_fn-iterations-object"])
def test_cyclic_resume_with_last_epoch_matches_an_uninterrupted_run(name):
    k = 23
    for lib in (OURS, THEIRS):
        reference = lib.opt("adam")
        (sched,) = CYCLIC[name](lib, reference)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(k):
                reference.step()
                sched.step()
            saved = lib.state(reference) if lib.ours else _torch_optimizer_state(reference)
            resumed = lib.opt("adam", lrs=(5.0, 7.0))
            resumed.load_state_dict(saved)
            sched.step()
            again = _rebuilt_cyclic(lib, name, resumed, last_epoch=k)
            assert again.last_epoch == sched.last_epoch == k + 1
            for step in range(STEPS - k - 1):
                assert _groups(resumed) == _groups(reference), f"{'ours' if lib.ours else 'torch'}: step {step}"
                sched.step()
                again.step()
            assert _groups(resumed) == _groups(reference)


def _rebuilt_cyclic(lib, name, opt, last_epoch):
    """CYCLIC[name]'s scheduler built with last_epoch (each builder's arguments, given again)."""
    m, kw = lib.m, {"last_epoch": last_epoch}
    return {
        "triangular": lambda: m.CyclicLR(opt, 0.01, 0.1, step_size_up=4, **kw),
        "triangular2-per-group": lambda: m.CyclicLR(opt, [0.01, 0.001], [0.2, 0.05], step_size_up=2,
                                                    step_size_down=3, mode="triangular2", **kw),
        "exp_range": lambda: m.CyclicLR(opt, 0.01, 0.1, step_size_up=5, mode="exp_range", gamma=0.97, **kw),
        "momentums-per-group": lambda: m.CyclicLR(opt, 0.01, 0.1, step_size_up=6, base_momentum=[0.85, 0.7],
                                                  max_momentum=(0.95, 0.9), **kw),
        "scale_fn-iterations-object": lambda: m.CyclicLR(opt, 0.02, 0.3, step_size_up=4, mode="own",
                                                         scale_fn=Decay(0.98), scale_mode="iterations", **kw),
    }[name]()


def test_cyclic_built_after_another_scheduler_starts_at_base_lr_where_torch_starts_at_initial_lr():
    # torch's first step at construction takes the groups' initial_lr (set by the ExponentialLR) as the cycle's
    # base, and its later steps base_lr; here every lr is the cycle's. From step 1 on the two agree.
    def build(lib, opt):
        return [lib.m.ChainedScheduler([lib.m.ExponentialLR(opt, 0.9), lib.m.CyclicLR(opt, 0.01, 0.1, step_size_up=4)])]

    ours, theirs = _run(OURS, build), _run(THEIRS, build)
    assert [lr for lr, _, _ in ours[0]] == [0.01, 0.01]
    assert [lr for lr, _, _ in theirs[0]] == list(LRS)
    _assert_same(ours[1:], theirs[1:])


def test_cyclic_triangular2_goes_on_past_cycle_1024_where_torchs_power_overflows():
    opt, topt = OURS.opt(), THEIRS.opt()
    # one step per cycle: step_size_up=1 and no way down
    sched = lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=1, step_size_down=0, mode="triangular2")
    tsched = TLS.CyclicLR(topt, 0.01, 0.1, step_size_up=1, step_size_down=0, mode="triangular2")
    for step in range(1020):
        topt.step()
        sched.step()
        tsched.step()
        assert _groups(opt) == _groups(topt), f"step {step + 1}"
    with pytest.raises(OverflowError):
        for _ in range(10):
            topt.step()
            tsched.step()
    for _ in range(100):
        sched.step()
    assert _lrs(opt) == [0.01, 0.01] and [g["momentum"] for g in opt.param_groups] == [0.9, 0.9]


def test_cyclic_refuses_a_group_added_mid_run_before_anything_changes():
    opt = OURS.opt()
    sched = lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=4)
    sched.step()
    opt.add_param_group({"params": [OURS.param()], "lr": 0.05})
    before = _groups(opt)
    with pytest.raises(ValueError, match=r"base_lr and max_lr for 2 param groups, and 1 group\(s\) were added"):
        sched.step()
    assert _groups(opt) == before and sched.last_epoch == 1


# -- ChainedScheduler ---------------------------------------------------------------------------------------------

def test_chained_state_is_torchs_shape_and_its_load_is_all_or_nothing():
    opt, topt = OURS.opt(), THEIRS.opt()
    (chain,), (tchain,) = CHAINS["Exponential+Step"](OURS, opt), CHAINS["Exponential+Step"](THEIRS, topt)
    for _ in range(9):
        topt.step()
        chain.step()
        tchain.step()
    state, tstate = chain.state_dict(), tchain.state_dict()
    assert state["_last_lr"] == tstate["_last_lr"] == chain.get_last_lr() == _lrs(opt)
    assert [s["last_epoch"] for s in state["_schedulers"]] == [s["last_epoch"] for s in tstate["_schedulers"]] == [9, 9]
    fresh_opt = OURS.opt()
    (fresh,) = CHAINS["Exponential+Step"](OURS, fresh_opt)
    before = [s.state_dict() for s in fresh._schedulers]
    broken = json.loads(json.dumps(state))
    broken["_schedulers"][1] = lr_scheduler.ReduceLROnPlateau(OURS.opt()).state_dict()
    with pytest.raises(ValueError, match="StepLR does not have"):
        fresh.load_state_dict(broken)
    assert [s.state_dict() for s in fresh._schedulers] == before  # the first inner state was put back
    with pytest.raises(ValueError, match="state has 1 inner schedulers, this one has 2"):
        fresh.load_state_dict({**state, "_schedulers": state["_schedulers"][:1]})
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert fresh.get_last_lr() == chain.get_last_lr() and [s.last_epoch for s in fresh._schedulers] == [9, 9]


def test_a_chains_failed_load_puts_back_the_schedulers_of_a_chain_within_it():
    build = CHAINS["Chained+Multiplicative"]  # [ChainedScheduler([StepLR, ExponentialLR]), MultiplicativeLR]
    opt = OURS.opt()
    (chain,) = build(OURS, opt)
    for _ in range(6):
        chain.step()
    state = json.loads(json.dumps(chain.state_dict()))
    state["_schedulers"][1] = {"no such key": 1}
    (fresh,) = build(OURS, OURS.opt())
    inner = fresh._schedulers[0]._schedulers
    before = [s.state_dict() for s in inner]
    with pytest.raises(ValueError, match=r"keys \['no such key'\] that MultiplicativeLR does not have"):
        fresh.load_state_dict(state)
    assert [s.state_dict() for s in inner] == before and [s.last_epoch for s in inner] == [0, 0]


def test_chained_has_no_epoch_and_no_lr_formula_as_torchs():
    opt, topt = OURS.opt(), THEIRS.opt()
    (chain,), (tchain,) = CHAINS["Exponential+Step"](OURS, opt), CHAINS["Exponential+Step"](THEIRS, topt)
    assert not hasattr(chain, "last_epoch") and not hasattr(tchain, "last_epoch")
    with pytest.raises(NotImplementedError):
        tchain.get_lr()
    with pytest.raises(NotImplementedError, match="get_last_lr"):
        chain.get_lr()


def test_sequential_refuses_a_plateau_as_torch_and_a_chain_whose_steps_it_cannot_undo():
    opt, topt = OURS.opt(), THEIRS.opt()
    with pytest.raises(ValueError, match="SequentialLR does not support `ReduceLROnPlateau`"):
        TLS.SequentialLR(topt, [TLS.StepLR(topt, 2), TLS.ReduceLROnPlateau(topt)], milestones=[3])
    before = _groups(opt)
    step = lr_scheduler.StepLR(opt, 2)
    with pytest.raises(ValueError, match=r"schedulers\[1\], a ReduceLROnPlateau: its step needs the metric"):
        lr_scheduler.SequentialLR(opt, [step, lr_scheduler.ReduceLROnPlateau(opt)], milestones=[3])
    chain = lr_scheduler.ChainedScheduler([lr_scheduler.ExponentialLR(opt, 0.9)])
    with pytest.raises(ValueError, match=r"schedulers\[0\], a ChainedScheduler: put the SequentialLR inside"):
        lr_scheduler.SequentialLR(opt, [chain, step], milestones=[3])
    assert _groups(opt) == before and step.last_epoch == 0  # refused before anything changed
    # torch takes a chain in SequentialLR and fails at its milestone (NotImplementedError)
    tchain = TLS.ChainedScheduler([TLS.ExponentialLR(topt, 0.9)])
    tseq = TLS.SequentialLR(topt, [TLS.StepLR(topt, 2), tchain], milestones=[2])
    with warnings.catch_warnings(), pytest.raises(NotImplementedError):
        warnings.simplefilter("ignore")
        for _ in range(3):
            tseq.step()


# -- argument checks ----------------------------------------------------------------------------------------------

def _adagrad(lib):
    params = [lib.param()]
    return optim.Adagrad(params) if lib.ours else torch.optim.Adagrad(params)


# (build(lib, opt), torch's error type or None where torch takes it, ours, what our message names)
BAD = {
    "plateau-factor-1": (lambda L, o: L.m.ReduceLROnPlateau(o, factor=1.0), ValueError, ValueError,
                         "factor must be < 1.0"),
    "plateau-mode": (lambda L, o: L.m.ReduceLROnPlateau(o, mode="mean"), ValueError, ValueError, "'mean'"),
    "plateau-threshold-mode": (lambda L, o: L.m.ReduceLROnPlateau(o, threshold_mode="x"), ValueError, ValueError,
                               "threshold_mode must be 'rel' or 'abs', got 'x'"),
    "plateau-min-lrs": (lambda L, o: L.m.ReduceLROnPlateau(o, min_lr=[0.1]), ValueError, ValueError,
                        "expected 2 min_lrs (one per param group), got 1"),
    "plateau-not-optimizer": (lambda L, o: L.m.ReduceLROnPlateau(object()), TypeError, TypeError, "not an Optimizer"),
    "plateau-factor-negative": (lambda L, o: L.m.ReduceLROnPlateau(o, factor=-0.5), None, ValueError, "-0.5"),
    "plateau-patience-negative": (lambda L, o: L.m.ReduceLROnPlateau(o, patience=-1), None, ValueError, "patience"),
    "plateau-patience-float": (lambda L, o: L.m.ReduceLROnPlateau(o, patience=2.5), None, ValueError, "2.5"),
    "plateau-cooldown-negative": (lambda L, o: L.m.ReduceLROnPlateau(o, cooldown=-1), None, ValueError, "cooldown"),
    "plateau-threshold-negative": (lambda L, o: L.m.ReduceLROnPlateau(o, threshold=-0.1), None, ValueError, "-0.1"),
    "plateau-eps-nan": (lambda L, o: L.m.ReduceLROnPlateau(o, eps=float("nan")), None, ValueError, "eps"),
    "plateau-min-lr-negative": (lambda L, o: L.m.ReduceLROnPlateau(o, min_lr=[0.0, -1.0]), None, ValueError,
                                "min_lr[1]"),
    "cyclic-mode": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, mode="cosine"), ValueError, ValueError,
                    "mode must be one of ('triangular', 'triangular2', 'exp_range') when no scale_fn is given"),
    "cyclic-base-lr-count": (lambda L, o: L.m.CyclicLR(o, [0.01], 0.1), ValueError, ValueError,
                             "base_lr has 1 values, but the optimizer has 2 param groups"),
    "cyclic-max-lr-count": (lambda L, o: L.m.CyclicLR(o, 0.01, [0.1, 0.2, 0.3]), ValueError, ValueError,
                            "max_lr has 3 values"),
    "cyclic-momentum-count": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, base_momentum=[0.8]), ValueError, ValueError,
                              "base_momentum has 1 values"),
    "cyclic-no-momentum-setting": (lambda L, o: L.m.CyclicLR(_adagrad(L), 0.01, 0.1), ValueError,
                                   ValueError, "Adagrad has neither"),
    "cyclic-scale_fn-not-callable": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, scale_fn=3), TypeError, TypeError,
                                     "got a int"),
    "cyclic-step-up-0": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, step_size_up=0), ZeroDivisionError, ValueError,
                         "step_size_up must be an integer >= 1, got 0"),
    "cyclic-step-up-negative": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, step_size_up=-2), None, ValueError, "-2"),
    "cyclic-step-down-negative": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, step_size_down=-1), None, ValueError,
                                  "step_size_down"),
    "cyclic-scale-mode": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, scale_fn=lambda x: 1.0, scale_mode="steps"), None,
                          ValueError, "'steps'"),
    "cyclic-gamma-above-1": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, mode="exp_range", gamma=1.5), None, ValueError,
                             "gamma must be a finite number > 0.0 and <= 1.0, got 1.5"),
    "cyclic-base-lr-negative": (lambda L, o: L.m.CyclicLR(o, -0.1, 0.1), None, ValueError, "-0.1"),
    "cyclic-momentum-above-1": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, max_momentum=1.5), None, ValueError, "1.5"),
    "cyclic-cycle-momentum-str": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, cycle_momentum="no"), None, TypeError,
                                  "'no'"),
    "cyclic-last-epoch": (lambda L, o: L.m.CyclicLR(o, 0.01, 0.1, last_epoch=-2), KeyError, ValueError, "-2"),
    "chained-empty": (lambda L, o: L.m.ChainedScheduler([]), ValueError, ValueError, "at least one scheduler"),
    "chained-not-a-scheduler": (lambda L, o: L.m.ChainedScheduler([L.m.StepLR(o, 2), 5]), TypeError, TypeError,
                                "schedulers[1] is a int, which has no optimizer"),
    "chained-plateau": (lambda L, o: L.m.ChainedScheduler([L.m.StepLR(o, 2), L.m.ReduceLROnPlateau(o)]), ValueError,
                        ValueError, "schedulers[1], a ReduceLROnPlateau: its step needs the metric"),
    "chained-other-optimizer": (lambda L, o: L.m.ChainedScheduler([L.m.StepLR(o, 2), L.m.StepLR(L.opt(), 2)]),
                                ValueError, ValueError, "schedulers[1] (StepLR) has a different one"),
    "chained-given-other-optimizer": (lambda L, o: L.m.ChainedScheduler([L.m.StepLR(o, 2)], optimizer=L.opt()),
                                      ValueError, ValueError, "schedulers[0] (StepLR) has a different one"),
    "chained-optimizer-not-one": (lambda L, o: L.m.ChainedScheduler([L.m.StepLR(o, 2)], optimizer="sgd"),
                                  ValueError, ValueError, "schedulers[0] (StepLR) has a different one"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_invalid_arguments_raise_as_torch_and_name_the_value(name):
    build, theirs, ours, message = BAD[name]
    topt = THEIRS.opt()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if theirs is None:
            build(THEIRS, topt)  # torch takes it (and gives no schedule): ours refuses
        else:
            with pytest.raises(theirs):
                build(THEIRS, topt)
    opt = OURS.opt()
    before = [dict(g) for g in opt.param_groups]
    with pytest.raises(ours, match=re.escape(message)):
        build(OURS, opt)
    if not name.startswith("chained"):  # (a chain's own schedulers, built first, set the groups' initial_lr)
        assert [dict(g) for g in opt.param_groups] == before  # checked before any group changed


# -- with the Trainer -----------------------------------------------------------------------------------------------

def _sgd(lib, groups):
    return optim.SGD(groups, momentum=0.5) if lib is optim else torch.optim.SGD(groups, momentum=0.5)


def _adam(lib, groups):
    return optim.Adam(groups) if lib is optim else torch.optim.Adam(groups)


# name -> (optimizer, schedule), each taking the library (tensorarena.optim or torch.optim) first
TRAINER_CASES = {
    "CyclicLR-SGD": (_sgd, lambda m, o: m.CyclicLR(o, [0.01, 0.005], [0.1, 0.05], step_size_up=3,
                                                   mode="triangular2")),
    "CyclicLR-Adam": (_adam, lambda m, o: m.CyclicLR(o, 1e-3, 1e-2, step_size_up=2, step_size_down=4,
                                                     mode="exp_range", gamma=0.9)),
    "Chained-Adam": (_adam, lambda m, o: m.ChainedScheduler([m.CyclicLR(o, 1e-3, 1e-2, step_size_up=3),
                                                             m.ExponentialLR(o, 0.9)])),
    "Chained-SGD": (_sgd, lambda m, o: m.ChainedScheduler([m.LinearLR(o, start_factor=0.5, total_iters=4),
                                                           m.MultiStepLR(o, [3, 6], gamma=0.5)])),
}


def _trainer(route, make, build=None, seed=0, **kw):
    from mlp_cases import small_mlp
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    model = small_mlp(seed=seed, dtype=np.float64)
    params = list(model.parameters())
    opt = make(optim, [{"params": params[:2], "lr": 0.05}, {"params": params[2:], "lr": 0.01}])
    sched = build(lr_scheduler, opt) if build is not None else None
    return Trainer(model, opt, cross_entropy, scheduler=sched, route=route, **kw), model, opt


@pytest.mark.parametrize("name", sorted(TRAINER_CASES))
def test_the_trainer_steps_the_schedule_alike_on_the_eager_and_fused_routes(name):
    from mlp_cases import labelled_rows

    make, build = TRAINER_CASES[name]
    batches = labelled_rows(dtype=np.float64)
    steps = 12

    def run(route):
        trainer, model, opt = _trainer(route, make, build)
        losses, seen = [], []
        for i in range(steps):
            report = trainer.step(*batches[i % len(batches)])
            assert report.route == route
            losses.append(report.loss)
            seen.append(_groups(opt))
        if route == "fused":
            assert trainer.fused.traces == 1 and trainer.fused.replays == steps
        return model, losses, seen

    eager, eager_losses, eager_seen = run("eager")
    fused, fused_losses, fused_seen = run("fused")
    assert fused_losses == pytest.approx(eager_losses, rel=1e-10, abs=1e-12)
    assert eager_losses[-1] < eager_losses[0]  # it trained
    assert fused_seen == eager_seen
    for p, q in zip(eager.parameters(), fused.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10)
    # the schedule the trainer stepped (once after each update) is torch's
    topt = make(torch.optim, [{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in (0.05, 0.01)])
    tsched = build(TLS, topt)
    for step in range(steps):
        topt.step()
        tsched.step()
        assert eager_seen[step] == _groups(topt), f"step {step + 1}"


@pytest.mark.parametrize("name", sorted(TRAINER_CASES))
def test_trainer_save_and_load_resume_the_schedule_as_the_uninterrupted_run(name, tmp_path):
    from mlp_cases import labelled_rows

    make, build = TRAINER_CASES[name]
    batches = labelled_rows(dtype=np.float64)
    trainer, model, opt = _trainer("fused", make, build)
    for i in range(5):
        trainer.step(*batches[i % len(batches)])
    trainer.save(tmp_path / "run.safetensors")
    for i in range(5, 10):
        trainer.step(*batches[i % len(batches)])
    # a fresh run (other weights, lrs from construction) that loads the checkpoint goes on as the saved one did
    again, again_model, again_opt = _trainer("fused", make, build, seed=3)
    again.load(tmp_path / "run.safetensors")
    for i in range(5, 10):
        again.step(*batches[i % len(batches)])
    assert _groups(again_opt) == _groups(opt)
    assert again.scheduler.state_dict() == trainer.scheduler.state_dict()
    for p, q in zip(model.parameters(), again_model.parameters()):
        np.testing.assert_array_equal(q.data, p.data)


def test_trainer_load_refuses_a_chain_of_other_schedulers_changing_nothing(tmp_path):
    from mlp_cases import labelled_rows

    make, build = TRAINER_CASES["Chained-SGD"]
    trainer, _, _ = _trainer("eager", make, build)
    trainer.step(*labelled_rows(dtype=np.float64)[0])
    trainer.save(tmp_path / "run.safetensors")
    other, _, opt = _trainer("eager", make, lambda m, o: m.ChainedScheduler([m.LinearLR(o, total_iters=4)]))
    before = (_groups(opt), other.scheduler.state_dict())
    with pytest.raises(ValueError, match="it holds 2 inner schedulers, ChainedScheduler has 1"):
        other.load(tmp_path / "run.safetensors")
    assert (_groups(opt), other.scheduler.state_dict()) == before


PLATEAU_TRAINER = {"patience": 0, "threshold": 0.05, "factor": 0.5, "min_lr": [1e-3, 1e-4]}


def _plateau_training(route, steps=16, *, replay="auto", save=None, resume=None):
    """Trainer steps with a ReduceLROnPlateau the user steps on the held-out loss every 2nd step (the pattern
    README gives). `save=(path, after)` saves the run there after that many steps, its schedule in `extra`;
    `resume=(path, after)` starts from such a file at that step. Returns (model, lrs per step, held-out losses,
    trainer, scheduler)."""
    from mlp_cases import labelled_rows

    batches, (x_val, y_val) = labelled_rows(dtype=np.float64), labelled_rows(n=1, seed=9, dtype=np.float64)[0]
    trainer, model, opt = _trainer(route, _sgd, fused_replay=replay, seed=5 if resume else 0)
    sched = lr_scheduler.ReduceLROnPlateau(opt, **PLATEAU_TRAINER)
    start = 0
    if resume is not None:
        path, start = resume
        sched.load_state_dict(trainer.load(path)["plateau"])
    lrs, held_out = [], []
    for i in range(start, steps):
        report = trainer.step(*batches[i % len(batches)])
        assert report.route == route
        lrs.append(report.lr)
        if i % 2 == 1:
            held_out.append(trainer.evaluate(x_val, y_val)["loss"])
            sched.step(held_out[-1])
        if save is not None and i + 1 == save[1]:
            trainer.save(save[0], extra={"plateau": sched.state_dict()})
    return model, lrs, held_out, trainer, sched


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_a_user_driven_plateau_changes_the_lr_the_fused_steps_use_without_a_retrace(replay):
    eager, eager_lrs, eager_held_out, _, _ = _plateau_training("eager")
    fused, fused_lrs, fused_held_out, trainer, sched = _plateau_training("fused", replay=replay)
    assert trainer.fused.replay == replay and trainer.fused.traces == 1 and trainer.fused.replays == 16
    assert fused_lrs == eager_lrs
    assert len(set(eager_lrs)) >= 3  # reduced at least twice: the later steps ran at the new lrs
    assert fused_held_out == pytest.approx(eager_held_out, rel=1e-10, abs=1e-12)
    for p, q in zip(eager.parameters(), fused.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10)
    # torch's ReduceLROnPlateau fed the same losses reduces at the same steps to the same lrs
    topt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in (0.05, 0.01)])
    tsched = TLS.ReduceLROnPlateau(topt, **PLATEAU_TRAINER)
    want = []
    for i in range(16):
        want.append(topt.param_groups[0]["lr"])
        if i % 2 == 1:
            tsched.step(eager_held_out[i // 2])
    assert eager_lrs == want and sched.state_dict() == tsched.state_dict()


def test_a_user_driven_plateau_resumes_from_the_trainers_checkpoint_extra(tmp_path):
    path = tmp_path / "run.safetensors"
    model, lrs, held_out, _, sched = _plateau_training("fused", save=(path, 8))
    resumed, resumed_lrs, resumed_held_out, _, resumed_sched = _plateau_training("fused", resume=(path, 8))
    assert resumed_lrs == lrs[8:] and resumed_held_out == held_out[4:]
    assert resumed_sched.state_dict() == sched.state_dict()
    for p, q in zip(model.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(q.data, p.data)


def test_the_trainer_refuses_a_plateau_it_cannot_step_and_names_the_user_driven_pattern():
    # Regression (fixed): Trainer took it and step 1 applied its update, then failed: "step 1's update was applied,
    # then its learning-rate scheduler failed ... TypeError: ReduceLROnPlateau.step() missing 1 required
    # positional argument: 'metrics'", and so did every later step (train/trainer.py _check_scheduler).
    from tensorarena.train.trainer import Trainer

    trainer, model, opt = _trainer("fused", _sgd)
    plateau = lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau .*sched\.step\(.*evaluate"):
        Trainer(model, opt, trainer.loss_fn, scheduler=plateau, route="fused")
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau .*sched\.step\(.*evaluate"):
        trainer.scheduler = plateau
    assert trainer.scheduler is None
