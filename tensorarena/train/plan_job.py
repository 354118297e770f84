"""`tensorarena plan`: every route's memory for a model, batch and optimizer, the chosen route and why.

    tensorarena plan --model vit-base --image-size 224 --batch 8 --memory-limit 2G

Builds the model (parameters only: nothing is trained), estimates the fused, eager and
streaming routes (train/route_plan.py: persistent bytes from shapes, activations traced
stage by stage at the real batch size) and prints the table the Trainer's route="auto" uses.
Left out, --batch, --image-size and --patch-size are what `tensorarena train` runs for the model.
The data train holds all run (train and held-out sets, or simcse's tokenized corpus) is the part
"training data", counted from train's sizes for the model (--steps, --train-size, --test-size: a vit
draws no more images than the run shows once) without drawing it.
"""

from __future__ import annotations

import json
import sys

import numpy as np



def add_plan_parser(sub) -> None:
    from ..cli import MOMENTUM, HelpFormatter, _int_tuple, memory_size, nonnegative_float, positive_int, probability

    # The defaults are `tensorarena train`'s (its parser's, and each model's --batch-size), so a plan
    # without options describes the run a train without options makes.
    train = sub.choices["train"]
    plan = sub.add_parser(
        "plan", help="estimate each training route's memory and pick one",
        description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    plan.add_argument("--model", choices=["mlp", "vit-tiny", "vit-small", "vit-base", "simcse"], default="vit-base",
                      help="the model to plan, as train's --model")
    plan.add_argument("--batch", "--batch-size", dest="batch", type=positive_int, default=None,
                      help="examples per step (simcse: sentences, each run twice), as train's --batch-size "
                           "(default: train's for the model: mlp 128, vit 32, simcse 16)")
    plan.add_argument("--memory-limit", metavar="SIZE", type=memory_size, default=None,
                      help="budget, e.g. 2G (binary units, as train's) (default: the smaller of the cgroup limit "
                           "and this process's RSS plus the available RAM, minus a margin)")
    plan.add_argument("--image-size", type=positive_int, default=train.get_default("image_size"),
                      help="vit: image side (224 is the models' native size)")
    plan.add_argument("--patch-size", type=positive_int, default=train.get_default("patch_size"), help="vit: patch side")
    plan.add_argument("--seq-len", type=positive_int, default=train.get_default("seq_len"),
                      help="simcse: tokens per sentence")
    # The data's size: train draws its data from these (vit: --steps x --batch images at most), and holds it all run.
    plan.add_argument("--steps", type=positive_int, default=None,
                      help="the run's length, as train's --steps (or --total-steps): a vit's default training set "
                           "is what it shows once (default: train's for the model: mlp 400, vit 60, simcse 30)")
    plan.add_argument("--train-size", type=positive_int, default=train.get_default("train_size"),
                      help="mlp, vit: training examples, as train's (default: mlp 8000, vit what --steps shows)")
    plan.add_argument("--test-size", type=positive_int, default=train.get_default("test_size"),
                      help="mlp, vit: held-out examples, as train's (a vit's capped at 64 MiB of images)")
    plan.add_argument("--store-dir", metavar="DIR", default=None,
                      help="streaming: where train would keep its store (nothing is made here); on tmpfs its files "
                           "are memory, and the plan counts them (default: train's temporary directory)")
    plan.add_argument("--micro-batch", type=positive_int, default=None,
                      help="mlp, vit: examples per forward/backward pass, as train's --micro-batch: the step is "
                           "traced on one micro-batch, fused adds a gradient-sized sum, streaming keeps whole-batch "
                           "boundaries")
    plan.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default="adamw",
                      help="its state is part of the plan, as train's --optimizer")
    # The options of train that change the memory a run takes (a plan without them could only describe the
    # defaults: train --hidden 2048,2048 needed 269 MiB where plan could say 191, --dtype float64 was 23% low,
    # --momentum 0 held no momentum buffer that plan counted, and --dropout adds the masks' buffers).
    plan.add_argument("--hidden", type=_int_tuple, default=train.get_default("hidden"),
                      help="mlp: hidden layer widths, as train's")
    plan.add_argument("--activation", choices=["relu", "gelu", "tanh"], default=train.get_default("activation"),
                      help="mlp: hidden activation, as train's")
    plan.add_argument("--dropout", type=probability, default=train.get_default("dropout"),
                      help="dropout probability, as train's (simcse: 0 is the checkpoint's own, 0.1)")
    plan.add_argument("--dtype", choices=["float32", "float64"], default=train.get_default("dtype"),
                      help="mlp, simcse: parameter and compute dtype, as train's")
    plan.add_argument("--momentum", type=nonnegative_float, default=MOMENTUM,
                      help="sgd: momentum, as train's (0: no momentum buffer)")
    plan.add_argument("--matmul-precision", choices=["float32", "bfloat16"], default=train.get_default(
                      "matmul_precision"), help="float32 products or bfloat16 ones, as train's (their rounded "
                                                "operands take buffers of their own)")
    plan.add_argument("--clip", type=nonnegative_float, default=train.get_default("clip"),
                      help="global gradient-norm clip, as `tensorarena train --clip` (0: none, so the fused step "
                           "updates each parameter inside backward and holds no gradient buffer)")
    plan.add_argument("--json", nargs="?", const=True, default=None, metavar="PATH",
                      help="the estimates as JSON: alone, printed after the table; to PATH; with '-' to stdout "
                           "alone (the table goes to stderr), as train's --json -")


def _model_and_batch(args):
    """(model, inputs, targets, loss function) of the job `tensorarena train --model args.model` runs."""
    from ..nn.functional import cross_entropy

    rng = np.random.default_rng(0)
    if args.model == "mlp":
        from ..data.digits import NUM_CLASSES, SIZE
        from ..models.mlp import MLP, MLPConfig

        from ..nn import deferred_init

        with deferred_init():  # as train builds it (cli.train_mlp): the plan is of the run train makes
            model = MLP(MLPConfig(in_features=SIZE * SIZE, hidden=args.hidden, out_features=NUM_CLASSES,
                                  activation=args.activation, dropout=args.dropout, dtype=np.dtype(args.dtype).type),
                        rng=rng)
        x = np.zeros((args.batch, SIZE * SIZE), args.dtype)
        return model, x, np.zeros(args.batch, np.int64), cross_entropy
    if args.model == "simcse":
        return _simcse_and_batch(args)
    from .vit_job import build_vit

    if args.dtype != "float32":  # as train refuses it
        raise SystemExit("tensorarena plan: the ViT presets train in float32; drop --dtype float64")
    args.seed = 0
    model = build_vit(args, command="plan")
    x = np.zeros((args.batch, 3, args.image_size, args.image_size), np.float32)
    return model, x, np.zeros(args.batch, np.int64), cross_entropy


def _check_model_options(args) -> None:
    """As train refuses it (cli.OPTIMIZER_OPTIONS): --momentum with an optimizer that does not read it would be
    planned as if it changed nothing. (Options of another model: cli.check_model_options, before this.)"""
    from ..cli import MOMENTUM

    if args.optimizer != "sgd" and args.momentum != MOMENTUM:
        raise SystemExit(f"tensorarena plan: --momentum does not apply to --optimizer {args.optimizer} (--momentum: "
                         f"sgd only)")


def _check_batch_fits_data(args) -> None:
    """As train refuses it (classifier_job.run_classifier): a batch of more examples than the training set, which
    train would not run, must not be planned as if it would."""
    from ..cli import MLP_TRAIN_SIZE, model_defaults

    if args.model == "mlp":
        n_train = args.train_size or MLP_TRAIN_SIZE
    else:
        from .vit_job import default_train_images

        n_train = args.train_size or default_train_images(args.steps or model_defaults(args.model)["steps"], args.batch)
    if args.batch > n_train:
        raise SystemExit(f"tensorarena plan: --batch {args.batch} is larger than the {n_train} training examples "
                         f"(train refuses it); pass a smaller --batch or a larger --train-size")


def _data_bytes(args) -> int:
    """The bytes of data `tensorarena train --model args.model` holds all run (route_plan.TRAINING_DATA), from
    the sizes it would draw (the job's own functions for them), without drawing any."""
    from ..cli import MLP_TRAIN_SIZE, model_defaults
    from .classifier_job import classifier_data_bytes

    if args.model == "mlp":
        from ..data.digits import SIZE

        return classifier_data_bytes(args.train_size or MLP_TRAIN_SIZE, args.test_size, (SIZE * SIZE,), args.dtype)
    if args.model == "simcse":
        from ..text import python_reference_sentences
        from .simcse_job import PROBE_SIZE, corpus_data_bytes

        # The corpus's size, as train splits it (the probe sentences first); read, not tokenized.
        return corpus_data_bytes(len(python_reference_sentences(seed=0)) - PROBE_SIZE, args.batch, args.seq_len)
    from .vit_job import default_train_images, test_images

    steps = args.steps or model_defaults(args.model)["steps"]
    n_train = args.train_size or default_train_images(steps, args.batch)
    return classifier_data_bytes(n_train, test_images(args.test_size, args.image_size),
                                 (3, args.image_size, args.image_size))


def _simcse_and_batch(args):
    """SimCSE over all-MiniLM-L6-v2, as `tensorarena train --model simcse` builds it, and a batch of
    args.batch unpadded sentences of args.seq_len tokens (the job pads every batch to that length)."""
    from ..models.bert import BertModel
    from ..models.simcse import SimCSE
    from ..text import locate_minilm
    from .simcse_job import _model_loss

    if args.batch < 2:
        raise SystemExit("tensorarena plan: simcse needs --batch >= 2 (the other sentences are the negatives)")
    overrides = {"dtype": np.dtype(args.dtype).type}  # as train builds it (simcse_job.train_simcse)
    if args.dropout > 0:
        overrides.update(hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout)
    try:
        encoder = BertModel.from_pretrained(locate_minilm(), rng=np.random.default_rng(0), **overrides)
    except FileNotFoundError as e:
        raise SystemExit(f"tensorarena plan: {e}") from None
    if not 3 <= args.seq_len <= encoder.config.max_position_embeddings:
        raise SystemExit(f"tensorarena plan: --seq-len must be in [3, {encoder.config.max_position_embeddings}], "
                         f"got {args.seq_len}")
    ids = np.full((args.batch, args.seq_len), encoder.config.pad_token_id + 1, np.int64)  # no padding
    return SimCSE(encoder, pad_id=encoder.config.pad_token_id), ids, None, _model_loss


def _simcse_tokenizer(args):
    """The tokenizer `tensorarena train --model simcse` builds (its corpus is not tokenized here)."""
    from ..text import WordPieceTokenizer, locate_minilm

    return WordPieceTokenizer(locate_minilm(), max_length=args.seq_len)


def _print_plan(args, model, plan, data_bytes: int) -> None:
    """The table, and with --json the estimates as JSON: after the table (bare --json), to a file (--json PATH),
    or alone on stdout (--json -: the table goes to stderr, so the output pipes into jq or json.loads as it is)."""
    to_stdout = args.json == "-"
    shape = {"mlp": "", "simcse": f" x {args.seq_len} tokens"}.get(args.model, f", {args.image_size}x{args.image_size}")
    table = sys.stderr if to_stdout else sys.stdout
    micro = f" in micro-batches of {args.micro_batch}" if args.micro_batch and args.micro_batch < args.batch else ""
    print(f"{args.model}, batch {args.batch}{micro}{shape}, {args.optimizer}, {model.num_parameters():,} parameters",
          file=table)
    print(plan.format(), file=table)
    if args.json:
        # Everything the text says, exactly: its reason and the routes that were not possible too.
        text = json.dumps({"budget": plan.budget.nbytes, "budget_source": plan.budget.source,
                           "budget_margin": plan.budget.margin, "chosen": plan.chosen, "reason": plan.reason,
                           "process_other_bytes": plan.process_other_bytes, "activations": plan.activation_source,
                           "data_bytes": data_bytes,
                           "estimates": {r: vars(e) for r, e in plan.estimates.items()},
                           "unavailable": plan.unavailable, "recompute_mlp": plan.recompute_mlp})
        if args.json is True or to_stdout:
            print(text)
        else:
            try:
                with open(args.json, "w") as f:
                    f.write(text + "\n")
            except OSError as err:
                raise SystemExit(f"tensorarena plan: cannot write --json {args.json}: {err.strerror}") from None
    sys.stdout.flush()


def cmd_plan(args) -> dict:
    from .. import optim
    from ..memory.budget import resolve_budget
    from ..precision import float32_matmul_precision
    from .route_plan import plan_routes

    _check_model_options(args)
    if args.micro_batch is not None and args.model == "simcse":
        raise SystemExit("tensorarena plan: --micro-batch is not supported for simcse (its loss needs the whole "
                         "batch: the other sentences are the negatives)")
    if args.model != "simcse":
        _check_batch_fits_data(args)
        from ..cli import one_pass_micro_batch

        args.micro_batch = one_pass_micro_batch("plan", args.micro_batch, args.batch)
    model, x, y, loss_fn = _model_and_batch(args)
    data_bytes = _data_bytes(args)
    # simcse's train holds its tokenizer all run (~12 MiB of vocabulary in RSS, the process's share): held here
    # too while planning, so both measure the same process (without it, plan's totals were 2.8% under train's).
    tokenizer = _simcse_tokenizer(args) if args.model == "simcse" else None
    params = model.parameters()
    opt = {"adamw": optim.AdamW, "adam": optim.Adam}.get(args.optimizer,
                                                         lambda p: optim.SGD(p, momentum=args.momentum))(params)
    budget = resolve_budget(args.memory_limit)
    # As the Trainer resolves update_in_backward: clipping needs every gradient, so flat gradients.
    # route="auto" chooses between fused and streaming (`choose`: its reason and advice are about those two,
    # never eager, which is shown for comparison only). simcse streams too: its BERT stages read the attention
    # mask as side inputs, a part of their own in the plan.
    with float32_matmul_precision(args.matmul_precision):  # as Trainer.plan: the traces hold bf16 buffers too
        plan = plan_routes(model, opt, loss_fn, x, y, budget, routes=("fused", "eager", "streaming"),
                           fused_keeps_grads=bool(args.clip), choose=("fused", "streaming"), data_bytes=data_bytes,
                           data_held=False,  # counted from train's sizes, never drawn here
                           micro_batch=args.micro_batch, store_dir=getattr(args, "store_dir", None))
    del tokenizer  # measured: the plan is made
    _print_plan(args, model, plan, data_bytes)
    return {"plan": plan, "chosen": plan.chosen}
