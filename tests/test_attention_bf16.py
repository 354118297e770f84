"""Attention's products at float32_matmul_precision("bfloat16"): the kernels' twins, the ops, the routes.

The ops round q, k, v (and in backward the incoming gradient g) to bfloat16 once; the kernels round
the probabilities P (or D = dropout(P)) before D v and D^T g, and dS before dS k and dS^T q, and every
product sums in float32. The reference is that recipe in float64 (rounding by torch's
Tensor.bfloat16()). Where the recipe rounds a value the kernel computed itself (P, dS), an ulp of
float32 difference can move a bfloat16 rounding by one step, so the ops tests do not ask for exact
agreement: they ask that our result be much nearer the full recipe than the recipe with any one
rounding left out. That fails if the kernels skip any of them. (Checked once: with the reference
twin's rounding of D before D v, or of dS, taken out, the twin and recipe tests fail.)
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import kernels
from tensorarena.kernels import attention, gemm_bf16 as K
from tensorarena.kernels.dropout import keep_threshold
from tensorarena.ops import _products
from tensorarena.ops.attention import packed_self_attention, scaled_dot_product_attention

from reference import torch_bf16 as _bf16, torch_bf16_bits as _bits

needs_bf16_gemm = pytest.mark.skipif(not K.available(), reason=f"no fast bfloat16 GEMM: {K.why_not()}")
needs_bf16_in_kernels = pytest.mark.skipif(not K.in_kernels(), reason="Numba kernels cannot call MKL's bf16 GEMM")
ROUNDINGS = ("qkv", "P", "g", "dS")


def _needs_slice_path() -> None:
    if kernels.choose("batched_gemm") != "fused":  # TENSORARENA_KERNELS=reference: the slice path is off
        pytest.skip("the slice path is off: MKL's batched GEMMs are not the kernels in use")


# -- the kernels' twins ------------------------------------------------------------------------------

def _kernel_case(b=2, h=3, t=21, hs=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, t, 3, h, hs)).astype(np.float32)  # packed, as ops.packed_self_attention's
    q, k, v = (_bits(x)[:, :, j].transpose(0, 2, 1, 3) for j in range(3))  # strided bfloat16 views
    g = _bits(rng.standard_normal((b, h, t, hs)))
    pad = rng.random((b, t)) < 0.3
    pad[:, 0] = False
    return q, k, v, g, pad


def _run_kernels(impl, q, k, v, g, pad, causal, dropout):
    b, h, t, hs = q.shape
    out, probs = np.empty((b, h, t, hs), np.float32), np.empty((b, h, t, t), np.float32)
    kernels.kernel("attention_forward", impl)(q, k, v, pad, causal, None, out, probs, dropout)
    grads = [np.empty((b, h, t, hs), np.float32) for _ in range(3)]
    kernels.kernel("attention_backward", impl)(q, k, v, probs, g, None, *grads, dropout)
    return [out, probs, *grads]


@needs_bf16_in_kernels
@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("drop", [False, True])
def test_slice_kernels_match_the_reference_twin_with_bfloat16_operands(masks, drop):
    q, k, v, g, pad = _kernel_case()
    _needs_slice_path()
    dropout = (12345, keep_threshold(0.25), np.float32(1 / 0.75)) if drop else None
    pad = pad if masks else None
    before = kernels.calls[("attention_bf16", "fused")]
    fused = _run_kernels("fused", q, k, v, g, pad, masks, dropout)
    assert kernels.calls[("attention_bf16", "fused")] - before == 2  # forward and backward, on the slices
    reference = _run_kernels("reference", q, k, v, g, pad, masks, dropout)
    for name, a, r in zip(("out", "probs", "dq", "dk", "dv"), fused, reference):
        # Both twins round P and dS; the last float32 bits of P may differ between them (float32 exp
        # against float64 exp), so a bfloat16 rounding may land one step apart: a few 1e-6 here.
        np.testing.assert_allclose(a, r, rtol=0, atol=2e-5 * max(1.0, float(np.abs(r).max())), err_msg=name)


@needs_bf16_in_kernels
def test_slice_kernels_match_the_reference_twin_for_cross_attention_shapes():
    # T != S and hs != hv, separate (not packed) operands, a padding mask and dropout: the layouts
    # kernels.attention_heads' descriptors must get right for bfloat16 operands too.
    _needs_slice_path()
    rng = np.random.default_rng(4)
    b, h, t, s, hs, hv = 3, 2, 5, 12, 4, 6
    q, k, v = _bits(rng.standard_normal((b, h, t, hs))), _bits(rng.standard_normal((b, h, s, hs))), \
        _bits(rng.standard_normal((b, h, s, hv)))
    g = _bits(rng.standard_normal((b, h, t, hv)))
    pad = rng.random((b, s)) < 0.3
    pad[:, 0] = False
    dropout = (777, keep_threshold(0.2), np.float32(1 / 0.8))
    results = {}
    for impl in ("fused", "reference"):
        out, probs = np.empty((b, h, t, hv), np.float32), np.empty((b, h, t, s), np.float32)
        kernels.kernel("attention_forward", impl)(q, k, v, pad, False, None, out, probs, dropout)
        dq, dk, dv = np.empty((b, h, t, hs), np.float32), np.empty((b, h, s, hs), np.float32), \
            np.empty((b, h, s, hv), np.float32)
        kernels.kernel("attention_backward", impl)(q, k, v, probs, g, None, dq, dk, dv, dropout)
        results[impl] = (out, probs, dq, dk, dv)
    for name, a, r in zip(("out", "probs", "dq", "dk", "dv"), results["fused"], results["reference"]):
        np.testing.assert_allclose(a, r, rtol=0, atol=2e-5 * max(1.0, float(np.abs(r).max())), err_msg=name)


def test_mixed_float32_and_bfloat16_operands_are_refused_with_their_dtypes():
    q, k, v, g, pad = _kernel_case()
    out, probs = np.empty(q.shape, np.float32), np.empty(q.shape[:3] + (q.shape[2],), np.float32)
    for impl in ("reference", "fused"):
        with pytest.raises(TypeError, match="uint16.*float32"):
            kernels.kernel("attention_forward", impl)(q, K.widen(k), v, None, False, None, out, probs)


def test_the_batched_path_refuses_bfloat16_operands_it_cannot_multiply(monkeypatch):
    q, k, v, g, pad = _kernel_case()
    monkeypatch.setattr(attention.slices, "usable", lambda *arrays: False)  # as without MKL in Numba
    out, probs = np.empty(q.shape, np.float32), np.empty(q.shape[:3] + (q.shape[2],), np.float32)
    with pytest.raises(RuntimeError, match="bfloat16 operands need the slice path"):
        attention.attention_forward_fused(q, k, v, None, False, None, out, probs)


@pytest.mark.parametrize("shape", [(5,), (4, 7), (3, 4, 5), (2, 3, 4, 6)])
def test_rounding_takes_attention_heads_as_strided_views(shape):
    x = np.random.default_rng(3).standard_normal(shape + (2,)).astype(np.float32)[..., 0]  # every stride odd
    if x.ndim == 4:
        x = x.transpose(0, 2, 1, 3)  # heads of a packed projection: (B, H, T, hs)
    for twin in (K.to_bfloat16_fused, K.to_bfloat16_reference):
        np.testing.assert_array_equal(twin(x, np.empty(x.shape, np.uint16)), _bits(x))


# -- the ops against the recipe ----------------------------------------------------------------------

def _recipe(q, k, v, g, probs, scale, mask, leave_out=None):
    """out, dq, dk, dv in float64 by the bfloat16 recipe, with one rounding (ROUNDINGS) left out if asked.

    P is given: the float64 softmax of the rounded q k^T, rounded to float32 (ours may differ from it in
    the last bit); dS is the recipe's own from it.
    """
    def r(x, what):
        return np.asarray(x, np.float64) if leave_out == what else _bf16(x)
    q, k, v, g = r(q, "qkv"), r(k, "qkv"), r(v, "qkv"), r(g, "g")
    p = probs.astype(np.float64)
    pr = r(probs, "P")
    out = pr @ v
    dv = pr.swapaxes(-1, -2) @ g
    dp = g @ v.swapaxes(-1, -2)
    ds = scale * p * (dp - (p * dp).sum(-1, keepdims=True))
    ds = r(ds.astype(np.float32), "dS")
    return {"out": out, "dq": ds @ k, "dk": ds.swapaxes(-1, -2) @ q, "dv": dv}


def _softmax64(q, k, scale, mask):
    s = _bf16(q) @ _bf16(k).swapaxes(-1, -2) * scale
    s = np.where(mask, -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _assert_the_recipe_ran(ours: dict, q, k, v, g, probs, scale, mask):
    full = _recipe(q, k, v, g, probs, scale, mask)
    # With P given, rounding q, k, v reaches dv only through P: not counted there.
    affects = {"qkv": ("out", "dq", "dk"), "P": ("out", "dv"), "g": ("dq", "dk", "dv"), "dS": ("dq", "dk")}
    for name, want in full.items():
        err = np.abs(ours[name] - want).max() / np.abs(want).max()
        assert err < 1e-3, (name, err)  # float32 sums, and the odd bfloat16 rounding one step apart
        for left_out in ROUNDINGS:
            if name in affects[left_out]:
                other = np.abs(ours[name] - _recipe(q, k, v, g, probs, scale, mask, left_out)[name]).max()
                assert np.abs(ours[name] - want).max() < 0.2 * other, (name, "without rounding", left_out)


@needs_bf16_gemm
@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_packed_self_attention_rounds_every_product_operand(impl):
    if impl == "fused" and not K.in_kernels():
        pytest.skip("Numba kernels cannot call MKL's bf16 GEMM")
    rng = np.random.default_rng(5)
    B, T, H, hs = 2, 19, 3, 16
    x = rng.standard_normal((B, T, 3 * H * hs)).astype(np.float32)
    g = rng.standard_normal((B, T, H * hs)).astype(np.float32)
    before = kernels.calls[("attention_bf16", impl)]
    xt = ta.tensor(x, requires_grad=True)
    with kernels.using(impl), ta.float32_matmul_precision("bfloat16"):
        y = packed_self_attention(xt, H)
        (y * ta.tensor(g)).sum().backward()
    assert kernels.calls[("attention_bf16", impl)] - before == 2
    heads = x.reshape(B, T, 3, H, hs).transpose(2, 0, 3, 1, 4)
    q, k, v = heads[0], heads[1], heads[2]
    gh = g.reshape(B, T, H, hs).transpose(0, 2, 1, 3)
    scale = 1 / np.sqrt(hs)
    no_mask = np.zeros((1, 1, 1, T), bool)
    probs = _softmax64(q, k, scale, no_mask).astype(np.float32)  # within 1e-7 of ours (out checks it)
    dqkv = xt.grad.reshape(B, T, 3, H, hs).transpose(2, 0, 3, 1, 4)
    ours = {"out": y.data.reshape(B, T, H, hs).transpose(0, 2, 1, 3), "dq": dqkv[0], "dk": dqkv[1], "dv": dqkv[2]}
    _assert_the_recipe_ran(ours, q, k, v, gh, probs, scale, no_mask)


@needs_bf16_gemm
def test_scaled_dot_product_attention_with_masks_and_strided_queries_rounds_too():
    rng = np.random.default_rng(6)
    B, H, T, hs = 2, 2, 15, 8
    qkv = rng.standard_normal((B, T, 3 * H * hs)).astype(np.float32)
    pad = rng.random((B, T)) < 0.3
    pad[:, 0] = False
    g = rng.standard_normal((B, H, T, hs)).astype(np.float32)
    t = ta.tensor(qkv, requires_grad=True)
    C = H * hs  # q, k, v as the [CLS]-only ViT block takes them: permuted views of one projection
    q, k, v = (t[:, :, i * C:(i + 1) * C].reshape(B, T, H, hs).permute(0, 2, 1, 3) for i in range(3))
    with ta.float32_matmul_precision("bfloat16"):
        y = scaled_dot_product_attention(q, k, v, key_padding_mask=pad, causal=True)
        (y * ta.tensor(g)).sum().backward()
    qn, kn, vn = (qkv[:, :, i * C:(i + 1) * C].reshape(B, T, H, hs).transpose(0, 2, 1, 3) for i in range(3))
    mask = pad[:, None, None, :] | np.triu(np.ones((T, T), bool), k=1)
    scale = 1 / np.sqrt(hs)
    probs = _softmax64(qn, kn, scale, mask).astype(np.float32)
    grad = t.grad.reshape(B, T, 3, H, hs).transpose(2, 0, 3, 1, 4)
    _assert_the_recipe_ran({"out": y.data, "dq": grad[0], "dk": grad[1], "dv": grad[2]}, qn, kn, vn, g, probs,
                           scale, mask)


@needs_bf16_gemm
def test_float32_precision_and_float64_leave_attention_unrounded():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 9, 24)).astype(np.float32)
    before = sum(n for (name, _), n in kernels.calls.items() if name == "attention_bf16")
    y32 = packed_self_attention(ta.tensor(x), 2).data
    with ta.float32_matmul_precision("bfloat16"):
        y64 = packed_self_attention(ta.tensor(x.astype(np.float64)), 2).data
        y16 = packed_self_attention(ta.tensor(x), 2).data
    assert sum(n for (name, _), n in kernels.calls.items() if name == "attention_bf16") - before == 1  # y16 only
    np.testing.assert_allclose(y64, y32, rtol=0, atol=1e-5)
    assert np.abs(y16 - y32).max() > 1e-3  # the bfloat16 run did round


def test_without_bf16_gemms_in_kernels_attention_stays_float32_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(K, "available", lambda: True)  # linear products could run bfloat16 ...
    monkeypatch.setattr(K, "in_kernels", lambda: False)  # ... but attention's Numba kernels cannot
    monkeypatch.setattr(_products, "_warned_attention", False)
    x = np.random.default_rng(8).standard_normal((2, 9, 24)).astype(np.float32)
    skipped = ("attention_bf16", "skipped: float32 instead")
    before = kernels.calls[skipped]
    with caplog.at_level(logging.WARNING, logger="tensorarena"), kernels.using("fused"), \
            ta.float32_matmul_precision("bfloat16"):
        y = packed_self_attention(ta.tensor(x), 2).data
    assert kernels.calls[skipped] - before == 1
    assert "attention's products stay float32" in caplog.text
    np.testing.assert_allclose(y, packed_self_attention(ta.tensor(x), 2).data, rtol=0, atol=1e-6)
