"""The tracing the route plan (route_plan.py) reads its activation bytes from: each stream stage, or the whole
step, run forward and backward under a TracingArena (TracedStage), the side inputs' bytes, the staged fused and
eager peaks, the lean trace with MLPs recomputing GELU, and what is done around tracing before the process is
measured. Its own file to keep route_plan.py to the estimates and the choice; it imports nothing from there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..compile.planner import plan_memory
from ..compile.trace import TracingArena
from ..nn.modes import ensure_training
from ..nn.module import Module
from ..stream.arena_pages import touched_bytes
from ..stream.arena_pages import STAGE_BLOCK_BYTES
from ..tensor import Tensor

# -- traced activations ----------------------------------------------------------------------------

@dataclass
class TracedStage:
    """What tracing one stage (or the whole step) found."""

    forward_live: int  # bytes the forward leaves alive: saved for backward, plus its output
    allocated: int  # every byte the stage's forward and backward allocate
    slab: int  # the stage's own liveness plan (its peak)
    live_peak: int  # the most bytes alive at once (what the eager arena, reusing dead memory, holds)
    output_bytes: int
    output_key: tuple | None = None  # (shape, dtype str) of a stage's output; None for a whole step
    touched: int = 0  # bytes a streamed step's stage arena touches for it (stream/arena_pages.py)


def _trace(run: Callable[[], Any], params: list[Tensor], model: Module, loss_fn: Any) -> tuple[TracedStage, Any]:
    """Run `run` (forward then backward) under a TracingArena; restore grads, RNG and buffers after (a forward
    writing running statistics would otherwise count the estimate's batch as a step's: tests/test_trainer_hunt.py),
    the plain values the model and the loss set (a count of calls) and what they wrote in place to the model's
    memory (a target network's moving average: journal.py); as the fused trace does (compile/step_trace.py)."""
    from ..compile.step_state import buffer_states, restore_buffers, restore_rng, rng_states
    from ..compile.watched_state import PythonState
    from ..journal import WriteJournal

    saved_grads = [(p, p.grad, p._grad_buffer) for p in params]
    rng = rng_states(model)
    saved_buffers = buffer_states(model)
    saved_state = PythonState(model, loss_fn)
    journal = WriteJournal()
    tracer = TracingArena(name="route estimate tracing arena")
    marks: dict[str, int] = {}
    try:
        with tracer, journal:
            for p in params:
                p.grad = None
            result = run(lambda: marks.setdefault("forward_end", len(tracer.buffers)))
        buffers = tracer.finish()
    finally:
        journal.undo()
        restore_rng(rng)
        restore_buffers(saved_buffers)
        saved_state.put_back()
        for p, grad, buf in saved_grads:
            p.grad, p._grad_buffer = grad, buf
    n = len(buffers)
    end = marks.get("forward_end", n)
    live = sum(b.nbytes for b in buffers[:end] if b.death is None or b.death > end)
    memory = plan_memory(tracer.lifetimes()) if buffers else None
    slab, peak = (memory.slab_bytes, memory.peak_live_bytes) if memory else (0, 0)
    touched = touched_bytes(tracer.lifetimes(), STAGE_BLOCK_BYTES)  # the streamed stage arena's pages
    return TracedStage(live, sum(b.nbytes for b in buffers), slab, peak, result[1], touched=touched), result[0]


def trace_stages(model: Module, loss_fn: Callable, inputs: np.ndarray, targets: Any) -> tuple[list[TracedStage], int]:
    """Each stage of `model.stream_stages()` traced once at this batch (identical stages share one trace), and
    the bytes of the side inputs the route's step arena holds for it (0 when no stage reads any)."""
    from ..stream.stages import SideForward, model_stages, run_stage

    stages = model_stages(model)
    ensure_training(model)  # as a step trains (Trainer.plan puts every module's mode back after: nn/modes.py)
    first_input, side, side_bytes = _side_inputs(model, stages, inputs)
    cache: dict[tuple, tuple[TracedStage, tuple, np.dtype]] = {}
    # Stage 0 reads what the route gives it: the batch, or stream_inputs' first array (a SimCSE's stacked ids),
    # which must agree with the side inputs computed from the same batch (the mask's shape).
    x = np.zeros(inputs.shape, inputs.dtype) if side is None else first_input
    out_stats = []
    for i, stage in enumerate(stages):
        last = i == len(stages) - 1
        # What the stage computes, for sharing traces: a SideForward wraps it (BERT's layers: one _LayerStage each).
        fn = stage.forward.fn if isinstance(stage.forward, SideForward) else stage.forward
        owner = getattr(fn, "__self__", fn)
        # A forward that says what it computes (a Sequential's chain of entries: nn/layers.py _Chain) is keyed by it
        what = owner.trace_key() if callable(getattr(owner, "trace_key", None)) else type(owner).__name__
        key = (what, tuple((p.shape, p.dtype.str) for p in stage.params), x.shape, x.dtype.str, last)
        if key in cache and not last:
            stats, shape, dtype = cache[key]
            out_stats.append(stats)
            x = np.zeros(shape, dtype)
            continue

        def run(mark, stage=stage, x=x, first=(i == 0), last=last):
            inp = Tensor(x, requires_grad=not first and np.dtype(x.dtype).kind == "f")
            # Regression (fixed): stages were called with the activation alone, so a SideForward stage (every
            # BERT layer reads the attention mask) raised and BERT/SimCSE were planned as "streaming not possible".
            out = run_stage(stage, inp, side)
            mark()
            if last:
                loss_fn(out, targets).backward()
            elif out.requires_grad:
                out.backward(np.ones(out.shape, out.dtype))
            return np.zeros(out.shape, out.dtype), out.data.nbytes

        with values_for_tracing(stage.params):
            stats, nxt = _trace(run, list(stage.params), model, loss_fn)
        stats.output_key = (nxt.shape, nxt.dtype.str)
        cache[key] = (stats, nxt.shape, nxt.dtype)
        out_stats.append(stats)
        x = nxt
    return out_stats, side_bytes


def _side_inputs(model: Module, stages: list, batch: np.ndarray) -> tuple[np.ndarray | None, dict | None, int]:
    """stream.stages.stage_inputs for `batch` as the streaming step computes them (under no_grad, first in an
    arena of its own), copied out of that arena for the traces, and the bytes they took in it: what the route's
    step arena holds all step (StreamStepStats.side_input_bytes). (None, None, 0) when no stage reads side inputs."""
    from ..autograd import no_grad
    from ..compile.step_state import restore_rng, rng_states
    from ..memory.arena import Arena
    from ..stream.stages import reads_side, stage_inputs

    if not reads_side(stages):
        return None, None, 0
    rng = rng_states(model)  # a stream_inputs drawing random numbers must not shift the first step's
    try:
        with no_grad(), Arena(name="route estimate side inputs arena") as arena:
            first, side = stage_inputs(model, stages, batch)
            nbytes = arena.stats.bytes_in_use
            # Copies: the arena's blocks go back to its pool when it closes, and the traces read these after.
            first = np.array(first.data)
            side = {key: None if value is None else np.array(value) for key, value in side.items()}
    finally:
        restore_rng(rng)
    return first, side, nbytes


def trace_whole(model: Module, loss_fn: Callable, inputs: np.ndarray, targets: Any) -> TracedStage:
    """The whole step traced once (models without stages)."""
    ensure_training(model)  # as a step trains (Trainer.plan puts every module's mode back after: nn/modes.py)

    def run(mark):
        out = model(Tensor(np.zeros(inputs.shape, inputs.dtype)))
        mark()
        loss = loss_fn(out, targets)
        del out  # as in the fused trace, the outputs die once the loss no longer needs them
        loss.backward()
        return None, 0

    params = list(model.parameters())
    with values_for_tracing(params):  # a model that cannot stream is planned for routes that hold it whole
        return _trace(run, params, model, loss_fn)[0]


@contextlib.contextmanager
def values_for_tracing(params) -> Iterator[None]:
    """Zeros in place of the deferred parameters among `params` (built under nn.deferred_init(): no values yet),
    or of those on disk (a streaming route's), while a trace runs, then the placeholders again. The traced buffers depend on shapes and dtypes alone, so
    zeros trace what the values would, without drawing them; trace_stages passes one stage at a time, so at most
    one stage's worth is allocated (np.zeros' pages, only read, mostly stay the kernel's shared zero page)."""
    from ..stream.on_disk import _ON_DISK

    # And those a streaming route holds on disk (a placeholder array in memory): a larger batch on that route is
    # planned against memory_limit like one on eager or fused (trainer_step.route_step).
    deferred = [p for p in params if p.is_deferred or p._arena is _ON_DISK]
    saved = [(p, p._data, p._arena) for p in deferred]
    try:
        for p in deferred:
            # Private slots, as the streaming route's attach: the public setter would forget the record.
            p._data, p._arena = np.zeros(p.shape, p.dtype), None
        yield
    finally:
        for p, data, record in saved:
            p._data, p._arena = data, record


def _backward_peak(traced: list[TracedStage], peak: str) -> int:
    """Most bytes alive during some stage's backward: the forward buffers of stages 0..i and stage i's
    backward extra (its `peak` less its forward's). The gradient arriving at stage i's output is not
    added: the stage's trace holds its output through its backward (trace_stages), and in the whole
    step that output, the next stage's input, is dead by then (the next stage's backward was its last
    reader), so the output's bytes stand in for its gradient's. Counting both put a depth-2 ViT's
    estimate 7.5% over its real slab (tests/test_memory_reports.py)."""
    kept = best = 0
    for stage in traced:
        kept += stage.forward_live
        best = max(best, kept + getattr(stage, peak) - stage.forward_live)
    return best


def _load_mlp_recompute_kernels(model: Module) -> None:
    """Compile (or load from Numba's cache) the kernels MLPs recomputing GELU run, before the process is measured,
    for a model whose MLPs keep it: a plan that does not fit fused traces them after that measurement
    (_lean_fused_activations). Done whatever the routes asked, so plans for any routes measure the same process.
    Compiled there instead, in a fresh install, they took a vit-tiny run in a cgroup 3.75% over its plan's need
    (tests/test_streaming_rss_under_cgroup.py's cold run). Kernel call counts are left as they were."""
    from ..kernels import calls_unchanged, kernel
    from ..nn.transformer import keeping_mlp_activations

    # Each GELU form is a kernel of its own (kernels/gelu.py): the forms the MLPs use, not "none" alone.
    forms = {(np.dtype(m.fc1.weight.dtype), m.approximate) for m in keeping_mlp_activations(model)}
    with calls_unchanged():
        for dtype, approximate in forms:
            one = lambda: np.zeros((1, 1), dtype)  # noqa: E731
            kernel("bias_gelu_forward")(one(), np.zeros(1, dtype), one(), one(), approximate)
            kernel("bias_gelu_backward_recompute")(one(), one(), one(), np.zeros(1, dtype), one(), approximate)
            kernel("bias_gelu_backward")(one(), one(), one(), np.zeros(1, dtype), approximate)  # fc2's weight frozen


def _lean_fused_activations(model: Module, loss_fn: Callable, x: np.ndarray, y: Any, by_stage: bool) -> int | None:
    """The fused route's activation bytes with every FeedForward recomputing GELU in backward, traced as the
    default's were (stage by stage, or the whole step); None when the model has no FeedForward keeping it. The
    modules are switched for the trace only."""
    from ..nn.transformer import keeping_mlp_activations

    switched = keeping_mlp_activations(model)
    if not switched:
        return None
    for m in switched:
        m.recompute_activation = True
    try:
        if by_stage:
            traced, _, _ = _stage_traces(model, loss_fn, x, y)
            return _backward_peak(traced, "slab")
        return trace_whole(model, loss_fn, x, y).slab
    finally:
        for m in switched:
            m.recompute_activation = False


def _return_tracing_memory() -> None:
    """Give what the traces freed back to the operating system before the process's share is measured: their
    buffers (heap arrays that glibc keeps resident once freed) and the side inputs' pool blocks. Left in, they
    were counted in "+ process, not params" though no route reuses them as such: each route's activations are
    a part of their own (simcse's plan was 20 MiB over its fused run once its job returned the same memory)."""
    from ..memory.pool import default_pool, return_freed_memory

    default_pool().trim()
    return_freed_memory()


def _stage_traces(model: Module, loss_fn: Callable, x: np.ndarray, y: Any) -> tuple[list[TracedStage] | None, int,
                                                                                     str | None]:
    """The model's stages traced one by one and their side inputs' bytes (trace_stages), or (None, 0, why the
    model cannot stream): then no route streams it, and the caller traces the whole step (a route that never
    streams must still be planned)."""
    from ..stream.stages import StreamingUnsupportedError

    if not callable(getattr(model, "stream_stages", None)):
        return None, 0, (f"{type(model).__name__} has no stream_stages() to cut it into blocks "
                         f"(see tensorarena/stream/stages.py)")
    try:
        traced, side_bytes = trace_stages(model, loss_fn, x, y)
    except StreamingUnsupportedError as exc:  # model_stages or stage_inputs refused, before anything was traced
        return None, 0, str(exc)
    return traced, side_bytes, None
