"""`tensorarena plan` and `tensorarena train` plan the same run alike (README: plan's options default to train's).

Measured 2026-12-01: `plan --model vit-tiny` said streaming needs 213 MiB, and `train --model vit-tiny --steps 3
--memory-limit 215M` refused ("the smallest, streaming, needs 239.66 MiB"); mlp's fused route was 181.5 MiB
in plan and 192.9 MiB in train. The route plan's "+ process, not params" is measured from RSS, and train had
drawn its data sets before planning while plan had drawn none. The data is now a part of its own, "training
data", counted by train from the arrays it holds and by plan from train's sizes, and left out of the measured
share; simcse's job plans before its probe forward (whose arena blocks sat in RSS) and plan holds the
tokenizer train holds.

Each command runs in a subprocess of its own (the share is that process's RSS), from a temporary directory so
that PYTHONPATH decides which tensorarena runs. On the base commit 35acfbe3c602a9df2458941a00b116b5a5f5b8d5, 7
of these 7 tests fail; checked with
    git -C /work/main worktree add /tmp/ta-base 35acfbe3c602a9df2458941a00b116b5a5f5b8d5
    PYTHONPATH=/tmp/ta-base NUMBA_NUM_THREADS=1 python -m pytest tests/test_plan_matches_train.py
    git -C /work/main worktree remove /tmp/ta-base
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

MIB = 1 << 20
LIMIT = ["--memory-limit", "16G"]  # every route fits: both plan fused and streaming, nothing else differs
# train's run of the default length (--total-steps: the schedule's and, for a vit, the data's size) stopped after
# one step; plan's defaults are that run's.
RUN_LENGTH = {"mlp": "400", "vit-tiny": "60", "simcse": "30"}
_cache: dict[str, tuple[dict, dict]] = {}


def _run(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tensorarena", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp, timeout=300)


def _plan(tmp: Path, *argv: str) -> dict:
    done = _run(tmp, "plan", *argv, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _train(tmp: Path, *argv: str) -> dict:
    out = tmp / f"summary-{len(list(tmp.iterdir()))}.json"
    done = _run(tmp, "train", *argv, "--no-progress", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def _both(model: str, tmp_path_factory) -> tuple[dict, dict]:
    """(plan --json, train's summary) for the model with default options, each run once per session."""
    if model == "simcse":
        pytest.importorskip("tokenizers")
        from tensorarena.text import locate_minilm

        try:
            locate_minilm()
        except FileNotFoundError as e:
            pytest.skip(str(e))
    if model not in _cache:
        tmp = tmp_path_factory.mktemp(model)
        plan = _plan(tmp, "--model", model, *LIMIT)
        train = _train(tmp, "--model", model, "--steps", "1", "--total-steps", RUN_LENGTH[model], *LIMIT)
        _cache[model] = (plan, train)
    return _cache[model]


def _train_estimates(train: dict) -> dict:
    # Regression (fixed): the summary had the plan as text only; it carries the estimates as plan --json does.
    estimates = train.get("route_plan_estimates")
    assert estimates, "train's summary carries no route plan estimates"
    return estimates


@pytest.mark.parametrize("model", ["mlp", "vit-tiny",
                                   pytest.param("simcse", marks=pytest.mark.heavy(seconds=35))])
def test_training_data_is_the_same_part_in_plan_and_train(model, tmp_path_factory):
    # Regression (fixed): the data train holds was hidden in the measured process share, and plan had none.
    plan, train = _both(model, tmp_path_factory)
    estimates = _train_estimates(train)
    # route auto plans fused and streaming before step 1 (the mlp too, since Sequential.stream_stages)
    assert set(estimates) == {"fused", "streaming"}
    data = {"mlp": (8000 + 2000) * (16 * 16 * 4 + 8),  # digits: 16x16 float32 + int64 label
            "vit-tiny": (60 * 32 + 2000) * (3 * 32 * 32 * 4 + 8)}.get(model)  # what 60 steps of 32 show once
    for route, est in estimates.items():
        held = est["parts"].get("training data")
        assert held == plan["estimates"][route]["parts"].get("training data"), route
        if data is not None:
            assert held == data, route
        else:  # simcse: the tokenized corpus, about a thousand sentences of 32 int64 ids
            assert 100_000 < held < 2 * MIB


@pytest.mark.parametrize("model", ["mlp", "vit-tiny", "simcse"])
def test_plan_and_train_need_the_same_memory(model, tmp_path_factory):
    # Regression (fixed): vit-tiny's plan was 46 MiB under train's on every route (its data), mlp's 11 MiB,
    # simcse's 68 MiB (its probe's arena blocks, planned after the probe) and then 18 MiB (its tokenizer).
    plan, train = _both(model, tmp_path_factory)
    for route, est in _train_estimates(train).items():
        ours = plan["estimates"][route]
        # The routes' parts are computed, not measured: the same bytes on both sides.
        assert ours["parts"] == est["parts"], route
        assert ours["total"] == est["total"], route
        # Only the rest of the process is measured, and differs a little (train's parser, loader, summary): on an
        # AMD EPYC within 4 MiB; on an Intel Xeon (MKL's products) mlp's train held 3.4 MiB more anonymous memory
        # after its traces than plan's, run after run, and 5.5 MiB more RSS in all (fails at 4 MiB on 59aa01a too).
        tolerance = max(0.02 * est["required"], 6 * MIB)
        assert abs(ours["required"] - est["required"]) <= tolerance, (
            f"{route}: plan needs {ours['required'] / MIB:.1f} MiB, train {est['required'] / MIB:.1f} MiB")


def test_the_reported_run_trains_within_what_plan_says(tmp_path):
    # Regression (fixed): plan said vit-tiny streams in 213 MiB; train --steps 3 --memory-limit 215M refused.
    # plan --steps 3 counts the data that run draws (96 training images); its streaming need, plus the stated
    # tolerance, is a limit the run trains within (on the streaming route: fused needs ~70 MiB more).
    plan = _plan(tmp_path, "--model", "vit-tiny", "--steps", "3", *LIMIT)
    need = plan["estimates"]["streaming"]["required"]
    assert plan["data_bytes"] == (96 + 2000) * (3 * 32 * 32 * 4 + 8)
    limit = math.ceil((need + 4 * MIB) / MIB)
    summary = _train(tmp_path, "--model", "vit-tiny", "--steps", "3", "--memory-limit", f"{limit}M")
    assert summary["route"] == "streaming"
    assert summary["steps"] == 3
