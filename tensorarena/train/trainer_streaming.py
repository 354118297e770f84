"""The Trainer's streaming route: starting it (a store directory, temporary unless given), its step, the
minimum it needs (for an out-of-memory message), and the switch to it when a fused or eager step runs out of
memory, so that training goes on from the same state instead of dying.

The route itself is stream/route.py's StreamingRoute; this module is the Trainer's side of it.
"""

from __future__ import annotations

import atexit
import logging
import shutil
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compile.step_state import restore_step_state
from ..memory.meter import rss_bytes
from ..tensor import Tensor
from .report import StepReport, StoreDirError

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("tensorarena")


def _say_what_a_kept_store_does(trainer: Trainer, for_checkpoint: bool) -> None:
    """A store_dir that holds a run is resumed (StreamingRoute start="auto"): its parameters, optimizer state,
    hyperparameters, schedule, RNG and step count replace the trainer's. Said, not silent (a fine-tuning user's
    pretrained weights and learning rate were replaced without a word); refused when the trainer holds a state
    of its own to lose (a loaded checkpoint, steps taken), which the store's run would silently replace."""
    import json
    from pathlib import Path

    from ..stream.store_manifest import MANIFEST

    manifest = Path(trainer.store_dir) / MANIFEST
    if not manifest.exists():
        return
    try:
        at = f" at step {int(json.loads(manifest.read_text())['step'])}"
    except (OSError, ValueError, KeyError, TypeError):
        at = ""  # damaged: the route's own check says how when it opens the store
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

    made = None
    if trainer.store_dir is None:
        made = trainer.store_dir = tempfile.mkdtemp(prefix="tensorarena-store-")
        log.info("streaming store: %s (temporary: removed when this trainer's route goes; pass store_dir= "
                 "to keep it)", made)
    start = "memory" if redo_after_oom else "auto"
    if start == "auto":
        _say_what_a_kept_store_does(trainer, for_checkpoint)
    try:
        trainer.stream = StreamingRoute(trainer.model, trainer.optimizer, trainer.loss_fn, trainer.store_dir,
                                        scheduler=trainer.scheduler, clip_grad_norm=trainer.clip_grad_norm,
                                        on_nonfinite=trainer.on_nonfinite, start=start, step=trainer.step_count,
                                        overwrite=redo_after_oom, io=trainer.stream_io, pool=trainer.pool,
                                        micro_batch=trainer.micro_batch)
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


def streaming_step(trainer: Trainer, inputs: Any, targets: Any) -> StepReport:
    """One streamed step (starting the route first if needed); an out-of-memory names the route's minimum."""
    if trainer.stream is None:
        start_streaming(trainer)
    try:
        trainer.stream.step(inputs, targets)
    except MemoryError as err:
        need = streaming_minimum(trainer, inputs, targets)
        raise MemoryError(f"the streaming route ran out of memory too at step {trainer.step_count + 1} ({err}); "
                          f"it needs at least {need} for this model and batch. Raise the memory limit or "
                          f"lower the batch size") from err
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
    except StreamingUnsupportedError as exc:
        raise MemoryError(f"step {index} ran out of memory ({err}) and the streaming fallback is not "
                          f"possible: {exc}") from err
    trainer.route_switches.append({"step": index, "from": source, "to": "streaming", "error": str(err)})
    log.warning("step %d ran out of memory on the %s route (%s); the training state moved to the streaming "
                "store %s and training goes on there", index, source, str(err), trainer.store_dir)
    # str(err), not err: a handler that keeps records (pytest's capture, a MemoryHandler) would keep the
    # exception's traceback and, through its frames, the fused step's slab and flat buffers let go above.
