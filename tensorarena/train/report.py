"""What one training step reports back."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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


def check_step_options(clip_grad_norm: float | None, on_nonfinite: str) -> None:
    """The step options every route takes (Trainer, StreamingRoute): ValueError naming a bad one."""
    if on_nonfinite not in ("raise", "skip"):
        raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
    if clip_grad_norm is not None and not clip_grad_norm > 0:
        raise ValueError(f"clip_grad_norm must be positive, got {clip_grad_norm}")
