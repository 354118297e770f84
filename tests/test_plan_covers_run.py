"""The fused route's planned need is an upper bound of the whole `tensorarena train` run's peak RSS.

The promise: before step 1 the user is told what the run needs, and the process stays under it: the steps, the
held-out evaluation (mlp, vit) or the probe forwards (simcse), not only the steps. bench/budget_sweep.py found
two runs over their plan inside a real cgroup (mlp: evaluation at 1024 rows in an arena beside the fused slab;
simcse: the probe's ~41 MiB of pool blocks left cached beside the slab all run). Each run here is a subprocess of
its own (peak RSS is that process's VmHWM), from a temporary directory so that PYTHONPATH decides which
tensorarena runs; the need is the fused estimate's `required` in the same run's summary (route auto, which plans
before step 1 and takes fused under a 16G limit).

On the base commit d0c9eb9f2f79b747c26729e48c6bbd8b1d0a4573, 3 of these 4 tests fail (mlp 3.9% over its need
there, simcse 4.2%, and the evaluation takes a pool block; vit-tiny passed the 1% bound already); checked with
    git -C /work/main worktree add /tmp/wt-evalmem d0c9eb9f2f79b747c26729e48c6bbd8b1d0a4573
    cp tests/test_plan_covers_run.py /tmp/wt-evalmem/tests/ && cd /tmp/wt-evalmem
    PYTHONPATH=/tmp/wt-evalmem python -m pytest -q -p no:cacheprovider tests/test_plan_covers_run.py
    git -C /work/main worktree remove --force /tmp/wt-evalmem
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MIB = 1 << 20
TOLERANCE = 1.01  # the plan's "+ process, not params" is measured before step 1; what step 1 adds is within this


def _train(tmp: Path, model: str, *extra: str) -> dict:
    out = tmp / "summary.json"
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tensorarena", "train", "--model", model, "--steps", "3",
                           "--memory-limit", "16G", "--no-progress", "--json", str(out), *extra],
                          capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def _need_and_peak(summary: dict) -> tuple[int, int]:
    assert summary["route"] == "fused", summary["route"]
    need = summary["route_plan_estimates"]["fused"]["required"]
    return need, summary["peak_rss_bytes"]


def _skip_without_minilm() -> None:
    pytest.importorskip("tokenizers")
    from tensorarena.text import locate_minilm

    try:
        locate_minilm()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("model, extra", [("mlp", ()), ("vit-tiny", ())], ids=["mlp", "vit-tiny"])
def test_fused_run_with_evaluation_stays_within_its_plan(model, extra, tmp_path):
    # Regression (fixed): mlp evaluated 2000 rows at batch 1024 in a new arena beside the fused slab, peaking at
    # 196.1 MiB against a 193.0 MiB need; it now evaluates at the training batch, in the slab.
    summary = _train(tmp_path, model, *extra)
    need, peak = _need_and_peak(summary)
    assert summary["test_loss"] is not None and summary["test_accuracy"] is not None
    assert peak <= need * TOLERANCE, f"{model}: peak RSS {peak / MIB:.2f} MiB, the plan's need {need / MIB:.2f} MiB"


def _trained(pool, *, in_slab: bool):
    """A small MLP trained 3 fused steps and evaluated after step 2: by its own trainer (in the fused slab) or,
    `in_slab` False, by a second, eager trainer over the same model (an ordinary arena of another pool).
    Returns (trainer, evaluation, pool blocks the evaluation took)."""
    import tensorarena as ta
    from tensorarena.memory.pool import BlockPool
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    from mlp_cases import labelled_rows, small_mlp

    model = small_mlp(seed=3, hidden=(64, 64))
    trainer = Trainer(model, ta.optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route="fused", pool=pool)
    held_x, held_y = labelled_rows(n=1, batch=40, seed=7)[0]
    result = taken = None
    for i, (x, y) in enumerate(labelled_rows(n=3, batch=16)):
        trainer.step(x, y)
        if i == 1:
            evaluator = trainer if in_slab else Trainer(model, ta.optim.SGD(model.parameters(), lr=0.0),
                                                        cross_entropy, route="eager", pool=BlockPool())
            misses = pool.stats.misses
            result = evaluator.evaluate(held_x, held_y, batch_size=16)
            taken = pool.stats.misses - misses
    return trainer, result, taken


def test_evaluation_between_fused_steps_runs_in_the_slab_and_leaves_training_as_it_was():
    import numpy as np

    from tensorarena.memory.pool import BlockPool

    trainer, result, taken = _trained(BlockPool(), in_slab=True)
    plain, reference, _ = _trained(BlockPool(), in_slab=False)
    # No pool block: the forward at the training batch took its memory from the fused slab alone.
    assert taken == 0
    # The slab's bytes were dead between steps: step 3 after it trains exactly as after an evaluation elsewhere.
    for (name, p), (_, q) in zip(trainer.model.named_parameters(), plain.model.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    # The evaluation in an ordinary arena gives the same figures: the slab's views served it alone.
    assert result == reference


@pytest.mark.heavy(seconds=35)
def test_fused_simcse_with_its_probes_stays_within_its_plan(tmp_path):
    # Regression (fixed): 885.7 MiB through every step against an 852 MiB need: the probe forward before step 1
    # left ~41 MiB of blocks cached in the pool, which the fused step (its buffers in its slab) never takes.
    _skip_without_minilm()
    summary = _train(tmp_path, "simcse")
    need, peak = _need_and_peak(summary)
    assert summary["probe_loss_before"] > 0 and summary["probe_loss_after"] > 0
    assert peak <= need * TOLERANCE, f"simcse: peak RSS {peak / MIB:.2f} MiB, the plan's need {need / MIB:.2f} MiB"


def test_a_fused_run_resumed_on_route_auto_stays_within_its_plan(tmp_path):
    # Regression (fixed): once Trainer.load() on route auto left the checkpoint of a deferred model to step 1 (so a
    # streamed run resumes within its limit), a resumed vit-tiny on fused peaked at 333.7 MiB against a 293.8 MiB
    # plan: the plan was made before the load, and the load's optimizer state and heap pages were in no part of it.
    # Now route auto plans again once it has loaded the checkpoint into the model for fused (shown failing without
    # that: drop the second plan in Trainer._choose_route).
    # The first run only writes the checkpoint (its peak is not checked): it evaluates 32 held-out images, not the
    # default 2000 (~3.5 s of the run). The held-out set is in no part of the checkpoint (the two write the same
    # bytes, checked); the resumed run, the one measured, holds and evaluates its default 2000.
    (tmp_path / "first").mkdir(), (tmp_path / "resumed").mkdir()
    _train(tmp_path / "first", "vit-tiny", "--steps", "1", "--save", str(tmp_path / "half.st"), "--test-size", "32")
    summary = _train(tmp_path / "resumed", "vit-tiny", "--resume", str(tmp_path / "half.st"))
    assert summary["steps"] == 3 and summary["steps_this_run"] == 2
    need, peak = _need_and_peak(summary)
    assert peak <= need * TOLERANCE, (f"resumed vit-tiny: peak RSS {peak / MIB:.2f} MiB, the plan's need "
                                      f"{need / MIB:.2f} MiB")


def test_a_run_resumed_under_a_limit_stays_within_its_plan_and_the_limit(tmp_path):
    # Regression (fixed): resumed at --memory-limit 320M, a vit-tiny printed "fused needs 275.71 MiB of 320" and
    # peaked at 332.5 MiB: the load read the whole checkpoint beside the model (train/tensor_file.py now reads it
    # tensor by tensor), and then, the loaded optimizer state freed when the fused route laid it out flat having
    # raised glibc's mmap threshold, the first step's buffers came from the heap: 284 MiB, 2.9% over (the state
    # read into mappings of its own and kept, optimizer.Optimizer._copy_param_state). Fails on 8de4784 (332.2 MiB
    # for a need of 317.7) and on d40fb77 (283.4 for 275.9), run as the module docstring says (PYTHONPATH absolute).
    (tmp_path / "first").mkdir(), (tmp_path / "resumed").mkdir()
    small = ("--test-size", "16", "--batch-size", "8")
    _train(tmp_path / "first", "vit-tiny", "--steps", "2", "--total-steps", "4", "--save", str(tmp_path / "half.st"),
           *small)
    summary = _train(tmp_path / "resumed", "vit-tiny", "--steps", "4", "--resume", str(tmp_path / "half.st"),
                     "--memory-limit", "320M", *small)
    need, peak = _need_and_peak(summary)
    assert peak <= need * TOLERANCE, f"resumed at 320M: peak RSS {peak / MIB:.2f} MiB, the plan's need {need / MIB:.2f}"
    assert peak <= 320 * MIB
