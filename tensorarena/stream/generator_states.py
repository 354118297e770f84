"""The model's random generators in a streaming store's manifest or checkpoint: whether saved states fit, and
putting them back (StreamingRoute's resume and finished commits, stream/checkpoint.py's load); and sharing the
states a step's snapshots have in common (`share_unchanged`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..nn.module import Module
from ..random import peek_default_generator
from ..train.checkpoint import _generators


def generator_states_problem(model: Module, states: dict[str, Any]) -> str | None:
    """What keeps saved generator `states` (name -> JSON state) from going into `model`'s generators, in words
    ("holds a MT19937 state for ..."); None if they fit. Asked before anything changes, as check_checkpoint does."""
    generators = _generators(model)
    for name, state in states.items():
        kind = state.get("bit_generator") if isinstance(state, dict) else None
        if name in generators and kind != type(generators[name].bit_generator).__name__:
            return (f"holds a {kind} state for the generator {name}, which is a "
                    f"{type(generators[name].bit_generator).__name__}; build the model with the generator the saved "
                    f"run had")
    return None


def damaged_generator_state(model: Module, states: dict[str, Any], default_state: dict | None) -> str | None:
    """Which saved state (of `model`'s generators, or the default one) NumPy would refuse to set, in words with
    its error; None if all would be set. Tried on new bit generators of the same kinds: nothing changes. For a
    caller that must refuse before it changes anything, not half-way through restore_generators."""
    generators = _generators(model)
    tries = [(f"the generator {name}", state, generators[name].bit_generator)
             for name, state in states.items() if name in generators]
    if default_state is not None:
        tries.append(("the default generator", default_state, peek_default_generator().bit_generator))
    for what, state, like in tries:
        try:
            type(like)().state = state
        except (KeyError, TypeError, ValueError) as exc:
            return f"its state for {what} cannot be set ({type(exc).__name__}: {exc})"
    return None


def restore_generators(model: Module, states: dict[str, Any], default_state: dict | None) -> None:
    """Put saved states (rng_state's JSON; NumPy's setters take its lists back) into `model`'s generators and the
    default one (None: leave it). Setting a state draws nothing, so the default generator is peeked at."""
    generators = _generators(model)
    for name, state in states.items():
        if name in generators:
            generators[name].bit_generator.state = state
    if default_state is not None:
        peek_default_generator().bit_generator.state = default_state


def share_unchanged(previous: list | None, states: list) -> list:
    """`states` (one per generator, as StreamingRoute._rng_snapshot reads them), where each state equal to the one in
    `previous` (the snapshot before, same generators in the same order) is replaced by that one object.

    Why: a streamed step keeps a snapshot per stage and micro-batch until it ends (sweep.py), and most generators do
    not move between two of them: Python's `random` (~25 KB of state) and NumPy's global one (~3 KB) rarely do. Kept
    as copies they were ~30 KB per snapshot, none of it planned: 11 MB at 8 stages and 48 micro-batches (a hunt
    measured the streamed step's peak 1.063x its plan). Shared, the step holds only the states that moved."""
    if previous is None or len(previous) != len(states):
        return states
    return [old if _same(old, new) else new for old, new in zip(previous, states)]


def _same(a: Any, b: Any) -> bool:
    """Whether two generator states are equal: dicts, tuples and lists of ints and strings, and NumPy arrays (a
    RandomState's key), compared element by element (== on a dict holding arrays would raise)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
