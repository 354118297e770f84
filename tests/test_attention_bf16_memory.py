"""bfloat16 attention keeps no memory from call to call (kernels/attention_heads.py's module docstring).

Its slice kernels called MKL's cblas_gemm_bf16bf16f32 from inside their libgomp parallel loop, and each such call
kept ~100 bytes of the process's memory for good (a helper's bisection: the same GEMM from Python, cblas_sgemm in
the loop, or the loop on Numba's tbb layer kept none): five bf16 evaluate() calls of ViT-Tiny grew RSS 278.6 ->
302.9 MiB. The kernels multiply the bfloat16 values widened to float32 now (exact products, float32 sums).

On 745266e (before the fix) this test fails (anonymous memory grew 3.0 MiB over the 1200 calls; here < 0.5):
    git worktree add /tmp/wt 745266e && cp tests/test_attention_bf16_memory.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_attention_bf16_memory.py)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tensorarena.kernels import attention_heads, gemm_bf16

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LOOP = textwrap.dedent("""
    import numpy as np
    from tensorarena.kernels import attention_heads as heads, gemm_bf16

    def anonymous_mib():
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Anonymous:")) / 1024

    def bf16(x):
        out = np.empty(x.shape, np.uint16)
        gemm_bf16.to_bfloat16_fused(x, out)
        return out

    B, H, T, HS = 8, 3, 5, 64  # 24 slices a call, 2 products each
    rng = np.random.default_rng(0)
    q, k, v = (bf16(rng.standard_normal((B, H, T, HS)).astype(np.float32)) for _ in range(3))
    out, probs = np.empty((B, H, T, HS), np.float32), np.empty((B, H, T, T), np.float32)
    mask = np.zeros((1, T), np.bool_)
    assert heads.usable(q, k, v, out, probs)

    def calls(n):
        for _ in range(n):
            heads.attention_forward_slices(q, k, v, mask, False, False, 0.125, out, probs, None)

    calls(300)  # compiled or loaded, pools started
    start = anonymous_mib()
    calls(1200)
    print(anonymous_mib() - start)
""")


@pytest.mark.skipif(not gemm_bf16.in_kernels(), reason="no bfloat16 products here (MKL's bf16 GEMM not found)")
def test_bf16_attention_keeps_no_memory_from_call_to_call():
    assert attention_heads.usable  # the slice path this test drives
    done = subprocess.run([sys.executable, "-c", _LOOP], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    grown = float(done.stdout.split()[-1])
    assert grown < 0.5, f"1200 bf16 attention calls kept {grown:.2f} MiB of anonymous memory"
