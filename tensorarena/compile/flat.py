"""Parameters, gradients and optimizer state in flat persistent buffers, one segment per param group.

The fused route updates a whole parameter group with ONE optimizer kernel call, which
needs each group's parameters (and their gradients and every per-element optimizer
state array) to be consecutive pieces of one flat array. `FlatState` copies them
there once and rebinds every parameter, gradient buffer and state entry to a view of
its piece, so the module, `state_dict`, eval and checkpoints keep seeing the live,
trained values through the same objects they always used.

With `keep_grads=False` (FusedStep's update_in_backward, its default without clipping) there is
no flat gradient buffer:
the step updates each parameter (`update_param`, the same kernel on its own pieces, as the
eager optimizer does) the moment backward completes its gradient, which then dies in the
step's slab. That saves one parameter-sized buffer (327 MiB on ViT-Base).

Only parameters that require grad are laid out (a frozen one keeps its values and optimizer
state where they are and is not updated, as torch's optimizers skip a parameter without a
gradient), and each optimizer group is split into FlatGroups of parameters of one dtype whose scalar
state (the "step" count, NAdam's mu_product) is equal: a parameter unfrozen mid-run goes on with its
own, smaller count, and a float64 layer in a float32 model's one group gets a flat group of its own.
A layout describes the optimizer and the parameters' dtypes as they were when built; `FlatState.stale()`
says when it no longer does (a group added, a parameter frozen, momentum switched on, model.double()),
and a new FlatState built then takes the values over from the old one's buffers (cast to the new dtype).
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
import weakref
from typing import Any, Callable, Iterable

import numpy as np

from ..memory.arena import StaleTensorError
from ..memory.pool import aligned_empty, return_freed_memory
from ..nn.module import Module
from ..optim.optimizer import Optimizer, raise_partly_applied
from ..tensor import Tensor
from .trace import UnsupportedOptimizerError


log = logging.getLogger(__name__)

# Bytes of replaced arrays between malloc_trim calls while binding. At 64 MiB a small model's old arrays were all
# still resident beside the new flat ones: vit-tiny's flattening (21 MiB of parameters) peaked 4.5 MiB above its
# fused plan, before the slab existed. At 8 MiB at most ~8 MiB of old arrays overlap (vit-tiny: 300 MiB, under it).
_RELEASE_EVERY = 8 << 20
# Every FlatGroup alive: a new FlatState copies values out of an older layout's buffers (see _let_go).
_LIVE: "weakref.WeakSet[FlatGroup]" = weakref.WeakSet()
# Guards _LIVE's update and its snapshot: a layout built in one thread while another thread's was read raised
# "RuntimeError: Set changed size during iteration" (tests/test_threads_hunt.py).
_LIVE_LOCK = threading.Lock()
# FlatState.generation values, unique across FlatStates: a new layout never reuses an old one's, so
# what was prepared against the old layout (captured.Capture.prepared) cannot pass for current.
_GENERATIONS = itertools.count(1)
_requires_grad = operator.attrgetter("requires_grad")


def _stored_step(state: dict) -> float:
    step = state.get("step")
    return 0.0 if step is None else float(step)


def _start_value(state: dict | None, kind: str, init: dict[str, float],
                 start_step: Callable[[dict], float]) -> float:
    """A parameter's scalar state `kind` as the layout adopts it: its current value, or (none yet) the
    optimizer's starting value, as Optimizer._init_state would create it; the step count as
    `start_step(state)` gives it (Optimizer.continued_step: SGD restarts it for a new momentum buffer)."""
    if kind == "step":
        return start_step(state or {})
    current = state.get(kind) if state else None
    return init[kind] if current is None else float(current)


_DTYPE_CHANGED = "model.to(dtype), double() or float() since the layout"


def _names_by_dtype(params: list[Tensor], names: list[str]) -> str:
    """"float32 (a, b, ...) and float64 (c)": each dtype with its parameters, the fewest first (the odd ones)."""
    by_dtype: dict[str, list[str]] = {}
    for p, name in zip(params, names):
        by_dtype.setdefault(str(p.dtype), []).append(name)
    parts = [f"{dtype} ({', '.join(group[:3])}{', ...' if len(group) > 3 else ''})"
             for dtype, group in sorted(by_dtype.items(), key=lambda item: len(item[1]))]
    return " and ".join(parts)


def _aligned_zeros(count: int, dtype) -> np.ndarray:
    out = aligned_empty(count, dtype)
    out.fill(0)
    return out


class FlatGroup:
    """One optimizer param group laid out flat: params, grads, state kinds and step counts."""

    def __init__(self, group: dict, params: list[Tensor], names: list[str], state_init: dict[str, float],
                 scalar_init: dict[str, float], keep_grads: bool = True) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:  # FlatState splits a group by dtype; this guards a FlatGroup built by hand
            raise TypeError(f"a flat group must hold one dtype, got {_names_by_dtype(params, names)}; lay each "
                            f"dtype out as a flat group of its own")
        self.group = group
        self.params = params
        self.names = names
        self.dtype = np.dtype(dtypes.pop())
        sizes = [p.data.size for p in params]
        self.segments = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(self.segments[-1])
        # Aligned like the slab (memory/pool.aligned_bytes): the update kernels stream these.
        self.param = aligned_empty(total, self.dtype)
        self.grad = _aligned_zeros(total, self.dtype) if keep_grads else None
        # Filled piece by piece in bind(), while the old per-parameter arrays are handed back: a
        # full-size np.full here made flattening ViT-Base hold old and new copies at once, and that
        # moment (not the training step) was the process's peak RSS.
        self.state = {kind: aligned_empty(total, self.dtype) for kind in state_init}
        self.state_fill = dict(state_init)
        # Per-parameter scalars ("step", NAdam's "mu_product"...): one float64 per parameter, each
        # parameter's state entry a 0-d view, all equal within a group (the group updates as one).
        self.scalar_init = {"step": 0.0, **scalar_init}
        self.scalars = {kind: np.full(len(params), fill, np.float64) for kind, fill in self.scalar_init.items()}
        self.steps = self.scalars["step"]
        self.uniform = True  # every scalar kind equal over the parameters (bind checks it)
        self._param_views = [self._piece(self.param, i) for i in range(len(params))]
        self._grad_views = [self._piece(self.grad, i) if keep_grads else None for i in range(len(params))]
        self._state_views = {kind: [self._piece(flat, i) for i in range(len(params))]
                             for kind, flat in self.state.items()}
        self._scalar_views = {kind: [flat[i:i + 1].reshape(()) for i in range(len(params))]
                              for kind, flat in self.scalars.items()}
        # What update_flat sees: the flat state arrays and parameter 0's scalars (copied to the rest after).
        self.update_state = dict(self.state)
        self.update_state.update({kind: views[0] for kind, views in self._scalar_views.items() if kind != "step"})
        # What update_param(i) sees: parameter i's own pieces and scalars.
        self._param_states = [{**{kind: views[i] for kind, views in self._state_views.items()},
                               **{kind: views[i] for kind, views in self._scalar_views.items() if kind != "step"}}
                              for i in range(len(params))]

    def _piece(self, flat: np.ndarray, i: int) -> np.ndarray:
        return flat[self.segments[i]:self.segments[i + 1]].reshape(self.params[i].shape)

    @property
    def nbytes(self) -> dict[str, int]:
        out = {"params": self.param.nbytes, "grads": self.grad.nbytes if self.grad is not None else 0,
               "scalars": sum(flat.nbytes for flat in self.scalars.values())}
        out.update({f"state.{kind}": flat.nbytes for kind, flat in self.state.items()})
        return out

    def bind(self, optimizer_state: dict, start_step: Callable[[dict], float] = _stored_step) -> None:
        """Copy current values into the flat pieces (where they are not there already) and point everything at them.

        The replaced arrays go back to the operating system every ~64 MiB, so flattening never
        holds much more than one copy of the model and its state. `start_step(state)`: the step
        count a parameter's update goes on from (Optimizer.continued_step for this group).
        """
        released = 0
        for i, p in enumerate(self.params):
            if released > _RELEASE_EVERY:
                return_freed_memory()
                released = 0
            view = self._param_views[i]
            if p._data is not view:
                if getattr(p._arena, "on_disk", False):
                    # Another trainer's streaming route holds it (a placeholder array here): copied, its one
                    # zero spread over the whole parameter and this trainer trained from zeros, silently (a
                    # helper's hunt). What the eager route says in the same spot.
                    from ..stream.on_disk import ON_DISK_MESSAGE

                    raise StaleTensorError(f"{self.names[i]}: {ON_DISK_MESSAGE}")
                if p._data.shape != view.shape:  # never broadcast another array over the parameter
                    raise ValueError(f"{self.names[i]} holds an array of shape {p._data.shape} but its flat piece "
                                     f"is {view.shape}; the layout is stale, build a new FlatState")
                if p._data.dtype != self.dtype:
                    # np.copyto would cast it back silently, undoing model.double() / float(): FlatState.stale
                    # reports it, and a new layout in the new dtype is what takes it.
                    raise TypeError(f"{self.names[i]} is {p._data.dtype} but its flat group is {self.dtype}; the "
                                    f"layout is stale ({_DTYPE_CHANGED}), build a new FlatState")
                np.copyto(view, p._data)
                released += p._data.nbytes
                p.data = view
            p._grad_buffer = self._grad_views[i]
            state = optimizer_state[p]
            # Read before the state arrays are bound: SGD's starting step depends on whether a buffer was there.
            start = {kind: _start_value(state, kind, self.scalar_init, start_step) for kind in self._scalar_views}
            for kind, views in self._state_views.items():
                current = state.get(kind)
                if current is not views[i]:
                    if current is not None:
                        np.copyto(views[i], current)
                        released += getattr(current, "nbytes", 0)
                    else:
                        views[i].fill(self.state_fill[kind])  # fresh state
                    state[kind] = views[i]
            for kind, views in self._scalar_views.items():
                if state.get(kind) is not views[i]:
                    views[i][...] = start[kind]
                    state[kind] = views[i]
        # The layout split the group by these values; a rebinding (a loaded state dict) may bring unequal ones.
        self.uniform = all(not flat.size or bool(np.all(flat == flat[0])) for flat in self.scalars.values())

    def uneven_kinds(self) -> list[str]:
        """The scalar kinds whose values differ between this group's parameters."""
        return [kind for kind, flat in self.scalars.items() if flat.size and not np.all(flat == flat[0])]

    def update_param(self, i: int, optimizer: Optimizer, grad: np.ndarray) -> None:
        """Parameter i's update from its complete gradient: one kernel on its own pieces with step + 1, then
        step += 1 (not before: a kernel that raises leaves the count as it was)."""
        step = self._scalar_views["step"][i]
        count = float(step) + 1.0
        optimizer.update_flat(self.group, self._param_views[i], grad, self._param_states[i], count, None)
        step[()] = count

    def prepare_param(self, i: int, optimizer: Optimizer, grad: np.ndarray) -> Callable[[], None]:
        """`update_param(i, optimizer, grad)` on this very grad array, prepared once (Optimizer.prepare_flat):
        what a captured fused step runs for parameter i on every step."""
        step = self._scalar_views["step"][i]
        update = optimizer.prepare_flat(self.group, self._param_views[i], grad, self._param_states[i])

        def run() -> None:
            count = float(step) + 1.0
            update(count)
            step[()] = count  # only once the kernel ran, as update_param
        return run

    def update(self, optimizer: Optimizer) -> None:
        """The whole group's update: one kernel over the flat buffers with step + 1, then the counts stored
        (all equal: the group was laid out so, and `uniform` says they still are)."""
        count = float(self.steps[0]) + 1.0
        optimizer.update_flat(self.group, self.param, self.grad, self.update_state, count, self.segments)
        self.steps.fill(count)
        for kind, flat in self.scalars.items():
            if kind != "step":
                flat[1:] = flat[0]  # parameter 0's scalar was the group's; keep every entry equal

    def buffers(self) -> list[np.ndarray]:
        """Every array this group owns."""
        out = [self.param, *self.state.values(), *self.scalars.values()]
        return out + [self.grad] if self.grad is not None else out

    def is_bound(self, optimizer_state: dict) -> bool:
        for i, p in enumerate(self.params):
            if p._data is not self._param_views[i] or p._grad_buffer is not self._grad_views[i]:
                return False
            state = optimizer_state.get(p)
            if state is None:
                return False
            if any(state.get(kind) is not views[i] for kind, views in self._scalar_views.items()):
                return False
            if any(state.get(kind) is not views[i] for kind, views in self._state_views.items()):
                return False
        return True


class FlatState:
    """Every parameter group of `optimizer` laid out flat; see the module docstring."""

    def __init__(self, model: Module, optimizer: Optimizer, *, keep_grads: bool = True,
                 leave_out: Iterable[Tensor] = ()) -> None:
        """`leave_out`: parameters not to lay out although they require grad (as frozen ones are not), e.g.
        those a traced step gave no gradient (the eager optimizer skips them too)."""
        for method in ("state_init", "scalar_state_init", "update_flat"):
            if not callable(getattr(optimizer, method, None)):
                raise TypeError(f"{type(optimizer).__name__} has no {method}(); the fused route needs an optimizer "
                                f"with a flat-buffer update (every tensorarena.optim optimizer has one)")
        if isinstance(optimizer, Optimizer) and type(optimizer).step is not Optimizer.step:
            # The fused route runs update_flat and never calls step(): an override (skipping updates, logging,
            # a step of one's own) was silently bypassed. UnsupportedOpError: fallback_to_eager applies.
            raise UnsupportedOptimizerError(
                f"{type(optimizer).__name__} overrides step(), which the fused route never calls (it runs the "
                f"optimizer's update_flat over flat buffers); train it with route='eager', or pass "
                f"fallback_to_eager=True")
        self.optimizer = optimizer
        self.keep_grads = keep_grads
        self._continued_step = getattr(optimizer, "continued_step", None)
        self._names = {id(p): name for name, p in model.named_parameters()}
        left_out = {id(p) for p in leave_out}
        # An older layout of these values, if any, copied out of below (_let_go). Its groups are held here until
        # then: a garbage collection while this layout is built (an old layout in a reference cycle) would free
        # their buffers, the new ones could be allocated at the same addresses, and _let_go would then take this
        # layout's own parameters and gradients for the old one's and detach them (tests/test_fused_programs_hunt).
        with _LIVE_LOCK:
            older = list(_LIVE)
        superseded = _bounds(older)
        self.groups: list[FlatGroup] = []
        self._group_index: list[int] = []  # each FlatGroup's position in optimizer.param_groups (several may share one)
        for index, group in enumerate(optimizer.param_groups):
            state_init = optimizer.state_init(group)
            scalar_init = optimizer.scalar_state_init(group)
            trainable = [p for p in group["params"] if p.requires_grad and id(p) not in left_out]
            for params in self._split(index, trainable, scalar_init):
                self.groups.append(FlatGroup(group, params, [self.name(p) for p in params], state_init,
                                             scalar_init, keep_grads))
                self._group_index.append(index)
        self._layout = [self._describe(group) for group in optimizer.param_groups]
        # Changes with every rebinding (ensure_bound): what was prepared against the old binding is stale after one.
        self.generation = next(_GENERATIONS)
        self._where = {id(p): (g, i) for g in self.groups for i, p in enumerate(g.params)}
        self._params = [p for group in optimizer.param_groups for p in group["params"] if id(p) in self._where]
        self._views = [(p, g._param_views[i]) for g in self.groups for i, p in enumerate(g.params)]  # data_rebound
        self.bind()
        with _LIVE_LOCK:
            _LIVE.update(self.groups)
        self._let_go(superseded, model)
        del older  # now they may go
        return_freed_memory()

    def name(self, p: Tensor) -> str:
        """`p`'s name in the model, or "<not in model>"."""
        return self._names.get(id(p), "<not in model>")

    def _split(self, index: int, params: list[Tensor], scalar_init: dict[str, float]) -> list[list[Tensor]]:
        """Param group `index`'s `params` in runs of one dtype and equal scalar state ("step", ...), in order of
        first appearance: one kernel call updates a FlatGroup, over one flat array with one step count.
        Unequal counts come from parameters that missed steps (frozen, or added to the optimizer later),
        which torch's optimizers count on their own; a group of float32 and float64 parameters (which the
        eager optimizer, as torch's, updates each in its own dtype) takes one kernel call per dtype."""
        init = {"step": 0.0, **scalar_init}
        start = self._start_step(self.optimizer.param_groups[index])
        runs: dict[tuple, list[Tensor]] = {}
        for p in params:
            state = self.optimizer.state.get(p)
            key = (p.dtype.str, *(_start_value(state, kind, init, start) for kind in init))
            runs.setdefault(key, []).append(p)
        dtypes = {key[0] for key in runs}
        if len(dtypes) > 1:
            log.info("fused route: param group %d holds %s: laid out as one flat group per dtype (one update "
                     "kernel call each)", index, _names_by_dtype(params, [self.name(p) for p in params]))
        return list(runs.values())

    def _describe(self, group: dict) -> tuple:
        """What the layout of `group` depends on, as `stale` compares it: its parameters, which of them
        require grad, and its state kinds (arrays and scalars)."""
        params = group["params"]
        return (tuple(map(id, params)), tuple(map(_requires_grad, params)), self._kinds(group))

    def _kinds(self, group: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(self.optimizer.state_init(group)), tuple(self.optimizer.scalar_state_init(group))

    def stale(self) -> str | None:
        """Why this layout no longer matches the optimizer (a reason for a log line), or None if it does.

        Checked before every fused step; a reason means: build a new FlatState (it takes the values over)
        and trace again. About 20 us for ViT-Base's 152 parameters in two groups on a busy 2-core machine, 6
        of them the dtype check (tests/test_flat_layout.py)."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self._layout):
            return (f"the optimizer has {len(groups)} param groups, {len(self._layout)} when its state was laid "
                    f"out (add_param_group)")
        for index, (group, (ids, trainable, kinds)) in enumerate(zip(groups, self._layout)):
            params = group["params"]
            if tuple(map(id, params)) != ids:
                return f"the parameters of param group {index} changed"
            if tuple(map(_requires_grad, params)) != trainable:
                changed = [f"{self.name(p)} ({'unfrozen' if p.requires_grad else 'frozen'})"
                           for p, was in zip(params, trainable) if p.requires_grad != was]
                return f"requires_grad changed for {', '.join(changed[:5])}{'...' if len(changed) > 5 else ''}"
            now = self._kinds(group)
            # A kind the settings no longer ask for stays laid out, as torch keeps a momentum buffer while the
            # momentum is 0 (a CyclicLR/OneCycleLR cycling it from 0 laid out and traced again at each crossing).
            if now != kinds and not (set(now[0]) <= set(kinds[0]) and now[1] == kinds[1]):
                return (f"param group {index}'s optimizer state is now {list(now[0] + now[1])}, was "
                        f"{list(kinds[0] + kinds[1])} (a setting such as momentum or amsgrad changed, or a state "
                        f"dict with other settings was loaded)")
        converted = self._converted()
        if converted:
            return (f"the dtype of {', '.join(converted[:5])}{'...' if len(converted) > 5 else ''} changed "
                    f"({_DTYPE_CHANGED}); its values and optimizer state move to a layout in the new dtype")
        # Looked at, not taken from `uniform`: an edit in place (opt.state[p]["step"][...] = 0, as a torch user
        # restarts bias correction) keeps every array bound, and the group's one kernel then gave all parameters
        # parameter 0's count, or overwrote the edited one. A few comparisons of float64 vectors per group.
        uneven = []
        for i, g in enumerate(self.groups):
            kinds = g.uneven_kinds()
            g.uniform = not kinds
            if kinds:
                uneven.append((i, kinds))
        if uneven:
            return (f"the parameters of flat group {uneven[0][0]} no longer share their {uneven[0][1]} values (a "
                    f"loaded or edited optimizer state)")
        return None

    def _converted(self) -> list[str]:
        """"name (float32 -> float64)" for each laid-out parameter whose dtype is no longer its flat group's."""
        # `is not` first: a dtype is almost always the very object it was, and `!=` alone doubled stale()'s time.
        return [f"{name} ({g.dtype} -> {p._data.dtype})" for g in self.groups for p, name in zip(g.params, g.names)
                if p._data.dtype is not g.dtype and p._data.dtype != g.dtype]

    def _let_go(self, superseded: list[tuple[int, int]], model: Module) -> None:
        """Copy whatever still lives in an older layout's buffers out of them, so those buffers can go once
        their FlatState does: a frozen parameter's values and state, a state kind this layout dropped
        (momentum switched off: kept, as the eager optimizer keeps it), gradients."""
        if not superseded:
            return
        params = {id(p): p for p in [*model.parameters(), *(q for g in self.optimizer.param_groups
                                                              for q in g["params"])]}
        for p in params.values():
            if _inside(p._data, superseded):
                p.data = p._data.copy()
            if p._grad_buffer is not None and _inside(p._grad_buffer, superseded):
                p._grad_buffer = None  # a reusable buffer only: autograd makes another when needed
            if p.grad is not None and _inside(p.grad, superseded):
                own = p._grad_buffer if id(p) in self._where and p._grad_buffer is not None else None
                if own is not None:
                    np.copyto(own, p.grad)
                    p.grad = own
                else:
                    p.grad = p.grad.copy()
            state = self.optimizer.state.get(p)
            for kind, value in (state or {}).items():
                if isinstance(value, np.ndarray) and _inside(value, superseded):
                    state[kind] = value.copy()

    def _start_step(self, group: dict) -> Callable[[dict], float]:
        """The step count a parameter of `group` goes on from, given its state (Optimizer.continued_step)."""
        if self._continued_step is None:
            return _stored_step
        return lambda state: self._continued_step(state, group)

    def bind(self) -> None:
        for g in self.groups:
            g.bind(self.optimizer.state, self._start_step(g.group))

    def data_rebound(self) -> bool:
        """Whether a parameter's .data was rebound away from its flat piece (a forward's max-norm constraint): the
        one check a step makes after its forward, 6 us for ViT-Base's 152 parameters where ensure_bound takes 120."""
        return any(p._data is not view for p, view in self._views)

    def ensure_bound(self) -> bool:
        """Re-adopt values someone rebound (e.g. optimizer.load_state_dict replaced step arrays, and its
        param-group dicts, where schedules now write the lr); True if it had to."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self._layout):
            raise RuntimeError(f"the flat layout is stale ({self.stale()}); build a new FlatState")
        regrouped = False
        for g, index in zip(self.groups, self._group_index):
            if g.group is not groups[index]:
                g.group, regrouped = groups[index], True
        if not regrouped and all(g.is_bound(self.optimizer.state) for g in self.groups):
            return False
        self.bind()
        self.generation = next(_GENERATIONS)
        return True

    def params(self) -> list[Tensor]:
        """Every flattened parameter, in the optimizer's order (the same list each call)."""
        return self._params

    def missing_grads(self, received: set[int] | None = None) -> list[str]:
        """Names of flattened parameters that received no gradient (no .grad, or id not in `received`)."""
        if received is None:
            return [name for g in self.groups for p, name in zip(g.params, g.names) if p.grad is None]
        return [name for g in self.groups for p, name in zip(g.params, g.names) if id(p) not in received]

    def owns(self, p: Tensor) -> bool:
        """Whether `p` is one of the flattened parameters."""
        return id(p) in self._where

    def update_param(self, p: Tensor, grad: np.ndarray) -> None:
        """Update flattened parameter `p` (see `owns`) from its complete gradient now."""
        group, i = self._where[id(p)]
        if grad.dtype != group.dtype:
            grad = grad.astype(group.dtype)  # as a leaf's .grad keeps its parameter's precision
        group.update_param(i, self.optimizer, grad)

    def prepare_update(self, p: Tensor, grad: np.ndarray) -> Callable[[], None]:
        """`update_param(p, grad)` prepared once for this grad array (FlatGroup.prepare_param); a grad of
        another dtype than the group's is cast on each call, as update_param casts it."""
        group, i = self._where[id(p)]
        if grad.dtype != group.dtype:
            return lambda: self.update_param(p, grad)
        return group.prepare_param(i, self.optimizer, grad)

    def update(self, index: int | None = None) -> None:
        """The optimizer step: one `update_flat` kernel call per group over its flat buffers.

        A group whose parameters' step counts came apart after the layout (a loaded state, see `stale`)
        is updated parameter by parameter, each with its own count. If an update fails after another
        one succeeded, the step is partly applied: the error says so (a RuntimeError, so that the
        out-of-memory fallback does not redo the step on top of it; a BaseException such as
        KeyboardInterrupt goes on as itself with a note). `index`: the step's number, for the message."""
        done = updated = 0
        try:
            for g in self.groups:
                if g.uniform:
                    g.update(self.optimizer)
                    updated += len(g.params)
                else:
                    log.warning("fused route: flat group %d's parameters have unequal %s; updating them one "
                                "kernel call each until the state is laid out again", done, g.uneven_kinds())
                    for i in range(len(g.params)):
                        g.update_param(i, self.optimizer, g._grad_views[i])
                        updated += 1
                done += 1
        except BaseException as exc:
            if not updated:
                raise
            raise_partly_applied(exc, self._partly_applied(index, done, updated, exc))

    def _partly_applied(self, index: int | None, done: int, updated: int, exc: BaseException) -> str:
        """compile/step.py partly_applied's wording, for a failure between the flat update's kernel calls."""
        step = "this step" if index is None else f"step {index}"
        return (f"{step} failed in the optimizer update after {done} of {len(self.groups)} flat groups "
                f"({updated} of {len(self._params)} parameters) were already updated: the step is partly "
                f"applied, so it is not redone. Restore the last checkpoint; {type(exc).__name__}: {exc}")

    def nbytes(self) -> dict[str, int]:
        """Persistent bytes by kind (params, grads, steps, state.<kind>) summed over groups."""
        total: dict[str, int] = {}
        for g in self.groups:
            for kind, n in g.nbytes.items():
                total[kind] = total.get(kind, 0) + n
        return total


def _bounds(groups: list[FlatGroup]) -> list[tuple[int, int]]:
    """(first byte, end) of every buffer of `groups` (valid while the caller holds them)."""
    return [(a.ctypes.data, a.ctypes.data + a.nbytes) for g in groups for a in g.buffers() if a.size]


def _inside(a: Any, bounds: list[tuple[int, int]]) -> bool:
    """Whether array `a` starts inside one of `bounds` (a view of such a buffer)."""
    if not isinstance(a, np.ndarray) or not a.size:
        return False
    start = a.ctypes.data
    return any(lo <= start < hi for lo, hi in bounds)
