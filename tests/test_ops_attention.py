"""scaled_dot_product_attention and bias_gelu against torch, under both kernel implementations.

Every comparison runs twice: on the fused (Numba) kernels and with the reference (NumPy) twins
forced, so neither route can drift from torch unnoticed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorarena as ta
from tensorarena import kernels
from tensorarena.ops import bias_gelu, bias_gelu_linear, packed_self_attention, scaled_dot_product_attention
from tests.reference import check_finite_differences, check_op, randn

DTYPES = [np.float64, np.float32]
# float64 as tests/reference.py; float32 to 1e-5 (both sides accumulate in float32 BLAS).
TOL = {np.float64: {}, np.float32: dict(rtol=1e-5, atol=1e-5)}


@pytest.fixture(params=["fused", "reference"])
def impl(request):
    """Run the test on the fused kernels, then on the forced reference twins; restore the choice."""
    with kernels.using(request.param):
        yield request.param


def _torch_mask(b: int, t: int, s: int, pad: np.ndarray | None, causal: bool) -> torch.Tensor | None:
    """torch's boolean attn_mask (True = attend), (B, 1, T, S), for our key padding + causal."""
    if pad is None and not causal:
        return None
    keep = np.ones((b, 1, t, s), bool)
    if pad is not None:
        keep &= ~pad[:, None, None, :]
    if causal:
        keep &= np.tril(np.ones((t, s), bool))  # top-left aligned, as torch's is_causal
    return torch.from_numpy(keep)


# (B, H, T, S, hs, hv, padded keys per batch element or None, causal, scale)
CASES = {
    "plain": (2, 3, 5, 5, 4, 4, None, False, None),
    "T!=S, hv!=hs": (2, 2, 3, 7, 4, 6, None, False, None),
    "key padding": (3, 2, 4, 6, 5, 5, [[4, 5], [], [1, 2, 3]], False, None),
    "causal": (2, 2, 6, 6, 4, 4, None, True, None),
    "causal + padding": (2, 3, 5, 5, 4, 3, [[3, 4], [4]], True, None),
    "causal T<S": (1, 2, 3, 5, 4, 4, None, True, None),
    "custom scale": (2, 2, 4, 5, 3, 3, [[0], []], False, 0.3),
}


def _case(name: str, seed: int = 0):
    b, h, t, s, hs, hv, padded, causal, scale = CASES[name]
    arrays = [randn(seed, (b, h, t, hs)), randn(seed + 1, (b, h, s, hs)), randn(seed + 2, (b, h, s, hv))]
    pad = None
    if padded is not None:
        pad = np.zeros((b, s), bool)
        for i, cols in enumerate(padded):
            pad[i, cols] = True
    return arrays, pad, causal, scale, _torch_mask(b, t, s, pad, causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_torch(name, dtype, impl):
    arrays, pad, causal, scale, mask = _case(name)
    before = kernels.calls[("attention_backward", impl)]
    check_op(lambda q, k, v: scaled_dot_product_attention(q, k, v, key_padding_mask=pad, causal=causal, scale=scale),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale),
             arrays, dtype=dtype, **TOL[dtype])
    assert kernels.calls[("attention_backward", impl)] == before + 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_is_causal_matches_torch_is_causal(dtype, impl):
    arrays, _, _, _, _ = _case("causal", seed=3)
    check_op(lambda q, k, v: scaled_dot_product_attention(q, k, v, causal=True),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), arrays, dtype=dtype,
             **TOL[dtype])


@pytest.mark.parametrize("name", ["key padding", "causal + padding", "custom scale"])
def test_attention_gradients_match_finite_differences(name, impl):
    b, h, t, s, hs, hv = 1, 2, 2, 3, 2, 2  # tiny: 3 * 12 inputs, two forward passes each
    pad = np.array([[False, False, True]]) if name != "custom scale" else None
    causal = name == "causal + padding"
    scale = 0.7 if name == "custom scale" else None
    check_finite_differences(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, key_padding_mask=pad, causal=causal, scale=scale),
        [randn(1, (b, h, t, hs)), randn(2, (b, h, s, hs)), randn(3, (b, h, s, hv))])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_give_zeros_and_zero_gradients(dtype, impl):
    b, h, t, s, hs = 2, 2, 3, 4, 5
    q, k, v = (ta.tensor(randn(i, (b, h, n, hs)), dtype=dtype, requires_grad=True) for i, n in enumerate((t, s, s)))
    pad = np.zeros((b, s), bool)
    pad[1] = True  # batch element 1: every key is padding
    pad[0, 0] = True  # with causal, query 0 of batch element 0 sees only key 0: padded too
    out = scaled_dot_product_attention(q, k, v, key_padding_mask=pad, causal=True)
    y = out.numpy()
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(y[1], 0.0)
    np.testing.assert_array_equal(y[0, :, 0], 0.0)
    assert np.abs(y[0, :, 1:]).min() > 0  # the other rows attend to something
    (out * ta.tensor(randn(9, out.shape), dtype=dtype)).sum().backward()
    for grad in (q.grad, k.grad, v.grad):
        assert np.isfinite(grad).all()
        np.testing.assert_array_equal(grad[1], 0.0)
    np.testing.assert_array_equal(q.grad[0, :, 0], 0.0)
    np.testing.assert_array_equal(k.grad[0, :, 0], 0.0)  # a padded key gets no gradient
    np.testing.assert_array_equal(v.grad[0, :, 0], 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_on_strided_head_views_and_mixed_precision(dtype, impl):
    # The usual caller splits heads with a permute: (B, T, H, hs) -> (B, H, T, hs), not contiguous.
    b, t, nh, hs = 2, 5, 3, 4
    arrays = [randn(i, (b, t, nh, hs)) for i in range(3)]
    pad = np.zeros((b, t), bool)
    pad[0, 3:] = True
    mask = _torch_mask(b, t, t, pad, False)
    check_op(lambda q, k, v: scaled_dot_product_attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3),
                                                          v.permute(0, 2, 1, 3), key_padding_mask=pad),
             lambda q, k, v: F.scaled_dot_product_attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3),
                                                            v.permute(0, 2, 1, 3), attn_mask=mask),
             arrays, dtype=dtype, **TOL[dtype])
    q32 = ta.tensor(arrays[0].transpose(0, 2, 1, 3), dtype=np.float32, requires_grad=True)
    k64, v64 = (ta.tensor(a.transpose(0, 2, 1, 3), dtype=np.float64, requires_grad=True) for a in arrays[1:])
    out = scaled_dot_product_attention(q32, k64, v64)
    assert out.dtype == np.float64  # promoted, as in torch
    out.sum().backward()
    assert q32.grad.dtype == np.float32 and k64.grad.dtype == np.float64


# -- packed_self_attention: heads read straight from a (B, T, 3D) projection ---------------------

def _torch_packed(qkv, heads, mask=None, causal=False):
    b, t, three_d = qkv.shape
    q, k, v = (x.reshape(b, t, heads, three_d // 3 // heads).transpose(1, 2) for x in qkv.split(three_d // 3, -1))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return y.transpose(1, 2).reshape(b, t, three_d // 3)


PACKED = {  # B, T, heads, hs, padded keys per batch element or None, causal
    "plain": (2, 5, 3, 4, None, False),
    "padding": (3, 6, 2, 5, [[4, 5], [], [1, 2, 3]], False),
    "causal": (2, 7, 2, 3, None, True),
    "one head": (1, 4, 1, 6, None, False),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(PACKED))
def test_packed_self_attention_matches_torch(name, dtype, impl):
    b, t, heads, hs, padded, causal = PACKED[name]
    pad = None
    if padded is not None:
        pad = np.zeros((b, t), bool)
        for i, cols in enumerate(padded):
            pad[i, cols] = True
    mask = _torch_mask(b, t, t, pad, False)
    before = kernels.calls[("attention_backward", impl)]
    check_op(lambda qkv: packed_self_attention(qkv, heads, key_padding_mask=pad, causal=causal),
             lambda qkv: _torch_packed(qkv, heads, mask, causal), [randn(7, (b, t, 3 * heads * hs))],
             dtype=dtype, **TOL[dtype])
    assert kernels.calls[("attention_backward", impl)] == before + 1  # the route the test meant ran


def test_packed_self_attention_equals_split_heads_and_finite_differences(impl):
    b, t, heads, hs = 2, 4, 2, 3
    x = randn(3, (b, t, 3 * heads * hs))
    pad = np.array([[False, False, True, True], [False] * 4])

    def split(qkv):
        parts = qkv.reshape(b, t, 3, heads, hs).permute(2, 0, 3, 1, 4)
        y = scaled_dot_product_attention(parts[0], parts[1], parts[2], key_padding_mask=pad)
        return y.transpose(1, 2).reshape(b, t, heads * hs)

    ours = [ta.tensor(x, dtype=np.float64, requires_grad=True) for _ in range(2)]
    outs = [packed_self_attention(ours[0], heads, key_padding_mask=pad), split(ours[1])]
    np.testing.assert_allclose(outs[0].numpy(), outs[1].numpy(), rtol=1e-12, atol=1e-13)
    for o in outs:
        o.sum().backward()
    np.testing.assert_allclose(ours[0].grad, ours[1].grad, rtol=1e-12, atol=1e-13)
    check_finite_differences(lambda qkv: packed_self_attention(qkv, heads, key_padding_mask=pad), [x])


def test_packed_self_attention_errors_name_the_shape():
    with pytest.raises(ValueError, match=r"\(B, T, 3 \* D\).*num_heads=2.*\(2, 3, 10\)"):
        packed_self_attention(ta.tensor(np.zeros((2, 3, 10))), 2)
    with pytest.raises(ValueError, match=r"\(B, T, 3 \* D\)"):
        packed_self_attention(ta.tensor(np.zeros((3, 12))), 2)


def test_attention_outputs_come_from_the_arena_and_leaf_grads_outlive_it():
    q, k, v = (ta.tensor(randn(i, (1, 2, 3, 4)), requires_grad=True) for i in range(3))
    with ta.Arena() as arena:
        out = scaled_dot_product_attention(q, k, v, causal=True)
        after_forward = arena.stats.allocations
        assert after_forward >= 2  # the output and the saved probabilities
        out.sum().backward()
        assert arena.stats.allocations > after_forward
    with pytest.raises(ta.StaleTensorError):
        out.data
    assert all(t.grad is not None and np.isfinite(t.grad).all() for t in (q, k, v))


def test_attention_errors_say_what_is_expected():
    q = ta.tensor(np.zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match=r"\(B, H, T, hs\)"):
        scaled_dot_product_attention(ta.tensor(np.zeros((2, 3, 4))), q, q)
    with pytest.raises(ValueError, match="disagree"):
        scaled_dot_product_attention(q, ta.tensor(np.zeros((1, 2, 3, 5))), q)
    with pytest.raises(TypeError, match="must be bool"):
        scaled_dot_product_attention(q, q, q, key_padding_mask=np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"must be \(B, S\)"):
        scaled_dot_product_attention(q, q, q, key_padding_mask=np.zeros((1, 4), bool))


# -- bias_gelu ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (5, 1), (6,)], ids=["3d", "D=1", "1d"])
def test_bias_gelu_matches_torch(shape, approximate, dtype, impl):
    before = kernels.calls[("bias_gelu_forward", impl)]
    check_op(lambda x, b: bias_gelu(x, b, approximate=approximate),
             lambda x, b: F.gelu(x + b, approximate=approximate),
             [2.0 * randn(0, shape), randn(1, shape[-1:])], dtype=dtype, **TOL[dtype])
    assert kernels.calls[("bias_gelu_forward", impl)] == before + 1


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_finite_differences_and_strided_input(approximate, impl):
    check_finite_differences(lambda x, b: bias_gelu(x, b, approximate), [randn(0, (2, 3)), randn(1, (3,))])
    x = randn(2, (4, 3, 5))
    check_op(lambda x, b: bias_gelu(x.transpose(0, 2), b, approximate),
             lambda x, b: F.gelu(x.transpose(0, 2) + b, approximate=approximate), [x, randn(3, (4,))])


def test_bias_gelu_at_huge_inputs_takes_the_limits(impl):
    # gelu' is exactly 0 / 1 out here; the op must neither overflow nor return nan.
    for form in ("none", "tanh"):
        x = ta.tensor(np.array([[-1e200, 1e200], [-50.0, 50.0]]), dtype=np.float64, requires_grad=True)
        b = ta.tensor(np.zeros(2), dtype=np.float64, requires_grad=True)
        bias_gelu(x, b, form).sum().backward()
        np.testing.assert_array_equal(x.grad, [[0.0, 1.0], [0.0, 1.0]])
        np.testing.assert_array_equal(b.grad, [0.0, 2.0])


def test_bias_gelu_writes_the_bias_grad_straight_into_its_buffer(monkeypatch):
    direct = {}
    accumulate = ta.Tensor._accumulate_leaf_grad

    def spy(self, g):
        direct[id(self)] = g is self._grad_buffer  # the kernel wrote the persistent buffer itself
        accumulate(self, g)

    monkeypatch.setattr(ta.Tensor, "_accumulate_leaf_grad", spy)
    x = ta.tensor(randn(0, (4, 3)), dtype=np.float32, requires_grad=True)
    b = ta.tensor(randn(1, (3,)), dtype=np.float32, requires_grad=True)
    with ta.Arena():
        bias_gelu(x, b).sum().backward()
    assert direct[id(b)]
    assert b.grad.dtype == np.float32 and x.grad.shape == (4, 3)


def test_bias_gelu_errors():
    x = ta.tensor(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"bias shape \(2,\)"):
        bias_gelu(x, ta.tensor(np.zeros(2)))
    with pytest.raises(ValueError, match="'none' or 'tanh'"):
        bias_gelu(x, ta.tensor(np.zeros(3)), approximate="fast")


# -- bias_gelu_linear: GELU + second MLP layer; backward from the kept derivative, or recomputed --------

@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recompute"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("out_bias", [True, False], ids=["out_bias", "no_out_bias"])
def test_bias_gelu_linear_matches_torch(out_bias, approximate, dtype, recompute, impl):
    arrays = [randn(1, (2, 5, 8)), randn(2, (8,)), randn(3, (3, 8))] + ([randn(4, (3,))] if out_bias else [])
    names = ["gelu_forward", "bias_gelu_backward", "bias_gelu_backward_recompute", "bias_gelu_forward",
             "bias_gelu_forward_with_grad", "bias_gelu_backward_stored"]
    before = [kernels.calls[(name, impl)] for name in names]
    check_op(lambda x, b, w, *ob: bias_gelu_linear(x, b, w, *ob, approximate=approximate, recompute=recompute),
             lambda x, b, w, *ob: F.linear(F.gelu(x + b, approximate=approximate), w, *ob),
             arrays, dtype=dtype, **TOL[dtype])
    ran = [kernels.calls[(name, impl)] - b for name, b in zip(names, before)]
    if recompute:  # backward recomputed the activation in the same pass as GELU's gradient: one kernel, not two
        assert ran == [0, 0, 1, 1, 0, 0]
    else:  # forward kept the activation and the derivative; backward took the derivative
        assert ran == [0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recompute"])
def test_bias_gelu_linear_keeps_what_backward_reads_and_passes_finite_differences(recompute, impl):
    x, b, w, ob = randn(5, (4, 6)), randn(6, (6,)), randn(7, (2, 6)), randn(8, (2,))
    check_finite_differences(lambda *t: bias_gelu_linear(*t, recompute=recompute), [x, b, w, ob])
    leaf = ta.tensor(x, requires_grad=True)
    params = [ta.tensor(a, requires_grad=True) for a in (b, w, ob)]
    with ta.Arena() as arena:
        h = leaf * 1.0
        out = bias_gelu_linear(h, *params, recompute=recompute)
        del h
        # Alive: x + bias alone (recompute), or the activation and GELU's derivative (192 B each), and the
        # output (64 B); h is gone, and so is the activation when it is recomputed.
        kept = x.nbytes if recompute else 2 * x.nbytes
        assert arena.stats.bytes_in_use == kept + out.data.nbytes
        out.sum().backward()
    assert all(t.grad is not None for t in [leaf, *params])


def test_bias_gelu_linear_keeps_no_activation_for_a_frozen_weight(impl):
    x, b, w = randn(5, (4, 6)), randn(6, (6,)), randn(7, (2, 6))
    leaf = ta.tensor(x, requires_grad=True)
    bias, weight = ta.tensor(b, requires_grad=True), ta.tensor(w)  # the weight takes no gradient
    with ta.Arena() as arena:
        h = leaf * 1.0
        out = bias_gelu_linear(h, bias, weight)
        del h
        assert arena.stats.bytes_in_use == x.nbytes + out.data.nbytes  # the derivative only
        out.sum().backward()
    tx, tb = torch.tensor(x, requires_grad=True), torch.tensor(b, requires_grad=True)
    F.linear(F.gelu(tx + tb), torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(leaf.grad, tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bias.grad, tb.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert weight.grad is None


def test_bias_gelu_linear_errors_name_the_shapes():
    x = ta.tensor(np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"x \(2, 4\).*bias \(3,\).*weight \(5, 4\)"):
        bias_gelu_linear(x, ta.tensor(np.zeros(3)), ta.tensor(np.zeros((5, 4))))
    with pytest.raises(ValueError, match=r"out_bias shape \(4,\) must be \(5,\)"):
        bias_gelu_linear(x, ta.tensor(np.zeros(4)), ta.tensor(np.zeros((5, 4))), ta.tensor(np.zeros(4)))
