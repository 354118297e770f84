"""RAdam (torch.optim.RAdam, dense single-tensor form): Adam whose adaptive step is rectified, or held off.

Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and Beyond". The rectification
term and whether it applies yet depend on the step count alone (kernels/radam.py computes them
from the `step` every caller passes), so RAdam keeps no scalar state besides "step" and a flat
group, sharing one count, shares them too. decoupled_weight_decay=True is RAdamW.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_adam_family, _torch_flags


class RAdam(Optimizer):
    """torch.optim.RAdam: rectified Adam; L2 or decoupled (RAdamW) weight decay."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        _torch_flags("RAdam", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, decoupled_weight_decay=decoupled_weight_decay,
                        maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_adam_family(group)

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """First and second moments."""
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One RAdam update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        self._check_flat("RAdam", param, grad, state, ("exp_avg", "exp_avg_sq"))
        update, reference = self._kernel("radam", group)
        beta1, beta2 = group["betas"]
        update(param, grad, state["exp_avg"], state["exp_avg_sq"], step=step, lr=group["lr"], beta1=beta1,
               beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
               decoupled_weight_decay=group["decoupled_weight_decay"], maximize=group["maximize"],
               scratch=self._scratch_like(param, 2) if reference else None)
