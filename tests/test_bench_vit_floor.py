"""bench/vit_floor.py's recording of a fused step's kernel calls, on a small ViT.

The recording watches a Python replay, whose liveness check (compile/step_plan.previous_occupants)
refuses a step that still holds a plan view when the plan hands its bytes on. A recording that kept
the views tripped it (PlanMismatchError "this step still holds buffer #49 ..."): the bench had
been broken since that check landed (19d8d37) and no test ran it. Without _SameBytes,
test_a_python_replay_step_is_recorded_whole fails with that RuntimeError (checked by keeping the
views in record_calls' watcher: `git stash push bench/vit_floor.py`).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from tensorarena import kernels, optim
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from vit_floor import kernels_replay, record_calls, record_products  # noqa: E402


def _trainer_and_batch():
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, num_heads=4)
    model = ViT(cfg, rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay="python")
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    ys = rng.integers(0, 10, size=4)
    trainer.step(xs, ys)
    return trainer, xs, ys


def test_a_python_replay_step_is_recorded_whole():
    trainer, xs, ys = _trainer_and_batch()
    before = kernels.calls[("fused_replay", "python")]
    tape = record_calls(trainer, xs, ys)
    assert kernels.calls[("fused_replay", "python")] == before + 2  # the re-trace under watchers, then the replay
    names = [name for name, *_ in tape]
    # 2 blocks: 4 linears each, a forward and two backward products (the head and patch embedding add more)
    assert names.count("gemm") >= 2 * 4 * 3
    # one fused AdamW call per parameter; 2 LayerNorms per block and the final one, forward and backward
    assert names.count("adam") == len(list(trainer.model.parameters()))
    assert names.count("layer_norm_forward") == names.count("layer_norm_backward") == 2 * 2 + 1
    assert names.count("attention_forward") == names.count("attention_backward") == 2
    slab = trainer.fused.plan.slab
    # the recorded views are the plan's own bytes again, not copies
    outs = [args[2].again() for name, _, args, _ in tape if name == "gemm" and hasattr(args[2], "again")]
    assert outs and any(np.shares_memory(out, slab) for out in outs)
    replay = kernels_replay(tape)
    replay()
    assert all(np.isfinite(out).all() for out in outs)


def test_products_come_back_as_arrays_of_the_recorded_layouts():
    trainer, xs, ys = _trainer_and_batch()
    seen = record_products(trainer, xs, ys)
    assert seen["gemm"] and seen["attention_forward"] and seen["attention_backward"]
    for args, _ in seen["gemm"]:
        a, b, out = args[:3]
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and isinstance(out, np.ndarray)
        assert out.shape == (a.shape[0], b.shape[1]) and a.shape[1] == b.shape[0]


def test_the_kernel_breakdown_counts_every_recorded_call_by_kernel():
    from vit_floor import kernel_breakdown

    trainer, xs, ys = _trainer_and_batch()
    tape = record_calls(trainer, xs, ys)
    replay = kernels_replay(tape)
    breakdown = kernel_breakdown(replay.named_calls, replays=2)
    names = [name for name, *_ in tape]
    assert {name: calls for name, (calls, _) in breakdown.items()} == {name: names.count(name) for name in set(names)}
    spent = [seconds for _, seconds in breakdown.values()]
    assert all(s > 0 for s in spent) and spent == sorted(spent, reverse=True)  # biggest first
