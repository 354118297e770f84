"""`tensorarena plan`: every route's memory for a model, batch and optimizer, the chosen route and why.

    tensorarena plan --model vit-base --batch 8 --memory-limit 2G

Builds the model (parameters only: nothing is trained), estimates the fused, eager and
streaming routes (train/route_plan.py: persistent bytes from shapes, activations traced
stage by stage at the real batch size) and prints the table the Trainer's route="auto" uses.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

NATIVE_IMAGE = 224


def add_plan_parser(sub) -> None:
    plan = sub.add_parser(
        "plan", help="estimate each training route's memory and pick one",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    plan.add_argument("--model", choices=["mlp", "vit-tiny", "vit-small", "vit-base"], default="vit-base")
    plan.add_argument("--batch", type=int, default=8, help="examples per step")
    plan.add_argument("--memory-limit", metavar="SIZE", default=None,
                      help="budget, e.g. 2G (default: the cgroup limit or available RAM, minus a margin)")
    plan.add_argument("--image-size", type=int, default=NATIVE_IMAGE, help="vit: image side")
    plan.add_argument("--patch-size", type=int, default=16, help="vit: patch side")
    plan.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default="adamw")
    plan.add_argument("--clip", type=float, default=1.0,
                      help="global gradient-norm clip, as `tensorarena train --clip` (0: none, so the fused step "
                           "updates each parameter inside backward and holds no gradient buffer)")
    plan.add_argument("--json", action="store_true", help="print the estimates as JSON after the table")


def _model_and_batch(args):
    rng = np.random.default_rng(0)
    if args.model == "mlp":
        from ..data.digits import NUM_CLASSES, SIZE
        from ..models.mlp import MLP, MLPConfig

        model = MLP(MLPConfig(in_features=SIZE * SIZE, hidden=(256, 256), out_features=NUM_CLASSES), rng=rng)
        x = np.zeros((args.batch, SIZE * SIZE), np.float32)
        return model, x, np.zeros(args.batch, np.int64)
    from .vit_job import build_vit

    args.seed = 0
    model = build_vit(args)
    x = np.zeros((args.batch, 3, args.image_size, args.image_size), np.float32)
    return model, x, np.zeros(args.batch, np.int64)


def cmd_plan(args) -> dict:
    from .. import optim
    from ..memory.budget import resolve_budget
    from ..nn.functional import cross_entropy
    from .route_plan import plan_routes

    if args.batch <= 0:
        raise SystemExit(f"tensorarena plan: --batch must be positive, got {args.batch}")
    model, x, y = _model_and_batch(args)
    params = model.parameters()
    opt = {"adamw": optim.AdamW, "adam": optim.Adam}.get(args.optimizer, lambda p: optim.SGD(p, momentum=0.9))(params)
    budget = resolve_budget(args.memory_limit)
    # As the Trainer resolves update_in_backward: clipping needs every gradient, so flat gradients.
    plan = plan_routes(model, opt, cross_entropy, x, y, budget, routes=("fused", "eager", "streaming"),
                       fused_keeps_grads=bool(args.clip))
    # route="auto" chooses between fused and streaming; eager is shown for comparison.
    auto = next((r for r in ("fused", "streaming") if plan.estimates[r].fits), None)
    print(f"{args.model}, batch {args.batch}" + (f", {args.image_size}x{args.image_size}" if args.model != "mlp" else "")
          + f", {args.optimizer}, {model.num_parameters():,} parameters")
    print(plan.format().replace(f"chosen: {plan.chosen}", f"chosen by route=auto: {auto}", 1)
          if plan.chosen != auto else plan.format())
    if args.json:
        print(json.dumps({"budget": plan.budget.nbytes, "budget_source": plan.budget.source, "chosen": auto,
                          "estimates": {r: vars(e) for r, e in plan.estimates.items()}}, default=str))
    sys.stdout.flush()
    return {"plan": plan, "chosen": auto}
