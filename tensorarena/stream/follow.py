"""What the streaming route follows between steps: the optimizer changes a PyTorch user makes by hand.

The eager step reads `optimizer.param_groups` and `optimizer.state` afresh every time; the streaming route
keeps the optimizer state in its store, laid out when the route started. So before each step's own I/O
(a refusal then changes nothing), `StreamingRoute.step` calls `follow_user_changes`, which brings the
store in line with:

  state kinds  momentum or amsgrad switched on: a group's state_init names a kind the store lacks. Every
               stage is laid out again with it (ParamStore.relayout: new files, one manifest commit), filled
               as Optimizer._init_state fills a missing entry.
  groups       add_param_group (or groups rebuilt): the parameter -> group map is rebuilt and recorded in
               the manifest (param_groups_of). A parameter that changed group and never took a step gets
               its new group's fill values (eager creates its state lazily, from that group); one with steps
               keeps its state, as eager does.
  state        optimizer.load_state_dict: what optimizer.state holds for a streamed parameter moves into the
               store (as StreamingRoute._move_in does at the start) and leaves memory. A load makes a new
               optimizer.state (as does `optimizer.state = defaultdict(dict)`): then every streamed parameter is
               rewritten, one the loaded state has no entry for starting afresh (fill values, step 0) as on
               eager; only the parameters with an entry moved before, so loading a fresh optimizer's state dict,
               torch's way to reset the moments, changed nothing.

Rewriting stages outside a step is journaled (ParamStore.begin_rewrite): a kill half-way leaves a store
that refuses to open rather than one that silently mixes two states.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import optim_state

if TYPE_CHECKING:
    from .route import StreamingRoute

log = logging.getLogger("tensorarena")


def group_map(route: "StreamingRoute") -> dict[int, int]:
    """id(parameter) -> index of its optimizer group, for the streamed parameters (others are left out)."""
    staged = route._staged
    groups: dict[int, int] = {}
    outside = 0
    for gi, group in enumerate(route.optimizer.param_groups):
        for p in group["params"]:
            if id(p) in staged:
                groups[id(p)] = gi
            else:
                outside += 1
    if outside and outside != route._outside_warned:
        route._outside_warned = outside
        log.warning("the optimizer holds %d parameter(s) in no stage of %s.stream_stages(); the streaming route "
                    "does not update them (no stage computes their gradient)", outside, type(route.model).__name__)
    return groups


def follow_user_changes(route: "StreamingRoute") -> None:
    """Bring the store in line with the optimizer's current state kinds, groups and in-memory state."""
    groups = group_map(route)
    grow_state_kinds(route, optim_state.state_kinds(route.optimizer), route.optimizer.param_groups, groups)
    state = route.optimizer.state
    if state is not route._state_seen:  # a load replaced it: what it lacks starts afresh
        loaded = set(route._staged)
    else:
        loaded = {pid for pid, p in route._staged.items() if state.get(p)} if state else set()
    if groups != route._group_of or loaded:
        _rewrite_state(route, groups, loaded)
    route._state_seen = state
    if state:
        for p in route._staged.values():  # empty entries (defaultdict lookups) hold nothing to move
            state.pop(p, None)


_ANY_COUNT = 12345.0  # a stand-in step count for grow_state_kinds: continued_step gives it back unless it restarts


def grow_state_kinds(route: "StreamingRoute", kinds: optim_state.StateKinds, param_groups: list[dict],
                     groups: dict[int, int]) -> None:
    """Add the state kinds `kinds` names and the store lacks, filled by `param_groups` (as eager fills a missing
    entry); a StoreError before anything changed if the disk has no room for it."""
    arrays = [k for k in kinds.arrays if k not in route.kinds.arrays]
    scalars = [k for k in kinds.scalars if k not in route.kinds.scalars]
    if not arrays and not scalars:
        return
    grown = optim_state.StateKinds(route.kinds.optimizer, route.kinds.arrays + tuple(arrays),
                                   route.kinds.scalars + tuple(scalars))
    optimizer = route.optimizer

    def fill(k: int, i: int) -> tuple[dict, dict]:
        gi = groups.get(id(route.stages[k].params[i]))
        group = param_groups[gi] if gi is not None else None
        array_init = optimizer.state_init(group) if group is not None else {}
        scalar_init = optimizer.scalar_state_init(group) if group is not None else {}
        scalar_fill = {kind: scalar_init.get(kind, 0.0) for kind in scalars}
        if group is not None:
            # The step an update goes on from once the new arrays are made (Optimizer.continued_step, as eager's
            # _init_state): SGD restarts it for a new momentum buffer. A stand-in count tells whether it does.
            held = {kind: True for kind in route.kinds.arrays}
            start = optimizer.continued_step({**held, "step": _ANY_COUNT}, group)
            if start != _ANY_COUNT:
                scalar_fill["step"] = start
        return {kind: array_init.get(kind, 0.0) for kind in arrays}, scalar_fill

    log.info("streaming store: laying out every stage again for the new optimizer state %s", arrays + scalars)
    route.store.relayout(route._spec(grown), fill)
    route.kinds = grown


def _rewrite_state(route: "StreamingRoute", groups: dict[int, int], loaded: set[int]) -> None:
    """Write into the store the optimizer state of the `loaded` parameters (from optimizer.state) and the fill
    values of those that joined another group and never took a step, then commit the new group map."""
    store, optimizer, kinds = route.store, route.optimizer, route.kinds
    moved = {pid for pid, gi in groups.items() if route._group_of.get(pid) != gi}
    todo = [(k, [i for i, p in enumerate(s.params) if id(p) in moved or id(p) in loaded])
            for k, s in enumerate(route.stages)]
    todo = [(k, members) for k, members in todo if members]
    what = "moving the optimizer's state into it" if loaded else "changing the parameter groups"
    token = store.begin_rewrite(what)
    touched = 0  # stages changed (io="map" changes the file itself, before its write)
    try:
        for k, members in todo:
            store.read(k, 0).result()
            views = store.views(0, k)
            touched += 1
            for i in members:
                p = route.stages[k].params[i]
                gi = groups.get(id(p))
                group = optimizer.param_groups[gi] if gi is not None else None
                if id(p) in loaded:
                    optim_state.read_state(kinds, optimizer, p, group, views.state[i], views.scalars[i])
                    if not route.release:
                        route._kept_state[id(p)] = optimizer.state[p]  # to_memory() refills these arrays
                elif views.scalars[i, 0] == 0 and group is not None:  # no step taken: eager has no state yet
                    optim_state.put_state(kinds, optimizer, group, {}, views.state[i], views.scalars[i])
            views = None  # io="map": the write unmaps the slot (store._release)
            store.write(k, 0, None).result()
        route._group_of = groups
        store.commit(param_groups_of=route._groups_of_params(), rewrite=token)
    except BaseException as exc:
        if not touched:  # nothing changed: the store is as it was, and so is the route
            store.end_rewrite()
            raise
        route._broken = (f"{what} failed ({type(exc).__name__}: {exc}) after changing {touched} of {len(todo)} "
                         f"stages, so the store holds a mix of the old and the new state")
        exc.add_note(route._refusal())
        raise
    store.end_rewrite()
