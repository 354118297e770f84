"""Memory limits where they were read wrong or not at all (a hunt of 2026-12-07).

Before: a parent cgroup's limit was ignored (a child group with no limit of its own under a 400M parent got the
machine's free RAM as its budget, chose fused and was OOM-killed); a memory_limit was checked for step 1's batch
only (route auto's fused run planned for batch 8 in 300M took batch 64 to 325 MiB unsaid, and batch 256 in a 300M
cgroup was killed); "1e400" passed parsing and crashed printing the budget, "1e500000" took seconds, and "1GIB"
was refused where "1GiB" was read. Run on the commit before the one that added this file (a worktree of it first
on PYTHONPATH), all 8 of its cases failed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.memory.budget import cgroup_limit, parse_size
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train import trainer as trainer_module
from tensorarena.train.trainer import Trainer
from test_budget import _fake


def test_a_parent_cgroup_s_limit_holds_a_child_without_one_v2(tmp_path):
    paths = _fake(tmp_path, ["0::/jobs/run1"], {"jobs/memory.max": "419430400", "jobs/run1/memory.max": "max"})
    value, source = cgroup_limit(**paths)
    assert value == 400 << 20 and source.endswith("jobs/memory.max")


def test_the_smallest_limit_on_the_path_wins_v1(tmp_path):
    paths = _fake(tmp_path, ["4:memory:/a/b"], {"memory/a/memory.limit_in_bytes": "1073741824",
                                                "memory/a/b/memory.limit_in_bytes": "2147483648"})
    assert cgroup_limit(**paths)[0] == 1 << 30


@pytest.mark.parametrize("text", ["1e400", "1e500000", "9e99G"])
def test_a_size_beyond_any_machine_is_refused_at_once(text):
    with pytest.raises(ValueError, match="beyond any machine"):
        parse_size(text)


def test_a_binary_unit_in_capitals_is_read():
    assert parse_size("1GIB") == parse_size("1GiB") == parse_size("1gib") == 1 << 30


def _vit_trainer(**kw):
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, num_heads=2),
                rng=np.random.default_rng(0))
    return model, Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, **kw)


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, n)


def test_a_larger_batch_than_planned_is_planned_again(monkeypatch, tmp_path):
    checked = []
    real = trainer_module.check_the_limit
    monkeypatch.setattr(trainer_module, "check_the_limit",
                        lambda trainer, x, y: (checked.append(len(x)), real(trainer, x, y)))
    _, trainer = _vit_trainer(route="fused", memory_limit="16G", store_dir=tmp_path / "store")
    for n in (4, 4, 2, 8, 8, 6, 16):
        trainer.step(*_batch(n))
    assert checked == [4, 8, 16]  # step 1's batch, then each batch of more rows than any before it


def test_a_larger_batch_that_does_not_fit_moves_to_streaming_before_any_update(monkeypatch, tmp_path):
    model, trainer = _vit_trainer(route="fused", memory_limit="16G", store_dir=tmp_path / "store")
    trainer.step(*_batch(4))
    real = trainer_module.check_the_limit

    def refuse_more_than_4(trainer, x, y):
        if len(x) > 4 and trainer.route == "fused":  # (streaming, where the step moves, checks it again: it fits)
            raise MemoryError(f"route 'fused' does not fit memory_limit for a batch of {len(x)} (test)")
        return real(trainer, x, y)

    monkeypatch.setattr(trainer_module, "check_the_limit", refuse_more_than_4)
    report = trainer.step(*_batch(32, seed=1))
    assert report.route == "streaming" and report.step == 2
    assert trainer.route_switches[0]["from"] == "fused" and "batch of 32" in trainer.route_switches[0]["error"]
