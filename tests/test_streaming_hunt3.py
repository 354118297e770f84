"""Third bug hunt on the streaming route (the report in /tmp/hunt/streaming/REPORT.md): a relative store_dir after
os.chdir(), the out-of-memory fallback and a run kept in store_dir, an out-of-memory that leaves a streamed step
partly applied, the fallback's redo running out of memory, micro-batch RNG snapshots, a store on tmpfs.

Every test uses a tiny ViT and a few small batches; an out-of-memory comes from a BlockPool budget, not a cgroup.

Before the fixes, N_FAIL of its N_TESTS tests failed on commit 8a56057 (each marked "Regression (fixed)"). To see it:
    git worktree add /tmp/old-hunt3 8a56057 && cp tests/test_streaming_hunt3.py /tmp/old-hunt3/tests/ && \\
        cd /tmp/old-hunt3 && python -m pytest -q -p no:cacheprovider tests/test_streaming_hunt3.py
"""

from __future__ import annotations

import json
import os

import numpy as np

from tensorarena import optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer


def _vit(seed=0, *, depth=2, dropout=0.0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=32, depth=depth, num_heads=4, dropout=dropout,
                    attention_dropout=dropout, dtype=np.float32)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _batches(n, batch=4, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 3, 16, 16)).astype(np.float32), rng.integers(0, 5, batch))
            for _ in range(n)]


def _trainer(route="streaming", seed=0, **options):
    model = _vit(seed)
    return Trainer(model, optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05), cross_entropy, route=route,
                   **options)


def _step_of(directory) -> int:
    return json.loads((directory / "manifest.json").read_text())["step"]


# -- 3: a relative store_dir -----------------------------------------------------------------------------------
def test_a_relative_store_dir_stays_the_directory_it_named_after_chdir(tmp_path, monkeypatch):
    """Regression (fixed): the store kept a relative store_dir as given and wrote its manifest by that path, so
    after os.chdir() trainer A's step was committed into trainer B's store of the same relative name (B's manifest
    went back to A's step; A's stayed behind its stage files)."""
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    batches = _batches(4)
    monkeypatch.chdir(tmp_path / "A")
    a = _trainer(store_dir="store")
    a.step(*batches[0])
    monkeypatch.chdir(tmp_path / "B")
    b = _trainer(seed=1, store_dir="store")
    for x, y in batches[:3]:
        b.step(x, y)
    a.step(*batches[1])
    assert (_step_of(tmp_path / "A" / "store"), _step_of(tmp_path / "B" / "store")) == (2, 3)
    assert os.path.isabs(a.store_dir) and str(a.stream.store.directory) == str(tmp_path / "A" / "store")
