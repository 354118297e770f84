"""Optimizers (class -> functional -> per-tensor update), lr schedules and gradient clipping (torch.optim names)."""

from . import lr_scheduler
from .adam import Adam, AdamW, adam
from .clip import clip_grad_norm_, clip_grad_value_
from .optimizer import Optimizer
from .sgd import SGD, sgd, sgd_update

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler", "clip_grad_norm_", "clip_grad_value_",
           "sgd", "sgd_update", "adam"]
