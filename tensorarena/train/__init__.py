"""Training: the Trainer and its routes (eager, fused, streaming), route planning, checkpoints."""

from .report import NonFiniteLossError, StepReport
from .trainer import Trainer

__all__ = ["Trainer", "StepReport", "NonFiniteLossError"]
