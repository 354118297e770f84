"""torch 2.13's elementwise `weight=` of mse_loss, l1_loss and huber_loss, built from recorded ops.

torch defines it in Python on top of the unweighted loss, and so does this: the per-element losses
(reduction "none") times the weight, then "sum" sums them and "mean" divides. The two means differ in torch and
are kept as they are: mse_loss and l1_loss divide by the weights' sum (a weighted mean), huber_loss by the
element count (the mean of the weighted losses). Composed of recorded ops, it traces into a fused plan like any
other step, and a weight that requires grad gets its gradient (the unweighted losses).
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._base import as_dtype
from .arith import div, mul
from .reduce import mean, sum as sum_all

WEIGHT_SUM_MEAN = ("mse_loss", "l1_loss")  # "mean" divides by sum(weight); huber_loss by the element count


def weighted_loss(losses: Tensor, weight, reduction: str, what: str) -> Tensor:
    """`losses` (the unweighted per-element losses) times `weight`, reduced as torch's `what` reduces them."""
    if not isinstance(weight, Tensor):
        weight = Tensor(as_dtype(np.asarray(weight), losses.dtype))
    if weight.shape != losses.shape:  # torch raises too (it allows no broadcasting of the weight)
        raise ValueError(f"{what}: weight shape {tuple(weight.shape)} differs from input shape "
                         f"{tuple(losses.shape)}; give one weight per element")
    if weight.dtype.kind != "f":
        raise TypeError(f"{what}: weight must be floating point, got {weight.dtype}; convert it with .float()")
    weighted = mul(losses, weight)
    if reduction == "none":
        return weighted
    if reduction == "sum":
        return sum_all(weighted)
    if what in WEIGHT_SUM_MEAN:
        return div(sum_all(weighted), sum_all(weight))
    return mean(weighted)
