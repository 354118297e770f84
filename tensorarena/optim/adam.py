"""Adam and AdamW (torch.optim.Adam / AdamW, single-tensor form), with AMSGrad and maximize.

`Adam.step` is Optimizer.step: lazy state, then `Adam.update_flat` -> the "adam" kernel in
kernels/adam.py (one array in place: a NumPy reference using two scratch arrays instead of
per-step temporaries, or its one-pass Numba twin), the same call a fused route makes on a
group's flat buffer. `adam` is the torch-style functional form over lists.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..kernels import calls, kernel, lookup
from .optimizer import Optimizer, ParamsT, _check_adam_family, _torch_flags


class Adam(Optimizer):
    """torch.optim.Adam: bias-corrected moment estimates; L2 or (AdamW) decoupled weight decay."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False, fused: bool | None = None, foreach: bool | None = None,
                 capturable: bool = False, differentiable: bool = False) -> None:
        _torch_flags(type(self).__name__, foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        decoupled_weight_decay=decoupled_weight_decay, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_adam_family(group)

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """First and second moments, and the running max of the second with AMSGrad."""
        init = {"exp_avg": 0.0, "exp_avg_sq": 0.0}
        if group["amsgrad"]:
            init["max_exp_avg_sq"] = 0.0
        return init

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One Adam(W) update of `param` (a tensor or a flat buffer); see Optimizer.update_flat."""
        amsgrad = group["amsgrad"]
        self._check_flat("Adam", param, grad, state, self.state_init(group))
        update, reference = self._kernel("adam", group)
        beta1, beta2 = group["betas"]
        update(param, grad, state["exp_avg"], state["exp_avg_sq"], state["max_exp_avg_sq"] if amsgrad else None,
               step=step, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
               weight_decay=group["weight_decay"], maximize=group["maximize"],
               decoupled_weight_decay=group["decoupled_weight_decay"],
               scratch=self._scratch_like(param, 2) if reference else None)

    def prepare_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray,
                     state: dict[str, np.ndarray]) -> Callable[[float], None]:
        """Optimizer.prepare_flat with the fused kernel bound to the arrays once (kernels.adam.bind_adam):
        the ~30 us of checks and lookups per parameter and step that update_flat makes are left out.

        What the binding fixes (the kernel group["fused"] picks, and whether amsgrad's running max is
        passed) is looked up on every call, so a choice set in the group mid-run is followed: each choice
        is bound once, on the first step that makes it."""
        self._check_flat("Adam", param, grad, state, self.state_init(group))
        bound: dict[tuple, Callable[[float], None]] = {}

        def step_update(step: float) -> None:
            choice = (group.get("fused"), group["amsgrad"])
            update = bound.get(choice)
            if update is None:
                update = bound[choice] = self._bind(group, param, grad, state)
            update(step)
        return step_update

    def _bind(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray,
              state: dict[str, np.ndarray]) -> Callable[[float], None]:
        """The update for the group's current kernel choice and amsgrad setting: the fused kernel bound to
        these arrays, or (the reference kernel, or a fused one that cannot bind) update_flat on every call."""
        self._check_flat("Adam", param, grad, state, self.state_init(group))
        update, impl = lookup("adam", self._impl(group))
        bind = getattr(update, "bind", None)
        if impl == "reference" or bind is None:
            return super().prepare_flat(group, param, grad, state)
        run = bind(param, grad, state["exp_avg"], state["exp_avg_sq"],
                   state["max_exp_avg_sq"] if group["amsgrad"] else None)
        counted = ("adam", "fused")

        def step_update(step: float) -> None:
            calls[counted] += 1  # as kernels.kernel counts each update_flat's kernel
            beta1, beta2 = group["betas"]
            run(step=step, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                weight_decay=group["weight_decay"], maximize=group["maximize"],
                decoupled_weight_decay=group["decoupled_weight_decay"])
        return step_update


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay p *= 1 - lr * weight_decay."""

    _class_settings = {"decoupled_weight_decay": True}

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, fused: bool | None = None, foreach: bool | None = None,
                 capturable: bool = False, differentiable: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, fused=fused, foreach=foreach, capturable=capturable,
                         differentiable=differentiable)


def adam(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], exp_avgs: Sequence[np.ndarray],
         exp_avg_sqs: Sequence[np.ndarray], max_exp_avg_sqs: Sequence[np.ndarray | None],
         steps: Sequence[np.ndarray], *, amsgrad: bool, beta1: float, beta2: float, lr: float, weight_decay: float,
         eps: float, maximize: bool, decoupled_weight_decay: bool = False,
         scratch: Sequence[tuple[np.ndarray, np.ndarray]] | None = None, fused: bool | None = None) -> None:
    """Functional Adam(W) over lists of arrays; increments each 0-d `steps[i]` in place once its update ran.

    fused=None runs the fused (Numba, one pass per tensor) kernel unless the reference
    kernels are forced (TENSORARENA_KERNELS=reference); True/False pick explicitly.
    `kernels.calls` records which one ran.
    """
    update = kernel("adam", None if fused is None else ("fused" if fused else "reference"))
    for i, p in enumerate(params):
        count = float(steps[i]) + 1.0
        update(p, grads[i], exp_avgs[i], exp_avg_sqs[i],
               max_exp_avg_sqs[i] if amsgrad else None, step=count, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
               weight_decay=weight_decay, maximize=maximize, decoupled_weight_decay=decoupled_weight_decay,
               scratch=scratch[i] if scratch else None)
        steps[i][...] = count  # after the update: one that raised leaves the count as it was
