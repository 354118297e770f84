"""Undoing the in-place writes an extra run of a step makes to memory that outlives it.

The fused route runs a step's Python more often than eager does: its trace, route="auto"'s planning trace and a
recording's checking passes each run the forward once more. A forward that writes a parameter in place under
no_grad (a mean-teacher or BYOL target network's moving average, `t.mul_(m).add_(s, alpha=1 - m)`) then got one
update per extra run that eager never made. The generators, the buffers and the modules' plain values are put
back after such a run (step_state.py, watched_state.py); this puts back the rest: while a `WriteJournal` is
open, the first in-place write through a Tensor op (every one asks ops.arith.writable for the array) to memory
no arena owns (parameters, buffers, tensors kept across steps) copies the bytes it is about to change, and
`undo()` writes them back, last first. Arena memory is the run's own and dies with it: not copied. A write
straight into a NumPy array (`p.data[...] = x`) passes no Tensor op and is not seen, as autograd's version
counter does not see it either.

The copies last as long as the journal (one extra run): the bytes of what the forward writes, once each.
"""

from __future__ import annotations

import threading

import numpy as np

_local = threading.local()


class WriteJournal:
    """`with WriteJournal() as journal:` ...; `journal.undo()` puts every noted array back (repeatable: a captured
    replay's tape writes the same arrays again, and is undone with the same copies)."""

    def __init__(self) -> None:
        self.entries: list[tuple[np.ndarray, np.ndarray]] = []
        self._seen: set[tuple[int, tuple, tuple]] = set()
        self._outer = None

    def __enter__(self) -> "WriteJournal":
        self._outer = getattr(_local, "journal", None)
        _local.journal = self
        return self

    def __exit__(self, *exc) -> None:
        _local.journal = self._outer

    def note(self, array: np.ndarray) -> None:
        key = (array.__array_interface__["data"][0], array.shape, array.strides)
        if key not in self._seen:
            self._seen.add(key)
            self.entries.append((array, array.copy()))

    def undo(self) -> None:
        for array, before in reversed(self.entries):
            np.copyto(array, before)

    @property
    def written(self) -> int:
        """How many arrays were noted."""
        return len(self.entries)


def note_write(tensor, array: np.ndarray) -> None:
    """Called before an in-place write of `array` (`tensor`'s): noted if a journal is open and no arena owns it."""
    journal = getattr(_local, "journal", None)
    if journal is not None and tensor._arena is None:
        journal.note(array)


def undo_open_journal() -> None:
    """Undo the open journal's writes so far, if one is open (a recording's checking pass ends: each starts from
    what the capture found, compile/captured.py)."""
    journal = getattr(_local, "journal", None)
    if journal is not None:
        journal.undo()
