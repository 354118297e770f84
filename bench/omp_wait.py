"""How idle OpenMP threads wait, measured on whole fused ViT steps: sleep at once vs spin a while.

    python bench/omp_wait.py [--model tiny|base] [--rounds 5] [--steps 10]

libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it loads, so each setting needs a
process of its own. This starts one child per setting per round, the settings alternated round by
round so that each sees the same spread of machine load, and prints each setting's median over the
rounds of the per-process median step (after 3 warm-up steps), with its ratio to PASSIVE, and JSON.
kernels/__init__ picks ACTIVE with GOMP_SPINCOUNT=100000 when MKL runs the GEMMs (the GEMMs and the
fused kernels then share libgomp's pool), PASSIVE otherwise. No PyTorch here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import positive_int, write_json  # noqa: E402

SETTINGS = {  # name -> environment
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin 30k": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "30000"},
    "spin 100k (default with MKL)": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "100000"},
    "spin 300k": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"},
}


def child(model: str, steps: int) -> None:
    import numpy as np

    from tensorarena import optim
    from tensorarena.kernels.gemm import backend
    from tensorarena.models.vit import ViT, ViTConfig
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    batch = 8 if model == "tiny" else 1
    net = ViT(getattr(ViTConfig, model)(image_size=224, patch_size=16, num_classes=10), rng=np.random.default_rng(0))
    trainer = Trainer(net, optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01), cross_entropy, route="fused")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    for _ in range(3):
        trainer.step(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.step(x, y)
        times.append(time.perf_counter() - start)
    print("RESULT " + json.dumps({"median_s": statistics.median(times), "gemm": backend()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "base"], default="tiny")
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.steps)
        return

    base_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    medians: dict[str, list[float]] = {name: [] for name in SETTINGS}
    gemm = None
    for _ in range(args.rounds):
        for name, env in SETTINGS.items():
            proc = subprocess.run([sys.executable, __file__, "--child", "--model", args.model, "--steps", str(args.steps)],
                                  env={**base_env, **env}, capture_output=True, text=True)
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            result = json.loads(line[len("RESULT "):])
            medians[name].append(result["median_s"])
            gemm = result["gemm"]
    summary = {name: statistics.median(v) for name, v in medians.items()}
    passive = summary["PASSIVE"]
    print(f"fused ViT-{args.model} steps, {args.rounds} rounds x one process per setting ({args.steps} timed steps each); "
          f"GEMMs: {gemm}")
    print(f"{'setting':<30}{'median ms':>11}{'x PASSIVE':>11}   per-round medians (ms)")
    for name, value in summary.items():
        rounds = " ".join(f"{v * 1e3:.0f}" for v in medians[name])
        print(f"{name:<30}{value * 1e3:>11.1f}{value / passive:>11.3f}   {rounds}")
    write_json(args.json, {"model": args.model, "gemm": gemm, "median_s": summary, "per_round_s": medians})


if __name__ == "__main__":
    main()
