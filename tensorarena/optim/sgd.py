"""Stochastic gradient descent with momentum, dampening, Nesterov, weight decay (torch.optim.SGD).

`SGD.step` is Optimizer.step: lazy state, then `SGD.update_flat` -> the "sgd" kernel in
kernels/sgd.py (one array in place: a NumPy reference or its one-pass Numba twin), the same call a
fused route makes on a group's flat buffer. `sgd` (functional over lists, buffers created on a
first step) and `sgd_update` (one parameter) are the torch-style functional forms.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..kernels import kernel
from .optimizer import Optimizer, ParamsT, _check_number, _torch_flags


class SGD(Optimizer):
    """torch.optim.SGD: p -= lr * (momentum-filtered, weight-decayed gradient)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 fused: bool | None = None, foreach: bool | None = None, differentiable: bool = False,
                 capturable: bool = False) -> None:
        _torch_flags("SGD", foreach, capturable, differentiable)
        # fused: None = the fused kernel unless reference kernels are forced; True/False = explicit.
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_hyperparams(self, group: dict[str, Any]) -> None:
        _check_number("lr", group["lr"], what="learning rate")
        _check_number("momentum", group["momentum"])
        _check_number("dampening", group["dampening"], low=-float("inf"))  # torch accepts any number
        _check_number("weight_decay", group["weight_decay"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(f"Nesterov momentum requires a momentum and zero dampening, got "
                             f"momentum={group['momentum']}, dampening={group['dampening']}")

    def state_init(self, group: dict[str, Any]) -> dict[str, float]:
        """A momentum buffer only with momentum (torch keeps none without)."""
        return {"momentum_buffer": 0.0} if group["momentum"] != 0 else {}

    def initial_step(self, state: dict[str, Any]) -> float:
        # A buffer loaded without a step (torch's SGD keeps none) is past its first step:
        # counting from 1 keeps the next update from mistaking it for a fresh buffer.
        return 1.0 if state.get("momentum_buffer") is not None else 0.0

    def continued_step(self, state: dict[str, Any], group: dict[str, Any]) -> float:
        """0 when a momentum buffer is about to be made for a parameter that has taken steps without one
        (momentum switched on by hand mid-run, or a plain SGD's state loaded into a momentum SGD): torch's
        first momentum step takes the gradient itself as the buffer whenever the buffer is first made, and
        step == 1 is what tells the kernel to. Counting on instead blended the gradient into a zero buffer,
        (1 - dampening) * g where torch has g. SGD's step count serves this alone (torch's SGD keeps none)."""
        if group["momentum"] != 0 and state.get("momentum_buffer") is None:
            return 0.0
        return super().continued_step(state, group)

    def update_flat(self, group: dict[str, Any], param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray],
                    step: float, segments: np.ndarray | None = None) -> None:
        """One SGD update of `param` (a tensor or a flat buffer); see Optimizer.update_flat.

        torch's first momentum step takes the gradient itself as the buffer; the buffer here
        starts zero-filled, so step == 1 is what tells the kernel to copy instead of blend (a
        buffer first created later, momentum switched on mid-run, restarts the count: continued_step).
        """
        momentum = group["momentum"]
        self._check_flat("SGD", param, grad, state, ("momentum_buffer",) if momentum != 0 else ())
        buf = state["momentum_buffer"] if momentum != 0 else None
        update, reference = self._kernel("sgd", group)
        update(param, grad, buf, lr=group["lr"], momentum=momentum, dampening=group["dampening"],
               weight_decay=group["weight_decay"], nesterov=group["nesterov"], maximize=group["maximize"],
               first_step=step == 1, scratch=self._scratch_like(param, 2) if reference else None)


def sgd(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], momentum_buffers: Sequence[np.ndarray | None],
        *, lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
        fused: bool | None = None, scratch: Sequence[tuple[np.ndarray, np.ndarray]] | None = None
        ) -> list[np.ndarray | None]:
    """Functional SGD over lists of arrays, in place; returns the momentum buffers (new ones on a first step).

    fused=None runs the fused (Numba, one pass per tensor) kernel unless the reference kernels
    are forced (TENSORARENA_KERNELS=reference); True/False pick explicitly. `kernels.calls`
    records which one ran. A None buffer with momentum != 0 means a first step: torch then
    takes the gradient itself as the buffer.
    """
    update = kernel("sgd", None if fused is None else ("fused" if fused else "reference"))
    out: list[np.ndarray | None] = []
    for i, (p, g, buf) in enumerate(zip(params, grads, momentum_buffers)):
        first = momentum != 0 and buf is None
        if first:
            buf = np.empty_like(p)  # persistent state: heap, never the step arena; the kernel fills it
        update(p, g, buf if momentum != 0 else None, lr=lr, momentum=momentum, dampening=dampening,
               weight_decay=weight_decay, nesterov=nesterov, maximize=maximize, first_step=first,
               scratch=scratch[i] if scratch else None)
        out.append(buf if momentum != 0 else None)
    return out


def sgd_update(param: np.ndarray, grad: np.ndarray, momentum_buffer: np.ndarray | None, *, lr: float,
               momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
               maximize: bool = False, fused: bool | None = None) -> np.ndarray | None:
    """One in-place SGD step of `param`; returns the momentum buffer (created on the first step)."""
    return sgd([param], [grad], [momentum_buffer], lr=lr, momentum=momentum, dampening=dampening,
               weight_decay=weight_decay, nesterov=nesterov, maximize=maximize, fused=fused)[0]
