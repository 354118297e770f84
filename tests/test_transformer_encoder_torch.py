"""nn.TransformerEncoderLayer / nn.TransformerEncoder in torch's layout (tensorarena/nn/transformer_torch.py)
against torch 2.13.0: torch's state_dict loads as it is, values and gradients agree, and a model made of them
trains on the fused route's captured replay as torch trains it. On 9f86595 this file does not collect (the names
did not exist; README listed TransformerEncoderLayer as missing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import fused_steps_match_torch


def _pair(batch_first=False, norm_first=False, activation="relu", layers=None, final_norm=False, dtype=torch.float64):
    torch.manual_seed(0)
    kw = dict(d_model=12, nhead=3, dim_feedforward=20, dropout=0.0, activation=activation, batch_first=batch_first,
              norm_first=norm_first)
    theirs = torch.nn.TransformerEncoderLayer(**kw, dtype=dtype)
    ours = ta.nn.TransformerEncoderLayer(**kw, dtype=np.float64 if dtype == torch.float64 else np.float32)
    if layers:
        theirs = torch.nn.TransformerEncoder(theirs, layers, norm=torch.nn.LayerNorm(12, dtype=dtype) if final_norm
                                             else None, enable_nested_tensor=False)
        ours = ta.nn.TransformerEncoder(ours, layers, norm=ta.nn.LayerNorm(12, dtype=ours.linear1.weight.dtype)
                                        if final_norm else None)
    with torch.no_grad():  # different initial values per layer in torch: all of them must come across
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def _compare(ours, theirs, x, tol, **kw):
    ours_x = ta.tensor(x, requires_grad=True)
    theirs_x = torch.tensor(x, requires_grad=True)
    ta_kw = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    out, want = ours(ours_x, **ta_kw), theirs(theirs_x, **kw)
    g = np.random.default_rng(9).standard_normal(want.shape)
    (out * ta.tensor(g.astype(x.dtype))).sum().backward()
    (want * torch.from_numpy(g.astype(x.dtype))).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(ours_x.grad), theirs_x.grad.numpy(), rtol=tol, atol=tol)
    named = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(np.asarray(p.grad), named[name].grad.numpy(), rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_layer_values_and_gradients_match_torch(batch_first, norm_first, activation):
    ours, theirs = _pair(batch_first, norm_first, activation)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = np.random.default_rng(1).standard_normal((2, 5, 12) if batch_first else (5, 2, 12))
    _compare(ours, theirs, x, 1e-10)


@pytest.mark.parametrize("final_norm", [False, True])
def test_encoder_with_padding_and_causal_masks_matches_torch(final_norm):
    ours, theirs = _pair(batch_first=True, layers=2, final_norm=final_norm)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = np.random.default_rng(2).standard_normal((3, 6, 12))
    padding = np.zeros((3, 6), bool)
    padding[1, 4:] = padding[2, 2:] = True
    _compare(ours, theirs, x, 1e-10, src_key_padding_mask=torch.from_numpy(padding))
    ours, theirs = _pair(batch_first=True, layers=2, final_norm=final_norm)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    _compare(ours, theirs, x, 1e-10, mask=causal)
    ours, theirs = _pair(batch_first=True, layers=2, final_norm=final_norm)
    _compare(ours, theirs, x, 1e-10, mask=causal, is_causal=True)


def test_a_layer_takes_a_bool_causal_mask_and_refuses_other_masks():
    ours, theirs = _pair(batch_first=True)
    x = np.random.default_rng(3).standard_normal((2, 4, 12))
    _compare(ours, theirs, x, 1e-10, src_mask=torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1))
    other = np.zeros((4, 4), bool)
    other[0, 3] = True
    with pytest.raises(ValueError, match=r"src_mask of shape \(4, 4\) \(bool\) is not the causal mask of 4 "
                                         r"positions.*src_key_padding_mask"):
        ours(ta.tensor(x), src_mask=other)
    with pytest.raises(ValueError, match=r"expects a 3-D input, \(N, S, E\), got shape \(4, 12\)"):
        ours(ta.tensor(x[0]))
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        ta.nn.TransformerEncoderLayer(12, 3, activation="tanh")
    with pytest.raises(ValueError, match="embed_dim 12 must be divisible by num_heads 5"):
        ta.nn.TransformerEncoderLayer(12, 5)


def test_a_transformer_classifier_trains_on_the_fused_routes_captured_replay_as_torch():
    ours_encoder, theirs_encoder = _pair(batch_first=True, norm_first=True, activation="gelu", layers=2,
                                         dtype=torch.float32)
    model = ta.nn.Sequential(ours_encoder, ta.nn.Flatten(1), ta.nn.Linear(6 * 12, 3))
    twin_head = torch.nn.Linear(6 * 12, 3)
    with torch.no_grad():
        twin_head.weight.copy_(torch.from_numpy(model[2].weight.numpy().copy()))
        twin_head.bias.copy_(torch.from_numpy(model[2].bias.numpy().copy()))
    twin = torch.nn.Sequential(theirs_encoder, torch.nn.Flatten(1), twin_head)
    # SGD, not Adam: the key projection's bias gets a gradient of rounding noise only (softmax ignores a constant
    # per query), which Adam divides by its own size into lr-sized steps that differ from torch's noise
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), ta.nn.functional.cross_entropy,
                      route="fused")
    topt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((4, 6, 12)).astype(np.float32), rng.integers(0, 3, 4)) for _ in range(4)]
    fused_steps_match_torch(trainer, topt, lambda x, y: torch.nn.functional.cross_entropy(twin(x), y), batches,
                            rel=1e-4)
    assert trainer.fused.replay == "captured" and trainer.fused.plan.capture.tape is not None
    named = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), named[name].detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
