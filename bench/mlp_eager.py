"""MLP 784-1024-1024-10, batch 256, AdamW: tensorarena eager vs PyTorch eager, one run.

    python bench/mlp_eager.py [--steps 40] [--json out.json]

Bar (issue 2): our median step time <= 1.0x PyTorch eager and our peak RSS <= PyTorch's.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (child_main, positive_int, print_table, run_children, time_steps, time_trainer,  # noqa: E402
                    write_json)

BATCH, SIZES, LR = 256, (784, 1024, 1024, 10), 1e-3
WARMUP = 5
STEPS = int(os.environ.get("BENCH_STEPS", 40))  # the parent passes --steps to its children this way


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], BATCH)


def run_ours() -> dict:
    import numpy as np

    from tensorarena import optim
    from tensorarena.models import MLP, MLPConfig
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    x, y = _data()
    model = MLP(MLPConfig(in_features=SIZES[0], hidden=SIZES[1:-1], out_features=SIZES[-1]),
                rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=LR), cross_entropy)
    return time_trainer(trainer, x, y, warmup=WARMUP, steps=STEPS)


def run_torch() -> dict:
    import torch

    x, y = _data()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(0)
    layers = []
    for i in range(len(SIZES) - 1):
        layers.append(torch.nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    result = time_steps(step, warmup=WARMUP, steps=STEPS)
    result["torch_threads"] = torch.get_num_threads()
    return result


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main({"tensorarena eager": run_ours, "pytorch eager": run_torch})
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=STEPS)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results = run_children(__file__, ["tensorarena eager", "pytorch eager"], env={"BENCH_STEPS": str(args.steps)})
    print_table(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, AdamW, {args.steps} timed steps",
                results, reference="pytorch eager")
    ours, theirs = results["tensorarena eager"], results["pytorch eager"]
    verdict = {
        "step_time_ratio": ours["median_step_s"] / theirs["median_step_s"],
        "peak_rss_ratio": ours["peak_rss_bytes"] / theirs["peak_rss_bytes"],
    }
    verdict["meets_bar"] = verdict["step_time_ratio"] <= 1.0 and verdict["peak_rss_ratio"] <= 1.0
    summary = {"benchmark": "mlp_eager", "results": results, "verdict": verdict}
    for r in results.values():
        r.pop("step_times_s")
    write_json(args.json, summary)
