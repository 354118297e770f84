"""The shared body of the classifier train jobs (mlp, vit): optimizer to summary dict."""

from __future__ import annotations

import sys
import time

import numpy as np

from ..data.loader import BatchLoader
from ..memory.meter import peak_rss_bytes, rss_bytes
from ..nn.functional import cross_entropy
from ..nn.module import Module
from .summary import bf16_products_since, plan_before_step_1, print_fused_lines, route_summary, step_rate
from .trainer import Trainer


def run_classifier(args, model: Module, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                   *, make_optimizer, make_scheduler, eval_batch_size: int = 1024, postfix_every: int = 10) -> dict:
    """Train `model` on `train` for args.steps (resuming from args.resume), evaluate on `test`, save
    to args.save; return the summary (losses, held-out metrics, speed, memory, per-step figures)."""
    from tqdm import tqdm

    optimizer = make_optimizer(args, model.parameters())
    route = getattr(args, "route", "eager")
    trainer = Trainer(model, optimizer, cross_entropy, scheduler=make_scheduler(args, optimizer),
                      clip_grad_norm=args.clip or None, on_nonfinite=args.on_nonfinite, route=route,
                      memory_limit=getattr(args, "memory_limit", None), store_dir=getattr(args, "store_dir", None),
                      matmul_precision=getattr(args, "matmul_precision", "float32"))
    x_train, y_train = train
    loader = BatchLoader(x_train, y_train, min(args.batch_size, len(x_train)), rng=np.random.default_rng(args.seed + 1))
    if args.resume:
        extra = trainer.load(args.resume)
        if "loader" in extra:
            loader.load_state(extra["loader"])
        print(f"resumed from {args.resume} at step {trainer.step_count}", file=sys.stderr)

    reports = []
    rss_before = rss_bytes()
    products_before = bf16_products_since()
    remaining = max(args.steps - trainer.step_count, 0)
    # The choice, and why, before step 1 (shapes are all it needs).
    planning = plan_before_step_1(trainer, x_train[:loader.batch_size], y_train[:loader.batch_size]) if remaining else None
    started = time.perf_counter()
    bar = tqdm(total=remaining, disable=args.no_progress, unit="step", file=sys.stderr)
    for _ in range(remaining):
        report = trainer.step(*loader.next())
        reports.append(report)
        bar.update(1)
        if report.step % postfix_every == 0 or report.step == args.steps:
            bar.set_postfix(loss=f"{report.loss:.4f}", lr=f"{report.lr:.2e}")
    bar.close()
    elapsed = time.perf_counter() - started
    held_out = trainer.evaluate(*test, batch_size=eval_batch_size)
    if args.save:
        trainer.save(args.save, extra={"loader": loader.state()})
    first, last = (reports[0], reports[-1]) if reports else (None, None)
    high_waters = [r.arena_high_water for r in reports]
    return {
        "model": args.model, "route": last.route if last else trainer.route, "steps": trainer.step_count,
        **route_summary(trainer, planning),
        "matmul_precision": trainer.matmul_precision, "bf16_products": bf16_products_since(products_before),
        "first_loss": first.loss if first else None, "final_loss": last.loss if last else None,
        "test_loss": held_out["loss"], "test_accuracy": held_out["accuracy"],
        **step_rate([r.seconds for r in reports], elapsed),
        "peak_rss_bytes": peak_rss_bytes(), "rss_growth_bytes": rss_bytes() - rss_before,
        "arena_high_water_bytes": max(high_waters, default=0), "parameters": model.num_parameters(),
        # Per step, so callers can check the arena invariant (flat after warm-up) and the loss curve.
        "step_losses": [r.loss for r in reports], "step_arena_high_water_bytes": high_waters,
    }


def print_classifier_result(summary: dict, header: str, *, test_note: str = "", accuracy_note: str = "") -> None:
    """The job-specific head of a classifier run's report: what trained, losses, held-out metrics."""
    print(f"trained {summary['model']} ({summary['parameters']:,} parameters{header}) for {summary['steps']} "
          f"steps on the {summary['route']} route")
    if summary["first_loss"] is not None:
        print(f"  train loss        {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}")
    print(f"  held-out loss     {summary['test_loss']:.4f}{test_note}")
    print(f"  held-out accuracy {summary['test_accuracy']:.2%}{accuracy_note}")
    print_fused_lines(summary)
