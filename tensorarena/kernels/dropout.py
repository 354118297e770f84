"""Dropout's keep mask from a counter-based hash: a NumPy reference and a fused Numba twin.

Element i (C order) of a dropout call is kept when the high 32 bits of mix(seed + (i + 1) * GAMMA)
are >= threshold = round(p * 2**32), where mix is SplitMix64's finaliser (Steele, Lea & Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014: xor-shift 30, multiply, xor-shift
27, multiply, xor-shift 31, with the published constants) and seed is one uint64 drawn from the
caller's numpy Generator. So a mask is a pure function of (seed, i): the fused twin computes it in
parallel, packed (8 uint64 lanes: AVX-512's vpmullq, checked in the assembly), inside the multiply that applies it, and backward recomputes it
from the seed instead of keeping a mask the size of the activation.

Both directions are the same operation, out = x * (scale if kept else 0) with scale = 1 / (1 - p)
rounded in x's dtype (torch's inverted dropout; a dropped NaN or inf becomes NaN, as x * 0 makes it).
P(kept) = 1 - threshold / 2**32, i.e. 1 - p to within 2**-33. Measured on (64, 12, 64, 64) float32
attention probabilities (2 threads): the previous NumPy path (Generator.random into a float32
mask, compare, scale, multiply) 11 ms, this kernel ~1 ms.
"""

from __future__ import annotations

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np

from . import register

GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment (2**64 / golden ratio, odd)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def keep_threshold(p: float) -> int:
    """The 32-bit threshold for drop probability p in (0, 1): keep where hash >= it."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"keep_threshold wants 0 < p < 1, got {p}")
    return min(max(round(p * 2.0**32), 1), 2**32 - 1)


def keep_mask_reference(seed: int, n: int, threshold: int, start: int = 0) -> np.ndarray:
    """Which elements start .. start + n - 1 (C order) a dropout call with this seed keeps (plain NumPy)."""
    z = np.uint64(seed) + np.arange(start + 1, start + n + 1, dtype=np.uint64) * GAMMA  # uint64 arrays wrap
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(32)) >= np.uint64(threshold)


def dropout_apply_reference(x: np.ndarray, out: np.ndarray, seed: int, threshold: int, scale: float,
                            start: int = 0) -> None:
    """out = x * (scale where kept, 0 elsewhere); x, out C-contiguous, same shape, out may be x.

    `start` is the C-order index of x's first element within the whole dropped array, so a
    chunk gets the same mask as the whole would (plain NumPy).
    """
    keep = keep_mask_reference(seed, x.size, threshold, start).reshape(x.shape)
    factor = np.where(keep, x.dtype.type(scale), x.dtype.type(0))
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 = NaN and a huge x * scale = inf, as torch
        np.multiply(x, factor, out=out)


@numba.njit(inline="always")
def _kept(seed, index, threshold):
    z = seed + np.uint64(index) * GAMMA
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(32)) >= threshold


@numba.njit(inline="always")
def dropped(value, seed, threshold, scale, zero, position):
    """value * scale if the mask keeps the element at C-order `position` (0-based) of the whole
    dropped array, else value * 0 (the one expression every dropout loop applies)."""
    return value * (scale if _kept(seed, position + np.uint64(1), threshold) else zero)


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _apply(x, out, seed, threshold, scale, zero, start):
    for i in numba.prange(x.shape[0]):
        out[i] = dropped(x[i], seed, threshold, scale, zero, start + np.uint64(i))


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _apply_in_place(x, seed, threshold, scale, zero, start):
    # One array read and written: two aliased arguments would fail LLVM's overlap check and run scalar.
    for i in numba.prange(x.shape[0]):
        x[i] = dropped(x[i], seed, threshold, scale, zero, start + np.uint64(i))


def dropout_apply_fused(x: np.ndarray, out: np.ndarray, seed: int, threshold: int, scale: float,
                        start: int = 0) -> None:
    """Same contract as `dropout_apply_reference`: one parallel pass, the mask hashed in registers."""
    t = x.dtype.type
    args = (np.uint64(seed), np.uint64(threshold), t(scale), t(0), np.uint64(start))
    if out is x:
        _apply_in_place(x.reshape(-1), *args)
    else:
        _apply(x.reshape(-1), out.reshape(-1), *args)


register("dropout_apply", "reference", dropout_apply_reference)
register("dropout_apply", "fused", dropout_apply_fused)
