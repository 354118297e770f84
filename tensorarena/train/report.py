"""What one training step reports back."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable


@dataclass(frozen=True)
class StepReport:
    """Per-step facts: which route ran, how long it took and what memory it used."""

    step: int  # 1-based index of this step
    loss: float
    route: str  # "eager", "fused" or "streaming"
    seconds: float
    arena_high_water: int  # bytes: most the step arena held at once
    rss: int  # bytes: process resident set size right after the step
    lr: float  # learning rate the update used (first param group)
    grad_norm: float | None = None  # global norm before clipping, when clipping is on
    skipped: bool = False  # True when a non-finite loss was skipped (on_nonfinite="skip")

    def as_dict(self) -> dict:
        return asdict(self)


class NonFiniteLossError(FloatingPointError):
    """The loss was NaN or infinite; the step was not applied."""


class StoreDirError(ValueError):
    """store_dir cannot hold this trainer's streaming store (a file, not writable or creatable, or holding
    another run to resume where the trainer has a state of its own)."""


def save_after_error(err: Exception, trainer, save: Callable[[], str]) -> None:
    """A CLI job's step (or its evaluation or save) failed with `err`: keep the completed steps by `save` (which
    writes --save and returns the sentence saying so, empty when there is nothing to write) and add that sentence
    to the error. A failed step changes nothing on every route (a MemoryError in a forward, a loss that raises: a
    helper's hunt compared the whole state with a run that never failed), so this writes exactly the last
    completed step, as a non-finite loss and Ctrl-C already did; before, any other error lost every step of
    the run. Not when the step stopped part-way (a PartlyAppliedError: half a step would be saved) or left a
    streaming store broken."""
    from ..optim.optimizer import PartlyAppliedError

    if isinstance(err, PartlyAppliedError) or getattr(getattr(trainer, "stream", None), "_broken", None):
        return
    try:
        said = save()
    except Exception as failed:  # noqa: BLE001 - the step's error is the one to raise; this is said with it
        err.add_note(f"Saving the steps before it to --save failed too ({type(failed).__name__}: {failed}).")
        return
    if said:
        err.add_note(said.strip())


def with_notes(err: BaseException) -> str:
    """str(err) followed by its notes (add_note), for a message printed as one line without a traceback."""
    parts = [str(err), *getattr(err, "__notes__", ())]
    return " ".join(part if part.endswith((".", "!", "?", ")")) or part is parts[-1] else part + "."
                    for part in parts)


def check_scheduler(scheduler, optimizer, stepper: str = "the Trainer") -> None:
    """A ValueError for a scheduler `stepper` (the Trainer, or compile_step's FusedStep) cannot step after each
    update: one whose step needs a metric (ReduceLROnPlateau: step 1 applied its update and then failed, and so did
    every step), or one built on another optimizer than `optimizer` (when given: it stepped that one's lr, the
    trained optimizer's never moved)."""
    from ..optim.lr_scheduler import ReduceLROnPlateau

    trainer = stepper == "the Trainer"
    scheduled = getattr(scheduler, "optimizer", None)  # a scheduler of one's own may have none: not checked
    if scheduled is not None and optimizer is not None and scheduled is not optimizer:
        rebuild = ("Build it on the Trainer's optimizer (after trainer.optimizer = new, set trainer.scheduler to a "
                   "scheduler of the new one, or None)" if trainer else "Build it on the optimizer given to "
                                                                        "compile_step")
        raise ValueError(f"the scheduler ({type(scheduler).__name__}) was built on another optimizer "
                         f"({type(scheduled).__name__} at {id(scheduled):#x}) than the one {stepper} steps "
                         f"({type(optimizer).__name__} at {id(optimizer):#x}): its schedule would move that one's lr. "
                         f"{rebuild}")
    if isinstance(scheduler, ReduceLROnPlateau):
        if trainer:
            how = ("build the Trainer without it (scheduler=None) and step it yourself, "
                   "sched.step(trainer.evaluate(x_val, y_val)['loss']), after each evaluation; the new lr takes effect "
                   "at the next step on every route. Keep its state in your checkpoints with "
                   "trainer.save(path, extra={'plateau': sched.state_dict()})")
        else:
            how = ("compile the step without it (scheduler=None) and step it yourself, sched.step(val_loss), after "
                   "each evaluation; the new lr takes effect at the next step")
        raise ValueError(f"ReduceLROnPlateau steps on a metric (the held-out loss), which {stepper} does not have "
                         f"after an update: {how}")


def check_step_options(clip_grad_norm: float | None, on_nonfinite: str) -> None:
    """The step options every route takes (Trainer, StreamingRoute): ValueError naming a bad one."""
    if on_nonfinite not in ("raise", "skip"):
        raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
    if clip_grad_norm is not None and not clip_grad_norm > 0:
        raise ValueError(f"clip_grad_norm must be positive, got {clip_grad_norm}")
