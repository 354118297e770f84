"""The Trainer's route choice before step 1: the route plan for a batch (kept for step 1 when the batch matches),
route="auto"'s pick of fused or streaming from it, the check of a route the user chose against a memory_limit
they set, and switching MLPs to recompute GELU where the plan counted on it.

The estimates themselves are train/route_plan.py's (plan_routes); this module only decides, for the trainer,
when to plan, what the plan's answer does to its route, and what is said or raised when nothing fits.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..nn.modes import kept_modes
from ..precision import float32_matmul_precision
from .micro_batch_choice import fit_for_route_auto, fit_micro_batch

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("tensorarena")


def plan(trainer: Trainer, inputs: Any, targets: Any, routes: tuple[str, ...], data_bytes: int | None):
    """Trainer.plan's work: every asked route's estimate for this batch against the budget, kept as route_plan."""
    from .route_plan import plan_routes

    from ..compile.step import batch_signature

    if data_bytes is not None:
        trainer.data_bytes = data_bytes
    # Its traces hold the bfloat16 buffers too; they run in a step's modes, each module's put back after (a plan
    # before step 1 left a model in eval mode in train mode: nn/modes.py).
    with float32_matmul_precision(trainer.matmul_precision), kept_modes(trainer.model):
        trainer.route_plan = plan_routes(trainer.model, trainer.optimizer, trainer.loss_fn, inputs, targets,
                                         trainer.budget, routes=routes,
                                         fused_keeps_grads=not trainer.update_in_backward,
                                         data_bytes=getattr(trainer, "data_bytes", 0),
                                         micro_batch=trainer.micro_batch, store_dir=trainer.store_dir)
    trainer._route_plan_batch = (batch_signature(inputs, targets), routes)
    return trainer.route_plan


def planned_for(trainer: Trainer, inputs: Any, targets: Any, routes: tuple[str, ...]):
    """The route plan for this batch: the one plan() made before step 1 if it was for this batch's shapes
    (a preview on a smaller batch is not), else a new one."""
    from ..compile.step import batch_signature

    if trainer.route_plan is not None and trainer._route_plan_batch == (batch_signature(inputs, targets), routes):
        return trainer.route_plan
    if trainer.route_plan is not None:
        log.info("route plan: step 1's batch %s is not the one planned before, planning again",
                 batch_signature(inputs, targets))
    return trainer.plan(inputs, targets, routes)


def choose_route(trainer: Trainer, inputs: Any, targets: Any) -> None:
    """Route "auto" at step 1: take the plan's choice (fused or streaming), or eager on an allowed fallback."""
    from ..compile.trace import UnsupportedOpError

    try:
        plan = trainer._planned_for(inputs, targets, ("fused", "streaming"))
    except UnsupportedOpError as err:  # e.g. a dict batch, which neither fused nor streaming can hold
        if not trainer.fallback_to_eager:
            raise
        trainer.route, trainer.fallback_reason = "eager", str(err)
        trainer._limit_to_check = False  # eager's estimate traces the step too: step 2 would raise this again
        log.warning("route auto: neither the fused nor the streaming route can run this step, training on the "
                    "eager route (its memory is not planned before step 1): %s", err)
        trainer._materialize("route auto fell back to eager, which holds it whole")
        trainer._load_pending_checkpoint("route auto fell back to eager")
        return
    if plan.chosen is None:
        cut, why_not = fit_for_route_auto(trainer, inputs, targets)
        if cut is None:
            plan = trainer.route_plan
            also = f"; {why_not}" if why_not else ""
            raise MemoryError(f"no training route fits before step 1: {plan.reason}{also}\n{plan.format()}")
        plan = cut
    if plan.chosen != "streaming" and trainer._pending_checkpoint is not None:
        # A waiting checkpoint goes into the model made whole; what loading it leaves in the process (the
        # optimizer's state arrays, heap pages) is measured by planning again, as a load before the plan was:
        # without this a resumed vit-tiny peaked at 333.7 MiB on fused against a 293.8 MiB plan.
        trainer._load_pending_checkpoint(f"route auto chose {plan.chosen}")  # (it makes the model whole first)
        before = plan
        plan = trainer.plan(inputs, targets, ("fused", "streaming"))
        if plan.chosen != before.chosen:  # said, not only logged: the plan printed before step 1 named the other
            log.warning("route auto: with the checkpoint loaded the plan changed: %s, not %s (%s)\n%s", plan.chosen,
                        before.chosen, plan.reason, plan.format())
        if plan.chosen is None:
            raise MemoryError(f"no training route fits before step 1 with the checkpoint loaded: {plan.reason}"
                              f"\n{plan.format()}")
    trainer.route = plan.chosen
    trainer._recompute_mlp_if_planned(plan)
    if plan.chosen != "streaming":
        trainer._materialize(f"route auto chose {plan.chosen}, which holds it whole")
    trainer._load_pending_checkpoint(f"route auto chose {plan.chosen}")
    # The choice was the check against the limit: checking again at the next step would plan once more, with
    # the chosen route's buffers now in the process's memory counted a second time (simcse at 640M: fused
    # needs 607 MiB, then "901 MiB" at step 2, a MemoryError after a step that fit).
    trainer._limit_to_check = False
    log.info("route auto -> %s: %s", plan.chosen, plan.reason)


def check_the_limit(trainer: Trainer, inputs: Any, targets: Any) -> None:
    """Before step 1 on a route the user chose (eager, fused or streaming) with a memory_limit, or before a batch
    larger than the one planned on any route (trainer_step._check_a_larger_batch): that route's estimate against
    it, a MemoryError naming both if it does not fit (the limit is not ignored). A streaming route plans with
    zeros for the parameters on disk (route_traces.values_for_tracing)."""
    from ..compile.trace import UnsupportedOpError

    if trainer.route == "streaming" and trainer.stream is not None and trainer._limit_rows is None:
        return  # step 1 of a run resumed from a store: its buffers are allocated, nothing to plan
    try:
        plan = trainer._planned_for(inputs, targets, (trainer.route,))
    except UnsupportedOpError as err:
        # Every estimate traces the step. The eager route runs what the tracer cannot follow, and a fused route
        # allowed to fall back goes to eager at its first step (and logs why): neither is refused for want of
        # an estimate. Only a fused (or streaming) route that would fail on the op anyway raises it here.
        if trainer.route == "eager" or (trainer.route == "fused" and trainer.fallback_to_eager):
            log.warning("memory_limit (budget %s) is not checked before step 1: the %s route's estimate traces "
                        "the step, which the tracer cannot follow (%s); training goes on unplanned", trainer.budget,
                        trainer.route, err)
            return
        raise
    estimate = plan.estimates.get(trainer.route)
    if estimate is None:  # streaming a model without stages: StreamingRoute's own error says why, next
        log.info("route %s not checked against memory_limit: %s", trainer.route,
                 plan.unavailable.get(trainer.route, plan.reason))
        return
    why_not = ""
    if not estimate.fits:
        route = trainer.route
        cut, why_not = fit_micro_batch(trainer, inputs, targets, (route,), lambda p: p.estimates[route].fits)
        if cut is not None:
            plan, estimate = cut, cut.estimates[route]
        else:
            plan = trainer.route_plan
    if not estimate.fits:
        # Streaming is the smallest route there is: only a bigger limit or a smaller batch helps it; and a model
        # without stream_stages() (the MLP), or whose forward a subclass wraps (stream/stages.py unstaged_forward),
        # cannot stream, so route='auto' would not help it either.
        from ..stream.stages import unstaged_forward

        if (trainer.route == "streaming" or not callable(getattr(trainer.model, "stream_stages", None))
                or unstaged_forward(trainer.model) is not None):
            advice = "Raise memory_limit or lower the batch size"
        else:
            advice = ("Use route='auto' (streams when fused does not fit), raise memory_limit or lower the batch "
                      "size")
        also = f" ({why_not})" if why_not else ""
        raise MemoryError(f"route {trainer.route!r} does not fit memory_limit: {plan.reason}{also}. {advice}\n"
                          f"{plan.format()}")
    trainer._recompute_mlp_if_planned(plan)
    log.info("route %s fits memory_limit: %s", trainer.route, plan.reason)


def recompute_mlp_if_planned(trainer: Trainer, plan) -> None:
    """Switch the model's MLPs to recompute GELU in backward where the plan's fused estimate counted on it
    (RoutePlan.recompute_mlp: keeping GELU's output and derivative did not fit the budget)."""
    if not plan.recompute_mlp:
        return
    from ..nn.transformer import keeping_mlp_activations

    switched = keeping_mlp_activations(trainer.model)
    for m in switched:
        m.recompute_activation = True
    log.info("route plan: %d MLPs recompute GELU in backward (FeedForward.recompute_activation) so that the "
             "fused route fits the budget", len(switched))
