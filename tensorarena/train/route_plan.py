"""How much memory each training route needs for a model, batch and optimizer, and which one to take.

Persistent bytes are exact, from the parameter shapes and the optimizer's declared state
(`state_init` / `scalar_state_init`), plus the gradients of trainable parameters the optimizer does not hold. Activations come from tracing: for a model with
`stream_stages()` each stage is traced on its own at the real batch size (so estimating never
needs more memory than one stage: a model that does not fit can still be planned), identical
stages once; otherwise the whole step is traced. From the traced buffers:

- eager: the step arena reuses a buffer's bytes once it is dead, so its high-water is the most
  bytes alive at once (the traced live peak; its best-fit reuse has matched it exactly on ViTs);
- fused: buffers share the slab by liveness. From whole-step traces this is the planned slab;
  from stage traces, the most over stages i of what stages 0..i keep alive from forward plus
  what stage i's backward needs on top and the gradient arriving at its output. Backward runs
  the stages last to first, so when stage i's runs, the later stages' saved buffers are gone
  (counting them too overestimated by 11% once ViT's last block shrank to one token);
- streaming: the route's resident buffers (two slots of the largest stage's parameters and
  state, one stage's gradients; stream.StreamingRoute.estimate), the largest stage's traced
  slab, the boundary activations the step arena keeps (every stage's output but the last's,
  which lives in its stage's slab) and the two gradient buffers per boundary shape that
  stream/sweep.py _Sweep._io_grad alternates between, each padded as the arena pads it, and the side inputs
  (below). That is the step's measured transient peak exactly (tests/test_streaming_hunt.py,
  tests/test_streaming_masks.py). Starting from memory holds the
  parameters, their optimizer state and a slot at once until the store takes over; where that is
  more than the step, the difference is the part "moving into the store" (_streaming_parts). A model
  built under nn.deferred_init() holds none of that: each stage is made straight into the slot, so the
  part is 0 (or the largest parameter's draw, where that exceeds the step). Its stages are traced with
  zeros in place of their parameters, one stage at a time (values_for_tracing).

Stages that read side inputs (stream/stages.py SideForward: every BERT layer reads the attention
mask) are traced with them: model.stream_inputs(batch), computed once as the streaming step computes
them, in an arena whose bytes are the part "side inputs (attention mask)" of every route (the step
arena holds them all step; eager and fused compute them in the forward, before the first stage).

A model that cannot stream (no stream_stages(), or stages model_stages refuses: a shared block,
tied weights across stages) is traced as a whole step, and streaming is left out of the plan
with the reason (`RoutePlan.unavailable`, logged, and in the reason when nothing fits).

With update_in_backward the fused route holds no gradient buffer, only about the largest
parameter's gradient in flight.

The data a job holds for its run (its train and held-out arrays, `data_bytes`) is the part "training data" of
every route, and is taken out of the measured process share: the share is RSS, which holds the data once a job
has drawn it, and `tensorarena plan` (which draws none) computes the same part from the job's sizes, so both
plan the same run alike.

`plan_routes` compares each total, added to what the process holds besides the parameters and the data, with
the budget and picks fused if it fits, else streaming (eager when asked and it fits). Before giving fused up, a
model whose transformer MLPs keep GELU's output and derivative for backward (FeedForward's default, the faster)
is traced once more with them recomputing it (recompute_activation=True: one (tokens, hidden) buffer less per
block); if that fits, the plan says so (`RoutePlan.recompute_mlp`, the reason, the estimate's note) and the
Trainer switches them before step 1.

The tracing (TracedStage, trace_stages, trace_whole, values_for_tracing, the lean trace) is in route_traces.py.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..memory.budget import MemoryBudget
from ..memory.meter import format_bytes, format_bytes_up, rss_bytes
from ..memory.pool import ALIGN
from ..nn.deferred import deferred_bytes
from ..nn.module import Module
from ..optim.optimizer import Optimizer
from ..stream.arena_pages import page_rounded
from ..stream.store_medium import in_memory_filesystem, temporary_store_parent
from .route_traces import (TracedStage, _backward_peak, _lean_fused_activations, _load_mlp_recompute_kernels,
                           _return_tracing_memory, _side_inputs, _stage_traces, trace_whole)

ROUTE_ORDER = ("fused", "eager", "streaming")
# The part for what model.stream_inputs computes once a step for stages that read it (stream/stages.py SideForward):
# for BERT and SimCSE, the attention mask and token types (and SimCSE's stacked ids).
SIDE_INPUTS = "side inputs (attention mask)"
# The part for the arrays a train job holds for the whole run (train and held-out sets): plan_routes' data_bytes.
TRAINING_DATA = "training data"
# The part for a streaming store on tmpfs (or ramfs): its files are memory there (stream/store_medium.py).
STORE_IN_MEMORY = "store (on tmpfs: in memory)"
# What evaluation between or after the steps needs on the fused route, said under the table: Trainer.evaluate and
# simcse's probe run in the fused slab (compile/lend.py), whose bytes are dead between steps, so at the training
# batch size they need nothing beyond the route's total. (An ordinary arena beside the slab took mlp's run 1.6% and
# vit-tiny's 0.5% over this plan; simcse's probe, left cached in the pool, 4%.)
EVALUATION_NOTE = ("evaluation (at the training batch, or micro-batch): runs in the fused slab between steps, "
                   "no part of its own")
log = logging.getLogger("tensorarena")


@dataclass
class RouteEstimate:
    """Bytes one route needs, by part, and whether it fits the budget."""

    route: str
    parts: dict[str, int]
    total: int
    required: int  # total + what the process holds besides the parameters
    fits: bool
    note: str = ""


@dataclass
class RoutePlan:
    """Every route's estimate, the budget, the chosen route and why."""

    budget: MemoryBudget
    estimates: dict[str, RouteEstimate]
    chosen: str | None
    reason: str
    process_other_bytes: int
    activation_source: str
    details: dict[str, Any] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # asked routes not estimated -> why
    # The fused estimate is for the MLPs recomputing GELU in backward (FeedForward.recompute_activation), which
    # the Trainer then sets: their default, keeping GELU's output and derivative, did not fit the budget.
    recompute_mlp: bool = False

    def format(self) -> str:
        parts = sorted({k for e in self.estimates.values() for k in e.parts}, key=_part_order)
        routes = [r for r in ROUTE_ORDER if r in self.estimates]
        width = 14
        lines = [f"memory budget {format_bytes(self.budget.nbytes)} ({self.budget.source}"
                 + (f", after a {format_bytes(self.budget.margin)} margin)" if self.budget.margin else ")"),
                 f"activations: {self.activation_source}",
                 f"{'':<26}" + "".join(f"{r:>{width}}" for r in routes)]
        for part in parts:
            lines.append(f"{part:<26}" + "".join(
                f"{format_bytes(self.estimates[r].parts[part]) if part in self.estimates[r].parts else '-':>{width}}"
                for r in routes))
        lines.append(f"{'route total':<26}" + "".join(f"{format_bytes(self.estimates[r].total):>{width}}"
                                                      for r in routes))
        lines.append(f"{'+ process, not params':<26}" + "".join(
            f"{format_bytes(self.process_other_bytes):>{width}}" for _ in routes))
        lines.append(f"{'= needs':<26}" + "".join(f"{format_bytes(self.estimates[r].required):>{width}}"
                                                  for r in routes))
        lines.append(f"{'fits':<26}" + "".join(f"{'yes' if self.estimates[r].fits else 'NO':>{width}}"
                                               for r in routes))
        if "fused" in self.estimates:
            lines.append(EVALUATION_NOTE)
        lines.extend(f"{route}: not possible: {why}" for route, why in self.unavailable.items())
        # A store in memory is the user's to move (store_dir): where it is, and the fix, said under the table.
        lines.extend(f"{route}: {e.note}" for route, e in self.estimates.items() if STORE_IN_MEMORY in e.parts)
        lines.append(f"chosen: {self.chosen or 'none'} ({self.reason})")
        return "\n".join(lines)


def _part_order(name: str) -> tuple:
    order = ["params", "grads", "optimizer", "training data", "inputs", "side inputs", "activations", "stream buffers",
             "boundary activations", "boundary gradients"]
    for i, prefix in enumerate(order):
        if name.startswith(prefix):
            return (i, name)
    return (len(order), name)


# -- persistent memory ---------------------------------------------------------------------------

def persistent_bytes(optimizer: Optimizer) -> dict[str, int]:
    """Parameters, their gradients and the optimizer's state by kind, from shapes alone. A frozen parameter
    (requires_grad False) counts as a parameter only: no route makes it a gradient or optimizer state."""
    out = {"params": 0, "grads": 0}
    for group in optimizer.param_groups:
        # _data, not data: a streamed parameter's memory is on disk, its placeholder keeps shape and dtype
        sizes = [(int(np.prod(p._data.shape)) * p._data.dtype.itemsize, p.requires_grad) for p in group["params"]]
        trained = sum(size for size, grad in sizes if grad)
        out["params"] += sum(size for size, _ in sizes)
        out["grads"] += trained
        for kind in optimizer.state_init(group):
            out[f"optimizer {kind}"] = out.get(f"optimizer {kind}", 0) + trained
        scalars = 1 + len(optimizer.scalar_state_init(group))
        count = sum(grad for _, grad in sizes)
        out["optimizer scalars"] = out.get("optimizer scalars", 0) + 8 * scalars * count
    return out


def held_state_bytes(optimizer: Optimizer) -> int:
    """Bytes of the optimizer state arrays in memory now (a loaded checkpoint's, or earlier steps'), each array
    counted once: the measured process share holds them, and the parts count them already. (The streaming route
    keeps its state in its store, not in optimizer.state.)"""
    arrays = {id(value): value for state in optimizer.state.values() for value in state.values()
              if isinstance(value, np.ndarray) and value.ndim}
    return sum(value.nbytes for value in arrays.values())


# -- the plan ---------------------------------------------------------------------------------------

def plan_routes(model: Module, optimizer: Optimizer, loss_fn: Callable, inputs: Any, targets: Any,
                budget: MemoryBudget, *, routes: tuple[str, ...] = ("fused", "streaming"),
                process_other_bytes: int | None = None, fused_keeps_grads: bool = False,
                choose: tuple[str, ...] | None = None, data_bytes: int = 0, data_held: bool = True,
                micro_batch: int | None = None, store_dir=None) -> RoutePlan:
    """Estimate each route in `routes` for this batch and pick the first that fits (see module docstring).

    `choose`: the routes the choice is made from, in order (default: all of `routes`); the others are estimated
    for comparison only (`tensorarena plan` shows eager, which route="auto" never takes, so its choice, reason
    and advice must not be eager's).

    `fused_keeps_grads`: whether the fused step keeps flat gradients (the Trainer's resolved
    `not update_in_backward`: True only with clip_grad_norm or when asked); False is its default.

    `data_bytes`: the bytes of the data the caller holds for the run (train and held-out arrays), the part
    TRAINING_DATA of every route. `data_held`: whether they are in this process's memory now (a train job's,
    drawn before planning), so that the measured process share holds them and leaves them out, not to count
    them twice; False for `tensorarena plan`, which counts them without drawing any.

    `micro_batch`: the Trainer's (compile/micro_batches.py). The step is traced on the batch's first micro-batch,
    whose activations and input buffers are what a step holds at once; fused keeps flat gradients and their
    weighted sum besides ("grad accumulator"). Streaming holds one micro-batch's activations in a stage, but its
    boundary activations, their gradients, the side inputs and the inputs are the whole batch's (stream/sweep.py).

    `store_dir`: where streaming would keep its store (None: the temporary directory a Trainer would make it in).
    On tmpfs its files are memory, counted as the part STORE_IN_MEMORY (stream/store_medium.py).
    """
    from ..compile.micro_batches import split_batch

    order = routes if choose is None else tuple(choose)
    unknown = [r for r in order if r not in routes]
    if unknown:  # before tracing: a typo should not cost a trace of the step first
        raise ValueError(f"choose={order!r} names {unknown}, which are not among routes={routes!r}: a route is "
                         f"chosen only from those estimated")
    chunks = split_batch(inputs, targets, micro_batch)
    # Streaming holds the whole batch (stage 0 reads it) even when the step runs in micro-batches.
    batch_x, _, batch_bytes = _batch_arrays(inputs, targets) if len(chunks) > 1 else (None, None, 0)
    inputs, targets, _ = chunks[0]
    x, y, inputs_bytes = _batch_arrays(inputs, targets)
    persistent = persistent_bytes(optimizer)
    details: dict[str, Any] = {}
    traced, side_bytes, no_streaming = _stage_traces(model, loss_fn, x, y)
    if no_streaming is not None:
        log.info("route plan: streaming is not possible (%s); activations are traced over the whole step%s",
                 no_streaming, ", and streaming is left out of the plan" if "streaming" in routes else "")
    if traced is not None:
        source = f"traced stage by stage at batch {x.shape[0] if x.ndim else 1} ({len(traced)} stages)"
        fused_act = _backward_peak(traced, "slab")
        eager_act = _backward_peak(traced, "live_peak")
        details["stages"] = [vars(s) for s in traced]
    else:
        whole = trace_whole(model, loss_fn, x, y)
        source = f"traced whole step at batch {x.shape[0] if x.ndim else 1}"
        fused_act, eager_act = whole.slab, whole.live_peak
    if process_other_bytes is None:
        # Measured after tracing: the kernels are compiled (or loaded from the cache) by now, and
        # that code is part of what the process holds whatever the route.
        # Regression (fixed): the data a train job had drawn was inside this share and `tensorarena plan` (no data)
        # had none, so plan said vit-tiny streams in 213 MiB and train refused 215M ("needs 239.66 MiB"). The data
        # is its own part now, the same bytes on both sides, so it is taken out here.
        # Parameters built under nn.deferred_init() are not in RSS yet: only those with values are taken out.
        # Nor are those a streaming route holds on disk (a larger batch planned while streaming: their placeholders
        # take no memory).
        from ..stream.on_disk import _ON_DISK

        group_params = [p for group in optimizer.param_groups for p in group["params"]]
        on_disk = {id(p): p for p in group_params if p._arena is _ON_DISK}
        held = (persistent["params"] - deferred_bytes(group_params)
                - sum(math.prod(p.shape) * p.dtype.itemsize for p in on_disk.values()))
        # A loaded checkpoint's (or earlier steps') optimizer state is in RSS too, and in the parts above.
        held += held_state_bytes(optimizer)
        # Tracing ran no optimizer update: its kernel is loaded now, or step 1 would add it uncounted.
        from ..stream.optim_state import load_update_kernels

        load_update_kernels(optimizer)
        _load_mlp_recompute_kernels(model)
        _return_tracing_memory()
        process_other_bytes = max(0, rss_bytes() - held - (data_bytes if data_held else 0))
    estimates: dict[str, RouteEstimate] = {}
    recompute_mlp = False

    def estimate(route: str, parts: dict[str, int], note: str = "") -> RouteEstimate:
        total = sum(parts.values())
        required = total + process_other_bytes
        return RouteEstimate(route, parts, total, required, required <= budget.nbytes, note)

    def add(route: str, parts: dict[str, int], note: str = "") -> None:
        estimates[route] = estimate(route, parts, note)

    base = dict(persistent, inputs=inputs_bytes)
    if data_bytes:
        base[TRAINING_DATA] = data_bytes
    if side_bytes:
        # The stage traces start after the side inputs (a BERT's mask and token types), which eager and fused
        # compute in the forward and read until the last layer's backward: counted beside the activations, as the
        # streaming step arena holds them (a whole-step SimCSE trace had them within 1% of this).
        base[SIDE_INPUTS] = side_bytes
    # A parameter that requires a gradient but is in no optimizer group (an optimizer over the head only, the
    # body not frozen) still gets one from every backward, and the eager route holds it in .grad: counted too.
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    outside = sum(p._data.nbytes for p in model.parameters() if p.requires_grad and id(p) not in in_optimizer)
    if outside:
        base["grads outside the optimizer"] = outside
    if "fused" in routes:
        fused_parts = dict(base, **{"activations (slab)": fused_act})
        if micro_batch is not None:
            fused_keeps_grads = True  # the Trainer's update_in_backward resolves to False (compile/step.py)
            fused_parts["grad accumulator"] = persistent["grads"]
        if not fused_keeps_grads:
            # update_in_backward: no gradient buffer; each gradient lives in the slab from its op to
            # its parameter's update, which follows at once, so about one parameter's worth extra.
            del fused_parts["grads"]
            fused_parts["gradient in flight"] = max(
                (int(np.prod(p._data.shape)) * p._data.dtype.itemsize
                 for group in optimizer.param_groups for p in group["params"]), default=0)
        fused = estimate("fused", fused_parts, "" if fused_keeps_grads else "parameters updated inside backward")
        # Recomputing GELU can save at most all the activations: where the rest alone (parameters, gradients,
        # optimizer state, inputs, the process) is over the budget, the lean trace could not make fused fit
        # and is skipped (a streaming-sized model: it was a second trace of every stage, for nothing).
        if not fused.fits and fused.required - fused_act <= budget.nbytes:
            lean_act = _lean_fused_activations(model, loss_fn, x, y, traced is not None)
            if lean_act is not None and lean_act < fused_act:
                lean_note = (f"MLPs recompute GELU in backward: {format_bytes(fused_act - lean_act)} less than "
                             f"keeping it, which needs {format_bytes(fused.required)}")
                lean = estimate("fused", dict(fused_parts, **{"activations (slab)": lean_act}),
                                "; ".join(filter(None, [fused.note, lean_note])))
                # When neither fits, the plan shows the default the user would otherwise get.
                if lean.fits:
                    fused, recompute_mlp = lean, True
        estimates["fused"] = fused
    if "eager" in routes:
        add("eager", dict(base, **{"activations (arena)": eager_act}))
    unavailable: dict[str, str] = {}
    if "streaming" in routes:
        if no_streaming is None:
            from ..stream.route import StreamingRoute

            stream = StreamingRoute.estimate(model, optimizer)
            batch_rows = None
            if batch_x is not None:  # the boundaries, side inputs and inputs are the whole batch's
                from ..stream.stages import model_stages

                batch_rows, inputs_bytes = batch_x.shape[0], batch_bytes
                side_bytes = _side_inputs(model, model_stages(model), batch_x)[2] if side_bytes else 0
            parts = _streaming_parts(stream, inputs_bytes, side_bytes, traced, data_bytes, batch_rows=batch_rows,
                                     micro_batch=micro_batch)
            where = store_dir if store_dir is not None else temporary_store_parent()
            medium = in_memory_filesystem(where)
            if medium is not None:
                parts[STORE_IN_MEMORY] = stream["disk_bytes"]
            add("streaming", parts,
                note=f"{stream['stages']} stages, largest {stream['largest_stage']}; "
                     + (f"{format_bytes(stream['disk_bytes'])} on disk" if medium is None else
                        f"its {format_bytes(stream['disk_bytes'])} store is in memory ({where} is on {medium}; "
                        f"pass a store_dir on a disk)"))
            details["streaming"] = stream
        else:
            unavailable["streaming"] = no_streaming
    chosen, reason = None, ""
    for route in order:
        est = estimates.get(route)
        if est is not None and est.fits:
            chosen = route
            before = [r for r in order[:order.index(route)] if r in estimates]
            reason = (f"{route} needs {format_bytes(est.required)} of {format_bytes(budget.nbytes)}"
                      + (f"; {', '.join(before)} would need "
                         + ", ".join(format_bytes(estimates[r].required) for r in before) if before else ""))
            break
    if chosen is None:
        reason = _nothing_fits({r: e for r, e in estimates.items() if r in order},
                               {r: why for r, why in unavailable.items() if r in order}, budget)
    if recompute_mlp and chosen == "fused":
        reason += "; its MLPs recompute GELU in backward to fit"
    return RoutePlan(budget, estimates, chosen, reason, process_other_bytes, source, details, unavailable,
                     recompute_mlp=recompute_mlp and chosen == "fused")


def _padded(nbytes: int) -> int:
    """Bytes an arena takes for an array of `nbytes` (memory/arena.py rounds up to ALIGN, at least one)."""
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN or ALIGN


def _boundaries(traced: list[TracedStage], batch_rows: int | None = None) -> dict[str, int]:
    """What the streaming step arena holds across stages: the kept output of every stage but the last
    (the last's lives in its own stage arena, counted in its slab), and two input-gradient buffers per
    distinct boundary (shape, dtype), which stage k and k + 1 alternate between (stream/sweep.py _io_grad).
    `batch_rows`: stages traced on a micro-batch keep whole-batch boundaries, of this many rows."""
    kept = traced[:-1]
    if batch_rows is None:
        sizes = [(s.output_key, s.output_bytes) for s in kept]
    else:
        sizes = [(s.output_key, math.prod((batch_rows,) + tuple(s.output_key[0][1:])) * np.dtype(s.output_key[1]).itemsize)
                 for s in kept]
    shapes = dict(sizes)
    return {"boundary activations": sum(_padded(nbytes) for _, nbytes in sizes),
            "boundary gradients": 2 * sum(_padded(nbytes) for nbytes in shapes.values())}


def _batch_arrays(inputs: Any, targets: Any) -> tuple[np.ndarray, Any, int]:
    """(x, y, bytes): the inputs as the model reads them (Tensor's dtype rules) and the fused plan holds them, the
    targets as one array or a structure of them (compile/targets.py), and the bytes of both."""
    from ..compile.step import input_array
    from ..compile.targets import build, flatten

    x = input_array(inputs)
    if targets is None:
        return x, None, x.nbytes
    spec, leaves = flatten(targets)
    return x, build(spec, leaves), x.nbytes + sum(leaf.nbytes for leaf in leaves)


def _streaming_parts(stream: dict[str, Any], inputs_bytes: int, side_bytes: int,
                     traced: list[TracedStage], data_bytes: int = 0, *, batch_rows: int | None = None,
                     micro_batch: int | None = None) -> dict[str, int]:
    """The streaming route's parts: its step, and what moving the in-memory state into the store holds on top.

    "process, not params" (added to every route) leaves the parameters out, which is true for streaming only
    once the store holds them and their pages went back to the kernel (stream/heap.py). Before that, the
    move holds the parameters, their optimizer state and a slot at once: vit-small's RSS peaked there, ~50
    MiB above the step (which alone was planned). So the route needs the larger of the two; the part
    "moving into the store" is by how much the move exceeds the step. Where freed pages are not returned,
    the parameters' pages stay for the whole run, and are counted as such.
    """
    from ..stream.heap import HEAP_RETURNS_PAGES

    parts = dict({"inputs": inputs_bytes, "stream buffers": stream["resident_bytes"],
                  # The stage arena's high-water: the most bytes alive at once, as the arena reuses dead ones (the
                  # offline slab placement was up to 4% above it for a block without dropout); the pages it
                  # touches beyond that are "arena pages" below.
                  "activations (one stage)": max(s.live_peak for s in traced)}, **_boundaries(traced, batch_rows))
    if side_bytes:  # in the step arena all step, beside the boundaries (StreamStepStats.side_input_bytes)
        parts[SIDE_INPUTS] = side_bytes
    # RSS is the arenas' touched pages (stream/arena_pages.py): the stage arena reaches past its live bytes where a
    # dead buffer's bytes fit no later one, and each arena's last page is whole. vit-base peaked 1.5% over without.
    step_arena = sum(parts[k] for k in ("boundary activations", "boundary gradients", SIDE_INPUTS) if k in parts)
    stage_arena = parts["activations (one stage)"]
    parts["arena pages"] = (page_rounded(step_arena) - step_arena
                            + max(page_rounded(stage_arena), max(s.touched for s in traced)) - stage_arena)
    if micro_batch is not None:  # the micro-batches' gradient sum, one stage's (StreamingRoute._size_grad_buffers)
        parts["grad accumulator"] = stream["grad_bytes"]
    if not HEAP_RETURNS_PAGES and stream["in_memory_bytes"]:
        parts["params (pages kept)"] = stream["in_memory_bytes"]
    parts["moving into the store"] = max(0, stream["move_in_bytes"] - sum(parts.values()))
    if data_bytes:  # held all run beside whatever the route holds (the move's peak included): added after it
        parts[TRAINING_DATA] = data_bytes
    return parts


def _nothing_fits(estimates: dict[str, RouteEstimate], unavailable: dict[str, str], budget: MemoryBudget) -> str:
    """Why no route was chosen: the smallest estimate against the budget, what each other route needs (the one
    line a user reads: the MemoryError's first, `tensorarena plan`'s "chosen: none"), and any asked route that
    was not possible (so "train anyway by streaming" is not silently missing)."""
    why_not = "; ".join(f"{route} is not possible: {why}" for route, why in unavailable.items())
    if not estimates:
        return f"no route could be planned: {why_not}"
    smallest = min(estimates.values(), key=lambda e: e.required)
    others = [f"{e.route} needs {format_bytes(e.required)}" for e in estimates.values() if e is not smallest]
    reason = (f"nothing fits: the smallest, {smallest.route}, needs {format_bytes(smallest.required)} but the "
              f"budget is {format_bytes(budget.nbytes)} ({budget.source})"
              + (f", and {', '.join(others)}" if others else "")
              + f"; raise the limit to at least {format_bytes_up(smallest.required + budget.margin)} or lower the "
              f"batch size")
    # A store on tmpfs: moving it to a disk takes its bytes out of memory, the one fix that needs no more memory.
    in_memory = [e for e in estimates.values() if STORE_IN_MEMORY in e.parts]
    reason += "".join(f", or put {e.route}'s store on a disk (store_dir): {format_bytes(e.parts[STORE_IN_MEMORY])} "
                      f"of its {format_bytes(e.required)} is its store, on tmpfs" for e in in_memory)
    return f"{reason}; {why_not}" if why_not else reason
