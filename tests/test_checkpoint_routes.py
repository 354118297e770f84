"""A checkpoint taken on any route resumes on any other, with the same trajectory as an unbroken run."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.checkpoint import read_metadata
from tensorarena.train.trainer import Trainer
from tests.test_fused import _batches, _max_param_diff, _vit

ROUTES = ["eager", "fused", "streaming"]


def _trainer(route, tmp_path, tag, seed=0):
    model = _vit(seed=seed)
    model.pos_drop.p = 0.1  # dropout: the RNG state must travel too
    opt = optim.AdamW(model.parameters(), lr=3e-3)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=3, total_steps=12)
    return model, Trainer(model, opt, cross_entropy, scheduler=sched, route=route, store_dir=tmp_path / tag)


@pytest.mark.parametrize("saved_on,resumed_on", list(itertools.product(ROUTES, ROUTES)))
def test_resume_across_routes_continues_the_same_run(saved_on, resumed_on, tmp_path):
    batches = _batches(4)
    straight_model, straight = _trainer("eager", tmp_path, "straight")
    expected = [straight.step(*batches[i % 4]).loss for i in range(12)]

    _, first = _trainer(saved_on, tmp_path, "first")
    losses = [first.step(*batches[i % 4]).loss for i in range(6)]
    first.save(tmp_path / "ckpt.safetensors", extra={"note": saved_on})
    assert read_metadata(tmp_path / "ckpt.safetensors")["step"] == 6

    model, second = _trainer(resumed_on, tmp_path, "second", seed=99)  # other init: the checkpoint must win
    assert second.load(tmp_path / "ckpt.safetensors") == {"note": saved_on}
    reports = [second.step(*batches[i % 4]) for i in range(6, 12)]
    assert {r.route for r in reports} == {resumed_on} and reports[-1].step == 12
    np.testing.assert_allclose(losses + [r.loss for r in reports], expected, rtol=1e-5, atol=1e-6)
    for trainer in (first, second):  # saving from / loading into a mapped store left no mapping behind
        if trainer.stream is not None:
            assert trainer.stream.store.late_unmaps == 0
    if second.stream is not None:
        second.stream.to_memory()
    assert _max_param_diff(model, straight_model) <= 1e-5
