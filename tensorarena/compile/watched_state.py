"""What a fused step's trace or recording was made under besides its batch, watched for a change between steps.

A plan's trace and its captured recording (compile/captured.py) keep what the step's Python read when they
were made: a module's flag or dropout probability, a number in the loss function's closure, the array a
buffer held. The Python replay reads these again every step; a recording would go on replaying the old
ones, silently. So each is read once when the step is traced or recorded, and compared before every step:
- ModelState: the modules' attributes and the parameters' requires_grad; a change makes FusedStep.plan_for
  trace the plan again (compile/step.py), recording and all.
- LossState: what the user's loss function reads besides its arguments (closure cells, globals, a loss
  object's attributes); a change records the step again (captured.changed).
- BufferArrays: the arrays of the model's and the loss module's buffers; one assigned anew records the
  step again (captured.changed).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import types
from typing import Any

import numpy as np

from ..nn.module import Module
from ..nn.parameter import Parameter
from ..tensor import Tensor

# Values compared by value: immutable, and what a forward's flags and sizes are made of.
_PLAIN = (bool, int, float, complex, str, bytes, type(None), enum.Enum, np.generic)
# Objects compared by identity: replaced is changed (a layer swapped, a new generator); what they hold is
# watched elsewhere (a Module's own attributes, a Parameter's requires_grad) or is not the forward's choice.
_SAME = (Module, Parameter, np.random.Generator, types.FunctionType, types.BuiltinFunctionType,
         functools.partial)
_CONTAINERS = (dict, list, tuple)
_MAX_DEPTH = 4  # containers nested deeper under a module's attribute are not watched
_MAX_LEAVES = 256  # nor one holding more values: a config is small; a table or a vocabulary is not config


class _Same:
    """An expected value that equals only `obj` itself: a container watched as a space of its own, so that
    a new container with equal contents, which the space no longer watches, still counts as a change; and a
    watched Parameter (Tensor == is elementwise: a one-element Parameter replaced by an equal-valued one
    would otherwise compare equal)."""

    __slots__ = ("obj",)
    __hash__ = None

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: Any) -> bool:
        return other is self.obj

    def __repr__(self) -> str:
        return f"the {type(self.obj).__name__} at the time of recording"


def _is_config(v: Any) -> bool:
    """A config object whose attributes are watched like a module's: a dataclass instance or a SimpleNamespace."""
    return (isinstance(v, types.SimpleNamespace) or (dataclasses.is_dataclass(v) and not isinstance(v, type))) \
        and hasattr(v, "__dict__")


def _copyable(v: Any, depth: int, budget: list[int]) -> bool | None:
    """For a container: True if every value in it is plain or compared by identity (a structural copy of it
    is then compared in one C-level ==), False if it also holds arrays, Tensors, config objects or other
    objects (it is watched as a space of its own), None if past the bounds (not watched)."""
    if depth > _MAX_DEPTH:
        return None
    values = v.values() if isinstance(v, dict) else v
    copyable = True
    for x in values:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if isinstance(x, _CONTAINERS):
            inner = _copyable(x, depth + 1, budget)
            if inner is None:
                return None
            copyable = copyable and inner
        elif not isinstance(x, _PLAIN + _SAME):
            copyable = False
    return copyable


def _copy(v: Any) -> Any:
    """A structural copy of a copyable container: its containers copied, its values kept (immutable, or
    compared by identity)."""
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_copy(x) for x in v)
    return _Same(v) if isinstance(v, Tensor) else v  # a Parameter by identity: Tensor == is elementwise


def _restore_in_place(live: Any, want: Any) -> None:
    """Make the dict or list `live` equal to the copy `want` (_copy), keeping `live` and the containers inside it
    that still have the copy's type as the same objects; a value _Same wraps goes back as the object itself."""
    def value(w: Any) -> Any:
        if isinstance(w, dict):
            return {k: value(x) for k, x in w.items()}
        if isinstance(w, list):
            return [value(x) for x in w]
        if isinstance(w, tuple):
            return tuple(value(x) for x in w)
        return w.obj if isinstance(w, _Same) else w

    if isinstance(want, dict):
        for k in [k for k in live if k not in want]:
            del live[k]
        pairs = list(want.items())
    else:
        del live[len(want):]
        pairs = list(enumerate(want))
    for k, w in pairs:
        inside = live.get(k) if isinstance(live, dict) else (live[k] if k < len(live) else None)
        if isinstance(w, (dict, list)) and type(inside) is type(w):
            _restore_in_place(inside, w)
        elif isinstance(live, dict) or k < len(live):
            live[k] = value(w)
        else:
            live.append(value(w))


def _entry(prefix: str, key: Any, attributes: bool) -> str:
    return f"{prefix}.{key}" if attributes else f"{prefix}[{key!r}]"


def _keys(space: Any) -> tuple:
    return tuple(space) if isinstance(space, dict) else tuple(range(len(space)))


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class ModelState:
    """What a module's Python may branch on besides the data, read when a step is recorded (or traced); a
    recording (a trace) made under one state would go on replaying it after a change that the Python replay
    follows (a dropout probability set anew, a flag switched off), so a change makes the plan record (trace)
    its step again (FusedStep._replay, plan_for). Watched, for every module:
    - the set of its attributes (a class default later set on the instance is a new one);
    - plain values (a flag, a probability, a size, a string), by value;
    - dicts, lists and tuples of them, nested (self.cfg["use_b"]), by value; and a config object (a dataclass
      instance, a SimpleNamespace), attribute by attribute, as a module;
    - Modules, Parameters, generators and functions, by identity: a layer swapped is a change;
    - every parameter's requires_grad.
    Not watched: arrays and Tensors (data, not config), other objects (looked into by nobody), and a
    container nested more than _MAX_DEPTH deep or holding more than _MAX_LEAVES values.

    `changed()` runs before every step: the dicts and keys are found once here, and a read is three list
    comprehensions compared in C (~0.06 ms on a ViT-Base since Parameters compare through _Same's __eq__ in
    Python, ~0.025 before; 0.020 for the narrower watch before that), not the ~1 ms a walk over
    model.modules() takes.
    `describe_change()` names the first change found (slow; for the log)."""

    def __init__(self, model: "Module") -> None:
        self._start()
        for name, module in model.named_modules():
            self._watch(vars(module), type(module).__name__, True, f" of {name!r}" if name else " of the model", 0)
        named = list(model.named_parameters())
        self._finish([n for n, _ in named], [p for _, p in named])
        # The globals the model's own forwards read, put back with the rest (put_back_plain_values) but not part of
        # `changed()`: the Python replay reads them afresh every step, and a loop setting one each step (a scale)
        # would retrace every step for nothing (a review of 5b7bbad found 39 retraces in 40 steps).
        self.forward_globals = ForwardGlobals(model)

    def _start(self) -> None:
        self.spaces: list[tuple[str, bool, str, Any]] = []  # (prefix, attributes, suffix, container): lengths compared
        self.space_keys: list[tuple] = []  # each space's keys when read (describe_change names what came or went)
        self.slots: list[tuple[str, Any, Any]] = []  # (what, container, key): each value is compared
        self.expected: list[Any] = []  # what each slot held: the value, the object, a copy, or _Same(container)

    def _finish(self, param_names: list[str], params: list[Tensor]) -> None:
        self.param_names, self.params = param_names, params
        self.spaced = [c for *_, c in self.spaces]
        self.getters, self.wanted = self._group()
        self.lengths, _, self.grads = self._read()

    def _group(self) -> tuple[list, list]:
        """One itemgetter per space over its compared keys (one C call reads them all), and what it must give."""
        by_space: dict[int, tuple[Any, list, list]] = {}
        for (_, space, key), want in zip(self.slots, self.expected):
            _, keys, wants = by_space.setdefault(id(space), (space, [], []))
            keys.append(key)
            wants.append(want)
        getters = [(operator.itemgetter(*keys), space) for space, keys, _ in by_space.values()]
        wanted = [wants[0] if len(wants) == 1 else tuple(wants) for _, _, wants in by_space.values()]
        return getters, wanted

    def _watch(self, space: Any, prefix: str, attributes: bool, suffix: str, depth: int) -> None:
        """Watch a module's attributes (a config object's, or a container's entries: `attributes` False),
        named `prefix`.key (prefix[key]) `suffix`, and the containers and config objects below them."""
        self.spaces.append((prefix, attributes, suffix, space))
        self.space_keys.append(_keys(space))
        for key, v in (space.items() if isinstance(space, dict) else enumerate(space)):
            if depth == 0 and key == "training":
                continue  # a module's mode: FusedStep.plan_for keys its plans by every module's (nn/modes.py)
            entry = _entry(prefix, key, attributes)
            what = entry + suffix
            if isinstance(v, np.ndarray) or (isinstance(v, Tensor) and not isinstance(v, Parameter)):
                continue  # data, not config (the space's length still notices it going away)
            if isinstance(v, _PLAIN + _SAME):
                self._slot(what, space, key, _Same(v) if isinstance(v, Tensor) else v)  # == is elementwise
            elif isinstance(v, _CONTAINERS):
                copyable = _copyable(v, depth + 1, [_MAX_LEAVES])
                if copyable:
                    self._slot(what, space, key, _copy(v))
                elif copyable is False:
                    self._slot(what, space, key, _Same(v))
                    self._watch(v, entry, False, suffix, depth + 1)
            elif _is_config(v) and depth < _MAX_DEPTH:
                self._slot(what, space, key, _Same(v))
                self._watch(vars(v), entry, True, suffix, depth + 1)

    def _slot(self, what: str, space: Any, key: Any, expected: Any) -> None:
        self.slots.append((what, space, key))
        self.expected.append(expected)

    def _read(self) -> tuple:
        return ([len(c) for c in self.spaced], [get(c) for get, c in self.getters],
                [p.requires_grad for p in self.params])

    def changed(self) -> bool:
        try:
            lengths, values, grads = self._read()
            return lengths != self.lengths or values != self.wanted or grads != self.grads
        except Exception:  # noqa: BLE001 - a key gone (KeyError), or a value whose == will not say (an array): changed
            return True

    def put_back_plain_values(self) -> None:
        """Set every watched plain value (a counter, a flag, a string) that changed since this state was read back
        to what it was, in the modules' attributes, config objects and dicts or lists: a trace runs the forward
        once more than the steps do, and kept its writes (a step counter the forward raises ran one ahead of
        eager's, and the changed state retraced every step). `training` is left to train()/eval()."""
        for (_, space, key), want in zip(self.slots, self.expected):
            if isinstance(space, tuple) or key == "training":
                continue
            try:
                got = space[key]
                if isinstance(want, (dict, list)) and type(got) is type(want):
                    # A container of plain values, watched as a copy (_copy): put back in place, so that what
                    # holds it (self.stats["calls"], a loss's list of counts) still holds the same object.
                    if _copy(got) != want:
                        _restore_in_place(got, want)
                    continue
                if not isinstance(want, _PLAIN):
                    continue
                if got is not want and type(got) is type(want) and got == want:
                    continue
                if got is not want:
                    space[key] = want
            except Exception:  # noqa: BLE001 - a key gone, an entry that will not compare: left as it is
                continue

    def put_back(self) -> None:
        """put_back_plain_values, and that of the forwards' globals (ForwardGlobals)."""
        self.put_back_plain_values()
        if getattr(self, "forward_globals", None) is not None:
            self.forward_globals.put_back_plain_values()

    def describe_change(self) -> str:
        """The first change found, named: class, attribute or entry, and module path; or the parameter."""
        for (prefix, attributes, suffix, space), keys in zip(self.spaces, self.space_keys):
            now = _keys(space)
            if now != keys:
                came = [k for k in now if k not in keys]
                went = [k for k in keys if k not in now]
                if came:
                    return f"{_entry(prefix, came[0], attributes)}{suffix}: set to {_show(space[came[0]])} (new)"
                if went:
                    return f"{_entry(prefix, went[0], attributes)}{suffix}: removed"
        for (what, space, key), want in zip(self.slots, self.expected):
            got = space[key]
            if got is want:
                continue
            try:
                same = got is want.obj if isinstance(want, _Same) else bool(got == want)
            except Exception:  # noqa: BLE001 - an == that will not say (an array): a change
                same = False
            if same:
                continue
            if isinstance(want, _Same) or (isinstance(want, _SAME) and not isinstance(want, _PLAIN)):
                old = want.obj if isinstance(want, _Same) else want
                return f"{what}: replaced ({type(old).__name__} -> another {type(got).__name__})"
            return f"{what}: {_show(want)} -> {_show(got)}"
        for name, p, want in zip(self.param_names, self.params, self.grads):
            if p.requires_grad != want:
                return f"parameter {name!r}: requires_grad {want} -> {p.requires_grad}"
        return "no change"


class _LiveNames(dict):
    """name -> what `read(name)` gives now (a closure cell's contents, a global's value): a function's state
    watched as a module's attributes are. The dict holds the names only; every read goes to `read`, every
    write (a put-back) to `write`."""

    def __init__(self, names: list[str], read: Any, write: Any) -> None:
        super().__init__(dict.fromkeys(names))
        self._read, self._write = read, write

    def __getitem__(self, name: str) -> Any:
        return self._read(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self._write(name, value)

    def items(self) -> list[tuple[str, Any]]:
        return [(name, self[name]) for name in self]


_EMPTY_CELL = "<empty cell>"


def _cell_access(code: types.CodeType, closure: tuple) -> tuple[Any, Any]:
    """(read, write) of a function's closure cells by name."""
    cells = dict(zip(code.co_freevars, closure))

    def read(name: str) -> Any:
        try:
            return cells[name].cell_contents
        except ValueError:  # a cell not bound yet
            return _EMPTY_CELL

    def write(name: str, value: Any) -> None:
        cells[name].cell_contents = value
    return read, write


def _code_names(code: types.CodeType) -> list[str]:
    """The global names `code` and the functions and lambdas defined in it may read."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _code_names(const)
    return list(dict.fromkeys(names))


def _loss_spaces(fn: Any, where: str, depth: int = 0) -> list[tuple[Any, str]]:
    """(space, name) for what a loss function of the user's own may read besides its arguments: its closure
    cells, the globals its code names, a callable object's or a bound method's instance attributes, a partial's
    arguments. tensorarena's own functions are audited (compile/captured.py's docstring) and not watched."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(fn, functools.partial):
        return [(list(fn.args), f"{where} args"), (fn.keywords, f"{where} keywords"),
                *_loss_spaces(fn.func, where, depth + 1)]
    if isinstance(fn, types.MethodType):
        owner = fn.__self__
        spaces = [(vars(owner), f"{where}.__self__")] if hasattr(owner, "__dict__") else []
        return spaces + _loss_spaces(fn.__func__, where, depth + 1)
    if isinstance(fn, types.FunctionType):
        if (fn.__module__ or "").startswith("tensorarena."):
            return []
        code = fn.__code__
        spaces = []
        if fn.__closure__:
            spaces.append((_LiveNames(list(code.co_freevars), *_cell_access(code, fn.__closure__)),
                           f"{where}'s closure"))
        names = [n for n in _code_names(code) if n in fn.__globals__]
        if names:
            spaces.append((_LiveNames(names, fn.__globals__.get, fn.__globals__.__setitem__), f"{where}'s globals"))
        return spaces
    if hasattr(fn, "__dict__") and not isinstance(fn, (type, types.BuiltinFunctionType, types.ModuleType)):
        call = getattr(type(fn), "__call__", None)
        return [(vars(fn), where), *(_loss_spaces(call, where, depth + 1) if call is not None else [])]
    return []


class ForwardGlobals(ModelState):
    """The globals a model's own forwards read by name (a module-level step counter, a flag, a scale), watched as
    LossState watches a loss function's: a trace's extra forward moved such a counter one ahead of eager's, so
    PythonState puts them back; and a captured recording, which holds the values read as constants, records again
    when one changes (captured.changed). tensorarena's own modules read none the user sets."""

    def __init__(self, model: "Module") -> None:
        self._start()
        self.forward_globals = None
        forwards: dict[Any, str] = {}
        for module in model.modules():
            forward = getattr(type(module), "forward", None)
            if isinstance(forward, types.FunctionType) and not (forward.__module__ or "").startswith("tensorarena."):
                forwards.setdefault(forward, type(module).__name__)
        for forward, owner in forwards.items():
            names = [n for n in _code_names(forward.__code__) if n in forward.__globals__]
            if names:
                self._watch(_LiveNames(names, forward.__globals__.get, forward.__globals__.__setitem__),
                            f"{owner}.forward's globals", False, "", 1)
        self._finish([], [])


class LossState(ModelState):
    """What the loss function reads besides its arguments (_loss_spaces), watched as ModelState watches a
    module: a scale in a closure, a global, a loss object's attribute. A recording holds the numbers the loss
    computed with as constants (`2.0 * loss`), so a change makes the step record again (`changed`), as the
    Python replay, which calls the loss every step, follows it."""

    def __init__(self, loss_fn: Any) -> None:
        self._start()
        for space, where in _loss_spaces(loss_fn, "loss_fn"):
            self._watch(space, where, not isinstance(space, (list, tuple)), "", 0)
        self._finish([], [])


class PythonState:
    """The plain values a step's Python may set besides arrays, the model's (ModelState) and the loss function's
    (LossState: a loss object counting its calls for a KL warm-up, a global), read before an extra run of the
    step (a trace, a route plan's trace, a recording's checking pass) and put back after it: eager runs the
    forward once per step, and those runs must not count (the loss's count ran one ahead of eager's)."""

    def __init__(self, model: Module, loss_fn: Any) -> None:
        self.model, self.loss = ModelState(model), LossState(loss_fn)

    def put_back(self) -> None:
        self.model.put_back()
        self.loss.put_back_plain_values()


def _loss_modules(loss_fn: Any) -> list[Module]:
    """The modules a loss function is, or is a bound method or partial of (nn.NLLLoss(weight=w)): their buffers
    are the loss's constants, as a model's are the model's."""
    fn = loss_fn
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, types.MethodType):
        fn = fn.__self__
    return list(fn.modules()) if isinstance(fn, Module) else []


def _buffer_array(value: Any) -> Any:
    """What a recorded call holds of a buffer: its array (a Tensor's, which `.data = ...` replaces)."""
    return value._data if isinstance(value, Tensor) else value


class BufferArrays:
    """The arrays of the model's and the loss module's buffers when a step was recorded. A recorded call holds
    the array itself, so a write into it (`loss.weight[0] = 2`) is read by every replay after it, but a buffer
    assigned anew (`loss.weight = w`, `model.mask = m`, `loss.weight.data = a`) is not: the recording would
    go on reading the old array where the Python replay reads the new one. `changed` names such a buffer, and
    the step is recorded again (captured.changed). The same for `params`, (name, parameter) the flat state does not
    own (frozen ones): `p.data = new_array` on a frozen layer left the recording reading the old array. The slots
    are found once; a read is one pass over them (none, for a model and a loss without buffers)."""

    def __init__(self, model: Module, loss_fn: Any, params: list[tuple[str, Tensor]] = ()) -> None:
        from .step_state import buffer_slots

        self.slots = [(f"the model's buffer {path!r}", module, name) for path, module, name in buffer_slots(model)]
        for loss_module in _loss_modules(loss_fn):
            self.slots += [(f"the loss function's buffer {name!r}", loss_module, name)
                           for name in vars(loss_module).get("_buffers", {})]
        self.arrays = [_buffer_array(getattr(module, name, None)) for _, module, name in self.slots]
        self.params = [(f"the model's parameter {name!r} (not in the optimizer's flat state)", p, p._data)
                       for name, p in params]

    def changed(self) -> str | None:
        """The first buffer (or parameter outside the flat state) whose array is not the one recorded, or None."""
        for (what, module, name), then in zip(self.slots, self.arrays):
            if _buffer_array(getattr(module, name, None)) is not then:
                return what
        for what, p, then in self.params:
            if p._data is not then:
                return what
        return None
