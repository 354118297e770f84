"""Adadelta (torch.optim.Adadelta, dense single-tensor form): steps scaled by RMS(past steps) / RMS(gradients).

Zeiler 2012, "ADADELTA: An Adaptive Learning Rate Method". torch multiplies the step by lr
(1.0 by default, the paper's update).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_number, _torch_flags


class Adadelta(Optimizer):
    """torch.optim.Adadelta: p -= lr * sqrt(u + eps) / sqrt(v + eps) * g, with running means v of g^2, u of steps^2."""

    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, foreach: bool | None = None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False, fused: bool | None = None) -> None:
        _torch_flags("Adadelta", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_number("rho", group["rho"], high=1.0)
        _check_number("eps", group["eps"], what="epsilon value")
        _check_number("weight_decay", group["weight_decay"])

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """Running means of the squared gradients and of the squared steps."""
        return {"square_avg": 0.0, "acc_delta": 0.0}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One Adadelta update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        self._check_flat("Adadelta", param, grad, state, ("square_avg", "acc_delta"))
        update, reference = self._kernel("adadelta", group)
        update(param, grad, state["square_avg"], state["acc_delta"], lr=group["lr"], rho=group["rho"],
               eps=group["eps"], weight_decay=group["weight_decay"], maximize=group["maximize"],
               scratch=self._scratch_like(param, 3) if reference else None)
