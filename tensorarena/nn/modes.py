"""Train/eval modes as a training loop should treat them: each module's own, changed only where it must be.

torch keeps a `training` flag per module. A user who freezes part of a model puts that part in eval mode after
model.train() (a backbone's dropout off), and expects it to stay so while the rest trains. The Trainer set
model.train() at every step and evaluate() put back only the top-level flag, which model.train(flag) hands
to every submodule, so such a part trained with its dropout on again; plan() and compile() left an eval-mode
model in train mode.

Now a step trains the model (model.train()) only when the model itself is in eval mode (after the user's
model.eval(), as a torch loop calls model.train() each epoch); a model already training keeps each submodule's
mode. What only looks at the model (evaluate, plans, traces, predict) puts every module's mode back as it was.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .module import Module


def ensure_training(model: Module) -> None:
    """Train mode for a step: model.train() when the model is in eval mode, else each module as it is."""
    if not model.training:
        model.train()


def modes(model: Module) -> tuple[bool, ...]:
    """Every module's `training` flag, in named_modules() order: a fused plan is traced under these (a dropout in
    eval mode is no dropout in the plan), so they are part of the plan's key."""
    return tuple(m.training for _, m in model.named_modules())


def saved_modes(model: Module) -> list[tuple[Module, bool]]:
    """Every module with its mode now, for restore_modes."""
    return [(m, m.training) for _, m in model.named_modules()]


def restore_modes(saved: list[tuple[Module, bool]]) -> None:
    for module, training in saved:
        module.training = training


@contextlib.contextmanager
def kept_modes(model: Module) -> Iterator[None]:
    """Every module's mode put back as it was when the block ends, also on an error."""
    saved = saved_modes(model)
    try:
        yield
    finally:
        restore_modes(saved)
