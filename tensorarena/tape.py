"""Recording a fused step as a flat list of calls (compile/step.py's captured replay).

While a `Tape` records (`with tape.recording():`), every kernel handed out by `kernels.kernel`
and every call made through `host(fn, ...)` is run and appended to `tape.entries` as (fn, args,
kwargs): the step's work on arrays, in order. Calls made from inside a recorded call are not
recorded again (the outer call repeats them). A replay calls the entries again on the same
arrays, with none of the Python that chose them.

`host` is how code outside the kernels writes arrays during a step (a copy into a contiguous
buffer, a gradient accumulated with NumPy, the optimizer's per-parameter update): wrapped so,
the write belongs to the recording. A plain NumPy write that bypasses it is missing from the
tape; compile/step.py's verification finds that out before a tape is used.

Not thread-shared: the recording is per thread, like the step arena.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

_local = threading.local()


class Tape:
    """The calls of one recorded step: `entries`, plus the arena buffers allocated inside them."""

    def __init__(self) -> None:
        self.entries: list[tuple[Callable, tuple, dict]] = []
        self.allocations: list[int] = []  # plan buffer indices handed out inside recorded calls, in order
        self.depth = 0  # > 0 while a recorded call runs
        # Values the step's Python read out of its tensors (item(), float(), bool(), numpy(), tolist()) outside
        # any recorded call: a replay of the tape would go on with the values read now (note_host_read).
        self.reads: list[str] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator["Tape"]:
        if getattr(_local, "tape", None) is not None:
            raise RuntimeError("a step is already being recorded in this thread")
        _local.tape = self
        try:
            yield self
        finally:
            _local.tape = None

    def call(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        if self.depth:
            return fn(*args, **kwargs)
        self.entries.append((fn, args, kwargs))
        self.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self.depth -= 1


def note_host_read(what: str) -> None:
    """Tensor.item() and friends tell the recording tape, if any, that the Python read a value out of a tensor:
    a branch or a scale taken from it is Python a replay does not run again (compile/captured.py refuses it)."""
    tape = getattr(_local, "tape", None)
    if tape is not None and not tape.depth:
        tape.reads.append(what)


def active() -> Tape | None:
    """The tape recording in this thread, if any."""
    return getattr(_local, "tape", None)


def host(fn: Callable, *args, **kwargs) -> Any:
    """fn(*args, **kwargs), recorded as one entry while a step is being recorded."""
    tape = getattr(_local, "tape", None)
    if tape is None:
        return fn(*args, **kwargs)
    return tape.call(fn, args, kwargs)


def recorded(fn: Callable, count: Callable[[], None]) -> Callable:
    """`fn` wrapped so that calling it goes through `host` (kernels.kernel hands these out while recording).
    `count` runs on every call, recorded or replayed: kernels.calls keeps counting the implementation
    that served a kernel when a replay no longer asks kernels.kernel for it.

    A kernel may offer `fn.prepare(*args, **kwargs)`: it checks the call as `fn` would and returns a
    zero-argument function that does the same work on the same arrays without checking or planning
    again (or None when some of that work must be redone each call). Recorded at the top level, the
    prepared function is what the replays run; the entry keeps the arguments for the capture's checks."""
    def counted(*args, **kwargs):
        count()
        return fn(*args, **kwargs)

    prepare = getattr(fn, "prepare", None)

    def call(*args, **kwargs):
        tape = getattr(_local, "tape", None)
        if tape is None or tape.depth or prepare is None:
            return host(counted, *args, **kwargs)
        run = prepare(*args, **kwargs)
        if run is None:
            return host(counted, *args, **kwargs)

        def prepared(*_args, **_kwargs):  # the entry's arguments are for reading, not for the call
            count()
            return run()
        return tape.call(prepared, args, kwargs)
    call.__wrapped__ = fn
    return call
