"""Precision and kernel edges found by a hunt on 2026-12-06. Run against the commit before the one that added this
file (a worktree of it first on PYTHONPATH), every test failed but the controls said in them:
- bfloat16 products were taken by strides and dims: a transposed view's batched product, a vector times a matrix
  and a matrix times a batch stayed float32 without a word (README: only two batched operands stay float32);
- attention with heads of size 0 and the default scale was a bare ZeroDivisionError;
- a mistyped TENSORARENA_KERNELS was silently the fused kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import kernels
from tensorarena.kernels import gemm_bf16 as K
from tensorarena.nn import functional as F

from reference import torch_bf16

needs_bf16_gemm = pytest.mark.skipif(not K.available(), reason=f"no fast bfloat16 GEMM: {K.why_not()}")


def _bf16_products_run() -> int:
    return kernels.calls[("gemm_bf16", "fused")] + kernels.calls[("gemm_bf16", "reference")]


def _strided(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    return np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)  # the same values, not C-contiguous


LAYOUTS = {"batch @ matrix, strided": (lambda r: _strided((2, 7, 33), r), (33, 5)), "vector @ matrix": ((33,), (33, 5)),
           "matrix @ vector": ((7, 33), (33,)), "matrix @ batch": ((7, 33), (2, 33, 5)),
           "batch @ vector": ((2, 7, 33), (33,)), "vector @ batch": ((33,), (2, 33, 5))}


@needs_bf16_gemm
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bfloat16_reaches_every_product_with_a_matrix_whatever_the_strides(layout):
    rng = np.random.default_rng(0)
    a, b = (s(rng) if callable(s) else rng.standard_normal(s).astype(np.float32) for s in LAYOUTS[layout])
    before = _bf16_products_run()
    with ta.float32_matmul_precision("bfloat16"):
        out = (ta.tensor(a) @ ta.tensor(b)).numpy()
    assert _bf16_products_run() > before
    reference = torch_bf16(a) @ torch_bf16(b)  # operands rounded as torch rounds them, multiplied in float64
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)


@needs_bf16_gemm
def test_two_batched_operands_stay_float32_as_documented():  # control: held before
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 7, 33)).astype(np.float32), rng.standard_normal((2, 33, 5)).astype(np.float32)
    before = _bf16_products_run()
    with ta.float32_matmul_precision("bfloat16"):
        out = (ta.tensor(a) @ ta.tensor(b)).numpy()
    assert _bf16_products_run() == before
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_attention_with_heads_of_size_zero_needs_a_scale():
    q = ta.tensor(np.zeros((1, 2, 3, 0), np.float32))
    v = np.random.default_rng(2).standard_normal((1, 2, 3, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="head size of 0.*pass scale="):
        F.scaled_dot_product_attention(q, q, ta.tensor(v))
    with pytest.raises(ValueError, match="heads of size 0.*pass scale="):
        F.packed_self_attention(ta.tensor(np.zeros((1, 3, 0), np.float32)), 1)
    out = F.scaled_dot_product_attention(q, q, ta.tensor(v), scale=1.0).numpy()  # all scores 0: v's mean
    ref = torch.nn.functional.scaled_dot_product_attention(torch.zeros(1, 2, 3, 0), torch.zeros(1, 2, 3, 0),
                                                           torch.from_numpy(v), scale=1.0)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-6, atol=1e-6)


def test_a_mistyped_tensorarena_kernels_is_an_error():
    env = dict(os.environ, TENSORARENA_KERNELS="refrence")
    done = subprocess.run([sys.executable, "-c", "import tensorarena"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode != 0 and "TENSORARENA_KERNELS must be 'reference'" in done.stderr
