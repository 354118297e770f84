"""Scaled dot-product attention, forward and backward: a NumPy reference and a fused Numba twin.

Shapes: q (B, H, T, hs), k (B, H, S, hs), v (B, H, S, hv) -> out (B, H, T, hv); the
probabilities P (B, H, T, S) are saved for backward. Forward: P = softmax(scale * q k^T + mask),
out = P v, where the mask drops keys with key_padding_mask[b, j] True (padding) and, when causal,
keys j > i (top-left aligned, as torch's is_causal; meant for T == S). A query whose every key
is dropped gets P = 0 and out = 0, as torch 2.13's scaled_dot_product_attention does too.
Backward: dv = P^T g, dP = g v^T, dS = scale * P * (dP - rowsum(P * dP)), dq = dS k, dk = dS^T q.

Dropout on the probabilities (`dropout=(seed, threshold, scale)`, kernels/dropout.py's mask over
(B, H, T, S) in C order): out = D v with D = dropout(P); backward dv = D^T g and dP = dropout(g v^T)
with the same mask, recomputed from the seed in tile-sized chunks; only P itself is kept.

The fused twin does the matmuls straight between the caller's arrays, which may be strided views
(no copies): the (batch, head) slices are split over the cores, each part one batched np.matmul on
one BLAS thread (`_slicewise`, kernels.blas_threads). It fuses scale, masks and softmax into one
in-place parallel pass over P (forward; the exp is kernels.fastmath's packed one, in P's
precision, as in softmax.py), and the softmax gradient into one pass over a dP tile (backward).
The tile is its only scratch: about 2**20 elements, or one batch element's (H, T, S) if larger,
never the whole (B, H, T, S). That is the path without MKL. With MKL as the GEMM backend both
fused kernels hand the whole job to kernels.attention_heads instead, which does each (b, h) slice's
products and softmax back to back inside one Numba prange, calling MKL single-threaded from it
(OpenBLAS's own threads nested in Numba's oversubscribed the cores, 6x to 50x slower: that is why
the path without MKL stays batched).
"""

from __future__ import annotations

import math

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import attention_heads as slices
from . import calls, choose, kernel, register
from .gemm_bf16 import BF16, to_bfloat16_reference, widen
from ..memory.arena import empty
from .blas import matmul as bmm
from .blas_threads import run_split
from .dropout import dropout_apply_fused, dropout_apply_reference
from .attention_heads import softmax_grad_rows, softmax_row
from .softmax import _BLOCK, softmax_forward_reference

# Results that underflow to (sub)normal zero are right, not errors: keep np.seterr(under="raise")
# callers (the tests) from tripping over them in the NumPy parts.
_quiet_underflow = np.errstate(under="ignore")


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray, key_padding_mask: np.ndarray | None) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention wants q, k, v of shape (B, H, T, hs); got {q.shape}, {k.shape}, {v.shape}")
    if k.shape[:2] != q.shape[:2] or v.shape[:3] != k.shape[:3] or k.shape[3] != q.shape[3]:
        raise ValueError(f"attention shapes disagree: q {q.shape} (B, H, T, hs), k {k.shape} (B, H, S, hs), "
                         f"v {v.shape} (B, H, S, hv)")
    if key_padding_mask is not None:
        if key_padding_mask.dtype != np.bool_:
            raise TypeError(f"key_padding_mask must be bool (True = padding, do not attend), "
                            f"got {key_padding_mask.dtype}")
        if key_padding_mask.shape != (k.shape[0], k.shape[2]):
            raise ValueError(f"key_padding_mask shape {key_padding_mask.shape} must be (B, S) = "
                             f"{(k.shape[0], k.shape[2])}")


def _bf16_operands(*operands: np.ndarray) -> bool:
    """Whether the products are bfloat16: q, k, v (and backward's g) rounded by the caller, all or none."""
    kinds = {a.dtype == BF16 for a in operands}
    if len(kinds) > 1:
        raise TypeError(f"attention: q, k, v (and g) must all be bfloat16 (uint16 bit patterns) or none of them, "
                        f"got {[str(a.dtype) for a in operands]}")
    return kinds.pop()


def _bf16_rounded(x: np.ndarray) -> np.ndarray:
    """x (float32) rounded to bfloat16 and widened back: the reference twin's product operand."""
    return widen(to_bfloat16_reference(x, np.empty(x.shape, BF16)))


def _count_bf16(twin: str) -> None:
    calls[("attention_bf16", twin)] += 1


def _scale(q: np.ndarray, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _dropped(p: np.ndarray, dropout: tuple | None, start: int = 0) -> np.ndarray:
    """p with the dropout mask applied (a new array; the reference twin's), or p itself without dropout."""
    if dropout is None:
        return p
    seed, threshold, scale = dropout
    out = np.empty(p.shape, p.dtype)
    dropout_apply_reference(np.ascontiguousarray(p), out, seed, threshold, scale, start)
    return out


@_quiet_underflow
def attention_forward_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, key_padding_mask: np.ndarray | None,
                                causal: bool, scale: float | None, out: np.ndarray, probs: np.ndarray,
                                dropout: tuple | None = None) -> None:
    """out = dropout(softmax(scale * q k^T, masked)) v into `out`, the (undropped) probabilities into
    `probs` (plain NumPy).

    bfloat16 q, k, v (uint16 bit patterns, ops at float32_matmul_precision("bfloat16")): both products
    are bfloat16 ones, summed in float32: q k^T of the operands widened back to float32 (exact), and
    D = dropout(P) rounded to bfloat16 before D v.
    """
    _check(q, k, v, key_padding_mask)
    bf16 = _bf16_operands(q, k, v)
    if bf16:
        q, k, v = widen(q), widen(k), widen(v)
        _count_bf16("reference")
    scale = _scale(q, scale)
    t, s = q.shape[2], k.shape[2]
    scores = bmm(q, k.swapaxes(-1, -2)).astype(np.float64) * scale  # (B, H, T, S)
    drop = np.zeros((1, 1, t, s), bool)
    if causal:
        drop = drop | np.triu(np.ones((t, s), bool), k=1)  # key j > query i
    if key_padding_mask is not None:
        drop = drop | key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
    softmax_forward_reference(scores, np.where(drop, -np.inf, 0.0), probs)
    d = _dropped(probs, dropout)
    bmm(_bf16_rounded(d) if bf16 else d, v, out=out)


@_quiet_underflow
def attention_backward_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, probs: np.ndarray, g: np.ndarray,
                                 scale: float | None, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray,
                                 dropout: tuple | None = None) -> None:
    """Gradients of attention_forward w.r.t. q, k, v from the saved probabilities (plain NumPy).

    bfloat16 q, k, v, g (uint16): all four products are bfloat16 ones, D and dS rounded before theirs.
    """
    bf16 = _bf16_operands(q, k, v, g)
    if bf16:
        q, k, v, g = widen(q), widen(k), widen(v), widen(g)
        _count_bf16("reference")
    scale = _scale(q, scale)
    d = _dropped(probs, dropout)
    bmm((_bf16_rounded(d) if bf16 else d).swapaxes(-1, -2), g, out=dv)
    dp = _dropped(bmm(g, v.swapaxes(-1, -2)), dropout)  # (B, H, T, S)
    p64 = probs.astype(np.float64)
    rowdot = (p64 * dp).sum(axis=-1, keepdims=True)
    ds = (scale * p64 * (dp - rowdot)).astype(probs.dtype)  # the fused twin keeps dS in P's dtype too
    if bf16:
        ds = _bf16_rounded(ds)
    bmm(ds, k, out=dq)
    bmm(ds.swapaxes(-1, -2), q, out=dk)


@numba.njit(cache=True, parallel=True, error_model="numpy", fastmath={"contract"})
def _masked_softmax(p, kpm, has_kpm, causal, scale, rows_per_block):
    # In place over probs viewed as (B*H*T, S) rows that hold raw q.k scores, each row by
    # attention_heads.softmax_row (the slice path's own).
    nb, nh, t, s = p.shape
    rows = p.reshape(nb * nh * t, s)
    n = rows.shape[0]
    for blk in numba.prange((n + rows_per_block - 1) // rows_per_block):
        r0 = np.int64(blk) * rows_per_block  # prange's index is unsigned: keep the arithmetic in int64
        r1 = min(n, r0 + rows_per_block)
        for r in range(r0, r1):
            b = r // (nh * t)
            softmax_row(rows[r], kpm[b if has_kpm else 0], has_kpm, causal, r % t, scale)


@numba.njit(cache=True, parallel=True)
def _softmax_grad(p, ds, scale):
    # In place: ds holds dP = g v^T on entry and scale * P * (dP - rowsum(P * dP)) on exit.
    s = p.shape[-1]
    prow = p.reshape(-1, s)
    drow = ds.reshape(-1, s)
    for r in numba.prange(prow.shape[0]):
        softmax_grad_rows(prow[r:r + 1], drow[r:r + 1], scale)


_TILE_ELEMENTS = 1 << 20  # backward's dP scratch: about this many elements (or one batch element's worth)


def _cin(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a)


def _cout(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.empty(a.shape, a.dtype)


def _back(a: np.ndarray, scratch: np.ndarray) -> None:
    if scratch is not a:
        np.copyto(a, scratch)


def _slicewise(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[i, j] = a[i, j] @ b[i, j] over the two leading (batch, head) axes, split over the cores.

    The batch (or, for one batch element, the heads) is cut into one part per core, each part one
    batched np.matmul on one BLAS thread (kernels.blas_threads). NumPy hands every 2-D slice to BLAS
    with a leading dimension and a transpose flag, so q, k, v viewed straight out of a packed
    (B, T, 3, H, hs) projection, k^T, P^T and an output viewed as (B, T, H, hs) need no copy.
    Measured (q k^T + P v + P^T g, 2 cores): SimCSE's (64, 12, 64, 32) 26.5 ms as one matmul per
    slice from Python, 14.5 ms as one batched call on OpenBLAS's 2 threads, 6.8 ms split like this;
    ViT-Tiny's (8, 3, 197, 64) 3.5 / 4.3 / 3.2 ms; ViT-Base's (1, 12, 197, 64) 1.8 / 2.0 / 1.7 ms.
    With MKL as the GEMM backend (kernels.gemm) all slices go to one cblas_sgemm_batch call instead,
    faster again: SimCSE 6.1 -> 5.0 ms, ViT-Tiny 2.9 -> 2.6 ms, ViT-Base 1.7 -> 1.5 ms.
    """
    if choose("batched_gemm") == "fused":  # MKL: one call, its threads spread over the slices
        kernel("batched_gemm")(a, b, out)
        return
    if a.shape[0] == 1:  # split the heads instead
        a, b, out = a[0], b[0], out[0]

    def work(lo: int, hi: int) -> None:
        np.matmul(a[lo:hi], b[lo:hi], out=out[lo:hi])

    run_split(work, a.shape[0])


def _swap(x: np.ndarray) -> np.ndarray:
    return x.swapaxes(-1, -2)


@_quiet_underflow
def attention_forward_fused(q: np.ndarray, k: np.ndarray, v: np.ndarray, key_padding_mask: np.ndarray | None,
                            causal: bool, scale: float | None, out: np.ndarray, probs: np.ndarray,
                            dropout: tuple | None = None) -> None:
    """Same contract as `attention_forward_reference`: BLAS matmuls around one fused masked-softmax pass.

    q, k, v and out may be strided views (e.g. heads of a packed projection): nothing is copied.
    """
    _check(q, k, v, key_padding_mask)
    bf16 = _bf16_operands(q, k, v)
    if probs.size == 0 or out.size == 0:  # no keys (out is 0, as torch's) or nothing to compute: as backward,
        out.fill(0)                       # before the slice path's check, which refuses empty arrays (and bf16)
        probs.fill(0)  # value heads 0 wide: backward reads probs, and 0 keeps its dq, dk 0 (no gradient flows)
        if bf16:
            _count_bf16("fused")
        return
    kpm = np.zeros((1, 1), bool) if key_padding_mask is None else _cin(key_padding_mask)
    if slices.usable(q, k, v, out, probs):
        slices.attention_forward_slices(q, k, v, kpm, key_padding_mask is not None, bool(causal), _scale(q, scale),
                                        out, probs, dropout)
        if bf16:
            _count_bf16("fused")
        return
    if bf16:
        _no_bf16_here()
    p = _cout(probs)
    _slicewise(q, _swap(k), p)  # raw scores straight into probs: no (B, H, T, S) temporary
    rows, s = p.size // max(1, p.shape[-1]), p.shape[-1]
    _masked_softmax(p, kpm, key_padding_mask is not None, bool(causal), _scale(q, scale),
                    max(1, min(_BLOCK // max(s, 1), -(-rows // numba.get_num_threads()))))
    if dropout is None:
        _slicewise(p, v, out)
    else:  # D = dropout(P) a tile at a time: P stays undropped for backward
        for b0, b1, tile in _tiles(p):
            _drop_into(p[b0:b1], tile, dropout, b0)
            _slicewise(tile, v[b0:b1], out[b0:b1])
    _back(probs, p)


@_quiet_underflow
def attention_backward_fused(q: np.ndarray, k: np.ndarray, v: np.ndarray, probs: np.ndarray, g: np.ndarray,
                             scale: float | None, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray,
                             dropout: tuple | None = None) -> None:
    """Same contract as `attention_backward_reference`, a few batch elements at a time through one dP tile.

    q, k, v, g, dq, dk, dv may be strided views, as in the forward.
    """
    scale = _scale(q, scale)
    bf16 = _bf16_operands(q, k, v, g)
    # No keys (S = 0: _softmax_grad's rows would be 0 wide), no queries, or value heads 0 wide (g v^T is 0, so
    # no gradient flows to q and k): sums over nothing, and the slice path refuses empty arrays.
    if probs.size == 0 or g.size == 0:
        for grad in (dq, dk, dv):
            grad.fill(0)
        if bf16:
            _count_bf16("fused")
        return
    if slices.usable(q, k, v, probs, g, dq, dk, dv):
        slices.attention_backward_slices(q, k, v, probs, g, scale, dq, dk, dv, dropout)
        if bf16:
            _count_bf16("fused")
        return
    if bf16:
        _no_bf16_here()
    if dropout is None:
        _slicewise(_swap(probs), g, dv)
    for b0, b1, ds in _tiles(probs):
        if dropout is not None:  # the tile holds D = dropout(P) for dv first, then dP
            _drop_into(probs[b0:b1], ds, dropout, b0)
            _slicewise(_swap(ds), g[b0:b1], dv[b0:b1])
        _slicewise(g[b0:b1], _swap(v[b0:b1]), ds)  # dP (of D, with dropout)
        if dropout is not None:
            _drop_into(ds, ds, dropout, b0)  # dP of P: the same mask and scale
        _softmax_grad(_cin(probs[b0:b1]), ds, scale)  # dS, in place
        _slicewise(ds, k[b0:b1], dq[b0:b1])
        _slicewise(_swap(ds), q[b0:b1], dk[b0:b1])


def _no_bf16_here() -> None:
    raise RuntimeError("attention: bfloat16 operands need the slice path (MKL's bf16 GEMM called from Numba "
                       "kernels, kernels.gemm_bf16.in_kernels() is False here) and the arrays float32; ops round "
                       "q, k, v only where it runs (ops.attention), so pass float32 operands instead")


def _tiles(probs: np.ndarray):
    """(b0, b1, tile) over the batch: a scratch tile of about _TILE_ELEMENTS (or one batch element) from
    the step's arena (a fused plan's slab), not the heap, reused for every chunk."""
    nb, nh, t, s = probs.shape
    chunk = max(1, min(nb, _TILE_ELEMENTS // max(1, nh * t * s)))
    tile = empty((chunk, nh, t, s), probs.dtype)
    for b0 in range(0, nb, chunk):
        b1 = min(nb, b0 + chunk)
        yield b0, b1, tile[: b1 - b0]


def _drop_into(p: np.ndarray, out: np.ndarray, dropout: tuple, b0: int) -> None:
    """out = dropout(p) for batch elements b0.. of the whole (B, H, T, S) mask; out may be p."""
    seed, threshold, scale = dropout
    dropout_apply_fused(_cin(p), out, seed, threshold, scale, b0 * p[0].size)


register("attention_forward", "reference", attention_forward_reference)
register("attention_forward", "fused", attention_forward_fused)
register("attention_backward", "reference", attention_backward_reference)
register("attention_backward", "fused", attention_backward_fused)
