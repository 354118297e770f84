"""Tracing a fused step: how FusedStep (step.py) turns a batch of a new signature into its StepPlan.

`trace` runs the step's Python once on the batch inside a TracingArena (compile/trace.py), updating nothing
(RNG states, the model's buffers and every .grad are put back), checks that the gradients match the flat layout
(laying it out again once if not: `_GradientsMoved`), and places the traced buffers in one slab
(compile/planner.py). FusedStep's `_trace`, `_trace_step` and `_untrained_bytes` call these functions of it. They
are a file of their own so that step.py keeps the plans' cache, the replay and the update, and this one the trace.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import autograd
from ..memory.pool import aligned_bytes, resident_after_returning_freed
from ..nn.modes import ensure_training, restore_modes, saved_modes
from ..precision import float32_matmul_precision
from ..tensor import Tensor
from . import targets as target_layout
from .flat import FlatState
from .planner import plan_memory
from .step_plan import Signature, StepPlan, previous_occupants
from .step_state import (buffer_states, param_arrays, restore_buffers, restore_param_arrays, restore_rng,
                         rng_states)
from .trace import TracingArena, UnsupportedOpError
from ..journal import WriteJournal
from .watched_state import ModelState, PythonState

if TYPE_CHECKING:
    from .step import FusedStep

log = logging.getLogger("tensorarena")


def _input_tensor(buffer: np.ndarray, source: Tensor) -> Tensor:
    """The traced step's input over the plan's buffer, naming the dtype the batch came in as its source does:
    a dtype error then says "float16 (converted to float32)", as on the eager route, not float32."""
    x = Tensor(buffer)
    x._converted_from = getattr(source, "_converted_from", None)
    return x


class _GradientsMoved(Exception):
    """A trace's gradients do not match the flat layout: parameters of it got none, or left-out ones got one.
    FusedStep._trace lays the state out again and traces once more; nothing was updated."""

    def __init__(self, flat: FlatState, no_grad: list[Tensor], regained: list[Tensor]) -> None:
        self.no_grad, self.regained = no_grad, regained
        parts = []
        if no_grad:
            names = [flat.name(p) for p in no_grad]
            parts.append(f"parameters {names[:5]}{'...' if len(names) > 5 else ''} got no gradient in the traced step "
                         f"and are left out of the fused update (the eager optimizer skips them too)")
        if regained:
            names = [flat.name(p) for p in regained]
            parts.append(f"parameters {names[:5]}{'...' if len(names) > 5 else ''} left out before now get a gradient")
        super().__init__("; ".join(parts))


def trace(fused: FusedStep, inputs: Any, targets: Any, sig: Signature) -> StepPlan:
    # Read once, before either attempt: a first attempt that finds a parameter without a gradient raises after the
    # libraries took their memory, and the retry's own reading would already hold it (libraries_measured 0).
    resident_before = resident_after_returning_freed()
    for attempt in range(2):
        try:
            with float32_matmul_precision(fused.matmul_precision):
                plan = fused._trace_step(inputs, targets, sig, resident_before)
            break
        except _GradientsMoved as moved:
            if attempt:  # a second trace under the new layout saw other gradients again: not a layout matter
                raise UnsupportedOpError(f"the traced step's gradients changed between two traces ({moved}); "
                                         f"use route='eager' for this model") from None
            for p in moved.no_grad:
                fused.left_out[id(p)] = p
                state = fused.optimizer.state.get(p)
                if state and float(state.get("step", 0.0)) == 0.0:
                    # Made by the first layout (bind fills fresh state) for a parameter never updated: the
                    # eager optimizer, as torch's, makes none for a parameter without a gradient.
                    del fused.optimizer.state[p]
            for p in moved.regained:
                del fused.left_out[id(p)]
            fused._lay_out_again(str(moved))
    # Read after the trace (which put its own writes back): the state the next step compares with.
    fused.model_state = ModelState(fused.model)
    return plan

def trace_step(fused: FusedStep, inputs: Any, targets: Any, sig: Signature, resident_before: int | None = None
               ) -> StepPlan:
    source = inputs if isinstance(inputs, Tensor) else Tensor(inputs)
    x = np.array(source.data, copy=True)
    target_buffers: list[np.ndarray] = []
    y = None
    if targets is not None:
        spec, leaves = target_layout.flatten(targets)
        target_buffers = [np.array(leaf, copy=True) for leaf in leaves]
        y = target_layout.build(spec, target_buffers)
    params = fused.flat.params()
    # And the arrays the parameters hold: a forward that rebinds .data (a max-norm constraint) must not have
    # the trace's extra run rebind it once more than eager's steps do.
    bound = param_arrays(params)
    saved_rng = rng_states(fused.model)
    # The trace runs the step's Python once more on this batch: a forward that updates buffers in training
    # (a running mean, a batch count) must not keep that update, or the buffers see step 1's batch twice.
    saved_buffers = buffer_states(fused.model)
    # And the plain values its Python sets (a step counter), the model's and the loss function's: the replay runs
    # the forward again (a captured replay's recording passes do, and keep what one pass set: captured.py), so
    # the trace's own writes are put back; and what it wrote in place to memory that outlives it (a target
    # network's moving average of the weights), from a journal of the bytes before (journal.py).
    saved_state = PythonState(fused.model, fused.loss_fn)
    journal = WriteJournal()
    # Every other leaf's .grad is kept (the trace changes none): the model's parameters outside the layout
    # and those left out of it for having had no gradient, which may sit outside the model.
    others = {p: p.grad for p in [*fused.model.parameters(), *fused.left_out.values()] if not fused.flat.owns(p)}
    tracer = TracingArena(name=f"tracing arena ({sig})")
    # What the process holds before the traced run (trace() reads it before its attempts), to measure what the run
    # leaves behind that no plan buffer holds (gained_by_libraries, below).
    copied_inputs = x.nbytes + sum(b.nbytes for b in target_buffers)  # resident already if read before them
    if resident_before is None:
        resident_before, copied_inputs = resident_after_returning_freed(), 0
    # Traced in the modes a step trains in, and each module's put back after (a compile() on a model in eval mode
    # before step 1 left it in train mode; a step's modes are these already): nn/modes.py.
    modes = saved_modes(fused.model)
    ensure_training(fused.model)
    try:
        with tracer, journal:
            for p in [*params, *others]:  # the others get theirs back below; None tells who got one
                p.grad = None
            loss = fused.loss_fn(fused.model(_input_tensor(x, source)), y)
            if not isinstance(loss, Tensor):  # a float or NumPy value has no graph to differentiate
                raise TypeError(f"loss_fn must return the loss as a scalar Tensor, computed with tensorarena ops "
                                f"from the model's output, got {type(loss).__name__}; a number made with "
                                f".item() or NumPy has no gradient")
            if loss.data.size != 1:
                raise ValueError(f"loss_fn must return a scalar, got shape {loss.shape}")
            if fused.update_in_backward:
                seen: set[int] = set()
                # The trace updates nothing: it notes who got a gradient and lets it die as a replay would.
                autograd.backward(loss, on_leaf_grad=fused._leaf_hook(seen, update=False))
            else:
                autograd.backward(loss, seed=fused.loss_seed)
                seen = {id(p) for p in params if p.grad is not None}
            # The layout holds exactly the parameters that get a gradient: the eager optimizer skips one
            # without (unused, cut off by detach, a branch the config turned off), so it is left out.
            no_grad = [p for p in params if id(p) not in seen]
            regained = [p for p in fused.left_out.values() if p.grad is not None]
            if no_grad or regained:
                raise _GradientsMoved(fused.flat, no_grad, regained)
            # A trainable parameter in no optimizer group (an optimizer over the head only) keeps the
            # gradient every backward gives it in .grad, a heap array of its own, as torch keeps it: that
            # is memory the step holds, so the report counts it (train/route_plan.py's part of this name).
            grads_outside = sum(p._data.nbytes for p in others if p.grad is not None)
            if not fused.update_in_backward:
                outside = [name for name, p in fused.model.named_parameters()
                           if p.grad is not None and not fused.flat.owns(p)]
                if outside:
                    # Its .grad would accumulate from step to step, so each replay would take a different
                    # path through autograd than the trace (a PlanMismatchError naming no parameter).
                    raise UnsupportedOpError(
                        f"parameters {outside[:5]}{'...' if len(outside) > 5 else ''} get a gradient but are not "
                        f"in the optimizer; with flat gradients (clip_grad_norm or update_in_backward=False) the "
                        f"fused route needs every such parameter in it. Add them to the optimizer, freeze them "
                        f"(requires_grad=False), or use route='eager'")
            del loss
    finally:
        restore_modes(modes)
        journal.undo()
        restore_rng(saved_rng)
        restore_buffers(saved_buffers)
        saved_state.put_back()
        restore_param_arrays(bound)
        for p in params:
            p.grad = None
        for p, grad in others.items():
            p.grad = grad
    buffers = tracer.finish()
    fused.traces += 1
    lifetimes = tracer.lifetimes()
    del tracer  # its buffers are dead: the step has let them all go
    gained_by_libraries = max(0, resident_after_returning_freed() - resident_before - copied_inputs)
    fused.libraries_measured += gained_by_libraries
    memory = plan_memory(lifetimes)
    slab = aligned_bytes(max(memory.slab_bytes, 1))  # persistent: owned by the plan; offsets are ALIGN multiples
    views = [slab[memory.offsets[str(b.index)]:memory.offsets[str(b.index)] + b.nbytes]
             .view(b.dtype).reshape(b.shape) for b in buffers]
    name = type(fused.optimizer).__name__
    if fused.update_in_backward:
        host = [f"backward, each parameter updated as its gradient completes ({name}.update_flat on its pieces)"]
    else:
        host = ["zero_grad (set_to_none)", "backward"]
        if fused.clip_grad_norm is not None:
            host.append(f"clip_grad_norm_({fused.clip_grad_norm})")
        host += [f"{name}.update_flat(group {i})" for i in range(len(fused.flat.groups))]
    if fused.scheduler is not None:
        host.append(f"{type(fused.scheduler).__name__}.step()")
    persistent = {**fused.flat.nbytes(), **fused._untrained_bytes()}
    if grads_outside:
        persistent["grads outside the optimizer"] = grads_outside
    plan = StepPlan(sig, buffers, memory, slab, views, x, y, host, persistent, fused.matmul_precision,
                    target_buffers=target_buffers, occupants=previous_occupants(buffers, memory.offsets),
                    libraries_measured=gained_by_libraries)
    log.info("fused route: traced %s (float32 products in %s)", memory.summary(), fused.matmul_precision)
    return plan

def untrained_bytes(fused: FusedStep) -> dict[str, int]:
    """What training holds outside the flat layout: parameters it does not train (frozen ones, which the
    forward still reads; those left out for having no gradient) and optimizer state they keep (a
    parameter frozen mid-run keeps its moments, as in torch). Empty when every parameter is trained."""
    outside = {id(p): p for p in [*fused.model.parameters(),
                                  *(q for group in fused.optimizer.param_groups for q in group["params"])]
               if not fused.flat.owns(p)}
    params = sum(p._data.nbytes for p in outside.values())
    state = sum(v.nbytes for p in outside.values() for v in fused.optimizer.state.get(p, {}).values()
                if isinstance(v, np.ndarray))
    return {k: v for k, v in (("params_not_trained", params), ("state_not_trained", state)) if v}
