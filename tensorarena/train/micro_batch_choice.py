"""Trainer(micro_batch="auto"): the most rows per forward/backward pass that fit the memory budget, found before
step 1.

The whole batch in one pass is tried first, as without micro-batches. Where the route plan finds that nothing fits
(route "auto") or that the route asked does not fit its memory_limit, the step is planned again with the batch cut
into micro-batches of ceil(B/2), ceil(B/4), ... rows, down to 1, and the first that fits is the run's micro_batch
(logged). Activations scale with the rows of a pass, so halving finds a fitting size in at most log2(B) plans, each
one trace of the step at that many rows; a size between two halvings that would also fit is not looked for.

Micro-batches change nothing else for a loss that is a mean over rows (their gradients are summed weighted by
their rows, compile/micro_batches.py), so "auto" is opt-in: a model whose loss couples its rows refuses it
(check_model_splits), and BatchNorm's batch statistics become each micro-batch's, as in any gradient accumulation.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..tensor import Tensor

if TYPE_CHECKING:
    from .route_plan import RoutePlan
    from .trainer import Trainer

log = logging.getLogger("tensorarena")


def check_auto_micro_batch(route: str, memory_limit: Any, update_in_backward: bool | None) -> None:
    """ValueError where micro_batch="auto" cannot work: no plan to read (a route given without a memory_limit), or
    update_in_backward=True, which a cut batch cannot keep (its update waits for every micro-batch)."""
    if route != "auto" and memory_limit is None:
        raise ValueError(f"micro_batch='auto' cuts the batch where the route plan says it does not fit, and "
                         f"route={route!r} is planned only against a memory_limit: pass memory_limit=..., use "
                         f"route='auto', or give micro_batch a number of rows")
    if update_in_backward:
        raise ValueError("update_in_backward=True cannot be combined with micro_batch='auto': a cut batch's update "
                         "waits for every micro-batch's gradient. Drop one of the two")


def _rows(inputs: Any) -> int | None:
    x = inputs.data if isinstance(inputs, Tensor) else inputs
    return x.shape[0] if isinstance(x, np.ndarray) and x.ndim else None


def _use(trainer: Trainer, micro_batch: int | None) -> None:
    from ..compile.step import resolve_update_in_backward

    trainer._micro_batch = micro_batch
    trainer.update_in_backward = resolve_update_in_backward(trainer._update_in_backward_asked,
                                                            trainer.clip_grad_norm, micro_batch)


def fit_micro_batch(trainer: Trainer, inputs: Any, targets: Any, routes: tuple[str, ...],
                    fits: Callable[[RoutePlan], bool]) -> tuple[RoutePlan | None, str]:
    """For micro_batch="auto" after the whole batch did not fit: (the plan at the first halved micro-batch for which
    `fits(plan)`, the trainer's micro_batch set to it; "") or (None, why not, said after the plan's own reason),
    the trainer left with the whole batch."""
    if not trainer._micro_batch_auto or trainer._micro_batch is not None:
        return None, ""
    rows = _rows(inputs)
    if rows is None or rows < 2:
        return None, f"micro_batch='auto' has no rows to cut ({'one row' if rows else 'not one array of rows'})"
    from ..compile.micro_batches import check_model_splits

    try:
        check_model_splits(trainer.model, 1)
    except ValueError as refused:
        return None, f"micro_batch='auto' cannot cut this batch: {refused}"
    whole = trainer.route_plan, trainer._route_plan_batch  # put back if nothing fits: the one the error shows
    micro = rows
    while micro > 1:
        micro = -(-micro // 2)
        _use(trainer, micro)
        plan = trainer.plan(inputs, targets, routes)
        if fits(plan):
            log.info("micro_batch='auto': the batch of %d rows does not fit the budget in one pass; micro-batches "
                     "of %d rows do: %s", rows, micro, plan.reason)
            return plan, ""
    smallest = plan.reason
    _use(trainer, None)
    trainer.route_plan, trainer._route_plan_batch = whole
    return None, f"micro_batch='auto' tried micro-batches down to 1 row, and at 1 row: {smallest}"


def fit_for_route_auto(trainer: Trainer, inputs: Any, targets: Any) -> tuple[RoutePlan | None, str]:
    """fit_micro_batch where route "auto" found nothing fits: the first cut for which it chooses a route."""
    return fit_micro_batch(trainer, inputs, targets, ("fused", "streaming"), lambda plan: plan.chosen is not None)
