"""LR schedules in torch's chainable form: a param group added mid-run, an lr edited by hand between steps, two
schedulers chained on one optimizer and state_dict round trips mid-run, each over 120 steps against
torch.optim.lr_scheduler driven by the same calls (lrs equal within 1e-12, float64).

tensorarena offers no `step(epoch)`; torch's explicit-epoch (closed-form) path is reached through SequentialLR's
milestones, covered here too. Where torch itself fails (a group added after construction meets a step that needs
its base lr: a SequentialLR milestone, a CosineAnnealingLR restart) the expectation is torch's own formulas with
the added group's lr as its base lr: torch with that base lr appended by hand.

Before the change to optim/lr_scheduler.py (base 36a8d855e23aeed9cd7b30ff6603faf0fbd77ac7), 75 of the 80 tests
here fail; the 81st (SequentialLR's all-or-nothing load, added after) fails there too. Seen with:
    git -C /work/main worktree add /tmp/lr_base 36a8d855e23aeed9cd7b30ff6603faf0fbd77ac7
    cp /work/main/tests/test_lr_chainable.py /tmp/lr_base/tests/
    cd /tmp/lr_base && NUMBA_NUM_THREADS=1 PYTHONPATH=/tmp/lr_base python -m pytest -q tests/test_lr_chainable.py
    git -C /work/main worktree remove --force /tmp/lr_base
"""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import pytest
import torch

from tensorarena import optim
from tensorarena.nn import Parameter
from tensorarena.optim import lr_scheduler

TLS = torch.optim.lr_scheduler
LRS = (0.1, 0.03)
STEPS = 120


class _Lib:
    """One library's scheduler module, optimizer and parameter, so a scenario runs unchanged on both."""

    def __init__(self, ours: bool):
        self.ours = ours
        self.m = lr_scheduler if ours else TLS

    def param(self):
        return Parameter(np.zeros(2)) if self.ours else torch.zeros(2, requires_grad=True)

    def opt(self, lrs=LRS):
        groups = [{"params": [self.param()], "lr": lr} for lr in lrs]
        return optim.SGD(groups) if self.ours else torch.optim.SGD(groups)

    def state(self, sched_or_opt):
        """A state_dict as a checkpoint keeps it: ours through JSON, torch's deep-copied."""
        state = sched_or_opt.state_dict()
        if self.ours and not isinstance(sched_or_opt, optim.Optimizer):
            return json.loads(json.dumps(state))
        return copy.deepcopy(state)


OURS, THEIRS = _Lib(True), _Lib(False)


def _warmup_cosine(lib, o, warmup, total):
    if lib.ours:
        return lib.m.warmup_cosine(o, warmup, total, start_factor=0.01, eta_min=1e-4)
    return TLS.SequentialLR(o, [TLS.LinearLR(o, 0.01, 1.0, warmup),
                                TLS.CosineAnnealingLR(o, T_max=total - warmup, eta_min=1e-4)], milestones=[warmup])


# Each builder takes (library, optimizer) and returns the schedulers to step, in order.
SINGLE = {
    "ConstantLR": lambda L, o: [L.m.ConstantLR(o, factor=0.5, total_iters=7)],
    "ConstantLR-defaults": lambda L, o: [L.m.ConstantLR(o)],
    "ConstantLR-zero-iters": lambda L, o: [L.m.ConstantLR(o, factor=0.25, total_iters=0)],
    "LinearLR": lambda L, o: [L.m.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=20)],
    "LinearLR-to-zero": lambda L, o: [L.m.LinearLR(o, start_factor=0.5, end_factor=0.0, total_iters=30)],
    "LinearLR-zero-iters": lambda L, o: [L.m.LinearLR(o, start_factor=0.25, total_iters=0)],
    "CosineAnnealingLR": lambda L, o: [L.m.CosineAnnealingLR(o, T_max=200, eta_min=1e-4)],
    "StepLR": lambda L, o: [L.m.StepLR(o, step_size=7, gamma=0.5)],
    "StepLR-growing": lambda L, o: [L.m.StepLR(o, step_size=10, gamma=1.5)],
    "ExponentialLR": lambda L, o: [L.m.ExponentialLR(o, gamma=0.95)],
    "SequentialLR": lambda L, o: [L.m.SequentialLR(o, [
        L.m.LinearLR(o, start_factor=0.1, total_iters=10), L.m.ExponentialLR(o, gamma=0.97),
        L.m.CosineAnnealingLR(o, T_max=200, eta_min=1e-4)], milestones=[10, 30])],
    "SequentialLR-into-step": lambda L, o: [L.m.SequentialLR(o, [
        L.m.ExponentialLR(o, gamma=0.9), L.m.StepLR(o, step_size=5, gamma=0.5)], milestones=[40])],
    # torch's closed form at the milestone gives the base lr here (factor + (epoch >= 0) * (1 - factor) = 1)
    "SequentialLR-into-constant-zero-iters": lambda L, o: [L.m.SequentialLR(o, [
        L.m.ExponentialLR(o, gamma=0.9), L.m.ConstantLR(o, factor=0.25, total_iters=0)], milestones=[30])],
    "warmup_cosine": lambda L, o: [_warmup_cosine(L, o, 10, 300)],
}
# Cosine schedules that pass a restart within STEPS (torch's restart step reads the base lrs).
RESTARTING = {
    "CosineAnnealingLR-restarts": lambda L, o: [L.m.CosineAnnealingLR(o, T_max=15, eta_min=1e-3)],
    "CosineAnnealingLR-T1": lambda L, o: [L.m.CosineAnnealingLR(o, T_max=1, eta_min=1e-4)],
    "warmup_cosine-past-its-end": lambda L, o: [_warmup_cosine(L, o, 5, 40)],
}
CHAINED = {
    "Exponential+Step": lambda L, o: [L.m.ExponentialLR(o, gamma=0.98), L.m.StepLR(o, step_size=25, gamma=0.5)],
    "Linear+Cosine": lambda L, o: [L.m.LinearLR(o, start_factor=0.1, total_iters=10),
                                   L.m.CosineAnnealingLR(o, T_max=40, eta_min=1e-4)],
    "Constant+Exponential": lambda L, o: [L.m.ConstantLR(o, factor=0.5, total_iters=15),
                                          L.m.ExponentialLR(o, gamma=0.99)],
    "Step+Linear": lambda L, o: [L.m.StepLR(o, step_size=9, gamma=0.7),
                                 L.m.LinearLR(o, start_factor=1.0, end_factor=0.2, total_iters=60)],
    "Cosine+Constant": lambda L, o: [L.m.CosineAnnealingLR(o, T_max=30), L.m.ConstantLR(o, factor=0.25, total_iters=12)],
    "Sequential+Exponential": lambda L, o: [
        L.m.SequentialLR(o, [L.m.ConstantLR(o, factor=0.5, total_iters=5), L.m.StepLR(o, step_size=10, gamma=0.5)],
                         milestones=[20]),
        L.m.ExponentialLR(o, gamma=0.99)],
}
EVERY = {**SINGLE, **RESTARTING, **CHAINED}


def _lrs(opt):
    return [g["lr"] for g in opt.param_groups]


def _run(lib, build, *, events=None, steps=STEPS, save_at=None, observe=_lrs, opt_args=()):
    """What `observe` reads of the groups (their lrs) after construction and each step; `lib.opt(*opt_args)` makes
    the optimizer. `events[i](lib, opt)` runs before step i + 1. With `save_at`, the run is checkpointed after that
    step and resumed on a fresh optimizer (other lrs) and fresh schedulers: their states loaded as a checkpoint
    restores them."""
    events = events or {}
    opt = lib.opt(*opt_args)
    scheds = build(lib, opt)
    seen = [observe(opt)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notes; nothing here depends on them
        for i in range(steps):
            if i in events:
                events[i](lib, opt)
            opt.step()
            for s in scheds:
                s.step()
            seen.append(observe(opt))
            if i + 1 == save_at:
                saved_opt, saved = lib.state(opt), [lib.state(s) for s in scheds]
                opt = lib.opt(*opt_args, lrs=(5.0, 7.0))  # everything must come from the state dicts
                for _ in range(len(saved_opt["param_groups"]) - len(opt.param_groups)):
                    opt.add_param_group({"params": [lib.param()], "lr": 9.0})
                scheds = build(lib, opt)
                opt.load_state_dict(saved_opt)
                for s, state in zip(scheds, saved):
                    s.load_state_dict(state)
    if len(scheds) == 1:  # what the scheduler reports is what the groups hold
        assert [float(x) for x in scheds[0].get_last_lr()] == _lrs(opt)
    return seen


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert len(a) == len(b), f"step {step}: {len(a)} groups vs torch's {len(b)}"
        bad = [(x, y) for x, y in zip(a, b) if not abs(x - y) <= 1e-12 * max(1.0, abs(y))]
        assert not bad, f"step {step}: lrs {a}, torch's {b}"


def _add_group(lr):
    def event(lib, opt):
        opt.add_param_group({"params": [lib.param()], "lr": lr})
    return event


def _set_lr(group, lr=None, times=None):
    def event(lib, opt):
        g = opt.param_groups[group]
        g["lr"] = lr if lr is not None else g["lr"] * times
    return event


# -- a param group added mid-run -------------------------------------------------------------------------------

# Regression (fixed): a group added under a running schedule got base_lr * factor(epoch) with its own lr as base
# lr (ExponentialLR(0.95) at epoch 50: 0.077x its lr on the next step); torch's step-based schedules continue from
# the lr the group has (0.95x). Now each step updates the group's current lr as torch's do.
@pytest.mark.parametrize("name", sorted(SINGLE) + sorted(set(CHAINED) - {"Cosine+Constant"}))
def test_a_group_added_mid_run_follows_torch(name):
    build = EVERY[name]
    events = {50: _add_group(0.05), 97: _add_group(0.2)}
    _assert_same(_run(OURS, build, events=events), _run(THEIRS, build, events=events))


def _torch_adopting(build, added_at, lr):
    """torch's run when a group of `lr` is added before step `added_at` + 1, with the group's lr appended to the
    base lrs of every scheduler (torch fails without it: it has no base lr for the group)."""
    def adopt(lib, opt):
        opt.add_param_group({"params": [lib.param()], "lr": lr, "initial_lr": lr})
        stack = list(scheds)
        while stack:
            s = stack.pop()
            if hasattr(s, "base_lrs"):  # torch's SequentialLR has none of its own
                s.base_lrs.append(lr)
            stack.extend(getattr(s, "_schedulers", []))

    scheds = []

    def build_and_keep(lib, opt):
        scheds[:] = build(lib, opt)
        return list(scheds)

    return _run(THEIRS, build_and_keep, events={added_at: adopt})


# Where torch needs a base lr for a group it has none for (it raises "zip() argument 2 is longer than argument 1"),
# the added group's base lr is its lr when added: a cosine restart and a SequentialLR milestone after the addition.
@pytest.mark.parametrize("name", sorted(RESTARTING) + ["Cosine+Constant", "SequentialLR", "SequentialLR-into-step"])
def test_a_group_added_before_a_step_that_needs_its_base_lr_takes_its_lr_as_base(name):
    added_at = 5 if name.startswith("SequentialLR") else 50
    ours = _run(OURS, EVERY[name], events={added_at: _add_group(0.05)})
    _assert_same(ours, _torch_adopting(EVERY[name], added_at, 0.05))


def test_exponential_lr_on_an_added_group_multiplies_its_lr_by_gamma():
    # The case as reported: ExponentialLR(0.95) at epoch 100; the group added then gets 0.95x its lr per step.
    opt = OURS.opt()
    sched = lr_scheduler.ExponentialLR(opt, gamma=0.95)
    for _ in range(100):
        sched.step()
    opt.add_param_group({"params": [OURS.param()], "lr": 0.04})
    sched.step()
    assert opt.param_groups[2]["lr"] == 0.04 * 0.95
    sched.step()
    assert opt.param_groups[2]["lr"] == 0.04 * 0.95 * 0.95


# -- an lr edited by hand between steps ------------------------------------------------------------------------

# Regression (fixed): the schedule overwrote a hand-set lr at its next step (closed form from the base lr); torch
# continues the schedule from the lr the group has.
@pytest.mark.parametrize("name", sorted(EVERY))
def test_an_lr_edited_by_hand_mid_run_follows_torch(name):
    events = {40: _set_lr(0, lr=0.07), 75: _set_lr(1, times=3.0)}
    _assert_same(_run(OURS, EVERY[name], events=events), _run(THEIRS, EVERY[name], events=events))


# -- two schedulers on one optimizer ---------------------------------------------------------------------------

# Regression (fixed): the second scheduler overwrote the first's lr (both closed form from the base lrs); torch
# chains them: each multiplies the lr the other left.
@pytest.mark.parametrize("name", sorted(CHAINED))
def test_two_schedulers_on_one_optimizer_chain_as_torchs(name):
    _assert_same(_run(OURS, CHAINED[name]), _run(THEIRS, CHAINED[name]))


# -- state_dict round trips mid-run ----------------------------------------------------------------------------

# Regression (fixed): a run resumed from its state dicts lost the hand edit (the closed form ignored it) where
# torch's resumed run continues from the lr the optimizer's state holds.
@pytest.mark.parametrize("name", sorted(EVERY))
def test_a_state_dict_round_trip_mid_run_follows_torch(name):
    events = {20: _set_lr(0, times=0.5)}
    if name in SINGLE or name in ("Exponential+Step", "Step+Linear"):
        events[45] = _add_group(0.05)  # a group added before the checkpoint: restored with the optimizer's state
    ours = _run(OURS, EVERY[name], events=events, save_at=60)
    _assert_same(ours, _run(THEIRS, EVERY[name], events=events, save_at=60))
    _assert_same(ours, _run(OURS, EVERY[name], events=events))  # the round trip changed nothing


# -- closed-form corners where torch itself fails --------------------------------------------------------------

def test_linear_lr_without_iterations_after_a_milestone_is_its_start_factor():
    # torch's closed form divides by total_iters there (ZeroDivisionError); its chainable form would hold
    # base_lr * start_factor from epoch 0, which is what a milestone gives here.
    opt = OURS.opt()
    sched = lr_scheduler.SequentialLR(opt, [lr_scheduler.ExponentialLR(opt, gamma=0.9),
                                            lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=0)],
                                      milestones=[3])
    for _ in range(6):
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == [lr * 0.25 for lr in LRS]



# Regression (fixed): a scheduler state saved with an optimizer of more groups loaded, and each later step failed
# with zip()'s "argument 2 is shorter than argument 1" (after optimizer.step(): the step half applied).
def test_a_state_with_more_base_lrs_than_groups_is_refused_when_loaded():
    source = OURS.opt(lrs=(0.1, 0.03, 0.2))
    state = lr_scheduler.StepLR(source, step_size=3).state_dict()
    opt = OURS.opt()
    sched = lr_scheduler.StepLR(opt, step_size=3)
    with pytest.raises(ValueError, match=r"3 base lrs but the optimizer has 2 param groups"):
        sched.load_state_dict(state)
    assert sched.base_lrs == list(LRS)  # nothing loaded
    sched.step()


# Regression (fixed): SequentialLR.load_state_dict loaded its own state and the inner schedulers' one by one, so a
# bad inner state (here the last) left the others loaded: the schedule then half the saved run's, half this one's.
def test_a_sequential_state_with_a_bad_inner_state_loads_nothing():
    source = OURS.opt()
    saved_sched = lr_scheduler.warmup_cosine(source, 2, 10)
    for _ in range(5):
        saved_sched.step()
    state = copy.deepcopy(saved_sched.state_dict())
    state["_schedulers"][-1]["not_a_cosine_key"] = 1
    opt = OURS.opt()
    sched = lr_scheduler.warmup_cosine(opt, 2, 10)
    sched.step()
    before = [copy.deepcopy(s.state_dict()) for s in (sched, *sched._schedulers)]
    with pytest.raises(ValueError, match=r"not_a_cosine_key"):
        sched.load_state_dict(state)
    assert [s.state_dict() for s in (sched, *sched._schedulers)] == before
    del state["_schedulers"][-1]["not_a_cosine_key"]
    sched.load_state_dict(state)  # the good state loads afterwards, every part of it
    assert sched.state_dict() == saved_sched.state_dict()
    # with the optimizer's state too (its lrs: the chainable steps go on from them, as in torch), the run goes
    # on as the saved one
    for group, saved_group in zip(opt.param_groups, source.param_groups):
        group["lr"] = saved_group["lr"]
    sched.step()
    saved_sched.step()
    assert sched.get_last_lr() == saved_sched.get_last_lr()
