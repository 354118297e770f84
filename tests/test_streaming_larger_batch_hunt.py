"""A batch larger than step 1's is planned against memory_limit on the streaming route too (a helper's hunt).

Eager and fused re-plan such a batch before it runs (trainer_step._check_a_larger_batch); streaming did not, when
chosen or after the batch itself moved a fused step there: batch 30000 of a small ViT peaked at ~457 MiB under
memory_limit="260M" (in a 260M cgroup: killed). Trainer.plan could not trace once the parameters were on disk;
it traces them as zeros now, and leaves them out of the resident bytes (they counted as held, and the estimate
for a larger batch came out under the peak by the parameters' bytes).

On 745266e (before the fix) 3 of this file's 4 tests fail (the control passes: a larger batch that fits runs):
    git worktree add /tmp/wt 745266e && cp tests/test_streaming_larger_batch_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_streaming_larger_batch_hunt.py)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.memory.meter import rss_bytes
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ViTConfig(image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, num_heads=2)


def _batch(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, rows)


def _trainer(route: str, limit, tmp_path) -> Trainer:
    model = ViT(CFG, rng=np.random.default_rng(0))
    return Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route=route, memory_limit=limit,
                   store_dir=tmp_path / "store")


@pytest.mark.parametrize("route", ["streaming", "fused"])
def test_a_batch_no_route_fits_is_refused_before_it_runs(route, tmp_path):
    # 120 MiB over what this process holds now (a test worker holds more than a fresh process): batch 3 fits,
    # batch 30000 (~300 MiB of activations, traced) does not.
    trainer = _trainer(route, rss_bytes() + (120 << 20), tmp_path)
    trainer.step(*_batch(3, 1))
    with pytest.raises(MemoryError, match=r"route 'streaming' does not fit memory_limit: .*streaming, needs "
                                          r"[\d.]+ [MG]iB but the budget is [\d.]+ [MG]iB"):
        trainer.step(*_batch(30000, 2))
    assert trainer.step_count == 1
    assert trainer.step(*_batch(3, 3)).step == 2  # nothing was lost: it goes on with a batch that fits


def test_a_larger_batch_that_fits_runs_on_streaming(tmp_path):
    trainer = _trainer("streaming", "2G", tmp_path)
    trainer.step(*_batch(3, 1))
    assert trainer.step(*_batch(500, 2)).route == "streaming"


_MEASURE = textwrap.dedent("""
    import numpy as np
    from tensorarena import optim
    from tensorarena.memory.meter import peak_rss_bytes
    from tensorarena.models.vit import ViT, ViTConfig
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    model = ViT(ViTConfig(image_size=32, patch_size=4, num_classes=10, dim=256, depth=6, num_heads=4),
                rng=np.random.default_rng(0))  # 18 MiB of parameters, 36 more of AdamW state, all on disk
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="streaming",
                      memory_limit="4G")
    rng = np.random.default_rng(1)
    for rows in (2, 2):
        trainer.step(rng.standard_normal((rows, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, rows))
    big = rng.standard_normal((64, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 64)
    need = trainer.plan(*big, routes=("streaming",)).estimates["streaming"].required
    trainer.step(*big)
    print(need / peak_rss_bytes())
""")


def test_the_plan_of_a_larger_streaming_batch_covers_its_peak():
    done = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    ratio = float(done.stdout.split()[-1])
    assert 0.97 <= ratio < 1.10, f"the streaming plan for batch 64 is {ratio:.3f} of the step's peak RSS"
