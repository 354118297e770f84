"""Resuming into objects that do not match what was saved: refused, and the refusal changes nothing (a helper's hunt).

1. A streaming store trained with ExponentialLR resumed under a StepLR trained on: the manifest kept the schedule's
   state but not its class, and ExponentialLR's keys are a subset of StepLR's (a schedule of neither run). Trainer.load
   of a checkpoint of the same run refused it. The manifest records the class now, and the state is checked first.
2. A streaming resume refused by the scheduler's load had already written the store's hyperparameters into the
   optimizer's param groups (lr, betas, OneCycleLR's keys): a caller reusing the optimizer trained with them.
3. Optimizer.load_state_dict took another optimizer's state: Adam loading SGD's kept its momentum_buffer and step
   count (its first update bias-corrected as a later step, from zero moments). torch fails such a load with a
   KeyError at its first step; ours refuses it at the load now, naming the keys.

On 745266e (before the fix) 4 of this file's 7 tests fail (the three controls pass: torch's SGD momentum state
loads, a state at step 0 without arrays loads, a setting given as a NumPy number loads; the last failed on
b27390f, a review finding):
    git worktree add /tmp/wt 745266e && cp tests/test_resume_mismatch_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_resume_mismatch_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn, optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import StoreError, StreamingRoute

CFG = ViTConfig(image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, num_heads=2)


def _batch(i: int):
    rng = np.random.default_rng(i)
    return rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, 4)


def _store_trained_with(store, make_scheduler) -> None:
    model = ViT(CFG, rng=np.random.default_rng(0))
    opt = optim.AdamW(model.parameters(), lr=3e-3, betas=(0.85, 0.99))
    with StreamingRoute.from_memory(model, opt, cross_entropy, store, scheduler=make_scheduler(opt)) as route:
        for i in range(3):
            route.step(*_batch(i))


def _groups(opt) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def test_a_store_resumed_under_another_scheduler_class_is_refused_and_nothing_changes(tmp_path):
    store = tmp_path / "store"
    _store_trained_with(store, lambda opt: optim.lr_scheduler.ExponentialLR(opt, gamma=0.9))
    model = ViT(CFG, rng=np.random.default_rng(1))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    before, sched_before = _groups(opt), sched.state_dict()
    with pytest.raises(StoreError, match="trained with a ExponentialLR schedule but this route was given a StepLR"):
        StreamingRoute.resume(model, opt, cross_entropy, store, scheduler=sched)
    assert _groups(opt) == before and sched.state_dict() == sched_before


class ExponentialLR(optim.lr_scheduler.ExponentialLR):
    """The store's schedule class (by name), whose next load changes the schedule and then fails."""
    failures = 0

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if type(self).failures:
            type(self).failures -= 1
            raise ValueError("this schedule's state does not load")


def test_a_scheduler_load_that_fails_puts_the_groups_back(tmp_path, monkeypatch):
    store = tmp_path / "store"
    _store_trained_with(store, lambda opt: optim.lr_scheduler.ExponentialLR(opt, gamma=0.9))
    model = ViT(CFG, rng=np.random.default_rng(1))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    sched = ExponentialLR(opt, gamma=0.5)
    before, sched_before = _groups(opt), sched.state_dict()
    monkeypatch.setattr(ExponentialLR, "failures", 1)
    with pytest.raises(ValueError, match="does not load"):
        StreamingRoute.resume(model, opt, cross_entropy, store, scheduler=sched)
    assert _groups(opt) == before
    assert sched.state_dict() == sched_before
    with StreamingRoute.resume(model, opt, cross_entropy, store, scheduler=sched) as route:  # the store is whole
        assert route.step_count == 3 and opt.param_groups[0]["betas"] == (0.85, 0.99)


def _stepped(make, steps=2):
    layer = nn.Linear(3, 2)
    opt = make(layer.parameters())
    for _ in range(steps):
        opt.zero_grad()
        (layer(ta.tensor(np.ones((4, 3), np.float32))) ** 2).sum().backward()
        opt.step()
    return opt


@pytest.mark.parametrize("source, match", [
    (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), r"keys \['momentum_buffer'\] that Adam does not keep"),
    (lambda ps: optim.SGD(ps, lr=0.1), r"no \[.exp_avg., .exp_avg_sq.\] although it is at step 2"),
])
def test_adam_refuses_an_sgd_state_dict(source, match):
    layer = nn.Linear(3, 2)
    adam = optim.Adam(layer.parameters(), lr=1e-2)
    before = _groups(adam)
    with pytest.raises(ValueError, match=match):
        adam.load_state_dict(_stepped(source).state_dict())
    assert _groups(adam) == before and not adam.state


def test_torch_sgd_momentum_state_loads():
    tlayer = torch.nn.Linear(3, 2)
    topt = torch.optim.SGD(tlayer.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        topt.zero_grad()
        tlayer(torch.ones(4, 3)).pow(2).sum().backward()
        topt.step()
    state = topt.state_dict()
    assert set(state["state"][0]) == {"momentum_buffer"}  # torch's SGD keeps no step count
    ours = optim.SGD(nn.Linear(3, 2).parameters(), lr=0.5, momentum=0.9)
    ours.load_state_dict({"state": state["state"], "param_groups": [
        {k: v for k, v in g.items() if k not in ("foreach", "differentiable", "fused")} for g in state["param_groups"]]})
    assert ours.param_groups[0]["lr"] == 0.1
    np.testing.assert_array_equal(ours.state[ours.param_groups[0]["params"][0]]["momentum_buffer"],
                                  state["state"][0]["momentum_buffer"].numpy())


def test_a_state_at_step_zero_without_arrays_loads():
    layer = nn.Linear(3, 2)
    adam = optim.Adam(layer.parameters(), lr=1e-2)
    saved = adam.state_dict()
    saved["state"] = {0: {"step": 0.0}}
    adam.load_state_dict(saved)
    assert float(adam.state[layer.weight]["step"]) == 0.0


def test_a_setting_given_as_a_numpy_number_still_loads_a_state_of_another_setting():
    # A review finding: _settings switched Python numbers only, so SGD state saved with momentum 0 loaded into a
    # group whose momentum was np.float32(0.9) was refused as another optimizer's.
    source = _stepped(lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9))
    saved = source.state_dict()
    saved["param_groups"][0]["momentum"] = np.float32(0.0)  # switched off by hand after two steps
    target = optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1, momentum=np.float32(0.9))
    target.load_state_dict(saved)
    assert "momentum_buffer" in target.state[target.param_groups[0]["params"][0]]
