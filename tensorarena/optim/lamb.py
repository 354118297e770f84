"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"): Adam with a per-tensor trust ratio.

Not in torch.optim; the signature follows torch's conventions. The trust ratio ||p|| / ||r||
is per parameter tensor, so when a fused route hands `update_flat` a group's parameters as one
flat buffer it must also pass `segments`, their offsets; the kernel takes the norms per segment.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_adam_family, _torch_flags


class LAMB(Optimizer):
    """LAMB: bias-corrected Adam direction r (+ wd p), scaled per tensor by lr * ||p|| / ||r||."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, *, maximize: bool = False,
                 fused: bool | None = None, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False) -> None:
        _torch_flags("LAMB", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, maximize=maximize, fused=fused)
        super().__init__(params, defaults)
        # Offsets [0, size] of a lone tensor, rewritten in place per call: no array per step.
        self._whole = np.zeros(2, dtype=np.int64)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_adam_family(group)

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """First and second moments."""
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One LAMB update of `param`; `segments` (n+1 offsets) delimits the tensors of a flat buffer."""
        self._check_flat("LAMB", param, grad, state, ("exp_avg", "exp_avg_sq"))
        if segments is None:
            self._whole[1] = param.size
            segments = self._whole
        update, reference = self._kernel("lamb", group)
        beta1, beta2 = group["betas"]
        update(param, grad, state["exp_avg"], state["exp_avg_sq"], step=step, lr=group["lr"], beta1=beta1,
               beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"], maximize=group["maximize"],
               segments=segments, scratch=self._scratch_like(param, 2) if reference else None)
