"""Ops a hunt of 2026-12-07 found wrong at their edges (sorting, losses, clamping, arranging, selecting), each
checked against torch. Run on the commit before the one that added this file (a worktree of it first on
PYTHONPATH), 23 of its 26 cases failed; the 3 that passed are the controls (numbers torch takes into integer
tensors, crops within the edge) and pad (-2, -2) on 3 elements, which the old final-shape check caught.
Before: nll_loss over 0 classes and index_select of a 0-d tensor with two indices raised NumPy's reshape
errors; mse_loss of two integer tensors summed them silently, and of a float32 input with an int64 target was
float64; clamp, clamp_, where, masked_fill, fill_ and t[i] = v wrapped a Python int the integer dtype cannot
hold (uint8 clamp(max=300) was max=44); tril/triu/diag/pad truncated float amounts and roll read dims=True as
dim 1; pad cropping past an edge gave a tensor of fill values; a mean BCE of an empty batch divided by zero in
backward; t.flip(dims=...) was refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tensorarena as ta
import tensorarena.nn.functional as F


def test_nll_loss_over_zero_classes_is_an_index_error_as_torch():
    x, t = np.zeros((2, 0), np.float32), np.array([0, 0])
    with pytest.raises(IndexError):
        TF.nll_loss(torch.from_numpy(x), torch.from_numpy(t))
    with pytest.raises(IndexError, match=r"nll_loss: input of shape \(2, 0\) has 0 classes"):
        F.nll_loss(ta.Tensor(x, requires_grad=True), t)


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
def test_difference_losses_promote_an_integer_target_as_torch_and_refuse_two_integer_tensors(name):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5).astype(np.float32)
    t = np.array([1, -2, 0, 3, 1])
    ours_x = ta.Tensor(x, requires_grad=True)
    ours = getattr(F, name)(ours_x, ta.Tensor(t))
    theirs = getattr(TF, name)(torch.tensor(x), torch.tensor(t))
    assert ours.dtype == np.float32 and theirs.dtype == torch.float32
    np.testing.assert_allclose(ours.item(), theirs.item(), rtol=1e-6)
    ours.backward()
    # The gradient against the float target's (torch's huber_loss backward fails on an int64 target: "Found dtype
    # Long but expected Float").
    theirs_x = torch.tensor(x, requires_grad=True)
    getattr(TF, name)(theirs_x, torch.tensor(t, dtype=torch.float32)).backward()
    assert ours_x.grad.dtype == np.float32
    np.testing.assert_allclose(ours_x.grad, theirs_x.grad.numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises((NotImplementedError, RuntimeError)):  # torch has no integer mean of these
        getattr(TF, name)(torch.tensor(t), torch.tensor(t))
    for reduction in ("mean", "sum"):  # mse_loss's "sum" returned tensor(13, int64)
        with pytest.raises(TypeError, match=f"{name}: needs floating-point input or target, got int64 and int64"):
            getattr(F, name)(ta.Tensor(t), ta.Tensor(t), reduction=reduction)


_OUT_OF_RANGE = [
    ("clamp max", lambda m, a: m.clamp(a, max=300), np.uint8),
    ("clamp min", lambda m, a: m.clamp(a, min=-2 ** 33), np.int32),
    ("clamp_", lambda m, a: a.clamp_(max=2 ** 32), np.int32),
    ("where", lambda m, a: m.where(a > 0, a, 300), np.uint8),
    ("masked_fill", lambda m, a: a.masked_fill(a > 0, 300), np.uint8),
    ("fill_", lambda m, a: a.fill_(-256), np.uint8),
    ("setitem", lambda m, a: a.__setitem__(0, 300), np.uint8),
]


@pytest.mark.parametrize("name, op, dtype", _OUT_OF_RANGE, ids=[c[0] for c in _OUT_OF_RANGE])
def test_a_number_the_integer_dtype_cannot_hold_is_refused_where_torch_refuses_it(name, op, dtype):
    data = np.array([44, 0, 7], dtype)
    with pytest.raises(RuntimeError, match="without overflow"):
        op(torch, torch.tensor(data))
    ours = ta.Tensor(data.copy())
    with pytest.raises(OverflowError, match=f"cannot be converted to the tensor's dtype {np.dtype(dtype)} without "
                                            f"overflow"):
        op(ta, ours)
    np.testing.assert_array_equal(ours.numpy(), data)  # nothing written


def test_numbers_torch_takes_into_integer_tensors_still_work():
    # Controls (they passed before the fix too): unsigned dtypes take down to -max, wrapping, as torch's;
    # arithmetic and comparisons wrap in both.
    data = np.array([44, 0, 7], np.uint8)
    for op in (lambda m, a: a.fill_(-1), lambda m, a: m.clamp(a, min=-1), lambda m, a: a + 300,
               lambda m, a: a == 300, lambda m, a: m.clamp(a, max=2.5), lambda m, a: a.masked_fill(a > 0, 255)):
        theirs = op(torch, torch.tensor(data.copy()))
        ours = op(ta, ta.Tensor(data.copy()))
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("call", [lambda m, x: m.tril(x, 1.5), lambda m, x: m.triu(x, 0.9),
                                  lambda m, x: m.diag(x, 1.7), lambda m, x: m.roll(x, 1, True),
                                  lambda m, x: (TF if m is torch else F).pad(x, (1.5, 1.5))],
                         ids=["tril", "triu", "diag", "roll", "pad"])
def test_float_or_bool_amounts_and_dims_are_refused_as_torch(call):
    x = np.arange(9.0).reshape(3, 3)
    with pytest.raises(TypeError):
        call(torch, torch.tensor(x))
    with pytest.raises(TypeError, match="must be (an int|ints)"):
        call(ta, ta.Tensor(x))


@pytest.mark.parametrize("amounts", [(-5, 3), (3, -5), (-2, -2)])
def test_pad_refuses_a_crop_past_the_edge_as_torch(amounts):
    x = np.arange(9.0).reshape(3, 3)
    with pytest.raises(RuntimeError):
        TF.pad(torch.tensor(x), amounts)
    with pytest.raises(ValueError, match=r"pad: the padding \(-?\d, -?\d\) crops"):
        F.pad(ta.Tensor(x), amounts)


def test_pad_crops_within_the_edge_as_torch():  # control: a crop of the whole dim, and one side each
    x = np.arange(12.0).reshape(3, 4)
    for amounts in ((-2, -2), (-1, 2), (2, -3), (-1, -1, 1, 0)):
        np.testing.assert_array_equal(F.pad(ta.Tensor(x), amounts).numpy(), TF.pad(torch.tensor(x), amounts).numpy())


def test_index_select_of_a_0d_tensor_takes_one_index_as_torch():
    with pytest.raises(RuntimeError, match="only 1 value"):
        torch.index_select(torch.tensor(2.0), 0, torch.tensor([0, 0]))
    with pytest.raises(IndexError, match="a 0-d tensor takes an index of exactly one value, got 2"):
        ta.index_select(ta.tensor(2.0), 0, np.array([0, 0]))
    assert ta.index_select(ta.tensor(2.0), 0, np.array([0])).item() == 2.0  # control


@pytest.mark.parametrize("with_logits", [True, False])
def test_mean_bce_of_an_empty_batch_is_nan_with_an_empty_gradient_as_torch(with_logits):
    x = np.zeros((0, 3))
    target = np.zeros((0, 3))
    fn, tfn = ((F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits) if with_logits
               else (F.binary_cross_entropy, TF.binary_cross_entropy))
    ours_x, ours_t = ta.Tensor(x, requires_grad=True), ta.Tensor(target, requires_grad=True)
    theirs_x, theirs_t = torch.tensor(x, requires_grad=True), torch.tensor(target, requires_grad=True)
    with np.errstate(all="raise"):  # the suite's setting, under which g / 0 raised
        ours = fn(ours_x, ours_t)
        ours.backward()
    theirs = tfn(theirs_x, theirs_t)
    theirs.backward()
    assert np.isnan(ours.item()) and np.isnan(theirs.item())
    assert ours_x.grad.shape == tuple(theirs_x.grad.shape) == (0, 3)
    assert ours_t.grad.shape == tuple(theirs_t.grad.shape) == (0, 3)


def test_flip_takes_dims_as_a_keyword_as_torch():
    x = np.arange(6.0).reshape(2, 3)
    for kwargs in ({"dims": (0,)}, {"dims": (0, 1)}, {"dims": [1]}):
        np.testing.assert_array_equal(ta.Tensor(x).flip(**kwargs).numpy(), torch.tensor(x).flip(**kwargs).numpy())
    with pytest.raises(TypeError, match="takes dims once"):
        ta.Tensor(x).flip(0, dims=(1,))
