"""Ops over empty axes, as torch gives them: matmul and the fused GELU ops with a last dim of 0 (NumPy's
reshape(-1, 0) is ambiguous), embedding's backward at width 0, and attention with no queries, keys, batch
or value width at bfloat16 precision (the slice path refuses empty arrays and its error blamed bf16 support).

On d674c72 (`python -m pytest -q tests/test_empty_axes_hunt.py` from a worktree of it, with an absolute
PYTHONPATH) 11 of 15 fail ("cannot reshape array of size 0", or "bfloat16 operands need the slice path").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
import tensorarena.nn.functional as F
from tensorarena.kernels import gemm_bf16


def _ones(shape):
    return ta.tensor(np.ones(shape, np.float32), requires_grad=True)


def _torch_ones(shape):
    return torch.ones(shape, requires_grad=True)


@pytest.mark.parametrize("sa, sb", [((2, 3, 0), (0, 4)), ((2, 3, 4), (4, 0)), ((2, 3, 0), (0,))])
def test_matmul_with_an_empty_inner_or_outer_dim(sa, sb):
    a, b = _ones(sa), _ones(sb)
    ta_, tb = _torch_ones(sa), _torch_ones(sb)
    out, want = ta.matmul(a, b), torch.matmul(ta_, tb)
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    out.sum().backward()
    want.sum().backward()
    np.testing.assert_array_equal(a.grad, ta_.grad.numpy())
    np.testing.assert_array_equal(b.grad, tb.grad.numpy())


def test_bias_gelu_of_zero_features():
    x, b = _ones((4, 0)), _ones((0,))
    out = F.bias_gelu(x, b)
    assert out.shape == (4, 0)
    out.sum().backward()
    assert x.grad.shape == (4, 0) and b.grad.shape == (0,)


def test_bias_gelu_linear_of_zero_features_is_its_output_bias():
    # No inputs to the product: out is the bias alone (torch: gelu of an empty vector, then linear).
    x, b, w, ob = _ones((4, 0)), _ones((0,)), _ones((3, 0)), _ones((3,))
    out = F.bias_gelu_linear(x, b, w, ob)
    want = torch.nn.functional.linear(torch.nn.functional.gelu(torch.ones(4, 0)), torch.ones(3, 0), torch.ones(3))
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    out.sum().backward()
    np.testing.assert_array_equal(ob.grad, np.full(3, 4.0, np.float32))
    assert w.grad.shape == (3, 0)


def test_embedding_of_width_zero_trains():
    weight = _ones((5, 0))
    out = F.embedding(ta.tensor(np.array([1, 2])), weight)
    assert out.shape == (2, 0)
    out.sum().backward()
    assert weight.grad.shape == (5, 0)


ATTENTION_CASES = {"no queries": ((1, 1, 0, 4), (1, 1, 4, 4), 4), "no keys": ((1, 1, 4, 4), (1, 1, 0, 4), 4),
                   "no batch": ((0, 2, 4, 4), (0, 2, 4, 4), 4), "value width 0": ((1, 2, 3, 4), (1, 2, 5, 4), 0)}


@pytest.mark.parametrize("precision", ["highest", "bfloat16"])
@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention_over_an_empty_axis_matches_torch(case, precision):
    if precision == "bfloat16" and not gemm_bf16.in_kernels():
        pytest.skip("bfloat16 attention does not run here")
    qs, ks, hv = ATTENTION_CASES[case]
    rng = np.random.default_rng(0)
    q_, k_ = rng.standard_normal(qs).astype(np.float32), rng.standard_normal(ks).astype(np.float32)
    v_ = rng.standard_normal(ks[:3] + (hv,)).astype(np.float32)
    q, k, v = (ta.tensor(a, requires_grad=True) for a in (q_, k_, v_))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q_, k_, v_))
    with ta.float32_matmul_precision(precision):
        out = F.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    want.sum().backward()
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())  # empty, or the zeros of no keys
    for ours, theirs in ((q, tq), (k, tk), (v, tv)):
        np.testing.assert_array_equal(ours.grad, theirs.grad.numpy())  # all empty or zero: no gradient flows


def test_packed_attention_of_an_empty_batch_at_bfloat16():
    if not gemm_bf16.in_kernels():
        pytest.skip("bfloat16 attention does not run here")
    qkv = _ones((0, 5, 12))
    with ta.float32_matmul_precision("bfloat16"):
        out = F.packed_self_attention(qkv, 2)
        out.sum().backward()
    assert out.shape == (0, 5, 4) and qkv.grad.shape == (0, 5, 12)
