"""Tracing one training step: which buffers it allocates, in what order, and when each dies.

While a `TracingArena` is the current arena, every transient buffer an op asks for
(`memory.arena.empty`, which `ops._base.new`/`grad_out` use) is a fresh heap array
of its own. The tracer writes down, for buffer number i: its shape, dtype, the op
that asked for it, and the allocation number at which the array object died (a
weakref finalizer fires when the last view of it goes). Because a replayed step runs
the same Python with the same shapes, buffer i is requested at the same point and
nothing reads it after its death point, so buffer j requested after i died may share
i's bytes. `compile.step` turns these lifetimes into one slab with `plan_memory`.

Tracing never allocates from a step arena (the system we learned from traced inside
one, recycled the plan's own buffers and trained on zero gradients): the traced
buffers are private heap arrays, big ones anonymous mmaps that go back to the
operating system the moment they die, so the trace step leaves no RSS behind.
"""

from __future__ import annotations

import mmap
import sys
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..memory.arena import Arena, current_arena

# Below this a buffer comes from NumPy's allocator; above it from its own mmap.
_MMAP_MIN_BYTES = 1 << 16
# Frames inside these files are plumbing, not the op that asked for memory.
_PLUMBING = ("memory/arena.py", "ops/_base.py", "compile/trace.py", "autograd.py")

_tracing = threading.local()


class UnsupportedOpError(RuntimeError):
    """The traced step used something a replayed plan cannot reproduce."""


class UnsupportedInputError(UnsupportedOpError, TypeError):
    """A batch the fused route cannot hold in its plan's input buffer (a dict, an object), which the eager route
    hands to the model as it is: a TypeError, and an UnsupportedOpError, so that fallback_to_eager=True applies."""


class UnsupportedOptimizerError(UnsupportedOpError, TypeError):
    """An optimizer whose step() the fused route would bypass (it runs update_flat over flat buffers): a TypeError,
    and an UnsupportedOpError, so that fallback_to_eager=True applies."""


class PlanMismatchError(RuntimeError):
    """A replayed step asked for different buffers than the traced one (input-dependent control flow)."""


def is_tracing() -> bool:
    """True while a step is being traced on this thread."""
    return getattr(_tracing, "active", False)


def unsupported(op: str, why: str) -> None:
    """Called by ops a plan cannot replay (data-dependent shapes, host reads); raises only while tracing."""
    if is_tracing():
        raise UnsupportedOpError(
            f"the fused route cannot trace '{op}': {why}. Rewrite the step without it, or train with "
            f"route='eager' (Trainer(..., fallback_to_eager=True) falls back automatically and logs why).")


@dataclass
class TracedBuffer:
    """One transient buffer of the traced step."""

    index: int  # allocation number within the step
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    op: str  # "module.function" of the op that asked for it
    death: int | None = None  # allocation count when it died; None = alive at the end of the step


def _caller_op() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not name.endswith(_PLUMBING):
            module = frame.f_globals.get("__name__", "?").removeprefix("tensorarena.")
            return f"{module}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _heap_array(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    if nbytes < _MMAP_MIN_BYTES:
        return np.empty(shape, dtype)
    # Its own mapping: unmapped (RSS returned) as soon as the array and its views are gone.
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)


class TracingArena(Arena):
    """The arena a step is traced in: private heap buffers, each one's lifetime recorded."""

    def __init__(self, name: str = "tracing arena") -> None:
        super().__init__(name=name)
        self.buffers: list[TracedBuffer] = []
        self._finalizers: list[weakref.finalize] = []

    def __enter__(self) -> "TracingArena":
        outer = current_arena()
        self.outer_name = outer.name if outer is not None else None
        super().__enter__()
        _tracing.active = True
        return self

    def __exit__(self, *exc) -> None:
        _tracing.active = False
        super().__exit__(*exc)

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * dtype.itemsize
        array = _heap_array(shape, dtype, nbytes)
        record = TracedBuffer(index=len(self.buffers), shape=shape, dtype=dtype, nbytes=nbytes, op=_caller_op())
        self.buffers.append(record)
        base = array
        while isinstance(base.base, np.ndarray):  # views keep their ultimate ndarray base alive, not us
            base = base.base
        self._finalizers.append(weakref.finalize(base, self._died, record))
        self.stats.allocations += 1
        self.stats.bytes_in_use += nbytes
        self.stats.high_water = max(self.stats.high_water, self.stats.bytes_in_use)
        return array

    def _died(self, record: TracedBuffer) -> None:
        if record.death is None:
            record.death = len(self.buffers)
            self.stats.bytes_in_use -= record.nbytes

    def lifetimes(self) -> list:
        """Each traced buffer as a planner BufferSpec: live from its allocation to the last
        allocation before it died (to the end of the step if it never did)."""
        from .planner import BufferSpec

        n = len(self.buffers)
        return [BufferSpec(str(b.index), b.nbytes, b.index, n - 1 if b.death is None else max(b.index, b.death - 1))
                for b in self.buffers]

    def finish(self) -> list[TracedBuffer]:
        """Stop watching; buffers still alive are alive until the end of the step."""
        for fin in self._finalizers:
            fin.detach()
        self._finalizers.clear()
        return self.buffers
