"""The streaming route's peak RSS stays within its route plan's need, unlimited and inside a real memory cgroup.

Measured before this work: `tensorarena train --model vit-base --memory-limit 440M --steps 2` in a 450 MiB cgroup
peaked at 447.9 MiB against a 423.8 MiB plan. Two causes, both outside the plan's count:

- the optimizer's update kernel is the one kernel the plan's traces (forward and backward) never call, so it was
  compiled, or loaded from Numba's cache, inside step 1, after the plan measured the process. With it missing from
  the cache (a fresh install, any edit of kernels/adam.py) vit-base peaked at 451.2 MiB against 433.8 (+4.0%).
  The plan now loads it before measuring (stream/optim_state.load_update_kernels).
- the step's arenas took the pool's power-of-two blocks, and touched 21.7 MiB of them for 16.7 MiB they planned;
  NumPy's huge-page advice rounded an arena's pages up to 2 MiB (vit-base +1.0..1.8% with a warm cache). Each
  arena now bumps in one block of a pool without huge pages, and the plan counts the pages it touches ("arena
  pages", stream/arena_pages.py), which the first test checks against the kernel's own count (mincore).

Page cache is not RSS, and the stage files' mapped pages are: they are the two slots the plan counts ("stream
buffers"); sampled every 20 ms over a vit-base run, RssFile never exceeded the libraries plus those two slots.

On the commit this work started from (d0c9eb9f2f79b747c26729e48c6bbd8b1d0a4573), 3 of these 3 tests fail: no arena
pages are counted; vit-small unlimited peaked 389.0 MiB against 380.4 (+2.26%: the new worktree's Numba cache was
empty; run again with it filled, +1.25%), the cold vit-tiny 336.1 against 330.1 (+1.82%). Checked with
    git worktree add /tmp/wt-streamrss d0c9eb9f2f79b747c26729e48c6bbd8b1d0a4573
    cp tests/test_streaming_rss_under_cgroup.py /tmp/wt-streamrss/tests/ && cd /tmp/wt-streamrss
    PYTHONPATH=/tmp/wt-streamrss python -m pytest -q -p no:cacheprovider tests/test_streaming_rss_under_cgroup.py
    git worktree remove --force /tmp/wt-streamrss
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorarena import nn, optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

MIB = 1 << 20
TOLERANCE = 1.01  # peak RSS over the plan's need, as tests/test_plan_covers_run.py
PAGE = mmap.PAGESIZE
REPO = Path(__file__).resolve().parents[1]


# -- the arenas' pages, as the kernel counts them --------------------------------------------------------------------
def _resident(buffer: np.ndarray) -> int:
    """Bytes of `buffer`'s pages the kernel holds in memory now (mincore), whole pages."""
    begin = buffer.ctypes.data // PAGE * PAGE
    pages = -(-(buffer.ctypes.data + buffer.nbytes - begin) // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(begin), ctypes.c_size_t(pages * PAGE), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) * PAGE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and madvise as Linux has them")
def test_the_streamed_arenas_hold_the_pages_the_plan_counts(tmp_path):
    from tensorarena.stream.arena_pages import STAGE_BLOCK_BYTES, STEP_BLOCK_BYTES

    with nn.deferred_init():
        model = ViT(ViTConfig(image_size=32, patch_size=8, num_classes=10, dim=96, depth=4, num_heads=4),
                    rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="streaming",
                      store_dir=tmp_path / "store")
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((16, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 16)) for _ in range(3)]
    parts = trainer.plan(*batches[0], routes=("streaming",)).estimates["streaming"].parts
    for x, y in batches:
        assert trainer.step(x, y).route == "streaming"
    # After the steps the arenas' blocks are back in the route's pool: one of each class, touched as deep as the
    # steps reached (a third step reaches no deeper: the second found the same pages).
    cached = {size: blocks for size, blocks in trainer.stream._arena_pool._free.items() if blocks}
    assert sorted(cached) == [STEP_BLOCK_BYTES, STAGE_BLOCK_BYTES] and all(len(b) == 1 for b in cached.values())
    step_pages, stage_pages = (_resident(cached[size][0].buffer) for size in (STEP_BLOCK_BYTES, STAGE_BLOCK_BYTES))
    step_planned = parts["boundary activations"] + parts["boundary gradients"]
    planned = step_planned + parts["activations (one stage)"] + parts["arena pages"]
    # Exact to a few pages per block: a block's first page also holds the allocator's header, and the last page
    # of the last buffer may never be written (then it is not resident). Here every run gives step 157 pages for
    # 157.5 planned and the sum one page under the plan; one CI run (full suite, 2 cores) found the step block 160
    # pages resident, 2.5 over, which no local run reproduced (alone, after the streaming files, on a cold Numba
    # cache, 6 at once): the bounds allow that much and no more (a missed buffer, a stage output of 102 KiB, fails).
    slack = 3 * PAGE
    assert abs(step_pages + stage_pages - planned) <= slack, (step_pages, stage_pages, parts)
    assert abs(step_pages - step_planned) <= slack, (step_pages, step_planned)
    assert step_pages + stage_pages <= planned + slack, (step_pages, stage_pages, parts)
    trainer.stream.close()


_RECYCLED_HEAP = """
import ctypes, mmap, sys
import numpy as np
ctypes.CDLL(None).mallopt(-3, 256 << 20)  # M_MMAP_THRESHOLD: malloc serves blocks up to 256 MiB from its heap
x = np.ones(48 << 20, np.uint8)  # a big array, every page touched, then freed: its pages stay with the heap
del x
from tensorarena.stream.arena_pages import STEP_BLOCK_BYTES, SmallPagePool
sys.path.insert(0, sys.argv[1])
from tests.test_streaming_rss_under_cgroup import _resident
print(_resident(SmallPagePool().acquire(STEP_BLOCK_BYTES).buffer) // mmap.PAGESIZE)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt and mincore as Linux has them")
def test_a_new_arena_block_holds_no_page_a_freed_array_left_resident():
    # Regression: SmallPagePool's blocks came from malloc, which may hand out memory a freed array left resident;
    # those pages then counted as the arena's (mincore) and the plan's "arena pages" fell short. Two fresh-clone CI
    # runs saw the step block 2.5 and 154 pages over its plan. Before each block was a mapping of its own, this
    # printed 34 and 80 in two runs (pages of the freed array), in a process whose malloc takes big blocks from its
    # heap (checked with the fix stashed: tensorarena/stream/arena_pages.py and tensorarena/memory/pool.py).
    out = subprocess.run([sys.executable, "-c", _RECYCLED_HEAP, str(REPO)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) == 0


# -- whole runs: `tensorarena train`, each in a process of its own ------------------------------------------------------
def _one_thread_env() -> dict[str, str]:
    """The environment of each `tensorarena` subprocess here: this checkout's package, one Numba and one OpenMP
    thread."""
    return {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _train(tmp: Path, name: str, argv: list[str], *, limit: int | None = None, cold: bool = False,
           steps: int = 2) -> dict:
    """Run `tensorarena train <argv>` (inside a cgroup of `limit` bytes if given; with an empty Numba cache if
    `cold`) and return its summary with the cgroup's verdict."""
    from tests.cgroup_harness import CgroupUnavailable, run_limited

    summary = tmp / f"{name}.json"
    env = _one_thread_env()
    if cold:  # Numba reads and writes this directory instead of the package's __pycache__: every kernel compiles
        (tmp / f"{name}-numba").mkdir()
        env["NUMBA_CACHE_DIR"] = str(tmp / f"{name}-numba")
    # 64 held-out images, not the default 2000: streamed evaluation of 2000 was most of a vit-small run's time.
    cmd = [sys.executable, "-m", "tensorarena", "train", *argv, "--steps", str(steps), "--test-size", "64",
           "--no-progress", "--json", str(summary), "--store-dir", str(tmp / f"{name}-store")]
    if limit is None:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
        returncode, stderr, oom = done.returncode, done.stderr, False
    else:
        try:
            run = run_limited(cmd, limit, timeout=600, env=env)
        except CgroupUnavailable as exc:
            pytest.skip(f"cannot hold the run to a real memory limit here: {exc}")
        returncode, stderr, oom = run.returncode, run.stderr, run.oom_killed
    assert not oom, f"{name}: killed by the kernel at the hard limit {limit}: {stderr[-2000:]}"
    assert returncode == 0, f"{name}: exit {returncode}: {stderr[-3000:]}"
    return json.loads(summary.read_text())


def _within_plan(summary: dict, what: str) -> None:
    assert summary["route"] == "streaming", (what, summary["route"])
    need, peak = summary["route_plan_estimates"]["streaming"]["required"], summary["peak_rss_bytes"]
    assert peak <= need * TOLERANCE, (f"{what}: peak RSS {peak / MIB:.2f} MiB over the plan's need {need / MIB:.2f} MiB "
                                      f"by {(peak / need - 1) * 100:.2f}%")


def _streams_within_plan_free_and_in_a_cgroup(tmp: Path, model: str) -> None:
    # Unlimited first, forced onto the streaming route: its plan gives the need the cgroup is sized from.
    free = _train(tmp, "free", ["--model", model, "--route", "streaming", "--memory-limit", "16G"])
    _within_plan(free, f"{model} unlimited")
    # Then inside a real cgroup whose hard limit is that need + 2%, the same limit given to train (route auto: the
    # plan must choose streaming itself), as bench/budget_sweep.py's "streaming +2%".
    limit = int(free["route_plan_estimates"]["streaming"]["required"] * 1.02)
    limited = _train(tmp, "limited", ["--model", model, "--memory-limit", str(limit)], limit=limit)
    _within_plan(limited, f"{model} in a {limit / MIB:.1f} MiB cgroup")
    assert limited["peak_rss_bytes"] <= limit


@pytest.mark.heavy(seconds=18)
def test_vit_small_streams_within_its_plan_unlimited_and_in_a_cgroup(tmp_path):
    _streams_within_plan_free_and_in_a_cgroup(tmp_path, "vit-small")


# What an empty Numba cache adds to the process share a plan measures (LLVM's memory for the kernels it compiled):
# `tensorarena plan --model vit-tiny --memory-limit 16G` needed 245.4 MiB (streaming) and 335.7 MiB (fused) with
# the cache warm, 372.0 and 462.3 with NUMBA_CACHE_DIR empty (Zen 3, 2026-12-02): 126.6 MiB more on both.
COLD_EXTRA = 127 * MIB


def _warm_needs(tmp: Path, model: str, argv: list[str]) -> dict[str, int]:
    """Each route's need in `tensorarena plan <argv>` for `model`, on the package's own Numba cache: planned twice,
    so that the measured run loads every kernel the first one may have had to compile."""
    out = tmp / "warm-plan.json"
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "tensorarena", "plan", "--model", model, *argv,
                               "--memory-limit", "16G", "--json", str(out)], capture_output=True, text=True,
                              env=_one_thread_env(), cwd=tmp, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return {route: est["required"] for route, est in json.loads(out.read_text())["estimates"].items()}


@pytest.mark.heavy(seconds=95)
def test_the_first_run_after_install_streams_within_its_plan(tmp_path):
    # An empty Numba cache: the plan's traces compile the forward and backward kernels (inside its measurement),
    # and every kernel it calls after them (the optimizer's update; the MLPs' GELU recompute, which its lean
    # fused re-trace runs when fused does not fit) must be compiled before that measurement too, not in step 1.
    # One cold run, in a cgroup, with route auto, as the user's first run: the limit sits midway between the
    # streaming and fused needs the cold process will measure, estimated as the warm needs plus COLD_EXTRA, so the
    # estimate may be off by ±45 MiB (half the 90 MiB between the two) and the run still streams. (Until
    # 2026-12-02 a cold unlimited run gave the limit: a second cold compile, ~90 s of this suite's ~180.)
    warm = _warm_needs(tmp_path, "vit-tiny", ["--steps", "2"])
    limit = int((warm["streaming"] + warm["fused"]) / 2 + COLD_EXTRA)
    limited = _train(tmp_path, "limited", ["--model", "vit-tiny", "--memory-limit", str(limit)], limit=limit,
                     cold=True)
    _within_plan(limited, f"vit-tiny, cold Numba cache, in a {limit / MIB:.1f} MiB cgroup")
    assert limited["peak_rss_bytes"] <= limit
    # The cold process measured what COLD_EXTRA says it would, or the limit was not where this test means it.
    cold = {route: est["required"] for route, est in limited["route_plan_estimates"].items()}
    assert cold["streaming"] < limit < cold["fused"], (cold, limit)


def test_a_run_resumed_on_route_auto_streams_within_the_limit_it_streamed_in(tmp_path):
    # Regression (fixed): `--resume` on route auto loaded the checkpoint into the deferred model before the route
    # plan, making the model and its optimizer state whole in memory, which the plan then measured as the process:
    # vit-small streamed at --memory-limit 400M (243 MiB) and its resume there said "nothing fits: streaming needs
    # 619 MiB". The load now waits for the route (Trainer.load). Streaming, it then read the file through one
    # safetensors map: every page read stayed resident, 460 MiB against the 243 planned (stream/checkpoint.py).
    # Both shown failing without the fix: `git stash` the two files, then this test fails at the resumed run.
    first = _train(tmp_path, "first", ["--model", "vit-tiny", "--route", "streaming", "--memory-limit", "16G",
                                       "--total-steps", "2", "--save", str(tmp_path / "half.st")], steps=1)
    need = first["route_plan_estimates"]["streaming"]["required"]
    # Room for streaming and not for fused (~90 MiB more here: the parameters, their gradients and AdamW's state).
    limit = int(need * 1.08)
    resumed = _train(tmp_path, "resumed", ["--model", "vit-tiny", "--memory-limit", str(limit),
                                           "--resume", str(tmp_path / "half.st")], limit=limit)
    assert resumed["steps"] == 2 and resumed["steps_this_run"] == 1
    assert resumed["route_plan_estimates"]["fused"]["required"] > limit  # else the premise (a choice) is gone
    _within_plan(resumed, f"vit-tiny resumed on route auto in a {limit / MIB:.1f} MiB cgroup")
