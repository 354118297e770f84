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
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..memory.pool import aligned_empty, return_freed_memory
from ..nn.module import Module
from ..optim.optimizer import Optimizer
from ..tensor import Tensor


_RELEASE_EVERY = 64 << 20  # bytes of replaced arrays between malloc_trim calls while binding


def _aligned_zeros(count: int, dtype) -> np.ndarray:
    out = aligned_empty(count, dtype)
    out.fill(0)
    return out


class FlatGroup:
    """One optimizer param group laid out flat: params, grads, state kinds and step counts."""

    def __init__(self, group: dict, params: list[Tensor], names: list[str], state_init: dict[str, float],
                 scalar_init: dict[str, float], keep_grads: bool = True) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise TypeError(f"a fused param group must hold one dtype, got {sorted(map(str, dtypes))} in the "
                            f"group with {names[:3]}...; put float32 and float64 parameters in separate groups")
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

    def bind(self, optimizer_state: dict) -> None:
        """Copy current values into the flat pieces (where they are not there already) and point everything at them.

        The replaced arrays go back to the operating system every ~64 MiB, so flattening never
        holds much more than one copy of the model and its state.
        """
        released = 0
        for i, p in enumerate(self.params):
            if released > _RELEASE_EVERY:
                return_freed_memory()
                released = 0
            view = self._param_views[i]
            if p._data is not view:
                np.copyto(view, p._data)
                released += p._data.nbytes
                p.data = view
            p._grad_buffer = self._grad_views[i]
            state = optimizer_state[p]
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
                current = state.get(kind)
                if current is not views[i]:
                    views[i][...] = self.scalar_init[kind] if current is None else float(current)
                    state[kind] = views[i]
        for kind, flat in self.scalars.items():
            if flat.size and not np.all(flat == flat[0]):
                raise ValueError(
                    f"the parameters of one group have different {kind!r} values {sorted(set(flat.tolist()))[:4]}; "
                    f"the fused optimizer updates a group as one. Some parameters missed updates on the eager "
                    f"route (no gradient): keep training them with route='eager'")

    def update_param(self, i: int, optimizer: Optimizer, grad: np.ndarray) -> None:
        """Parameter i's update from its complete gradient: step += 1, then one kernel on its own pieces."""
        step = self._scalar_views["step"][i]
        np.add(step, 1.0, out=step)
        optimizer.update_flat(self.group, self._param_views[i], grad, self._param_states[i], float(step), None)

    def prepare_param(self, i: int, optimizer: Optimizer, grad: np.ndarray) -> Callable[[], None]:
        """`update_param(i, optimizer, grad)` on this very grad array, prepared once (Optimizer.prepare_flat):
        what a captured fused step runs for parameter i on every step."""
        step = self._scalar_views["step"][i]
        update = optimizer.prepare_flat(self.group, self._param_views[i], grad, self._param_states[i])

        def run() -> None:
            np.add(step, 1.0, out=step)
            update(float(step))
        return run

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

    def __init__(self, model: Module, optimizer: Optimizer, *, keep_grads: bool = True) -> None:
        for method in ("state_init", "scalar_state_init", "update_flat"):
            if not callable(getattr(optimizer, method, None)):
                raise TypeError(f"{type(optimizer).__name__} has no {method}(); the fused route needs an optimizer "
                                f"with a flat-buffer update (every tensorarena.optim optimizer has one)")
        self.optimizer = optimizer
        names = {id(p): name for name, p in model.named_parameters()}
        self.groups: list[FlatGroup] = []
        self._group_index: list[int] = []  # each FlatGroup's position in optimizer.param_groups
        for index, group in enumerate(optimizer.param_groups):
            params = list(group["params"])
            if not params:
                continue
            self.groups.append(FlatGroup(group, params, [names.get(id(p), "<not in model>") for p in params],
                                         optimizer.state_init(group), optimizer.scalar_state_init(group),
                                         keep_grads))
            self._group_index.append(index)
        # Counts every rebinding (ensure_bound): what was prepared against the old binding is stale after one.
        self.generation = 0
        self.keep_grads = keep_grads
        self._params = [p for g in self.groups for p in g.params]
        self._where = {id(p): (g, i) for g in self.groups for i, p in enumerate(g.params)}
        self.bind()
        return_freed_memory()

    def bind(self) -> None:
        for g in self.groups:
            g.bind(self.optimizer.state)

    def ensure_bound(self) -> bool:
        """Re-adopt values someone rebound (e.g. optimizer.load_state_dict replaced step arrays, and its
        param-group dicts, where schedules now write the lr); True if it had to."""
        groups = self.optimizer.param_groups
        regrouped = False
        for g, index in zip(self.groups, self._group_index):
            if g.group is not groups[index]:
                g.group, regrouped = groups[index], True
        if not regrouped and all(g.is_bound(self.optimizer.state) for g in self.groups):
            return False
        self.bind()
        self.generation += 1
        return True

    def params(self) -> list[Tensor]:
        """Every flattened parameter, in group order (the same list each call)."""
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

    def update(self) -> None:
        """The optimizer step: one `update_flat` kernel call per group over its flat buffers."""
        for g in self.groups:
            np.add(g.steps, 1.0, out=g.steps)
            self.optimizer.update_flat(g.group, g.param, g.grad, g.update_state, float(g.steps[0]), g.segments)
            for kind, flat in g.scalars.items():
                if kind != "step":
                    flat[1:] = flat[0]  # parameter 0's scalar was the group's; keep every entry equal

    def nbytes(self) -> dict[str, int]:
        """Persistent bytes by kind (params, grads, steps, state.<kind>) summed over groups."""
        total: dict[str, int] = {}
        for g in self.groups:
            for kind, n in g.nbytes.items():
                total[kind] = total.get(kind, 0) + n
        return total
