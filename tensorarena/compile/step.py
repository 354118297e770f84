"""The fused route: a training step traced once, planned into one slab, replayed without allocating.

`compile_step(model, loss_fn, optimizer, example_batch)` returns a `FusedStep`. For each
input signature (shapes and dtypes of inputs and targets) it traces the step once
(compile/trace.py), places every transient buffer into ONE slab by liveness
(compile/planner.py), and from then on replays: the batch is copied into the plan's
persistent input buffers, and the same Python ops run inside a `PlannedArena` whose
i-th allocation is the precomputed slab view of traced buffer i — so a replayed step
allocates no array memory. Parameters and optimizer state are flat (compile/flat.py), and so
are gradients when the update runs after backward (below); clipping and the LR schedule run
as host calls after backward, reading the live step count and lr. Tracing one plan from one
batch is compile/step_trace.py's.

Where the update is applied: by default (`update_in_backward=None`) each parameter is updated
inside backward the moment its gradient is complete (the optimizer's kernel on that parameter's
flat pieces, as the eager optimizer runs it), so gradients are transient slab buffers and no
parameter-sized gradient array exists (327 MiB less on ViT-Base; the step time was the flat
update's within noise: 0.89-1.02x in five A/B runs on ViT-Tiny and ViT-Base, each pair taking
turns in one process). Every optimizer here
updates each parameter from its own gradient alone, so this is the same arithmetic as the flat
update. Global-norm clipping must read every gradient before any update, so with
`clip_grad_norm` the default is the flat route instead: flat persistent gradients and one kernel
call per parameter group after backward. `update_in_backward=False` asks for that always (e.g.
to read `p.grad` after a step); True with clipping is an error.

Two replays. `replay="python"` re-runs the Python op dispatch on the plan's buffers, and checks
every allocation against the trace (its shape and dtype, and that no buffer whose bytes it takes over is
still held: step_plan.PlannedArena), so input-dependent control flow is caught (`PlanMismatchError`)
rather than silently mis-planned. `replay="captured"` (compile/captured.py)
records the step's calls once per plan, checks the recording against this replay bit for bit on
two batches, and then runs only those calls: no forward, autograd or dispatch in Python. Like a
captured CUDA graph, it assumes the step does the same work for every batch of a signature (no
branch on the data's values); the checks refuse what they can see breaking that, and the plan then
keeps the Python replay, with the reason logged. The default, `replay="auto"`, captures when the
model's modules and the loss are all tensorarena's (kept free of such branches) and keeps the
Python replay for a step that runs the user's own forward or loss (replay_choice.choose_replay).
`micro_batch=m` runs a batch of more rows as micro-batches of m on the plan for m rows, summing their weighted
gradients in one more flat buffer before one update (compile/micro_batches.py; never inside backward).
The trace itself does not update anything: no step is taken, and RNG states and the model's buffers (what a
forward writes in training, as BatchNorm's running statistics) are restored, so `memory_report()` is known
before step 1, step 1 is the first replay, and the buffers see each batch once, as on the eager route.

Between steps a user may change what a hand-written PyTorch loop lets them change. Hyperparameters in
`param_groups` are read live by every update. A change to the layout's inputs (requires_grad set or
cleared, `add_param_group`, a setting that adds optimizer state such as momentum, a loaded state dict
with other settings, a parameter's dtype after model.double() or float(): `FlatState.stale`) builds a
new flat layout, which takes the values over, and traces again. A module attribute the forward may branch
on (`watched_state.ModelState`) changed since the last step (its forward's own writes, a step counter, are that
step's state, not a change) drops every plan, each traced under the old state. A parameter the traced step
gives no gradient (unused, cut off by `detach`) is left out of the layout, as the eager optimizer skips it. A new `matmul_precision` traces (or
finds) a plan of its own, as a new kernel dispatch does. The Trainer passes a new `clip_grad_norm` or
scheduler on.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import Any, Callable

import numba
import numpy as np

from .. import autograd, kernels
from ..kernels import calls
from ..nn.modes import ensure_training, modes
from ..nn.module import Module
from ..optim.clip import clip_grad_norm_
from ..optim.optimizer import Optimizer, PartlyAppliedError, check_trains_the_model
from ..precision import float32_matmul_precision, get_float32_matmul_precision
from ..precision import normalize as normalize_precision
from ..tensor import Tensor
from . import captured, step_trace
from . import targets as target_layout
from .batches import load_batch
from .flat import FlatState
from .micro_batches import GradAccumulator, check_micro_batch, check_model_splits, micro_step, split_batch
from .replay_choice import choose_replay
from .step_state import step_scheduler
from .step_plan import PlannedArena, Signature, StepPlan
from .trace import PlanMismatchError, UnsupportedInputError
from .watched_state import ModelState

log = logging.getLogger("tensorarena")



def input_array(inputs: Any) -> np.ndarray:
    """The array the model reads for `inputs`, by Tensor's own rules (as the eager route's Tensor(inputs)):
    Python floats and float16 become float32, a big-endian float32 a native one. The plan's input buffer
    has this dtype, so a replay never converts the batch into a heap copy."""
    if isinstance(inputs, Tensor):
        return inputs.data
    try:
        return Tensor(inputs).data
    except TypeError:
        if isinstance(inputs, (np.ndarray, list, tuple, int, float, np.generic)):
            raise  # an array-like the eager route makes a Tensor of too, and fails the same way
        # The eager route hands such a batch (a dict of arrays, a tokenizer's Encoding) to the model as it is; a
        # plan holds its inputs in one array buffer. An UnsupportedOpError, so fallback_to_eager=True applies.
        # (NumPy's own words are left out: for an Encoding they were about "64 dimensions", which misled.)
        raise UnsupportedInputError(
            f"the fused route (and route='auto', whose plan traces it) holds the inputs in one array buffer, and "
            f"cannot hold a batch of type {type(inputs).__name__}. Pass the inputs as one array (e.g. an Encoding's "
            f".input_ids; read the rest from the targets or the model), or train with route='eager' or "
            f"'streaming', which hand the batch to the model as it is (Trainer(..., fallback_to_eager=True) falls "
            f"back to eager and logs why)") from None


def batch_signature(inputs: Any, targets: Any) -> Signature:
    """What a plan is specialised on: shape and dtype of the inputs as the model reads them, and of the
    targets (one array's, or the structure's: compile/targets.py, whose constants are part of it too)."""
    x = input_array(inputs)
    if targets is None:
        return ((x.shape, x.dtype.str), None)
    if isinstance(targets, np.ndarray):  # the common case, without the walk
        return ((x.shape, x.dtype.str), (targets.shape, targets.dtype.str))
    spec, _ = target_layout.flatten(targets)
    return ((x.shape, x.dtype.str), spec[1:] if spec[0] == "array" else spec)


class FusedStep:
    """A model's compiled training step: per-signature plans in a bounded LRU; see the module docstring.

    Plans belong to this object (one per model/optimizer pair), never to a process- or
    thread-wide cache, so two models trained side by side never see each other's plans.
    """

    def __init__(self, model: Module, loss_fn: Callable, optimizer: Optimizer, *, scheduler=None,
                 clip_grad_norm: float | None = None, max_plans: int = 4,
                 update_in_backward: bool | None = None, matmul_precision: str | None = None,
                 replay: str = "auto", micro_batch: int | None = None) -> None:
        if not isinstance(max_plans, int) or max_plans < 1:
            raise ValueError(f"max_plans must be a positive integer, got {max_plans!r}")
        if not isinstance(model, Module):
            raise TypeError(f"model must be a tensorarena.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable as loss_fn(outputs, targets), got {type(loss_fn).__name__}")
        check_trains_the_model(model, optimizer)  # as the Trainer checks: another model's optimizer trained nothing
        from ..train.report import check_step_options
        check_step_options(clip_grad_norm, "raise")  # as the Trainer's: clip_grad_norm=0 was taken, -1 failed at step 1
        self.replay_asked = replay
        self.replay, self.replay_reason = choose_replay(replay, model, loss_fn)
        log.info("fused route: %s replay (%s)", self.replay, self.replay_reason)
        self.grad_sink = captured.GradSink(self)
        # Every trace and replay runs under it (tensorarena.precision); settable between steps (the property).
        self._matmul_precision = (normalize_precision(matmul_precision) if matmul_precision is not None
                                  else get_float32_matmul_precision())
        self.model, self._loss_fn, self.optimizer = model, loss_fn, optimizer
        self.scheduler, self.clip_grad_norm, self.max_plans = scheduler, clip_grad_norm, max_plans  # (checked)
        self.micro_batch = check_micro_batch(micro_batch)
        check_model_splits(model, self.micro_batch)
        self.update_in_backward = resolve_update_in_backward(update_in_backward, clip_grad_norm, self.micro_batch)
        log.info("fused route: %s", "each parameter updated inside backward (no gradient buffer)"
                 if self.update_in_backward else "flat gradients, one update kernel per group after backward "
                 f"({_why_flat_grads(clip_grad_norm, self.micro_batch)})")
        self.flat = FlatState(model, optimizer, keep_grads=not self.update_in_backward)
        # The micro-batches' weighted gradient sum (compile/micro_batches.py): made with the layout, so that
        # memory_report counts it before step 1.
        self.accumulator = GradAccumulator(self.flat) if self.micro_batch is not None else None
        # (signature, dispatch_key(), threads, matmul precision) -> plan
        self.plans: OrderedDict[tuple, StepPlan] = OrderedDict()
        self.traces = 0  # how many times a step was traced (first signature + every retrace)
        # What seeds the loss's gradient in backward: 1, or while micro-batches run each one's weight (their
        # products then round the whole batch's gradient values, as the eager route's do: micro_batches.py).
        self.loss_seed = np.ones((), np.float64)
        # What the process gained over all traces besides plan buffers (StepPlan.libraries_measured): the
        # libraries' working memory stays after a plan is evicted, so every report counts all of it.
        self.libraries_measured = 0
        # The modules' state the last step (or trace) left: a change before the next step is the user's and drops
        # every plan. One for all plans: each plan's own went stale whenever another plan's step ran a forward that
        # sets an attribute (a step counter), and a batch of the other shape then traced again every time.
        self.model_state: ModelState | None = None
        self.layouts = 1  # flat layouts built: 1 + one per change of the optimizer's groups or trainable set
        self.left_out: dict[int, Tensor] = {}  # id -> optimizer parameter a trace gave no gradient (not laid out)
        self.replays = 0

    @property
    def scheduler(self):
        """The learning-rate schedule stepped (with no argument) after every update, or None."""
        return self._scheduler

    @scheduler.setter
    def scheduler(self, value) -> None:
        """Checked when set, as the Trainer checks its own (train/report.check_scheduler): a ReduceLROnPlateau (whose
        step needs a metric) or a schedule of another optimizer was taken, and step 1 then applied its update and
        failed in the schedule (PartlyAppliedError), or moved the other optimizer's lr while this one's never moved."""
        from ..train.report import check_scheduler

        check_scheduler(value, self.optimizer, "compile_step")
        self._scheduler = value

    @property
    def loss_fn(self) -> Callable:
        """loss_fn(outputs, targets) -> scalar Tensor, traced into every plan."""
        return self._loss_fn

    @loss_fn.setter
    def loss_fn(self, value: Callable) -> None:
        """A new loss from the next step on, as a PyTorch loop that calls another function: every plan was traced
        (and recorded) with the old loss's ops, so they are all dropped and the next step traces anew, and
        replay="auto" chooses again (a loss of the user's own keeps the Python replay)."""
        if not callable(value):
            raise TypeError(f"loss_fn must be callable as loss_fn(outputs, targets), got {type(value).__name__}")
        if value is self._loss_fn:
            return
        self._loss_fn = value
        self.replay, self.replay_reason = choose_replay(self.replay_asked, self.model, value)
        log.info("fused route: a new loss_fn; its plans (%d) are traced anew at the next step, %s replay (%s)",
                 len(self.plans), self.replay, self.replay_reason)
        self.plans.clear()

    @property
    def matmul_precision(self) -> str:
        """The precision of float32 products ("float32" or "bfloat16") the next step traces and replays under."""
        return self._matmul_precision

    @matmul_precision.setter
    def matmul_precision(self, name: str) -> None:
        """Takes effect at the next step: plans are keyed by the precision (plan_for), so the next step finds or
        traces one under the new precision; a plan traced under the old one stays cached for a switch back.
        A name tensorarena.precision does not know is a ValueError now, not at the next step."""
        wanted = normalize_precision(name)
        if wanted != self._matmul_precision:
            log.info("fused route: float32 products in %s from the next step on (were %s)", wanted,
                     self._matmul_precision)
        self._matmul_precision = wanted

    # -- plans ------------------------------------------------------------------
    @property
    def plan(self) -> StepPlan:
        """The most recently used plan."""
        if not self.plans:
            raise RuntimeError("no step has been traced yet; call plan_for(inputs, targets) or step() first")
        return next(reversed(self.plans.values()))

    def memory_report(self) -> dict[str, int]:
        """The most recent plan's report (StepPlan.memory_report), plus "other_plans": the slabs and input
        buffers of the other plans this step keeps (a last, smaller batch of an epoch: up to max_plans),
        which training holds too; and libraries_measured over every trace this step made (evicted plans' too: what
        the libraries kept stays)."""
        report = self.plan.memory_report()
        earlier_traces = self.libraries_measured - report["libraries_measured"]
        report["libraries_measured"] += earlier_traces
        report["predicted_peak"] += earlier_traces
        report["predicted_growth"] += earlier_traces
        others = [p for p in self.plans.values() if p is not self.plan]
        if others:
            extra = sum(p.slab.nbytes + p.inputs.nbytes + sum(b.nbytes for b in p.target_buffers) for p in others)
            report["other_plans"] = extra
            report["predicted_peak"] += extra
            report["predicted_growth"] += extra
        if self.accumulator is not None:
            report["grad_accumulator"] = self.accumulator.nbytes
            for key in ("persistent_total", "predicted_peak", "predicted_growth"):
                report[key] += self.accumulator.nbytes
        return report

    def plan_for(self, inputs: Any, targets: Any) -> StepPlan:
        """The plan for this batch's signature under the kernel dispatch in force (kernels.dispatch_key), the
        thread count and this step's matmul precision, tracing it (and evicting the least recently used) if new."""
        sig = batch_signature(inputs, targets)
        stale = self.flat.stale()
        if stale is not None:
            self._lay_out_again(stale)
        # Kernel dispatch is part of the key: a switch (kernels.use_reference, gemm.use_backend, ...) may
        # change which scratch buffers the step asks for, so the plan traced before it would not replay
        # (PlanMismatchError). Such a switch traces a plan of its own; switching back finds the first.
        # So is the kernels' thread count (numba.set_num_threads, per calling thread): per-core partial
        # rows, attention's tiles and product splits are shaped by it. And the float32 matmul precision
        # (a new one set between steps): bfloat16 products round their operands into buffers of their own.
        # And every module's train/eval mode: a step keeps a submodule the user put in eval mode so (nn/modes.py),
        # whose dropout is then no dropout in the plan; switching it back finds the plan traced before.
        key = (sig, kernels.dispatch_key(), numba.get_num_threads(), self._matmul_precision, modes(self.model))
        if self.model_state is not None and self.plans and self.model_state.changed():
            ensure_training(self.model)  # steps train: a model left in eval mode (compile_step's user) is no change
            if self.model_state.changed():
                # A module attribute the forward may branch on (a flag, a dropout probability) changed since the
                # last step: replaying a plan traced before would diverge from it (or, captured, train the old
                # forward).
                log.info("fused route: the model's state changed since the last step (%s); dropping the %d "
                         "plan(s) traced before it, tracing %s again", self.model_state.describe_change(),
                         len(self.plans), sig)
                self.plans.clear()
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
            return plan
        same_sig = [cached for cached in self.plans if cached[0] == sig]
        if same_sig and all(cached[:4] == key[:4] for cached in same_sig):
            log.info("fused route: a module's train/eval mode changed since %s was traced; tracing it in the new "
                     "modes (%d plan(s) cached)", sig, len(self.plans))
        elif same_sig and all(cached[1:3] == key[1:3] for cached in same_sig):
            log.info("fused route: no plan for %s in float32 products in %s yet (matmul_precision set); tracing it "
                     "(%d plan(s) cached)", sig, self._matmul_precision, len(self.plans))
        elif same_sig:
            log.info("fused route: the kernel dispatch or thread count changed since %s was traced "
                     "(kernels.use_reference, gemm.use_backend, numba.set_num_threads, ...); tracing it under the "
                     "new one (%d plan(s) cached)", sig, len(self.plans))
        elif self.plans:
            log.info("fused route: new batch signature %s, retracing (%d plan(s) cached)", sig, len(self.plans))
        # Room first: evicted after the trace, the oldest plan's slab was still held while the new one was
        # traced and laid out, and max_plans=2 over five shapes peaked at 113 MiB against a 77 MiB report (a
        # helper's memory hunt). A trace that then fails costs the evicted plan a trace of its own later.
        while len(self.plans) >= self.max_plans:
            (old, *_), _ = self.plans.popitem(last=False)
            log.info("fused route: evicted the plan for %s (max_plans=%d)", old, self.max_plans)
        plan = self._trace(inputs, targets, sig)
        self.plans[key] = plan
        return plan

    def _lay_out_again(self, reason: str) -> None:
        """A new flat layout (FlatState) for a changed optimizer or set of trainable parameters, and no plans:
        each was traced against the old layout. The values move over; the next step traces again."""
        log.info("fused route: %s; laying the parameters and optimizer state out again and tracing anew", reason)
        self.flat = FlatState(self.model, self.optimizer, keep_grads=not self.update_in_backward,
                              leave_out=self.left_out.values())
        self.accumulator = GradAccumulator(self.flat) if self.micro_batch is not None else None
        self.plans.clear()
        self.grad_sink = captured.GradSink(self)
        self.layouts += 1

    def _trace(self, inputs: Any, targets: Any, sig: Signature) -> StepPlan:
        return step_trace.trace(self, inputs, targets, sig)

    def _trace_step(self, inputs: Any, targets: Any, sig: Signature, resident_before: int | None = None
                    ) -> StepPlan:
        return step_trace.trace_step(self, inputs, targets, sig, resident_before)

    def _untrained_bytes(self) -> dict[str, int]:
        return step_trace.untrained_bytes(self)

    def _leaf_hook(self, received: set[int], *, update: bool) -> Callable:
        """update_in_backward's on_leaf_grad: for each flattened parameter, record that its gradient came
        and (unless tracing) update it; any other leaf's gradient goes to .grad as usual."""
        flat = self.flat

        def hook(p: Tensor, g: np.ndarray) -> bool:
            if not flat.owns(p):
                return False
            if update:
                flat.update_param(p, g)
            received.add(id(p))
            return True

        return hook

    # -- replay -----------------------------------------------------------------
    def step(self, inputs: Any, targets: Any, *, index: int = 0, on_nonfinite: str = "raise"
             ) -> tuple[float, float | None, bool, PlannedArena]:
        """One replayed step: (loss, grad norm before clipping or None, skipped, the step's arena). With
        micro_batch, a batch of more rows is run as micro-batches and updated once (micro_batches.micro_step).
        A model in eval mode is put in train mode first (model.train()), as the Trainer's step does."""
        # Underflow is a result here, as in eager backward (autograd.backward): the captured replay runs the
        # recorded backward calls without passing through autograd's own errstate.
        # A step trains, as the Trainer's does (nn/modes.py): a model the user put in eval mode between steps (to
        # evaluate it) goes back to train mode first. The trace runs in these modes too (step_trace.trace_step), so
        # a plan keyed by the eval modes was traced with dropout on, and replaying it without dropout raised a
        # PlanMismatchError that blamed data-dependent control flow.
        ensure_training(self.model)
        if on_nonfinite not in ("raise", "skip"):  # another word skipped a non-finite step silently
            from ..train.report import check_step_options
            check_step_options(None, on_nonfinite)
        with float32_matmul_precision(self.matmul_precision), np.errstate(under="ignore"):
            chunks = split_batch(inputs, targets, self.micro_batch, self.loss_fn)
            if len(chunks) > 1:
                return micro_step(self, chunks, index, on_nonfinite)
            return self._replay(inputs, targets, index, on_nonfinite)

    def _note_model_state(self) -> None:
        """The forward's own writes (a step counter) are the state the next step starts from; compared with the
        state before them, every later step would count as changed and trace again."""
        if self.model_state is None or self.model_state.changed():
            self.model_state = ModelState(self.model)

    def _replay(self, inputs: Any, targets: Any, index: int, on_nonfinite: str, *, update: bool = True
                ) -> tuple[float, float | None, bool, PlannedArena]:
        """One forward and backward on the plan for this batch; then, with `update`, clipping, the update and the
        schedule (after_backward). Without it (a micro-batch) the gradients are left in the flat buffers."""
        plan = self.plan_for(inputs, targets)
        if plan.capture is not None:
            stale = captured.changed(plan.capture)
            if stale is not None:
                log.info("fused route: %s, for %s; recording it again", stale, plan.signature)
                plan.capture = None
        if self.replay == "captured" and plan.capture is None:
            self.flat.ensure_bound()
            plan.capture = captured.capture(self, plan, inputs, targets)
            self._note_model_state()  # what its Python passes set (ViT's last_block_route), as a replay's below
        load_batch(plan, inputs, targets)
        if plan.capture is not None and plan.capture.tape is not None:
            return captured.replay(self, plan, plan.capture, index, on_nonfinite, update=update)
        calls[("fused_replay", "python")] += 1
        self.flat.ensure_bound()
        params = self.flat.params()
        grad_norm = None
        arena = PlannedArena(plan, name=f"fused step {index} arena")
        with arena:  # closed before any exception below propagates
            loss = self.loss_fn(self.model(Tensor(plan.inputs)), plan.targets)
            value = loss.item()
            if skip_non_finite(value, index, on_nonfinite):
                return value, None, True, arena  # the .grad of the last good step stay, as on eager
            if self.flat.data_rebound() and self.flat.ensure_bound():
                # The forward rebound a parameter's .data (a max-norm constraint, `w.data = w.data / norms`): the
                # update must reach the array it holds now, as eager's does; it went to the flat view the
                # parameter had left, and the next step's binding copied the stale array back over it (the
                # weight never trained, silently).
                log.info("fused route: step %d's forward rebound a parameter's .data; its values moved into the "
                         "flat state before backward", index)
            for p in params:
                p.grad = None
            updated: set[int] = set()
            if self.update_in_backward:
                try:
                    autograd.backward(loss, on_leaf_grad=self._leaf_hook(updated, update=True))
                except Exception as exc:
                    if not updated:
                        raise
                    raise partly_applied(index, len(updated), len(params), exc) from exc
                except BaseException as exc:  # KeyboardInterrupt: not turned into an error, but told
                    if updated:
                        exc.add_note(partly_applied_note(index, len(updated), len(params)))
                    raise
                missing = self.flat.missing_grads(updated)
            else:
                autograd.backward(loss, seed=self.loss_seed)  # 1, or a micro-batch's weight (micro_batches.py)
                missing = self.flat.missing_grads()
            del loss
            partly = (f" ({len(updated)} of {len(params)} parameters were already updated inside backward: the "
                      f"step is partly applied)" if updated else " (nothing was updated)")
            why = ("the step's control flow depends on the data (or on Python state outside the model's modules), "
                   "which one traced plan cannot follow: train this model with route='eager'")
            if arena.cursor != len(plan.buffers):
                raise PlanMismatchError(f"this step used {arena.cursor} buffers but its trace used "
                                        f"{len(plan.buffers)}; {why}{partly}")
            if missing:
                raise PlanMismatchError(f"parameters {missing[:5]} got no gradient in this step but did in its "
                                        f"trace: {why}{partly}")
            if update:
                grad_norm = self.after_backward(params, index)
        self._note_model_state()
        self.replays += 1
        return value, grad_norm, False, arena

    def after_backward(self, params: list[Tensor], index: int | None = None) -> float | None:
        """The host calls after backward, on either replay: clipping, the flat update, the schedule.
        Returns the gradient norm before clipping (None without clipping)."""
        grad_norm = float(clip_grad_norm_(params, self.clip_grad_norm)) if self.clip_grad_norm is not None else None
        if not self.update_in_backward:
            self.flat.update(index)  # a failure after some groups names the step as partly applied
        if self.scheduler is not None:
            step_scheduler(self.scheduler, index)  # (compile/step_state.py)
        return grad_norm


def skip_non_finite(value: float, index: int, on_nonfinite: str) -> bool:
    """For a step's loss, before any update: False if finite; True if not and on_nonfinite is "skip";
    NonFiniteLossError if not and it is "raise". "continue": a micro-batch that weighs nothing, never checked."""
    if math.isfinite(value) or on_nonfinite == "continue":
        return False
    if on_nonfinite == "raise":
        from ..train.report import NonFiniteLossError
        raise NonFiniteLossError(
            f"loss is {value} at step {index}; the parameters were not updated. Lower the learning "
            f"rate or check the batch, or pass on_nonfinite='skip' to skip such steps.")
    return True


def partly_applied(index: int, updated: int, total: int, exc: Exception) -> PartlyAppliedError:
    """The error for a step that failed inside backward after `updated` parameters were updated there. Not a
    MemoryError any more: redoing the step (the out-of-memory fallback) would update them twice."""
    return PartlyAppliedError(
        f"step {index} failed inside backward after {updated} of {total} parameters were already updated "
        f"(update_in_backward): the step is partly applied, so it is not redone. Restore the last checkpoint; "
        f"{type(exc).__name__}: {exc}")


def partly_applied_note(index: int, updated: int, total: int) -> str:
    """The note added to a KeyboardInterrupt (any BaseException) that stopped backward after `updated` updates."""
    return (f"tensorarena: step {index} stopped inside backward after {updated} of {total} parameters were "
            f"already updated (update_in_backward): the step is partly applied. Restore the last checkpoint")


def resolve_update_in_backward(update_in_backward: bool | None, clip_grad_norm: float | None,
                               micro_batch: int | None = None) -> bool:
    """Whether the fused step updates parameters inside backward: None means yes unless clipping or micro-batches.

    ValueError for True with global-norm clipping, which must see every gradient first, or with micro_batch,
    whose update waits for the last micro-batch's gradient.
    """
    if update_in_backward and micro_batch is not None:
        raise ValueError(f"update_in_backward=True cannot be combined with micro_batch={micro_batch}: the update "
                         f"waits for every micro-batch's gradient. Drop one of the two (update_in_backward=False, "
                         f"or the default None, keeps flat gradients with micro-batches)")
    if update_in_backward is None:
        return clip_grad_norm is None and micro_batch is None
    if update_in_backward and clip_grad_norm is not None:
        raise ValueError("update_in_backward=True cannot be combined with clip_grad_norm: global-norm clipping "
                         "must see every gradient before any parameter is updated. Drop one of the two "
                         "(update_in_backward=False, or the default None, keeps flat gradients when clipping)")
    return bool(update_in_backward)


def _why_flat_grads(clip_grad_norm: float | None, micro_batch: int | None) -> str:
    if clip_grad_norm is not None:
        return "clip_grad_norm needs every gradient first"
    return "micro-batches sum their gradients first" if micro_batch is not None else "asked for"


def compile_step(model: Module, loss_fn: Callable, optimizer: Optimizer, example_batch: tuple[Any, Any], *,
                 scheduler=None, clip_grad_norm: float | None = None, max_plans: int = 4,
                 update_in_backward: bool | None = None, matmul_precision: str | None = None,
                 replay: str = "auto", micro_batch: int | None = None) -> FusedStep:
    """Trace `model`'s training step on `example_batch` = (inputs, targets); nothing is updated yet.

    The result's `memory_report()` gives the step's memory before step 1; `step(x, y)` trains.
    `matmul_precision` ("float32" or "bfloat16", see tensorarena.precision; default: this thread's
    setting now) is the precision of the plans' float32 products; setting the result's `matmul_precision`
    changes it from the next step on. `micro_batch` (rows): a batch of more rows is run as micro-batches of that
    many, their gradients summed before one update (compile/micro_batches.py); the example batch's first
    micro-batch is what gets traced, so memory_report() is a micro-batch's.
    """
    if not isinstance(example_batch, (tuple, list)) or len(example_batch) != 2:
        # Unpacked as it was, an array of two rows became (inputs, targets) = its rows, a dict its two keys, and a
        # batch of other lengths a TypeError about split_batch's arguments; (x, y, extra) dropped `extra`.
        what = (f"a {type(example_batch).__name__} of {len(example_batch)}" if isinstance(example_batch, (tuple, list))
                else f"a {type(example_batch).__name__}")
        raise TypeError(f"example_batch must be the pair (inputs, targets) a step takes, got {what}; pass "
                        f"(x, y), or (x, None) for a loss_fn that needs no targets")
    fused = FusedStep(model, loss_fn, optimizer, scheduler=scheduler, clip_grad_norm=clip_grad_norm,
                      max_plans=max_plans, update_in_backward=update_in_backward, matmul_precision=matmul_precision,
                      replay=replay, micro_batch=micro_batch)
    x, y, _ = split_batch(*example_batch, fused.micro_batch)[0]
    fused.plan_for(x, y)
    return fused
