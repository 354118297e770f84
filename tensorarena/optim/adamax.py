"""Adamax (torch.optim.Adamax, dense single-tensor form): Adam with an infinity-norm second moment.

Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", section 7.1: the second moment
becomes an exponentially weighted max of |g| (exp_inf), which needs no bias correction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_adam_family, _torch_flags


class Adamax(Optimizer):
    """torch.optim.Adamax: p -= lr / (1 - beta1^t) * m / max(beta2 u, |g| + eps); L2 weight decay."""

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False, capturable: bool = False,
                 fused: bool | None = None) -> None:
        _torch_flags("Adamax", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_adam_family(group)

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """First moment and the exponentially weighted infinity norm."""
        return {"exp_avg": 0.0, "exp_inf": 0.0}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One Adamax update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        self._check_flat("Adamax", param, grad, state, ("exp_avg", "exp_inf"))
        update, reference = self._kernel("adamax", group)
        beta1, beta2 = group["betas"]
        update(param, grad, state["exp_avg"], state["exp_inf"], step=step, lr=group["lr"], beta1=beta1, beta2=beta2,
               eps=group["eps"], weight_decay=group["weight_decay"], maximize=group["maximize"],
               scratch=self._scratch_like(param, 2) if reference else None)
