"""Losses, attention and reductions at extreme values, against torch.

Found by a helper's hunt of numerical robustness (each op on both kernel twins, forward and backward):
- cross_entropy's kernels kept logsumexp = max + log(sum): at |logits| ~1e16 the log(sum) rounded away, four
  equal logits of 1e20 gave loss 0 and gradient [1, 1, 0, 1] (torch: log 4, [.25, .25, -.75, .25]);
- nll_loss (and cross_entropy with a class weight) read an ignored row at class 0 and multiplied it by 0: a -inf
  there (a masked class) made the loss NaN where torch leaves the row out;
- fused attention folded the scale into exp(fma(score, scale, -m)): past 2**31 the max's residual overflowed exp
  (a NaN row) or every exp underflowed (a zero row);
- float32 sum, mean and var along a leading axis added row after row in float32 (2.7e-5 to 3.7e-4 off over 1e6
  rows; torch ~1e-7).

On 59aa01a (before the fixes) 20 of the 23 fail; the controls pass there (attention at 1e3, the reference twin's at 1e10):
    git worktree add /tmp/wt 59aa01a && cp tests/test_numerics_extremes_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_numerics_extremes_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tensorarena as ta
from tensorarena import kernels
from tensorarena.nn import functional as F


def _loss_and_grad(fn, logits: np.ndarray):
    x = ta.tensor(logits, requires_grad=True)
    loss = fn(x)
    loss.backward()
    return float(loss.item()), np.asarray(x.grad)


@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("magnitude", [1e12, 1e20])
def test_cross_entropy_of_huge_equal_logits_is_log_of_the_class_count(impl, dtype, magnitude):
    logits = np.full((1, 4), magnitude, dtype)
    target = np.array([2])
    with kernels.using(impl):
        loss, grad = _loss_and_grad(lambda x: F.cross_entropy(x, target), logits)
    tl = torch.tensor(logits, requires_grad=True)
    want = TF.cross_entropy(tl, torch.tensor(target))
    want.backward()
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(loss, want.item(), rtol=rtol)
    np.testing.assert_allclose(grad, tl.grad.numpy(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_cross_entropy_with_smoothing_at_huge_logits(impl):
    logits = np.array([[1e20, 1e20, 1e20 - 2**70, 1e20]])  # float64: the third e**-(2**70) behind the others
    target = np.array([1])
    with kernels.using(impl):
        loss, grad = _loss_and_grad(lambda x: F.cross_entropy(x, target, label_smoothing=0.1), logits)
    tl = torch.tensor(logits, requires_grad=True)
    want = TF.cross_entropy(tl, torch.tensor(target), label_smoothing=0.1)
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-12)
    np.testing.assert_allclose(grad, tl.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_leaves_an_ignored_row_with_minus_inf_out(reduction):
    with np.errstate(divide="ignore"):
        log_p = np.log(np.array([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]], np.float32))  # row 0 at class 0: -inf
    target = np.array([-100, 1])
    got = F.nll_loss(ta.tensor(log_p), target, reduction=reduction).numpy()
    want = TF.nll_loss(torch.tensor(log_p), torch.tensor(target), reduction=reduction).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_weighted_cross_entropy_leaves_an_ignored_row_with_minus_inf_out(smoothing):
    logits = np.array([[-np.inf, 1.0, 2.0], [0.5, 1.5, -0.5]], np.float32)
    target = np.array([-100, 2])
    weight = np.array([1.0, 2.0, 0.5], np.float32)
    x = ta.tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, target, weight=ta.tensor(weight), label_smoothing=smoothing)
    loss.backward()
    tl = torch.tensor(logits, requires_grad=True)
    want = TF.cross_entropy(tl, torch.tensor(target), weight=torch.tensor(weight), label_smoothing=smoothing)
    want.backward()
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(x.grad)[1], tl.grad.numpy()[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("magnitude", [1e3, 1e10])
def test_attention_with_huge_scores_matches_torch(impl, magnitude):
    rng = np.random.default_rng(0)
    q = (rng.standard_normal((1, 1, 4, 8)) * magnitude).astype(np.float32)
    k = (rng.standard_normal((1, 1, 8, 8)) * magnitude).astype(np.float32)
    v = rng.standard_normal((1, 1, 8, 8)).astype(np.float32)
    want = TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v)).numpy()
    with kernels.using(impl):
        got = F.scaled_dot_product_attention(ta.tensor(q), ta.tensor(k), ta.tensor(v)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_softmax_row_with_huge_scores_is_the_scaled_softmax():
    from tensorarena.kernels.attention_heads import softmax_row

    row = (np.random.default_rng(1).standard_normal(16) * 1e10).astype(np.float32)
    scale = 0.35355339  # 1 / sqrt(8): not a power of two, so scale * score rounds
    want = torch.softmax(torch.tensor(row) * np.float32(scale), 0).numpy()
    softmax_row(row, np.zeros(16, bool), False, False, 0, scale)
    np.testing.assert_allclose(row, want, atol=1e-6)


@pytest.mark.parametrize("op", ["sum", "mean", "var"])
def test_float32_reductions_along_the_leading_axis_are_accurate(op):
    x = (np.random.default_rng(2).standard_normal((1_000_000, 4)) + 10).astype(np.float32)
    got = getattr(ta.tensor(x), op)(0).numpy()
    exact = getattr(x.astype(np.float64), op)(0, **({"ddof": 1} if op == "var" else {}))
    # torch's own float32 error here is ~1e-7; adding row after row in float32 was 2.7e-5 to 3.7e-4 off.
    np.testing.assert_allclose(got, exact, rtol=5e-7)
