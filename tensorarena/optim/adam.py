"""Adam and AdamW (torch.optim.Adam / AdamW, single-tensor form), with AMSGrad and maximize.

Layers as in torch: `Adam`/`AdamW` (class: groups, lazy state) -> `adam`
(functional over lists: the one place that picks the kernel) -> the "adam" kernel in
kernels/adam.py (one parameter, in place: a NumPy reference using two scratch arrays
instead of per-step temporaries, or its one-pass Numba twin).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..kernels import kernel
from .optimizer import Optimizer, ParamsT, _check_number


class Adam(Optimizer):
    """torch.optim.Adam: bias-corrected moment estimates; L2 or (AdamW) decoupled weight decay."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False, fused: bool | None = None) -> None:
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        decoupled_weight_decay=decoupled_weight_decay, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_number("eps", group["eps"], what="epsilon value")
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Invalid betas: {betas!r} (expected a pair (beta1, beta2))")
        for i, beta in enumerate(betas):
            _check_number("beta", beta, high=1.0, high_inclusive=False, what=f"beta parameter at index {i}")
        _check_number("weight_decay", group["weight_decay"])

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adam(W) update of every parameter that has a gradient; returns closure() if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            amsgrad = group["amsgrad"]
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, scratch = [], [], [], [], [], [], []
            for p in group["params"]:
                g = self._grad_of(p)
                if g is None:
                    continue
                data = p.data
                state = self.state[p]
                if not state:
                    # Persistent state: plain heap arrays, never from the (possibly open) step arena.
                    state["step"] = np.array(0.0, dtype=np.float64)
                    state["exp_avg"] = np.zeros_like(data)
                    state["exp_avg_sq"] = np.zeros_like(data)
                if amsgrad and "max_exp_avg_sq" not in state:
                    state["max_exp_avg_sq"] = np.zeros_like(data)
                params.append(data)
                grads.append(g)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                max_exp_avg_sqs.append(state["max_exp_avg_sq"] if amsgrad else None)
                steps.append(state["step"])
                scratch.append(self._scratch(p, 2))
            if not params:
                continue
            beta1, beta2 = group["betas"]
            adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad=amsgrad, beta1=beta1,
                 beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                 maximize=group["maximize"], decoupled_weight_decay=group["decoupled_weight_decay"],
                 scratch=scratch, fused=group.get("fused"))
        return loss


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay p *= 1 - lr * weight_decay."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, fused=fused)


def adam(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], exp_avgs: Sequence[np.ndarray],
         exp_avg_sqs: Sequence[np.ndarray], max_exp_avg_sqs: Sequence[np.ndarray | None],
         steps: Sequence[np.ndarray], *, amsgrad: bool, beta1: float, beta2: float, lr: float, weight_decay: float,
         eps: float, maximize: bool, decoupled_weight_decay: bool = False,
         scratch: Sequence[tuple[np.ndarray, np.ndarray]] | None = None, fused: bool | None = None) -> None:
    """Functional Adam(W) over lists of arrays; increments each 0-d `steps[i]` in place.

    fused=None runs the fused (Numba, one pass per tensor) kernel unless the reference
    kernels are forced (TENSORARENA_KERNELS=reference); True/False pick explicitly.
    `kernels.calls` records which one ran.
    """
    update = kernel("adam", None if fused is None else ("fused" if fused else "reference"))
    for i, p in enumerate(params):
        np.add(steps[i], 1, out=steps[i])
        update(p, grads[i], exp_avgs[i], exp_avg_sqs[i], max_exp_avg_sqs[i] if amsgrad else None,
               step=float(steps[i]), lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
               maximize=maximize, decoupled_weight_decay=decoupled_weight_decay,
               scratch=scratch[i] if scratch else None)
