"""Attention's and the functional API's inputs as torch takes them (a hunt of 2026-12-07; the attention maths matched
torch on every route). Before: a bool Tensor key padding mask (what `ids == pad_id` gives) failed inside Numba in
packed_self_attention, and a list mask in both attention functions; integer q/k/v failed inside a GEMM naming an
internal twin; softmax/log_softmax without dim silently took dim -1 where torch takes dim 0 or 1 (and nn.Softmax()
here refuses no dim); F.linear's weight and bias, F.normalize and F.pad failed on NumPy arrays with
"'memoryview' object has no attribute 'dtype'". Run on the commit before the one that added this file (a worktree
of it first on PYTHONPATH), all 7 of its cases failed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tensorarena as ta
import tensorarena.nn.functional as F

B, T, H, HS = 2, 5, 2, 4


def _qkv(seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, 3 * H * HS))


def _torch_packed(qkv, padding):
    x = torch.tensor(qkv, requires_grad=True)
    q, k, v = x.reshape(B, T, 3, H, HS).permute(2, 0, 3, 1, 4)
    mask = ~torch.tensor(padding)[:, None, None, :]  # True: attend
    out = TF.scaled_dot_product_attention(q, k, v, attn_mask=mask).permute(0, 2, 1, 3).reshape(B, T, H * HS)
    return x, out


@pytest.mark.parametrize("kind", ["tensor", "list"])
def test_packed_attention_takes_a_mask_as_a_bool_tensor_or_a_list(kind):
    qkv = _qkv()
    padding = np.zeros((B, T), bool)
    padding[1, 3:] = True
    mask = ta.tensor(padding) if kind == "tensor" else padding.tolist()
    x = ta.tensor(qkv, requires_grad=True)
    out = F.packed_self_attention(x, H, key_padding_mask=mask)
    tx, tout = _torch_packed(qkv, padding)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    w = np.random.default_rng(1).standard_normal(out.shape)
    (out * ta.tensor(w)).sum().backward()
    (tout * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-9, atol=1e-11)


def test_attention_of_integer_tensors_is_refused_naming_them():
    ints = np.ones((B, H, T, HS), np.int64)
    with pytest.raises(RuntimeError, match="expected scalar type Float"):
        TF.scaled_dot_product_attention(*(torch.tensor(ints),) * 3)
    with pytest.raises(TypeError, match=r"scaled_dot_product_attention \(q\): the tensor has dtype int64"):
        F.scaled_dot_product_attention(ta.tensor(ints), ta.tensor(ints), ta.tensor(ints))
    with pytest.raises(TypeError, match="packed_self_attention: the tensor has dtype int64"):
        F.packed_self_attention(ta.tensor(np.ones((B, T, 3 * H * HS), np.int64)), H)


@pytest.mark.parametrize("call", [lambda m, x: m.softmax(x), lambda m, x: m.log_softmax(x)],
                         ids=["softmax", "log_softmax"])
def test_softmax_without_dim_is_refused_not_taken_as_the_last(call):
    x = np.random.default_rng(0).standard_normal((2, 2, 3))
    with pytest.warns(UserWarning, match="Implicit dimension choice"):  # torch: deprecated, picks dim 0 here
        call(TF, torch.tensor(x))
    with pytest.raises(TypeError, match="needs dim"):
        call(F, ta.tensor(x))


def test_tensor_softmax_without_dim_is_refused_as_torch():
    with pytest.raises(TypeError):
        torch.ones(2, 3).softmax()
    with pytest.raises(TypeError, match="needs dim"):
        ta.tensor(np.ones((2, 3))).softmax()


def test_functional_ops_take_numpy_arrays_as_their_other_inputs_do():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 3)), rng.standard_normal((4, 3)), rng.standard_normal(4)
    np.testing.assert_allclose(F.linear(ta.tensor(x), w, b).numpy(),
                               TF.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(F.normalize(x).numpy(), TF.normalize(torch.tensor(x)).numpy(), rtol=1e-12)
    np.testing.assert_array_equal(F.pad(x, (1, 1)).numpy(), TF.pad(torch.tensor(x), (1, 1)).numpy())
