"""NAdam: Adam with Nesterov momentum (torch.optim.NAdam, single-tensor form), with decoupled decay and maximize.

Dozat 2016, "Incorporating Nesterov Momentum into Adam". Besides the moments, torch keeps a
per-parameter scalar, mu_product: the product of the momentum schedule
mu_t = beta1 (1 - 0.5 * 0.96^(t * momentum_decay)) over the steps taken. It lives here as a
0-d float64 entry "mu_product" beside "step" (`scalar_state_init`), and `update_flat`
hands the kernel the product with this step's mu and stores it in place once the kernel ran.
Every caller (the eager step, a fused route holding one mu_product per flat group) passes it in
`state` and so keeps it the same way; a flat group shares one step count, hence one mu_product.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_adam_family, _check_number, _torch_flags


class NAdam(Optimizer):
    """torch.optim.NAdam: Nesterov-accelerated Adam; L2 or decoupled (NAdamW) weight decay."""

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, maximize: bool = False, fused: bool | None = None,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False) -> None:
        _torch_flags("NAdam", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, momentum_decay=momentum_decay,
                        decoupled_weight_decay=decoupled_weight_decay, maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_adam_family(group)
        _check_number("momentum_decay", group["momentum_decay"])

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """First and second moments."""
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    def scalar_state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """torch's running product of the momentum schedule, 1 before the first step."""
        return {"mu_product": 1.0}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One NAdam update of `param` (a tensor or a flat buffer); advances state["mu_product"] in place.

        `state` carries the 0-d "mu_product" besides the state_init arrays (see the module docstring).
        """
        self._check_flat("NAdam", param, grad, state, ("exp_avg", "exp_avg_sq"))
        update, reference = self._kernel("nadam", group)
        beta1, beta2 = group["betas"]
        mu, mu_next = (beta1 * (1.0 - 0.5 * 0.96 ** (t * group["momentum_decay"])) for t in (step, step + 1))
        mu_product = float(state["mu_product"]) * mu
        update(param, grad, state["exp_avg"], state["exp_avg_sq"], step=step, lr=group["lr"], beta1=beta1,
               beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"], mu=mu, mu_next=mu_next,
               mu_product=mu_product, decoupled_weight_decay=group["decoupled_weight_decay"],
               maximize=group["maximize"], scratch=self._scratch_like(param, 2) if reference else None)
        # Stored once the kernel ran, as the caller stores the step count: a kernel that raised leaves both.
        state["mu_product"][...] = mu_product
