"""Scheduler set-ups that trained with a wrong learning rate without a word: now refused before anything changes.

Found by a helper's hunt of the LR schedulers against torch (the schedules themselves matched torch to 1e-12 over
41 configurations, 1740 ordered pairs and 1944 ReduceLROnPlateau settings):
- a SequentialLR nested as a later phase went on from its inner phase's epoch -1 at the milestone: lr -0.02,
  -0.002, -0.008 where the phase starts at 0.01 (torch raises NotImplementedError there); nested as the first
  phase it failed at construction with an empty NotImplementedError;
- Trainer(scheduler=StepLR(other_optimizer)) stepped the other optimizer's lr; the trained one stayed at 0.1.
  The same after trainer.optimizer = new: the old scheduler moved the old optimizer.

On e4167e7 (before the fixes) all five fail:
    git worktree add /tmp/wt e4167e7 && cp tests/test_schedulers_misuse_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_schedulers_misuse_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import nn, optim
from tensorarena.nn.functional import cross_entropy
from tensorarena.optim import lr_scheduler
from tensorarena.train.trainer import Trainer


def _optimizer(lr: float = 0.1):
    return optim.SGD([nn.Parameter(np.zeros(2, np.float32))], lr=lr)


@pytest.mark.parametrize("position", [0, 1], ids=["first_phase", "later_phase"])
def test_a_sequential_lr_inside_another_is_refused(position):
    opt = _optimizer()
    inner = lr_scheduler.SequentialLR(opt, [lr_scheduler.LinearLR(opt, 0.1, 1.0, 3),
                                            lr_scheduler.ExponentialLR(opt, 0.9)], [3])
    other = lr_scheduler.StepLR(opt, 5)
    phases = [inner, other] if position == 0 else [other, inner]
    with pytest.raises(ValueError, match="another SequentialLR: put its phases into this one"):
        lr_scheduler.SequentialLR(opt, phases, [8])


def _trainer_parts():
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(4, 3, rng=rng))
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 3, 6)
    return model, x, y


def test_a_scheduler_of_another_optimizer_is_refused():
    model, _, _ = _trainer_parts()
    opt = optim.SGD(model.parameters(), lr=0.1)
    elsewhere = lr_scheduler.StepLR(_optimizer(), 1, 0.5)
    with pytest.raises(ValueError, match="built on another optimizer"):
        Trainer(model, opt, cross_entropy, scheduler=elsewhere, route="eager")
    trainer = Trainer(model, opt, cross_entropy, route="eager")
    with pytest.raises(ValueError, match="built on another optimizer"):
        trainer.scheduler = elsewhere
    assert trainer.scheduler is None


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_a_replaced_optimizer_with_the_old_scheduler_is_refused_before_the_step(route):
    model, x, y = _trainer_parts()
    opt = optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, opt, cross_entropy, scheduler=lr_scheduler.StepLR(opt, 1, 0.5), route=route)
    trainer.step(x, y)
    new = optim.SGD(model.parameters(), lr=0.05)
    trainer.optimizer = new
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match="built on another optimizer"):
        trainer.step(x, y)
    assert trainer.step_count == 1
    for p, was in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, was)
    trainer.scheduler = lr_scheduler.StepLR(new, 1, 0.5)  # the fix the message gives
    trainer.step(x, y)
    assert new.param_groups[0]["lr"] == pytest.approx(0.025)


def test_a_scheduler_of_ones_own_without_an_optimizer_attribute_still_steps():
    # The check above reads scheduler.optimizer; a hand-written scheduler (step() only) has none and trained
    # before it: it must still (the review of this change found it refused, "built on another optimizer (NoneType").
    model, x, y = _trainer_parts()
    opt = optim.SGD(model.parameters(), lr=0.1)

    class Halving:
        def step(self):
            for group in opt.param_groups:
                group["lr"] *= 0.5

    trainer = Trainer(model, opt, cross_entropy, scheduler=Halving(), route="eager")
    trainer.step(x, y)
    trainer.step(x, y)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
