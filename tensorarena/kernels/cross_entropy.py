"""Cross-entropy of (N, C) logits against int class targets: a NumPy reference and a fused Numba twin.

As torch.nn.functional.cross_entropy with ignore_index and label_smoothing eps: with
lse = logsumexp(x), row loss = (1 - eps) * (lse - x[t]) + eps * (lse - mean(x)), and 0 for rows
whose target is ignore_index. The forward writes per-row losses and lse (kept for backward)
and returns how many rows count, so reduction="mean" is losses.sum() / count, as in torch.
Backward: dlogits = scale * (softmax(x) - ((1 - eps) * onehot(t) + eps / C)) on counted rows,
0 on ignored ones; scale carries the upstream gradient and the 1/count of a mean.
Both twins compute in float64 per row and round once into the caller's arrays.
"""

from __future__ import annotations

import math

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register

# Results that underflow to (sub)normal zero are right, not errors: keep np.seterr(under="raise")
# callers (the tests) from tripping over them in the NumPy parts.
_quiet_underflow = np.errstate(under="ignore")


def _check(logits: np.ndarray, target: np.ndarray, ignore_index: int) -> np.ndarray:
    """Validate shapes and class indices; returns the mask of counted rows (N,) bool."""
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy wants logits (N, C) and target (N,); got {logits.shape} and {target.shape}")
    if target.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy target must hold integer class indices, got dtype {target.dtype}")
    counted = target != ignore_index
    bad = counted & ((target < 0) | (target >= logits.shape[1]))
    if bad.any():
        raise IndexError(f"cross_entropy target {int(target[bad][0])} is out of range for {logits.shape[1]} classes "
                         f"(and is not ignore_index={ignore_index})")
    return counted


@_quiet_underflow
def cross_entropy_forward_reference(logits: np.ndarray, target: np.ndarray, ignore_index: int,
                                    label_smoothing: float, losses: np.ndarray, lse: np.ndarray) -> int:
    """Per-row losses (0 where ignored) and logsumexp into `losses`/`lse`; returns the counted rows (plain NumPy)."""
    counted = _check(logits, target, ignore_index)
    n, c = logits.shape
    if n == 0:
        return 0
    x = logits.astype(np.float64)
    mx = x.max(axis=1)
    with np.errstate(under="ignore"):  # exp of a very negative logit is 0, not an error
        l = mx + np.log(np.exp(x - mx[:, None]).sum(axis=1))
    lse[...] = l
    picked = x[np.arange(n), np.where(counted, target, 0)]
    eps = float(label_smoothing)
    loss = (1.0 - eps) * (l - picked) + eps * (l - x.sum(axis=1) / c)
    np.copyto(losses, np.where(counted, loss, 0.0), casting="same_kind")
    return int(counted.sum())


@_quiet_underflow
def cross_entropy_backward_reference(logits: np.ndarray, target: np.ndarray, lse: np.ndarray, ignore_index: int,
                                     label_smoothing: float, scale: float, dlogits: np.ndarray) -> None:
    """dlogits = scale * (softmax - smoothed one-hot) on counted rows, 0 on ignored ones (plain NumPy)."""
    counted = _check(logits, target, ignore_index)
    n, c = logits.shape
    eps = float(label_smoothing)
    with np.errstate(under="ignore"):
        d = np.exp(logits.astype(np.float64) - lse.astype(np.float64)[:, None]) - eps / c
    d[np.arange(n), np.where(counted, target, 0)] -= np.where(counted, 1.0 - eps, 0.0)
    d *= float(scale)
    d[~counted] = 0.0
    np.copyto(dlogits, d, casting="same_kind")


@numba.njit(cache=True, parallel=True, fastmath=False)
def _forward(x, target, ignore_index, eps, losses, lse):
    n, c = x.shape
    for r in numba.prange(n):
        mx = -np.inf
        for j in range(c):
            if x[r, j] > mx:
                mx = float(x[r, j])
        tot = 0.0
        xsum = 0.0
        for j in range(c):
            tot += math.exp(x[r, j] - mx)
            xsum += x[r, j]
        l = mx + math.log(tot)
        lse[r] = l
        t = target[r]
        if t == ignore_index:
            losses[r] = 0.0
        else:
            losses[r] = (1.0 - eps) * (l - x[r, t]) + eps * (l - xsum / c)


@numba.njit(cache=True, parallel=True, fastmath=False)
def _backward(x, target, lse, ignore_index, eps, scale, dx):
    n, c = x.shape
    for r in numba.prange(n):
        t = target[r]
        if t == ignore_index:
            for j in range(c):
                dx[r, j] = 0.0
        else:
            l = float(lse[r])
            for j in range(c):
                d = math.exp(x[r, j] - l) - eps / c
                if j == t:
                    d -= 1.0 - eps
                dx[r, j] = scale * d


def cross_entropy_forward_fused(logits: np.ndarray, target: np.ndarray, ignore_index: int,
                                label_smoothing: float, losses: np.ndarray, lse: np.ndarray) -> int:
    """Same contract as `cross_entropy_forward_reference`, one parallel pass per row."""
    counted = _check(logits, target, ignore_index)
    _forward(logits, target, np.int64(ignore_index), float(label_smoothing), losses, lse)
    return int(counted.sum())


def cross_entropy_backward_fused(logits: np.ndarray, target: np.ndarray, lse: np.ndarray, ignore_index: int,
                                 label_smoothing: float, scale: float, dlogits: np.ndarray) -> None:
    """Same contract as `cross_entropy_backward_reference`, one parallel pass per row."""
    _check(logits, target, ignore_index)
    _backward(logits, target, lse, np.int64(ignore_index), float(label_smoothing), float(scale), dlogits)


register("cross_entropy_forward", "reference", cross_entropy_forward_reference)
register("cross_entropy_forward", "fused", cross_entropy_forward_fused)
register("cross_entropy_backward", "reference", cross_entropy_backward_reference)
register("cross_entropy_backward", "fused", cross_entropy_backward_fused)
