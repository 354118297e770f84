"""Training under a real cgroup hard limit: the eager route's memory is bounded, so it is never killed."""

import json
import sys

import pytest

from tests.cgroup_harness import CgroupUnavailable, run_limited

MiB = 1 << 20


def _limited(cmd, limit):
    try:
        return run_limited(cmd, limit)
    except CgroupUnavailable as exc:
        pytest.skip(f"cannot hold the run to a real memory limit here: {exc}")


def test_the_harness_really_kills_a_process_over_its_limit():
    # Without this, a passing training run below would prove nothing about the limit.
    run = _limited([sys.executable, "-c", "import numpy as np; a = np.ones(300 << 20, np.uint8); print('survived')"],
                   150 * MiB)
    assert run.returncode != 0 and "survived" not in run.stdout
    assert run.oom_killed


def test_eager_training_runs_to_the_end_inside_a_hard_limit(tmp_path):
    summary = tmp_path / "summary.json"
    limit = 512 * MiB
    run = _limited([sys.executable, "-m", "tensorarena", "train", "--steps", "150", "--no-progress",
                    "--json", str(summary)], limit)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not run.oom_killed
    result = json.loads(summary.read_text())
    assert result["steps"] == 150 and result["final_loss"] < result["first_loss"]
    assert result["peak_rss_bytes"] < limit and run.peak_bytes <= limit  # the run's own peak (VmHWM)
