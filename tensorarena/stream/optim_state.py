"""What the streaming route needs from an optimizer: its state kinds, moving state, one parameter's update.

The store keeps each parameter's optimizer state next to the parameter on disk, so the route
must know the state's layout without asking the optimizer to create it. Every optimizer
describes it through the per-array API of optim/optimizer.py: `state_init(group)` names the
per-element arrays (shaped like the parameter) and their fill values, `scalar_state_init(group)`
the extra 0-d float64 scalars; "step" is always there. The update is `update_flat` on the
parameter's own arrays after `step += 1`, which is exactly what `Optimizer.step` does per
parameter, so a streamed update is the eager update, bit for bit, for every optimizer that
implements the API (SGD, Adam, AdamW, NAdam, RMSprop, Adagrad, Lion, LAMB, Adamax, RAdam, Adadelta, Rprop,
ASGD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..optim.optimizer import Optimizer


@dataclass(frozen=True)
class StateKinds:
    """The optimizer state one parameter carries in the store (the union over its groups)."""

    optimizer: str  # class name, recorded in the manifest
    arrays: tuple[str, ...]  # per-element state, each shaped and typed like the parameter
    scalars: tuple[str, ...]  # per-parameter float64 numbers; "step" first


def state_kinds(optimizer: Optimizer, groups: Sequence[dict[str, Any]] | None = None) -> StateKinds:
    """The state kinds of `optimizer` (of `groups`, its param groups by default); a clear error for one
    without the per-array update API."""
    kind = type(optimizer)
    flat = getattr(kind, "update_flat", None)
    if not isinstance(optimizer, Optimizer) or flat is None or flat is Optimizer.__dict__.get("update_flat"):
        raise TypeError(f"the streaming route updates one stage at a time through Optimizer.update_flat, which "
                        f"{kind.__name__} does not implement; use the eager route for it")
    if kind.step is not Optimizer.step:
        raise TypeError(f"{kind.__name__} overrides step(), so its eager update may differ from update_flat per "
                        f"parameter, which is what the streaming route runs; use the eager route for it")
    arrays: dict[str, None] = {}
    scalars: dict[str, None] = {"step": None}
    for group in optimizer.param_groups if groups is None else groups:
        arrays.update(dict.fromkeys(optimizer.state_init(group)))
        scalars.update(dict.fromkeys(optimizer.scalar_state_init(group)))
    return StateKinds(kind.__name__, tuple(arrays), tuple(scalars))


def read_state(kinds: StateKinds, optimizer: Optimizer, p, group: dict[str, Any] | None,
               arrays: dict[str, np.ndarray], scalars: np.ndarray) -> None:
    """Copy `optimizer.state[p]` into the store views `arrays` (kind -> array) and `scalars` (one row).

    A parameter without state yet stores what `Optimizer._init_state` would create before its
    first update (fill values, step 0); one with state is completed by the same rules (see put_state).
    """
    put_state(kinds, optimizer, group, optimizer.state.get(p) or {}, arrays, scalars)


def put_state(kinds: StateKinds, optimizer: Optimizer, group: dict[str, Any] | None, state: dict[str, Any],
              arrays: dict[str, np.ndarray], scalars: np.ndarray) -> None:
    """Store one parameter's optimizer `state` (possibly partial or empty) in its views, completed as
    `Optimizer._init_state` completes it: a missing (or None) array or scalar gets `group`'s fill value (0
    without a group), the step `continued_step(state, group)` (e.g. SGD's 1 for a loaded buffer without one).
    Nothing in `optimizer.state` is created or changed."""
    init = optimizer.state_init(group) if group is not None else {}
    scalar_init = optimizer.scalar_state_init(group) if group is not None else {}
    state = {k: v for k, v in state.items() if v is not None}
    for kind in kinds.arrays:
        value = state.get(kind)
        if value is None:
            arrays[kind].fill(init.get(kind, 0.0))
        else:
            np.copyto(arrays[kind], np.asarray(value), casting="same_kind")
    for j, kind in enumerate(kinds.scalars):
        value = state.get(kind)
        if kind == "step" and group is not None:
            scalars[j] = optimizer.continued_step(state, group)  # as _init_state (SGD: a new buffer restarts it)
        elif value is not None:
            scalars[j] = float(np.asarray(value).reshape(()))
        elif kind == "step":
            scalars[j] = optimizer.initial_step(state) if state else 0.0
        else:
            scalars[j] = scalar_init.get(kind, 0.0)


def write_state(kinds: StateKinds, optimizer: Optimizer, p, group: dict[str, Any], arrays: dict[str, np.ndarray],
                scalars: np.ndarray, keep: dict[str, Any] | None) -> None:
    """Set `optimizer.state[p]` from the store views, as eager training would hold it.

    No entry while step is 0 (state is created lazily at the first update, as eager); else
    "step", the group's state_init arrays and scalar_state_init scalars. `keep` is the state
    dict held back when the route started (release=False): its arrays are refilled in place.
    """
    keep = keep or {}
    optimizer.state.pop(p, None)
    if scalars[0] == 0:
        return
    state: dict[str, Any] = {"step": np.array(scalars[0], dtype=np.float64)}
    for kind in optimizer.state_init(group):
        state[kind] = _into(keep.get(kind), arrays[kind])
    for kind in optimizer.scalar_state_init(group):
        state[kind] = np.array(scalars[kinds.scalars.index(kind)], dtype=np.float64)
    optimizer.state[p] = state


def _into(target: np.ndarray | None, source: np.ndarray) -> np.ndarray:
    """`source` copied to the heap: into `target` when it fits, else a new array."""
    if isinstance(target, np.ndarray) and target.shape == source.shape and target.dtype == source.dtype:
        np.copyto(target, source)
        return target
    return source.copy()


def update(kinds: StateKinds, optimizer: Optimizer, group: dict[str, Any], params: Sequence,
           arrays: Sequence[dict[str, np.ndarray]], scalars: Sequence[np.ndarray]) -> None:
    """One update of each of `params` (all of `group`, each with a .grad) in place, on the store views.

    `arrays[i]` and `scalars[i]` are parameter i's state views in the slot; the step runs as
    Optimizer.step's loop body: update_flat with step + 1 and the group's current hyperparameters (a
    scheduler's lr included), then step += 1 in place, only once the kernel ran (a MemoryError inside it
    leaves the count where it was, for the out-of-memory redo).
    """
    array_keys = tuple(optimizer.state_init(group))
    scalar_keys = tuple(optimizer.scalar_state_init(group))
    positions = [kinds.scalars.index(k) for k in scalar_keys]
    for p, state_arrays, row in zip(params, arrays, scalars):
        step = row[0:1].reshape(())  # 0-d view into the slot
        state = {k: state_arrays[k] for k in array_keys}
        state.update({k: row[j:j + 1].reshape(()) for k, j in zip(scalar_keys, positions)})
        optimizer.update_flat(group, p.data, optimizer._grad_of(p), state, float(step) + 1.0, None)
        np.add(step, 1.0, out=step)


def load_update_kernels(optimizer: Optimizer) -> None:
    """Run each param group's update once, on scratch arrays of one element, so that the kernel a step will run
    is compiled (or loaded from Numba's cache) now, not inside step 1.

    Why: the route planner measures the process after tracing the forward and backward passes, which load every
    kernel but the optimizer's. Adam's kernel compiled at step 1 added ~17 MiB of RSS the plan never counted
    (vit-base streaming peaked at 451 MiB against a 434 MiB plan in a 450 MiB cgroup: the cache had no entry
    for it, as after any edit of kernels/adam.py); loaded from a warm cache it is ~0.6 MiB. Nothing of the
    optimizer changes: not its state, its parameters or hyperparameters, nor the kernel call counts (a
    warm-up is no update). An optimizer without update_flat has no kernel to load here.
    """
    if getattr(type(optimizer), "update_flat", None) is Optimizer.update_flat:
        return
    from ..kernels import calls_unchanged

    with calls_unchanged():
        for group in optimizer.param_groups:
            for dtype in {np.dtype(p.dtype) for p in group["params"] if p.requires_grad}:
                param, grad = np.zeros(1, dtype), np.zeros(1, dtype)
                state = {k: np.full(1, v, dtype) for k, v in optimizer.state_init(group).items()}
                state.update({k: np.full((), v, np.float64) for k, v in optimizer.scalar_state_init(group).items()})
                optimizer.update_flat(group, param, grad, state, 1.0, None)


__all__ = ["StateKinds", "state_kinds", "read_state", "put_state", "write_state", "update", "load_update_kernels"]
