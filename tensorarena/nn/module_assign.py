"""Module.load_state_dict(assign=True): the model takes the checkpoint's arrays themselves, no copy.

As torch's assign=True, a parameter or buffer then holds the checkpoint's array (the same memory, in the
checkpoint's dtype), and an assigned parameter starts with no gradient. Unlike torch's, a parameter keeps its
Parameter object and only points it at the new array: optimizers, a Trainer and its fused route hold the Parameter
objects, so what was built before the load trains the loaded values (new objects, as torch makes, would leave them
training parameters the model no longer has, with no error). The fused route, whose parameters are views of its
flat buffers, sees a parameter pointed elsewhere at its next step and copies the values into its buffers, as it
does for `p.data = array` (from then on the model no longer shares the caller's memory); a buffer assigned anew
makes it record the step again. A model built under nn.deferred_init() is filled without making its values first
(torch's meta-device load).

The model then trains the checkpoint's memory in place, so an array it could not use that way is refused, before
anything is assigned: one in a dtype tensorarena has no kernels for, read-only, not C-contiguous, not in the
machine's byte order, or a tensor living in an arena; and two separate parameters given overlapping memory (a
checkpoint of tied weights loaded into an untied model), which the eager route would update twice in one place and
the fused route would silently untie.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import increment_version
from ..tensor import SUPPORTED_FLOATS, Tensor
from .parameter import Parameter

_NO_ASSIGN = "load without assign=True (the values are then copied into the model's arrays)"


def check(key: str, target: Any, value: Any, src: np.ndarray) -> str | None:
    """Why the checkpoint's array `src` (read from `value`) cannot become `target`'s memory, or None.

    `target` is the model's parameter or buffer under `key`. Its current values are not read: a deferred parameter
    has none and is assigned all the same.
    """
    if isinstance(target, Tensor) and not (isinstance(target, Parameter) and target.is_deferred):
        target.data  # read for its check: raises, as the copy does, for a parameter the streaming store holds
    if isinstance(value, Tensor) and value._arena is not None:
        return (f"cannot assign {key}: the checkpoint's tensor lives in an arena, whose memory goes to other tensors "
                f"when it is reset; pass its values (t.numpy()), or {_NO_ASSIGN}")
    if src.shape != target.shape:
        return (f"size mismatch for {key}: copying a value with shape {tuple(src.shape)} from the checkpoint, the "
                f"shape in the current model is {tuple(target.shape)}")
    if not src.dtype.isnative:
        return f"cannot assign {key}: the checkpoint's array is not in this machine's byte order; {_NO_ASSIGN}"
    floats = " or ".join(map(str, SUPPORTED_FLOATS))
    if target.dtype.kind == "f" and src.dtype not in SUPPORTED_FLOATS:
        return (f"cannot assign {key}: the checkpoint's {src.dtype} would become the model's dtype, and a floating "
                f"parameter or buffer here is {floats}; convert the checkpoint, or {_NO_ASSIGN}")
    if target.dtype.kind != "f" and src.dtype.kind != target.dtype.kind:
        return (f"cannot assign {key}: the checkpoint's {src.dtype} cannot replace the model's {target.dtype} (another "
                f"kind of number); {_NO_ASSIGN}")
    if not src.flags.writeable:
        return (f"cannot assign {key}: the checkpoint's array is read-only (a memory map or a broadcast view), and "
                f"the model would be trained in it in place; pass a writable copy (np.array(value)), or {_NO_ASSIGN}")
    if not src.flags.c_contiguous:
        return (f"cannot assign {key}: the checkpoint's array is not C-contiguous (a transposed or strided view), "
                f"which the kernels need; pass np.ascontiguousarray(value), or {_NO_ASSIGN}")
    return None


def overlaps(assigned: list[tuple[str, Any, np.ndarray]]) -> list[str]:
    """One message for each array that overlaps an earlier one given to another target. (key, target, array)
    triples; the arrays are C-contiguous (checked), so each spans [address, address + nbytes)."""
    spans = sorted(((a.ctypes.data, a.ctypes.data + a.nbytes, key, target) for key, target, a in assigned if a.nbytes),
                   key=lambda span: span[:2])  # by address only: a tie must not compare the targets (arrays)
    problems = []
    reach, reach_key, reach_target = 0, None, None  # the span reaching furthest so far
    for start, end, key, target in spans:
        if start < reach and target is not reach_target:
            problems.append(f"cannot assign {key} and {reach_key}: their arrays in the checkpoint share memory but "
                            f"they are separate in the model, so training would update that memory twice over; tie "
                            f"them in the model, or {_NO_ASSIGN}")
        if end > reach:
            reach, reach_key, reach_target = end, key, target
    return problems


def bind(owner: Any, name: str, target: Any, src: np.ndarray) -> None:
    """Make `src` the memory of `target`, found as attribute `name` of module `owner`."""
    if isinstance(target, Tensor):
        target._release_grad()  # as torch's assigned parameter: a gradient of the old values does not carry over
        target.data = src  # the same Parameter (or Tensor buffer) object: see the module docstring
        increment_version(target)  # a graph built before the load must not differentiate at the new values
    else:
        object.__setattr__(owner, name, src)  # an ndarray buffer: the array itself
