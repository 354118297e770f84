"""ViT step-time ratios under the same machine load: our steps and PyTorch's interleaved in one process.

    python bench/vit_interleaved.py [--model tiny|base] [--rounds 8] [--per-round 3] [--no-compile] [--json out.json]

bench/vit.py runs each contender in a process of its own, one after another, so that each peak RSS
is its own; on a shared 2-core machine the load changes between them, and the same code measured
1.11x and 1.56x PyTorch eager in two runs of it. Here every contender lives in one process and
they take turns: each round runs `--per-round` timed steps of each, after one untimed step that
lets the caches and thread pools settle after the switch. Medians over all rounds, and the ratio of
each to PyTorch eager and to torch.compile, come out as a table and JSON. No RSS here (one
process): bench/vit.py reports memory.

"fused, full last block" is the fused step with ViTConfig(cls_only_last_block=False): the work
PyTorch's mirror ViT does, so the gap between it and "tensorarena fused" is what computing the
last block for [CLS] alone saves. "fused, GELU recomputed" is the fused step with
ViTConfig(recompute_mlp_activation=True): its MLPs keep fc1's output plus bias alone and evaluate
GELU again in backward, where the default keeps GELU's output and derivative (one buffer more per
block; the line under the table gives each fused plan's predicted peak). "tensorarena fused"
replays the step's recorded calls without the Python that made them (the default for ViT:
compile/captured.py; the run stops if the recording was refused); "fused, python replay" is
Trainer(fused_replay="python"), which re-runs the model's ops each step: the gap between the two is
what the captured replay saves.

Each ratio comes two ways: the ratio of the whole-run medians, and the median over rounds of each
round's ratio (bench/common.paired_ratios), which a load change between rounds does not skew.

Same models, data and optimizer as bench/vit.py (224x224, patch 16, 10 classes, AdamW 1e-3, weight
decay 0.01). torch is imported before tensorarena, so its own OpenMP runtime starts with its
default settings, not the wait policy tensorarena sets for its kernels' pool (kernels/__init__).
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import cpu_name, interleave, interleaved_vit_parser, paired_ratios, write_json  # noqa: E402

# Our fused step re-running the model's Python ops each step (Trainer(fused_replay="python")).
FUSED_PYTHON = "fused, python replay"
# Our fused step with the last block computing every token, as PyTorch's mirror ViT does (by
# default ours computes it for [CLS] alone, the only token the head reads): what that saves.
FUSED_EVERY_TOKEN = "fused, full last block"
# Our fused step with the MLPs recomputing GELU in backward (ViTConfig(recompute_mlp_activation=True)): one
# (tokens, mlp dim) buffer less per block than the default, which keeps GELU's output and derivative.
FUSED_RECOMPUTE = "fused, GELU recomputed"


def torch_step(vit, xs, ys, *, compiled: bool, autocast_bf16: bool = False):
    """A zero-argument PyTorch training step (bench/vit.py's mirror ViT, AdamW) on the batch xs, ys;
    autocast_bf16: forward and loss under torch.autocast("cpu", torch.bfloat16), PyTorch's mixed precision."""
    import contextlib

    import torch

    model = vit._torch_vit(vit._case())
    opt = torch.optim.AdamW(model.parameters(), lr=vit.LR, weight_decay=vit.WEIGHT_DECAY)
    forward = torch.compile(model) if compiled else model
    xt, yt = torch.from_numpy(xs), torch.from_numpy(ys)
    region = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast_bf16 else contextlib.nullcontext

    def step():
        with region():
            loss = torch.nn.functional.cross_entropy(forward(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def our_trainer(vit, case_name: str, route: str, update_in_backward: bool | None = None, seed: int = 0,
                matmul_precision: str = "float32", fused_replay: str = "auto", **config):
    """A tensorarena Trainer on the same ViT, data and optimizer settings as bench/vit.py (`config`:
    ViTConfig overrides)."""
    import numpy as np

    from tensorarena import optim
    from tensorarena.models.vit import ViT, ViTConfig
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    config = getattr(ViTConfig, case_name)(image_size=vit.IMAGE, patch_size=vit.PATCH, num_classes=vit.CLASSES,
                                           **config)
    model = ViT(config, rng=np.random.default_rng(seed))
    return Trainer(model, optim.AdamW(model.parameters(), lr=vit.LR, weight_decay=vit.WEIGHT_DECAY),
                   cross_entropy, route=route, update_in_backward=update_in_backward,
                   matmul_precision=matmul_precision, fused_replay=fused_replay)


def build(case_name: str, with_compile: bool) -> dict:
    """name -> zero-argument step function, for every contender."""
    os.environ["BENCH_CASE"] = case_name
    import torch  # first: see the module docstring

    import vit  # bench/vit.py: the shared models and data

    torch.set_num_threads(2)
    torch.manual_seed(0)
    xs, ys = vit._data()
    steps = {"pytorch eager": torch_step(vit, xs, ys, compiled=False)}
    if with_compile:
        steps["torch.compile"] = torch_step(vit, xs, ys, compiled=True)

    from tensorarena.kernels.gemm import backend

    for name, route, in_backward, config in (
            ("tensorarena eager", "eager", None, {}), ("tensorarena fused", "fused", None, {}),
            (vit.FUSED_FLAT, "fused", False, {}), (FUSED_EVERY_TOKEN, "fused", None, {"cls_only_last_block": False}),
            (FUSED_RECOMPUTE, "fused", None, {"recompute_mlp_activation": True})):
        trainer = our_trainer(vit, case_name, route, in_backward, **config)
        if route == "fused":
            trainer.step(xs, ys)  # records the step (compile/captured.py); it must have passed its checks
            if trainer.fused.plan.capture is None or trainer.fused.plan.capture.tape is None:
                raise SystemExit(f"{name}: the step was not captured ({trainer.fused.replay_reason}; "
                                 f"{trainer.fused.plan.capture and trainer.fused.plan.capture.note})")
        steps[name] = lambda trainer=trainer: trainer.step(xs, ys).loss
        if route == "fused":
            steps.setdefault("_predicted_peak", {})[name] = trainer.fused.memory_report()["predicted_peak"]
    python_replay = our_trainer(vit, case_name, "fused", fused_replay="python")
    steps[FUSED_PYTHON] = lambda: python_replay.step(xs, ys).loss
    steps["_gemm_backend"] = backend()
    return steps


def main() -> None:
    parser = interleaved_vit_parser(__doc__)
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (it compiles ~1 min)")
    args = parser.parse_args()

    steps = build(args.model, not args.no_compile)
    gemm = steps.pop("_gemm_backend")
    peaks = steps.pop("_predicted_peak")
    times = interleave(steps, args.rounds, args.per_round)  # 3 warm-up steps: torch.compile compiles there
    medians = {name: statistics.median(t) for name, t in times.items()}
    ref, comp = medians["pytorch eager"], medians.get("torch.compile")
    paired = paired_ratios(times, "pytorch eager", args.per_round)
    paired_comp = paired_ratios(times, "torch.compile", args.per_round) if comp else None
    print(f"ViT-{args.model} ({'batch 8' if args.model == 'tiny' else 'batch 1'}), {args.rounds} rounds x "
          f"{args.per_round} steps per contender, interleaved in one process; our GEMMs: {gemm}; CPU: {cpu_name()}")
    print("x columns: ratio of whole-run medians / median over rounds of each round's ratio (common.paired_ratios)")
    print(f"{'contender':<30}{'median ms':>11}{'min ms':>10}{'x pytorch eager':>19}{'x torch.compile':>19}")
    for name, t in times.items():
        print(f"{name:<30}{medians[name] * 1e3:>11.1f}{min(t) * 1e3:>10.1f}"
              f"{f'{medians[name] / ref:.3f} / {paired[name]:.3f}':>19}"
              + (f"{f'{medians[name] / comp:.3f} / {paired_comp[name]:.3f}':>19}" if comp else ""))
    print("fused plans' predicted peak (memory_report): " + "; ".join(
        f"{name} {peak / 2**20:.1f} MiB" for name, peak in peaks.items()))
    out = {"model": args.model, "predicted_peak_bytes": peaks, "cpu": cpu_name(), "gemm_backend": gemm,
           "rounds": args.rounds, "per_round": args.per_round,
           "median_step_s": medians, "step_times_s": times,
           "x_pytorch_eager": {n: m / ref for n, m in medians.items()},
           "x_torch_compile": {n: m / comp for n, m in medians.items()} if comp else None,
           "paired_x_pytorch_eager": paired, "paired_x_torch_compile": paired_comp}
    write_json(args.json, out)


if __name__ == "__main__":
    main()
