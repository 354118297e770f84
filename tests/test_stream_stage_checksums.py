"""The streaming store's stage files carry checksums from close to open (stream/stage_checksums.py).

Before, a stage file changed between runs (3.0 written over a stage's weights) was trained on silently on resume.
Now a store closed by its process is sealed (each stage file's CRC32 in the manifest) and opening it checks them.
The rest of the file pins what the seal must not break or promise: a killed run opens unchecked with a warning,
the interpreter's exit seals a store nobody closed, a step drops the seal, a seal that cannot be written only warns,
and a temporary store its trainer's finalizer removed is not sealed (it warned of a missing .manifest.json.tmp
before 3831a6b's follow-up: that test fails without the directory check in ParamStore._seal_quietly).

On 745266e (before the seal) 6 of this file's first 6 tests fail: the damaged stage trains on (DID NOT RAISE), and the
others find no seal entry, no `sealed` attribute or no stage_checksums module:
    git worktree add /tmp/wt 745266e && cp tests/test_stream_stage_checksums.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_stream_stage_checksums.py)
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import StoreError, StreamingRoute

CFG = ViTConfig(image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, num_heads=2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _objects():
    model = ViT(CFG, rng=np.random.default_rng(0))
    return model, optim.AdamW(model.parameters(), lr=1e-2)


def _batch(i: int):
    rng = np.random.default_rng(i)
    return rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, 4)


def _train_and_close(store, steps=2) -> None:
    model, opt = _objects()
    with StreamingRoute.from_memory(model, opt, cross_entropy, store) as route:
        for i in range(steps):
            route.step(*_batch(i))


def _manifest(store) -> dict:
    return json.loads((store / "manifest.json").read_text())


def _resume(store) -> StreamingRoute:
    model, opt = _objects()
    return StreamingRoute.resume(model, opt, cross_entropy, store)


def test_a_stage_file_changed_after_close_is_refused_on_resume(tmp_path):
    store = tmp_path / "store"
    _train_and_close(store)
    stage = _manifest(store)["stages"][1]["file"]
    with open(store / stage, "r+b") as f:  # a stage's first weights overwritten, its size unchanged
        f.write(np.full(8, 3.0, np.float32).tobytes())
    with pytest.raises(StoreError, match=rf"damaged: {stage} \(stage .*CRC32 .*sealed .*Delete the directory"):
        _resume(store)


def test_a_closed_store_is_sealed_and_opens_checked(tmp_path, caplog):
    store = tmp_path / "store"
    _train_and_close(store)
    seal = _manifest(store)["seal"]
    assert seal["data_step"] == _manifest(store)["data_step"] and len(seal["crc32"]) == len(seal["files"]) > 1
    with caplog.at_level(logging.WARNING, logger="tensorarena"), _resume(store) as route:
        assert route.store.sealed
        route.step(*_batch(5))
        assert "seal" not in _manifest(store), "a step changed the stages: the old seal must go"
    assert not [r for r in caplog.records if "checksums" in r.getMessage()]
    assert _manifest(store)["seal"]["data_step"] == _manifest(store)["data_step"]  # sealed again at close


def test_to_memory_seals_the_store_it_leaves(tmp_path):
    store = tmp_path / "store"
    model, opt = _objects()
    route = StreamingRoute.from_memory(model, opt, cross_entropy, store)
    route.step(*_batch(0))
    route.to_memory()
    assert "seal" in _manifest(store)
    with _resume(store) as again:
        assert again.store.sealed


_NO_CLOSE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.environ["TA_ROOT"])
    from tests.test_stream_stage_checksums import _batch, _objects
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.stream import StreamingRoute
    model, opt = _objects()
    route = StreamingRoute.from_memory(model, opt, cross_entropy, sys.argv[1])
    route.step(*_batch(0))
    route.step(*_batch(1))
    if sys.argv[2] == "killed":
        os._exit(0)  # no atexit, no garbage collection: as a process killed between steps
""")


def _run_without_close(store, how: str) -> None:
    done = subprocess.run([sys.executable, "-c", _NO_CLOSE, str(store), how], capture_output=True, text=True,
                          env={**os.environ, "TA_ROOT": ROOT}, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_interpreter_exit_seals_a_store_nobody_closed(tmp_path):
    store = tmp_path / "store"
    _run_without_close(store, "exits")  # the route is still referenced from the script's globals at exit
    assert _manifest(store)["seal"]["data_step"] == 2
    with _resume(store) as route:
        assert route.store.sealed


def test_a_killed_run_opens_unchecked_and_says_so(tmp_path, caplog):
    store = tmp_path / "store"
    _run_without_close(store, "killed")
    assert "seal" not in _manifest(store)
    with caplog.at_level(logging.WARNING, logger="tensorarena"), _resume(store) as route:
        assert route.store.sealed is False
        assert route.step_count == 2
    assert any("not checked against checksums" in r.getMessage() for r in caplog.records)


def test_a_seal_that_cannot_be_written_leaves_the_store_usable(tmp_path, caplog, monkeypatch):
    from tensorarena.stream import stage_checksums

    def unreadable(fd, nbytes, path):
        raise OSError(5, "Input/output error", str(path))

    store = tmp_path / "store"
    model, opt = _objects()
    route = StreamingRoute.from_memory(model, opt, cross_entropy, store)
    route.step(*_batch(0))
    monkeypatch.setattr(stage_checksums, "file_crc32", unreadable)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        route.close()
    assert any("closed without checksums" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    with _resume(store) as again:
        assert again.store.sealed is False and again.step_count == 1


def test_a_temporary_store_removed_with_its_trainer_is_not_sealed_and_says_nothing(caplog):
    import gc
    import types

    from tensorarena.train.trainer import Trainer

    model, opt = _objects()
    trainer = Trainer(model, opt, cross_entropy, route="eager")
    trainer.step(*_batch(0))

    def out_of_memory(self, *args, **kwargs):  # once: the step moves to a temporary streaming store
        del model.head.forward
        raise MemoryError("injected")

    model.head.forward = types.MethodType(out_of_memory, model.head)
    trainer.step(*_batch(1))
    store = trainer.stream.store.directory
    assert trainer.route == "streaming" and store.is_dir()
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        del trainer, opt
        gc.collect()
    assert not store.exists()
    assert not [r for r in caplog.records if "checksums" in r.getMessage()]
