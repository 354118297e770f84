"""A ViT batch trained whole and in micro-batches: tensorarena's micro_batch against PyTorch's accumulation loop.

    python bench/micro_batches.py [--model tiny|base] [--batch 32] [--micro-batch 8] [--steps 5] [--json out.json]

One update per batch of B images (224x224, AdamW, as bench/vit.py), run as one forward/backward pass or as
B / m passes of m images whose gradients are summed first. PyTorch's usual way is a hand-written loop:
(loss_i * m / B).backward() per micro-batch, then opt.step(). Ours is Trainer(route="fused", micro_batch=m)
(compile/micro_batches.py) and the eager route with the same option. Each contender runs in a child process of
its own (bench/vit.py's run_contenders), so its peak RSS is its own; the table gives the median step time and
peak RSS, each against PyTorch's whole-batch step, and for the fused contenders the plan's predicted peak
(memory_report(), made before step 1) beside the RSS growth it measured. Numba's kernel cache is filled first by
a one-step run of each of our contenders, as in bench/vit.py.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vit  # noqa: E402 - bench/vit.py: the models, data and child harness
from common import child_main, cpu_name, positive_int, time_torch_steps, write_json  # noqa: E402

CONTENDERS = ["pytorch eager", "pytorch eager, accumulated", "tensorarena fused", "tensorarena fused, micro-batches",
              "tensorarena eager, micro-batches"]
REFERENCE = "pytorch eager"


def _micro() -> int | None:
    return int(os.environ["BENCH_MICRO"])


def _ours(route: str, micro: bool) -> dict:
    result = vit.run_ours(route, micro_batch=_micro() if micro else None)
    result["micro_batch"] = _micro() if micro else None
    return result


def _torch(accumulate: bool) -> dict:
    import torch

    torch.manual_seed(0)
    model = vit._torch_vit(vit._case())
    x, y = (torch.from_numpy(a) for a in vit._data())
    opt = torch.optim.AdamW(model.parameters(), lr=vit.LR, weight_decay=vit.WEIGHT_DECAY)
    size = _micro() if accumulate else len(x)

    def step():
        opt.zero_grad()
        total = 0.0
        for start in range(0, len(x), size):
            loss = torch.nn.functional.cross_entropy(model(x[start:start + size]), y[start:start + size])
            loss = loss * (len(x[start:start + size]) / len(x))
            loss.backward()
            total += loss.item()
        opt.step()
        return total

    return time_torch_steps(step, compiled=False, warmup=vit.WARMUP, steps=vit._steps())


CHILDREN = {"pytorch eager": lambda: _torch(False), "pytorch eager, accumulated": lambda: _torch(True),
            "tensorarena fused": lambda: _ours("fused", False),
            "tensorarena fused, micro-batches": lambda: _ours("fused", True),
            "tensorarena eager, micro-batches": lambda: _ours("eager", True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(vit.CASES), default="tiny")
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--micro-batch", type=positive_int, default=8)
    parser.add_argument("--steps", type=positive_int, default=5,
                        help="timed steps per contender, after 3 warm-up steps")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    env = {"BENCH_CASE": args.model, "BENCH_BATCH": str(args.batch), "BENCH_MICRO": str(args.micro_batch)}
    ours = [n for n in CONTENDERS if n.startswith("tensorarena")]
    vit.run_contenders(__file__, ours, {**env, "BENCH_STEPS": "1"})  # fills Numba's kernel cache
    results = vit.run_contenders(__file__, CONTENDERS, {**env, "BENCH_STEPS": str(args.steps)})
    pieces = -(-args.batch // args.micro_batch)  # the last micro-batch may be short: 10 rows by 4 run as 3
    title = (f"{vit.CASES[args.model]['title']} batch {args.batch} ({pieces} micro-batches "
             f"of {args.micro_batch} where named), {vit.IMAGE}x{vit.IMAGE}, AdamW, {args.steps} timed steps; "
             f"CPU: {cpu_name()}")
    print(title)
    ref = results[REFERENCE]
    if ref.get("unavailable"):  # no ratios to give; each contender's own figures still print (NaN ratios)
        ref = {"median_step_s": float("nan"), "peak_rss_bytes": float("nan")}
    print(f"{'contender':34s} {'median s':>9s} {'x time':>7s} {'peak RSS MiB':>13s} {'x RSS':>6s} "
          f"{'predicted peak MiB':>19s} {'growth / predicted':>19s}")
    for name, r in results.items():
        if r.get("unavailable"):
            print(f"{name:34s} unavailable: {r['error'].strip().splitlines()[-1][:100]}")
            continue
        predicted = r.get("memory_report", {}).get("predicted_peak")
        print(f"{name:34s} {r['median_step_s']:9.3f} {r['median_step_s'] / ref['median_step_s']:7.3f} "
              f"{r['peak_rss_bytes'] / 2**20:13.1f} {r['peak_rss_bytes'] / ref['peak_rss_bytes']:6.3f} "
              f"{predicted / 2**20 if predicted else float('nan'):19.1f} "
              f"{r.get('prediction_ratio', float('nan')):19.3f}")
        r.pop("step_times_s", None)
    summary = {"benchmark": "micro_batches", "title": title, "batch": args.batch, "micro_batch": args.micro_batch,
               "results": results}
    write_json(args.json, summary)


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main(CHILDREN)
        sys.exit(0)
    main()
