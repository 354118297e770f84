"""`tensorarena train --model vit-tiny|vit-small|vit-base`: a ViT classifier on the generated shape images.

The pattern of cli.train_mlp: fill the model's defaults, build model, optimizer, schedule
and Trainer (one arena per step), run with a progress bar, evaluate on held-out images and
print/return a summary. The images come from tensorarena.data.images, drawn at
--image-size. Without --train-size the job draws no more training images than the whole
run can show once (total steps x batch, at most 8000), so a 224x224 run does not spend
gigabytes on pictures it never uses; the count depends on the run's length, never on
where --steps stops it, and a resumed run draws the checkpoint's.
"""

from __future__ import annotations


from .classifier_job import prepare_resume, print_classifier_result, resolve_train_size, run_classifier
from .summary import finish

VIT_DEFAULTS = {"steps": 60, "batch_size": 32, "lr": 1e-3, "warmup": 6}
MAX_DEFAULT_TRAIN_IMAGES = 8000  # the default --train-size of a long run
PRESETS = ("tiny", "small", "base")
# Held-out images are capped by bytes as well: 2000 images of 224x224 would be 1.2 GB.
MAX_TEST_BYTES = 64 << 20


def _positive(args, *names: str) -> None:
    for name in names:
        if getattr(args, name) <= 0:
            raise SystemExit(f"tensorarena train: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")


def default_train_images(total_steps: int, batch_size: int) -> int:
    """Training images a run draws without --train-size: what its total_steps x batch_size show once, at most
    MAX_DEFAULT_TRAIN_IMAGES and at least one batch. `tensorarena plan` counts the data with it too."""
    return max(min(MAX_DEFAULT_TRAIN_IMAGES, total_steps * batch_size), batch_size)


def test_images(test_size: int, image_size: int) -> int:
    """Held-out images a run draws for --test-size: at most MAX_TEST_BYTES of float32 RGB, at least one."""
    per_image = 3 * image_size ** 2 * 4
    return max(min(test_size, MAX_TEST_BYTES // per_image), 1)


def build_vit(args, *, command: str = "train"):
    """The ViT preset named by args.model ('vit-tiny' ...) at args.image_size / args.patch_size, 10 classes;
    errors name the `tensorarena COMMAND` that asked (train or plan).

    Built under nn.deferred_init(): its parameters hold no values until the Trainer makes them where its route
    keeps them (stage by stage into the store when streaming, in memory for fused), exactly the values an eager
    build makes, so a ViT bigger than the memory limit still trains (and `tensorarena plan` plans it alike)."""
    from ..data.images import NUM_CLASSES
    from ..models.vit import ViT, ViTConfig
    from ..nn import deferred_init
    from ..random import INIT_STREAM, seed_stream

    preset = args.model.split("-", 1)[1]
    if preset not in PRESETS:
        raise SystemExit(f"tensorarena {command}: unknown ViT preset {args.model!r}; choose one of "
                         f"{', '.join('vit-' + p for p in PRESETS)}")
    if args.image_size % args.patch_size:
        raise SystemExit(f"tensorarena {command}: --image-size {args.image_size} must be a multiple of "
                         f"--patch-size {args.patch_size}")
    dropout = getattr(args, "dropout", 0.0)  # `tensorarena plan` builds the model without one
    if not 0 <= dropout < 1:
        raise SystemExit(f"tensorarena {command}: --dropout must be in [0, 1), got {dropout}")
    config = getattr(ViTConfig, preset)(image_size=args.image_size, patch_size=args.patch_size,
                                        num_classes=NUM_CLASSES, dropout=dropout)
    with deferred_init():
        return ViT(config, rng=seed_stream(args.seed, INIT_STREAM))  # not the images' stream (random.py)


def train_vit(args) -> dict:
    """Train a ViT preset on the generated shape images; returns the summary it prints."""
    from ..cli import _make_optimizer, _make_scheduler, apply_defaults
    from ..data.images import train_test_split
    from ..random import manual_seed_job

    apply_defaults(args, VIT_DEFAULTS)
    _positive(args, "steps", "batch_size", "test_size", "image_size", "patch_size")
    if args.dtype != "float32":
        raise SystemExit("tensorarena train: the ViT presets train in float32; drop --dtype float64")
    resumed = prepare_resume(args)  # the run's length (args.total_steps) and the checkpoint's data size
    n_train = args.train_size = resolve_train_size(args, resumed, default_train_images(args.total_steps,
                                                                                        args.batch_size))
    n_test = test_images(args.test_size, args.image_size)
    (x_train, y_train), (x_test, y_test) = train_test_split(n_train, n_test, size=args.image_size, seed=args.seed)
    manual_seed_job(args.seed)
    model = build_vit(args)
    summary = run_classifier(args, model, (x_train, y_train), (x_test, y_test), make_optimizer=_make_optimizer,
                             make_scheduler=_make_scheduler, resumed=resumed, eval_batch_size=args.batch_size,
                             postfix_every=5)
    summary.update(image_size=args.image_size, patch_size=args.patch_size, batch_size=args.batch_size,
                   train_images=n_train, test_images=n_test)
    print_classifier_result(summary, f", {args.image_size}x{args.image_size} images, {args.patch_size}px patches",
                            test_note=f"  ({n_test} images)", accuracy_note="  (chance 10%)")
    return finish(summary, json_path=args.json, saved_line=f"  checkpoint        {args.save}" if args.save else None, rate_digits=2)
