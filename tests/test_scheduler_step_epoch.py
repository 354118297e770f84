"""scheduler.step(epoch) (torch's deprecated form, in its docs for CosineAnnealingWarmRestarts per batch) and
step(val_loss) passed to the wrong scheduler get an error saying what to call, and change nothing.

On 8a56057 (`python -m pytest -q tests/test_scheduler_step_epoch.py` from a worktree of it, with an absolute
PYTHONPATH) 15 of 15 fail: Python's "step() takes 1 positional argument but 2 were given".
"""

from __future__ import annotations

import pytest

import tensorarena as ta
from tensorarena.optim import lr_scheduler as sched

SCHEDULERS = {
    "LambdaLR": lambda o: sched.LambdaLR(o, lambda e: 0.9 ** e),
    "MultiplicativeLR": lambda o: sched.MultiplicativeLR(o, lambda e: 0.9),
    "StepLR": lambda o: sched.StepLR(o, 3),
    "MultiStepLR": lambda o: sched.MultiStepLR(o, [2, 4]),
    "ConstantLR": lambda o: sched.ConstantLR(o),
    "LinearLR": lambda o: sched.LinearLR(o),
    "ExponentialLR": lambda o: sched.ExponentialLR(o, 0.9),
    "PolynomialLR": lambda o: sched.PolynomialLR(o),
    "CosineAnnealingLR": lambda o: sched.CosineAnnealingLR(o, 10),
    "CosineAnnealingWarmRestarts": lambda o: sched.CosineAnnealingWarmRestarts(o, 5),
    "OneCycleLR": lambda o: sched.OneCycleLR(o, 1.0, total_steps=10),
    "CyclicLR": lambda o: sched.CyclicLR(o, 0.01, 0.1),
    "SequentialLR": lambda o: sched.SequentialLR(o, [sched.ConstantLR(o), sched.ExponentialLR(o, 0.9)], [3]),
    "ChainedScheduler": lambda o: sched.ChainedScheduler([sched.ConstantLR(o), sched.ExponentialLR(o, 0.9)]),
    "warmup_cosine": lambda o: sched.warmup_cosine(o, warmup_steps=2, total_steps=10),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_step_with_an_epoch_says_what_to_call_and_changes_nothing(name):
    opt = ta.optim.SGD([ta.tensor([1.0], requires_grad=True)], lr=0.1, momentum=0.9)
    scheduler = SCHEDULERS[name](opt)
    scheduler.step()
    lr, state = opt.param_groups[0]["lr"], scheduler.state_dict()
    with pytest.raises(TypeError, match=r"step\(\) takes no epoch or metric \(got 1\.5\).*call step\(\) once per "
                                        r"step.*ReduceLROnPlateau\.step\(val_loss\)"):
        scheduler.step(1.5)
    assert opt.param_groups[0]["lr"] == lr
    assert repr(scheduler.state_dict()) == repr(state)
