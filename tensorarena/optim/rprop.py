"""Rprop (torch.optim.Rprop, dense single-tensor form): per-element step sizes steered by gradient signs.

Riedmiller & Braun 1993, "A Direct Adaptive Method for Faster Backpropagation Learning: The RPROP
Algorithm", without weight backtracking, as torch has it. Only the sign of each gradient element
is used; the step sizes start at lr (state "step_size", filled when the state is created) and
lr is not read again. Meant for full-batch training: noisy minibatch signs make it wander.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_number, _torch_flags


def _check_pair(name: str, value: Any, meaning: str) -> None:
    """ValueError unless `value` is a pair of numbers (torch indexes it without checking: an IndexError there)."""
    numbers = (int, float, np.integer, np.floating)
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, numbers) for v in value)):
        raise ValueError(f"Invalid {name}: {value!r} (expected a pair ({meaning}) of numbers)")


class Rprop(Optimizer):
    """torch.optim.Rprop: p -= sign(g) * step_size, step sizes grown by etaplus or shrunk by etaminus per element."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50.0), *, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        _torch_flags("Rprop", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, etas=tuple(etas) if isinstance(etas, list) else etas,
                        step_sizes=tuple(step_sizes) if isinstance(step_sizes, list) else step_sizes,
                        maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_pair("etas", group["etas"], "etaminus, etaplus")
        etaminus, etaplus = group["etas"]
        if not 0.0 < etaminus < 1.0 < etaplus:
            raise ValueError(f"Invalid eta values: {etaminus}, {etaplus}")
        # torch takes any step_sizes (min > max clamps everything to max, as torch.clamp); a NaN bound would
        # make every step size NaN, which is no setting anyone means.
        _check_pair("step_sizes", group["step_sizes"], "step_size_min, step_size_max")
        if any(math.isnan(s) for s in group["step_sizes"]):
            raise ValueError(f"Invalid step_sizes: {group['step_sizes']!r} (NaN)")

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """The previous (sign-filtered) gradient and the per-element step sizes, starting at lr."""
        return {"prev": 0.0, "step_size": float(group["lr"])}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One Rprop update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        self._check_flat("Rprop", param, grad, state, ("prev", "step_size"))
        update, reference = self._kernel("rprop", group)
        etaminus, etaplus = group["etas"]
        step_size_min, step_size_max = group["step_sizes"]
        update(param, grad, state["prev"], state["step_size"], etaminus=etaminus, etaplus=etaplus,
               step_size_min=step_size_min, step_size_max=step_size_max, maximize=group["maximize"],
               scratch=self._scratch_like(param, 2) if reference else None)
