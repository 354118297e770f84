"""bfloat16 products with float32 accumulation: rounding float32 to bfloat16, and MKL's bf16 GEMM.

What `float32_matmul_precision("bfloat16")` runs (tensorarena.precision). bfloat16 is float32's top
16 bits: the same 8-bit exponent, 7 stored mantissa bits. NumPy has no bfloat16 dtype, so the
rounded values are held as uint16 bit patterns.

Rounding is to nearest, ties to even, on the 16 dropped bits: (u + 0x7FFF + ((u >> 16) & 1)) >> 16
on the float32 bits u. A value that rounds past the largest bfloat16 becomes infinity, as IEEE
rounding does. A NaN is kept a NaN explicitly (the add would carry a NaN whose payload sits only in
the low bits into infinity) and made quiet.

The product: MKL's cblas_gemm_bf16bf16f32 multiplies bfloat16 operands, accumulates and writes
float32, on the CPU's AVX512-BF16 / AMX units where it has them. Its twin widens the operands back
to float32 (exact) and multiplies them with np.matmul in float32, so the two differ only in the
order of float32 sums, and in subnormals: on an Intel Xeon with AMX-BF16 (a helper measured it) MKL's
GEMM reads subnormal bfloat16 operands as 0 and flushes subnormal float32 results to 0, as those
instructions do (x = 1e-39 times a weight of 1, 32 terms: 0 where the exact sum is 3.2e-38), while
the twin, torch's bf16 mm and the attention slices (kernels/attention_heads.py) keep them. Only
values under float32's smallest normal, 1.2e-38, are affected.

Routes are counted like every kernel's: `calls[("to_bfloat16", ...)]` and `calls[("gemm_bf16", ...)]`.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import gemm as _gemm
from . import _registry, register

BF16 = np.dtype(np.uint16)  # storage of a bfloat16 value: its bit pattern
_F32 = np.dtype(np.float32)
_NAN_BITS = 0x7F800000  # float32 bits above this (sign cleared) are NaNs
_QUIET = 0x0040  # bfloat16's quiet-NaN bit


def to_bfloat16_reference(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out (uint16, src's shape) = src (float32) rounded to bfloat16, ties to even; NumPy."""
    bits = src.astype(_F32, copy=False).view(np.uint32).astype(np.uint64)  # uint64: the add cannot wrap
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > _NAN_BITS
    out[...] = np.where(nan, (bits >> 16) | _QUIET, rounded).astype(BF16)
    return out


@numba.njit(inline="always")
def round_bits(u):
    """One float32's bits (uint32) -> its bfloat16 bits (uint16): nearest, ties to even, NaNs kept quiet NaNs.

    kernels.attention_heads' disk-cached kernels inline this; their cache notices edits made here through
    kernels/numba_cache.py.
    """
    # uint32 lanes throughout: finite values cannot wrap (-inf + 0x8000 < 2^32), and a select rather
    # than a branch keeps the loops that inline this vectorised.
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet = (u >> np.uint32(16)) | np.uint32(_QUIET)
    return np.uint16(quiet if (u & np.uint32(0x7FFFFFFF)) > np.uint32(_NAN_BITS) else rounded)


@numba.njit(inline="always")
def round_block(bits, out):
    """out (2-D uint16) = bits (2-D uint32 view of float32, any strides) rounded, on the calling thread."""
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            out[i, j] = round_bits(bits[i, j])


@numba.njit(parallel=True, cache=True)
def _round_rows(bits, out):
    for i in numba.prange(bits.shape[0]):
        for j in range(bits.shape[1]):
            out[i, j] = round_bits(bits[i, j])


@numba.njit(parallel=True, cache=True)
def _round_slices(bits, out):
    # (A, B, rows, cols): the (a, b) slices shared over the cores; e.g. attention's q, k, v heads
    # read as strided views of a packed projection.
    nb = bits.shape[1]
    for ab in numba.prange(bits.shape[0] * nb):
        a, b = ab // nb, ab % nb
        round_block(bits[a, b], out[a, b])


def to_bfloat16_fused(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The Numba twin: rows (2-D) or (a, b) slices (4-D) split over the cores; src may be any strided view.

    1-D and 3-D arrays go as 2-D and 4-D ones with a leading axis of 1.
    """
    if src.dtype != _F32 or out.dtype != BF16 or src.shape != out.shape or not 1 <= src.ndim <= 4:
        raise TypeError(f"to_bfloat16: needs 1- to 4-D float32 src and uint16 out of one shape, got "
                        f"{src.dtype} {src.shape} -> {out.dtype} {out.shape}")
    padded = (src[None], out[None]) if src.ndim in (1, 3) else (src, out)
    # A float32 -> uint32 view keeps the strides (same item size), so transposed views work too.
    (_round_rows if padded[0].ndim == 2 else _round_slices)(padded[0].view(np.uint32), padded[1])
    return out


def widen(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> the float32 values they stand for (exact)."""
    return (bits.astype(np.uint32) << 16).view(_F32)


def gemm_bf16_reference(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False) -> np.ndarray:
    """out (float32) = a @ b (or out += a @ b) for bfloat16 a (m, k) and b (k, n): widened, np.matmul."""
    product = np.matmul(widen(a), widen(b))
    if accumulate:
        out += product
    else:
        out[...] = product
    return out


def gemm_bf16_mkl(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False) -> np.ndarray:
    """out (float32) = a @ b (or out += a @ b) for bfloat16 a (m, k) and b (k, n), one call on MKL's threads.

    Checked and laid out as kernels.gemm's float32 products are: operands read in place when
    row-major or a transposed view of a row-major array.
    """
    prepared = _gemm._product_job(a, b, out, accumulate, bf16=True)
    if prepared is None:
        return out
    (ta, tb, m, n, k, pa, lda, pb, ldb, pc, ldc, acc), _keep = prepared  # _keep: operand copies, if any
    _gemm._mkl.bf16_fn(_gemm._ROW_MAJOR, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, 1.0 if acc else 0.0, pc, ldc)
    return out


def _mkl_is_the_backend() -> bool:
    # Not only loaded: kernels.gemm.use_backend("numpy") takes MKL's float32 GEMMs away, and the
    # bfloat16 ones go with them.
    return _gemm._mkl is not None and "fused" in _registry.get("gemm", {})


def available() -> bool:
    """Whether bfloat16 products run on MKL here (the fast path); else they would run on the twin."""
    return _mkl_is_the_backend() and _gemm._mkl.bf16_fn is not None


def _cpu_info() -> tuple[str, set[str]]:
    """(vendor_id, flags) of this machine's first CPU in /proc/cpuinfo; ("", set()) where it cannot be read."""
    vendor, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


def slow_here() -> str:
    """Why MKL's bf16 GEMM is likely slower than its float32 one on this CPU, or "" where it should be faster.

    MKL picks its bf16 kernels by Intel CPU features (AMX-BF16, AVX512-BF16). On an AMD EPYC with
    AVX512-BF16 it still ran a block of ViT-Tiny's linear products in 1.16x its float32 time, 1.47x
    with our rounding of the operands (`python bench/gemm_bf16.py`; on an Intel Emerald Rapids: 0.53x).
    """
    vendor, flags = _cpu_info()
    if vendor == "GenuineIntel" and flags & {"amx_bf16", "avx512_bf16"}:
        return ""
    what = f"{vendor or 'an unknown vendor'}'s CPU" + ("" if flags & {"amx_bf16", "avx512_bf16"} else
                                                       " without bfloat16 units")
    return (f"MKL has fast bfloat16 GEMMs only for Intel CPUs with AMX-BF16 or AVX512-BF16, and this is {what}: "
            f"expect bfloat16 products to be slower than float32 ones here (an AMD EPYC measured 1.16x float32's "
            f"time, 1.47x with the rounding; bench/gemm_bf16.py)")


def in_kernels() -> bool:
    """Whether bfloat16 products are on here with MKL's symbols bound for Numba: then attention's slice path
    (kernels.attention_heads) takes bfloat16 operands (it multiplies them widened to float32, with MKL's or
    OpenBLAS's float32 GEMM: MKL's bf16 GEMM inside its parallel loop kept memory at every call)."""
    return available() and _gemm.mkl_symbols_loaded()


def why_not() -> str:
    """Why `available()` is False, for the log line that says products stay float32."""
    if not _mkl_is_the_backend():
        return f"MKL is not the GEMM backend ({_gemm._why_not})"
    return "" if available() else f"libmkl_rt at {_gemm._mkl.path} has no cblas_gemm_bf16bf16f32"


register("to_bfloat16", "reference", to_bfloat16_reference)
register("to_bfloat16", "fused", to_bfloat16_fused)
register("gemm_bf16", "reference", gemm_bf16_reference)
if _gemm._mkl is not None and _gemm._mkl.bf16_fn is not None:
    register("gemm_bf16", "fused", gemm_bf16_mkl)
