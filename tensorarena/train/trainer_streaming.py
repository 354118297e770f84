"""The Trainer's streaming route: starting it (a store directory, temporary unless given), its step, the
minimum it needs (for an out-of-memory message), and the switch to it when a fused or eager step runs out of
memory, so that training goes on from the same state instead of dying.

The route itself is stream/route.py's StreamingRoute; this module is the Trainer's side of it.
"""

from __future__ import annotations

import atexit
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compile.step_state import restore_step_state
from ..memory.meter import rss_bytes
from ..tensor import Tensor
from .report import StepReport, StoreDirError

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("tensorarena")


def kept_run(store_dir) -> str | None:
    """None when `store_dir` holds no streamed run (no manifest); else " at step N" (or "" for a damaged manifest),
    for a message that names the run."""
    import json
    from pathlib import Path

    from ..stream.store_manifest import MANIFEST

    if store_dir is None:
        return None
    manifest = Path(store_dir) / MANIFEST
    if not manifest.exists():
        return None
    try:
        return f" at step {int(json.loads(manifest.read_text())['step'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""  # damaged: the route's own check says how when it opens the store


def refuse_a_kept_run_to_overwrite(store_dir) -> None:
    """A StoreDirError when store_dir holds a run: the out-of-memory fallback moves the trainer's state into
    store_dir, and would replace that run (as StreamingRoute.from_memory(overwrite=True) would; it without
    overwrite=True and the CLI refuse such a directory). Raised before anything changed."""
    at = kept_run(store_dir)
    if at is not None:
        raise StoreDirError(f"store_dir {store_dir} holds a streamed run{at}, which the out-of-memory fallback "
                            f"would replace with this trainer's state (its stage files and manifest overwritten): "
                            f"refused, nothing was changed. Pass a new or empty store_dir (or delete {store_dir}), "
                            f"or lower the batch size; to go on with that run, use route='streaming' (it resumes "
                            f"the store)")


def warn_of_a_kept_run(store_dir) -> None:
    """Said when an eager or fused Trainer is built: its store_dir holds a run, which its out-of-memory fallback
    refuses to overwrite (a warning, not a refusal: a store_dir may also be opened on purpose, by Trainer.load on
    route "auto" or start_streaming, which resume the run)."""
    at = kept_run(store_dir)
    if at is not None:
        log.warning("store_dir %s holds a streamed run%s: the out-of-memory fallback will not overwrite it, so a "
                    "step that runs out of memory will fail; pass a new or empty store_dir to let it stream there",
                    store_dir, at)


def _say_what_a_kept_store_does(trainer: Trainer, for_checkpoint: bool) -> None:
    """A store_dir that holds a run is resumed (StreamingRoute start="auto"): its parameters, optimizer state,
    hyperparameters, schedule, RNG and step count replace the trainer's. Said, not silent (a fine-tuning user's
    pretrained weights and learning rate were replaced without a word); refused when the trainer holds a state
    of its own to lose (a loaded checkpoint, steps taken), which the store's run would silently replace."""
    at = kept_run(trainer.store_dir)
    if at is None:
        return
    if for_checkpoint:
        log.info("streaming: store_dir %s holds a run%s: opened so that the checkpoint being loaded replaces its "
                 "state", trainer.store_dir, at)
        return
    if trainer.step_count or trainer._pending_checkpoint is not None:
        raise StoreDirError(f"store_dir {trainer.store_dir} holds a streamed run{at}, and this trainer holds a "
                            f"state of its own (step {trainer.step_count}, or a checkpoint waiting to load): "
                            f"streaming would resume the store's run and drop it. Pass a new or empty store_dir "
                            f"(or delete {trainer.store_dir})")
    log.warning("streaming: store_dir %s holds a run%s: resuming it; its parameters, optimizer state, "
                "hyperparameters, schedule and step count replace this trainer's (pass a new or empty store_dir "
                "to start anew)", trainer.store_dir, at)


def start_streaming(trainer: Trainer, *, redo_after_oom: bool = False, for_checkpoint: bool = False) -> None:
    """Open the streaming route over trainer.store_dir (a temporary one if None) and make it the route;
    redo_after_oom starts it from the state in memory, overwriting the store, to redo a failed step;
    for_checkpoint opens it for Trainer.load to write a checkpoint into (whose state then replaces a kept run's)."""
    import tempfile
    import weakref

    from ..stream.route import StreamingRoute
    from ..stream.store_medium import temporary_store_parent

    made = None
    if trainer.store_dir is None:
        # On a disk: a temporary directory on tmpfs would hold the store in memory (stream/store_medium.py).
        made = trainer.store_dir = tempfile.mkdtemp(prefix="tensorarena-store-", dir=temporary_store_parent())
        log.info("streaming store: %s (temporary: removed when this trainer's route goes; pass store_dir= "
                 "to keep it)", made)
    start = "memory" if redo_after_oom else "auto"
    if start == "auto":
        _say_what_a_kept_store_does(trainer, for_checkpoint)
    elif made is None:
        # The store starts from the state in memory, overwriting the directory: only a store this trainer made
        # (a temporary one, just created) may be overwritten, never a run kept there (refused before any change).
        refuse_a_kept_run_to_overwrite(trainer.store_dir)
    try:
        trainer.stream = StreamingRoute(trainer.model, trainer.optimizer, trainer.loss_fn, trainer.store_dir,
                                        scheduler=trainer.scheduler, clip_grad_norm=trainer.clip_grad_norm,
                                        on_nonfinite=trainer.on_nonfinite, start=start, step=trainer.step_count,
                                        overwrite=redo_after_oom, io=trainer.stream_io, pool=trainer.pool,
                                        micro_batch=trainer.micro_batch,
                                        # The redo keeps the state in memory too until it took (keep_the_switch):
                                        # a redo that runs out of memory partway goes back to it (undo_the_switch).
                                        release=not redo_after_oom)
    except BaseException:
        if made is not None:  # nothing moved into it (the route refuses before it offloads anything)
            shutil.rmtree(made, ignore_errors=True)
            trainer.store_dir = None
        raise
    if made is not None:
        # A directory with a random name no later run can resume, holding a copy of the whole training
        # state: removed, as tempfile.TemporaryDirectory does, once the route that reads it is gone (with
        # the trainer, or at exit), never before, so checkpoints and to_memory() still find it.
        # Before it goes, the parameters it still holds come back into memory (the model stays usable, as a
        # torch model outlives its training loop; a Trainer per epoch, or a fused run moved here by one
        # out-of-memory, left every parameter pointing into a removed store: a helper's hunt). At exit only the
        # directory goes (reading the whole model back then would be work for nothing).
        at_collection = weakref.finalize(trainer.stream, params_out_of_temporary_store, vars(trainer.stream), made)
        at_collection.atexit = False
        trainer._temporary_store = at_collection  # undo_the_switch removes it at once
        atexit.register(shutil.rmtree, made, ignore_errors=True)
    trainer.step_count = trainer.stream.step_count
    trainer.fused = None  # its flat buffers and slab held the state the store now has; let them go
    trainer.route = "streaming"


def _read_array(f, offset: int, shape: tuple[int, ...], dtype, name: str) -> np.ndarray:
    values = np.empty(shape, dtype)
    f.seek(offset)
    if f.readinto(memoryview(values).cast("B")) != values.nbytes:
        raise OSError(f"{name} is shorter than its layout")
    return values


def params_out_of_temporary_store(route_state: dict, directory) -> None:
    """A temporary store's route was collected: read the parameters still on disk (those its to_memory() did not
    bring back) from their stage files into arrays of their own, and their optimizer state into the optimizer (as
    to_memory() would have: the next step goes on from it, as eager training would), then remove the directory."""
    from ..stream import optim_state
    from ..stream.on_disk import _ON_DISK

    try:
        store, restored = route_state.get("store"), 0
        optimizer, kinds, group_of = route_state["optimizer"], route_state["kinds"], route_state["_group_of"]
        for k, stage in enumerate(route_state.get("stages", [])):
            waiting = [(i, p) for i, p in enumerate(stage.params) if p._arena is _ON_DISK]
            if not waiting:
                continue
            layout, name = store.layouts[k], store.files[k]
            with open(store.directory / name, "rb") as f:
                for i, p in waiting:
                    values = _read_array(f, layout.param_offsets[i], p.shape, p.dtype, name)
                    gi = group_of.get(id(p))
                    if gi is not None:
                        arrays = {kind: _read_array(f, offsets[i], p.shape, p.dtype, name)
                                  for kind, offsets in layout.state_offsets.items()}
                        scalars = _read_array(f, layout.scalar_offset + 8 * layout.n_scalars * i,
                                              (layout.n_scalars,), np.float64, name)
                        optim_state.write_state(kinds, optimizer, p, optimizer.param_groups[gi], arrays, scalars,
                                                None)
                    p._data, p._arena, p._generation = values, None, 0
                    restored += 1
        if restored:
            # Regression (fixed): only the parameters came back, and the optimizer's moments and step counts were
            # gone (Adam restarted its bias correction: the next step moved each weight by about lr).
            log.warning("streaming: the temporary store %s went with its trainer; its %d parameters and their "
                        "optimizer state came back into the model and optimizer. Pass store_dir= to keep a store, "
                        "or call trainer.stream.to_memory() first", directory, restored)
    except Exception as exc:  # noqa: BLE001 - collection time: say it, never raise
        log.warning("streaming: the parameters of the temporary store %s could not be read back (%s); the model "
                    "needs rebuilding or a checkpoint", directory, exc)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def drop_temporary_store(trainer: Trainer) -> bool:
    """A run that is over and reads nothing more of its model (`tensorarena train` once its summary and --save are
    done): its temporary store goes as it is, its state not read back into memory first. Read back, the parameters
    and the optimizer's state came to several times the route's need after the last step: `train --model vit-small
    --memory-limit 300M` (streaming needs 245 MiB) trained, printed its summary and was then killed by a 300M cgroup
    (tests/test_sequential_streaming.py). The model's parameters are left on disk, unreadable (StaleTensorError);
    True if there was such a store."""
    finalizer = getattr(trainer, "_temporary_store", None)
    if finalizer is None or trainer.stream is None:
        return False
    finalizer.detach()  # no read-back when the route goes
    trainer.stream.close()
    shutil.rmtree(trainer.store_dir, ignore_errors=True)
    trainer._temporary_store = trainer.store_dir = None
    return True


def streaming_step(trainer: Trainer, inputs: Any, targets: Any) -> StepReport:
    """One streamed step (starting the route first if needed); an out-of-memory names the route's minimum."""
    if trainer.stream is None:
        start_streaming(trainer)
    try:
        trainer.stream.step(inputs, targets)
    except MemoryError as err:
        if trainer.stream.uncommitted_step is not None:
            raise  # the step is whole, only its commit failed: its note says so and what to do
        need = streaming_minimum(trainer, inputs, targets)
        index = trainer.step_count + 1
        if trainer.stream._broken:
            # Stages were updated in place before it ran out: the route refuses every step from here on, so
            # "lower the batch size" (and step again) would only meet that refusal. Said here, not only in the
            # cause's note, which a caller that prints the error does not see.
            raise MemoryError(f"the streaming route ran out of memory at step {index}: "
                              f"{trainer.stream._refusal()}. This model and batch need at least {need}: raise the "
                              f"memory limit, or lower the batch size, for the steps after that") from err
        raise MemoryError(f"the streaming route ran out of memory too at step {index} ({err}); "
                          f"it needs at least {need} for this model and batch; nothing was changed. Raise the "
                          f"memory limit or lower the batch size") from err
    stats = trainer.stream.last_stats
    trainer.step_count = trainer.stream.step_count
    return StepReport(step=trainer.step_count, loss=stats.loss, route="streaming", seconds=stats.seconds,
                      arena_high_water=stats.arena_high_water, rss=rss_bytes(), lr=stats.lr,
                      grad_norm=stats.grad_norm, skipped=stats.skipped)


def streaming_minimum(trainer: Trainer, inputs: Any, targets: Any) -> str:
    """The least memory the streaming route needs for this model and batch, as words for an error message."""
    from ..memory.meter import format_bytes
    from .route_plan import persistent_bytes

    try:
        from ..stream.route import StreamingRoute

        stream = StreamingRoute.estimate(trainer.model, trainer.optimizer)
        x = np.asarray(inputs.data if isinstance(inputs, Tensor) else inputs)
        return (f"{format_bytes(stream['resident_bytes'] + x.nbytes)} for its store buffers and inputs "
                f"plus one stage's activations (see Trainer.plan)")
    except Exception:  # noqa: BLE001 - the estimate is only a hint inside an error message
        return f"more than the {format_bytes(persistent_bytes(trainer.optimizer)['params'])} of parameters"


def switch_after_oom(trainer: Trainer, err: MemoryError, index: int, before) -> None:
    """Move a step that ran out of memory on the eager or fused route to streaming, with the state as it was
    before the step (`before`); a model that cannot stream gets a MemoryError saying so."""
    from ..stream.stages import StreamingUnsupportedError

    source = trainer.route
    restore_step_state(before)  # the redo draws the failed step's masks and sees its buffers
    if not callable(getattr(trainer.model, "stream_stages", None)):
        raise MemoryError(f"step {index} on the {source} route ran out of memory ({err}); the streaming "
                          f"fallback needs a model with stream_stages(), which {type(trainer.model).__name__} "
                          f"does not have. Lower the batch size or raise the memory limit") from err
    try:
        start_streaming(trainer, redo_after_oom=True)
    except (StreamingUnsupportedError, StoreDirError) as exc:
        raise MemoryError(f"step {index} ran out of memory ({err}) and the streaming fallback is not "
                          f"possible: {exc}") from err
    trainer.route_switches.append({"step": index, "from": source, "to": "streaming", "error": str(err)})
    log.warning("step %d ran out of memory on the %s route (%s); the training state moved to the streaming "
                "store %s and training goes on there", index, source, str(err), trainer.store_dir)
    # str(err), not err: a handler that keeps records (pytest's capture, a MemoryHandler) would keep the
    # exception's traceback and, through its frames, the fused step's slab and flat buffers let go above.


def keep_the_switch(trainer: Trainer) -> None:
    """The fallback's redo took: let go of the in-memory copy of the state it kept (the store holds it now)."""
    from ..stream.heap import return_freed_pages

    stream = trainer.stream
    if stream.release:
        return
    stream._kept.clear()
    stream._kept_state.clear()
    stream.release = True
    return_freed_pages()


def undo_the_switch(trainer: Trainer, exc: BaseException) -> BaseException:
    """The fallback's redo failed after updating stages in place (the route is broken): put the training state kept
    in memory (release=False) back into the model and optimizer and the trainer back on the route it left, as before
    the step; the store it made goes (its stages hold the failed step partly applied, and it is no run of anyone's).
    Returns the error to raise.

    Why not reserve the redo's memory before its first in-place update instead: a stage's recompute and backward
    take their arena blocks as they run, and their need is known only once traced; the state in memory, kept a
    little longer, is what the trainer held anyway before the step."""
    from ..stream.store_manifest import MANIFEST

    stream, switch = trainer.stream, trainer.route_switches[-1]
    if not stream._broken:
        # Nothing of the step changed the store (or it is whole there and only its commit failed, to be taken
        # again): the store holds the state as memory does, and the trainer goes on streaming, as it always did.
        keep_the_switch(trainer)
        return exc
    params = [p for stage in stream.stages for p in stage.params]
    if any(id(p) not in stream._kept for p in params):  # deferred ones were never in memory: nothing to go back to
        return exc
    stream.close()
    for p in params:
        p._data, p._arena, p._generation = stream._kept.pop(id(p)), None, 0
        state = stream._kept_state.pop(id(p), None)
        if state is not None:
            trainer.optimizer.state[p] = state
    if trainer._temporary_store is not None:
        trainer._temporary_store()  # removes the directory (its parameters are back: none is read)
        trainer._temporary_store = trainer.store_dir = None
    else:
        (Path(trainer.store_dir) / MANIFEST).unlink(missing_ok=True)  # no run: a later fallback may start anew
    trainer.stream, trainer.route = None, switch["from"]
    trainer.route_switches.pop()
    step = switch["step"]
    log.warning("step %d, redone on the streaming route after running out of memory on the %s route, failed "
                "there too (%s: %s); the training state is back in memory as before the step, on the %s route",
                step, switch["from"], type(exc).__name__, exc, switch["from"])
    if not isinstance(exc, MemoryError):
        exc.add_note(f"the training state is back in memory as it was before step {step}, on the {switch['from']} "
                     f"route: nothing was lost (the streaming route it moved to after running out of memory "
                     f"failed while redoing the step)")
        return exc
    return MemoryError(f"step {step} ran out of memory on the {switch['from']} route ({switch['error']}) and again "
                       f"when redone on the streaming route (the cause says how). The training state is back in "
                       f"memory as it was before the step, on the {switch['from']} route: nothing was lost. Lower "
                       f"the batch size or raise the memory limit, then go on")
