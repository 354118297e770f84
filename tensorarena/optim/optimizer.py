"""Optimizer base: parameter groups, lazy persistent state, zero_grad, state_dict (torch semantics).

Optimizer state is persistent memory (DESIGN.md): it is allocated with plain
NumPy on the heap, never from an arena, even when `step()` runs inside an open
step arena, and updates happen in place so a parameter's `.data` array keeps
its identity and address for the whole run. Per-step temporaries come from a
small scratch workspace the optimizer owns and reuses every step.

Every optimizer updates through one per-array API, so the eager step and a fused
route (one kernel call per parameter group over flat concatenated buffers) run the
same code: `state_init(group)` names the per-element state arrays and their fill
values, `scalar_state_init(group)` the extra 0-d float64 scalars (NAdam's
mu_product; "step" is always there and is not listed), and
`update_flat(group, param, grad, state, step, segments)` applies one update in
place with exactly one kernel call and no array allocation. A caller of
`update_flat` owns: creating the state (arrays filled per state_init, 0-d float64
scalars per scalar_state_init, a 0-d float64 step at `initial_step`), passing
the stored step count plus one and storing that count only once the call
returned, and passing `state` with exactly the state_init and scalar_state_init
keys. `update_flat` advances scalar state itself (in place, after its kernel
ran), so the eager step and a flat route keep it the same way. Either way an
update that raises leaves the counts as they were: an out-of-memory redo of the
step then uses the bias correction of the first try.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any, Callable, Iterable

import numpy as np

from ..autograd import enable_grad, increment_version
from ..kernels import choose, kernel
from ..tensor import SUPPORTED_FLOATS, Tensor


def _settings(group: dict[str, Any], *, on: bool) -> dict[str, Any]:
    """`group` with every switch on (bools True, zero numbers 0.5: momentum, amsgrad, centered) or off (bools
    False, numbers 0): what state_init keeps under some setting, or under every one (_check_state_keys)."""
    out = dict(group)
    for key, value in group.items():
        if key == "params":
            continue
        if isinstance(value, (bool, np.bool_)):
            out[key] = on
        elif isinstance(value, (int, float, np.integer, np.floating)):  # np.float32(0.9) set by hand too
            out[key] = (0.5 if value == 0 else value) if on else 0
    return out


class PartlyAppliedError(RuntimeError):
    """A step failed after it had updated some parameters: it must not be redone on top of itself, and its state
    is no step's (train/report.save_after_error keeps no checkpoint of it). A RuntimeError, as it was."""


def raise_partly_applied(exc: BaseException, message: str):
    """Re-raise `exc`, which stopped an update part-way, so that nothing redoes the step on top of itself: an
    Exception becomes a RuntimeError saying so (a MemoryError would make the out-of-memory fallback redo it), an
    interrupt (KeyboardInterrupt) goes on as itself with the message as a note. Call it inside the except block."""
    if not isinstance(exc, Exception):
        exc.add_note(message)
        raise exc
    raise PartlyAppliedError(message) from exc

log = logging.getLogger(__name__)

# What to do when a saved optimizer state's groups do not match this optimizer's (every loader's errors end so):
# the count names what differs, these say how to make them match.
GROUPS_HINT = ("; build the optimizer with the param groups of the run that saved it before loading (a state saved "
               "before add_param_group loads before the group is added, one saved after it once it is added)")
PARAMS_HINT = "; give each group the parameters of the saved run's group, in the same order"

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]] | Iterable[tuple[str, Tensor]]


class Optimizer:
    """Base class of optimizers: holds `param_groups`, `defaults` and per-parameter `state`."""

    # Group settings that make the class what it is, kept by load_state_dict whatever the state dict says (torch's
    # AdamW.__setstate__ does so for its decoupled decay: an Adam state dict loaded into AdamW switched it to L2).
    _class_settings: dict[str, Any] = {}

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self._check_hyperparams(self.defaults)
        # Keyed by the Parameter itself (hashed by identity), created lazily at its first step.
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        # dtype -> flat scratch array shared by all updates (one runs at a time), and the views
        # into it per (dtype, shape), so a step allocates no array memory, flat buffers included.
        self._workspace: dict[np.dtype, np.ndarray] = {}
        self._scratch_views: dict[tuple[np.dtype, tuple[int, ...]], tuple[np.ndarray, ...]] = {}
        # (dtype, shape) -> where a gradient assigned in another dtype (or non-contiguous) is cast (_grad_of).
        self._grad_casts: dict[tuple[np.dtype, tuple[int, ...]], np.ndarray] = {}

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

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """Per-element state arrays kept for each parameter of `group` (shaped like it) -> fill value."""
        raise NotImplementedError

    def scalar_state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """Per-parameter 0-d float64 state besides "step" -> initial value (none unless overridden)."""
        return {}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """Apply one update in place to `param` (any shape, or a flat concatenation of the group's parameters).

        `state` holds the state_init arrays (shaped like `param`) and the scalar_state_init 0-d
        arrays, updated in place; `step` is the count this update makes (the stored count plus one, which the
        caller stores once this returned). `segments` is None
        for one tensor, or int64 offsets (length n+1) of the n parameters inside a flat `param`:
        only optimizers with per-tensor quantities (LAMB) read it. Runs exactly one kernel and
        allocates no arrays.
        """
        raise NotImplementedError

    def prepare_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray,
                     state: dict[str, np.ndarray]) -> Callable[[float], None]:
        """`update_flat` of one tensor on these very arrays, as a function of the step count: a captured
        fused step (compile/captured.py) runs it for each parameter on every step. The group's
        hyperparameters are read when it runs, so schedules and edits to the group still apply. An
        optimizer may bind its kernel here once (Adam); this default calls update_flat each time."""
        return lambda step: self.update_flat(group, param, grad, state, step, None)

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
        # torch (2.6+) also takes model.named_parameters(): (name, parameter) pairs, the names kept in the group's
        # "param_names" (and so in state_dict), all or none of them named.
        named = [q for q in params if isinstance(q, tuple)]
        if named:
            if len(named) != len(params) or any(len(q) != 2 for q in named):
                raise ValueError("all optimizer params should be with/without names (name, parameter pairs, as "
                                 "model.named_parameters() gives); some param names are missing")
            group["param_names"] = [name for name, _ in named]
            params = [q for _, q in named]
        if self.param_groups and ("param_names" in group) != ("param_names" in self.param_groups[0]):
            raise ValueError("all optimizer param groups should be with/without names (model.named_parameters() "
                             "for every group, or parameters alone for every group)")
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
        """Forget the gradients: `grad = None` or zero-filled in place (torch's two modes).

        With set_to_none the next backward refills the same heap buffer unless something else still holds
        the old gradient, which then keeps its values as in torch (Tensor._release_grad).
        """
        for p in self._params():
            if set_to_none:
                p._release_grad()
            elif p.grad is not None:
                p.grad.fill(0)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the parameters once from their `.grad`; returns closure() if given.

        The same path a fused route takes, one parameter at a time: lazy state, `update_flat`
        on the parameter's own arrays with step + 1, then step += 1 (only once the update ran).
        """
        loss = self._run_closure(closure)
        updated = 0
        try:
            for group in self.param_groups:
                keys = (*self.state_init(group), *self.scalar_state_init(group))
                for p in group["params"]:
                    g = self._grad_of(p)
                    if g is None:
                        continue
                    state = self._init_state(p, group)
                    step = state["step"]
                    count = float(step) + 1.0
                    self.update_flat(group, p.data, g, {k: state[k] for k in keys}, count, None)
                    step[...] = count
                    updated += 1
                    # The update wrote p's array in place: a graph that saved p (a forward run before this step)
                    # must refuse its backward rather than differentiate at the new values (as torch does).
                    increment_version(p)
        except BaseException as exc:
            if not updated:
                raise  # nothing changed: the step may be redone (the Trainer's out-of-memory fallback does)
            # Some parameters moved, others not: redoing the step (a MemoryError's fallback) would update the
            # first ones twice, so it is no MemoryError any more; an interrupt goes on as itself, with a note.
            raise_partly_applied(exc, f"{type(self).__name__}.step() failed after {updated} parameters were updated: "
                                      f"the step is partly applied, so it must not be redone. Restore the last "
                                      f"checkpoint; {type(exc).__name__}: {exc}")
        return loss

    def initial_step(self, state: dict[str, Any]) -> float:
        """The step count of a parameter whose state has no "step" entry (0: no step taken yet)."""
        return 0.0

    def continued_step(self, state: dict[str, Any], group: dict[str, Any]) -> float:
        """The step count a parameter's next update goes on from, given its state as it stands before the
        state_init arrays `group` asks for are completed: its "step", or initial_step(state) without one. Every
        route completes the state by it (_init_state, compile/flat.py's layout); SGD overrides it."""
        step = state.get("step")
        return self.initial_step(state) if step is None else float(step)

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """`self.state[p]` with every entry `update_flat` needs (missing ones created: lazily, on the heap; arrays
        of another dtype than `p`'s, left by model.double() or float(), cast to it)."""
        state = self.state[p]
        start = self.continued_step(state, group)  # read before the missing arrays are made below
        step = state.get("step")
        if isinstance(step, np.ndarray) and step.shape == () and step.dtype == np.float64:
            if float(step) != start:
                step[...] = start  # in place: a flat layout's step is a view it keeps
        else:  # none yet, or a number set by hand
            state["step"] = np.array(start, dtype=np.float64)
        for key, fill in self.state_init(group).items():
            current = state.get(key)
            if current is None:  # torch-format dicts may carry None for an absent buffer
                # Persistent state: plain heap arrays, never from the (possibly open) step arena.
                state[key] = np.full(p.shape, fill, dtype=p.dtype)
            elif isinstance(current, np.ndarray) and current.dtype != p.dtype and current.shape == p.shape:
                # The parameter changed dtype since its state was made (model.double() / float() / to(dtype)
                # mid-run): the state follows it, as the fused route's new layout casts it and as torch's
                # load_state_dict casts state to its parameter's dtype (torch's own step raises instead).
                log.info("optimizer state %r of a %s parameter of shape %s was %s: cast to %s", key, p.dtype,
                         p.shape, current.dtype, p.dtype)
                with np.errstate(under="ignore"):  # narrowing flushes tiny moments to 0, as torch's cast does
                    state[key] = current.astype(p.dtype)  # a new heap array: the old dtype's buffer is let go
        for key, value in self.scalar_state_init(group).items():
            if state.get(key) is None:
                state[key] = np.array(value, dtype=np.float64)
        return state

    # -- helpers for update_flat -----------------------------------------------------
    def _kernel(self, name: str, group: dict[str, Any]) -> tuple[Callable, bool]:
        """The kernel `name` honouring group["fused"] (None: the default choice), and whether it is the reference."""
        impl = choose(name, self._impl(group))
        return kernel(name, impl), impl == "reference"

    @staticmethod
    def _impl(group: dict[str, Any]) -> str | None:
        """The kernel implementation group["fused"] asks for: "fused", "reference", or None (the default)."""
        fused = group.get("fused")
        return None if fused is None else ("fused" if fused else "reference")

    @staticmethod
    def _check_flat(name: str, param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    keys: Iterable[str]) -> None:
        """ValueError unless grad and every state array match param's shape and dtype.

        Fused kernels index flat memory without bounds checks: a short state buffer would be
        read past its end, so the shapes are checked here, once per call, at no array cost.
        """
        if grad.shape != param.shape:
            raise ValueError(f"{name}: grad shape {grad.shape} differs from param shape {param.shape}")
        for key in keys:
            array = state.get(key)
            if array is None:
                raise KeyError(f"{name}: the state has no {key!r} array, which the param group's settings now "
                               f"ask for (e.g. momentum or amsgrad switched on after the state was laid out); "
                               f"got {sorted(state)}")
            if array.shape != param.shape or array.dtype != param.dtype:
                raise ValueError(f"{name}: state {key!r} is {array.dtype}{list(array.shape)} but param is "
                                 f"{param.dtype}{list(param.shape)}; pass state arrays of the parameter's shape "
                                 f"and dtype (optimizer.step() casts a parameter's state after model.double())")

    def _run_closure(self, closure: Callable[[], Any] | None) -> Any:
        if closure is None:
            return None
        with enable_grad():
            return closure()

    def _grad_of(self, p: Tensor) -> np.ndarray | None:
        """`p.grad` checked against `p` (a wrong shape would broadcast silently into the update), as a C-contiguous
        array of `p`'s dtype.

        Autograd always hands a leaf its gradient in the leaf's dtype, but `.grad` may be assigned by hand (a
        float32 array on a float64 parameter, a transposed view). The fused kernels refused such an array while
        the reference twins updated with it (and Adagrad's squared it in float32): which optimizers trained
        depended on the kernel. Every kernel now gets it cast (casting="same_kind": floats of any width and
        ints, not complex) into a persistent buffer of the parameter's dtype: the float64 update of a float32
        gradient is that of its exact float64 copy. (torch refuses the assignment instead; ours is looser.)
        """
        g = p.grad
        if g is None:
            return None
        if g.shape != p.shape:
            raise ValueError(f"gradient shape {g.shape} does not match parameter shape {p.shape}")
        if g.dtype == p.dtype and g.flags.c_contiguous:
            return g
        key = (p.dtype, g.shape)
        buf = self._grad_casts.get(key)
        if buf is None:
            buf = self._grad_casts[key] = np.empty(g.shape, p.dtype)  # persistent (heap), reused every step
        try:
            np.copyto(buf, g, casting="same_kind")
        except TypeError as err:
            raise TypeError(f"the gradient of a {p.dtype} parameter of shape {p.shape} is {g.dtype}, which "
                            f"cannot be cast to {p.dtype}") from err
        return buf

    def _scratch(self, p: Tensor, count: int) -> tuple[np.ndarray, ...]:
        """`count` persistent scratch arrays shaped like `p`, views into a shared heap workspace."""
        return self._scratch_like(p.data, count)

    def _scratch_like(self, array: np.ndarray, count: int) -> tuple[np.ndarray, ...]:
        """`count` persistent scratch arrays shaped like `array` (a parameter or a flat buffer).

        Views are cached by (dtype, shape), not by parameter, so a flat buffer that is not a
        parameter gets its scratch without allocating after the first call.
        """
        key = (array.dtype, array.shape)
        views = self._scratch_views.get(key)
        if views is not None and len(views) >= count:
            return views
        need = count * array.size
        work = self._workspace.get(array.dtype)
        if work is None or work.size < need:
            # Grow once to fit the largest array seen; every view handed out before is dropped.
            work = self._workspace[array.dtype] = np.empty(max(need, 1), array.dtype)
            self._scratch_views.clear()
        views = tuple(work[i * array.size:(i + 1) * array.size].reshape(array.shape) for i in range(count))
        self._scratch_views[key] = views
        return views

    # -- persistence ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch-format state: {"state": {index: {...}}, "param_groups": [{..., "params": [index]}]}.

        Arrays are the live state arrays (not copies), as in torch: serialise or copy
        them before the next step if you need a snapshot.
        """
        self._refuse_while_streamed("state_dict() would return none of it")
        index_of, groups = self._packed_groups()
        state = {index_of[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index_of}
        return {"state": state, "param_groups": groups}

    def _packed_groups(self) -> tuple[dict[int, int], list[dict[str, Any]]]:
        """(id(param) -> its index, the groups with indices for params): state_dict's "param_groups", which a
        streamed checkpoint (stream/checkpoint.py) writes while the state itself is in the store."""
        index_of: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index_of.setdefault(id(p), len(index_of))
            packed["params"] = [index_of[id(p)] for p in group["params"]]
            groups.append(packed)
        return index_of, groups

    def _refuse_while_streamed(self, what: str) -> None:
        """A StreamingRoute keeps its parameters' optimizer state in its store, not in self.state (stream/on_disk.py
        marks those parameters): reading self.state then would silently miss all of it. (Loading a state dict is
        fine: the route moves it into the store before its next step, stream/follow.py.)"""
        from ..memory.arena import StaleTensorError

        if any(getattr(p._arena, "on_disk", False) for group in self.param_groups for p in group["params"]):
            raise StaleTensorError(f"the optimizer state of the parameters a StreamingRoute trains lives on disk, in "
                                   f"its store: {what}. Bring it into memory first with trainer.stream.to_memory(), "
                                   f"or save and restore a checkpoint with trainer.save(path) / trainer.load(path)")

    def _saved_hyperparams(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A saved param group's hyperparameters (all but "params") as this optimizer keeps them: JSON has no
        tuple, so a list where the optimizer's default is a tuple (betas; Rprop's etas and step_sizes) becomes
        a tuple again, as torch keeps it. Every loader of saved groups (checkpoints, the streaming store) uses it."""
        return {k: tuple(v) if isinstance(v, list) and isinstance(self.defaults.get(k), tuple) else v
                for k, v in saved.items() if k != "params"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (copied to the heap); validates groups and shapes."""
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise ValueError(f"optimizer state dict has no {key!r} entry; got keys {sorted(state_dict)}")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} parameter groups but the optimizer has "
                             f"{len(self.param_groups)}{GROUPS_HINT}")
        id_map: dict[int, Tensor] = {}
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"parameter group {gi} of the loaded state dict has {len(saved['params'])} "
                                 f"parameters but the optimizer's group {gi} has {len(group['params'])}{PARAMS_HINT}")
            for index, p in zip(saved["params"], group["params"]):
                id_map[int(index)] = p

        new_groups = []
        for saved, group in zip(saved_groups, self.param_groups):
            merged = dict(group)
            merged.update(self._saved_hyperparams(saved))
            merged.update(self._class_settings)  # what the class is (AdamW's decoupled decay), whatever was saved
            self._check_hyperparams(merged)
            new_groups.append(merged)
        group_of = {id(p): merged for merged in new_groups for p in merged["params"]}

        entries: list[tuple[Tensor, int, dict[str, Any]]] = []
        for index, entry in state_dict["state"].items():
            p = id_map.get(int(index))
            if p is None:
                raise ValueError(f"loaded state dict has state for parameter index {index}, which is in no "
                                 f"parameter group (indices {sorted(id_map)})")
            self._check_param_state(p, int(index), entry)
            self._check_state_keys(int(index), entry, group_of[id(p)])
            entries.append((p, int(index), entry))

        # Everything is validated: commit (a failed load leaves the optimizer untouched).
        new_state = {p: self._copy_param_state(p, entry) for p, _, entry in entries}
        self.param_groups[:] = new_groups
        self.state = defaultdict(dict, new_state)

    def _scalar_keys(self) -> set[str]:
        return {key for group in self.param_groups for key in self.scalar_state_init(group)}

    @staticmethod
    def _is_array(value: Any) -> bool:
        return isinstance(value, (np.ndarray, list)) or hasattr(value, "__array__")

    def _check_param_state(self, p: Tensor, index: int, entry: dict[str, Any]) -> None:
        if not isinstance(entry, dict):
            raise ValueError(f"state of parameter {index} must be a dict, got {type(entry).__name__}")
        scalars = self._scalar_keys()
        for key, value in entry.items():
            if key == "step":
                _step_array(value)
            elif key in scalars:
                _scalar_array(key, value)
            elif self._is_array(value):
                shape = np.shape(value)
                if shape != p.shape:
                    raise ValueError(f"state {key!r} of parameter {index} has shape {shape} but the "
                                     f"parameter has shape {p.shape}")

    def _check_state_keys(self, index: int, entry: dict[str, Any], group: dict[str, Any]) -> None:
        """Refuse the state of another optimizer: keys this class keeps under no setting (SGD's momentum_buffer in
        an Adam), or a state past step 0 without the arrays this class keeps under every setting (an SGD's bare
        step count in an Adam: its moments would start at zero, bias-corrected as a later step). torch fails
        such a load at its first step with a KeyError; before this check ours trained on. Keys of another
        setting stay (momentum switched off keeps its buffer, as eager and torch keep it; switched on, the
        buffer comes at the next step). A subclass that keeps state of its own without declaring it (no
        state_init) is not checked."""
        try:
            every, some = set(self.state_init(_settings(group, on=False))), self.state_init(_settings(group, on=True))
        except Exception:  # noqa: BLE001 - no state_init, or one that refuses a setting it never meets: unchecked
            return
        keeps = set(some) | set(self.scalar_state_init(_settings(group, on=True))) | {"step"}
        present = {key for key, value in entry.items() if value is not None}  # torch writes momentum_buffer=None
        unknown, missing = sorted(present - keeps), sorted(every - present)
        started = "step" in present and float(np.asarray(entry["step"])) > 0
        if unknown or (started and missing):
            name = type(self).__name__
            what = (f"keys {unknown} that {name} does not keep" if unknown
                    else f"no {missing} although it is at step {float(np.asarray(entry['step'])):g}")
            raise ValueError(f"state of parameter {index} has {what} ({name} keeps {sorted(keeps)}, and "
                             f"{sorted(every)} always): the state dict looks like another optimizer's. Load the "
                             f"state of a {name} (or build the optimizer the state came from)")

    def _copy_param_state(self, p: Tensor, entry: dict[str, Any]) -> dict[str, Any]:
        old = self.state.get(p, {})
        out: dict[str, Any] = {}
        scalars = self._scalar_keys()
        for key, value in entry.items():
            if key == "step":
                out[key] = _step_array(value)
            elif key in scalars:
                out[key] = _scalar_array(key, value)
            elif self._is_array(value):
                fresh = getattr(value, "reads_fresh", False)  # a checkpoint's tensor read for this use alone
                value = np.asarray(value)
                prev = old.get(key)
                # A float64 state loaded into a float32 model narrows: tiny moments flush to 0 (as torch's cast
                # does) instead of raising under np.seterr(under="raise") after earlier entries had loaded.
                with np.errstate(under="ignore"):
                    if isinstance(prev, np.ndarray) and prev.shape == p.shape and prev.dtype == p.dtype:
                        np.copyto(prev, value)  # keep the existing heap buffer (a plan may hold it)
                        out[key] = prev
                    elif fresh and value.dtype == p.dtype and value.flags.writeable and value.flags.c_contiguous:
                        # Owned by nobody else: kept, not copied (train/tensor_file.py reads it into a mapping of
                        # its own, which a later free gives back at once; a malloc'd copy, freed when the fused
                        # route lays the state out flat, raised glibc's mmap threshold and the heap kept pages)
                        out[key] = value
                    else:
                        # np.asarray first: np.array(copy=True) hands copy= to a torch Tensor's __array__, which
                        # does not take it (NumPy 2's DeprecationWarning, an error under the test settings).
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


def check_trains_the_model(model: Any, optimizer: Any) -> None:
    """A ValueError when the model has trainable parameters and the optimizer holds none of them: another model's
    optimizer passed by mistake trained nothing, while every step reported a loss (an optimizer over part of the
    model, a head only, is fine). The Trainer's and compile_step's check."""
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    groups = getattr(optimizer, "param_groups", None)
    if not trainable or groups is None:
        return
    if not any(id(p) in trainable for group in groups for p in group["params"]):
        raise ValueError(f"the optimizer ({type(optimizer).__name__}) holds none of the {type(model).__name__}'s "
                         f"{len(trainable)} trainable parameters, so training would change nothing: build it from "
                         f"this model's parameters (optimizer = AdamW(model.parameters(), ...))")


def _step_array(value: Any) -> np.ndarray:
    """A step count as a 0-d float64 heap array (mutable in place, like torch's step tensor)."""
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"state 'step' must be a single number, got shape {array.shape}")
    step = float(array.reshape(()))  # 1-element arrays too: np.ascontiguousarray makes 0-d arrays 1-d
    if not (math.isfinite(step) and step >= 0 and step == int(step)):
        raise ValueError(f"state 'step' must be a non-negative whole number, got {value!r}")
    return np.array(step, dtype=np.float64)


def _scalar_array(key: str, value: Any) -> np.ndarray:
    """A finite scalar state entry (e.g. NAdam's mu_product) as a 0-d float64 heap array."""
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"state {key!r} must be a single number, got shape {array.shape}")
    number = float(array.reshape(()))
    if not math.isfinite(number):
        raise ValueError(f"state {key!r} must be a finite number, got {value!r}")
    return np.array(number, dtype=np.float64)


def _torch_flags(optimizer: str, foreach: Any, capturable: Any, differentiable: Any) -> None:
    """Accept torch's implementation flags so torch-written code runs unchanged; refuse what would mean something.

    foreach (any value) only picks between torch's per-tensor loop and its multi-tensor kernels: here the
    `fused` option picks the kernel, so it changes nothing. capturable=True and differentiable=True ask
    for behaviour this engine has not got, and saying so beats ignoring it.
    """
    if capturable:
        raise ValueError(f"{optimizer}(capturable=True) has no meaning here: it keeps torch's step count on the "
                         f"device for CUDA graph capture, and tensorarena runs on the CPU with NumPy; leave it "
                         f"False")
    if differentiable:
        raise ValueError(f"{optimizer}(differentiable=True) has no meaning here: the update runs in place outside "
                         f"autograd, so no gradient flows through optimizer.step(); leave it False")


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


def _check_adam_family(group: dict[str, Any]) -> None:
    """The checks Adam, NAdam and LAMB share: lr, eps, betas and weight_decay of a param group."""
    _check_number("lr", group["lr"], what="learning rate")
    _check_number("eps", group["eps"], what="epsilon value")
    _check_betas(group["betas"])
    _check_number("weight_decay", group["weight_decay"])


def _check_betas(betas: Any) -> None:
    """ValueError unless `betas` is a pair of numbers in [0, 1) (torch's messages)."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"Invalid betas: {betas!r} (expected a pair (beta1, beta2))")
    for i, beta in enumerate(betas):
        _check_number("beta", beta, high=1.0, high_inclusive=False, what=f"beta parameter at index {i}")
