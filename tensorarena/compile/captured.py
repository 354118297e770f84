"""The captured replay: a fused step run as its recorded flat list of calls, with no Python between them.

FusedStep(replay="captured") records, once per plan, every call that touches arrays during a step
(tensorarena/tape.py: the kernels, the ops' plain-NumPy writes made through `tape.host`, and each
parameter's update inside backward), and from then on replays that list on the plan's buffers. The
model's forward, autograd, the arena and the op dispatch are not run again: that Python is what
separates a fused step from its kernels (bench/vit_floor.py's "kernels only": 0.765 against 0.817
x PyTorch eager on ViT-Tiny, 0.661 against 0.717 on ViT-Base).

A list is only as good as its completeness: a NumPy write that bypassed `tape.host`, an argument
computed from the data, or a random draw would be replayed stale, silently. So before a recording
is used, four passes that update nothing check it against the Python replay, bit for bit (the loss
and a hash of every parameter's gradient):
  1. the Python replay on the batch, recording;  2. the Python replay on a second batch B (the first
  with its values moved and changed: second_batch), which leaves B's values in every buffer;
  3. the recording on the batch: it must give pass 1's results, so no value it reads was left behind
  by pass 2;
  4. the recording on B: it must give pass 2's, so nothing in it is frozen to the first batch.
The capture is also refused when the step draws random numbers outside its recorded calls (dropout
draws its seed inside one, tensorarena.random.Seed, so a replay draws a new one each step: every
pass starts from the same generator states, and the recording must leave them where the Python
pass did), when a recorded call reads an array outside the plan's buffers, the flat state, the
model's own arrays and the loss module's buffers (e.g. a mask the step computed with NumPy from the batch;
a class weight, nn.NLLLoss(weight=w), is a buffer: written in place it is read by the next replay, assigned
anew it records the step again), when a leaf the
optimizer does not own gets a gradient, when replaying the recording fails, or when the recording leaves
the model's buffers (register_buffer) otherwise than its Python pass did (a running statistic updated
with NumPy in a forward: a replay would never update it again). A refusal is logged, and the plan keeps
the Python replay.
Every pass starts from the generators' states and the buffers the capture found, and leaves them so: the
real step after it draws and writes them once, as the eager step does.

Some batches cannot check a recording, though the next of the signature may: the second batch equals
the batch, both give the same loss and gradients (every target ignored), or a loss is not finite (a
NaN pixel). That is no verdict: the step runs the Python replay (which skips or raises as it would),
a warning says so, and the plan's next step records and checks again, up to _MAX_UNCHECKED batches
before the plan keeps the Python replay for good. And an exception from the Python passes (the model's
own code on the batch: a bad label, a MemoryError, an interrupt) is no verdict either: it propagates
as the Python replay would raise it, nothing updated, and the next step records again.

What the checks cannot see: a branch on the data's values that both checking batches take the same
way, or an argument computed from the data that happens to be equal for both. Like a captured CUDA
graph, a recording assumes the step does the same work for every batch of its signature. Hence
`replay="auto"`, the default, records only a step whose Python is all tensorarena's own
(compile/replay_choice.py says which replay a step runs, and why).
Ops keep their array work inside kernels or `tape.host` calls (ops/_base.py, arith.py, unary.py,
reduce.py, index.py, loss.py, shape.py, nn_ops.py, attention.py, autograd's gradient accumulation).

A recording holds the kernels handed out when it was made, and the modules' state it was made under.
A switch of kernel dispatch (kernels.use_reference, gemm.use_backend, ...) gives the step a plan of its
own (FusedStep.plan_for keys plans by kernels.dispatch_key), recorded anew; before each captured step,
`changed` compares the dispatch again (a safety net). A change of the modules' state (watched_state.ModelState:
e.g. a dropout probability set anew) makes FusedStep.plan_for trace the plan again, so it is recorded anew too.

On ViT, the MLP and BERT the recording passes the checks and trains bit for bit as the Python
replay (tests/test_captured_replay.py, tests/test_captured_ops.py).
`kernels.calls[("fused_replay", "captured" | "python")]` counts which replay ran each step.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from .. import autograd, kernels
from ..kernels import calls
from ..memory.pool import return_freed_memory
from ..ops._base import is_constant
from ..precision import float32_matmul_precision
from ..journal import WriteJournal, undo_open_journal
from ..tape import Tape, host
from ..tensor import Tensor
from .batches import SecondOf, _data, load_batch
from .trace import PlanMismatchError
from .watched_state import BufferArrays, ForwardGlobals, LossState, PythonState, _loss_modules

if TYPE_CHECKING:
    from .step import FusedStep
    from .step_plan import StepPlan

log = logging.getLogger("tensorarena")


@dataclass
class Capture:
    """A plan's recording (None when refused), the loss's buffer, where forward ends, and the verdict."""

    tape: Tape | None
    loss: np.ndarray | None = None  # the loss's 0-d buffer in the slab, read after the forward entries
    forward_end: int = 0  # entries before this index compute the loss; the rest are backward and updates
    note: str = "captured"
    # (id(param), id(grad buffer)) -> its bound update (GradSink); here, so that it goes with its plan; made
    # under the flat state's binding `prepared_generation` (FlatState.generation), emptied after a rebinding
    prepared: dict = field(default_factory=dict)
    prepared_generation: int = 0
    dispatch: tuple = ()  # kernels.dispatch_key() when recorded: the recorded calls are the kernels handed out then
    loss_state: Any = None  # LossState of the loss function when recorded: a change records the step again
    forward_globals: Any = None  # ForwardGlobals of the model's forwards when recorded: likewise
    buffers: Any = None  # BufferArrays when recorded: a buffer assigned anew records the step again


class GradSink:
    """What a recorded step does with each parameter's complete gradient (update_in_backward): update it,
    or (a checking pass) only hash it."""

    def __init__(self, step: "FusedStep") -> None:
        # A proxy, not the step: the step holds its sink, and the cycle kept a dropped FusedStep (its slabs, its
        # flat copy of parameters and optimizer state) alive until a full garbage collection, which a captured
        # replay, making almost no Python objects, seldom triggers (tests/test_memory_churn_hunt.py).
        self.step, self.mode, self.hashes, self.updated = weakref.proxy(step), "update", [], 0
        self.prepared: dict[tuple[int, int], Any] = {}  # the replaying plan's (Capture.prepared)

    def __call__(self, p: Tensor, g: np.ndarray) -> None:
        if self.mode == "update":
            # A recording hands each parameter the same gradient buffer every step, so its update is bound
            # to both once (FlatState.prepare_update), on the first step that updates it.
            run = self.prepared.get((id(p), id(g)))
            if run is None:
                run = self.prepared[id(p), id(g)] = self.step.flat.prepare_update(p, g)
            run()
            self.updated += 1
        else:
            self.hashes.append(_digest(g))


def _same_state(a: Any, b: Any) -> bool:
    """Whether two bit-generator states are equal (nested dicts of ints and, for some generators, arrays)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8).reshape(-1), digest_size=16).digest()


def _python_pass(step: "FusedStep", plan: "StepPlan", sink: GradSink, x, y, tape: Tape | None) -> dict:
    """Forward and backward as the Python replay runs them, updating nothing: the loss's digest, each
    gradient's, and (recording) the loss buffer and where forward ends."""
    from .step import PlannedArena

    load_batch(plan, x, y)
    params = step.flat.params()
    others = {p: p.grad for p in step.model.parameters() if not step.flat.owns(p)}  # put back afterwards
    sink.mode, sink.hashes, foreign = "hash", [], []

    def on_leaf_grad(p: Tensor, g: np.ndarray) -> bool:
        if not step.flat.owns(p):
            foreign.append(p)
            return False
        host(sink, p, g)
        return True

    arena = PlannedArena(plan, name="fused capture arena")
    recording = tape.recording() if tape is not None else contextlib.nullcontext()
    try:
        with arena, recording:
            for p in [*params, *others]:  # the others get theirs back below; None tells who got one
                p.grad = None
            loss = step.loss_fn(step.model(Tensor(plan.inputs)), plan.targets)
            if not math.isfinite(float(loss.data)):  # gradients of nan everywhere check nothing: no backward
                return {"finite": False, "loss_value": float(loss.data)}
            forward_end = len(tape.entries) if tape is not None else 0
            if step.update_in_backward:
                autograd.backward(loss, on_leaf_grad=on_leaf_grad)
            else:
                autograd.backward(loss, seed=step.loss_seed)
                # A model parameter outside the optimizer accumulates into its .grad across steps on the
                # Python replay; a recording would copy over it each step instead.
                foreign += [p for p in step.model.parameters() if p.grad is not None and not step.flat.owns(p)]
            loss_buffer, complete = loss.data, arena.cursor == len(plan.buffers)
            del loss
        grads = list(sink.hashes) if step.update_in_backward else [_digest(g.grad) for g in step.flat.groups]
    finally:
        undo_open_journal()  # its in-place writes to the model's memory: each pass starts where the capture did
        for p in params:
            p.grad = None
        for p, grad in others.items():  # a checking pass leaves no gradient behind
            p.grad = grad
    return {"finite": True, "loss": _digest(loss_buffer), "grads": grads, "loss_buffer": loss_buffer,
            "forward_end": forward_end, "complete": complete, "foreign": foreign}


def _tape_pass(step: "FusedStep", plan: "StepPlan", sink: GradSink, capture: Capture, x, y) -> dict:
    """The recording replayed on a batch, updating nothing: the loss's digest and each gradient's."""
    from .step_plan import TapeArena

    load_batch(plan, x, y)
    sink.mode, sink.hashes = "hash", []
    arena = TapeArena(plan, capture.tape.allocations, name="fused capture arena")
    try:
        with arena:
            for fn, args, kwargs in capture.tape.entries:
                fn(*args, **kwargs)
    finally:
        undo_open_journal()  # the recording writes what pass 1 wrote, whose bytes before the journal holds
    grads = list(sink.hashes) if step.update_in_backward else [_digest(g.grad) for g in step.flat.groups]
    return {"loss": _digest(capture.loss), "grads": grads, "complete": arena.cursor == len(capture.tape.allocations)}


def changed(capture: Capture) -> str | None:
    """Why `capture` no longer does what the Python replay would, or None: the kernel dispatch changed
    (kernels.dispatch_key: the recording calls the kernels handed out when it was made, where the Python
    replay asks kernels.kernel each step; plans are keyed by it, so this is a safety net), the loss function's
    state changed (LossState), or a buffer of the model or the loss module was assigned another array
    (BufferArrays). A change of the model's state (ModelState) is FusedStep.plan_for's to see: it traces the
    plan again, recording and all."""
    if capture.tape is None:
        return None
    now = kernels.dispatch_key()  # cached between changes: this runs before every captured step
    if capture.dispatch is not now and capture.dispatch != now:
        return ("the kernel dispatch changed since its step was recorded (kernels.use_reference or using, "
                "kernels.register, gemm.use_backend or gemm_jobs.use_jobs)")
    if capture.loss_state is not None and capture.loss_state.changed():
        return f"the loss function's state changed since its step was recorded ({capture.loss_state.describe_change()})"
    if capture.forward_globals is not None and capture.forward_globals.changed():
        return (f"a global the model's forward reads changed since its step was recorded "
                f"({capture.forward_globals.describe_change()})")
    replaced = capture.buffers.changed() if capture.buffers is not None else None
    if replaced is not None:
        return (f"{replaced} was assigned another array since its step was recorded (the recording reads the old "
                f"one)")
    return None


@dataclass
class _Unchecked:
    """A recording this batch could not check, though another batch of the signature may: no verdict."""

    reason: str


# How many batches of a plan may fail to check its recording (_Unchecked) before the plan keeps the Python
# replay for good; counted on the plan (StepPlan.<_TRIES_ATTR>), reset when a recording passes.
_MAX_UNCHECKED = 3
_TRIES_ATTR = "captured_unchecked_tries"


def _capture(step: "FusedStep", plan: "StepPlan", inputs: Any, targets: Any) -> Capture | _Unchecked:
    """The recording and its four checks (module docstring). An exception from the Python passes (the model
    on the batch: a bad batch, a MemoryError, an interrupt) propagates, as the Python replay would raise it,
    with nothing updated and the generators where they were; a failure of the recording's own passes (3
    and 4) is a refusal; a batch that cannot tell the passes apart is _Unchecked."""
    from .step_state import (buffer_states, param_arrays, restore_buffers, restore_param_arrays, restore_rng,
                             rng_states)

    x, y = _data(inputs), targets  # the targets as given: one array or a structure of them (load_batch)
    xb, yb = SecondOf(x), None if y is None else SecondOf(y)
    load_batch(plan, xb, yb)  # compared where it is made: neither a copy of the batch nor a boolean mask
    if _digest(plan.inputs) == _digest(np.asarray(x, plan.inputs.dtype)):
        return _Unchecked("the second batch made from this one (second_batch) equals it, so the recording "
                          "cannot be checked against a second batch")
    sink = step.grad_sink
    dispatch = kernels.dispatch_key()  # the kernels the recording will hold are the ones handed out now
    loss_state = LossState(step.loss_fn)  # and the numbers the loss computes with now
    forward_globals = ForwardGlobals(step.model)  # and the globals the model's forwards read now
    # And the arrays of the buffers and of the parameters outside the flat state (frozen) its calls will hold.
    arrays = BufferArrays(step.model, step.loss_fn,
                          [(name, p) for name, p in step.model.named_parameters() if not step.flat.owns(p)])
    saved = rng_states(step.model)  # every pass starts from these states, and the real steps after them
    bound = param_arrays(step.flat.params())  # and the arrays the parameters hold (see below)
    # And from these buffers: a forward's buffer writes in training (running statistics) are the real step's
    # to make, once, as on eager; the passes' writes are compared (_left_buffers) and undone.
    buffers = buffer_states(step.model)
    tape = Tape()
    try:
        with float32_matmul_precision(step.matmul_precision):
            first = _python_pass(step, plan, sink, x, y, tape)
            if not first["finite"]:
                return _Unchecked(f"the loss on this batch is {first['loss_value']}, so its gradients cannot "
                                  f"check the recording")
            # Where the step leaves the generators: the default one only if this pass was handed it, else another
            # thread drawing from it meanwhile would look like a draw outside the recorded calls.
            from ..random import default_asks, peek_default_generator

            used = [g for g, _ in saved if g is not peek_default_generator() or default_asks() != saved.asks]
            drawn = rng_states(step.model, used)
            restore_rng(saved)
            if tape.reads:
                return _refused(f"the step's Python reads values out of the tensors it computes ({tape.reads[0]}"
                                f"{f' and {len(tape.reads) - 1} more' if len(tape.reads) > 1 else ''}): a "
                                f"recording would go on with the values read now (a branch, a scale)")
            rebound = restore_param_arrays(bound)
            if rebound:
                return _refused(f"the forward rebinds the .data of {rebound} parameter(s) (a constraint such as "
                                f"`w.data = w.data / norms`), which a recording would not do again")
            first["buffers"] = _left_buffers(step, buffers)
            if first["foreign"]:
                return _refused(f"{len(first['foreign'])} leaf tensor(s) the optimizer does not own received a "
                                f"gradient; a recording would not set their .grad")
            if not first["complete"]:
                return _refused("the recording pass used fewer buffers than the plan")
            stray = _stray_array(tape, _regions(step, plan))
            if stray is not None:
                return _refused(f"a recorded call reads an array made outside the plan's buffers ({stray.shape} "
                                f"{stray.dtype}), {_stray_origin(stray, first['buffers'])}, which a replay would "
                                f"not compute again")
            try:
                second = _python_pass(step, plan, sink, xb, yb, None)
            except MemoryError:
                raise
            except Exception as exc:  # the second batch is made up: its failure says nothing of the real one
                return _Unchecked(f"the Python replay failed on the second batch ({type(exc).__name__}: {exc})")
            restore_rng(saved)
            second["buffers"] = _left_buffers(step, buffers)
            if not second["finite"]:
                return _Unchecked(f"the loss on the second batch is {second['loss_value']}, so its gradients "
                                  f"cannot check the recording")
            if (first["loss"], first["grads"]) == (second["loss"], second["grads"]):
                return _Unchecked("the batch and the second batch give the same loss and gradients, so the "
                                  "recording cannot be checked")
            result = Capture(tape, first["loss_buffer"], first["forward_end"], dispatch=dispatch,
                             loss_state=loss_state, forward_globals=forward_globals, buffers=arrays)
            try:
                again, other, random_outside = _tape_passes(step, plan, sink, result, (x, y), (xb, yb), saved,
                                                            drawn, buffers, (first["buffers"], second["buffers"]))
            except MemoryError:
                raise
            except Exception as exc:  # a recorded call that cannot run again, e.g.: the Python replay goes on
                return _refused(f"replaying the recording failed ({type(exc).__name__}: {exc})")
    finally:
        restore_rng(saved)  # the first real step draws what the Python replay's first step would
        restore_buffers(buffers)  # and finds the buffers the previous step left
        sink.mode = "update"
    if random_outside:
        return _refused("the step draws random numbers outside its recorded calls (an rng used in the model's "
                        "Python rather than through tensorarena.random.Seed), which a recording would not draw "
                        "again")
    for name, got, want in (("the batch", again, first), ("the second batch", other, second)):
        if not got["complete"]:
            return _refused(f"on {name}, the recording's calls asked for fewer scratch buffers than recorded")
        if (got["loss"], got["grads"]) != (want["loss"], want["grads"]):
            what = "loss" if got["loss"] != want["loss"] else "gradients"
            return _refused(f"on {name}, the recording's {what} differ from the Python replay's: some of the "
                            f"step's work on arrays is not in it (a NumPy write outside kernels and tape.host, "
                            f"or an argument computed from the data)")
    for name, got in (("the batch", again), ("the second batch", other)):
        if got["buffers"]:
            return _refused(f"on {name}, the step's Python writes buffers {got['buffers'][:5]} that the recording "
                            f"does not write as it does (a write outside kernels and tape.host, e.g. a running "
                            f"statistic updated with NumPy in forward), so a captured replay would not update them")
    log.info("fused route: captured the step for %s as %d calls (checked on two batches)", plan.signature,
             len(tape.entries))
    return result


def _tape_passes(step: "FusedStep", plan: "StepPlan", sink: GradSink, result: Capture, batch: tuple,
                 second: tuple, saved: list, drawn: list, buffers: list, python_left: tuple
                 ) -> tuple[dict, dict | None, bool]:
    """Passes 3 and 4: the recording on the batch and on the second batch; and whether pass 3 left the
    generators elsewhere than the Python pass did (then pass 4 is not run: None). Each pass's "buffers":
    the model's buffers it left with other values than its Python pass did (python_left: passes 1 and 2's
    _left_buffers), found before they are put back to `buffers`, as every pass found them."""
    from .step_state import restore_rng

    again = _tape_pass(step, plan, sink, result, *batch)
    again["buffers"] = _unrepeated_buffers(python_left[0], buffers)
    # Draws made through recorded calls (random.Seed: dropout) happen again on a replay; any other
    # draw would not, and leaves the generators elsewhere than the Python pass did.
    if not all(_same_state(g.bit_generator.state, s) for g, s in drawn):
        return again, None, True
    restore_rng(saved)
    other = _tape_pass(step, plan, sink, result, *second)
    other["buffers"] = _unrepeated_buffers(python_left[1], buffers)
    return again, other, False


def _left_buffers(step: "FusedStep", buffers: list) -> list | None:
    """After a Python pass: the buffers as it left them (None when it changed none, the common case: no
    copy), then put back to `buffers`, where the pass found them."""
    from .step_state import buffer_states, changed_buffers, restore_buffers

    left = buffer_states(step.model) if changed_buffers(buffers) else None
    restore_buffers(buffers)
    return left


def _unrepeated_buffers(python_left: list | None, buffers: list) -> list[str]:
    """After a recording's pass: the names of the buffers it left otherwise than its Python pass did
    (python_left, or `buffers` where that changed none), then every buffer put back to `buffers`."""
    from .step_state import changed_buffers, restore_buffers

    differ = changed_buffers(python_left if python_left is not None else buffers)
    restore_buffers(buffers)
    return differ


def capture(step: "FusedStep", plan: "StepPlan", inputs: Any, targets: Any) -> Capture | None:
    """Record `plan`'s step on this batch and check the recording (module docstring); nothing is updated.

    None when this batch could not check the recording (_Unchecked: a non-finite loss, a second batch that
    cannot be told from it): this step runs the Python replay, and the plan's next step records and checks
    again, up to _MAX_UNCHECKED batches, after which the plan keeps the Python replay for good."""
    # The passes run the step's Python (passes 1 and 2) and its recording (3 and 4) on top of the real step: what
    # they write in place to memory outside the plan (a target network's moving average) is undone after each
    # (journal.py), and the plain values they set (a count of calls) are put back unless the recording is used
    # (it never runs the Python again, so what a pass set stands for what the first step sets).
    before = PythonState(step.model, step.loss_fn)
    try:
        with WriteJournal() as journal:
            verdict = _capture(step, plan, inputs, targets)
    finally:
        journal.undo()
        # The second batch and the checking passes' temporaries are freed by now, but glibc keeps such
        # pages resident: 6 MiB on ViT-Tiny, which the step's memory prediction does not count.
        return_freed_memory()
    if isinstance(verdict, _Unchecked) or verdict.tape is None:
        before.put_back()  # the Python replay runs this step's forward, as eager does
    if isinstance(verdict, _Unchecked):
        return _unchecked(plan, verdict.reason)
    if verdict.tape is not None:
        setattr(plan, _TRIES_ATTR, 0)  # a later recording (after a change) gets its own tries
    return verdict


def _unchecked(plan: "StepPlan", reason: str) -> Capture | None:
    """No verdict on this batch: None (record again at the plan's next step), or the refusal once the plan
    has had _MAX_UNCHECKED such batches."""
    tries = getattr(plan, _TRIES_ATTR, 0) + 1
    setattr(plan, _TRIES_ATTR, tries)  # StepPlan is a plain dataclass: the count goes with its plan
    if tries >= _MAX_UNCHECKED:
        return _refused(f"{tries} batches of this signature could not check the recording; the last: {reason}")
    log.warning("fused route: this step of %s runs the Python replay: %s; the next step records and checks "
                "again (%d of %d tries)", plan.signature, reason, tries, _MAX_UNCHECKED)
    return None


def _regions(step: "FusedStep", plan: "StepPlan") -> list[tuple[int, int]]:
    """Memory a replay may read and write: the slab, the plan's inputs, the flat state, the model's own arrays
    and the loss module's buffers (a class weight: BufferArrays sees one assigned anew)."""
    arrays = [plan.slab, plan.inputs, *plan.target_buffers, step.loss_seed]
    for g in step.flat.groups:
        arrays += [g.param, g.grad, *g.state.values(), *g.scalars.values()]
    arrays += [p.data for p in step.model.parameters()]
    for module in [*step.model.modules(), *_loss_modules(step.loss_fn)]:
        arrays += [b.data if isinstance(b, Tensor) else b for _, b in module._own_buffers()]
    return [byte_bounds(a) for a in arrays if isinstance(a, np.ndarray) and a.size]


def _stray_array(tape: Tape, regions: list[tuple[int, int]]) -> np.ndarray | None:
    """The first array a recorded call takes that lies outside `regions`: made by the step's Python from the
    batch, it would be replayed as it was on the recorded batch."""
    def arrays(value):
        if isinstance(value, np.ndarray):
            yield value
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from arrays(v)

    for _, args, kwargs in tape.entries:
        for a in arrays((*args, *kwargs.values())):
            if a.size == 0 or is_constant(a):  # a number from the op's arguments (ops._base._constant)
                continue
            lo, hi = byte_bounds(a)
            if not any(rlo <= lo and hi <= rhi for rlo, rhi in regions):
                return a
    return None


def _stray_origin(stray: np.ndarray, left: list | None) -> str:
    """What the stray array is, in words: a buffer the forward assigned a new tensor (Module copies one to the
    heap each step, nn/module.py _buffer_value), found among the buffers the Python pass left (`left`)."""
    for path, _, _, _, array, _ in left or ():
        if array is not None and np.may_share_memory(array, stray):
            return (f"the model's buffer {path!r}, which its forward assigns a new tensor (kept as a copy made "
                    f"that step)")
    return "e.g. a mask computed with NumPy from the batch"


def _refused(reason: str) -> Capture:
    log.warning("fused route: this plan keeps the Python replay: %s", reason)
    return Capture(None, note=f"python: {reason}")


def replay(step: "FusedStep", plan: "StepPlan", capture: Capture, index: int, on_nonfinite: str, *,
           update: bool = True):
    """One training step from the recording (the batch is already in the plan's inputs): (loss, grad norm
    before clipping or None, skipped, the step's arena), as FusedStep._replay returns them. Without `update`
    (a micro-batch) the gradients are left in the flat buffers: no clipping, update or schedule."""
    from .step import partly_applied, skip_non_finite
    from .step_plan import TapeArena

    step.flat.ensure_bound()
    if capture.prepared_generation != step.flat.generation:  # e.g. a checkpoint loaded: new group dicts
        capture.prepared.clear()
        capture.prepared_generation = step.flat.generation
    params = step.flat.params()
    sink = step.grad_sink
    sink.mode, sink.updated, sink.prepared = "update", 0, capture.prepared
    entries = capture.tape.entries
    arena = TapeArena(plan, capture.tape.allocations, name=f"fused step {index} arena (captured)")
    with arena:
        for fn, args, kwargs in entries[:capture.forward_end]:
            fn(*args, **kwargs)
        value = float(capture.loss)
        if skip_non_finite(value, index, on_nonfinite):
            return value, None, True, arena
        try:
            for fn, args, kwargs in entries[capture.forward_end:]:
                fn(*args, **kwargs)
        except Exception as exc:
            if not sink.updated:
                raise
            raise partly_applied(index, sink.updated, len(params), exc) from exc
        except BaseException as exc:  # an interrupt: let it through as itself, but say what it left behind
            if sink.updated:
                exc.add_note(f"step {index} was interrupted inside backward after {sink.updated} of {len(params)} "
                             f"parameters were already updated (update_in_backward): the step is partly "
                             f"applied. Restore the last checkpoint")
            raise
        if arena.cursor != len(capture.tape.allocations):
            raise PlanMismatchError(f"step {index}'s captured replay asked for {arena.cursor} scratch buffers, its "
                                    f"recording {len(capture.tape.allocations)}")
        if not step.update_in_backward:
            for p in params:  # as after the Python replay's backward: .grad is the flat gradient
                p.grad = p._grad_buffer
        grad_norm = step.after_backward(params, index) if update else None
    calls[("fused_replay", "captured")] += 1
    step.replays += 1
    return value, grad_norm, False, arena
