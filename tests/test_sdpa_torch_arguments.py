"""F.scaled_dot_product_attention takes torch's arguments: attn_mask (bool, True = attend, varying by batch and
key), is_causal, dropout_p, enable_gqa; a fused step inverts each batch's own mask.

On d10e298 (`python -m pytest -q tests/test_sdpa_torch_arguments.py` from a worktree of it, with an absolute
PYTHONPATH) 12 of 12 fail: each of these keywords was an "unexpected keyword argument" TypeError.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
import tensorarena.nn.functional as F
from tensorarena.train.trainer import Trainer


def _qkv(seed=0, b=2, h=2, t=3, s=5, hs=4):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, h, t, hs)).astype(np.float32), rng.standard_normal((b, h, s, hs)).astype(np.float32),
            rng.standard_normal((b, h, s, hs)).astype(np.float32))


def _padding(shape=(2, 1, 1, 5)):
    mask = np.ones(shape, bool)
    mask[0, ..., -2:] = False  # the first sequence's last two keys are padding
    return mask


def _both(arrays, call_ours, call_torch, cotangent_seed=1):
    ours = [ta.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, want = call_ours(*ours), call_torch(*theirs)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    cot = np.random.default_rng(cotangent_seed).standard_normal(out.shape).astype(np.float32)
    (out * ta.tensor(cot)).sum().backward()
    (want * torch.from_numpy(cot)).sum().backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad, t.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 5), (1, 1, 5), (1, 5)])
def test_a_bool_attn_mask_matches_torch(mask_shape):
    mask = _padding((2, 1, 1, 5))
    mask = mask.reshape(mask_shape) if mask_shape == (2, 1, 1, 5) else mask[1].reshape(mask_shape)
    _both(_qkv(), lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=ta.tensor(mask)),
          lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(mask)))


def test_attn_mask_with_is_causal_and_positional_arguments_match_torch():
    q, _, _ = _qkv(s=3)
    mask = np.ones((2, 1, 1, 3), bool)
    mask[1, ..., -1] = False
    _both((q, q + 1, q - 1), lambda a, b, c: F.scaled_dot_product_attention(a, b, c, ta.tensor(mask), 0.0, True),
          lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c, torch.tensor(mask), 0.0, True))


def test_attn_mask_and_key_padding_mask_combine():
    q, k, v = (ta.tensor(a) for a in _qkv())
    attend = _padding()
    padding = np.zeros((2, 5), bool)
    padding[1, 0] = True
    both = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, key_padding_mask=padding)
    combined = F.scaled_dot_product_attention(q, k, v, key_padding_mask=~attend[:, 0, 0] | padding)
    np.testing.assert_array_equal(both.numpy(), combined.numpy())


@pytest.mark.parametrize("mask, match", [
    (np.zeros((2, 1, 1, 5), np.float32), "dtype float32 is not supported, only a bool mask"),
    (np.ones((3, 5), bool), r"shape \(3, 5\) varies by query or head"),
    (np.ones((2, 2, 1, 5), bool), r"shape \(2, 2, 1, 5\) varies by query or head"),
    (np.ones((3, 1, 1, 5), bool), r"shape \(3, 1, 1, 5\) does not broadcast"),
])
def test_unsupported_masks_are_refused_saying_what_to_pass(mask, match):
    q, k, v = (ta.tensor(a) for a in _qkv())
    with pytest.raises(ValueError, match=match):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_enable_gqa_with_fewer_key_heads_is_refused():
    q, k, v = (ta.tensor(a) for a in _qkv())
    with pytest.raises(ValueError, match="grouped heads are not supported"):
        F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True)


def test_dropout_p_drops_as_the_packed_kernel_with_the_same_seed():
    # The same kernels and seed as packed_self_attention's dropout (tested against its reference elsewhere):
    # q, k, v packed into one projection give the same output and gradients.
    q, k, v = _qkv(s=3)
    b, h, t, hs = q.shape
    packed = np.concatenate([a.transpose(0, 2, 1, 3).reshape(b, t, h * hs) for a in (q, k, v)], axis=-1)
    ours = [ta.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, dropout_p=0.4, rng=np.random.default_rng(7))
    qkv = ta.tensor(packed, requires_grad=True)
    ref = F.packed_self_attention(qkv, h, dropout_p=0.4, rng=np.random.default_rng(7))
    np.testing.assert_allclose(out.numpy().transpose(0, 2, 1, 3).reshape(b, t, h * hs), ref.numpy(), rtol=1e-6)
    no_drop = F.scaled_dot_product_attention(*(ta.tensor(a) for a in (q, k, v)))
    assert not np.allclose(out.numpy(), no_drop.numpy())  # something was dropped
    out.sum().backward()
    ref.sum().backward()
    grads = np.concatenate([o.grad.transpose(0, 2, 1, 3).reshape(b, t, h * hs) for o in ours], axis=-1)
    np.testing.assert_allclose(grads, qkv.grad, rtol=1e-5, atol=1e-6)


class _MaskedAttention(ta.nn.Module):
    """One head over a projection of x; x[..., 0] > 0 marks the keys to attend (the batch's own mask)."""

    def __init__(self, d):
        super().__init__()
        self.proj = ta.nn.Linear(d, d)

    def forward(self, x):
        h = self.proj(x).unsqueeze(1)  # (B, 1, T, D)
        attend = (x[:, :, 0] > 0).reshape(x.shape[0], 1, 1, x.shape[1])
        return F.scaled_dot_product_attention(h, h, h, attn_mask=attend).mean(dim=(1, 2))


def test_fused_steps_use_each_batchs_mask():
    d = 4
    model = _MaskedAttention(d)
    tproj = torch.nn.Linear(d, d)
    with torch.no_grad():
        tproj.weight.copy_(torch.from_numpy(model.proj.weight.numpy()))
        tproj.bias.copy_(torch.from_numpy(model.proj.bias.numpy()))

    def torch_forward(x):
        h = tproj(x).unsqueeze(1)
        attend = (x[:, :, 0] > 0).reshape(x.shape[0], 1, 1, x.shape[1])
        return torch.nn.functional.scaled_dot_product_attention(h, h, h, attn_mask=attend).mean(dim=(1, 2))

    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), F.mse_loss, route="fused")
    topt = torch.optim.SGD(tproj.parameters(), lr=0.1)
    rng = np.random.default_rng(3)
    for _ in range(4):
        x = rng.standard_normal((3, 6, d)).astype(np.float32)
        x[:, 0, 0] = 1.0  # every sequence attends to at least one key
        y = rng.standard_normal((3, d)).astype(np.float32)
        report = trainer.step(x, y)
        assert report.route == "fused"
        topt.zero_grad()
        want = torch.nn.functional.mse_loss(torch_forward(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        topt.step()
        assert report.loss == pytest.approx(want.item(), rel=1e-5)
    np.testing.assert_allclose(model.proj.weight.numpy(), tproj.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
