"""Attention one (batch, head) slice at a time, MKL's GEMMs called from inside the parallel loop.

kernels.attention's fused twin runs each product over all B*H slices at once (one cblas_?gemm_batch
call), then the softmax over the whole (B, H, T, S) probabilities: ViT-Tiny's 3.7 MB of them per
layer go out to memory and back three times in the forward, more in the backward. Here each core
takes whole slices, and for one slice does the q k^T product, the masked softmax and the P v
product (backward: dv, dP, the softmax gradient, dq, dk) back to back, while the slice's (T, S)
block is still in its cache (155 KB at T = S = 197). Each GEMM is MKL on one thread
(MKL_Set_Num_Threads_Local(1) around the loop body): the cores are already split over the slices.
Measured against the batched path on 2 cores, time inside the attention kernels per ViT-Tiny
training step (batch 8, 12 layers; both paths in one process, 8 alternating rounds of 3 steps,
medians): eager 77 -> 61 ms, fused 70 -> 62 ms; PyTorch's flash attention takes ~54 ms there.

Why this did not work before: with OpenBLAS, BLAS's own thread pool nested inside Numba's
oversubscribed the cores (6x to 50x slower, kernels/attention.py). MKL here runs on the same GNU
OpenMP pool as Numba's kernels (kernels.gemm) and is told to use one thread inside the loop.

How Numba reaches MKL: by symbol name (kernels.mkl_numba), so Numba's on-disk cache stays valid
across processes. The float products call OpenBLAS's one-thread GEMM instead where kernels.gemm_library
chose it (the default on CPUs that are not Intel's; `calls[("attention_library", ...)]` says which).
The path runs only when MKL is kernels.gemm's backend; `kernels.calls[("attention_slices", "mkl")]`
counts its calls (tests assert on it), and a process without MKL logs that once (kernels.gemm).

bfloat16 products (ops at float32_matmul_precision("bfloat16")): q, k, v (and backward's g) arrive
rounded, as uint16 bit patterns; they are widened to the float32 values they stand for (exact: a shift) and
every product is the float32 GEMM above, one thread per slice. Each slice rounds its P (or D = dropout(P))
to bfloat16 into a per-core tile of float32 values before D v and D^T g, and its dS into the same tile before
dS k and dS^T q; the softmax and its gradient stay float32. A product of two bfloat16 values is exact in
float32 and the sums are float32, so this is what MKL's cblas_gemm_bf16bf16f32 gives, up to the order of
the sums (kernels.gemm_bf16's twin; tests/test_attention_bf16.py). That GEMM was called here until a
helper's bisection found that each call from inside this libgomp parallel region kept ~100 bytes of the
process's memory for good (the same GEMM from Python, or cblas_sgemm here, kept none): repeated bf16
evaluate() grew RSS 278.6 -> 302.9 MiB over five calls, and `train --matmul-precision bfloat16` ended ~6%
over its plan. On this machine's Zen 4 the float32 products of widened values were also 2-4x faster than
MKL's bf16 ones inside the loop (tests/test_attention_bf16_memory.py holds the memory flat). The widened
copies are arena buffers of the call, twice the bfloat16 operands' bytes.

The arithmetic is kernels.attention's batched path's: the same row functions (`softmax_row`,
`softmax_grad_rows`, defined here and used by both), the same dropout mask hashed from (seed,
C-order index); only the GEMMs' blocking (hence the last bits of their sums) may differ.
"""

from __future__ import annotations

import contextlib

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from ..memory.arena import empty
from . import calls, choose
from .gemm import _slice_layout, mkl_symbols_loaded
from .dropout import dropped
from .mkl_numba import NO_TRANS as _NO_TRANS, TRANS as _TRANS
from .mkl_numba import gemm_call, set_local_threads
from . import blas_threads, gemm_library
from .gemm_bf16 import BF16, in_kernels as _bf16_in_kernels, round_bits
from . import fastmath as fm
from .softmax import _exp_fma_normalise, _rowdot, _rowmax

# Operand descriptors: one int64 row per operand, (address, batch stride, head stride, transpose, ld),
# strides in bytes: slice (b, h) of the operand starts at address + b * batch stride + h * head stride.
_ADDR, _SB, _SH, _TR, _LD = range(5)
# Rows of the forward's descriptor table, and of the backward's.
FWD_Q, FWD_KT, FWD_V, FWD_OUT = range(4)
BWD_Q, BWD_K, BWD_VT, BWD_G, BWD_DQ, BWD_DK, BWD_DV = range(7)


@numba.njit(inline="always")
def _at(d, b, h):
    return d[_ADDR] + b * d[_SB] + h * d[_SH]


# The helpers the parallel kernels below call once per slice are plain njit functions, not inline="always":
# inlined, Numba typed and lowered each copy inside the prange body, and a cold compile (an empty cache: a fresh
# install, CI) of the float32 forward and backward took 6.1 + 6.1 s; as calls, 4.8 + 3.0 s (first forward and
# backward at 2 x 3 x 17 x 8 under an empty NUMBA_CACHE_DIR, Zen 4). LLVM still sees their code (Numba links it
# into the kernel's module), and ViT-Tiny's attention (8 x 3 x 197 x 64) ran no slower: forward 2.25 -> 2.11 ms,
# backward 3.68 -> 3.44 ms (medians of 60, two alternating runs of each version).
@numba.njit
def _gemm(lib, f32, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    # c (m, n) = op(a) @ op(b), row-major, one thread (the loop set MKL's count for its thread; OpenBLAS's is held
    # at one by the Python caller, blas_threads.one_thread)
    gemm_call(lib, f32, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, False)


# The largest |scale * max(score)| softmax_row folds the scale into its exp for: the fma's residual at the max is then
# at most half an ulp of 2**16, 2**-8 in float32, so the max's exp stays within 0.4% of 1. Larger scores (never a
# trained model's: ViT's are in the tens) are scaled first, one extra pass over the row.
_FOLD_LIMIT = 65536.0


@numba.njit(inline="always")
def softmax_row(row, kb, has_kpm, causal, i, scale):
    """row (raw q.k scores of query i) -> its masked softmax of scale * score, in place.

    Dropped keys are written as -inf into the row, then its max m of scale * score, then one pass
    takes exp(score * scale - m) with a single rounding (fma) and sums it, one more scales by
    1 / sum. All in the row's precision (float32 arithmetic for float32 rows), no scratch row.
    For scale > 0, m = scale * max(score) rounded once equals the max of the rounded products
    (rounding is monotonic), so the scale needs no pass of its own; any other scale is applied
    to the row first. It replaced a version with a float64 scratch row (scale into it, mask, max,
    subtract back, exp): one 197 x 197 float32 slice alone 55 -> 34 us on one core, but inside fused
    ViT-Tiny steps (both versions taking turns in one process) the attention forward kernel only went
    30.2 -> 29.4 ms a step, ViT-Base 14.8 -> 14.1 ms. Results are the old ones to the bit for
    scale 1/8 (ViT's); other scales differ by the scale's own rounding to the row's precision.

    kernels.attention's _masked_softmax inlines this into its own disk-cached code; Numba's cache
    of it notices edits made here through kernels/numba_cache.py.
    """
    s = row.shape[0]
    sc = fm.like(row[0], scale)
    folded = sc > fm.like(sc, 0.0)
    if not folded:  # scale <= 0 (or NaN): multiply first, so the masks below stay -inf
        for j in range(s):
            row[j] = row[j] * sc
    if has_kpm:
        for j in range(s):
            row[j] = -np.inf if kb[j] else row[j]  # a select and a plain store: no scatter
    if causal:
        later = row[i + 1:]  # a view indexed from 0: range(i + 1, s) made LLVM scatter
        for j in range(later.shape[0]):
            later[j] = -np.inf
    mx = _rowmax(row)
    if folded:
        mx = mx * sc
        if mx > fm.like(mx, _FOLD_LIMIT) or mx < fm.like(mx, -_FOLD_LIMIT):
            # fma(score, scale, -m) leaves the row's max a residual of up to half an ulp of m: past 2**31 in
            # float32 that is over 88, and exp overflowed (a NaN row) or every exp underflowed (a zero row, as if
            # masked), where the scaled-first row is right (a helper's hunt: q, k ~ 1e10, head size 8).
            folded = False
            for j in range(s):
                row[j] = row[j] * sc  # the dropped keys' -inf stay -inf (sc > 0)
            mx = _rowmax(row)
    if mx == -np.inf:  # every key dropped: exp(-inf) = 0, and the row stays zeros, not NaN
        mx = fm.like(mx, 0.0)
    _exp_fma_normalise(row, sc if folded else fm.like(sc, 1.0), -mx)


@numba.njit(cache=True, fastmath=False)
def softmax_grad_rows(p, ds, scale):
    """ds (dP on entry) -> scale * P * (dP - rowsum(P * dP)), in place, one 2-D block of rows.

    In float64 throughout: dP - rowsum cancels. Float32 after the float64 row sum was 30% faster on
    a 197 x 197 slice (15.4 -> 10.9 us) but missed the reference by 0.5% on small dq entries at
    scale 40 (test_any_scale_with_masks_matches_the_reference_twin); ~1 ms a ViT-Tiny step, not kept."""
    for r in range(p.shape[0]):
        rowdot = _rowdot(p[r], ds[r])  # float64, vectorised
        for j in range(p.shape[1]):
            ds[r, j] = scale * p[r, j] * (ds[r, j] - rowdot)


@numba.njit
def _drop(src, dst, seed, threshold, scale, zero, start):
    # dst = src * (scale where kept, 0 elsewhere); element i of the tile is element start + i of the mask
    a = src.reshape(-1)
    o = dst.reshape(-1)
    for i in range(a.shape[0]):
        o[i] = dropped(a[i], seed, threshold, scale, zero, start + np.uint64(i))


@numba.njit
def _drop_in_place(x, seed, threshold, scale, zero, start):
    # one array read and written (two aliased ones would fail LLVM's overlap check and run scalar)
    a = x.reshape(-1)
    for i in range(a.shape[0]):
        a[i] = dropped(a[i], seed, threshold, scale, zero, start + np.uint64(i))


@numba.njit
def _softmax_rows(p, kb, has_kpm, causal, scale):
    for i in range(p.shape[0]):
        softmax_row(p[i], kb, has_kpm, causal, i, scale)


@numba.njit
def _round_block(bits, out):
    # out (uint32 bits of a float32 tile) = bits rounded to bfloat16 and widened back to float32 (exact): the
    # product that reads it is a float32 one (cblas_sgemm). MKL's cblas_gemm_bf16bf16f32, called inside this
    # libgomp parallel region, grew the process's memory by ~100 bytes a call, never given back.
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            out[i, j] = np.uint32(round_bits(bits[i, j])) << np.uint32(16)


@numba.njit(inline="always")
def _span(c, nchunks, total):
    c64 = np.int64(c)  # prange's index is unsigned: keep the arithmetic in int64
    return c64 * total // nchunks, (c64 + 1) * total // nchunks


@numba.njit(cache=True, parallel=True, error_model="numpy", fastmath={"contract"})
def _forward(ops, probs, tiles, kpm, has_kpm, causal, scale, has_drop, seed, threshold, dscale, zero, f32, lib, nchunks,
             nh, hs, hv, bf16, pbits, tbits, rounded):
    # probs (B, H, T, S) C-contiguous, written with the undropped P; tiles (nchunks, T, S) hold D = dropout(P).
    # f32: float32 (cblas_sgemm) or float64 (cblas_dgemm); lib: MKL's or OpenBLAS's (gemm_library); zero is 0 in
    # probs' dtype.
    # bf16: q, k, v are bfloat16 and both products are: P (or D) is rounded into rounded[c] (nchunks, T, S
    # uint16) from pbits / tbits, probs and tiles viewed as uint32 (empty stand-ins otherwise).
    nb, _, t, s = probs.shape
    q, kt, v, out = ops[FWD_Q], ops[FWD_KT], ops[FWD_V], ops[FWD_OUT]
    for c in numba.prange(nchunks):
        lo, hi = _span(c, nchunks, nb * nh)
        saved = set_local_threads(1)
        for sl in range(lo, hi):
            b = sl // nh
            h = sl % nh
            p = probs[b, h]
            _gemm(lib, f32, q[_TR], kt[_TR], t, s, hs, _at(q, b, h), q[_LD], _at(kt, b, h), kt[_LD], p.ctypes.data, s)
            _softmax_rows(p, kpm[b if has_kpm else 0], has_kpm, causal, scale)
            src = p
            if has_drop:
                src = tiles[c]
                _drop(p, src, seed, threshold, dscale, zero, np.uint64(sl * t * s))
            if bf16:
                r = rounded[c]
                _round_block(tbits[c] if has_drop else pbits[b, h], r)
                _gemm(lib, f32, _NO_TRANS, v[_TR], t, hv, s, r.ctypes.data, s, _at(v, b, h), v[_LD], _at(out, b, h),
                      out[_LD])
            else:
                _gemm(lib, f32, _NO_TRANS, v[_TR], t, hv, s, src.ctypes.data, s, _at(v, b, h), v[_LD], _at(out, b, h),
                      out[_LD])
        set_local_threads(saved)


@numba.njit(cache=True, parallel=True, error_model="numpy", fastmath={"contract"})
def _backward(ops, probs, tiles, scale, has_drop, seed, threshold, dscale, zero, f32, lib, nchunks, nh, hs, hv, bf16,
              pbits, tbits, rounded):
    # tiles (nchunks, T, S): D = dropout(P) for dv first (when dropping), then dP -> dS.
    # bf16: q, k, v, g are bfloat16 and so are all four products: rounded[c] holds D rounded, then dS
    # (pbits, tbits: probs and tiles viewed as uint32, as in _forward).
    nb, _, t, s = probs.shape
    q, k, vt, g = ops[BWD_Q], ops[BWD_K], ops[BWD_VT], ops[BWD_G]
    dq, dk, dv = ops[BWD_DQ], ops[BWD_DK], ops[BWD_DV]
    for c in numba.prange(nchunks):
        lo, hi = _span(c, nchunks, nb * nh)
        saved = set_local_threads(1)
        tile = tiles[c]
        for sl in range(lo, hi):
            b = sl // nh
            h = sl % nh
            p = probs[b, h]
            start = np.uint64(sl * t * s)
            d = p
            if has_drop:
                d = tile
                _drop(p, d, seed, threshold, dscale, zero, start)
            if bf16:
                r = rounded[c]
                _round_block(tbits[c] if has_drop else pbits[b, h], r)
                _gemm(lib, f32, _TRANS, g[_TR], s, hv, t, r.ctypes.data, s, _at(g, b, h), g[_LD], _at(dv, b, h), dv[_LD])
                _gemm(lib, f32, g[_TR], vt[_TR], t, s, hv, _at(g, b, h), g[_LD], _at(vt, b, h), vt[_LD], tile.ctypes.data,
                      s)
            else:
                # dv (S, hv) = D^T g
                _gemm(lib, f32, _TRANS, g[_TR], s, hv, t, d.ctypes.data, s, _at(g, b, h), g[_LD], _at(dv, b, h),
                      dv[_LD])
                # dP (T, S) = g v^T, of D; the same mask takes it to dP of P
                _gemm(lib, f32, g[_TR], vt[_TR], t, s, hv, _at(g, b, h), g[_LD], _at(vt, b, h), vt[_LD],
                      tile.ctypes.data, s)
            if has_drop:
                _drop_in_place(tile, seed, threshold, dscale, zero, start)
            softmax_grad_rows(p, tile, scale)
            # dq (T, hs) = dS k; dk (S, hs) = dS^T q
            if bf16:
                r = rounded[c]
                _round_block(tbits[c], r)
                _gemm(lib, f32, _NO_TRANS, k[_TR], t, hs, s, r.ctypes.data, s, _at(k, b, h), k[_LD], _at(dq, b, h),
                      dq[_LD])
                _gemm(lib, f32, _TRANS, q[_TR], s, hs, t, r.ctypes.data, s, _at(q, b, h), q[_LD], _at(dk, b, h), dk[_LD])
            else:
                _gemm(lib, f32, _NO_TRANS, k[_TR], t, hs, s, tile.ctypes.data, s, _at(k, b, h), k[_LD], _at(dq, b, h),
                      dq[_LD])
                _gemm(lib, f32, _TRANS, q[_TR], s, hs, t, tile.ctypes.data, s, _at(q, b, h), q[_LD], _at(dk, b, h),
                      dk[_LD])
        set_local_threads(saved)


def usable(*arrays: np.ndarray) -> bool:
    """Whether this path can run: MKL is kernels.gemm's backend, no array has an empty axis, and every array
    is float32 or float64 of one dtype, or (bfloat16 products) the operands are bfloat16 (uint16), the rest
    float32, and Numba kernels can call MKL's bf16 GEMM."""
    floats = {a.dtype for a in arrays if a.dtype != BF16}
    bf16 = len(floats) < len({a.dtype for a in arrays})
    if bf16:
        dtype_ok = floats == {np.dtype(np.float32)} and _bf16_in_kernels()
    else:
        dtype_ok = len(floats) == 1 and floats <= {np.dtype(np.float32), np.dtype(np.float64)}
    return (choose("batched_gemm") == "fused" and mkl_symbols_loaded() and dtype_ok
            and all(a.size > 0 for a in arrays))


def _descriptor(x: np.ndarray, table: np.ndarray, row: int, *, output: bool = False) -> np.ndarray:
    """Fill table[row] with how BLAS reads (or, for an output, writes) every (b, h) slice of x in place.

    Returns the array the table points at: x itself, or a C-contiguous copy from the step's arena when
    x's slices have no BLAS layout (or, for an output, no row-major one; the caller copies it back).
    """
    rows, cols = x.shape[-2:]
    layout = _slice_layout(x, rows, cols)
    if layout is None or (output and layout[0] != _NO_TRANS):
        copy = empty(x.shape, x.dtype)
        if not output:
            np.copyto(copy, x)
        x, layout = copy, (_NO_TRANS, max(1, cols))
    table[row] = (x.ctypes.data, x.strides[0], x.strides[1], layout[0], layout[1])
    return x


def _chunks(nb: int, nh: int) -> int:
    return max(1, min(numba.get_num_threads(), nb * nh))


def _drop_args(dropout: tuple | None, dtype) -> tuple:
    if dropout is None:
        return False, np.uint64(0), np.uint64(0), dtype.type(1)
    seed, threshold, scale = dropout
    return True, np.uint64(seed), np.uint64(threshold), dtype.type(scale)


_NO_TILES = {np.dtype(dt): np.empty((0, 0, 0), dt) for dt in (np.float32, np.float64)}  # forward without dropout
_NO_BITS = (np.empty((0, 0, 0, 0), np.uint32), np.empty((0, 0, 0), np.uint32), np.empty((0, 0, 0), np.uint32))


def _bf16_args(bf16: bool, probs: np.ndarray, tiles: np.ndarray, nchunks: int) -> tuple:
    """(bf16, probs and tiles as uint32, the per-core tile P or dS is rounded into) for the kernels; empty
    stand-ins of the same types when the products are not bfloat16."""
    if not bf16:
        return (False, *_NO_BITS)
    t, s = probs.shape[-2:]
    return True, probs.view(np.uint32), tiles.view(np.uint32), empty((nchunks, t, s), np.uint32)


def _widened(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> the float32 values they stand for (exact), in a C-contiguous arena buffer; other
    arrays as they are. The slices multiply these with cblas_sgemm: a float32 product of bfloat16 values, as
    cblas_gemm_bf16bf16f32 computes it up to the order of the float32 sums (kernels.gemm_bf16's twin)."""
    if x.dtype != BF16:
        return x
    wide = empty(x.shape, np.float32)
    np.left_shift(x, np.uint32(16), out=wide.view(np.uint32), dtype=np.uint32)
    return wide


def _contiguous_probs(probs: np.ndarray) -> np.ndarray:
    return probs if probs.flags.c_contiguous else empty(probs.shape, probs.dtype)


def _library(q: np.ndarray) -> int:
    """The library the slices' float products call now (bfloat16 ones are MKL's whatever it is); counted."""
    lib = gemm_library.current()
    calls[("attention_library", "mkl" if q.dtype == BF16 else gemm_library.NAMES[lib])] += 1
    return lib


def _one_thread_if(lib: int):
    """OpenBLAS held at one thread while the slices call it (blas_threads.one_thread)."""
    return blas_threads.one_thread() if lib == gemm_library.OPENBLAS else contextlib.nullcontext()


def attention_forward_slices(q: np.ndarray, k: np.ndarray, v: np.ndarray, kpm: np.ndarray, has_kpm: bool,
                             causal: bool, scale: float, out: np.ndarray, probs: np.ndarray,
                             dropout: tuple | None) -> None:
    """kernels.attention's forward, slice by slice (the module docstring); the caller checked `usable`."""
    nb, nh, t, hs = q.shape
    s, hv = k.shape[2], v.shape[3]
    bf16 = q.dtype == BF16
    q, k, v = _widened(q), _widened(k), _widened(v)
    table = np.zeros((4, 5), np.int64)
    keep = [_descriptor(q, table, FWD_Q), _descriptor(k.swapaxes(-1, -2), table, FWD_KT),
            _descriptor(v, table, FWD_V)]  # alive until the kernel returns: the table holds their addresses
    out_w = _descriptor(out, table, FWD_OUT, output=True)
    p = _contiguous_probs(probs)
    nchunks = _chunks(nb, nh)
    has_drop, seed, threshold, dscale = _drop_args(dropout, p.dtype)
    tiles = empty((nchunks, t, s), p.dtype) if has_drop else _NO_TILES[p.dtype]
    lib = _library(q)
    with _one_thread_if(lib):
        _forward(table, p, tiles, kpm, has_kpm, causal, float(scale), has_drop, seed, threshold, dscale,
                 p.dtype.type(0), p.dtype == np.float32, lib, nchunks, nh, hs, hv,
                 *_bf16_args(bf16, p, tiles, nchunks))
    del keep
    if out_w is not out:
        np.copyto(out, out_w)
    if p is not probs:
        np.copyto(probs, p)
    calls[("attention_slices", "mkl")] += 1


def attention_backward_slices(q: np.ndarray, k: np.ndarray, v: np.ndarray, probs: np.ndarray, g: np.ndarray,
                              scale: float, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray,
                              dropout: tuple | None) -> None:
    """kernels.attention's backward, slice by slice; the caller checked `usable`."""
    nb, nh, t, hs = q.shape
    s, hv = k.shape[2], v.shape[3]
    bf16 = q.dtype == BF16
    q, k, v, g = _widened(q), _widened(k), _widened(v), _widened(g)
    table = np.zeros((7, 5), np.int64)
    keep = [_descriptor(q, table, BWD_Q), _descriptor(k, table, BWD_K),
            _descriptor(v.swapaxes(-1, -2), table, BWD_VT), _descriptor(g, table, BWD_G)]
    outs = [(dq, _descriptor(dq, table, BWD_DQ, output=True)), (dk, _descriptor(dk, table, BWD_DK, output=True)),
            (dv, _descriptor(dv, table, BWD_DV, output=True))]
    p = probs
    if not probs.flags.c_contiguous:
        p = empty(probs.shape, probs.dtype)
        np.copyto(p, probs)
    nchunks = _chunks(nb, nh)
    has_drop, seed, threshold, dscale = _drop_args(dropout, p.dtype)
    tiles = empty((nchunks, t, s), p.dtype)
    lib = _library(q)
    with _one_thread_if(lib):
        _backward(table, p, tiles, float(scale), has_drop, seed, threshold, dscale, p.dtype.type(0),
                  p.dtype == np.float32, lib, nchunks, nh, hs, hv, *_bf16_args(bf16, p, tiles, nchunks))
    del keep
    for user, written in outs:
        if written is not user:
            np.copyto(user, written)
    calls[("attention_slices", "mkl")] += 1
