"""BatchNorm1d and BatchNorm2d (torch.nn's), over F.batch_norm: normalise each channel (axis 1) by the batch's
mean and biased variance while training, by the running statistics in eval mode.

The batch statistics are differentiable ops (their gradient is torch's). The running statistics, buffers as
torch's (running_mean, running_var, num_batches_tracked, in state_dict), are updated in place by one host call
per training forward (tape.host), so a fused step's captured replay updates them each step as the Python replay
does; the update reads the batch count from num_batches_tracked when momentum is None (a cumulative average),
never a number fixed when the step was traced. running_var takes the unbiased batch variance, as torch's.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..autograd import no_grad
from ..tape import host
from ..tensor import Tensor
from . import init
from .layers import _size
from .module import Module
from .parameter import Parameter


def batch_norm(input, running_mean: np.ndarray | None, running_var: np.ndarray | None, weight=None, bias=None,
               training: bool = False, momentum: float | None = 0.1, eps: float = 1e-5, *,
               num_batches_tracked: np.ndarray | None = None) -> Tensor:
    """torch.nn.functional.batch_norm over axis 1 of an (N, C, ...) input. training=True normalises by the batch's
    statistics and, given running_mean/running_var (NumPy arrays, updated in place), moves them toward the batch's;
    training=False normalises by the running statistics."""
    x = input if isinstance(input, Tensor) else Tensor(np.asarray(input))
    if x.ndim < 2:
        raise ValueError(f"batch_norm expects an (N, C, ...) input, got shape {tuple(x.shape)}")
    channels = x.shape[1]
    # A running statistic or an affine parameter of another size was a reshape error naming neither (torch names it)
    for name, value in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                        ("bias", bias)):
        if value is not None and math.prod(np.shape(value)) != channels:  # np.shape: a Tensor's .size is a method
            raise ValueError(f"batch_norm: {name} has {math.prod(np.shape(value))} values (shape "
                             f"{tuple(np.shape(value))}) for an input of {channels} channels (axis 1 of shape "
                             f"{tuple(x.shape)}); it needs one per channel")
    shape = (1, channels) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        if momentum is None and num_batches_tracked is None and running_mean is not None:
            # the cumulative average divides by the batches seen: without their count it failed at float(None)
            raise ValueError("batch_norm: momentum=None (a cumulative average of the batches' statistics) needs "
                             "num_batches_tracked=, the count of batches seen (a 0-d int64 array); or pass a float "
                             "momentum")
        count = x.shape[0] * math.prod(x.shape[2:])
        if count == 0:  # torch gives an empty output, counts the batch and leaves the statistics as they were
            if num_batches_tracked is not None and running_mean is not None:
                host(np.add, num_batches_tracked, 1, out=num_batches_tracked)
            return _affine(x, weight, bias, shape)
        if count == 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{tuple(x.shape)}; use a batch of two or more, or model.eval()")
        mean = ops.mean(x, axes, keepdim=True)
        var = ops.var(x, axes, keepdim=True, correction=0)
        if running_mean is not None and running_var is not None:
            host(_update_running, running_mean, running_var, num_batches_tracked, mean.data, var.data, count,
                 momentum)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm with training=False needs running_mean and running_var")
        mean = Tensor(running_mean.reshape(shape))
        var = Tensor(running_var.reshape(shape))
    return _affine((x - mean) * ops.rsqrt(var + float(eps)), weight, bias, shape)


def _affine(out: Tensor, weight, bias, shape: tuple[int, ...]) -> Tensor:
    """out * weight + bias, each of one value per channel (axis 1)."""
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def _update_running(running_mean: np.ndarray, running_var: np.ndarray, tracked: np.ndarray | None,
                    mean: np.ndarray, var: np.ndarray, count: int, momentum: float | None) -> None:
    """torch's running-statistics update, in place: x <- (1 - f) x + f * batch, f = momentum, or 1 / (batches
    seen) when momentum is None; the variance's batch value unbiased (count / (count - 1))."""
    if tracked is not None:
        tracked += 1
    factor = 1.0 / float(tracked) if momentum is None else float(momentum)
    running_mean *= 1.0 - factor
    running_mean += factor * mean.reshape(-1)
    running_var *= 1.0 - factor
    running_var += factor * var.reshape(-1) * (count / (count - 1))


class _BatchNorm(Module):
    """torch's _BatchNorm: weight (ones) and bias (zeros) when affine, the running statistics as buffers when
    track_running_stats. Subclasses say which input ranks they take."""

    _ranks: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        from ..device import check_cpu

        check_cpu(device, type(self).__name__)
        dtype = dtype or np.float32
        self.num_features = _size(type(self).__name__, "num_features", num_features)
        self.eps, self.momentum = float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.register_parameter("weight", init.ones_(Parameter.empty((num_features,), dtype)) if affine else None)
        self.register_parameter("bias", init.zeros_(Parameter.empty((num_features,), dtype))
                                if affine and bias else None)
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, dtype))
            self.register_buffer("running_var", np.ones(num_features, dtype))
            self.register_buffer("num_batches_tracked", np.zeros((), np.int64))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with no_grad():
                self.running_mean[...] = 0
                self.running_var[...] = 1
                self.num_batches_tracked[...] = 0

    def forward(self, x) -> Tensor:
        x = x if isinstance(x, Tensor) else Tensor(np.asarray(x))
        if x.ndim not in self._ranks or x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) expects input of "
                             f"{' or '.join(f'{r}-D' for r in self._ranks)} shape (N, {self.num_features}, ...), "
                             f"got {tuple(x.shape)}")
        batch_stats = self.training or not self.track_running_stats
        return batch_norm(x, self.running_mean if self.track_running_stats else None,
                          self.running_var if self.track_running_stats else None, self.weight, self.bias,
                          batch_stats, self.momentum, self.eps,
                          num_batches_tracked=self.num_batches_tracked if self.track_running_stats else None)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """torch.nn.BatchNorm1d: input (N, C) or (N, C, L)."""

    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """torch.nn.BatchNorm2d: input (N, C, H, W)."""

    _ranks = (4,)
