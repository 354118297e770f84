"""ASGD (torch.optim.ASGD, dense single-tensor form): SGD with a decaying step size and a running average.

Polyak & Juditsky 1992, "Acceleration of Stochastic Approximation by Averaging". torch's form
keeps three per-parameter values besides the averaged parameters "ax": the step size
eta_t = lr / (1 + lambd lr t)^alpha and the averaging weight mu_t = 1 / max(1, t - t0), each
computed at the end of step t for step t + 1. They live here as 0-d float64 entries "eta" and
"mu" beside "step" (`scalar_state_init`), and `update_flat` hands the kernel the stored values
and stores the next ones in place once the kernel ran. Every caller (the eager step, a fused
route holding one of each per flat group, the streaming route's store) passes them in `state`
and so keeps them the same way; they depend on the step count and the group's settings only,
so a flat group, sharing one count, shares them too.

torch keeps eta and mu (like every step count) in its default dtype, float32 unless changed; ours
are float64 whatever the parameter dtype, as NAdam's mu_product is.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_number, _torch_flags


class ASGD(Optimizer):
    """torch.optim.ASGD: averaged SGD; the average of the iterates is state "ax"."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0.0, foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False, *, fused: bool | None = None) -> None:
        _torch_flags("ASGD", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, maximize=maximize,
                        fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_number("weight_decay", group["weight_decay"])
        # torch does not check these; a NaN or a non-number would only surface as NaN weights or a failed step.
        for name in ("lambd", "alpha", "t0"):
            _check_number(name, group[name], low=-math.inf)

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """The running average of the parameter."""
        return {"ax": 0.0}

    def scalar_state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """torch's step size (lr before the first step) and averaging weight (1: ax follows the parameter)."""
        return {"eta": float(group["lr"]), "mu": 1.0}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One ASGD update of `param` (a tensor or a flat buffer); advances state["eta"] and state["mu"] in place.

        `state` carries the 0-d "eta" and "mu" besides the "ax" array (see the module docstring).
        """
        self._check_flat("ASGD", param, grad, state, ("ax",))
        lr, lambd = group["lr"], group["lambd"]
        base = 1 + lambd * lr * step
        if not base > 0:  # a negative lambd; the power would be complex (or divide by zero)
            raise ValueError(f"ASGD: 1 + lambd * lr * step = {base} at step {step:g} (lambd={lambd}, lr={lr}); "
                             f"the step size lr / (1 + lambd * lr * step) ** alpha needs it positive: use lambd >= 0")
        eta_next = lr / base ** group["alpha"]
        mu_next = 1 / max(1, step - group["t0"])
        update, reference = self._kernel("asgd", group)
        update(param, grad, state["ax"], eta=float(state["eta"]), mu=float(state["mu"]), lambd=lambd,
               weight_decay=group["weight_decay"], maximize=group["maximize"],
               scratch=self._scratch_like(param, 2) if reference else None)
        # Stored once the kernel ran, as the caller stores the step count: a kernel that raised leaves all three.
        state["eta"][...] = eta_next
        state["mu"][...] = mu_next
