"""Optimizer changes a PyTorch user makes mid-run, honoured on every route (a hunt of 2026-12-07).

Before: on the streaming route, optimizer.load_state_dict(a fresh optimizer's state dict), torch's way to reset
the moments, changed nothing (only parameters with loaded state were moved into the store); replacing
trainer.optimizer left the fused route stepping the old one; the fused route bypassed an optimizer subclass's
own step() (it runs update_flat), silently; AdamW.load_state_dict of an Adam state dict switched AdamW to L2
weight decay (torch keeps it decoupled). Run on the commit before the one that added this file (a worktree of it
first on PYTHONPATH), 4 of its 5 cases failed; the fused route's reset passed (it re-reads a loaded state).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorarena import optim
from tensorarena.compile.trace import UnsupportedOpError
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn import Parameter
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer


def _vit():
    cfg = ViTConfig(image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, num_heads=2, dtype=np.float64)
    return ViT(cfg, rng=np.random.default_rng(0))


def _batches(n=5):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((3, 3, 8, 8)), rng.integers(0, 5, 3)) for _ in range(n)]


def _run(route, tmp_path, change):
    """3 steps, `change(trainer, optimizer)`, 2 steps: (losses after the change, parameters, Adam step counts)."""
    model = _vit()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    trainer = Trainer(model, opt, cross_entropy, route=route,
                      store_dir=tmp_path / route if route == "streaming" else None)
    batches = _batches()
    for x, y in batches[:3]:
        trainer.step(x, y)
    change(trainer, opt)
    reports = [trainer.step(x, y) for x, y in batches[3:]]
    assert {r.route for r in reports} == {route}
    if trainer.stream is not None:
        trainer.stream.to_memory()
    opt = trainer.optimizer
    counts = sorted({float(s["step"]) for s in opt.state.values() if "step" in s})
    return [r.loss for r in reports], [p.data.copy() for p in model.parameters()], counts


def _reset(trainer, opt):
    opt.load_state_dict(optim.Adam(_vit().parameters(), lr=1e-2).state_dict())  # no state: moments start afresh


@pytest.mark.parametrize("route", ["fused", "streaming"])
def test_loading_a_fresh_optimizer_s_state_resets_the_moments_on_every_route(route, tmp_path):
    want_losses, want_params, want_counts = _run("eager", tmp_path, _reset)
    assert want_counts == [2.0]  # two steps since the reset
    losses, params, counts = _run(route, tmp_path, _reset)
    assert counts == want_counts
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    for got, want in zip(params, want_params):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _switch_to_sgd(trainer, opt):
    trainer.optimizer = optim.SGD(trainer.model.parameters(), lr=0.5, momentum=0.9)


def test_a_replaced_optimizer_is_the_one_the_fused_route_steps(tmp_path):
    want_losses, want_params, _ = _run("eager", tmp_path, _switch_to_sgd)
    losses, params, _ = _run("fused", tmp_path, _switch_to_sgd)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    for got, want in zip(params, want_params):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="cannot be replaced while it streams"):
        _run("streaming", tmp_path, _switch_to_sgd)


class _SkipsFirstUpdates(optim.AdamW):
    """A custom step(): the first two calls update nothing (a warm-up freeze)."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.calls = 0

    def step(self, closure=None):
        self.calls += 1
        if self.calls > 2:
            super().step(closure)


def test_an_optimizer_that_overrides_step_is_refused_by_the_fused_route_and_kept_by_its_fallback():
    x = np.random.default_rng(0).standard_normal((6, 5))
    y = np.array([0, 1, 2, 3, 0, 1])

    def trained(route, **kw):
        model = MLP(MLPConfig(5, (7,), 4, dtype=np.float64), rng=np.random.default_rng(0))
        opt = _SkipsFirstUpdates(model.parameters(), lr=0.1)
        trainer = Trainer(model, opt, cross_entropy, route=route, **kw)
        routes = [trainer.step(x, y).route for _ in range(4)]
        return routes, opt, [p.data.copy() for p in model.parameters()]

    with pytest.raises(UnsupportedOpError, match="_SkipsFirstUpdates overrides step\\(\\), which the fused route"):
        trained("fused")
    routes, opt, params = trained("fused", fallback_to_eager=True)
    want_routes, want_opt, want = trained("eager")
    assert routes == want_routes == ["eager"] * 4 and opt.calls == want_opt.calls == 4
    assert {float(s["step"]) for s in opt.state.values()} == {2.0}
    for got, expected in zip(params, want):
        np.testing.assert_array_equal(got, expected)


def test_adamw_keeps_decoupled_weight_decay_when_it_loads_an_adam_state_dict_as_torch():
    w0 = np.array([-0.2, -0.45, 0.3, -0.2])
    grads = [np.array([0.1, -0.3, 0.5, 0.05]) * (i + 1) for i in range(3)]
    p = Parameter(w0.copy())
    adam = optim.Adam([p], lr=0.1, weight_decay=0.5)
    adamw = optim.AdamW([p], lr=0.1, weight_decay=0.5)
    adamw.load_state_dict(adam.state_dict())
    tp = torch.nn.Parameter(torch.tensor(w0.copy()))
    tadamw = torch.optim.AdamW([tp], lr=0.1, weight_decay=0.5)
    tadamw.load_state_dict(torch.optim.Adam([tp], lr=0.1, weight_decay=0.5).state_dict())
    assert adamw.param_groups[0]["decoupled_weight_decay"] is True
    assert tadamw.param_groups[0]["decoupled_weight_decay"] is True
    for g in grads:
        p.grad = g.copy()
        adamw.step()
        tp.grad = torch.tensor(g)
        tadamw.step()
    np.testing.assert_allclose(p.data, tp.detach().numpy(), rtol=1e-12, atol=1e-14)
