"""The 2-D matrix products of ops (linear, matmul, the fused GELU+linear) at the thread's precision.

float32 products run in float32 unless tensorarena.precision says "bfloat16": then both operands
are rounded to bfloat16 into transient buffers of the current arena (so the fused route plans them
into its slab like any other buffer, and its memory report counts them) and one bf16 GEMM
accumulates in float32 into `out`. Where bfloat16 GEMMs cannot run (no MKL, or an MKL without them)
products stay float32 and a warning says so once. Where they run but slowly (a CPU without bfloat16 units:
AMD's, older Intel's) they still run, as asked, and a warning says so once: unlike torch, whose "medium" is a
hint its CPU products ignore there (bit-identical to "highest" on an AMD EPYC Zen 3 and Zen 4).

Attention's products (ops.attention) follow the same setting through `bf16_attention`: its kernels take
q, k, v (and the gradient) rounded once by the op and round the probabilities and dS themselves.

An op that uses one operand in several products rounds it once with `operand` and passes the
rounded array (uint16 bit patterns) to `product`: linear rounds its input in forward and keeps only
the rounded copy for the weight's gradient, half the bytes of the float32 one, and rounds the
incoming gradient once for both of its backward products. A product that receives a rounded
operand runs in bfloat16 whatever the thread's setting is by then: forward decided.
"""

from __future__ import annotations

import logging

import numpy as np

from ..kernels import calls, choose, gemm_bf16, kernel
from ..kernels.gemm import gemm
from ..precision import get_float32_matmul_precision
from ._base import new

log = logging.getLogger("tensorarena")

_F32 = np.dtype(np.float32)
_warned = False
_warned_attention = False


def _asked(dtype) -> bool:
    return np.dtype(dtype) == _F32 and get_float32_matmul_precision() == "bfloat16"


def bf16_asked(dtype) -> bool:
    """Whether float32 products of this dtype are asked to run in bfloat16 now (whether they can: bf16_products)."""
    return _asked(dtype)


def bf16_products(dtype) -> bool:
    """Whether float32 products of this dtype run in bfloat16 now (says once when asked for but impossible)."""
    global _warned
    if not _asked(dtype):
        return False
    if gemm_bf16.available():
        if not _warned:  # bfloat16 was asked for, and runs; but where it costs time, say so once
            _warned = True
            slow = gemm_bf16.slow_here()
            if slow:
                log.warning("float32 matmul precision is 'bfloat16' and products run in bfloat16, but %s", slow)
        return True
    if not _warned:
        _warned = True
        log.warning("float32 matmul precision is 'bfloat16', but products stay float32: %s", gemm_bf16.why_not())
    return False


def bf16_attention(dtype) -> bool:
    """Whether attention's products of this dtype run in bfloat16 now: as `bf16_products`, and where the
    fused attention kernel runs, only if Numba kernels can call the bf16 GEMM (kernels.gemm_bf16.in_kernels).
    Asked for but impossible: float32, counted in calls[("attention_bf16", "skipped: float32 instead")]."""
    global _warned_attention
    if not _asked(dtype):
        return False
    if bf16_products(dtype):
        if choose("attention_forward") == "reference" or gemm_bf16.in_kernels():
            return True
        if not _warned_attention:
            _warned_attention = True
            log.warning("float32 matmul precision is 'bfloat16', but attention's products stay float32: Numba "
                        "kernels cannot call MKL's bf16 GEMM here (kernels.gemm logged why)")
    calls[("attention_bf16", "skipped: float32 instead")] += 1
    return False


def rounded(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 in a new arena buffer, in x's own memory order (a transposed view of a
    row-major array stays a transposed view, which the GEMM reads with its transpose flag)."""
    if x.dtype == gemm_bf16.BF16:
        return x
    if x.ndim == 2 and x.shape[0] > 1 and x.strides[0] == x.itemsize:
        out = new(x.shape[::-1], gemm_bf16.BF16)
        kernel("to_bfloat16")(x.T, out)
        return out.T
    out = new(x.shape, gemm_bf16.BF16)
    kernel("to_bfloat16")(x, out)
    return out


def operand(x: np.ndarray) -> np.ndarray:
    """x as products of its dtype take it now: rounded to bfloat16 once (bf16_products), else x itself."""
    return rounded(x) if bf16_products(x.dtype) else x


def product(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False) -> np.ndarray:
    """out = a @ b (out += a @ b with accumulate) for 2-D arrays, at the float32 matmul precision.

    a and b are float arrays, or operands `operand` already rounded (then the product is bfloat16).
    """
    if a.dtype == gemm_bf16.BF16 or b.dtype == gemm_bf16.BF16:
        return kernel("gemm_bf16")(rounded(a), rounded(b), out, accumulate)
    if _asked(out.dtype):
        if bf16_products(out.dtype):
            return kernel("gemm_bf16")(rounded(a), rounded(b), out, accumulate)
        calls[("gemm_bf16", "skipped: float32 instead")] += 1  # asked for, impossible here: say what ran
    return gemm(a, b, out, accumulate)
