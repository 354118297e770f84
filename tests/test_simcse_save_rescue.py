"""simcse's --save (a model directory) on a disk that cannot take it: refused before step 1 where the free space is
too small, and a write that fails at the end (the disk filled during the run) goes to the temporary directory,
/var/tmp or the working directory, saying where, as the mlp and vit jobs' checkpoints do (left open last session:
the run trained, then the save failed into a traceback and every step was lost).

On 1baeffd all three tests fail (`git worktree add /tmp/w/base 1baeffd && cd /tmp/w/base && PYTHONPATH=/tmp/w/base
python -m pytest -q /work/main/tests/test_simcse_save_rescue.py`)."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tensorarena import cli
from tensorarena.train import simcse_job
from tests.test_cli_hunt2 import need_minilm, refused
from tests.test_cli_hunt3 import small_disk  # noqa: F401 - the fixture: a 600 KiB tmpfs (root only)

SIMCSE = ["train", "--model", "simcse", "--batch-size", "2", "--seq-len", "8", "--no-progress"]


def test_a_save_on_a_disk_too_small_is_refused_before_step_1(small_disk, capsys):  # noqa: F811
    need_minilm()
    msg = refused([*SIMCSE, "--steps", "1", "--save", str(small_disk / "model")], capsys)
    assert f"--save {small_disk / 'model' / 'model.safetensors'}: its disk has" in msg
    assert "the model directory takes about" in msg and "(the parameters)" in msg
    assert list(small_disk.iterdir()) == []


def _full_disk_at(monkeypatch, *targets: Path) -> None:
    real = simcse_job.save_model_dir

    def save_model_dir(encoder, source_dir, target):
        if Path(target) in targets:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(encoder, source_dir, target)

    monkeypatch.setattr(simcse_job, "save_model_dir", save_model_dir)


def test_a_save_that_fails_at_the_end_goes_elsewhere_and_says_where(tmp_path, monkeypatch, capsys):
    from tensorarena.models.bert import BertModel

    need_minilm()
    target = tmp_path / "model"
    _full_disk_at(monkeypatch, target)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))
    (tmp_path / "temporary").mkdir()
    msg = refused([*SIMCSE, "--steps", "2", "--save", str(target)], capsys)
    rescued = list((tmp_path / "temporary").glob("tensorarena-rescue-*-step2"))
    assert len(rescued) == 1 and f"the model directory of the 2 steps was saved to {rescued[0]} instead" in msg
    assert "No space left" in msg and "tensorarena embed --model-dir" in msg
    encoder = BertModel.from_pretrained(rescued[0])  # a whole model directory
    assert np.isfinite(encoder.state_dict()["embeddings.word_embeddings.weight"]).all()


def test_a_save_no_place_takes_says_the_model_is_lost(tmp_path, monkeypatch, capsys):
    need_minilm()
    target = tmp_path / "model"
    _full_disk_at(monkeypatch, target)
    monkeypatch.setattr(simcse_job, "write_or_rescue", _no_rescue_place(simcse_job.write_or_rescue))
    msg = refused([*SIMCSE, "--steps", "1", "--save", str(target)], capsys)
    assert "nor could the model directory of the 1 step be written to" in msg and "it is lost" in msg


def _no_rescue_place(real):
    """write_or_rescue whose every write fails: no disk anywhere has room."""
    def write_or_rescue(write, target, steps, **kw):
        def full(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(full, target, steps, **kw)
    return write_or_rescue
