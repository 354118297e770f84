"""`tensorarena plan` takes train's memory options, and train's reports and refusals: a helper agent's CLI hunt.

1. plan had no --hidden, --dtype, --momentum, --dropout, --matmul-precision, and named train's --batch-size
   --batch only: it could only plan the defaults (train --hidden 2048,2048 needed 269 MiB where plan could say
   191; --dtype float64 23% low; --optimizer sgd --momentum 0 12% high, its momentum buffer counted).
2. A run with --micro-batch not below the batch size (one pass, saved as no micro-batch) could not be resumed
   with its own command line, and the refusal advised `--micro-batch None`, which is no valid value.
3. --on-nonfinite skip skipped steps without a word: "trained ... for 4 steps" with 3 updating nothing.
4. --store-dir was taken for --model mlp, which never streamed then: ignored, leaving an empty directory (the MLP
   streams since Sequential.stream_stages, and its --store-dir is used).
5. Minor: plan's exit status when nothing fits, an unreadable --resume named twice.

Each command runs in a subprocess from a temporary directory, so PYTHONPATH (absolute) decides which tensorarena
runs. On 8de4784 (before the fix) 12 of this file's 12 tests fail (a resume with another --micro-batch was
refused there too, advising `--micro-batch None`; plan said nothing fits with status 0; an unreadable --resume
was named "not a readable tensorarena checkpoint" twice, one message wrapping the other):
    git worktree add /tmp/wt 8de4784 && cp tests/test_cli_plan_flags_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_cli_plan_flags_hunt.py)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MLP = ("--model", "mlp", "--batch-size", "64", "--train-size", "256", "--test-size", "32", "--steps", "2")


def _run(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tensorarena", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp, timeout=300)


def _json(tmp: Path, command: str, *argv: str) -> dict:
    out = tmp / f"{command}-{len(list(tmp.iterdir()))}.json"
    extra = ("--no-progress",) if command == "train" else ()
    done = _run(tmp, command, *argv, *extra, "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("flags", [
    ("--hidden", "1024,1024"),
    ("--dtype", "float64"),
    ("--optimizer", "sgd", "--momentum", "0"),
    ("--dropout", "0.2", "--activation", "gelu"),
    ("--matmul-precision", "bfloat16"),
], ids=["hidden", "float64", "sgd-no-momentum", "dropout-gelu", "bfloat16"])
def test_plan_takes_trains_memory_options_and_plans_alike(flags, tmp_path):
    planned = _json(tmp_path, "plan", *MLP, *flags, "--memory-limit", "16G")
    trained = _json(tmp_path, "train", *MLP, *flags, "--memory-limit", "16G")
    ours, theirs = planned["estimates"]["fused"], trained["route_plan_estimates"]["fused"]
    assert ours["parts"] == pytest.approx(theirs["parts"], rel=0.02), (ours["parts"], theirs["parts"])
    assert ours["required"] == pytest.approx(theirs["required"], rel=0.03)


def test_plan_refuses_options_the_model_or_optimizer_does_not_read(tmp_path):
    for argv, named in ((("--model", "vit-tiny", "--hidden", "64"), "--hidden"),
                        (("--model", "mlp", "--optimizer", "adam", "--momentum", "0.5"), "--momentum")):
        done = _run(tmp_path, "plan", *argv)
        assert done.returncode != 0 and f"{named} does not apply" in done.stderr and "Traceback" not in done.stderr


def test_a_one_pass_micro_batch_run_resumes_with_its_own_command_line(tmp_path):
    run = (*MLP[:-2], "--micro-batch", "64")  # the batch of 64 in one pass
    first = _run(tmp_path, "train", *run, "--steps", "2", "--total-steps", "4", "--save", "mb.st", "--no-progress")
    assert first.returncode == 0, first.stderr[-2000:]
    again = _run(tmp_path, "train", *run, "--steps", "4", "--resume", "mb.st", "--no-progress")
    assert again.returncode == 0, again.stderr[-2000:]


def test_another_micro_batch_on_resume_is_refused_with_advice_that_works(tmp_path):
    first = _run(tmp_path, "train", *MLP, "--total-steps", "4", "--save", "mb.st", "--no-progress")
    assert first.returncode == 0, first.stderr[-2000:]
    again = _run(tmp_path, "train", *MLP[:-1], "4", "--micro-batch", "8", "--resume", "mb.st", "--no-progress")
    assert again.returncode != 0 and "--micro-batch" in again.stderr
    assert "--micro-batch None" not in again.stderr


def test_skipped_steps_are_reported(tmp_path):
    argv = (*MLP[:-1], "4", "--lr", "1e30", "--on-nonfinite", "skip")
    summary = _json(tmp_path, "train", *argv)
    assert summary["skipped_steps"] == sum(loss is None for loss in summary["step_losses"]) >= 1
    text = _run(tmp_path, "train", *argv, "--no-progress").stdout
    assert f"skipped steps     {summary['skipped_steps']} of 4" in text


def test_store_dir_is_where_the_mlp_streams(tmp_path):
    # The MLP streams since Sequential.stream_stages, so --store-dir is no longer refused for it (item 4 above,
    # then: it was ignored). As for the ViT presets, the directory is made where route auto may stream.
    done = _run(tmp_path, "train", *MLP, "--store-dir", "sd/x", "--route", "streaming", "--no-progress")
    assert done.returncode == 0 and "on the streaming route" in done.stdout, done.stderr[-800:]
    assert len(list((tmp_path / "sd" / "x").iterdir())) > 1  # the stage files and the manifest


def test_plan_exits_1_when_nothing_fits_as_train_does(tmp_path):
    assert _run(tmp_path, "plan", "--model", "mlp", "--memory-limit", "1").returncode == 1
    assert _run(tmp_path, "plan", "--model", "mlp", "--memory-limit", "16G").returncode == 0  # control


def test_an_unreadable_resume_is_named_once(tmp_path):
    (tmp_path / "trunc.st").write_bytes(b"")
    done = _run(tmp_path, "train", *MLP, "--resume", "trunc.st", "--no-progress")
    assert done.returncode != 0 and done.stderr.count("is not a readable tensorarena checkpoint") == 1
