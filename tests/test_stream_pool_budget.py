"""The streaming route under a user's budgeted BlockPool: its arenas' blocks fit the budget.

A streamed step's step and stage arenas each asked the pool for one reserved block of fixed size (32 and 64 MiB;
stream/arena_pages.py: only the pages an arena touches become resident, which the plan counts). Under
Trainer(pool=BlockPool(budget=...)) below 96 MiB every streamed step failed whatever it needed (a ViT whose step
needs 45 KiB refused at 45 MiB), and so did the out-of-memory fallback from eager or fused to streaming, whose
point is to train in less memory. arena_pages.block_sizes now takes the largest power of two up to those sizes
that leaves room for both arenas' blocks and two more within the budget.

On 8de4784 (before the fix) 3 of this file's 4 tests fail (block_sizes did not exist; route="streaming" at 45
MiB and the fallback at 64 MiB ran out of memory); the eager control passes on both:
    git worktree add /tmp/wt 8de4784 && cp tests/test_stream_pool_budget.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=. python -m pytest -q -p no:cacheprovider tests/test_stream_pool_budget.py)
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.memory.pool import BlockPool
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train import Trainer

MiB = 1 << 20


def test_block_sizes_fit_the_budget():
    from tensorarena.stream.arena_pages import STAGE_BLOCK_BYTES, STEP_BLOCK_BYTES, block_sizes

    assert block_sizes(BlockPool()) == (STEP_BLOCK_BYTES, STAGE_BLOCK_BYTES)  # no budget: the usual blocks
    assert block_sizes(BlockPool(budget=1 << 30)) == (STEP_BLOCK_BYTES, STAGE_BLOCK_BYTES)
    assert block_sizes(BlockPool(budget=45 * MiB)) == (8 * MiB, 8 * MiB)  # four of them fit in 45 MiB
    assert block_sizes(BlockPool(budget=2 * MiB)) == (MiB, MiB)  # never below the pool's smallest block


def _trainer(route: str, pool: BlockPool | None, tmp_path, config: ViTConfig) -> Trainer:
    model = ViT(config, rng=np.random.default_rng(0))
    return Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route, pool=pool,
                   store_dir=tmp_path / f"store-{route}-{id(pool)}", oom_fallback=True)


def _batch(rows: int, size: int):
    rng = np.random.default_rng(1)
    return rng.standard_normal((rows, 3, size, size)).astype(np.float32), rng.integers(0, 5, rows)


TINY = ViTConfig(image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, num_heads=2)


def test_the_streaming_route_trains_in_a_budgeted_pool(tmp_path):
    x, y = _batch(8, 8)
    streamed = _trainer("streaming", BlockPool(budget=45 * MiB), tmp_path, TINY)
    eager = _trainer("eager", None, tmp_path, TINY)
    for _ in range(3):
        assert streamed.step(x, y).loss == pytest.approx(eager.step(x, y).loss, rel=1e-6)
    assert streamed.route == "streaming"


SMALL = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=64, depth=4, num_heads=2)


def test_an_eager_step_out_of_a_budgeted_pool_goes_on_streaming(tmp_path):
    # batch 256: eager's arena needs ~64 MiB, a streamed step ~29 MiB
    x, y = _batch(256, 16)
    reference = _trainer("eager", None, tmp_path, SMALL)
    fallback = _trainer("eager", BlockPool(budget=64 * MiB), tmp_path, SMALL)
    assert fallback.step(x, y).loss == pytest.approx(reference.step(x, y).loss, rel=1e-6)  # the same step, redone
    assert fallback.route == "streaming" and fallback.route_switches[0]["from"] == "eager"
    assert fallback.step(x, y).loss == pytest.approx(reference.step(x, y).loss, rel=1e-5)


def test_eager_fits_a_budget_that_holds_its_arena(tmp_path):  # control: no switch where the step fits
    x, y = _batch(256, 16)
    trainer = _trainer("eager", BlockPool(budget=128 * MiB), tmp_path, SMALL)
    trainer.step(x, y)
    assert trainer.route == "eager" and not trainer.route_switches
