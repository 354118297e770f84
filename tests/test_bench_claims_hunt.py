"""bench/: what the benchmarks print is what they say they measured (a helper agent's hunt of every bench).

1. budget_sweep.py died on its first default model (mlp) before any run: `tensorarena plan` exits 1 when nothing
   fits (its JSON still printed), which the sweep asks for on purpose, and it ran plan with check=True.
2. The "bf16" PyTorch rivals (vit_bf16.py, gemm_bf16.py, vit_floor.py --bf16) were float32 on this machine: torch
   2.13's CPU knobs left its products float32. Each bench now checks one product and prints which it was.
3. micro_batches.py lost every result (KeyError) when its reference, PyTorch's step, was unavailable.
4. --steps 0 became the default step count (`args.steps or default`); 0 rounds failed after the whole run.
5. Fused contenders counted compile_all()'s warm-up in their kernel calls and peak RSS (common.after_kernel_warmup).
6. openblas_spin.py took no --json; vit_base_limit.py read --limit with its own parser (2Gi failed there only).

On 745266e (before the fix) 9 of this file's 9 tests fail (budget_sweep with CalledProcessError, the others on
what was missing):
    git worktree add /tmp/wt 745266e && cp tests/test_bench_claims_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_bench_claims_hunt.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)


def test_budget_sweep_reads_plans_where_nothing_fits():
    import budget_sweep

    plan = budget_sweep._plan("mlp", 1, 1 << 20)  # 1 MiB: nothing fits, plan exits 1 with its JSON
    assert plan["estimates"]["fused"]["required"] > 1 << 20
    needs = budget_sweep.route_needs("mlp", 1)  # its lean probe plans 0.5% under fused (exit 1 where eager is over)
    assert needs["fused"] > 0


def test_a_torch_knob_that_leaves_products_float32_is_told_apart_from_one_that_does_not():
    import torch
    from common import bf16_note, torch_products_in_bf16

    assert torch_products_in_bf16(contextlib.nullcontext) is False
    assert torch_products_in_bf16(lambda: torch.autocast("cpu", torch.bfloat16)) is True
    assert "float32 rival" in bf16_note("torch bf16", False)


@pytest.mark.parametrize("bench", ["vit_bf16.py", "gemm_bf16.py", "vit_floor.py"])
def test_each_bf16_bench_checks_and_reports_torchs_products(bench):
    with open(os.path.join(BENCH, bench)) as f:
        source = f.read()
    assert "torch_products_in_bf16(" in source and "bf16_note(" in source


def test_counts_must_be_positive():
    from common import positive_int

    assert positive_int("3") == 3
    for bad in ("0", "-2", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive whole number"):
            positive_int(bad)
    done = subprocess.run([sys.executable, os.path.join(BENCH, "vit.py"), "--steps", "0"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "expected a positive whole number, got 0" in done.stderr


def test_micro_batches_prints_its_table_without_its_reference(monkeypatch, capsys):
    import micro_batches

    fake = {name: {"median_step_s": 0.5, "peak_rss_bytes": 300 << 20, "step_times_s": [0.5]}
            for name in micro_batches.CONTENDERS}
    fake[micro_batches.REFERENCE] = {"unavailable": True, "error": "Killed\n"}
    monkeypatch.setattr(micro_batches.vit, "run_contenders", lambda *a, **k: dict(fake))
    monkeypatch.setattr(sys, "argv", ["micro_batches.py", "--batch", "10", "--micro-batch", "4", "--steps", "1"])
    micro_batches.main()
    out = capsys.readouterr().out
    assert "(3 micro-batches of 4" in out and "unavailable: Killed" in out
    assert json.loads(out.strip().splitlines()[-1])["micro_batch"] == 4


def test_after_kernel_warmup_restarts_the_counters_and_the_peak():
    from common import after_kernel_warmup, peak_rss_bytes
    from tensorarena import kernels

    kernels.calls[("a warm-up kernel", "fused")] += 1
    big = np.ones(64 << 20 >> 3)  # 64 MiB touched, then freed: the peak holds it
    del big
    before = peak_rss_bytes()
    after_kernel_warmup()
    assert not kernels.calls and peak_rss_bytes() < before - (32 << 20)


def test_openblas_spin_takes_json_and_vit_base_limit_reads_limits_as_the_cli():
    with open(os.path.join(BENCH, "openblas_spin.py")) as f:
        assert '"--json"' in f.read()
    import vit_base_limit
    from tensorarena.memory.budget import parse_size

    assert vit_base_limit.parse_size is parse_size and parse_size("2Gi") == 2 << 30
