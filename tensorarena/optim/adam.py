"""Adam and AdamW (torch.optim.Adam / AdamW, single-tensor form), with AMSGrad and maximize.

Layers as in torch: `Adam`/`AdamW` (class: groups, lazy state) -> `adam`
(functional over lists: the one place that picks the per-tensor loop or, later,
a fused flat-buffer kernel) -> `adam_update` (one parameter, in place, using two
scratch arrays instead of per-step temporaries).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_number


class Adam(Optimizer):
    """torch.optim.Adam: bias-corrected moment estimates; L2 or (AdamW) decoupled weight decay."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        decoupled_weight_decay=decoupled_weight_decay)
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
                 scratch=scratch)
        return loss


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay p *= 1 - lr * weight_decay."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True)


def adam(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], exp_avgs: Sequence[np.ndarray],
         exp_avg_sqs: Sequence[np.ndarray], max_exp_avg_sqs: Sequence[np.ndarray | None],
         steps: Sequence[np.ndarray], *, amsgrad: bool, beta1: float, beta2: float, lr: float, weight_decay: float,
         eps: float, maximize: bool, decoupled_weight_decay: bool = False,
         scratch: Sequence[tuple[np.ndarray, np.ndarray]] | None = None, fused: bool = False) -> None:
    """Functional Adam(W) over lists of arrays; increments each 0-d `steps[i]` in place."""
    if fused:
        # The single plug-in point for a fused flat-buffer kernel (one pass over all params).
        raise NotImplementedError("fused Adam is not implemented yet; use fused=False")
    for i, p in enumerate(params):
        np.add(steps[i], 1, out=steps[i])
        adam_update(p, grads[i], exp_avgs[i], exp_avg_sqs[i], max_exp_avg_sqs[i] if amsgrad else None,
                    step=float(steps[i]), lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                    maximize=maximize, decoupled_weight_decay=decoupled_weight_decay,
                    scratch=scratch[i] if scratch else None)


def adam_update(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
                max_exp_avg_sq: np.ndarray | None, *, step: float, lr: float, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0, maximize: bool = False,
                decoupled_weight_decay: bool = False,
                scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One in-place Adam(W) step of `param` at (already incremented) step count `step`.

    Pass `max_exp_avg_sq` for AMSGrad. `scratch` is two arrays shaped like `param`
    that the update overwrites (allocated here when not given); `grad` is never modified.
    Operation order follows torch's single-tensor Adam so results agree to rounding.
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    g = grad
    if weight_decay != 0 and not decoupled_weight_decay:
        np.multiply(param, weight_decay, out=a)
        if maximize:
            np.subtract(a, grad, out=a)  # -g + wd * p
        else:
            np.add(grad, a, out=a)  # g + wd * p
        g = a
    elif maximize:
        np.negative(grad, out=a)
        g = a
    if weight_decay != 0 and decoupled_weight_decay:
        np.multiply(param, 1 - lr * weight_decay, out=param)

    # exp_avg.lerp_(g, 1 - beta1), with torch's two-sided lerp formula.
    weight = 1 - beta1
    np.subtract(g, exp_avg, out=b)
    if abs(weight) < 0.5:
        np.multiply(b, weight, out=b)
        np.add(exp_avg, b, out=exp_avg)
    else:
        np.multiply(b, 1 - weight, out=b)
        np.subtract(g, b, out=exp_avg)
    # exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
    np.multiply(exp_avg_sq, beta2, out=exp_avg_sq)
    np.multiply(g, 1 - beta2, out=b)
    np.multiply(b, g, out=b)
    np.add(exp_avg_sq, b, out=exp_avg_sq)

    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    step_size = lr / bias_correction1
    second = exp_avg_sq
    if max_exp_avg_sq is not None:
        np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second = max_exp_avg_sq
    # denom = sqrt(v) / sqrt(bc2) + eps ;  p += (-step_size * m) / denom   (torch's addcdiv order)
    np.sqrt(second, out=b)
    np.divide(b, bias_correction2_sqrt, out=b)
    np.add(b, eps, out=b)
    np.multiply(exp_avg, -step_size, out=a)  # g (possibly in `a`) is no longer needed
    np.divide(a, b, out=a)
    np.add(param, a, out=param)
