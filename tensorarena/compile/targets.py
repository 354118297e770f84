"""Targets as a plan holds them: one array, or any nesting of tuples, lists and dicts around arrays.

The eager route hands `loss_fn` the targets exactly as the caller gave them, so a loss may take
`(labels, weights)` or `{"class": labels, "box": boxes}`, as a PyTorch loss often does. A plan holds
each array of the targets in a persistent buffer of its own and builds the same structure around
those buffers once, at the trace; every replay copies the new batch's arrays into them.

`flatten(targets)` gives a `spec` (hashable, part of the plan's signature) and the array leaves:
- an ndarray or Tensor is an array leaf (a Tensor by its data);
- a tuple, list or dict holding an array, a Tensor or a dict anywhere inside is a container;
- any other list or tuple (of numbers) is one array leaf, as np.asarray makes it (labels as a list);
- a number, string, bool or None inside a container is a constant: another value is another
  signature (a new plan), as a Python branch on it would need.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import Tensor

_ARRAY = "array"
_CONSTANTS = (bool, int, float, complex, str, bytes, type(None), np.generic)


def is_container(x: Any) -> bool:
    """A dict, or a tuple or list with an array, a Tensor or a dict somewhere inside."""
    if isinstance(x, dict):
        return True
    return isinstance(x, (tuple, list)) and any(isinstance(v, (np.ndarray, Tensor)) or is_container(v) for v in x)


def flatten(targets: Any) -> tuple[tuple, list[np.ndarray]]:
    """(spec, array leaves in order); TypeError naming what a plan cannot hold (an object of another kind)."""
    leaves: list[np.ndarray] = []
    if isinstance(targets, _CONSTANTS):  # a lone number: one 0-d array, as np.asarray made it before
        targets = np.asarray(targets)
    spec = _flatten(targets, leaves, "targets")
    return spec, leaves


def _flatten(x: Any, leaves: list[np.ndarray], where: str) -> tuple:
    if isinstance(x, (np.ndarray, Tensor)) or (isinstance(x, (tuple, list)) and not is_container(x)):
        array = x.data if isinstance(x, Tensor) else _as_array(x, where)
        leaves.append(array)
        return (_ARRAY, array.shape, array.dtype.str)
    if isinstance(x, dict):
        keys = tuple(x)
        return ("dict", keys, tuple(_flatten(x[k], leaves, f"{where}[{k!r}]") for k in keys))
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(_flatten(v, leaves, f"{where}[{i}]") for i, v in enumerate(x)))
    if isinstance(x, _CONSTANTS):
        return ("constant", x)
    return _refuse(x, where)


class UnheldTargetsError(TypeError):
    """Targets a plan cannot hold; `where` names the part (targets, targets[0], ...) and `kind` its type, so a
    caller that is not the fused route (evaluate) can say it in its own words."""

    def __init__(self, message: str, where: str, kind: str) -> None:
        super().__init__(message)
        self.where, self.kind = where, kind


def _as_array(x: Any, where: str) -> np.ndarray:
    try:
        array = np.asarray(x)
    except ValueError as exc:  # ragged nesting
        raise UnheldTargetsError(f"the fused route cannot hold {where}: NumPy cannot make one array of it ({exc}). "
                                 f"Pass an array, or train with route='eager'", where,
                                 f"ragged {type(x).__name__} NumPy cannot make one array of") from None
    if array.dtype == object:
        _refuse(x, where)
    return array


def _refuse(x: Any, where: str):
    kind = f"{type(x).__module__}.{type(x).__qualname__}".removeprefix("builtins.")
    raise UnheldTargetsError(f"the fused route holds targets made of arrays, Tensors, numbers and tuples, lists or "
                             f"dicts of them; {where} is of type {type(x).__name__}. Pass arrays, or train with "
                             f"route='eager', which hands the targets to loss_fn as they are", where, kind)


def build(spec: tuple, buffers: list[np.ndarray]) -> Any:
    """The structure `spec` describes with `buffers` (one per array leaf, in order) in the arrays' places."""
    it = iter(buffers)
    out = _build(spec, it)
    if next(it, None) is not None:
        raise ValueError("more buffers than the spec has arrays")
    return out


def _build(spec: tuple, it) -> Any:
    kind = spec[0]
    if kind == _ARRAY:
        return next(it)
    if kind == "constant":
        return spec[1]
    if kind == "dict":
        return {k: _build(s, it) for k, s in zip(spec[1], spec[2])}
    items = [_build(s, it) for s in spec[1]]
    return tuple(items) if kind == "tuple" else items


__all__ = ["UnheldTargetsError", "build", "flatten", "is_container"]
