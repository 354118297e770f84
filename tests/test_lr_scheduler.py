"""LR schedulers against torch.optim.lr_scheduler: lr sequences, state_dict, validation, with an optimizer."""

from __future__ import annotations

import json
import re
from functools import partial

import numpy as np
import pytest
import torch

from tensorarena import optim
from tensorarena.nn import Parameter
from tensorarena.optim import lr_scheduler

LRS = (0.1, 0.03)
STEPS = 60


def _optimizers(lrs=LRS):
    ours = optim.SGD([{"params": [Parameter(np.zeros(2))], "lr": lr} for lr in lrs])
    theirs = torch.optim.SGD([{"params": [torch.zeros(2, requires_grad=True)], "lr": lr} for lr in lrs])
    return ours, theirs


# Each builder takes (scheduler module, optimizer) and runs unchanged on both libraries.
BUILDERS = {
    "ConstantLR": lambda m, o: m.ConstantLR(o, factor=0.5, total_iters=7),
    "ConstantLR-constant": lambda m, o: m.ConstantLR(o, factor=1.0, total_iters=0),
    "ConstantLR-zero-iters": lambda m, o: m.ConstantLR(o, factor=0.25, total_iters=0),
    "LinearLR-defaults": lambda m, o: m.LinearLR(o),
    "LinearLR": lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=20),
    "LinearLR-decay-to-zero": lambda m, o: m.LinearLR(o, start_factor=0.5, end_factor=0.0, total_iters=30),
    "CosineAnnealingLR": lambda m, o: m.CosineAnnealingLR(o, T_max=20),  # 60 steps: past T_max, periodic
    "CosineAnnealingLR-eta_min": lambda m, o: m.CosineAnnealingLR(o, T_max=45, eta_min=1e-3),
    "CosineAnnealingLR-T1": lambda m, o: m.CosineAnnealingLR(o, T_max=1, eta_min=1e-4),
    "StepLR": lambda m, o: m.StepLR(o, step_size=7),
    "StepLR-every-step": lambda m, o: m.StepLR(o, step_size=1, gamma=0.9),
    "ExponentialLR": lambda m, o: m.ExponentialLR(o, gamma=0.95),
    "SequentialLR-three": lambda m, o: m.SequentialLR(o, [
        m.LinearLR(o, start_factor=0.1, total_iters=10),
        m.ConstantLR(o, factor=0.5, total_iters=5),
        m.CosineAnnealingLR(o, T_max=30, eta_min=1e-3)], milestones=[10, 25]),
    "SequentialLR-milestone-0": lambda m, o: m.SequentialLR(o, [
        m.ExponentialLR(o, gamma=0.5), m.StepLR(o, step_size=4, gamma=0.5)], milestones=[0]),
    "SequentialLR-exp-then-step": lambda m, o: m.SequentialLR(o, [
        m.ExponentialLR(o, gamma=0.9), m.StepLR(o, step_size=4, gamma=0.5)], milestones=[12]),
}


def _torch_warmup_cosine(o, warmup, total, start_factor, eta_min):
    s = torch.optim.lr_scheduler
    return s.SequentialLR(o, [s.LinearLR(o, start_factor=start_factor, end_factor=1.0, total_iters=warmup),
                              s.CosineAnnealingLR(o, T_max=total - warmup, eta_min=eta_min)], milestones=[warmup])


WARMUP_COSINE = [(10, 60, 0.01, 1e-5), (0, 40, 1e-3, 0.0), (1, 30, 0.5, 1e-3), (25, 50, 1e-3, 0.0)]


def _pairs():
    """(id, build ours, build torch's), each build taking an optimizer."""
    for name, build in BUILDERS.items():
        yield name, partial(build, lr_scheduler), partial(build, torch.optim.lr_scheduler)
    for w, t, sf, em in WARMUP_COSINE:
        yield (f"warmup_cosine-{w}-{t}",
               lambda o, w=w, t=t, sf=sf, em=em: lr_scheduler.warmup_cosine(o, w, t, start_factor=sf, eta_min=em),
               lambda o, w=w, t=t, sf=sf, em=em: _torch_warmup_cosine(o, w, t, sf, em))


PAIRS = list(_pairs())


def _assert_same(sched, tsched, opt, topt, where):
    ours, theirs = sched.get_last_lr(), [float(x) for x in tsched.get_last_lr()]
    assert np.max(np.abs(np.subtract(ours, theirs))) <= 1e-12, f"{where}: {ours} vs {theirs}"
    groups = [g["lr"] for g in opt.param_groups]
    tgroups = [g["lr"] for g in topt.param_groups]
    assert np.max(np.abs(np.subtract(groups, tgroups))) <= 1e-12, f"{where}: groups {groups} vs {tgroups}"


@pytest.mark.parametrize("name, ours_build, torch_build", PAIRS, ids=[p[0] for p in PAIRS])
def test_lr_sequence_matches_torch(name, ours_build, torch_build):
    opt, topt = _optimizers()
    sched, tsched = ours_build(opt), torch_build(topt)
    _assert_same(sched, tsched, opt, topt, "after construction")
    for step in range(STEPS):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        _assert_same(sched, tsched, opt, topt, f"step {step + 1}")
        assert sched.last_epoch == tsched.last_epoch


def test_warmup_cosine_shape():
    opt, _ = _optimizers(lrs=(1.0,))
    sched = lr_scheduler.warmup_cosine(opt, warmup_steps=4, total_steps=12, start_factor=0.25, eta_min=0.0)
    seq = [sched.get_last_lr()[0]]
    for _ in range(12):
        sched.step()
        seq.append(sched.get_last_lr()[0])
    assert seq[:5] == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1.0])
    assert all(a >= b for a, b in zip(seq[4:], seq[5:]))  # cosine decay after the warmup
    assert seq[12] == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("name, ours_build, torch_build", PAIRS, ids=[p[0] for p in PAIRS])
def test_state_dict_round_trip_through_json(name, ours_build, torch_build):
    opt, _ = _optimizers()
    sched = ours_build(opt)
    for _ in range(15):
        opt.step()
        sched.step()
    saved_sched = json.loads(json.dumps(sched.state_dict()))  # checkpoints keep scheduler state as JSON
    saved_opt = opt.state_dict()
    expected = []
    for _ in range(30):
        sched.step()
        expected.append(sched.get_last_lr())

    opt2, _ = _optimizers(lrs=(5.0, 7.0))  # different lrs: everything must come from the state dicts
    sched2 = ours_build(opt2)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    assert sched2.last_epoch == 15
    resumed = []
    for _ in range(30):
        sched2.step()
        resumed.append(sched2.get_last_lr())
    assert resumed == expected


def test_state_dict_excludes_the_optimizer_and_rejects_foreign_state():
    opt, _ = _optimizers()
    sched = lr_scheduler.StepLR(opt, step_size=3)
    state = sched.state_dict()
    assert "optimizer" not in state and state["last_epoch"] == 0 and state["base_lrs"] == list(LRS)
    with pytest.raises(ValueError, match="T_max"):
        sched.load_state_dict(lr_scheduler.CosineAnnealingLR(opt, T_max=3).state_dict())
    seq = lr_scheduler.warmup_cosine(opt, 2, 10)
    bad = seq.state_dict()
    bad["_schedulers"] = bad["_schedulers"][:1]
    with pytest.raises(ValueError, match="1 inner schedulers, this one has 2"):
        seq.load_state_dict(bad)


def test_get_last_lr_is_a_copy_and_get_lr_is_pure():
    opt, _ = _optimizers()
    sched = lr_scheduler.ExponentialLR(opt, gamma=0.5)
    sched.step()
    lrs = sched.get_last_lr()
    lrs[0] = 123.0
    assert sched.get_last_lr() == [0.05, 0.015]
    assert sched.get_lr() == [0.05, 0.015] and sched.last_epoch == 1


def test_resume_with_last_epoch_continues_the_closed_form():
    opt, _ = _optimizers()
    reference = lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    for _ in range(8):
        reference.step()
    resumed_opt, _ = _optimizers()
    for g in resumed_opt.param_groups:
        g["initial_lr"] = g["lr"]
    resumed = lr_scheduler.CosineAnnealingLR(resumed_opt, T_max=20, last_epoch=7)
    assert resumed.last_epoch == 8 and resumed.get_last_lr() == reference.get_last_lr()
    for _ in range(10):
        reference.step()
        resumed.step()
        assert resumed.get_last_lr() == reference.get_last_lr()
    fresh, _ = _optimizers()
    with pytest.raises(KeyError, match="initial_lr"):
        lr_scheduler.StepLR(fresh, step_size=2, last_epoch=3)


@pytest.mark.parametrize("build, bad", [
    (lambda o: lr_scheduler.ConstantLR(o, factor=1.5), "1.5"),
    (lambda o: lr_scheduler.ConstantLR(o, factor=0.5, total_iters=-1), "-1"),
    (lambda o: lr_scheduler.LinearLR(o, start_factor=0.0), "0.0"),
    (lambda o: lr_scheduler.LinearLR(o, end_factor=1.2), "1.2"),
    (lambda o: lr_scheduler.LinearLR(o, total_iters=2.5), "2.5"),
    (lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=0), "0"),
    (lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=10, eta_min=-1e-3), "-0.001"),
    (lambda o: lr_scheduler.StepLR(o, step_size=0), "0"),
    (lambda o: lr_scheduler.StepLR(o, step_size=3, gamma=-0.1), "-0.1"),
    (lambda o: lr_scheduler.ExponentialLR(o, gamma=float("nan")), "nan"),
    (lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.StepLR(o, 2)], milestones=[3]),
     "1 schedulers and 1 milestones [3]"),
    (lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.StepLR(o, 2)] * 3, milestones=[5, 5]), "[5, 5]"),
    (lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.StepLR(_optimizers()[0], 2)], milestones=[]),
     "different one"),
    (lambda o: lr_scheduler.SequentialLR(o, [], milestones=[]), "at least one scheduler"),
    (lambda o: lr_scheduler.warmup_cosine(o, warmup_steps=10, total_steps=10), "total_steps (10)"),
    (lambda o: lr_scheduler.warmup_cosine(o, warmup_steps=-1, total_steps=10), "-1"),
])
def test_invalid_arguments_raise_naming_the_value(build, bad):
    opt, _ = _optimizers()
    with pytest.raises(ValueError, match=re.escape(bad)):
        build(opt)


def test_scheduler_needs_an_optimizer():
    with pytest.raises(TypeError, match="not an Optimizer"):
        lr_scheduler.StepLR(object(), step_size=2)


# -- scheduler and optimizer together ------------------------------------------------------------

@pytest.mark.parametrize("make, tmake", [
    (lambda ps: optim.Adam(ps, lr=0.02, amsgrad=True),
     lambda ps: torch.optim.Adam(ps, lr=0.02, amsgrad=True, foreach=False)),
    (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=False)),
    (lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
     lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=False)),
], ids=["Adam+warmup_cosine", "SGD+warmup_cosine", "AdamW+warmup_cosine"])
def test_optimizer_with_scheduler_matches_torch(make, tmake):
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (8,)]
    arrays = [rng.standard_normal(s) for s in shapes]
    params = [Parameter(a, dtype=np.float64) for a in arrays]
    tparams = [torch.tensor(a, requires_grad=True) for a in arrays]
    opt, topt = make(params), tmake(tparams)
    sched = lr_scheduler.warmup_cosine(opt, warmup_steps=8, total_steps=50, start_factor=0.05, eta_min=1e-4)
    tsched = _torch_warmup_cosine(topt, 8, 50, 0.05, 1e-4)
    for step in range(50):
        for p, t in zip(params, tparams):
            g = rng.standard_normal(p.shape)
            p.grad = g.copy()
            t.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        diff = max(np.abs(p.data - t.detach().numpy()).max() for p, t in zip(params, tparams))
        assert diff <= 1e-10, f"step {step}: max |ours - torch| = {diff:.3g}"
        assert abs(opt.param_groups[0]["lr"] - topt.param_groups[0]["lr"]) <= 1e-12


def test_step_lr_with_sgd_matches_torch():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 4))
    p, t = Parameter(a, dtype=np.float64), torch.tensor(a, requires_grad=True)
    opt = optim.SGD([p], lr=0.2, momentum=0.5, weight_decay=0.01)
    topt = torch.optim.SGD([t], lr=0.2, momentum=0.5, weight_decay=0.01, foreach=False)
    sched = lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=5, gamma=0.5)
    for step in range(50):
        g = rng.standard_normal((4, 4))
        p.grad, t.grad = g.copy(), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert np.abs(p.data - t.detach().numpy()).max() <= 1e-10, f"step {step}"
