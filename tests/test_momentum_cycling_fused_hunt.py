"""A momentum schedule that passes through 0 keeps the momentum buffer laid out, and the fused step traced once.

Found by a helper's hunt of the LR schedulers: SGD(momentum=0.9) under CyclicLR(base_momentum=0.0) laid the flat
state out again and traced the step at every crossing of 0 (7 traces in 20 steps of one batch shape; OneCycleLR
base_momentum=0: 3), because SGD.state_init asks for a buffer only while the momentum is not 0 and FlatState.stale
compared those kinds each step. torch keeps the buffer while the momentum is 0 and goes on from it after; so do
both routes here (5.6e-17 from torch over 20 float64 steps).

On e4167e7 (before the fix) test_cycling_momentum_through_zero_traces_once fails (7 traces); the torch
comparison passes there too (the numbers were right, the retraces were the defect):
    git worktree add /tmp/wt e4167e7 && cp tests/test_momentum_cycling_fused_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_momentum_cycling_fused_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorarena import nn, optim
from tensorarena.nn.functional import cross_entropy
from tensorarena.optim import lr_scheduler
from tensorarena.train.trainer import Trainer

_RNG = np.random.default_rng(1)
BATCHES = [(_RNG.standard_normal((6, 5)), _RNG.integers(0, 3, 6)) for _ in range(5)]
CYCLE = dict(base_lr=0.01, max_lr=0.1, step_size_up=3, base_momentum=0.0, max_momentum=0.9)


def _model():
    return nn.Sequential(nn.Linear(5, 4, rng=np.random.default_rng(0), dtype=np.float64), nn.ReLU(),
                         nn.Linear(4, 3, rng=np.random.default_rng(1), dtype=np.float64))


def _ours(route: str):
    model = _model()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = Trainer(model, opt, cross_entropy, scheduler=lr_scheduler.CyclicLR(opt, **CYCLE), route=route)
    for i in range(20):
        trainer.step(*BATCHES[i % 5])
    return model, trainer


def test_cycling_momentum_through_zero_traces_once():
    _, trainer = _ours("fused")
    assert trainer.fused.traces == 1
    assert trainer.fused.layouts == 1  # the first, never laid out again


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_cycling_momentum_through_zero_matches_torch(route):
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)).double()
    net.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in _model().state_dict().items()})
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, **CYCLE)
    for i in range(20):
        x, y = BATCHES[i % 5]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(torch.tensor(x)), torch.tensor(y)).backward()
        opt.step()
        sched.step()
    model, _ = _ours(route)
    got = model.state_dict()
    for name, value in net.state_dict().items():
        np.testing.assert_allclose(np.asarray(got[name]), value.numpy(), rtol=0, atol=1e-12, err_msg=name)
