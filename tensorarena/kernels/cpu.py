"""Which vectors Numba's compiled kernels use: 512-bit on AVX-512 cores.

LLVM's tuning for Intel server cores prefers 256-bit vectors (older Xeons clocked down on 512-bit
code), so Numba's loops ran 8 float32 lanes wide even where 16 fit. Our kernels are short,
compute-bound loops (the erf and exp polynomials of kernels.fastmath); on this machine's Emerald
Rapids cores 512-bit code measured, on ViT-Tiny shapes (1576 x 768 float32, 2 threads): GELU
forward 1.7 -> 1.1 ms, bias-GELU backward 2.3 -> 1.5 ms, masked softmax 2.0 -> 1.6 ms.

The choice must be made before Numba builds its target machine (when the first kernel is
decorated), so every kernel module imports this one before `import numba`. A NUMBA_CPU_FEATURES
the user set wins, and nothing changes on cores without AVX-512. Numba's on-disk cache keys on
the feature string, so kernels cached under other settings are recompiled, not reused.
"""

from __future__ import annotations

import os
import sys


def _prefer_512_bit_vectors() -> None:
    if "NUMBA_CPU_FEATURES" in os.environ:
        return
    import llvmlite.binding as llvm  # Numba imports it anyway

    try:
        features = llvm.get_host_cpu_features()
    except RuntimeError:  # LLVM cannot read this host's features: leave Numba's defaults
        return
    if not features.get("avx512f"):
        return
    wanted = features.flatten() + ",-prefer-256-bit"
    os.environ["NUMBA_CPU_FEATURES"] = wanted
    if "numba" in sys.modules:  # already imported: its config re-reads the environment only when compiling
        sys.modules["numba"].core.config.CPU_FEATURES = wanted


def vector_width_bits() -> int:
    """The widest vectors Numba's compiled kernels use in this process: 512, 256 or 128 bits."""
    from numba.core.registry import cpu_target

    features = cpu_target.target_context.codegen()._tm_features
    if "+avx512f" in features and "-prefer-256-bit" in features:
        return 512
    return 256 if "+avx" in features else 128


_prefer_512_bit_vectors()
