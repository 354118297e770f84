"""RMSprop (torch.optim.RMSprop, single-tensor form): centered variant, momentum, weight decay, maximize."""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_number, _torch_flags


class RMSprop(Optimizer):
    """torch.optim.RMSprop: divide the gradient by a running RMS of its recent magnitudes."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, *,
                 maximize: bool = False, fused: bool | None = None, foreach: bool | None = None,
                 capturable: bool = False, differentiable: bool = False) -> None:
        _torch_flags("RMSprop", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                        centered=centered, maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_number("eps", group["eps"], what="epsilon value")
        _check_number("momentum", group["momentum"])
        _check_number("weight_decay", group["weight_decay"])
        _check_number("alpha", group["alpha"])

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """Running mean of g^2; a momentum buffer with momentum; the running mean of g when centered."""
        init = {"square_avg": 0.0}
        if group["momentum"] > 0:
            init["momentum_buffer"] = 0.0
        if group["centered"]:
            init["grad_avg"] = 0.0
        return init

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One RMSprop update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        self._check_flat("RMSprop", param, grad, state, self.state_init(group))
        update, reference = self._kernel("rmsprop", group)
        momentum = group["momentum"]
        update(param, grad, state["square_avg"], state["grad_avg"] if group["centered"] else None,
               state["momentum_buffer"] if momentum > 0 else None, lr=group["lr"], alpha=group["alpha"],
               eps=group["eps"], weight_decay=group["weight_decay"], momentum=momentum, maximize=group["maximize"],
               scratch=self._scratch_like(param, 2) if reference else None)
