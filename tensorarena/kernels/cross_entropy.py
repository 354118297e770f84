"""Cross-entropy of (N, C) logits against int class targets: a NumPy reference and a fused Numba twin.

As torch.nn.functional.cross_entropy with ignore_index and label_smoothing eps: with m = max(x) and
log_total = log(sum(exp(x - m))) (logsumexp(x) = m + log_total), row loss = (1 - eps) * (log_total - (x[t] - m))
+ eps * (log_total - (mean(x) - m)), and 0 for rows whose target is ignore_index. The forward writes per-row
losses and log_total (kept for backward) and returns how many rows count, so reduction="mean" is
losses.sum() / count, as in torch. Backward: dlogits = scale * (softmax(x) - ((1 - eps) * onehot(t) + eps / C))
on counted rows, 0 on ignored ones, with softmax(x) = exp((x - m) - log_total) (m found again); scale carries the
upstream gradient and the 1/count of a mean. Both twins compute in float64 per row and round once into the
caller's arrays.

Why log_total and not logsumexp: m + log_total rounds log_total away once |m| is large (float64's ulp at 1e16
is 2): four equal logits of 1e20 gave loss 0 and gradient [1, 1, 0, 1] for log 4 and [.25, .25, -.75, .25]
(a helper's hunt). Kept apart, as log_softmax's (x - m) - log_total is, they are exact at any magnitude.
"""

from __future__ import annotations

import math

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
del _cpu  # imported for that side effect only
import numba
import numpy as np

from . import register

# Results that underflow to (sub)normal zero are right, not errors: keep np.seterr(under="raise")
# callers (the tests) from tripping over them in the NumPy parts.
_quiet_underflow = np.errstate(under="ignore")


def _check_layout(logits: np.ndarray, target: np.ndarray) -> None:
    """Validate shapes and the target dtype (no arrays: the fused twins call this on every replay)."""
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy wants logits (N, C) and target (N,); got {logits.shape} and {target.shape}")
    if target.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy target must hold integer class indices, got dtype {target.dtype}")


def _raise_bad_target(value: int, num_classes: int, ignore_index: int) -> None:
    raise IndexError(f"cross_entropy target {int(value)} is out of range for {num_classes} classes "
                     f"(and is not ignore_index={ignore_index})")


def _check(logits: np.ndarray, target: np.ndarray, ignore_index: int) -> np.ndarray:
    """Validate shapes and class indices; returns the mask of counted rows (N,) bool (the NumPy reference's way)."""
    _check_layout(logits, target)
    counted = target != ignore_index
    bad = counted & ((target < 0) | (target >= logits.shape[1]))
    if bad.any():
        _raise_bad_target(target[bad][0], logits.shape[1], ignore_index)
    return counted


@_quiet_underflow
def cross_entropy_forward_reference(logits: np.ndarray, target: np.ndarray, ignore_index: int,
                                    label_smoothing: float, losses: np.ndarray, log_total: np.ndarray) -> int:
    """Per-row losses (0 where ignored) and log_total into `losses`/`log_total`; returns the counted rows (plain
    NumPy)."""
    counted = _check(logits, target, ignore_index)
    n, c = logits.shape
    if n == 0:
        return 0
    x = logits.astype(np.float64)
    shifted = x - x.max(axis=1)[:, None]
    with np.errstate(under="ignore"):  # exp of a very negative logit is 0, not an error
        l = np.log(np.exp(shifted).sum(axis=1))
    log_total[...] = l
    picked = shifted[np.arange(n), np.where(counted, target, 0)]
    eps = float(label_smoothing)
    loss = (1.0 - eps) * (l - picked)
    if eps != 0.0:  # only then: a -inf logit (a masked class) makes log_total - mean inf, and 0 * inf is NaN
        loss += eps * (l - shifted.sum(axis=1) / c)
    np.copyto(losses, np.where(counted, loss, 0.0), casting="same_kind")
    return int(counted.sum())


@_quiet_underflow
def cross_entropy_backward_reference(logits: np.ndarray, target: np.ndarray, log_total: np.ndarray,
                                     ignore_index: int, label_smoothing: float, scale: float,
                                     dlogits: np.ndarray) -> None:
    """dlogits = scale * (softmax - smoothed one-hot) on counted rows, 0 on ignored ones (plain NumPy)."""
    counted = _check(logits, target, ignore_index)
    n, c = logits.shape
    eps = float(label_smoothing)
    x = logits.astype(np.float64)
    with np.errstate(under="ignore"):
        d = np.exp((x - x.max(axis=1, initial=-np.inf)[:, None]) - log_total.astype(np.float64)[:, None]) - eps / c
    d[np.arange(n), np.where(counted, target, 0)] -= np.where(counted, 1.0 - eps, 0.0)
    d *= float(scale)
    d[~counted] = 0.0
    np.copyto(dlogits, d, casting="same_kind")


# The fused twins check the targets inside their row loops rather than with NumPy: `target != ignore_index`,
# the range tests and the count are each an (N,) temporary, and a replayed step promises to allocate no array
# (a per-token loss has B * T rows). Each loop returns the index of the first counted row whose target is out
# of range (n if none) and the Python wrapper raises, as Numba cannot format the message.

@numba.njit(cache=True, parallel=True, fastmath=False)
def _forward(x, target, ignore_index, eps, losses, log_total):
    """Writes losses and log_total; returns (counted rows, first bad row or n). A bad row's loss is left 0."""
    n, c = x.shape
    counted = 0
    first_bad = n
    for r in numba.prange(n):
        mx = -np.inf
        for j in range(c):
            if x[r, j] > mx:
                mx = float(x[r, j])
        tot = 0.0
        xsum = 0.0  # of x - mx
        for j in range(c):
            tot += math.exp(x[r, j] - mx)
            xsum += x[r, j] - mx
        l = math.log(tot)
        log_total[r] = l
        t = target[r]
        if t == ignore_index:
            losses[r] = 0.0
        elif t < 0 or t >= c:  # x[r, t] would read outside the row
            losses[r] = 0.0
            first_bad = min(first_bad, r)
        else:
            counted += 1
            loss = (1.0 - eps) * (l - (x[r, t] - mx))
            if eps != 0.0:  # as the reference: without smoothing a -inf logit must not add 0 * inf = NaN
                loss += eps * (l - xsum / c)
            losses[r] = loss
    return counted, first_bad


@numba.njit(cache=True, parallel=True, fastmath=False)
def _backward(x, target, log_total, ignore_index, eps, scale, dx):
    """Writes dx; returns the first bad row or n (a bad target matches no class: its row is not used)."""
    n, c = x.shape
    first_bad = n
    for r in numba.prange(n):
        t = target[r]
        if t == ignore_index:
            for j in range(c):
                dx[r, j] = 0.0
        else:
            if t < 0 or t >= c:
                first_bad = min(first_bad, r)
            mx = -np.inf
            for j in range(c):
                if x[r, j] > mx:
                    mx = float(x[r, j])
            l = float(log_total[r])
            for j in range(c):
                d = math.exp((x[r, j] - mx) - l) - eps / c
                if j == t:
                    d -= 1.0 - eps
                dx[r, j] = scale * d
    return first_bad


def cross_entropy_forward_fused(logits: np.ndarray, target: np.ndarray, ignore_index: int,
                                label_smoothing: float, losses: np.ndarray, log_total: np.ndarray) -> int:
    """Same contract as `cross_entropy_forward_reference`, one parallel pass per row; it checks the targets in
    that pass, so on a bad target `losses` and `log_total` are already (partly) written when it raises."""
    _check_layout(logits, target)
    counted, first_bad = _forward(logits, target, np.int64(ignore_index), float(label_smoothing), losses,
                                  log_total)
    if first_bad < target.shape[0]:
        _raise_bad_target(target[first_bad], logits.shape[1], ignore_index)
    return int(counted)


def cross_entropy_backward_fused(logits: np.ndarray, target: np.ndarray, log_total: np.ndarray, ignore_index: int,
                                 label_smoothing: float, scale: float, dlogits: np.ndarray) -> None:
    """Same contract as `cross_entropy_backward_reference`, one parallel pass per row; it checks the targets in
    that pass (the forward on the same targets already did: this costs one compare per row and keeps a direct
    call from returning a wrong gradient), so on a bad target `dlogits` is already written when it raises."""
    _check_layout(logits, target)
    first_bad = _backward(logits, target, log_total, np.int64(ignore_index), float(label_smoothing), float(scale),
                          dlogits)
    if first_bad < target.shape[0]:
        _raise_bad_target(target[first_bad], logits.shape[1], ignore_index)


register("cross_entropy_forward", "reference", cross_entropy_forward_reference)
register("cross_entropy_forward", "fused", cross_entropy_forward_fused)
register("cross_entropy_backward", "reference", cross_entropy_backward_reference)
register("cross_entropy_backward", "fused", cross_entropy_backward_fused)
