"""The shared body of the classifier train jobs (mlp, vit): optimizer to summary dict, and --resume's checks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from ..data.loader import BatchLoader
from ..memory.meter import peak_rss_bytes, rss_bytes
from ..nn.functional import cross_entropy
from ..nn.module import Module
from .interrupt import RunInterrupted, SigintDeferred, StepAbandoned
from .report import NonFiniteLossError, save_after_error
from .save_rescue import CheckpointNotSaved, check_save_room, save_or_rescue
from .summary import (bf16_products_since, plan_before_step_1, print_fused_lines, print_skipped, route_summary,
                      step_rate)
from .trainer import Trainer
from .trainer_streaming import drop_temporary_store


def classifier_data_bytes(n_train: int, n_test: int, example_shape: tuple[int, ...], dtype=np.float32) -> int:
    """Bytes of the train and held-out sets a classifier job holds all run: (n, *example_shape) inputs of
    `dtype` and one int64 label per example (data.digits and data.images draw them so). `tensorarena plan`
    counts the data with it, without drawing any; run_classifier takes the arrays' own nbytes."""
    per_example = int(np.prod(example_shape)) * np.dtype(dtype).itemsize + np.dtype(np.int64).itemsize
    return (n_train + n_test) * per_example


def _refuse_resume(args, why: str):
    raise SystemExit(f"tensorarena train: --resume {args.resume} {why}")


def prepare_resume(args) -> dict | None:
    """The --resume checkpoint's metadata (None without --resume), checked to be a tensorarena checkpoint,
    and args.total_steps set: the checkpoint's run length, else --total-steps, else --steps."""
    from ..cli import resolve_total_steps

    meta = _read_checkpoint_metadata(args) if args.resume else None
    if meta is not None:
        _take_run_options(args, _saved(meta, "options") or {})
    args.total_steps = resolve_total_steps(args, _saved(meta, "total_steps"))
    return meta


# Options a resumed run must share with the checkpoint's run. --seed draws the data set and the test set, and
# --activation / --dropout build the model: other values (even the defaults, when the first run set them)
# silently made another run of the same shapes. --lr, --weight-decay, --momentum and --warmup live in the
# optimizer's and the schedule's state, which the checkpoint overwrites: another value was ignored unsaid.
# --batch-size and --clip shape every later step (and the loader's saved position counts batches): left out on a
# resume they went back to the defaults without a word, so the resumed run was another run.
# --dtype, --matmul-precision and --micro-batch too: left out, a float64 run went on in float32 (its weights and Adam
# moments cast down unsaid), bfloat16 products became float32 ones, and micro-batches one pass with other masks.
RUN_OPTIONS = ("seed", "activation", "dropout", "lr", "weight_decay", "momentum", "warmup", "batch_size", "clip",
               "dtype", "matmul_precision", "micro_batch")


def _run_options(args) -> dict:
    return {name: getattr(args, name) for name in RUN_OPTIONS if hasattr(args, name)}


def _take_run_options(args, saved: dict) -> None:
    """Options left out on --resume become the checkpoint's; one given with another value is refused, naming
    it and the checkpoint's value. `args.given_options` (cli.main sets it) says which the user typed; without
    it every option counts as typed, so nothing is overridden unasked."""
    given = getattr(args, "given_options", None)
    for name, value in saved.items():
        if name not in RUN_OPTIONS or not hasattr(args, name) or getattr(args, name) == value:
            continue
        if given is not None and name not in given:
            setattr(args, name, value)
            continue
        if name == "micro_batch" and value is None and isinstance(getattr(args, name), int) and \
                getattr(args, name) >= args.batch_size:
            continue  # one pass, as saved: a micro-batch not below the batch is none (cli.one_pass_micro_batch)
        flag = "--" + name.replace("_", "-")
        same = f"leave {flag} out" + (f" or pass {flag} {value}" if value is not None else "")  # no "--x None"
        _refuse_resume(args, f"was trained with {'no ' + flag if value is None else f'{flag} {value}'}, not "
                             f"{flag} {getattr(args, name)}: a resumed run goes on with its checkpoint's; {same}")


def _saved(meta: dict | None, key: str):
    """An entry the job stored in the checkpoint's extra dict (None: no checkpoint, or one from before it)."""
    return ((meta or {}).get("extra") or {}).get(key)


def _read_checkpoint_metadata(args) -> dict:
    from safetensors import SafetensorError

    from .checkpoint import read_metadata

    path = Path(args.resume)
    if not path.exists():
        _refuse_resume(args, "does not exist: pass the checkpoint file a run wrote with --save")
    if path.is_dir():
        _refuse_resume(args, "is a directory: pass the checkpoint file a run wrote with --save")
    try:
        return read_metadata(path)
    except (OSError, ValueError, SafetensorError) as err:  # not safetensors, truncated, unreadable, no metadata
        # (its message names the file and says it is no readable checkpoint already: said once, not twice)
        _refuse_resume(args, f"cannot be resumed: {err}")


def resolve_train_size(args, resumed: dict | None, default: int) -> int:
    """--train-size, else the resumed checkpoint's, else `default`. A resumed run must draw the data set it
    was trained on: the loader's saved position (a shuffled order of its indices) means nothing in another."""
    saved = _saved(resumed, "train_size")
    if args.train_size is not None and saved is not None and args.train_size != saved:
        _refuse_resume(args, f"was trained on {saved} examples, not --train-size {args.train_size}: its data "
                             f"loader's position is one in that data set; pass --train-size {saved} or leave "
                             f"it out")
    return args.train_size or saved or default


def _mlp_hidden(saved: dict[str, tuple]) -> str | None:
    """The --hidden of an MLP checkpoint (parameter name -> shape): the widths of its Linear layers but the last,
    in order (models/mlp.py names them net.<i>.weight), as "64,64"; None when it is not an MLP's (another --model
    is then the advice). Said when only the number of layers differs, where "another --model" misled."""
    weights = sorted(((int(name.split(".")[1]), shape) for name, shape in saved.items()
                      if name.startswith("net.") and name.endswith(".weight") and name.split(".")[1].isdigit()
                      and len(shape) == 2))
    if len(weights) < 2 or len(weights) * 2 < len(saved):
        return None
    return ",".join(str(shape[0]) for _, shape in weights[:-1])


def _check_checkpoint_fits(args, model: Module, optimizer, scheduler) -> None:
    """SystemExit naming --resume and what differs when the checkpoint is of another model (its parameter
    names or shapes: another --model, --hidden, --image-size ...), optimizer or schedule. Reads the
    file's header only, before anything is loaded."""
    from safetensors import safe_open

    from .checkpoint import read_metadata

    with safe_open(str(args.resume), framework="numpy") as f:
        saved = {k.removeprefix("model."): tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("model.")}
    here = {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}  # shapes: no values read
    if set(saved) != set(here):
        missing, unknown = sorted(set(here) - set(saved)), sorted(set(saved) - set(here))
        hidden = _mlp_hidden(saved) if args.model == "mlp" else None
        advice = (f"resume with the --hidden it was trained with (its layers: --hidden {hidden})" if hidden
                  else "resume with the --model it was trained with")
        _refuse_resume(args, f"holds another model's parameters than --model {args.model}'s (missing here: "
                             f"{', '.join(missing[:3]) or 'none'}; not in this model: {', '.join(unknown[:3]) or 'none'}); "
                             f"{advice}")
    for name, shape in here.items():
        if saved[name] != shape:
            _refuse_resume(args, f"holds {name} of shape {saved[name]}, and this model's is {shape}: resume with "
                                 f"the model options it was trained with (--hidden, --image-size, --patch-size)")
    meta = read_metadata(args.resume)
    for key, flag, current in (("optimizer", "--optimizer", optimizer), ("scheduler", "--schedule", scheduler)):
        kind = (meta.get(key) or {}).get("class")
        if kind is not None and kind != type(current).__name__:
            _refuse_resume(args, f"holds {kind} state, and {flag} {getattr(args, flag[2:])} builds "
                                 f"{type(current).__name__}: resume with the {flag} it was trained with")


def _check_streaming_route(args, model: Module) -> None:
    """--route streaming needs a model cut into blocks; else a StreamingUnsupportedError traceback at step 1."""
    if args.route == "streaming" and not callable(getattr(model, "stream_stages", None)):
        raise SystemExit(f"tensorarena train: --route streaming needs a model cut into blocks (the vit-* "
                         f"presets), and --model {args.model} has none; use --route auto, fused or eager")


def _resume(args, trainer: Trainer, loader: BatchLoader) -> None:
    """Load the checkpoint into the trainer and the loader; SystemExit naming --resume on any mismatch the
    header checks could not see (dtypes, a truncated body, a loader position outside the data)."""
    from safetensors import SafetensorError

    try:
        extra = trainer.load(args.resume)
        if "loader" in extra:
            loader.load_state(extra["loader"])
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
        _refuse_resume(args, f"cannot be resumed here: {err}")
    print(f"resumed from {args.resume} at step {trainer.step_count}", file=sys.stderr)


def run_classifier(args, model: Module, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                   *, make_optimizer, make_scheduler, resumed: dict | None = None, eval_batch_size: int | None = None,
                   postfix_every: int = 10) -> dict:
    """Train `model` on `train` until step args.steps (resuming from args.resume, whose metadata prepare_resume
    read into `resumed`), evaluate on `test`, save to args.save; return the summary (losses, held-out
    metrics, speed, memory, per-step figures).

    `eval_batch_size` defaults to args.batch_size: the route plan covers evaluation at the training batch size,
    which on the fused route runs in the fused slab (Trainer.scratch_arena). The mlp evaluated at 1024 rows,
    ~3.4 MiB of activations no plan counted, which took its run 1.6% over the plan's need. With --micro-batch
    the slab is a micro-batch's, so evaluation runs micro-batch by micro-batch: at the training batch it would
    take pool blocks beyond the slab, which no plan counts (Trainer.scratch_arena warns)."""
    from tqdm import tqdm

    x_train, y_train = train
    if args.batch_size > len(x_train):
        # The loader drops an epoch's last partial batch, so a batch takes at most the whole data set; it used
        # to be cut to that size without a word while the summary reported the --batch-size asked for.
        raise SystemExit(f"tensorarena train: --batch-size {args.batch_size} is larger than the {len(x_train)} "
                         f"training examples; pass a smaller --batch-size"
                         f"{'' if args.resume else ' or a larger --train-size'}")
    if getattr(args, "micro_batch", None) is not None:
        from ..cli import one_pass_micro_batch

        args.micro_batch = one_pass_micro_batch("train", args.micro_batch, args.batch_size)
    optimizer = make_optimizer(args, model.parameters())
    scheduler = make_scheduler(args, optimizer)
    if args.resume:
        _check_checkpoint_fits(args, model, optimizer, scheduler)
    if getattr(args, "schedule_warning", None):  # cli.resolve_total_steps's, now that the schedule is the checkpoint's
        print(args.schedule_warning, file=sys.stderr)
    if args.save:
        check_save_room(args.save, optimizer)
    route = getattr(args, "route", "eager")
    _check_streaming_route(args, model)
    trainer = Trainer(model, optimizer, cross_entropy, scheduler=scheduler,
                      clip_grad_norm=args.clip or None, on_nonfinite=args.on_nonfinite, route=route,
                      memory_limit=getattr(args, "memory_limit", None), store_dir=getattr(args, "store_dir", None),
                      matmul_precision=getattr(args, "matmul_precision", "float32"),
                      micro_batch=getattr(args, "micro_batch", None))
    # The arrays held all run are a part of the route plan, not of its measured process share: `tensorarena
    # plan` (which draws no data) counts the same bytes, so the two agree (route_plan.TRAINING_DATA).
    trainer.data_bytes = sum(a.nbytes for a in (*train, *test))
    loader = BatchLoader(x_train, y_train, args.batch_size, rng=np.random.default_rng(args.seed + 1))
    if args.resume:
        _resume(args, trainer, loader)

    reports = []
    rss_before = rss_bytes()
    products_before = bf16_products_since()
    remaining = max(args.steps - trainer.step_count, 0)
    # The choice, and why, before step 1 (shapes are all it needs).
    planning = plan_before_step_1(trainer, x_train[:loader.batch_size], y_train[:loader.batch_size]) if remaining else None
    started = time.perf_counter()
    bar = tqdm(total=remaining, disable=args.no_progress, unit="step", file=sys.stderr)
    saved = False
    try:
        for _ in range(remaining):
            # Ctrl-C held over the batch's draw and the step (Trainer.step's own hold is then a no-op): a batch
            # drawn but not trained would be skipped by the saved loader position, and --resume would differ.
            with SigintDeferred("the training step", lambda: _step_abandoned(args, trainer)):
                batch = loader.next()
                try:
                    report = trainer.step(*batch)
                except Exception:  # a non-finite loss, an out-of-memory, a bug: the step changed nothing
                    loader.rewind()  # the failed step's batch is the one a --resume of the save trains on next
                    raise
                reports.append(report)
            bar.update(1)
            if report.step % postfix_every == 0 or report.step == args.steps:
                bar.set_postfix(loss=f"{report.loss:.4f}", lr=f"{report.lr:.2e}")
        bar.close()
        elapsed = time.perf_counter() - started
        held_out = trainer.evaluate(*test, batch_size=trainer.micro_batch or eval_batch_size
                                    or args.batch_size)
        if args.save:
            with SigintDeferred("the checkpoint's write", lambda: _save_abandoned(args, trainer)):
                saved = _save_progress(args, trainer, loader, reports, resumed, always=True)
    except NonFiniteLossError as err:
        bar.close()
        raise NonFiniteLossError(f"{err}{_save_before_failure(args, trainer, loader, reports, resumed)}") from None
    except KeyboardInterrupt as err:
        bar.close()
        raise _interrupted(args, trainer, loader, reports, resumed, err, saved) from None
    except Exception as err:
        bar.close()
        if not saved and not isinstance(err, CheckpointNotSaved):  # a failed save is not tried twice
            save_after_error(err, trainer, lambda: _save_before_failure(args, trainer, loader, reports, resumed))
        raise
    # The route the model last trained on: this run's last step, else the checkpoint's (no step ran).
    last_route = _last_route(reports, resumed)
    first, last = (reports[0], reports[-1]) if reports else (None, None)
    high_waters = [r.arena_high_water for r in reports]
    summary = {
        "model": args.model, "route": last_route, "steps": trainer.step_count, "steps_this_run": len(reports),
        "total_steps": args.total_steps,
        **route_summary(trainer, planning),
        "matmul_precision": trainer.matmul_precision, "bf16_products": bf16_products_since(products_before),
        "micro_batch": trainer.micro_batch,
        "first_loss": first.loss if first else None, "final_loss": last.loss if last else None,
        "test_loss": held_out["loss"], "test_accuracy": held_out["accuracy"],
        **step_rate([r.seconds for r in reports], elapsed),
        "peak_rss_bytes": peak_rss_bytes(), "rss_growth_bytes": rss_bytes() - rss_before,
        "arena_high_water_bytes": max(high_waters, default=0), "parameters": model.num_parameters(),
        # Per step, so callers can check the arena invariant (flat after warm-up) and the loss curve.
        "step_losses": [r.loss for r in reports], "step_arena_high_water_bytes": high_waters,
        # Steps whose non-finite loss was skipped (--on-nonfinite skip): counted, but they updated nothing.
        "skipped_steps": sum(bool(r.skipped) for r in reports),
    }
    drop_temporary_store(trainer)  # saved and evaluated: its state read back would only take memory (the budget's)
    return summary


def _checkpoint_extra(args, loader: BatchLoader, route: str | None) -> dict:
    """What a --resume needs besides the trainer's state: the loader's position, the run's length (the
    schedule's), the data set's size, the route the model last trained on and the RUN_OPTIONS."""
    return {"loader": loader.state(), "total_steps": args.total_steps, "train_size": len(loader.inputs),
            "route": route, "options": _run_options(args)}


def _last_route(reports: list, resumed: dict | None) -> str | None:
    """The route the model last trained on: this run's last step, else the checkpoint's (no step ran)."""
    return reports[-1].route if reports else _saved(resumed, "route")


def _save_progress(args, trainer: Trainer, loader: BatchLoader, reports: list, resumed: dict | None, *,
                   always: bool = False) -> bool:
    """Write the trainer's state (its last completed step) to --save, as the end of a run does; whether it wrote.

    A run stopped early (a non-finite loss, Ctrl-C) writes only if it has steps to keep: this run's, or
    (`always`, the end of a run) a resumed checkpoint's."""
    if not args.save or not (reports or always or args.resume):
        return False
    save_or_rescue(trainer, args.save, _checkpoint_extra(args, loader, _last_route(reports, resumed)))
    return True


def _save_before_failure(args, trainer: Trainer, loader: BatchLoader, reports: list, resumed: dict | None) -> str:
    """On a non-finite loss that stops the run: save the steps before it to --save (the failed step updated
    nothing and left the RNGs as they were), so they are not lost; returns a sentence saying so."""
    if not _save_progress(args, trainer, loader, reports, resumed):
        return ""
    steps = f"{trainer.step_count} step{'s' if trainer.step_count != 1 else ''}"
    return f" The {steps} before it are saved in --save {args.save}."


def _interrupted(args, trainer: Trainer, loader: BatchLoader, reports: list, resumed: dict | None,
                 err: KeyboardInterrupt, saved: bool) -> RunInterrupted:
    """After Ctrl-C: the last completed step saved to --save (unless the end of the run saved it already, or
    a second Ctrl-C abandoned a step or the write); the one line `tensorarena train` prints for it."""
    if isinstance(err, StepAbandoned):
        return RunInterrupted(str(err))  # the job's own words (_step_abandoned, _save_abandoned)
    where = f"tensorarena train: interrupted at step {trainer.step_count} of {args.steps}"
    if not saved and args.save and reports:
        # Held like the end's write: one more Ctrl-C waits for it, a second abandons it (the file stays whole).
        try:
            with SigintDeferred("the checkpoint's write", lambda: _save_abandoned(args, trainer), raise_after=False):
                saved = _save_progress(args, trainer, loader, reports, resumed)
        except StepAbandoned as again:
            return RunInterrupted(str(again))
    if saved:
        return RunInterrupted(f"{where}; saved to {args.save} (resume with --resume {args.save})")
    if args.save:
        return RunInterrupted(f"{where}; nothing saved (no step completed in this run"
                              f"{f'; --resume {args.resume} is as it was' if args.resume else ''})")
    return RunInterrupted(f"{where}; nothing saved (pass --save PATH to keep a run)")


def _step_abandoned(args, trainer: Trainer) -> str:
    """The line for a second Ctrl-C during a step (the first was held until it completed)."""
    kept = f"; {args.save} is as it was before this run" if args.save else ""
    return (f"tensorarena train: interrupted twice at step {trainer.step_count + 1} of {args.steps}: that step "
            f"was abandoned part-way and the model may hold part of it, so nothing was saved{kept}")


def _save_abandoned(args, trainer: Trainer) -> str:
    """The line for a second Ctrl-C while the checkpoint is written: the write (to a temporary file, renamed
    over the path once whole: checkpoint._atomic_write) leaves the path as it was."""
    return (f"tensorarena train: interrupted twice at step {trainer.step_count} of {args.steps}, while writing "
            f"{args.save}: the write was abandoned and {args.save} is as it was before (checkpoints are written "
            f"whole or not at all)")


def print_classifier_result(summary: dict, header: str, *, test_note: str = "", accuracy_note: str = "") -> None:
    """The job-specific head of a classifier run's report: what trained, losses, held-out metrics."""
    if summary["steps_this_run"]:
        micro = f", in micro-batches of {summary['micro_batch']}" if summary.get("micro_batch") else ""
        print(f"trained {summary['model']} ({summary['parameters']:,} parameters{header}) for {summary['steps']} "
              f"steps on the {summary['route']} route{micro}")
    else:
        print(f"nothing trained: {summary['model']} ({summary['parameters']:,} parameters{header}) is already at "
              f"step {summary['steps']}, which --steps does not go past; its last step ran on the "
              f"{summary['route'] or 'none (no step run)'} route")
    if summary["first_loss"] is not None:
        print(f"  train loss        {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}")
    print_skipped(summary)
    print(f"  held-out loss     {summary['test_loss']:.4f}{test_note}")
    print(f"  held-out accuracy {summary['test_accuracy']:.2%}{accuracy_note}")
    print_fused_lines(summary)
