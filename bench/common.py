"""Shared benchmark plumbing: run each contender in its own child process, collect JSON, print a table.

Each contender runs in a fresh child so that its peak RSS (ru_maxrss) is its own:
importing torch alone costs a few hundred MB, which would otherwise be charged to
whoever ran second.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Callable

# Deliberately no tensorarena import here: importing it sets OpenMP defaults (see
# tensorarena/kernels/__init__.py) that must not leak into the PyTorch child.
_PAGE = os.sysconf("SC_PAGE_SIZE")

# Benchmarks measure the checkout they live in: its root goes first on sys.path, so `import
# tensorarena` here and in every child never finds another install instead (a non-editable one,
# left in site-packages by `.ci/run` in a fresh clone, made a whole bench/vit.py run measure the
# previous commit). Each bench imports this module before tensorarena.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [REPO_ROOT]:
    sys.path.insert(0, REPO_ROOT)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), to read the figures against: sessions here run on different
    machines (an Intel with AMX on one day, an AMD EPYC on another), and the ratios to PyTorch move with them."""
    from tensorarena.kernels.cpu import cpuinfo_field

    return cpuinfo_field("model name") or "unknown CPU"


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def peak_rss_bytes() -> int:
    # VmHWM, not ru_maxrss: the latter survives exec and would report the harness's peak.
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM line in /proc/self/status")


def after_kernel_warmup() -> None:
    """What a fused contender calls after tensorarena.kernels.warmup.compile_all(), which loads and runs every
    kernel (Adadelta's and LAMB's too) so that the baseline of its memory prediction holds compiled code: the
    kernel counters start again (its JSON "kernels" listed those warm-up calls as the step's), and so does the
    peak RSS (VmHWM, reset by /proc/self/clear_refs): that warm-up's transient buffers put ~13 MiB on a small
    ViT's peak that neither a user's Trainer(route="fused") nor the eager contender holds."""
    from tensorarena import kernels

    kernels.calls.clear()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def time_steps(step: Callable[[], float], *, warmup: int, steps: int) -> dict:
    """Run `step` (returns the loss) warmup+steps times; median/first/all times and RSS trace."""
    import time

    times, losses, rss = [], [], []
    for i in range(warmup + steps):
        start = time.perf_counter()
        losses.append(float(step()))
        times.append(time.perf_counter() - start)
        rss.append(rss_bytes())
    measured = times[warmup:]
    slope = (rss[-1] - rss[warmup]) / max(steps - 1, 1)
    return {"first_step_s": times[0], "median_step_s": statistics.median(measured),
            "step_times_s": measured, "first_loss": losses[0], "last_loss": losses[-1],
            "peak_rss_bytes": peak_rss_bytes(), "rss_slope_bytes_per_step": slope}


def time_torch_steps(step: Callable[[], float], *, compiled: bool, warmup: int, steps: int) -> dict:
    """`time_steps` for a torch contender; a torch.compile failure marks it unavailable instead of raising."""
    import traceback

    try:
        result = time_steps(step, warmup=warmup, steps=steps)
    except Exception as exc:  # noqa: BLE001 - any compiler failure makes the contender unavailable
        if not compiled:
            raise
        return {"unavailable": True, "error": f"{type(exc).__name__}: {exc}"[:4000],
                "traceback": traceback.format_exc()[-4000:]}
    import torch

    result["torch_threads"] = torch.get_num_threads()
    if compiled:
        result["compile_first_step_s"] = result["first_step_s"]
    return result


def time_trainer(trainer, inputs, targets, *, warmup: int, steps: int) -> dict:
    """`time_steps` over our Trainer's steps, with its arena and kernel-route facts added."""
    high_water = []

    def step():
        report = trainer.step(inputs, targets)
        high_water.append(report.arena_high_water)
        return report.loss

    result = time_steps(step, warmup=warmup, steps=steps)
    return ours_extras(result, high_water, warmup, trainer.model.num_parameters())


def ours_extras(result: dict, high_water: list[int], warmup: int, parameters: int) -> dict:
    """Add our engine's arena and kernel-route facts to a contender's result."""
    from tensorarena import kernels

    result["arena_high_water_bytes"] = high_water[-1]
    result["arena_flat_after_warmup"] = len(set(high_water[warmup:])) == 1
    result["parameters"] = parameters
    result["kernels"] = {f"{k}:{impl}": n for (k, impl), n in sorted(kernels.calls.items())}
    return result


def interleave(steps: dict[str, Callable[[], object]], rounds: int, per_round: int, *,
               warmup: int = 3) -> dict[str, list[float]]:
    """Time contenders taking turns in one process, so their ratios see the same machine load.

    Each first runs `warmup` untimed steps; then every round gives each contender one untimed
    step (caches and thread pools settle after the switch) and `per_round` timed ones. Returns
    the step times in seconds per contender.

    The order rotates by one each round, so no contender always follows the same one: in a fixed
    order, ViT-Base's fused step measured 0.754x and 0.722x PyTorch eager in two runs, slower than
    the same step doing more work (full last block, 0.740x and 0.686x), which alternating A/B runs
    put 3-6% behind it.
    """
    import time

    times: dict[str, list[float]] = {name: [] for name in steps}
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    names = list(steps)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = steps[name]
            fn()
            for _ in range(per_round):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return times


def positive_int(text: str) -> int:
    """argparse type for counts (--steps, --rounds...): 0 or less was taken as "the default" by `args.steps or
    default`, or failed only in statistics.median after the whole run."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value}")
    return value


def interleaved_vit_parser(description: str):
    """The options every interleaved ViT benchmark takes: --model, --rounds, --per-round, --json."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "base"], default="tiny")
    parser.add_argument("--rounds", type=positive_int, default=8)
    parser.add_argument("--per-round", type=positive_int, default=3)
    parser.add_argument("--json")
    return parser


def paired_ratios(times: dict[str, list[float]], reference: str, per_round: int) -> dict[str, float]:
    """Each contender against `reference` round by round, then the median over the rounds.

    `times` as `interleave` returns them (per_round steps per round, in round order). A round's
    ratio compares medians taken seconds apart, so a load change between rounds moves both sides
    of it; whole-run medians compare whichever steps happened to land in the middle.
    """
    def round_medians(t: list[float]) -> list[float]:
        return [statistics.median(t[r * per_round:(r + 1) * per_round]) for r in range(len(t) // per_round)]

    ref = round_medians(times[reference])
    return {name: statistics.median(a / b for a, b in zip(round_medians(t), ref)) for name, t in times.items()}


def torch_products_in_bf16(knob: Callable[[], object]) -> bool:
    """Whether PyTorch's float32 products run in bfloat16 under `knob` (a context manager factory setting its
    precision knob) on this machine: one product under it, compared with the float32 one and with one of the
    operands rounded to bfloat16. On the machine these benches were written on (Zen 4, avx512_bf16, torch 2.13
    CPU), neither set_float32_matmul_precision("medium") nor mkldnn.matmul.fp32_precision="bf16" changed a
    product by more than float32's own reordering (4e-5, where bfloat16 operands move it by 0.17): their
    "bf16" column is a float32 rival there, and the tables say so."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    a, b = (torch.from_numpy(rng.standard_normal((64, 256), dtype=np.float32)) for _ in range(2))
    full = (a @ b.T).numpy()
    rounded = (a.bfloat16().float() @ b.bfloat16().float().T).numpy()
    with knob():
        under = (a @ b.T).float().numpy()  # (autocast hands back bfloat16)
    return bool(np.abs(under - rounded).max() < np.abs(under - full).max())


def bf16_note(column: str, effective: bool) -> str:
    """The line a table prints under a PyTorch bf16 column (see torch_products_in_bf16)."""
    if effective:
        return f"{column}: PyTorch's products ran in bfloat16 here (checked on one product)"
    return (f"{column}: PyTorch's knob left its products in float32 on this machine (checked on one product): "
            f"that column is a float32 rival, not a bfloat16 one")


def write_json(path: str | None, data: dict) -> None:
    """Print a benchmark's JSON as stdout's last line (every benchmark prints its table and its JSON), and write it
    to `path` too when one was asked for."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        print(f"JSON written to {path}")
    print(json.dumps(data))


def child_main(contenders: dict[str, Callable[[], dict]]) -> None:
    """In a child: run the contender named on the command line and print its JSON result."""
    name = sys.argv[sys.argv.index("--child") + 1]
    baseline = rss_bytes()
    result = contenders[name]()
    result["rss_after_imports_bytes"] = baseline
    print("RESULT " + json.dumps(result))


def run_children(script: str, names: list[str], env: dict | None = None) -> dict[str, dict]:
    """Run `script --child NAME` for each name; return their parsed results."""
    results = {}
    for name in names:
        proc = subprocess.run([sys.executable, script, "--child", name], capture_output=True, text=True,
                              env={**os.environ, **(env or {})})
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"contender {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        results[name] = json.loads(line[len("RESULT "):])
    return results


def print_table(title: str, results: dict[str, dict], reference: str) -> None:
    """Median/first step time, peak RSS and ratios to `reference`."""
    ref = results[reference]
    print(f"\n{title}")
    ratio = "x " + reference
    width = max(12, len(ratio) + 2)  # "x pytorch eager" ran into "first ms" at 12
    header = (f"{'contender':<22}{'median ms':>11}{'first ms':>10}{ratio:>{width}}{'peak RSS MiB':>14}{'RSS x':>8}"
              f"{'slope KiB/step':>16}")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        print(f"{name:<22}{r['median_step_s'] * 1e3:>11.2f}{r['first_step_s'] * 1e3:>10.1f}"
              f"{r['median_step_s'] / ref['median_step_s']:>{width}.3f}{r['peak_rss_bytes'] / 2**20:>14.1f}"
              f"{r['peak_rss_bytes'] / ref['peak_rss_bytes']:>8.3f}{r['rss_slope_bytes_per_step'] / 1024:>16.1f}")
