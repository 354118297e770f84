"""A streaming store on tmpfs is memory (stream/store_medium.py): the plan counts it, the store says so when it
opens, and a Trainer's temporary store goes to a disk where the temporary directory is tmpfs.

Regression (fixed): a hunt under a 96 MiB cgroup limit streamed a model into store_dir=/dev/shm/...; the plan said it
fit (the store counted as disk) and the kernel's OOM killer ended the run at its first step, nothing said before.
On 47dd783 all of these tests fail (plan_routes had no store_dir, nothing was counted or said):
    git worktree add /tmp/w/base 47dd783 && cp tests/test_store_on_tmpfs.py /tmp/w/base/tests/ && \\
        cd /tmp/w/base && python -m pytest -q -p no:cacheprovider tests/test_store_on_tmpfs.py
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.memory.budget import MemoryBudget
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream.store_medium import filesystem_type, in_memory_filesystem, temporary_store_parent
from tensorarena.train.route_plan import STORE_IN_MEMORY, plan_routes
from tensorarena.train.trainer import Trainer

SHM = "/dev/shm"
needs_shm = pytest.mark.skipif(in_memory_filesystem(SHM) is None, reason=f"{SHM} is not tmpfs on this machine")


def _on_disk(tmp_path) -> str:
    """A directory on a disk for the store, or a skip (a machine whose every writable directory is tmpfs)."""
    for where in (tmp_path, "/var/tmp", os.getcwd()):
        if in_memory_filesystem(where) is None and os.access(where, os.W_OK):
            return tempfile.mkdtemp(prefix="store-on-disk-", dir=where)
    pytest.skip("no writable directory on a disk here")


@pytest.fixture
def shm_dir():
    where = tempfile.mkdtemp(prefix="tensorarena-test-", dir=SHM)
    yield where
    import shutil
    shutil.rmtree(where, ignore_errors=True)


def _trainer(**options):
    # float64 AdamW at dim 128: a ~13 MiB store (parameters and two moments), large beside the step's activations.
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=128, depth=4, num_heads=4, dtype=np.float64)
    model = ViT(cfg, rng=np.random.default_rng(0))
    return Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, **options)


def _batch():
    rng = np.random.default_rng(1)
    return rng.standard_normal((2, 3, 16, 16)), rng.integers(0, 5, 2)


def _streaming_plan(trainer, store_dir, nbytes=1 << 40):
    x, y = _batch()
    return plan_routes(trainer.model, trainer.optimizer, trainer.loss_fn, x, y, MemoryBudget(nbytes, "test"),
                       routes=("streaming",), store_dir=store_dir)


@needs_shm
def test_the_filesystem_of_a_path_and_of_one_not_made_yet():
    assert filesystem_type(SHM) == "tmpfs"
    assert in_memory_filesystem(os.path.join(SHM, "not", "made", "yet")) == "tmpfs"
    assert filesystem_type("/proc") == "proc" and in_memory_filesystem("/proc") is None


@needs_shm
def test_the_plan_counts_a_store_on_tmpfs_as_memory_and_says_so(tmp_path, shm_dir):
    trainer = _trainer(route="streaming")
    on_disk = _streaming_plan(trainer, _on_disk(tmp_path)).estimates["streaming"]
    on_shm = _streaming_plan(trainer, shm_dir).estimates["streaming"]
    disk_bytes = _streaming_plan(trainer, shm_dir).details["streaming"]["disk_bytes"]
    assert disk_bytes > 10 << 20
    assert STORE_IN_MEMORY not in on_disk.parts and "on disk" in on_disk.note
    assert on_shm.parts[STORE_IN_MEMORY] == disk_bytes
    assert "in memory" in on_shm.note and shm_dir in on_shm.note and "store_dir on a disk" in on_shm.note
    # Everything else is the same plan (the process's share is measured anew each time, so only the parts).
    assert {k: v for k, v in on_shm.parts.items() if k != STORE_IN_MEMORY} == on_disk.parts


@needs_shm
def test_a_limit_that_fits_a_store_on_disk_refuses_one_on_tmpfs_before_step_1(tmp_path, shm_dir):
    x, y = _batch()
    disk = _on_disk(tmp_path)
    probe = _trainer(route="streaming")
    needed = _streaming_plan(probe, disk).estimates["streaming"].required
    disk_bytes = _streaming_plan(probe, disk).details["streaming"]["disk_bytes"]
    limit = needed + disk_bytes // 2  # room for the step, not for the store in memory besides
    fits = _trainer(route="auto", memory_limit=limit, store_dir=disk)
    assert fits.step(x, y).route == "streaming"
    refused = _trainer(route="auto", memory_limit=limit, store_dir=shm_dir)
    with pytest.raises(MemoryError, match="no training route fits") as err:
        refused.step(x, y)
    assert STORE_IN_MEMORY in str(err.value) and shm_dir in str(err.value)
    assert "or put streaming's store on a disk (store_dir)" in str(err.value).splitlines()[0]
    assert os.listdir(shm_dir) == []  # refused before the store was made


@needs_shm
def test_a_store_opened_on_tmpfs_says_its_files_are_memory(shm_dir, caplog):
    trainer = _trainer(route="streaming", store_dir=shm_dir)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        trainer.step(*_batch())
    said = [r.getMessage() for r in caplog.records if "is on tmpfs" in r.getMessage()]
    assert len(said) == 1 and shm_dir in said[0] and "store_dir on a disk" in said[0]


@needs_shm
def test_a_temporary_store_goes_to_a_disk_when_the_temporary_directory_is_tmpfs(tmp_path, shm_dir, monkeypatch):
    if in_memory_filesystem("/var/tmp") is not None or not os.access("/var/tmp", os.W_OK):
        pytest.skip("/var/tmp is not a writable disk here")
    monkeypatch.setattr(tempfile, "tempdir", shm_dir)
    assert temporary_store_parent() == "/var/tmp"
    trainer = _trainer(route="streaming")
    planned = trainer.plan(*_batch(), routes=("streaming",))
    assert STORE_IN_MEMORY not in planned.estimates["streaming"].parts
    trainer.step(*_batch())
    where = trainer.stream.store.directory
    assert str(where).startswith("/var/tmp/tensorarena-store-") and in_memory_filesystem(where) is None
    trainer.stream.close()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if in_memory_filesystem(tmp_path) is None:
        assert temporary_store_parent() == str(tmp_path)  # a disk: the temporary directory itself


@needs_shm
def test_plan_and_train_on_the_command_line_say_the_store_is_in_memory(shm_dir, capsys):
    from tensorarena import cli

    # Nothing fits 100M: the advice names the store in memory, in the command's words (--store-dir).
    args = ["--model", "vit-tiny", "--memory-limit", "100M", "--store-dir", shm_dir]
    with pytest.raises(SystemExit):
        cli.main(["plan", *args])
    table = capsys.readouterr().out
    assert f"{STORE_IN_MEMORY}" in table and f"({shm_dir} is on tmpfs; pass a store_dir on a disk)" in table
    with pytest.raises(SystemExit) as err:
        cli.main(["train", *args, "--steps", "1", "--no-progress", "--test-size", "8"])
    assert "or put streaming's store on a disk (--store-dir)" in str(err.value.code)
    assert os.listdir(shm_dir) == []
