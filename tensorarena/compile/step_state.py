"""What a training step changes besides its parameters and optimizer state: the random generators it draws
from and the model's buffers a forward writes (BatchNorm-style running statistics).

A trace, a captured recording's checking passes and a failed or redone step must leave both as they found
them, so each snapshots them first (`rng_states`, `buffer_states`) and puts them back after
(`restore_rng`, `restore_buffers`): step 1 is then the first step the model sees, and a redo after an
out-of-memory draws the failed step's dropout masks again.

And `step_scheduler`: the schedule's step after an update, whose failure must not read as a step to redo.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from ..nn.module import Module
from ..optim.optimizer import raise_partly_applied
from ..tensor import Tensor


class _NumpyGlobalState:
    """The state of NumPy's global generator (np.random.seed, np.random.standard_normal), read and set whole with
    get_state/set_state: its bit generator's state without the normal it caches would not replay its draws."""

    @property
    def state(self) -> dict:
        return np.random.get_state(legacy=False)

    @state.setter
    def state(self, value: dict) -> None:
        np.random.set_state(value)


class _NumpyGlobal:
    """NumPy's global generator as one of a step's generators (`.bit_generator.state`): a forward drawing noise with
    np.random.standard_normal (a VAE's sample) drew once more in a trace, so step 1 drew other noise than eager's."""

    bit_generator = _NumpyGlobalState()


NUMPY_GLOBAL = _NumpyGlobal()


class _StateOf:
    """`.bit_generator.state` for a generator read and set whole by two functions: a RandomState (get_state and
    set_state keep the normal it caches) or Python's `random` module (getstate/setstate)."""

    def __init__(self, get, put) -> None:
        self._get, self._put = get, put

    @property
    def state(self):
        return self._get()

    @state.setter
    def state(self, value) -> None:
        self._put(value)


class _Wrapped:
    """A RandomState, or Python's `random` module, as one of a step's generators (`.bit_generator.state`)."""

    def __init__(self, get, put) -> None:
        self.bit_generator = _StateOf(get, put)


PYTHON_RANDOM = _Wrapped(random.getstate, random.setstate)
_MAX_DEPTH = 3  # how deep into a module's dicts, lists and tuples generators are looked for
_MAX_ITEMS = 256  # nor in one larger (a vocabulary, a table: a review timed a 30k-entry dict at +31 ms a step)


def _random_sources(value: Any, depth: int, found: dict[int, Any]) -> None:
    """Generators and RandomStates in `value` (one, or inside dicts, lists and tuples), into `found` by id."""
    if isinstance(value, np.random.Generator):
        found.setdefault(id(value), value)
    elif isinstance(value, np.random.RandomState):
        found.setdefault(id(value), _Wrapped(lambda v=value: v.get_state(legacy=False), value.set_state))
    elif isinstance(value, (dict, list, tuple)) and depth < _MAX_DEPTH and len(value) <= _MAX_ITEMS:
        for item in (value.values() if isinstance(value, dict) else value):
            _random_sources(item, depth + 1, found)


def _forward_globals(module: Module) -> list[Any]:
    """The values a module's forward reads by global name (a module-level `rng = np.random.default_rng()`)."""
    forward = getattr(type(module), "forward", None)
    code, names = getattr(forward, "__code__", None), getattr(forward, "__globals__", {})
    return [names[n] for n in code.co_names if n in names] if code is not None else []


def rng_generators(model: Module) -> list[np.random.Generator]:
    """Every generator a step may draw from, each once: the default one; those a module holds, as attributes or
    inside its dicts, lists and tuples, Generators and RandomStates both; those its forward reads as globals;
    NumPy's global one and Python's `random`. A trace or a captured recording's checking passes run the forward
    more often than eager does, and a generator left out moved on: step 1 drew eager's step-2 noise (a helper's
    hunt: a RandomState on the module, a Generator in a dict, a module-level one, `random.random()`)."""
    from ..random import peek_default_generator

    found: dict[int, Any] = {}
    _random_sources(peek_default_generator(), 0, found)
    for module in model.modules():
        for value in (*vars(module).values(), *_forward_globals(module)):
            _random_sources(value, 0, found)
    return [*found.values(), NUMPY_GLOBAL, PYTHON_RANDOM]


def param_arrays(params: list[Tensor]) -> list[tuple[Tensor, Any]]:
    """(parameter, the array it holds) for `params`: what a trace or a recording pass must leave them holding."""
    return [(p, p._data) for p in params]


def restore_param_arrays(saved: list[tuple[Tensor, Any]]) -> int:
    """Point each parameter back at the array `saved` found it holding (a forward that rebinds .data, as a max-norm
    constraint does, must not have an extra run of it count); returns how many had been rebound."""
    rebound = 0
    for p, data in saved:
        if p._data is not data:
            p.data = data
            rebound += 1
    return rebound


class RngStates(list):
    """[(generator, state)] taken by rng_states, and how often this thread had been handed the default
    generator then (random.default_asks): restore_rng leaves the default one alone if that has not moved."""

    asks: int = 0


def rng_states(model: Module, generators: list[np.random.Generator] | None = None) -> RngStates:
    """(generator, state) for `generators` (default: all of `model`'s), to restore after a trace or a failed step."""
    from ..random import default_asks

    saved = RngStates((g, g.bit_generator.state)
                      for g in (generators if generators is not None else rng_generators(model)))
    saved.asks = default_asks()
    return saved


def restore_rng(saved: list[tuple[np.random.Generator, dict]]) -> None:
    """Put the generators back where `saved` found them; the default generator only if this thread was handed
    it since (its draws were this step's; if not, they were another thread's, and stand)."""
    from ..random import default_asks, peek_default_generator

    untouched = isinstance(saved, RngStates) and saved.asks == default_asks()
    for gen, state in saved:
        if not (untouched and gen is peek_default_generator()):
            gen.bit_generator.state = state


# A buffer's entry in BufferStates: dotted name, its module and attribute, the object the attribute held, the
# array holding its values (the object itself, a Tensor's data, or None for None or a plain number), a copy.
BufferEntry = tuple[str, Module, str, Any, "np.ndarray | None", "np.ndarray | None"]


def buffer_slots(model: Module) -> list[tuple[str, Module, str]]:
    """(dotted name, module, attribute) of every registered buffer of `model`, a shared module's once; None
    ones too (a forward may set one). Found by one walk over the modules."""
    return [(f"{path}.{name}" if path else name, module, name)
            for path, module in model.named_modules() for name in vars(module).get("_buffers", {})]


class BufferStates(list):
    """[BufferEntry] for the model's buffers, taken by buffer_states; restore_buffers puts back both the object
    each attribute held and its values: a forward may write a buffer in place (`running_mean[...] = ...`,
    `num_batches_tracked += 1`) or bind a new value (`self.running_mean = 0.9 * self.running_mean + ...`)."""


def buffer_states(model: Module | None = None, slots: list[tuple[str, Module, str]] | None = None) -> BufferStates:
    """The buffers' objects and a copy of their values, now: of `slots` (buffer_slots, found once by a caller
    that snapshots often) or of all of `model`'s. Empty, at the cost of one walk, for a model without buffers
    (tensorarena's own models have none)."""
    saved = BufferStates()
    for path, module, name in (slots if slots is not None else buffer_slots(model)):
        value = getattr(module, name, None)
        array = value._data if isinstance(value, Tensor) else value if isinstance(value, np.ndarray) else None
        saved.append((path, module, name, value, array, None if array is None else array.copy()))
    return saved


def restore_buffers(saved: list[BufferEntry]) -> None:
    """Put each buffer of `saved` back: the object its attribute held, holding the values it had then."""
    for _, module, name, value, array, copy in saved:
        object.__setattr__(module, name, value)  # as register_buffer sets it
        if isinstance(value, Tensor):
            value._data = array
        if array is not None and array.flags.writeable:  # a read-only one cannot have been written in place
            np.copyto(array, copy)


def buffer_unchanged(entry: BufferEntry) -> bool:
    """Whether the buffer of `entry` holds the values it held then (bit for bit, in dtype and shape too), in
    whatever object: what a checkpoint saves and a forward reads."""
    _, module, name, value, _, copy = entry
    now = getattr(module, name, None)
    if now is None or value is None:
        return now is value
    then = copy if copy is not None else np.asarray(value)
    now = np.asarray(now._data if isinstance(now, Tensor) else now)
    if now.dtype != then.dtype or now.shape != then.shape:
        return False
    if now.dtype.hasobject:  # no bits to compare
        return bool(np.array_equal(now, then))
    return bool(np.array_equal(np.ascontiguousarray(now).view(np.uint8), np.ascontiguousarray(then).view(np.uint8)))


def changed_buffers(saved: list[BufferEntry]) -> list[str]:
    """The dotted names of the buffers whose values differ from `saved`'s."""
    return [entry[0] for entry in saved if not buffer_unchanged(entry)]


def restore_step_state(before: tuple[RngStates, BufferStates | None]) -> None:
    """Put back what a step's caller saved before it, (rng_states(...), buffer_states(...) or None): the
    generators' states and the buffers' values, after a failed step or before its redo on another route."""
    rng, buffers = before
    restore_rng(rng)
    if buffers is not None:
        restore_buffers(buffers)


def step_scheduler(scheduler: Any, index: int | None) -> None:
    """scheduler.step() after a step's update was applied whole (eager and fused). A failure here (a user's
    lr_lambda, an interrupt, a MemoryError) comes after the update: a RuntimeError (a note on an interrupt) says
    the step is partly applied, so the out-of-memory fallback does not redo it on top of itself (the update ran
    twice) and a retry of the batch is not mistaken for a clean one."""
    try:
        scheduler.step()
    except BaseException as exc:
        step = "this step" if index is None else f"step {index}"
        raise_partly_applied(exc, f"{step}'s update was applied, then its learning-rate scheduler failed: the step "
                                  f"is partly applied, so it is not redone. Restore the last checkpoint; "
                                  f"{type(exc).__name__}: {exc}")
