"""Third bug hunt on the streaming route (a helper's hunt under real memory cgroups): a relative store_dir after
os.chdir(), the out-of-memory fallback and a run kept in store_dir, an out-of-memory that leaves a streamed step
partly applied, and the fallback's redo running out of memory partway.

Every test uses a tiny ViT and a few small batches; an out-of-memory comes from a BlockPool budget, not a cgroup.

Before the fixes, 8 of its 9 tests failed on commit 8a56057 (each marked "Regression (fixed)"; the one that passed,
test_a_fallback_whose_redo_takes_lets_go_of_the_copy_in_memory, guards the fix of the redo). To see it:
    git worktree add /tmp/old-hunt3 8a56057 && cp tests/test_streaming_hunt3.py /tmp/old-hunt3/tests/ && \\
        cd /tmp/old-hunt3 && python -m pytest -q -p no:cacheprovider tests/test_streaming_hunt3.py
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.memory.pool import BlockPool
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


def _trainer(route="streaming", seed=0, *, depth=2, **options):
    model = _vit(seed, depth=depth)
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


# -- 4: the out-of-memory fallback and a run kept in store_dir ---------------------------------------------------
def _kept_run(directory, steps=2):
    """A streamed run of `steps` steps left in `directory` (closed, as a finished run leaves it)."""
    trainer = _trainer(store_dir=directory, seed=5)
    for x, y in _batches(steps):
        trainer.step(x, y)
    trainer.stream.close()


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_an_eager_or_fused_trainer_warns_of_a_store_dir_holding_a_run(tmp_path, route, caplog):
    """Regression (fixed): the store_dir of an eager or fused trainer only serves the out-of-memory fallback, which
    overwrote a run kept there without a word; said when the trainer is built (the fallback refuses it: below)."""
    _kept_run(tmp_path)
    caplog.set_level(logging.WARNING, logger="tensorarena")
    _trainer(route, store_dir=tmp_path)
    assert f"store_dir {tmp_path} holds a streamed run at step 2: the out-of-memory fallback" in caplog.text
    assert _step_of(tmp_path) == 2


@pytest.mark.parametrize("kept", ["before", "after"])
def test_the_fallback_refuses_a_run_kept_in_store_dir_and_changes_nothing(tmp_path, kept):
    """Regression (fixed): a run kept in store_dir (there when the trainer was built, or written there since) was
    replaced by the fallback (overwrite=True); now the out-of-memory step is refused before anything changes, naming
    the directory, and the trainer goes on on its route."""
    if kept == "before":
        _kept_run(tmp_path, steps=3)
    trainer = _trainer("eager", store_dir=tmp_path, pool=BlockPool(budget=4 << 20))
    small = _batches(2)
    trainer.step(*small[0])
    if kept == "after":
        _kept_run(tmp_path, steps=3)
    with pytest.raises(MemoryError, match=f"streaming fallback is not possible: store_dir {tmp_path} holds a "
                                          f"streamed run at step 3"):
        trainer.step(*_batches(1, batch=64, seed=4)[0])
    assert _step_of(tmp_path) == 3 and trainer.route == "eager" and trainer.stream is None
    assert trainer.step(*small[1]).step == 2


# -- 2: an out-of-memory that leaves a streamed step partly applied -------------------------------------------
def test_an_out_of_memory_that_leaves_a_streamed_step_partly_applied_says_so(tmp_path):
    """Regression (fixed): the Trainer raised a new MemoryError, "raise the memory limit or lower the batch size",
    whose message and notes did not say the step was partly applied (only its __cause__'s note did), and following
    its advice met the broken route's StoreError."""
    trainer = _trainer(store_dir=tmp_path, pool=BlockPool(budget=4 << 20))
    for x, y in _batches(2):
        trainer.step(x, y)
    with pytest.raises(MemoryError) as caught:
        trainer.step(*_batches(1, batch=64, seed=5)[0])
    assert trainer.stream._broken is not None  # the premise: some stages were updated before it ran out
    message = str(caught.value)
    assert "partly applied" in message and "two different steps" in message and "load the last checkpoint" in message
    assert "Do not train on" in message and "Raise the memory limit or lower the batch size" not in message
    with pytest.raises(Exception, match="partly applied"):  # what a step() after it meets
        trainer.step(*_batches(1)[0])


# -- 1: the fallback's redo runs out of memory too ------------------------------------------------------------
@pytest.mark.parametrize("store", ["given", "temporary"])
def test_a_fallback_whose_redo_runs_out_of_memory_partway_loses_nothing(tmp_path, monkeypatch, store):
    """Regression (fixed): the fallback moved the state into the store and let go of it in memory, then the redo ran
    out of memory after updating some stages in place: the route was broken and step(), save() and to_memory() all
    refused, losing every trained step. Now the state kept in memory comes back and the trainer goes on eager, as an
    eager run that never saw the big batch does."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where a temporary store goes (tempfile reads it once: below)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    where = tmp_path / "store" if store == "given" else None
    trainer = _trainer("eager", store_dir=where, pool=BlockPool(budget=4 << 20))
    reference = _trainer("eager")
    small = _batches(3)
    for x, y in small[:2]:
        assert trainer.step(x, y).loss == reference.step(x, y).loss
    with pytest.raises(MemoryError, match="and again when redone on the streaming route .* nothing was lost") as caught:
        trainer.step(*_batches(1, batch=64, seed=5)[0])
    assert "partly applied" in str(caught.value.__cause__)  # the premise: the redo changed stages before it ran out
    assert trainer.route == "eager" and trainer.stream is None and trainer.step_count == 2
    assert trainer.route_switches == []
    assert not list(tmp_path.glob("tensorarena-store-*")) and not (tmp_path / "store" / "manifest.json").exists()
    assert trainer.step(*small[2]).loss == reference.step(*small[2]).loss
    for p, q in zip(trainer.model.parameters(), reference.model.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


def test_a_fallback_whose_redo_takes_lets_go_of_the_copy_in_memory(tmp_path):
    """The redo keeps the state in memory too (release=False) only until it took: then the store holds it alone."""
    trainer = _trainer("eager", depth=8, store_dir=tmp_path, pool=BlockPool(budget=6 << 20))
    trainer.step(*_batches(1)[0])
    report = trainer.step(*_batches(1, batch=32, seed=5)[0])
    assert (report.route, trainer.route_switches[0]["to"]) == ("streaming", "streaming")
    assert trainer.stream.release and not trainer.stream._kept and not trainer.stream._kept_state
    assert _step_of(tmp_path) == 2
