"""Optimizers (class -> functional -> per-tensor update), lr schedules and gradient clipping (torch.optim names)."""

from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW, adam
from .adamax import Adamax
from .asgd import ASGD
from .clip import clip_grad_norm_, clip_grad_value_
from .lamb import LAMB
from .lion import Lion
from .nadam import NAdam
from .optimizer import Optimizer
from .radam import RAdam
from .rmsprop import RMSprop
from .rprop import Rprop
from .sgd import SGD, sgd, sgd_update

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "NAdam", "RMSprop", "Adagrad", "Lion", "LAMB", "Adamax", "RAdam",
           "Adadelta", "Rprop", "ASGD", "lr_scheduler", "clip_grad_norm_", "clip_grad_value_", "sgd", "sgd_update",
           "adam"]
