"""Stochastic gradient descent with momentum, dampening, Nesterov, weight decay (torch.optim.SGD).

Layers as in torch: `SGD` (class: groups, lazy state) -> `sgd` (functional over
lists: the one place that picks the per-tensor loop or, later, a fused kernel)
-> `sgd_update` (one parameter, in place, no array allocations after the first step).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .optimizer import Optimizer, ParamsT, _check_number


class SGD(Optimizer):
    """torch.optim.SGD: p -= lr * (momentum-filtered, weight-decayed gradient)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize)
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
                           nesterov=group["nesterov"], maximize=group["maximize"], scratch=scratch)
            if momentum != 0:
                for p, buf in zip(owners, new_bufs):
                    self.state[p]["momentum_buffer"] = buf
        return loss


def sgd(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], momentum_buffers: Sequence[np.ndarray | None],
        *, lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
        scratch: Sequence[tuple[np.ndarray, np.ndarray]] | None = None, fused: bool = False
        ) -> list[np.ndarray | None]:
    """Functional SGD over lists of arrays; returns the (possibly new) momentum buffers."""
    if fused:
        # The single plug-in point for a fused flat-buffer kernel (one pass over all params).
        raise NotImplementedError("fused SGD is not implemented yet; use fused=False")
    out = []
    for i, (p, g, buf) in enumerate(zip(params, grads, momentum_buffers)):
        out.append(sgd_update(p, g, buf, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                              nesterov=nesterov, maximize=maximize, scratch=scratch[i] if scratch else None))
    return out


def sgd_update(param: np.ndarray, grad: np.ndarray, momentum_buffer: np.ndarray | None, *, lr: float,
               momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
               maximize: bool = False, scratch: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray | None:
    """One in-place SGD step of `param`; returns the momentum buffer (created on the first step).

    `scratch` is two arrays shaped like `param` that the update may overwrite
    (allocated here when not given). `grad` is never modified.
    """
    a, b = scratch if scratch is not None else (np.empty_like(param), np.empty_like(param))
    g = grad
    if weight_decay != 0:
        np.multiply(param, weight_decay, out=a)
        if maximize:
            np.subtract(a, grad, out=a)  # -g + wd * p
        else:
            np.add(grad, a, out=a)  # g + wd * p
        g = a
    elif maximize:
        np.negative(grad, out=a)
        g = a

    update = g
    if momentum != 0:
        if momentum_buffer is None:
            # torch: the first step's buffer is the gradient itself (no dampening applied).
            momentum_buffer = np.array(g, dtype=param.dtype, copy=True)
        else:
            np.multiply(momentum_buffer, momentum, out=momentum_buffer)
            if dampening != 0:
                np.multiply(g, 1 - dampening, out=b)
                np.add(momentum_buffer, b, out=momentum_buffer)
            else:
                np.add(momentum_buffer, g, out=momentum_buffer)
        if nesterov:
            np.multiply(momentum_buffer, momentum, out=b)
            np.add(g, b, out=b)
            update = b
        else:
            update = momentum_buffer

    np.multiply(update, -lr, out=b)
    np.add(param, b, out=param)
    return momentum_buffer
