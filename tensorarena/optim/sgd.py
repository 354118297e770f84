"""Stochastic gradient descent with momentum, dampening, Nesterov, weight decay (torch.optim.SGD).

Layers as in torch: `SGD` (class: groups, lazy state) -> `sgd` (functional over lists: the one
place that picks the kernel) -> the "sgd" kernel in kernels/sgd.py (one parameter, in place: a
NumPy reference or its one-pass Numba twin). `sgd_update` is `sgd` for a single parameter.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..kernels import kernel
from .optimizer import Optimizer, ParamsT, _check_number


class SGD(Optimizer):
    """torch.optim.SGD: p -= lr * (momentum-filtered, weight-decayed gradient)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 fused: bool | None = None) -> None:
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

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One SGD update of every parameter that has a gradient; returns closure() if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            owners, params, grads, bufs, scratch = [], [], [], [], []
            momentum = group["momentum"]
            for p in group["params"]:
                g = self._grad_of(p)
                if g is None:
                    continue
                owners.append(p)
                params.append(p.data)
                grads.append(g)
                # torch keeps no SGD state without momentum; the buffer is made lazily at the first step.
                bufs.append(self.state[p].get("momentum_buffer") if momentum != 0 else None)
                scratch.append(self._scratch(p, 2))
            if not params:
                continue
            new_bufs = sgd(params, grads, bufs, lr=group["lr"], momentum=momentum,
                           dampening=group["dampening"], weight_decay=group["weight_decay"],
                           nesterov=group["nesterov"], maximize=group["maximize"], fused=group.get("fused"),
                           scratch=scratch)
            if momentum != 0:
                for p, buf in zip(owners, new_bufs):
                    self.state[p]["momentum_buffer"] = buf
        return loss


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
