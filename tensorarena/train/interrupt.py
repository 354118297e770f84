"""Ctrl-C (SIGINT) held off while a training step runs, so a step is applied whole or not at all.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. Inside a step that can be
between two parameter groups' updates, after the update but before the step count or the schedule moved, or
among a streamed step's stage writes: a state no checkpoint should hold and no --resume can continue from.
`SigintDeferred` holds the first Ctrl-C until the step is done and raises KeyboardInterrupt right after it. A
second Ctrl-C during the same step is the user insisting: it stops the step at once with StepAbandoned, whose
message says what that leaves behind.

What is deferred: only Python's own SIGINT handler (signal.default_int_handler, the one that raises
KeyboardInterrupt). A handler the program installed (or SIG_IGN, SIG_DFL) is that program's policy and is left
alone; so is a deferral already in force (an outer one, such as the train job's around loader.next() and the
step), which then delivers the Ctrl-C itself. Off the main thread nothing is done: CPython runs signal handlers
in the main thread only (signal.signal raises ValueError elsewhere), and a Ctrl-C never interrupts a step run
by another thread anyway, since KeyboardInterrupt is raised in the main thread.

Cost: two signal.signal calls and a getsignal per step, a few microseconds against a step's milliseconds.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable


class RunInterrupted(KeyboardInterrupt):
    """`tensorarena train` stopped by Ctrl-C; the message is the one line the command prints (cli.main) before it
    exits with status 130: the step it stopped at and what was saved."""


class StepAbandoned(KeyboardInterrupt):
    """A second Ctrl-C stopped work that the first one was held for (a training step, a checkpoint's write)
    part-way. Its message says what that leaves behind."""


class _Held:
    """The SIGINT handler while a deferral is in force: counts the Ctrl-Cs; the second one raises."""

    __slots__ = ("count", "body_done", "abandoned", "what")

    def __init__(self, abandoned: Callable[[], str], what: str) -> None:
        self.count = 0
        self.body_done = False  # a Ctrl-C after the work ended only counts: nothing is left to abandon
        self.abandoned = abandoned
        self.what = what

    def __call__(self, signum, frame) -> None:
        self.count += 1
        if self.count > 1 and not self.body_done:
            raise StepAbandoned(self.abandoned())
        if self.count == 1 and not self.body_done:
            # Said at once: a streamed step can take many seconds, and a Ctrl-C that seems ignored gets pressed
            # again, abandoning the step. os.write, not sys.stderr: the handler may have interrupted a write to
            # sys.stderr (the progress bar's), and its buffered writer refuses a reentrant call.
            again = "a second SIGTERM abandons it" if signum == signal.SIGTERM else "press Ctrl-C again to abandon it"
            _notice(f"\n{'SIGTERM' if signum == signal.SIGTERM else 'Ctrl-C'}: waiting for {self.what} to complete, "
                    f"then stopping ({again})\n")  # SIGTERM: forwarded by TerminateAsCtrlC


def _notice(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:  # no stderr (closed, or a daemon's): the Ctrl-C is still held and delivered
        pass


class SigintDeferred:
    """`with SigintDeferred(what, abandoned): work` holds a Ctrl-C until `work` ends, then raises KeyboardInterrupt.

    what: the work, for the KeyboardInterrupt's message ("the training step").
    abandoned: called only if a second Ctrl-C stops the work part-way: the StepAbandoned message, saying what
        the work leaves behind (a callable, so a step builds no message it does not need).
    raise_after: False holds a Ctrl-C and raises nothing after: for work done while already stopping (the
        checkpoint written after a Ctrl-C), where a second Ctrl-C still abandons it.

    The previous handler is restored on the way out, also on an error. If the work raised while a Ctrl-C was
    held, KeyboardInterrupt is raised all the same (the user asked to stop), chained to that error.
    """

    __slots__ = ("what", "abandoned", "raise_after", "_held", "_previous")

    def __init__(self, what: str, abandoned: Callable[[], str], *, raise_after: bool = True) -> None:
        self.what = what
        self.abandoned = abandoned
        self.raise_after = raise_after  # False: the caller is stopping anyway
        self._held: _Held | None = None
        self._previous = None

    def __enter__(self) -> "SigintDeferred":
        # Off the main thread signal.signal cannot be called (ValueError) and no Ctrl-C lands here: nothing to do.
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.default_int_handler:  # the program's own policy, or an outer deferral
            return self
        self._previous, self._held = previous, _Held(self.abandoned, self.what)
        signal.signal(signal.SIGINT, self._held)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        held = self._held
        if held is None:
            return False
        held.body_done = True
        self._held = None
        signal.signal(signal.SIGINT, self._previous)
        if held.count == 0 or isinstance(exc, KeyboardInterrupt) or not self.raise_after:
            return False  # nothing held, the work already stops with a KeyboardInterrupt, or the caller stops
        if exc is None:
            raise KeyboardInterrupt(f"Ctrl-C was held until {self.what} completed")
        raise KeyboardInterrupt(f"Ctrl-C was held while {self.what} ran, and it failed with "
                                f"{type(exc).__name__}: {exc}") from exc


class TerminateAsCtrlC:
    """`with TerminateAsCtrlC() as term: work`: a SIGTERM (a job scheduler's or a container's stop, `timeout`,
    `kill`) does what Ctrl-C does: the step in progress completes, `tensorarena train` saves it to --save and
    stops; afterwards term.received says it was SIGTERM (cli.main then exits with 143, 128 + SIGTERM).

    Without it SIGTERM killed the process at once and a run with --save lost every step since its last save.
    SIGTERM is taken over only where Ctrl-C itself stops the program (SIGINT has Python's own handler, or a
    deferral's) and SIGTERM has no handler of the program's: a background job started with SIGINT ignored, or a
    program embedding cli.main with its own policy, keeps what it had. Main thread only, as SigintDeferred."""

    __slots__ = ("received", "_previous")

    def __init__(self) -> None:
        self.received = False
        self._previous = None

    def __enter__(self) -> "TerminateAsCtrlC":
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGTERM, self._as_ctrl_c)
        return self

    def _as_ctrl_c(self, signum, frame) -> None:
        self.received = True
        handler = signal.getsignal(signal.SIGINT)  # a deferral's _Held during a step, else Python's own
        if callable(handler):
            handler(signum, frame)
        else:  # SIGINT's handler was changed to SIG_IGN or SIG_DFL inside the work: stop as SIGTERM would
            raise KeyboardInterrupt("SIGTERM")

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        return False


def abandoned_step_message(index: int, route: str) -> str:
    """What a second Ctrl-C during step `index` leaves behind, on `route`."""
    head = (f"step {index} was abandoned part-way by a second Ctrl-C (the first was being held until the step "
            f"completed). ")
    if route == "streaming":
        # stream/route.py StreamingRoute._abort: a step that wrote some stages marks the route broken; one cut
        # during its commit is whole and committed at the next use; one cut before any write changed nothing.
        return head + ("On the streaming route, a step stopped before it wrote a stage changed nothing; one "
                       "stopped while writing stages leaves the route refusing to train on until a checkpoint "
                       "is loaded; one stopped during its commit is whole and is committed at the next use. A note "
                       "below, if any, says which. To be safe, load the last checkpoint (trainer.load(path)).")
    return head + ("The parameters, the optimizer's state and the schedule may hold part of the step (some "
                   "parameters updated, others not; a note below says so where the route knows it). Do not save "
                   "or train on from this state: load the last checkpoint (trainer.load(path)).")
