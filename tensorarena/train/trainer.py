"""The training loop's one step, run inside its own step arena.

Every step opens a fresh `Arena`, does forward, loss, backward, clipping, the
optimizer update and the schedule inside it, and closes it in `finally`
(the `with` block) before any error is handled. Closing hands the step's blocks
back to the pool, so the next step reuses them and memory stays flat — also
when the caller wraps the whole loop in an outer arena that is never reset,
which is exactly the leak DESIGN.md was written about.

The routes' steps live beside it: eager_step.py (with its micro-batches), compile/step.py (fused),
trainer_streaming.py; the route choice before step 1 is trainer_route_choice.py's.
trainer_step.py holds the step's frame (states put back on failure, route dispatch, OOM switch) and the fused step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..memory.arena import Arena
from ..memory.budget import resolve_budget
from ..memory.pool import BlockPool
from ..nn.module import Module
from ..optim.optimizer import Optimizer, check_trains_the_model
from ..precision import float32_matmul_precision, get_float32_matmul_precision
from ..precision import normalize as normalize_precision
from ..tensor import Tensor
from .eager_step import eager_step
from .report import StepReport, StoreDirError, check_scheduler, check_step_options
from .micro_batch_choice import check_auto_micro_batch
from .trainer_route_choice import check_the_limit, choose_route, planned_for, recompute_mlp_if_planned
from .trainer_step import _rows, compile_fused, fused_step, route_step, run_step
from .trainer_streaming import warn_of_a_kept_run

ROUTES = ("eager", "fused", "streaming", "auto")
log = logging.getLogger("tensorarena")
LossFn = Callable[[Tensor, Any], Tensor]


def _absolute(path):
    """`path` made absolute, of the type given (a str stays a str, a Path a Path)."""
    absolute = os.path.abspath(path)
    return Path(absolute) if isinstance(path, Path) else absolute


def _check_store_dir(store_dir) -> None:
    """Create `store_dir` and prove it writable now; a clear error instead of a failed fallback later."""
    from pathlib import Path

    from ..stream.store import ensure_writable_dir

    where = Path(store_dir)
    if where.exists() and not where.is_dir():  # mkdir would say "File exists", which names no mistake
        raise StoreDirError(f"store_dir {store_dir} is a file, not a directory: pass a directory (new or "
                            f"existing) for the streaming store")
    try:
        ensure_writable_dir(where)
    except OSError as exc:
        raise StoreDirError(f"store_dir {store_dir} cannot be used for the streaming store: {exc.strerror or exc}. "
                            f"Pass a writable directory on a disk with room for the parameters and optimizer "
                            f"state") from exc


class Trainer:
    """Runs training steps of `model` with `optimizer`, one arena per step.

    Args:
        model: the module to train; called as model(inputs).
        optimizer: updates model's parameters.
        loss_fn: loss_fn(outputs, targets) -> scalar Tensor.
        scheduler: optional LR scheduler, stepped after each applied update.
        clip_grad_norm: if set, global-norm gradient clipping to this value.
        route: "eager" (the define-by-run tape) or "fused" (the step traced once per batch signature
            into a static slab plan and replayed without allocating; see compile/step.py).
        fallback_to_eager: with route="fused" (or "auto"), a step the tracer cannot handle (UnsupportedOpError,
            e.g. a dict batch) runs on the eager route instead of raising; the reason is logged once and kept in
            `fallback_reason`. Off by default: a silent change of route would hide a memory change.
        max_plans: how many fused plans (one per input shape/dtype signature) to keep, least
            recently used evicted first.
        update_in_backward: fused route only. None (default): update each parameter inside backward
            as soon as its gradient is complete, so no parameter-sized gradient buffer exists and
            `p.grad` stays None after a step, unless clip_grad_norm is set (clipping needs every
            gradient first): then flat gradients and one update kernel per group after backward.
            False asks for the flat gradients always; True with clip_grad_norm or micro_batch is an error.
            See compile/step.py.
        micro_batch: rows per forward/backward pass (None, default: the whole batch in one). A batch of more
            rows is cut into micro-batches of this many (the last may be smaller), whose gradients are summed,
            each weighted by its share of the batch's rows, before one update, clipping and schedule step; the
            report's loss is the same weighted mean. For a loss that averages over rows this is the whole
            batch's step, holding one micro-batch's activations at a time (fused: plus one gradient-sized
            buffer, its plan traced at the micro-batch's rows; streaming: each loaded stage runs every
            micro-batch before its update, so the store is read as often as without, stream/sweep.py). Dropout
            masks are drawn micro-batch by micro-batch (eager, fused) or stage by stage (streaming), so with
            dropout the routes draw different masks. See compile/micro_batches.py.
            "auto": the whole batch in one pass if it fits the memory budget, else the most rows per pass
            that fit, found before step 1 by planning halved micro-batches (B/2, B/4, ..., 1 rows, rounded up;
            train/micro_batch_choice.py) and logged. It needs a plan: route="auto" or a memory_limit. As any
            micro-batching, for a loss that averages over rows; BatchNorm's statistics become each micro-batch's.
        on_nonfinite: "raise" (default) raises NonFiniteLossError naming the step before
            any update; "skip" leaves parameters untouched and reports the step as skipped.
        pool: block pool for step arenas (default: the process-wide pool).
        memory_limit: the memory budget ("2G", bytes); default: the smaller of the cgroup limit and
            the RAM available, minus a margin (`budget.source` says which). route="auto" picks by it.
        A model built under nn.deferred_init() (no values yet) is made where the route keeps it: stage by
            stage straight into the store when streaming, in memory for eager and fused (at once; route="auto"
            once its plan, made from shapes, has chosen).
        route="streaming" keeps parameters and optimizer state in files under `store_dir` (kept; by
            default a new temporary directory, removed when the trainer's route goes: call
            trainer.stream.to_memory() or save a checkpoint first) and trains stage by stage (stream/route.py);
            route="auto" estimates every route before step 1 (`route_plan`, train/route_plan.py)
            and takes fused if it fits the budget, else streaming.
        oom_fallback: when an eager or fused step runs out of memory (MemoryError, ArenaOutOfMemory),
            move the whole training state into the streaming store, redo that step there and go
            on (logged once, recorded in `route_switches`). A model without stream_stages() re-raises.
        stream_io: how the streaming route brings a stage's files into memory: "map" (default,
            memory-mapped) or "copy" (read into and written from two slot buffers); stream/store.py
            compares them.
        matmul_precision: "float32" or "bfloat16" (torch's "highest" / "medium"): whether float32 matrix
            products round their inputs to bfloat16 (float32 accumulation) in this trainer's steps,
            plans and evaluation, on every route. Default: the thread's setting when the trainer is
            built (tensorarena.set_float32_matmul_precision; "float32" unless changed). See precision.py.
        fused_replay: fused route only. "captured" records the step's calls once per plan, checks the
            recording against the Python replay on two batches, and from then on replays only those calls
            (no model forward, autograd or op dispatch in Python); a plan whose recording fails a check
            keeps the Python replay, with the reason logged. "python" re-runs the model's ops on the plan's
            buffers each step, which also follows a forward that branches on the data's values. "auto"
            (default): captured when the model's modules and the loss function are all tensorarena's,
            python when any is the user's. See compile/captured.py.
    """

    def __init__(self, model: Module, optimizer: Optimizer, loss_fn: LossFn, *, scheduler=None,
                 clip_grad_norm: float | None = None, route: str = "eager", on_nonfinite: str = "raise",
                 pool: BlockPool | None = None, fallback_to_eager: bool = False, max_plans: int = 4,
                 memory_limit: str | int | None = None, store_dir=None, oom_fallback: bool = True,
                 update_in_backward: bool | None = None, stream_io: str = "map",
                 matmul_precision: str | None = None, fused_replay: str = "auto",
                 micro_batch: int | str | None = None) -> None:
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        from ..compile.micro_batches import check_micro_batch, check_model_splits

        micro_batch = check_micro_batch(micro_batch, auto=True)
        # "auto" starts as the whole batch; the route choice before step 1 may cut it (micro_batch_choice.py)
        self._micro_batch_auto = micro_batch == "auto"
        self._micro_batch = None if self._micro_batch_auto else micro_batch
        if self._micro_batch_auto:
            check_auto_micro_batch(route, memory_limit, update_in_backward)
        check_model_splits(model, self._micro_batch)
        from ..compile.replay_choice import REPLAYS

        if fused_replay not in REPLAYS:
            raise ValueError(f"fused_replay must be one of {REPLAYS}, got {fused_replay!r}")
        self.fused_replay = fused_replay
        check_step_options(clip_grad_norm, on_nonfinite)
        from ..compile.step import resolve_update_in_backward

        # Resolved (and checked) now, not at the first fused step; asked kept for a later clip_grad_norm change.
        self._update_in_backward_asked = update_in_backward
        self.update_in_backward = resolve_update_in_backward(update_in_backward, clip_grad_norm, self.micro_batch)
        self._matmul_precision = (normalize_precision(matmul_precision) if matmul_precision is not None
                                  else get_float32_matmul_precision())
        check_trains_the_model(model, optimizer)
        check_scheduler(scheduler, optimizer)
        self.model = model
        self._optimizer = optimizer
        self.loss_fn = loss_fn
        self._clip_grad_norm = clip_grad_norm
        self._scheduler = scheduler
        self.route = route
        self.on_nonfinite = on_nonfinite
        from ..stream.store_io import IO_MODES

        if stream_io not in IO_MODES:
            raise ValueError(f"stream_io must be one of {IO_MODES}, got {stream_io!r}")
        self.stream_io = stream_io
        self.pool = pool
        self._step_count = 0  # applied or skipped steps so far, off the streaming route (see step_count)
        self.fallback_to_eager = fallback_to_eager
        self.fallback_reason: str | None = None
        self.max_plans = max_plans
        self.fused = None  # the FusedStep, built at the first fused step (it needs a batch to trace)
        self.budget = resolve_budget(memory_limit)
        # Absolute, as the store keeps it: a relative one would name another directory after os.chdir().
        self.store_dir = None if store_dir is None else _absolute(store_dir)
        if store_dir is not None:
            _check_store_dir(self.store_dir)  # before step 1, not when a fallback needs it mid-run
        self.oom_fallback = oom_fallback
        if oom_fallback and route in ("eager", "fused"):  # its store_dir only serves the fallback
            warn_of_a_kept_run(self.store_dir)  # which refuses to overwrite it: said now, not only mid-run
        self.route_plan = None  # RoutePlan from plan(): every route's estimate and the choice
        self._route_plan_batch = None  # (batch signature, routes) route_plan was made for
        self._limit_to_check = memory_limit is not None  # a limit the user set is checked on any route, once
        self._limit_rows: int | None = None  # the rows the route was planned for (a larger batch is planned again)
        self.stream = None  # the StreamingRoute once training streams
        self._temporary_store = None  # removes a temporary store_dir (weakref.finalize, trainer_streaming.py)
        self.route_switches: list[dict] = []  # out-of-memory fallbacks: step, from, to, error
        self._generators = None  # the RNGs a step draws from, snapshot per step for the fallback
        self._buffer_slots = None  # the model's buffers (compile.step.buffer_slots), found with the generators
        self._busy = threading.Lock()  # held by step/save/load/evaluate (_one_at_a_time)
        self._train_rows: int | None = None  # the last training batch's rows: evaluate's default batch size
        self._busy_with: str | None = None
        # A checkpoint load()ed into a deferred model on route "auto" before step 1, checked and waiting for the
        # route choice: loading it then puts it where the route keeps the model (the store, when streaming).
        # With the identity of the file checked (checkpoint.path_identity): a file replaced since is refused.
        self._pending_checkpoint: tuple[Path, tuple[int, int, int, int] | None] | None = None
        self._take_deferred(model)

    def _take_deferred(self, model: Module) -> None:
        """A model built under nn.deferred_init() holds no values yet. Streaming makes them stage by stage into its
        store; eager and fused hold the model whole, so for those routes they are made in memory now. route="auto"
        decides at its first step, from the plan (which needs shapes only: route_traces.values_for_tracing)."""
        from ..nn.deferred import has_deferred, name_deferred

        if not has_deferred(model):
            return
        name_deferred(model)  # errors about them name them
        if self.route in ("eager", "fused"):
            self._materialize(f"route {self.route!r} holds it whole")
        elif self.route == "auto" and not callable(getattr(model, "stream_stages", None)):
            self._materialize(f"{type(model).__name__} has no stream_stages(), so only fused or eager can train it, "
                              f"and both hold it whole")

    def _materialize(self, why: str) -> None:
        """Make a deferred model's values in memory, saying so (the memory is the route's to hold)."""
        from ..memory.meter import format_bytes
        from ..nn.deferred import deferred_bytes, has_deferred

        if not has_deferred(self.model):
            return
        log.info("the model was built under nn.deferred_init(): making its %s of parameters in memory (%s)",
                 format_bytes(deferred_bytes(self.model.parameters())), why)
        self.model.materialize()

    @property
    def step_count(self) -> int:
        """Applied or skipped steps so far. Once training streams, the route's own count: a step whose commit failed
        counts from when its commit is taken, which may be outside a step (route.retry_commit(), a save, evaluate)."""
        return self.stream.step_count if self.stream is not None else self._step_count

    @step_count.setter
    def step_count(self, value: int) -> None:
        self._step_count = value

    # -- options a user may change between steps, as in a hand-written PyTorch loop ------
    @property
    def micro_batch(self) -> int | None:
        """Rows per forward/backward pass (None: the whole batch), fixed when the Trainer is built, or for
        micro_batch="auto" at the route choice before step 1: the fused plans are traced for it and its route
        choice counted on it."""
        return self._micro_batch

    @property
    def clip_grad_norm(self) -> float | None:
        return self._clip_grad_norm

    @clip_grad_norm.setter
    def clip_grad_norm(self, value: float | None) -> None:
        """Takes effect at the next step on every route. Switching clipping on or off changes where the fused
        step updates (flat gradients or inside backward, see compile/step.py), so its step is built again."""
        from ..compile.step import resolve_update_in_backward

        check_step_options(value, self.on_nonfinite)
        # ValueError if it cannot
        in_backward = resolve_update_in_backward(self._update_in_backward_asked, value, self.micro_batch)
        self._clip_grad_norm = value
        if in_backward != self.update_in_backward:
            self.update_in_backward = in_backward
            if self.fused is not None:
                log.info("clip_grad_norm %s: the fused step is built again with %s", value,
                         "updates inside backward" if in_backward else "flat gradients")
                self.fused = None  # the parameters are views of its flat buffers: the new one copies them over
        if self.fused is not None:
            self.fused.clip_grad_norm = value
        if self.stream is not None:
            self.stream.clip_grad_norm = value

    @property
    def matmul_precision(self) -> str:
        return self._matmul_precision

    @matmul_precision.setter
    def matmul_precision(self, value: str) -> None:
        """Takes effect at the next step on every route: eager and streaming read it each step, the fused step
        traces (or finds) a plan under it. An unknown name is a ValueError now, not at the next step."""
        self._matmul_precision = normalize_precision(value)
        if self.fused is not None:
            self.fused.matmul_precision = self._matmul_precision

    @property
    def optimizer(self):
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value) -> None:
        """Another optimizer from the next step on, as a PyTorch loop that switches (Adam, then SGD): the eager step
        reads it each step; the fused step, whose flat buffers hold the old one's state, is built again for it (the
        fused route kept stepping the old optimizer, unsaid). The streaming route keeps the optimizer's state in its
        store, laid out for the one it started with: refused there."""
        if value is self._optimizer:
            return
        check_trains_the_model(self.model, value)
        if self.stream is not None:
            raise RuntimeError("the streaming route keeps its optimizer's state in its store, laid out for the "
                               f"{type(self._optimizer).__name__} it started with, so trainer.optimizer cannot be "
                               "replaced while it streams; change the optimizer's param_groups (lr, weight_decay, ...) "
                               "instead, or bring the model back (trainer.stream.to_memory()) and build a new Trainer")
        self._optimizer = value
        if self.fused is not None:
            log.info("a new optimizer (%s): the fused step is built again for it", type(value).__name__)
            self.fused = None  # the parameters are views of its flat buffers: the new one copies them over
        self._route_plan_batch = None  # a route plan counted the old optimizer's state

    @property
    def loss_fn(self) -> LossFn:
        return self._loss_fn

    @loss_fn.setter
    def loss_fn(self, value: LossFn) -> None:
        """A new loss from the next step on, on every route (as a PyTorch loop that calls another function): the
        fused step drops the plans traced with the old one, the streaming route calls the new one."""
        if not callable(value):
            raise TypeError(f"loss_fn must be callable as loss_fn(outputs, targets), got {type(value).__name__}")
        self._loss_fn = value
        for route in (getattr(self, "fused", None), getattr(self, "stream", None)):
            if route is not None:
                route.loss_fn = value
        self._route_plan_batch = None  # a route plan traced with the old loss is not this step's

    @property
    def scheduler(self):
        return self._scheduler

    @scheduler.setter
    def scheduler(self, value) -> None:
        """A new schedule (or None) steps from the next step on, on every route."""
        check_scheduler(value, self._optimizer)
        self._scheduler = value
        for route in (self.fused, self.stream):
            if route is not None:
                route.scheduler = value

    # -- routes (the plan and the choice before step 1: trainer_route_choice.py) -------
    def plan(self, inputs: Any, targets: Any, routes: tuple[str, ...] = ("fused", "streaming"), *,
             data_bytes: int | None = None):
        """Estimate the routes for this batch against the budget (before step 1); returns the RoutePlan.

        `data_bytes`: the bytes of the data the caller holds for the run (its train and held-out arrays), a part
        of every route (route_plan.TRAINING_DATA) rather than of the measured process share. Kept as
        `self.data_bytes` (which a caller may also set) for the plans the Trainer makes itself before step 1."""
        from .trainer_route_choice import plan

        return plan(self, inputs, targets, routes, data_bytes)

    def _planned_for(self, inputs: Any, targets: Any, routes: tuple[str, ...]):
        return planned_for(self, inputs, targets, routes)

    def _choose_route(self, inputs: Any, targets: Any) -> None:
        return choose_route(self, inputs, targets)

    def _check_the_limit(self, inputs: Any, targets: Any) -> None:
        return check_the_limit(self, inputs, targets)

    def _recompute_mlp_if_planned(self, plan) -> None:
        return recompute_mlp_if_planned(self, plan)

    def _start_streaming(self, *, redo_after_oom: bool = False, for_checkpoint: bool = False) -> None:
        """Move the training state into the streaming store and make it this trainer's route."""
        from .trainer_streaming import start_streaming

        start_streaming(self, redo_after_oom=redo_after_oom, for_checkpoint=for_checkpoint)

    def compile(self, inputs: Any, targets: Any):
        """Trace the fused step for this batch signature now (before step 1); returns the FusedStep.

        Its `memory_report()` is the step's memory, known before any update. With micro_batch, the plan traced is
        the batch's first micro-batch's (what every step of that batch replays).
        """
        return compile_fused(self, inputs, targets)

    def step(self, inputs: Any, targets: Any) -> StepReport:
        """One training step on a batch; returns its report. One step at a time: a second thread calling it
        while a step runs gets a RuntimeError (the model, its flat buffers and slab are shared, unguarded).

        Ctrl-C during a step (main thread) is held until the step completes, then raised as KeyboardInterrupt:
        the step is applied whole (step_count counts it) though its report is not returned. A second Ctrl-C
        stops the step at once with StepAbandoned (a KeyboardInterrupt), saying what it left. See interrupt.py.

        The step trains: a model in eval mode is put in train mode (model.train()), while a model in train mode
        keeps each submodule's own mode (a part the user put in eval mode, a frozen backbone's dropout, stays so;
        nn/modes.py). On the fused route a change of any module's mode traces the step in the new modes."""
        from .interrupt import SigintDeferred, abandoned_step_message

        # A trainer.optimizer replaced since the scheduler was set: refused before the step changes anything. One
        # identity test a step (the full check, with its import and messages, only when it fails).
        if getattr(self._scheduler, "optimizer", None) not in (None, self._optimizer):
            check_scheduler(self._scheduler, self._optimizer)
        index = self.step_count + 1
        # Outermost, so that the lock of _one_at_a_time is taken and given back with Ctrl-C held too.
        with SigintDeferred("the training step", lambda: abandoned_step_message(index, self.route)), \
                self._one_at_a_time("step"), float32_matmul_precision(self.matmul_precision):
            report = self._step(inputs, targets)
            self._train_rows = _rows(inputs)
            return report

    @contextlib.contextmanager
    def _one_at_a_time(self, what: str):
        """Refuse, at once and clearly, a step/save/load while another thread is inside one. Two threads
        stepping one Trainer raised nothing before: steps were lost, step numbers repeated and, fused, both
        wrote into one slab (tests/test_threads_hunt.py)."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"Trainer.{what}() called in thread {threading.current_thread().name!r} while "
                               f"{self._busy_with} runs in another thread: a Trainer is not thread-safe. Give each "
                               f"thread its own model and Trainer, or take turns with a lock of your own")
        self._busy_with = f"Trainer.{what}() in thread {threading.current_thread().name!r}"
        try:
            yield
        finally:
            self._busy_with = None
            self._busy.release()

    def _step(self, inputs: Any, targets: Any) -> StepReport:
        return run_step(self, inputs, targets)

    def _route_step(self, inputs: Any, targets: Any, before) -> StepReport:
        """The step on the current route; an out-of-memory eager or fused step moves to streaming and is redone."""
        return route_step(self, inputs, targets, before)

    def _eager_step(self, inputs: Any, targets: Any) -> StepReport:
        return eager_step(self, inputs, targets)

    def _fused_step(self, inputs: Any, targets: Any) -> StepReport | None:
        """A replayed fused step, or None after switching to eager (allowed fallback only)."""
        return fused_step(self, inputs, targets)

    def evaluate(self, inputs: np.ndarray, targets: Any, *, batch_size: int | None = None) -> dict:
        """Mean loss on held-out data in eval mode, without building a graph, batch by batch: {"loss",
        "accuracy"}. "accuracy" (argmax of the outputs) is there for class-index targets, one integer label
        per output row of two or more class scores; for other targets (regression, hidden states, a structure such
        as (labels, weights)), a single logit or an output that is no one tensor ((logits, aux)) it is None.
        Targets may be what step() takes: an array, or a tuple, list or dict of arrays, each sliced
        by rows. The loss is each batch's loss weighted by its rows (the mean over rows for a mean-reduced loss), or,
        for tensorarena's class-index losses, by its counted targets (ignore_index, class weights: the whole data's
        loss whatever batch_size; compile/loss_shares.py), whose accuracy leaves ignored labels out.
        Every module's train/eval mode is put back as it was, also on an error. Once a fused step is traced, each
        batch's forward runs in its slab (scratch_arena): at up to the training batch size it needs no memory
        beyond the route plan's; a larger batch_size takes pool blocks beyond it, with one warning. batch_size
        defaults to the last training batch's rows (1024 before any step), or micro_batch if that is smaller (the
        slab is a micro-batch's). Not while another thread steps, saves or loads this trainer (RuntimeError): the
        slab it borrows is the step's."""
        from .evaluate import evaluate

        with self._one_at_a_time("evaluate"):
            return evaluate(self, inputs, targets, self._eval_batch_size(batch_size))

    def _eval_batch_size(self, batch_size: int | None) -> int:
        """evaluate's and predict's batch_size: as given, else the last training batch's rows (1024 before any
        step), or micro_batch if that is smaller (the fused slab is a micro-batch's)."""
        if isinstance(batch_size, np.integer):  # a size computed with NumPy, taken as DataLoader takes it (it was
            batch_size = int(batch_size)         # refused as "must be a positive int, got np.int64(4)")
        if batch_size is None:
            batch_size = self._train_rows or 1024
            if self.micro_batch is not None:
                batch_size = min(batch_size, self.micro_batch)
        return batch_size

    def predict(self, inputs, *, batch_size: int | None = None) -> np.ndarray:
        """The model's outputs for `inputs` (an array, a Tensor or a dict of arrays, as step() takes), in eval mode
        (dropout off) without a graph, batch by batch: one NumPy array of one output row per input row. On every
        route, memory and modes as evaluate(): a fused trainer's batches run in its slab, a streaming one's stage by
        stage from its store, and each module's mode is put back after. batch_size defaults as evaluate's."""
        from .predict import predict

        with self._one_at_a_time("predict"):
            return predict(self, inputs, self._eval_batch_size(batch_size))

    def scratch_arena(self, name: str, *, warn: bool = True) -> Arena:
        """An arena for work between steps (evaluate, a probe forward). Once a fused step is traced it takes the
        fused slab's memory first (dead between steps; compile/lend.py), so work that fits the slab, a forward
        at the training batch size, adds nothing to the memory the route plan counts; else an ordinary arena."""
        from ..compile.lend import slab_arena

        return slab_arena(self.fused, name=name, pool=self.pool, warn=warn)

    # -- checkpoints -----------------------------------------------------------
    def save(self, path, *, extra: dict | None = None) -> None:
        """Write model, optimizer, schedule, RNG states and step count atomically to `path`.

        The same file on every route; a streaming run writes it stage by stage from its store. Not while
        another thread steps this trainer (a torn checkpoint): that is a RuntimeError. Missing directories are
        created; a path that cannot take the file (a directory, under a file, no permission, a full disk) is an
        OSError naming it, the file there before unchanged and no half file left. `extra` is JSON (str keys;
        NumPy scalars and arrays become numbers and lists): anything else is a TypeError before writing.
        """
        from .trainer_checkpoints import save

        with self._one_at_a_time("save"):
            save(self, path, extra)

    def load(self, path) -> dict:
        """Restore everything `save` wrote (on any route); returns the checkpoint's `extra` dict.

        All or nothing: a file that is not a whole checkpoint, or one of another model (names, shapes),
        optimizer or scheduler class, is a ValueError naming it and what does not match, and the trainer
        keeps its weights, optimizer state, schedule, RNGs and step count.

        On route="streaming" the checkpoint goes into the store stage by stage, never whole into memory. On
        route="auto" before step 1, a model built under nn.deferred_init() (no values yet) gets the file checked
        now (the errors above, nothing changed) and the step count at once; the values, optimizer state, schedule
        and RNGs are loaded at step 1, once the route is chosen, where that route keeps the model (the store when
        it streams), so a run that streamed within a memory limit resumes within it. A save() or evaluate()
        before then loads them first, into the model made whole in memory.
        """
        from .trainer_checkpoints import load

        with self._one_at_a_time("load"):
            return load(self, path)

    def _load_pending_checkpoint(self, why: str) -> None:
        """Load the checkpoint load() left waiting (if any) where the route now keeps the model."""
        from .trainer_checkpoints import load_pending

        load_pending(self, why)

    def _make_whole(self, why: str) -> None:
        """Before step 1: a waiting checkpoint loaded, a deferred model made (trainer_checkpoints.make_whole)."""
        from .trainer_checkpoints import make_whole

        make_whole(self, why)
