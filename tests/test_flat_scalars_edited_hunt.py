"""A per-parameter optimizer scalar edited in place between fused steps with flat gradients (a helper's hunt).

A torch user restarts one parameter's bias correction with opt.state[p]["step"].fill_(0); ours is
opt.state[p]["step"][...] = 0. Eager and the fused route's update inside backward followed it; with flat gradients
(update_in_backward=False, clip_grad_norm, micro_batch) the group's one kernel gave every parameter parameter 0's
count (parameter 0 edited) or overwrote the edit (any other), silently: 0.019 from torch after 10 Adam steps. The
layout's check before each step (FlatState.stale) trusted a flag set when the arrays were bound, and an edit in
place keeps them bound; it looks at the values now, and a group whose counts came apart is laid out again.

On 745266e (before the fix) 8 of this file's 10 tests fail (the two eager controls pass):
    git worktree add /tmp/wt 745266e && cp tests/test_flat_scalars_edited_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_flat_scalars_edited_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorarena import optim
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

RNG = np.random.default_rng(2)
BATCHES = [(x, x[:, :4].argmax(1)) for x in (RNG.standard_normal((16, 12)) for _ in range(4))]
STEPS, EDIT_AT = 10, 5


def _model() -> MLP:
    return MLP(MLPConfig(in_features=12, hidden=(16,), out_features=4, dtype=np.float64), rng=np.random.default_rng(0))


def _ours(make, edited: int, route: str, **options) -> list[np.ndarray]:
    model = _model()
    params = list(model.parameters())
    opt = make(params)
    trainer = Trainer(model, opt, cross_entropy, route=route, **options)
    for i in range(STEPS):
        if i == EDIT_AT:
            opt.state[params[edited]]["step"][...] = 0.0
        trainer.step(*BATCHES[i % 4])
    return [p.data.copy() for p in params]


def _torch_adam(edited: int) -> list[np.ndarray]:
    model = _model()
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    net.load_state_dict({k.replace("net.", ""): torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    params = list(net.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    for i in range(STEPS):
        if i == EDIT_AT:
            opt.state[params[edited]]["step"].fill_(0.0)
        x, y = BATCHES[i % 4]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in params]


FLAT_GRADS = {"eager": ("eager", {}),
              "python, no update in backward": ("fused", {"fused_replay": "python", "update_in_backward": False}),
              "captured, no update in backward": ("fused", {"fused_replay": "captured", "update_in_backward": False}),
              "captured, clip_grad_norm": ("fused", {"fused_replay": "captured", "clip_grad_norm": 1e9}),
              "python, micro_batch": ("fused", {"fused_replay": "python", "micro_batch": 16})}


@pytest.mark.parametrize("edited", [0, 1])
@pytest.mark.parametrize("form", list(FLAT_GRADS))
def test_adam_follows_a_step_count_edited_in_place_as_torch(form, edited):
    route, options = FLAT_GRADS[form]
    got = _ours(lambda ps: optim.Adam(ps, lr=1e-2), edited, route, **options)
    for ours, theirs in zip(got, _torch_adam(edited)):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-10)
