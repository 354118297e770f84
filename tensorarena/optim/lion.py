"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): sign of an interpolated momentum.

Not in torch.optim; the signature follows torch's conventions. One state array (the momentum),
half of Adam's. Lion's paper advises an lr 3-10x smaller and a weight decay 3-10x larger than
AdamW's, since every coordinate moves by exactly lr.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_betas, _check_number, _torch_flags


class Lion(Optimizer):
    """Lion: p -= lr * (sign(beta1 m + (1 - beta1) g) + wd p); m = beta2 m + (1 - beta2) g."""

    def __init__(self, params: ParamsT, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, maximize: bool = False, fused: bool | None = None,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False) -> None:
        _torch_flags("Lion", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas,
                        weight_decay=weight_decay, maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_betas(group["betas"])
        _check_number("weight_decay", group["weight_decay"])

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """The momentum (an EMA of the gradient)."""
        return {"exp_avg": 0.0}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One Lion update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        self._check_flat("Lion", param, grad, state, ("exp_avg",))
        update, reference = self._kernel("lion", group)
        beta1, beta2 = group["betas"]
        update(param, grad, state["exp_avg"], lr=group["lr"], beta1=beta1, beta2=beta2,
               weight_decay=group["weight_decay"], maximize=group["maximize"],
               scratch=self._scratch_like(param, 2) if reference else None)
