"""`tensorarena train --model vit-tiny|vit-small|vit-base`: a ViT classifier on the generated shape images.

The pattern of cli.train_mlp: fill the model's defaults, build model, optimizer, schedule
and Trainer (one arena per step), run with a progress bar, evaluate on held-out images and
print/return a summary. The images come from tensorarena.data.images, drawn at
--image-size; the job never draws more training images than the run can show once
(steps x batch), so a 224x224 run does not spend gigabytes on pictures it never uses.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..memory.meter import peak_rss_bytes, rss_bytes
from .summary import finish

VIT_DEFAULTS = {"steps": 60, "batch_size": 32, "lr": 1e-3, "warmup": 6}
PRESETS = ("tiny", "small", "base")
# Held-out images are capped by bytes as well: 2000 images of 224x224 would be 1.2 GB.
MAX_TEST_BYTES = 64 << 20


def _positive(args, *names: str) -> None:
    for name in names:
        if getattr(args, name) <= 0:
            raise SystemExit(f"tensorarena train: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")


def build_vit(args):
    """The ViT preset named by args.model ('vit-tiny' ...) at args.image_size / args.patch_size, 10 classes."""
    from ..data.images import NUM_CLASSES
    from ..models.vit import ViT, ViTConfig

    preset = args.model.split("-", 1)[1]
    if preset not in PRESETS:
        raise SystemExit(f"tensorarena train: unknown ViT preset {args.model!r}; choose one of "
                         f"{', '.join('vit-' + p for p in PRESETS)}")
    if args.image_size % args.patch_size:
        raise SystemExit(f"tensorarena train: --image-size {args.image_size} must be a multiple of "
                         f"--patch-size {args.patch_size}")
    config = getattr(ViTConfig, preset)(image_size=args.image_size, patch_size=args.patch_size,
                                        num_classes=NUM_CLASSES)
    return ViT(config, rng=np.random.default_rng(args.seed))


def train_vit(args) -> dict:
    """Train a ViT preset on the generated shape images; returns the summary it prints."""
    from tqdm import tqdm

    from ..cli import _make_optimizer, _make_scheduler, apply_defaults
    from ..data.images import train_test_split
    from ..data.loader import BatchLoader
    from ..nn.functional import cross_entropy
    from ..random import manual_seed
    from .trainer import Trainer

    apply_defaults(args, VIT_DEFAULTS)
    _positive(args, "steps", "batch_size", "train_size", "test_size", "image_size", "patch_size")
    if args.dtype != "float32":
        raise SystemExit("tensorarena train: the ViT presets train in float32; drop --dtype float64")
    n_train = max(min(args.train_size, args.steps * args.batch_size), args.batch_size)
    per_image = 3 * args.image_size ** 2 * 4
    n_test = max(min(args.test_size, MAX_TEST_BYTES // per_image), 1)
    (x_train, y_train), (x_test, y_test) = train_test_split(n_train, n_test, size=args.image_size, seed=args.seed)
    manual_seed(args.seed)
    model = build_vit(args)
    optimizer = _make_optimizer(args, model.parameters())
    scheduler = _make_scheduler(args, optimizer)
    trainer = Trainer(model, optimizer, cross_entropy, scheduler=scheduler,
                      clip_grad_norm=args.clip or None, on_nonfinite=args.on_nonfinite)
    loader = BatchLoader(x_train, y_train, args.batch_size, rng=np.random.default_rng(args.seed + 1))
    if args.resume:
        extra = trainer.load(args.resume)
        if "loader" in extra:
            loader.load_state(extra["loader"])
        print(f"resumed from {args.resume} at step {trainer.step_count}", file=sys.stderr)

    reports = []
    rss_before = rss_bytes()
    remaining = max(args.steps - trainer.step_count, 0)
    started = time.perf_counter()
    bar = tqdm(total=remaining, disable=args.no_progress, unit="step", file=sys.stderr)
    for _ in range(remaining):
        report = trainer.step(*loader.next())
        reports.append(report)
        bar.update(1)
        if report.step % 5 == 0 or report.step == args.steps:
            bar.set_postfix(loss=f"{report.loss:.4f}", lr=f"{report.lr:.2e}")
    bar.close()
    elapsed = time.perf_counter() - started
    held_out = trainer.evaluate(x_test, y_test, batch_size=args.batch_size)
    if args.save:
        trainer.save(args.save, extra={"loader": loader.state()})
    first, last = (reports[0], reports[-1]) if reports else (None, None)
    high_waters = [r.arena_high_water for r in reports]
    summary = {
        "model": args.model, "route": last.route if last else "eager", "steps": trainer.step_count,
        "image_size": args.image_size, "patch_size": args.patch_size, "batch_size": args.batch_size,
        "train_images": n_train, "test_images": n_test,
        "first_loss": first.loss if first else None, "final_loss": last.loss if last else None,
        "test_loss": held_out["loss"], "test_accuracy": held_out["accuracy"],
        "steps_per_second": remaining / elapsed if elapsed > 0 and remaining else None,
        "peak_rss_bytes": peak_rss_bytes(), "rss_growth_bytes": rss_bytes() - rss_before,
        "arena_high_water_bytes": max(high_waters, default=0), "parameters": model.num_parameters(),
        # Per step, so callers can check the arena invariant (flat after warm-up) and the loss curve.
        "step_losses": [r.loss for r in reports], "step_arena_high_water_bytes": high_waters,
    }
    print(f"trained {args.model} ({summary['parameters']:,} parameters, {args.image_size}x{args.image_size} "
          f"images, {args.patch_size}px patches) for {trainer.step_count} steps on the {summary['route']} route")
    if first:
        print(f"  train loss        {first.loss:.4f} -> {last.loss:.4f}")
    print(f"  held-out loss     {held_out['loss']:.4f}  ({n_test} images)")
    print(f"  held-out accuracy {held_out['accuracy']:.2%}  (chance 10%)")
    return finish(summary, json_path=args.json, saved_line=f"  checkpoint        {args.save}" if args.save else None, rate_digits=2)
