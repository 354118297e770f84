"""torch API a PyTorch user reaches for that tensorarena lacked until 2026-12-07: F.rms_norm / nn.RMSNorm,
ta.eye / ta.empty / ta.empty_like and nn.Embedding.from_pretrained, each against torch 2.13.0.

On 6dda1f3 this file does not collect (ta.nn.RMSNorm did not exist; nor did the others), and LayerNorm(2.5) said
"'float' object is not iterable": `git worktree add /tmp/w/base 6dda1f3 && cp tests/fused_vs_torch.py /tmp/w/base/tests/
&& cd /tmp/w/base && PYTHONPATH=/tmp/w/base python -m pytest -q <this file>`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorarena as ta
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import fused_steps_match_torch

TOL = {np.float32: dict(rtol=2e-6, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,normalized,eps,with_weight", [
    ((5, 8), (8,), None, True), ((2, 3, 4, 6), (4, 6), 1e-3, True), ((7, 3), 3, 0.0, False),
    ((3, 16), (16,), None, False)])
def test_rms_norm_values_and_gradients_match_torch(dtype, shape, normalized, eps, with_weight):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    norm_shape = (normalized,) if isinstance(normalized, int) else normalized
    w = rng.standard_normal(norm_shape).astype(dtype) if with_weight else None
    g = rng.standard_normal(shape).astype(dtype)
    ours_x = ta.tensor(x, requires_grad=True)
    ours_w = ta.tensor(w, requires_grad=True) if with_weight else None
    out = ta.nn.functional.rms_norm(ours_x, normalized, ours_w, eps)
    (out * ta.tensor(g)).sum().backward()
    theirs_x = torch.tensor(x, requires_grad=True)
    theirs_w = torch.tensor(w, requires_grad=True) if with_weight else None
    want = F.rms_norm(theirs_x, list(norm_shape), theirs_w, eps)
    (want * torch.from_numpy(g)).sum().backward()
    assert out.dtype == dtype
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL[dtype])
    np.testing.assert_allclose(np.asarray(ours_x.grad), theirs_x.grad.numpy(), **TOL[dtype])
    if with_weight:
        np.testing.assert_allclose(np.asarray(ours_w.grad), theirs_w.grad.numpy(), **TOL[dtype])


def test_rms_norm_gradient_matches_finite_differences_in_float64():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 5)), rng.standard_normal(5)
    ours_x = ta.tensor(x, requires_grad=True)
    ta.nn.functional.rms_norm(ours_x, 5, ta.tensor(w), 1e-4).sum().backward()
    numeric = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += 1e-6
        down[i] -= 1e-6
        f = lambda a: ta.nn.functional.rms_norm(ta.tensor(a), 5, ta.tensor(w), 1e-4).sum().item()  # noqa: E731
        numeric[i] = (f(up) - f(down)) / 2e-6
    np.testing.assert_allclose(np.asarray(ours_x.grad), numeric, rtol=1e-6, atol=1e-8)


def test_rms_norm_module_mirrors_torch_repr_state_dict_and_values():
    ours, theirs = ta.nn.RMSNorm([2, 3], eps=1e-5), torch.nn.RMSNorm([2, 3], eps=1e-5)
    assert repr(ours) == repr(theirs)
    assert repr(ta.nn.RMSNorm(4)) == repr(torch.nn.RMSNorm(4))
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    assert list(ta.nn.RMSNorm(4, elementwise_affine=False).state_dict()) == []
    x = np.random.default_rng(2).standard_normal((4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(ours(ta.tensor(x)).numpy(), theirs(torch.from_numpy(x)).detach().numpy(),
                               **TOL[np.float32])


def test_rms_norm_refuses_bad_input_with_what_was_wrong():
    x = ta.randn(2, 4)
    with pytest.raises(ValueError, match=r"normalized_shape \(3,\) must equal the trailing dims .*\(2, 4\)"):
        ta.nn.functional.rms_norm(x, 3)
    with pytest.raises(ValueError, match=r"weight shape \(3,\) must equal normalized_shape \(4,\)"):
        ta.nn.functional.rms_norm(x, 4, ta.ones(3))
    with pytest.raises(TypeError, match="must be floating point.*int64"):
        ta.nn.functional.rms_norm(ta.tensor([[1, 2]]), 2)
    with pytest.raises(TypeError, match="the input is float32 but the weight is float64"):
        ta.nn.functional.rms_norm(x, 4, ta.ones(4, dtype=np.float64))
    with pytest.raises(ValueError, match="eps must be a number >= 0"):
        ta.nn.functional.rms_norm(x, 4, eps=-1.0)
    with pytest.raises(ValueError, match="RMSNorm: eps must be a finite number >= 0 or None"):
        ta.nn.RMSNorm(4, eps=float("nan"))
    with pytest.raises(TypeError, match="RMSNorm: normalized_shape must be an integer"):
        ta.nn.RMSNorm(2.5)


def test_a_model_with_rms_norm_trains_on_the_fused_routes_captured_replay_as_torch_does():
    model = ta.nn.Sequential(ta.nn.Linear(6, 8), ta.nn.RMSNorm(8), ta.nn.ReLU(), ta.nn.Linear(8, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.RMSNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for (_, p), (name, q) in zip(twin.named_parameters(), model.named_parameters()):
            p.copy_(torch.from_numpy(q.numpy().copy()))
    trainer = Trainer(model, ta.optim.AdamW(model.parameters(), lr=1e-2), ta.nn.functional.mse_loss, route="fused")
    topt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((16, 6)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32))
               for _ in range(5)]
    fused_steps_match_torch(trainer, topt, lambda x, y: F.mse_loss(twin(x), y), batches)
    # "auto" replays a step made of tensorarena's modules from its recording (README: all layers do)
    assert trainer.fused.replay == "captured" and trainer.fused.plan.capture.tape is not None
    for (_, p), (name, q) in zip(twin.named_parameters(), model.named_parameters()):
        np.testing.assert_allclose(q.numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("args", [(3,), (2, 5), (4, 1), (0,), (3, 0)])
def test_eye_matches_torch(args):
    for dtype, theirs in ((None, None), (np.float64, torch.float64), (np.int64, torch.int64)):
        ours = ta.eye(*args, dtype=dtype)
        want = torch.eye(*args, dtype=theirs)
        assert ours.shape == tuple(want.shape) and str(ours.dtype) == str(want.dtype).replace("torch.", "")
        np.testing.assert_array_equal(ours.numpy(), want.numpy())
    assert ta.eye(2, requires_grad=True).requires_grad


def test_eye_refuses_negative_and_non_integer_sizes():
    with pytest.raises(ValueError, match=r"eye: n and m must be >= 0, got n=-1, m=-1"):
        ta.eye(-1)
    with pytest.raises(TypeError, match=r"eye's m must be an int, got 2.5"):
        ta.eye(2, 2.5)


def test_empty_and_empty_like_have_torch_shapes_and_dtypes():
    for args, kwargs in (((2, 3), {}), (((4,),), {"dtype": np.float64}), ((), {"size": (1, 2)})):
        ours = ta.empty(*args, **kwargs)
        want = torch.empty(*args, **{k: (torch.float64 if k == "dtype" else v) for k, v in kwargs.items()})
        assert ours.shape == tuple(want.shape) and str(ours.dtype) == str(want.dtype).replace("torch.", "")
    like = ta.empty_like(ta.ones(3, 2, dtype=np.float64), requires_grad=True)
    assert like.shape == (3, 2) and like.dtype == np.float64 and like.requires_grad
    assert ta.empty_like(ta.ones(3), dtype=np.int32).dtype == np.int32
    with pytest.raises(TypeError, match="got the size twice"):
        ta.empty(2, size=(2,))


@pytest.mark.parametrize("freeze", [True, False])
def test_embedding_from_pretrained_as_torch(freeze):
    table = np.random.default_rng(4).standard_normal((5, 3)).astype(np.float32)
    table[1] = 7.0  # the padding row keeps what was given (torch does not zero it)
    ours = ta.nn.Embedding.from_pretrained(table, freeze=freeze, padding_idx=1)
    theirs = torch.nn.Embedding.from_pretrained(torch.from_numpy(table.copy()), freeze=freeze, padding_idx=1)
    assert ours.weight.requires_grad == theirs.weight.requires_grad == (not freeze)
    assert ours.padding_idx == theirs.padding_idx == 1
    ids = np.array([[0, 1, 4], [1, 3, 3]])
    out = ours(ta.tensor(ids))
    want = theirs(torch.from_numpy(ids))
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    table[0] = 0.0  # a copy, as torch's: the caller's array is not the weight
    assert ours.weight.numpy()[0, 0] != 0.0
    if not freeze:
        g = np.random.default_rng(5).standard_normal(out.shape).astype(np.float32)
        (out * ta.tensor(g)).sum().backward()
        (want * torch.from_numpy(g)).sum().backward()
        np.testing.assert_allclose(np.asarray(ours.weight.grad), theirs.weight.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_embedding_from_pretrained_draws_nothing_from_the_default_generator():
    ta.manual_seed(7)
    before = ta.randn(3).numpy()
    ta.manual_seed(7)
    ta.nn.Embedding.from_pretrained(np.ones((4, 2)))
    assert ta.nn.Embedding.from_pretrained(np.ones((4, 2))).weight.dtype == np.float64
    np.testing.assert_array_equal(ta.randn(3).numpy(), before)


def test_embedding_from_pretrained_refuses_a_table_that_is_not_2d_floats():
    with pytest.raises(ValueError, match=r"must be 2-D \(num_embeddings, embedding_dim\), got shape \(4,\)"):
        ta.nn.Embedding.from_pretrained(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="must be floating point, got dtype int64"):
        ta.nn.Embedding.from_pretrained(np.ones((2, 2), np.int64))


@pytest.mark.parametrize("layer", [ta.nn.LayerNorm, ta.nn.RMSNorm])
def test_a_norm_layer_names_a_float_normalized_shape(layer):
    # LayerNorm(2.5) said "'float' object is not iterable" on 6dda1f3.
    with pytest.raises(TypeError, match=rf"{layer.__name__}: normalized_shape must be an integer, got 2.5"):
        layer(2.5)
    assert layer(np.int64(3)).normalized_shape == layer([3]).normalized_shape == (3,)
