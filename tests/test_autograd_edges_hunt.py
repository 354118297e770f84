"""Autograd edges found by a hunt on 2026-12-06, against torch. Run on the commit before the one that added this file
(a worktree of it first on PYTHONPATH), every test failed but the controls said in them:
- backward(gradient) of another dtype than the output flowed into the graph as it was (gemm refused float32 @
  float64; elsewhere a float64 graph ran in float32);
- a tensor set to require grad after an op used it got a gradient from that op's graph (torch: None);
- an integer or read-only array assigned to .grad was accepted, and the next backward failed on it with NumPy's words.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta


@pytest.mark.parametrize("given", [np.float32, np.int64])
def test_backward_takes_its_gradient_in_the_outputs_dtype_as_torch(given):
    a, b = np.random.default_rng(0).standard_normal((2, 3)), np.random.default_rng(1).standard_normal((3, 4))
    g = (np.arange(8).reshape(2, 4) + 0.25).astype(given)
    x = ta.tensor(a, dtype=np.float64, requires_grad=True)
    (x @ ta.tensor(b, dtype=np.float64)).backward(g)
    xt = torch.tensor(a, requires_grad=True)
    (xt @ torch.tensor(b)).backward(torch.from_numpy(g).double())
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad, xt.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", [lambda x, w: x + w, lambda x, w: x @ w.reshape(3, 1)])
def test_a_tensor_made_to_require_grad_after_an_op_gets_no_gradient_from_it(op):
    x, w = ta.tensor([1.0, 2.0, 3.0]), ta.tensor([1.0, 1.0, 2.0], requires_grad=True)
    xt, wt = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, 2.0], requires_grad=True)
    y, yt = op(x, w), op(xt, wt)
    x.requires_grad_(True)
    xt.requires_grad_(True)
    y.sum().backward()
    yt.sum().backward()
    assert x.grad is None and xt.grad is None
    np.testing.assert_allclose(w.grad, wt.grad.numpy(), rtol=1e-6)  # control: w's gradient as before


def test_an_integer_or_read_only_grad_is_refused_at_assignment():
    w = ta.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(TypeError, match="assigned grad has dtype int64, but a gradient is floating point"):
        w.grad = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="assigned grad is read-only"):
        w.grad = np.broadcast_to(np.float32(0), (3,))
    with pytest.raises(RuntimeError):
        torch.tensor([1.0, 2.0, 3.0], requires_grad=True).grad = torch.zeros(3, dtype=torch.int64)
    w.grad = np.ones(3, np.float32)  # control: a writable float one is taken and accumulated into
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad, [3.0, 5.0, 7.0])
