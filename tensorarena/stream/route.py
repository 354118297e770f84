"""StreamingRoute: train a model whose parameters and optimizer state live on disk, one stage at a time.

DESIGN.md's third route. The model is cut into stages (`model.stream_stages()`, see stages.py);
the ParamStore keeps every stage's parameters and optimizer state in files. One step:

  forward   stage 0 .. N-2 under no_grad, each loaded from the store just for its forward;
            only the stage-boundary activations are kept (in the step arena), plus the RNG
            state before each stage so its dropout masks can be drawn again
  backward  stage N-1 .. 0: load parameters + optimizer state, recompute the stage's forward
            with grad from its saved input (RNG restored), the last stage also computing the
            loss; backward with the upstream gradient gives the parameter gradients and the
            gradient of the stage's input; apply THAT stage's optimizer update at once and
            write it back
  prefetch  while a stage computes, the store's I/O thread writes the previous stage back
            and brings the next one into the second slot (memory-maps its file by default,
            io="map"; io="copy" reads it into a slot buffer: store.py)

These passes are sweep.py's, and moving the training state into the store and back out (from_memory, resume,
to_memory) is route_moves.py's; this module keeps what lasts between them (the store, the parameters' place,
the step count, commits and failures).
Failed steps and commits and the checks before each use are route_failures.py's, estimate's sums route_estimate.py's.

Memory: two stage-sized slots + one stage of gradients + the largest stage's activations
(in a nested arena closed per stage) + the boundary activations and two gradient buffers per
boundary shape (sweep.py _Sweep._io_grad) + the step's side inputs (a BERT's attention mask, computed once per step
by model.stream_inputs and read by every stage: stages.py). Nothing grows with depth but the boundary
activations (batch x tokens x dim per stage). Every step runs inside its own
`Arena`, closed in `finally` (the `with` block), each stage's work in a nested one. With micro_batch, a stage's
work is one micro-batch's, and one more stage-sized gradient buffer holds their sum (sweep.py).

The update is the eager update: the same functional kernels (optim.adam.adam, optim.sgd.sgd)
with the optimizer's live param_groups (so an LR scheduler works unchanged), and dropout
draws the same masks, so a streamed run follows the eager run step for step.

Global-norm gradient clipping needs every gradient before the first update. With
`clip_grad_norm=` the route runs backward twice: a first sweep computes the gradients only
for their norm (parameters only are read), a second one recomputes them, scales and updates.
That costs one more backward (and recompute) per step; the result equals eager clipping.

Between steps the user may change the optimizer as in a PyTorch loop (add_param_group, momentum or
amsgrad switched on, load_state_dict): each step first brings the store in line (stream/follow.py).
To read or change parameters themselves, to_memory() brings everything back into memory; the next
step (or predict, or a checkpoint) moves it into the store again. A module or parameter replaced between steps
(model.head = nn.Linear(...)) is refused until then: the move back in builds the stages again from the model. A step that fails after updating
some stages leaves the route refusing to go on (the error says so) until a checkpoint is loaded. A step
whose stages were all written but whose manifest commit failed (EIO, EACCES, a read-only remount) is
whole: the route keeps that commit and takes it again first thing at the next step (or retry_commit(),
close(), to_memory()), so the run goes on once the cause is fixed. A directory or stage file removed
under the run is found before a step changes anything (store.lost_files); to_memory() then saves the state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..autograd import no_grad
from ..compile.micro_batches import check_micro_batch, check_model_splits
from ..memory.arena import Arena
from ..memory.pool import BlockPool, aligned_bytes
from ..nn.modes import ensure_training, kept_modes
from ..nn.module import Module
from ..optim.optimizer import Optimizer
from ..tensor import Tensor
from ..train.report import check_step_options
from . import optim_state, route_estimate, route_failures, route_moves
from .arena_pages import SmallPagePool, block_sizes
from ..compile.step_state import rng_generators
from .follow import follow_user_changes
from .generator_states import share_unchanged
from .stages import Stage, model_stages, run_stage, stage_inputs
from .store import ArraySpec, ParamStore, StageSpec, StoreError, StoreSpec
from .sweep import _as_tensor, _Loads, run_step

LossFn = Callable[[Tensor, Any], Tensor]
log = logging.getLogger("tensorarena")
STARTS = ("auto", "memory", "resume")


@dataclass(frozen=True)
class StreamStepStats:
    """What one streamed step did: loss, time, memory and bytes moved."""

    step: int
    loss: float
    skipped: bool
    grad_norm: float | None
    lr: float
    seconds: float
    arena_high_water: int  # step arena + the largest stage arena: the step's transient peak
    step_arena_high_water: int  # boundary activations and their gradients
    stage_arena_high_water: int  # the largest stage's recompute + backward
    bytes_read: int
    bytes_written: int
    resident_bytes: int  # store slots + gradient buffer (independent of depth)
    # Stage 0's input and the side inputs (model.stream_inputs: a BERT's mask) in the step arena, held all step and
    # part of step_arena_high_water; 0 for a model none of whose stages reads side inputs.
    side_input_bytes: int = 0


class StreamingRoute:
    """Trains `model` with `optimizer` from a store on disk; see the module docstring.

    Args:
        model: a Module with `stream_stages()` (e.g. ViT).
        optimizer: SGD, Adam or AdamW over the model's parameters.
        loss_fn: loss_fn(outputs, targets) -> scalar Tensor.
        store_dir: directory of the ParamStore (created; must be writable).
        scheduler: optional LR scheduler, stepped after each applied update (as Trainer does).
        clip_grad_norm: global-norm clipping, done in two backward sweeps (see module docstring).
        on_nonfinite: "raise" (NonFiniteLossError, nothing updated) or "skip" (step counted, no update).
        start: "memory" writes the in-memory state into a new store (see from_memory), "resume"
            continues the store's run (see resume), "auto" resumes when store_dir holds a run.
        step: with start="memory", the number of steps already taken (recorded in the store).
        overwrite: with start="memory", replace a store already in store_dir instead of refusing.
        release: free the in-memory parameter and optimizer-state arrays once they are in the
            store (the point of streaming); False keeps them allocated, unused, and to_memory()
            refills the same arrays.
        durable: fsync at every commit point, so even a power loss leaves a detectable state.
        io: how stages get into memory: "map" (default: the stage files are memory-mapped, nothing is
            copied) or "copy" (read into and written from two slot buffers); see stream/store.py.
        pool: block pool for the step arenas (default: one of the route's own, whose blocks never take 2 MiB
            pages, so that the route plan's "arena pages" count what they hold: stream/arena_pages.py).
        micro_batch: rows per forward/backward pass (None: the whole batch). Each loaded stage runs every
            micro-batch in turn and is updated once from their weighted sum, so the store is read no more often;
            the step holds one micro-batch's activations in a stage, the boundaries stay the whole batch's
            (sweep.py; what is computed: compile/micro_batches.py).
    """

    def __init__(self, model: Module, optimizer: Optimizer, loss_fn: LossFn, store_dir: str | Path, *,
                 scheduler=None, clip_grad_norm: float | None = None, on_nonfinite: str = "raise",
                 start: str = "auto", step: int = 0, overwrite: bool = False, release: bool = True,
                 durable: bool = False, io: str = "map", pool: BlockPool | None = None,
                 micro_batch: int | None = None) -> None:
        if start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {start!r}")
        check_step_options(clip_grad_norm, on_nonfinite)
        self.micro_batch = check_micro_batch(micro_batch)
        check_model_splits(model, self.micro_batch)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int (steps already taken), got {step!r}")
        self.model, self.optimizer, self.loss_fn, self.scheduler = model, optimizer, loss_fn, scheduler
        self.clip_grad_norm = clip_grad_norm
        self.on_nonfinite = on_nonfinite
        self.release = release
        self.pool = pool
        # The arenas' blocks: the pool given, else one of the route's own (released with the route).
        self._arena_pool = pool if pool is not None else SmallPagePool()
        self._step_block, self._stage_block = block_sizes(self._arena_pool)
        self._store_options = {"durable": durable, "io": io}  # to open the store again after to_memory()
        self._in_memory = False  # to_memory() ran: the next step moves the state back into the store
        self._outside_warned = 0
        self.kinds = optim_state.state_kinds(optimizer)
        self.stages: list[Stage] = model_stages(model)
        self._index_params(model, optimizer)
        self.step_count = 0
        self.last_stats: StreamStepStats | None = None
        self._broken: str | None = None
        self._gens: list = []
        self._last_rng: list | None = None  # a step's previous generator snapshot (_rng_snapshot)
        # (step, manifest fields) of a step that ran to its end but whose commit failed (see retry_commit).
        self._pending_commit: tuple[int, dict[str, Any]] | None = None
        self._kept: dict[int, np.ndarray] = {}
        self._kept_state: dict[int, dict] = {}
        # The optimizer.state the store follows: load_state_dict makes a new one (stream/follow.py)
        self._state_seen = optimizer.state
        self.store = ParamStore(store_dir, self._spec(self.kinds), durable=durable, io=io)
        try:
            # Before the state moves in (parameters come first in every layout, so resuming's state kinds do
            # not change it): nothing after the move may fail, or a caller could not tell whether the store
            # now holds the only copy of the parameters.
            self._size_grad_buffers()
            if start == "auto":
                start = "resume" if self.store.has_manifest() else "memory"
            if start == "memory":
                self._move_in(step, overwrite)
            else:
                self._resume()
        except BaseException:
            self.store.close()
            raise

    @classmethod
    def from_memory(cls, model: Module, optimizer: Optimizer, loss_fn: LossFn, store_dir: str | Path, *,
                    scheduler=None, step: int = 0, overwrite: bool = False, **options: Any) -> "StreamingRoute":
        """Move the in-memory training state (parameters, optimizer state, step count, schedule, RNG) into a new store."""
        return cls(model, optimizer, loss_fn, store_dir, scheduler=scheduler, start="memory", step=step,
                   overwrite=overwrite, **options)

    @classmethod
    def resume(cls, model: Module, optimizer: Optimizer, loss_fn: LossFn, store_dir: str | Path, *,
               scheduler=None, **options: Any) -> "StreamingRoute":
        """Continue the run in `store_dir`: restores step count, hyperparameters, schedule and RNG into the objects."""
        return cls(model, optimizer, loss_fn, store_dir, scheduler=scheduler, start="resume", **options)

    @staticmethod
    def estimate(model: Module, optimizer: Optimizer) -> dict[str, Any]:
        """What streaming `model` would hold, before creating anything (for a route planner).

        resident_bytes: the route's buffers between steps (two slots of the largest stage's
        parameters + optimizer state, and its gradients), independent of depth. disk_bytes: the
        store's files. read/written_bytes_per_step: the I/O of one step (clipping reads the
        parameters once more). Activations are not included: they depend on the batch (the largest
        stage's recompute + backward, one boundary activation per stage but the last, and two gradient
        buffers per boundary shape: train/route_plan.py adds them; nor are side inputs, StreamStepStats.
        side_input_bytes). move_in_bytes: what starting from memory holds at its peak: the in-memory parameters and optimizer state (freed only once the store is
        committed, so a failed start loses nothing: in_memory_bytes) and the slot a stage is copied through.
        Parameters built under nn.deferred_init() are not in memory: they are made stage by stage into that
        slot, which needs only the largest one's draw on top (fill_bytes; nn/deferred.py).
        """
        return route_estimate.estimate(model, optimizer)

    # -- setup --------------------------------------------------------------------
    def _index_params(self, model: Module, optimizer: Optimizer) -> None:
        self._index_stages()
        self._group_of: dict[int, int] = {}
        staged = self._staged
        for gi, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if id(p) not in staged:
                    raise ValueError(f"the optimizer updates a parameter of shape {p.shape} that is in no stage of "
                                     f"{type(model).__name__}.stream_stages(); the streaming route cannot update it")
                self._group_of[id(p)] = gi
        self._placeholder = self._placeholders()

    def _index_stages(self) -> None:
        """The stages' parameter names (as model.named_parameters() says them) and id -> parameter of each."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        self._names = [[names.get(id(p), f"{s.name}.{i}") for i, p in enumerate(s.params)] for s in self.stages]
        self._staged = {id(p): p for s in self.stages for p in s.params}

    def _check_stages(self) -> None:
        route_failures.check_stages(self)

    def _placeholders(self) -> dict[int, np.ndarray]:
        """What an offloaded parameter points at: no memory, but its shape and dtype (p.dtype stays true)."""
        return {id(p): np.broadcast_to(np.zeros((), p.dtype), p.shape) for s in self.stages for p in s.params}

    def _spec(self, kinds: optim_state.StateKinds) -> StoreSpec:
        stages = tuple(StageSpec(s.name, tuple(ArraySpec(n, tuple(p.shape), p.dtype.str) for n, p in zip(names, s.params)))
                       for s, names in zip(self.stages, self._names))
        return StoreSpec(stages, kinds.optimizer, kinds.arrays, kinds.scalars)

    def _groups_of_params(self) -> list[list[int]]:
        return [[self._group_of.get(id(p), -1) for p in s.params] for s in self.stages]

    def _move_in(self, step: int, overwrite: bool, *, keep_committed: bool = False) -> None:
        route_moves.move_in(self, step, overwrite, keep_committed=keep_committed)

    def _progress(self, step: int, data_step: int) -> dict[str, Any]:
        return route_moves.progress(self, step, data_step)

    def _resume(self) -> None:
        route_moves.resume(self)

    # -- parameters in and out of the slots ------------------------------------------
    def _detach_param(self, p) -> None:
        route_moves.detach_param(self, p)

    def _attach(self, k: int, slot: int):
        views = self.store.views(slot, k)
        for p, array in zip(self.stages[k].params, views.params):
            p._data, p._arena, p._generation = array, None, 0
        return views

    def _detach(self, k: int) -> None:
        for p in self.stages[k].params:
            self._detach_param(p)

    def _size_grad_buffers(self) -> None:
        """One stage's gradients, reused by every stage; with micro_batch, their sum over the micro-batches too
        (each micro-batch's backward writes its gradients straight into the first, as a whole batch's does, so a
        stage arena holds what the route plan traced: sweep.py)."""
        self._grads = _grad_buffer(self.store)
        self._grad_sums = _grad_buffer(self.store) if self.micro_batch is not None else None

    def _grad_views(self, k: int, buffer: np.ndarray | None = None) -> list[np.ndarray]:
        """Stage k's parameters' gradients over `buffer` (default: the route's gradient buffer)."""
        buffer = self._grads if buffer is None else buffer
        layout = self.store.layouts[k]
        return [buffer[o:o + a.nbytes].view(a.dtype).reshape(a.shape)
                for o, a in zip(layout.param_offsets, layout.stage.params)]

    # -- RNG ------------------------------------------------------------------------
    def _rng_snapshot(self) -> list:
        # States equal to the previous snapshot's are that object: the step keeps one snapshot per stage and
        # micro-batch, and holds only the states that moved (generator_states.share_unchanged).
        self._last_rng = share_unchanged(self._last_rng, [g.bit_generator.state for g in self._gens])
        return self._last_rng

    def _rng_restore(self, snapshot: list) -> None:
        for g, state in zip(self._gens, snapshot):
            g.bit_generator.state = state

    # -- the step -------------------------------------------------------------------
    def step(self, inputs: Any, targets: Any) -> float:
        """One training step on a batch; returns the loss (details in `last_stats`)."""
        self._check_usable()
        start = time.perf_counter()
        index = self.step_count + 1
        read0, written0 = self.store.bytes_read, self.store.bytes_written
        follow_user_changes(self)  # before the step's I/O: a refusal there changes nothing
        ensure_training(self.model)  # a submodule the user put in eval mode stays so (nn/modes.py)
        lr = float(self.optimizer.param_groups[0]["lr"])
        # Every generator a step may draw from (NumPy's global one too): a stage recomputed in backward must draw
        # what its forward drew
        self._gens = rng_generators(self.model)
        self._last_rng = None  # the step's previous snapshot (_rng_snapshot)
        self._writes = 0
        self.store.changed = 0
        self._committing = False
        arena = Arena(pool=self._arena_pool, block_bytes=self._step_block, name=f"streaming step {index} arena")
        try:
            # Before any stage changes: a disk too full for the commit that ends the step fails here, not after
            # the stages were updated in place (store.reserve_commit).
            self.store.reserve_commit(index)
            with arena:  # closed (blocks returned) before any exception propagates
                loss, grad_norm, skipped, stage_hw, side_bytes = run_step(self, arena, inputs, targets, index)
                step_hw = arena.stats.high_water
            self.store.drain()  # every stage's write has finished: what fails from here on is the commit
            if not skipped and self.scheduler is not None:
                self.scheduler.step()
            # Kept until committed: a commit that fails is taken again as it is (retry_commit).
            self._pending_commit = (index, self._progress(index, index if not skipped
                                                          else self.store.manifest["data_step"]))
            self._committing = True
            self.store.commit(**self._pending_commit[1])
            self._pending_commit = None
        except BaseException as exc:
            self._abort(index, exc)
            raise
        self.step_count = index
        self.last_stats = StreamStepStats(
            step=index, loss=loss, skipped=skipped, grad_norm=grad_norm, lr=lr,
            seconds=time.perf_counter() - start, arena_high_water=step_hw + stage_hw,
            step_arena_high_water=step_hw, stage_arena_high_water=stage_hw,
            bytes_read=self.store.bytes_read - read0, bytes_written=self.store.bytes_written - written0,
            resident_bytes=self.resident_bytes, side_input_bytes=side_bytes)
        return loss

    def _abort(self, index: int, exc: BaseException) -> None:
        route_failures.abort(self, index, exc)

    def _failed_step(self, index: int, exc: BaseException) -> str:
        return route_failures.failed_step(self, index, exc)

    def _pending_message(self, exc: BaseException) -> str:
        return route_failures.pending_message(self, exc)

    @property
    def uncommitted_step(self) -> int | None:
        """The step that ran to its end but whose commit failed (taken again by retry_commit); None if none."""
        return None if self._pending_commit is None else self._pending_commit[0]

    def retry_commit(self) -> None:
        """Take again the commit of a step whose commit failed (see the error it raised); nothing if none.

        Raises StoreError, naming the cause, while the commit still fails; the route then stays as it was.
        """
        route_failures.retry_commit(self)

    def _took_pending(self, index: int, fields: dict[str, Any]) -> None:
        route_failures.took_pending(self, index, fields)

    def _refusal(self) -> str:
        return route_failures.refusal(self)

    def _check_open(self) -> None:
        route_failures.check_open(self)

    def _check_usable(self) -> None:
        route_failures.check_usable(self)

    def _reenter(self) -> None:
        route_moves.reenter(self)

    # -- outside the step -------------------------------------------------------------
    @property
    def resident_bytes(self) -> int:
        """Bytes the route keeps in memory between steps: two store slots and one stage of gradients (two with
        micro_batch: the micro-batch's and their sum)."""
        sums = self._grad_sums.nbytes if self._grad_sums is not None else 0
        return self.store.resident_bytes + self._grads.nbytes + sums

    def predict(self, inputs: Any) -> np.ndarray:
        """Model outputs in eval mode (no graph, dropout off), streamed stage by stage; a NumPy copy."""
        self._check_usable()
        with kept_modes(self.model):  # every module's mode back as it was after (a frozen part's eval too)
            self.model.eval()
            loads = _Loads(self.store, [(k, True) for k in range(len(self.stages))])
            try:
                with no_grad(), Arena(pool=self._arena_pool, block_bytes=self._step_block,
                                      name="streaming predict arena") as arena:
                    y, side = stage_inputs(self.model, self.stages, inputs)  # as a step computes them, then kept
                    for k, stage in enumerate(self.stages):
                        self._attach(k, loads.get(k))
                        with Arena(pool=self._arena_pool, block_bytes=self._stage_block,
                                   name=f"stage {stage.name!r} predict arena"):
                            out = _as_tensor(run_stage(stage, y, side), stage.name).data
                            keep = arena.alloc(out.shape, out.dtype)
                            np.copyto(keep, out)
                        self._detach(k)
                        y = Tensor(keep)
                    return keep.copy()
            finally:
                loads.finish()
                for k in range(len(self.stages)):
                    self._detach(k)

    def to_memory(self) -> None:
        """Write the trained parameters and optimizer state back into the model and optimizer, then close.

        Parameters get heap arrays again (the same arrays when release=False), optimizer.state
        holds what eager training would hold; the step count is `step_count`, and the schedule
        and RNG were live objects all along. Continue streaming with `resume` (the store is
        unchanged) or `from_memory` (after editing the in-memory state).
        """
        route_moves.bring_back(self, with_state=True)
        self._in_memory = True
        # The store as it was left: a step here moves the state back in over it, which must not replace a run
        # another trainer went on with in this directory meanwhile (route_moves.reenter).
        self._left_manifest = route_moves.manifest_identity(self.store.directory)

    @property
    def in_memory(self) -> bool:
        """True after to_memory() until the next step moves the state back into the store: the model and the
        optimizer hold the training state (Trainer.save and evaluate read them, not the store)."""
        return self._in_memory

    def params_to_memory(self) -> None:
        """Write the trained parameters (only) back into the model, then close: what a run that ends needs for its
        outputs (an evaluation, a saved model), without the memory of the optimizer's state (for Adam, twice the
        parameters' bytes), which stays in the store. The route is closed after: to train on, resume from the
        store (StreamingRoute.resume) or use to_memory() instead."""
        route_moves.bring_back(self, with_state=False)

    def close(self) -> None:
        """Finish I/O and release the store (parameters stay on disk unless to_memory() ran).

        A step whose commit failed is committed first if it can be now; else the store stays refused (a
        warning says why: its stages hold a step its manifest does not record)."""
        if self._pending_commit is not None and not self.store.closed:
            try:
                self.retry_commit()
            except StoreError as exc:
                log.warning("closing the streaming route with step %d uncommitted: %s", self._pending_commit[0], exc)
        self.store.close()

    def __enter__(self) -> "StreamingRoute":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _grad_buffer(store: ParamStore) -> np.ndarray:
    """One stage's parameter gradients, reused by every stage: as large as the largest stage's parameters."""
    grad_bytes = max(layout.params_bytes for layout in store.layouts)
    return aligned_bytes(max(grad_bytes, 1))


__all__ = ["StreamingRoute", "StreamStepStats"]
