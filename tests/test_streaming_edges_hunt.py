"""Streaming-route edges found by a hunt on 2026-12-06. Run against the commit before the one that added this file
(a worktree of it first on PYTHONPATH, StoreDirError read as ValueError), 5 of the 6 tests failed; the io="copy"
truncation case, which already named the file, is the control:
- a store_dir holding a run was resumed without a word: a new trainer's weights and learning rate were replaced by
  the store's (now a warning; refused when the trainer has a state of its own to lose, and by the command);
- a truncated stage file gave mmap's bare "mmap length is greater than file size" on io="map" (now the StoreError
  io="copy" gives, naming the file);
- optimizer.state_dict() while streaming returned an empty, valid-looking state (now refused, as reading a
  streamed parameter is).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from tensorarena import cli, optim
from tensorarena.memory.arena import StaleTensorError
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream.store_files import StoreError
from tensorarena.train import Trainer
from tensorarena.train.report import StoreDirError
from tensorarena.train.trainer_streaming import start_streaming


def _vit(seed=0) -> ViT:
    config = ViTConfig(image_size=8, patch_size=4, num_classes=3, dim=8, depth=2, num_heads=2, dtype=np.float64)
    return ViT(config, rng=np.random.default_rng(seed))


def _batch(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((3, 3, 8, 8)), rng.integers(0, 3, 3)


def _trainer(model, store_dir, lr=0.01, **kw) -> Trainer:
    return Trainer(model, optim.Adam(model.parameters(), lr=lr), cross_entropy, route="streaming",
                   store_dir=store_dir, **kw)


def test_a_store_holding_a_run_is_resumed_out_loud(tmp_path, caplog):
    first = _trainer(_vit(), tmp_path / "store")
    first.step(*_batch())
    first.stream.close()
    second = _trainer(_vit(seed=5), tmp_path / "store", lr=0.0)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        second.step(*_batch())
    assert "holds a run at step 1: resuming it" in caplog.text
    assert second.step_count == 2 and second.optimizer.param_groups[0]["lr"] == 0.01  # the store's, as said


def test_a_store_holding_a_run_is_refused_when_the_trainer_has_a_state_of_its_own(tmp_path):
    first = _trainer(_vit(), tmp_path / "store")
    first.step(*_batch())
    first.save(tmp_path / "one.st")
    first.step(*_batch())
    first.stream.close()
    # A trainer that loaded a checkpoint into memory (step 1) and then streams: route="auto" does this when its
    # plan picks streaming at step 1; start_streaming is what it calls then.
    model = _vit(seed=5)
    second = Trainer(model, optim.Adam(model.parameters(), lr=0.01), cross_entropy, route="eager",
                     store_dir=tmp_path / "store")
    second.load(tmp_path / "one.st")
    with pytest.raises(StoreDirError, match="holds a streamed run at step 2, and this trainer holds a state"):
        start_streaming(second)
    assert second.stream is None and second.step_count == 1  # nothing changed: it still holds the checkpoint
    # Loading a checkpoint on the streaming route opens the kept store to write the checkpoint into it: the
    # checkpoint's state is what trains on (the same loss as from an empty store_dir).
    losses = []
    for store in ("store", "empty"):
        trainer = _trainer(_vit(seed=5), tmp_path / store)
        trainer.load(tmp_path / "one.st")
        report = trainer.step(*_batch())
        assert report.step == 2
        losses.append(report.loss)
    assert losses[0] == losses[1]


def test_the_command_refuses_a_store_dir_holding_a_run(tmp_path):
    store = tmp_path / "store"
    base = ["train", "--model", "vit-tiny", "--image-size", "16", "--patch-size", "8", "--train-size", "16",
            "--test-size", "8", "--batch-size", "4", "--route", "streaming", "--store-dir", str(store), "--steps",
            "1", "--no-progress"]
    assert cli.main(base) == 0
    with pytest.raises(SystemExit, match="already holds a streamed run"):
        cli.main(base)


@pytest.mark.parametrize("io", ["map", "copy"])
def test_a_truncated_stage_file_is_a_store_error_naming_it(tmp_path, io):
    trainer = _trainer(_vit(), tmp_path / "store", stream_io=io)
    trainer.step(*_batch())
    stage = tmp_path / "store" / "stage-0001.bin"
    os.truncate(stage, 100)
    with pytest.raises(StoreError, match=r"stage-0001\.bin ended after 100 of \d+ bytes; the store was truncated"):
        trainer.step(*_batch())


def test_optimizer_state_dict_while_streaming_is_refused_and_whole_after_to_memory(tmp_path):
    model = _vit()
    trainer = _trainer(model, tmp_path / "store")
    for _ in range(2):
        trainer.step(*_batch())
    with pytest.raises(StaleTensorError, match="lives on disk.*to_memory"):
        trainer.optimizer.state_dict()
    trainer.stream.to_memory()
    streamed = trainer.optimizer.state_dict()["state"]
    eager_model = _vit()
    eager = Trainer(eager_model, optim.Adam(eager_model.parameters(), lr=0.01), cross_entropy, route="eager")
    for _ in range(2):
        eager.step(*_batch())
    reference = eager.optimizer.state_dict()["state"]
    assert set(streamed) == set(reference) and len(reference) == len(list(model.parameters()))
    for index, entry in reference.items():
        for key, value in entry.items():
            np.testing.assert_allclose(streamed[index][key], value, rtol=0, atol=1e-12, err_msg=f"{index} {key}")
