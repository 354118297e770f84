"""Optimizer base: parameter groups, lazy persistent state, zero_grad, state_dict (torch semantics).

Optimizer state is persistent memory (DESIGN.md): it is allocated with plain
NumPy on the heap, never from an arena, even when `step()` runs inside an open
step arena, and updates happen in place so a parameter's `.data` array keeps
its identity and address for the whole run. Per-step temporaries come from a
small scratch workspace the optimizer owns and reuses every step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Iterable

import numpy as np

from ..autograd import enable_grad
from ..tensor import SUPPORTED_FLOATS, Tensor

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]


class Optimizer:
    """Base class of optimizers: holds `param_groups`, `defaults` and per-parameter `state`."""

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self._check_hyperparams(self.defaults)
        # Keyed by the Parameter itself (hashed by identity), created lazily at its first step.
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        # dtype -> flat scratch array shared by all parameters (one update runs at a time),
        # and the per-parameter views into it, so a step allocates no array memory.
        self._workspace: dict[np.dtype, np.ndarray] = {}
        self._scratch_views: dict[Tensor, tuple[np.ndarray, ...]] = {}

        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got a single {type(params).__name__}; wrap it in a list")
        param_groups = list(params)
        if not param_groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    # -- hooks for subclasses ------------------------------------------------------
    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        """Raise ValueError naming any invalid hyperparameter in `group` (subclasses extend)."""

    # -- groups --------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters (with optional per-group hyperparameters) to optimize."""
        if not isinstance(param_group, dict):
            raise TypeError(f"a param group must be a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        if "params" not in group:
            raise ValueError("a param group must have a 'params' entry (the parameters to optimize)")
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of tensors in sets will change between runs; use a list instead")
        params = list(params)
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but param {i} of the group is "
                                f"{type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"can't optimize a non-leaf Tensor (param {i} of the group, shape {p.shape})")
            if p.dtype not in SUPPORTED_FLOATS:
                raise TypeError(f"can only optimize float32/float64 tensors, param {i} has dtype {p.dtype}")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("optimizer contains a parameter group with duplicate parameters")
        group["params"] = params
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        self._check_hyperparams(group)
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in existing for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    # -- gradients -----------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: `grad = None` (the buffer is kept for reuse) or zero-filled in place."""
        for p in self._params():
            if set_to_none:
                p.grad = None  # the Tensor keeps its grad buffer; the next backward refills it
            elif p.grad is not None:
                p.grad.fill(0)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the parameters once from their `.grad`; returns closure() if given."""
        raise NotImplementedError

    def _run_closure(self, closure: Callable[[], Any] | None) -> Any:
        if closure is None:
            return None
        with enable_grad():
            return closure()

    def _grad_of(self, p: Tensor) -> np.ndarray | None:
        """`p.grad` checked against `p` (a wrong shape would broadcast silently into the update)."""
        g = p.grad
        if g is not None and g.shape != p.shape:
            raise ValueError(f"gradient shape {g.shape} does not match parameter shape {p.shape}")
        return g

    def _scratch(self, p: Tensor, count: int) -> tuple[np.ndarray, ...]:
        """`count` persistent scratch arrays shaped like `p`, views into a shared heap workspace."""
        views = self._scratch_views.get(p)
        if views is not None and len(views) >= count:
            return views
        data = p.data
        need = count * data.size
        work = self._workspace.get(data.dtype)
        if work is None or work.size < need:
            # Grow once to fit the largest parameter seen; every view handed out before is dropped.
            work = self._workspace[data.dtype] = np.empty(max(need, 1), data.dtype)
            self._scratch_views.clear()
        views = tuple(work[i * data.size:(i + 1) * data.size].reshape(data.shape) for i in range(count))
        self._scratch_views[p] = views
        return views

    # -- persistence ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch-format state: {"state": {index: {...}}, "param_groups": [{..., "params": [index]}]}.

        Arrays are the live state arrays (not copies), as in torch: serialise or copy
        them before the next step if you need a snapshot.
        """
        index_of: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index_of.setdefault(id(p), len(index_of))
            packed["params"] = [index_of[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index_of[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index_of}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (copied to the heap); validates groups and shapes."""
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise ValueError(f"optimizer state dict has no {key!r} entry; got keys {sorted(state_dict)}")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} parameter groups but the optimizer has "
                             f"{len(self.param_groups)}")
        id_map: dict[int, Tensor] = {}
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"parameter group {gi} of the loaded state dict has {len(saved['params'])} "
                                 f"parameters but the optimizer's group {gi} has {len(group['params'])}")
            for index, p in zip(saved["params"], group["params"]):
                id_map[int(index)] = p

        entries: list[tuple[Tensor, int, dict[str, Any]]] = []
        for index, entry in state_dict["state"].items():
            p = id_map.get(int(index))
            if p is None:
                raise ValueError(f"loaded state dict has state for parameter index {index}, which is in no "
                                 f"parameter group (indices {sorted(id_map)})")
            self._check_param_state(p, int(index), entry)
            entries.append((p, int(index), entry))

        new_groups = []
        for saved, group in zip(saved_groups, self.param_groups):
            merged = dict(group)
            merged.update({k: v for k, v in saved.items() if k != "params"})
            if isinstance(merged.get("betas"), list):  # JSON turns tuples into lists
                merged["betas"] = tuple(merged["betas"])
            self._check_hyperparams(merged)
            new_groups.append(merged)

        # Everything is validated: commit (a failed load leaves the optimizer untouched).
        new_state = {p: self._copy_param_state(p, entry) for p, _, entry in entries}
        self.param_groups[:] = new_groups
        self.state = defaultdict(dict, new_state)

    @staticmethod
    def _is_array(value: Any) -> bool:
        return isinstance(value, (np.ndarray, list)) or hasattr(value, "__array__")

    def _check_param_state(self, p: Tensor, index: int, entry: dict[str, Any]) -> None:
        if not isinstance(entry, dict):
            raise ValueError(f"state of parameter {index} must be a dict, got {type(entry).__name__}")
        for key, value in entry.items():
            if key == "step":
                _step_array(value)
            elif self._is_array(value):
                shape = np.shape(value)
                if shape != p.shape:
                    raise ValueError(f"state {key!r} of parameter {index} has shape {shape} but the "
                                     f"parameter has shape {p.shape}")

    def _copy_param_state(self, p: Tensor, entry: dict[str, Any]) -> dict[str, Any]:
        old = self.state.get(p, {})
        out: dict[str, Any] = {}
        for key, value in entry.items():
            if key == "step":
                out[key] = _step_array(value)
            elif self._is_array(value):
                prev = old.get(key)
                if isinstance(prev, np.ndarray) and prev.shape == p.shape and prev.dtype == p.dtype:
                    np.copyto(prev, np.asarray(value))  # keep the existing heap buffer (a plan may hold it)
                    out[key] = prev
                else:
                    out[key] = np.array(value, dtype=p.dtype, copy=True)  # heap, owned, never aliased
            else:
                out[key] = value
        return out

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(k for k in group if k != "params"):
                lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)


def _step_array(value: Any) -> np.ndarray:
    """A step count as a 0-d float64 heap array (mutable in place, like torch's step tensor)."""
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"state 'step' must be a single number, got shape {array.shape}")
    step = float(array.reshape(()))  # 1-element arrays too: np.ascontiguousarray makes 0-d arrays 1-d
    if not (math.isfinite(step) and step >= 0 and step == int(step)):
        raise ValueError(f"state 'step' must be a non-negative whole number, got {value!r}")
    return np.array(step, dtype=np.float64)


def _check_number(name: str, value: Any, *, low: float = 0.0, high: float | None = None,
                  high_inclusive: bool = True, what: str | None = None) -> None:
    """ValueError naming `value` unless low <= value (<=|<) high; NaN and non-numbers fail too."""
    label = what or f"{name} value"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"Invalid {label}: {value!r} (expected a number)")
    ok = low <= value
    if high is not None:
        ok = ok and (value <= high if high_inclusive else value < high)
    if not ok:
        raise ValueError(f"Invalid {label}: {value}")
