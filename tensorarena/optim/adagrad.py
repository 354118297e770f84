"""Adagrad (torch.optim.Adagrad, dense single-tensor form): lr decay, weight decay, initial accumulator, maximize.

torch creates Adagrad's state for every parameter in the constructor; here it is made at a
parameter's first step like every other optimizer's, so a state_dict taken before any step
has no entries for it (the values, once there, are the same).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_number, _torch_flags


class Adagrad(Optimizer):
    """torch.optim.Adagrad: per-coordinate step sizes lr / sqrt(sum of squared gradients)."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False,
                 fused: bool | None = None, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False) -> None:
        _torch_flags("Adagrad", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_number("lr_decay", group["lr_decay"])
        _check_number("weight_decay", group["weight_decay"])
        _check_number("initial_accumulator_value", group["initial_accumulator_value"])
        _check_number("eps", group["eps"], what="epsilon value")

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """The running sum of squared gradients, starting at initial_accumulator_value."""
        return {"sum": float(group["initial_accumulator_value"])}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One Adagrad update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        self._check_flat("Adagrad", param, grad, state, ("sum",))
        update, reference = self._kernel("adagrad", group)
        update(param, grad, state["sum"], step=step, lr=group["lr"], lr_decay=group["lr_decay"],
               weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
               scratch=self._scratch_like(param, 2) if reference else None)
