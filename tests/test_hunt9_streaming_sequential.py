"""A defect hunt on the new streaming paths of nn.Sequential and the MLP (Sequential.stream_stages), as a user
hits them: Trainer(route="streaming") against the eager route, checkpoints across routes, `tensorarena train` and
`plan` for the mlp, under a memory limit.

What was found (each test below names its defect):
- `tensorarena train` resumed a streamed MLP run in memory: the model was built whole, and on route auto (the
  default) trainer.load() put the checkpoint's weights and Adam's moments beside it before the plan, whose
  streaming need then counted moving all of them into the store. A run that streamed at a --memory-limit could not
  resume at it ("nothing fits", or killed by a cgroup of that size while loading), as the README promises.

Fail-before count: FAILS of TESTS fail on 9a8b2dc (the base of this work):
    git archive 9a8b2dc | tar -x -C /tmp/hunt/hunt9/base && cd /tmp/hunt/hunt9/base && NUMBA_NUM_THREADS=1 \
        PYTHONPATH=/tmp/hunt/hunt9/base python -m pytest -q -p no:cacheprovider \
        /tmp/hunt/hunt9/wt/tests/test_hunt9_streaming_sequential.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MIB = 1 << 20


def _train(args: list[str], tmp_path, name: str, limit: int | None = None) -> dict:
    """`tensorarena train` for the mlp in a fresh process (its RSS is the run's alone); its JSON summary. Under a
    real memory cgroup of `limit` bytes where one can be made."""
    out = tmp_path / f"{name}.json"
    command = [sys.executable, "-m", "tensorarena", "train", "--no-progress", "--json", str(out), *args]
    if limit is None:
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        killed = False
    else:
        from tests.cgroup_harness import CgroupUnavailable, run_limited

        try:
            run = run_limited(command, limit)
            killed = run.oom_killed
        except CgroupUnavailable:
            run = subprocess.run(command, capture_output=True, text=True, timeout=300)
            killed = False
    assert run.returncode == 0 and not killed, (name, run.returncode, run.stderr[-2000:])
    return json.loads(out.read_text())


def _streaming_need(args: list[str]) -> int:
    """`tensorarena plan`'s streaming need for the mlp of `args` (with no limit to fit)."""
    run = subprocess.run([sys.executable, "-m", "tensorarena", "plan", "--model", "mlp", "--memory-limit", "64G",
                          "--json", "-", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.JSONDecoder().raw_decode(run.stdout)[0]["estimates"]["streaming"]["required"]


def test_a_streamed_mlp_run_resumes_on_route_auto_within_the_limit_it_streamed_at(tmp_path):
    # 13M parameters (50 MiB, Adam's moments 100 MiB more): fused needs ~90 MiB more than streaming. The first half
    # streams at the plan's streaming need + 5%, and the second half resumes at that limit. Before, the resumed
    # run loaded the checkpoint whole into memory and then planned moving 150 MiB of it into the store: nothing fit.
    hidden = ["--hidden", "2048,2048,2048,2048"]
    common = [*hidden, "--train-size", "256", "--test-size", "64", "--batch-size", "64"]
    limit = int(_streaming_need([*hidden, "--train-size", "256", "--test-size", "64", "--batch", "64"]) * 1.05)
    ckpt = tmp_path / "run.safetensors"
    first = _train([*common, "--memory-limit", str(limit), "--steps", "2", "--total-steps", "4", "--save",
                    str(ckpt)], tmp_path, "first", limit=limit)
    assert first["route"] == "streaming"
    resumed = _train([*hidden, "--test-size", "64", "--steps", "4", "--resume", str(ckpt), "--memory-limit", str(limit)], tmp_path, "resumed",
                     limit=limit)
    assert resumed["route"] == "streaming"
    assert resumed["peak_rss_bytes"] <= limit, (resumed["peak_rss_bytes"] / MIB, limit / MIB)
    whole = _train([*common, "--route", "streaming", "--steps", "4"], tmp_path, "whole")
    assert resumed["final_loss"] == pytest.approx(whole["final_loss"], rel=1e-6)
    assert resumed["test_loss"] == pytest.approx(whole["test_loss"], rel=1e-6)
