"""kernels.cpu: Numba's kernels are compiled for 512-bit vectors on AVX-512 cores, unless the user chose.

Each case runs in a fresh interpreter: the vector width is fixed when Numba builds its compiler.
"""

import os
import subprocess
import sys

import pytest

PROBE = ("import tensorarena.kernels.gelu, tensorarena.kernels.cpu as c, os; "
         "print(c.vector_width_bits(), os.environ.get('NUMBA_CPU_FEATURES', '')[-20:])")


def _host_has_avx512f() -> bool:
    import llvmlite.binding as llvm

    return bool(llvm.get_host_cpu_features().get("avx512f"))


def _probe(env_extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(not _host_has_avx512f(), reason="the host has no AVX-512")
def test_kernels_use_512_bit_vectors_on_avx512_hosts():
    width, tail = _probe({})
    assert width == "512" and tail.endswith("-prefer-256-bit")


def test_a_user_chosen_feature_string_wins():
    import llvmlite.binding as llvm

    mine = llvm.get_host_cpu_features().flatten()  # the host's own features, LLVM's default 256-bit tuning
    width, *_ = _probe({"NUMBA_CPU_FEATURES": mine})
    assert width in ("256", "128")
