"""Moving a StreamingRoute's training state into its store and back out of it.

StreamingRoute (route.py) keeps the store and what lasts between steps; these functions of the route do the moves
around the steps: `move_in` writes the in-memory parameters and optimizer state into a new store and commits it
(from_memory, and `reenter`, the next step after to_memory()), `resume` restores what a committed store records,
`bring_back` returns the state to memory (to_memory, params_to_memory), and `offload_all` / `offload` /
`detach_param` point the parameters at their on-disk placeholders (on_disk.py). `progress` is the manifest's
per-step part, committed by the move in, each step and a streamed checkpoint load. None of this runs inside a
step's passes (sweep.py), which only attach the stages' slots. The route calls these from its methods of the same
names (_move_in, _progress, _resume, _reenter, _detach_param; to_memory and params_to_memory call bring_back).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..random import peek_default_generator
from ..train.checkpoint import _generators, _jsonable, _scheduler_problem, rng_state
from . import optim_state
from .follow import group_map
from .generator_states import damaged_generator_state, generator_states_problem, restore_generators
from .heap import return_freed_pages
from .on_disk import _ON_DISK
from .stages import model_stages
from .store import ParamStore, StoreError

if TYPE_CHECKING:
    from .route import StreamingRoute

log = logging.getLogger("tensorarena")


def move_in(route: StreamingRoute, step: int, overwrite: bool, *, keep_committed: bool = False) -> None:
    """StreamingRoute._move_in's work: the in-memory parameters and optimizer state into a new store, committed
    at `step`; only then are the in-memory arrays let go."""
    store = route.store
    on_disk = [name for s, names in zip(route.stages, route._names) for p, name in zip(s.params, names)
               if p._arena is _ON_DISK]
    if on_disk:
        raise StoreError(f"the model's parameters ({on_disk[0]}, ...) are not in memory: a StreamingRoute holds "
                         f"them on disk (closed without to_memory()). Continue that run with "
                         f"StreamingRoute.resume(...), or bring them back with resume(...).to_memory() first")
    if store.has_manifest() and not overwrite:
        raise StoreError(f"{store.directory} already holds a streaming store; continue it with "
                         f"StreamingRoute.resume(...), or pass overwrite=True to replace it with the in-memory "
                         f"state (its current contents are lost)")
    if store.leftovers() and not overwrite:
        raise StoreError(f"{store.directory} holds stage files but no manifest: creating a store there was "
                         f"interrupted. Pass overwrite=True (or delete the directory) to start it again")
    store.create(keep_committed=keep_committed)
    for k, stage in enumerate(route.stages):
        store.read(k, 0).result()  # io="map" writes through a mapping of the (new, zero) file
        views = store.views(0, k)
        for i, p in enumerate(stage.params):
            if p.is_deferred:
                # Built under nn.deferred_init(): its values are made straight into the slot, so the model
                # is never whole in memory; until the commit below it stays deferred (nothing is lost).
                p._arena.fill_into(views.params[i])
            else:
                np.copyto(views.params[i], p.data)
            gi = route._group_of.get(id(p))
            group = route.optimizer.param_groups[gi] if gi is not None else None
            optim_state.read_state(route.kinds, route.optimizer, p, group, views.state[i], views.scalars[i])
        del views  # no array over the slot may outlive its write (io="map" unmaps it there)
        store.write(k, 0, None).result()
    route.step_count = step
    store.commit(signature=route._spec(route.kinds).signature(),
                 optimizer={"class": route.kinds.optimizer, "state_arrays": list(route.kinds.arrays),
                            "state_scalars": list(route.kinds.scalars)},
                 param_groups_of=route._groups_of_params(), layout_generation=store.generation,
                 **progress(route, step, step))
    # Only now, with the store committed, let go of the in-memory arrays.
    offload_all(route)


def progress(route: StreamingRoute, step: int, data_step: int) -> dict[str, Any]:
    """Manifest fields that change every step; every stage holds the update of `data_step`."""
    return {"step": step, "data_step": data_step,
            "stages": [{"name": s.name, "file": f, "step": data_step}
                       for s, f in zip(route.stages, route.store.files)],
            "param_groups": [_jsonable({k: v for k, v in g.items() if k != "params"})
                             for g in route.optimizer.param_groups],
            "scheduler": None if route.scheduler is None else _jsonable(route.scheduler.state_dict()),
            # Its class too: a scheduler whose state's keys are a subset of another's (ExponentialLR's of StepLR's)
            # would load into it and train a schedule of neither run.
            "scheduler_class": None if route.scheduler is None else type(route.scheduler).__name__,
            # As JSON: MT19937, Philox and SFC64 keep arrays in their states (rng_state); peek: no draw.
            "rng": {name: rng_state(g) for name, g in _generators(route.model).items()},
            "rng_default": rng_state(peek_default_generator())}


def resume(route: StreamingRoute) -> None:
    """StreamingRoute._resume's work: open the store's committed run, check it fits this route's objects, then
    restore its hyperparameters, schedule, RNG and step count into them and offload the parameters."""
    manifest = route.store.open()
    where = route.store.directory
    # The store's state kinds: this optimizer's, or more (momentum switched on mid-run, see store._adopt).
    route.kinds = optim_state.StateKinds(route.kinds.optimizer, route.store.spec.state_arrays,
                                         route.store.spec.state_scalars)
    if manifest.get("param_groups_of") != route._groups_of_params():
        raise StoreError(f"the optimizer's parameter groups differ from the ones the store {where} was trained "
                         f"with; build the optimizer with the same groups (or delete the directory)")
    problem = generator_states_problem(route.model, manifest.get("rng", {}))
    if problem:
        raise StoreError(f"the store {where} {problem}")
    if (manifest.get("scheduler") is None) != (route.scheduler is None):
        raise StoreError(f"the store {where} was trained {'without' if manifest.get('scheduler') is None else 'with'} "
                         f"an LR scheduler but this route was given "
                         f"{'one' if route.scheduler is not None else 'none'}; pass the same scheduler kind")
    if route.scheduler is not None:
        saved_class, mine = manifest.get("scheduler_class"), type(route.scheduler).__name__
        if saved_class is not None and saved_class != mine:  # stores from before it was recorded hold none
            raise StoreError(f"the store {where} was trained with a {saved_class} schedule but this route was given "
                             f"a {mine}; pass the same scheduler class to resume it")
        problem = _scheduler_problem(manifest["scheduler"], route.scheduler)
        if problem:
            raise StoreError(f"the store {where} holds a schedule this {mine} cannot take: {problem}")
    # store.open checked the manifest's structure (its step, groups and generator states are there, of their
    # kinds); each group's values are checked as a load_state_dict checks them, before anything changes.
    saved_groups = manifest["param_groups"]
    if len(saved_groups) != len(route.optimizer.param_groups):
        raise StoreError(f"the store {where} holds {len(saved_groups)} parameter groups but the optimizer has "
                         f"{len(route.optimizer.param_groups)}; build the optimizer with the same groups (or delete "
                         f"the directory)")
    for gi, (group, entries) in enumerate(zip(route.optimizer.param_groups, saved_groups)):
        try:
            route.optimizer._check_hyperparams({**group, **route.optimizer._saved_hyperparams(entries)})
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"the store {where} holds hyperparameters this {type(route.optimizer).__name__} cannot "
                             f"take in parameter group {gi} ({type(exc).__name__}: {exc}); its manifest is damaged: "
                             f"delete {where} and resume from a checkpoint") from exc
    problem = damaged_generator_state(route.model, manifest.get("rng", {}), manifest["rng_default"])
    if problem:  # NumPy's own error, half-way through the restore, would name neither the store nor what to do
        raise StoreError(f"the manifest of the store {where} is damaged: {problem}. Delete {where} and resume from "
                         f"a checkpoint")
    step = int(manifest["step"])
    # Now restore (hyperparameters first: the schedule's state refers to them). A load that fails anyway puts
    # the groups, the schedule and the generators back: a refused resume changes nothing the caller holds.
    groups_before = [{k: v for k, v in g.items() if k != "params"} for g in route.optimizer.param_groups]
    schedule_before = None if route.scheduler is None else route.scheduler.state_dict()
    rng_before = {name: g.bit_generator.state for name, g in _generators(route.model).items()}
    default_before = peek_default_generator().bit_generator.state
    try:
        for group, entries in zip(route.optimizer.param_groups, saved_groups):
            group.update(route.optimizer._saved_hyperparams(entries))
        if route.scheduler is not None:
            route.scheduler.load_state_dict(manifest["scheduler"])
        restore_generators(route.model, manifest.get("rng", {}), manifest["rng_default"])
    except BaseException:
        for group, before in zip(route.optimizer.param_groups, groups_before):
            params = group["params"]
            group.clear()
            group.update(before, params=params)
        if schedule_before is not None:
            route.scheduler.load_state_dict(schedule_before)
        restore_generators(route.model, rng_before, default_before)
        raise
    route.step_count = step
    offload_all(route)


def manifest_identity(directory) -> tuple[int, int] | None:
    """(inode, modification time) of the committed manifest in `directory`, None without one: every commit
    renames a new file over it, so another identity means another commit."""
    from .store_manifest import MANIFEST

    try:
        stat = os.stat(os.path.join(directory, MANIFEST))
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def reenter(route: StreamingRoute) -> None:
    """After to_memory(): the training state, maybe changed in memory, goes into a new store in the same
    directory (as from_memory(..., overwrite=True) would, but the committed store stays whole until the new
    one commits: to_memory() promised to leave it as it was), and the route goes on from there. A store another
    trainer committed steps to meanwhile (to_memory() let go of its lock) is refused, not overwritten."""
    directory = route.store.directory
    now = manifest_identity(directory)
    if now is not None and now != getattr(route, "_left_manifest", now):
        raise StoreError(f"the streaming store {directory} changed after to_memory() (another trainer took steps "
                         f"there); this trainer's state of step {route.step_count} stays in memory and was not "
                         f"moved in over that run: save it (Trainer.save) or train it with another store_dir")
    # The stages again from the model as it is: a module replaced while the state was in memory is trained
    # from here on, as on the eager route (_check_stages refuses to train on without this).
    route.stages = model_stages(route.model)
    route._index_stages()
    route.kinds = optim_state.state_kinds(route.optimizer)
    route._group_of = group_map(route)
    route.store = ParamStore(route.store.directory, route._spec(route.kinds), **route._store_options)
    try:
        # The user may have changed dtypes (model.double()) or shapes in memory: everything sized from the
        # parameters is sized again from the new layouts, before the state moves in (as in StreamingRoute.__init__).
        route._size_grad_buffers()
        route._placeholder = route._placeholders()
        move_in(route, route.step_count, overwrite=True, keep_committed=True)
    except BaseException:
        route.store.close()
        raise
    route._in_memory = False
    route._broken = None


def bring_back(route: StreamingRoute, *, with_state: bool) -> None:
    """to_memory's (with_state) and params_to_memory's work: every stage's parameters, and with_state their
    optimizer state, back into the model and optimizer; then the route is closed."""
    what = "to_memory" if with_state else "params_to_memory"
    route._check_open()
    if route._broken:
        raise StoreError(route._refusal())
    pending = route._pending_commit
    if pending is not None:
        try:
            route.retry_commit()
        except StoreError as exc:
            # Bringing the state out is this method's whole point, and what a commit that cannot be taken
            # (the directory removed, a read-only disk) leaves the user: the stages hold step `pending[0]`.
            log.warning("%s: %s. The training state of step %d comes into memory; the next step writes "
                        "a new store", what, exc, pending[0])
            route._took_pending(*pending)
    route.store.drain()
    for k, stage in enumerate(route.stages):
        route.store.read(k, 0).result()
        views = route.store.views(0, k)
        for i, p in enumerate(stage.params):
            kept = route._kept.pop(id(p), None)
            array = optim_state._into(kept, views.params[i])
            gi = route._group_of.get(id(p))
            if with_state and gi is not None:
                optim_state.write_state(route.kinds, route.optimizer, p, route.optimizer.param_groups[gi],
                                        views.state[i], views.scalars[i], route._kept_state.pop(id(p), None))
            p._data, p._arena, p._generation = array, None, 0
    route.close()


def offload_all(route: StreamingRoute) -> None:
    """Offload every streamed parameter, then give the freed pages back to the kernel: free() alone left
    them in the heap, and RSS as high as if the parameters were still in memory (stream/heap.py)."""
    for stage in route.stages:
        for p in stage.params:
            offload(route, p)
    if route.release:
        return_freed_pages()


def offload(route: StreamingRoute, p) -> None:
    """Point `p` at a 1-element placeholder; free (or keep, release=False) its arrays and state."""
    if p._arena is not _ON_DISK:
        if not route.release and not p.is_deferred:  # a deferred one has no array to keep (to_memory makes one)
            route._kept[id(p)] = p._data
            route._kept_state[id(p)] = route.optimizer.state.get(p)
        route.optimizer.state.pop(p, None)
    detach_param(route, p)


def detach_param(route: StreamingRoute, p) -> None:
    """Point `p` at its placeholder, marked as on disk (on_disk.py), with no gradient."""
    # Private Tensor slots on purpose: the public setter would forget the "on disk" marker.
    p._data = route._placeholder[id(p)]
    p._arena, p._generation = _ON_DISK, 0
    p.grad = None
    p._grad_buffer = None
