"""Autograd engine: graph bookkeeping, grad modes, and the direct write of parameter grads."""

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.nn import Parameter
from tensorarena.ops import linear


def _pair(shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape)
    return Parameter(a), torch.tensor(a, requires_grad=True)


def test_parameter_used_once_gets_its_grad_without_a_copy():
    w, tw = _pair((4, 3))
    b, tb = _pair((4,), 1)
    x = np.random.default_rng(2).standard_normal((5, 3))
    addresses = set()
    for _ in range(3):
        w.grad = b.grad = None
        with ta.Arena():
            linear(ta.tensor(x, dtype=np.float64), w, b).sum().backward()
        assert w.grad is w._grad_buffer and b.grad is b._grad_buffer  # written in place, persistent
        addresses.add(w.grad.ctypes.data)
    assert len(addresses) == 1
    torch.nn.functional.linear(torch.tensor(x), tw, tb).sum().backward()
    np.testing.assert_allclose(w.grad, tw.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(b.grad, tb.grad.numpy(), rtol=1e-12)


def test_parameter_used_twice_accumulates_both_paths():
    # A shared weight gets two gradients: the direct write must not let the second
    # overwrite the first (it is refused when a leaf has more than one use).
    w, tw = _pair((3, 3))
    x = np.random.default_rng(3).standard_normal((2, 3))
    linear(linear(ta.tensor(x, dtype=np.float64), w), w).sum().backward()
    tl = torch.nn.functional.linear
    tl(tl(torch.tensor(x), tw), tw).sum().backward()
    np.testing.assert_allclose(w.grad, tw.grad.numpy(), rtol=1e-12)


def test_grads_accumulate_across_backward_calls_like_torch():
    w, tw = _pair((2, 3))
    x = np.ones((1, 3))
    for _ in range(2):
        linear(ta.tensor(x, dtype=np.float64), w).sum().backward()
        torch.nn.functional.linear(torch.tensor(x), tw).sum().backward()
    np.testing.assert_allclose(w.grad, tw.grad.numpy())
    np.testing.assert_allclose(w.grad, 2 * np.ones((2, 3)))


def test_second_backward_through_a_freed_graph_raises():
    w, _ = _pair((3,))
    y = (w * w).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_no_grad_records_nothing_and_detach_cuts_the_graph():
    w, _ = _pair((3,))
    with ta.no_grad():
        y = w * 2
        with ta.enable_grad():
            z = w * 2
    assert not y.requires_grad and z.requires_grad
    d = (w * 3).detach()
    assert not d.requires_grad and d.is_leaf
    assert ta.is_grad_enabled()


def test_backward_needs_a_scalar_or_a_matching_grad():
    w, _ = _pair((3,))
    y = w * 2
    with pytest.raises(RuntimeError, match=r"scalar output, got shape \(3,\)"):
        y.backward()
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        y.backward(np.ones(2))
    y.backward(np.ones(3))
    np.testing.assert_array_equal(w.grad, 2 * np.ones(3))
    with pytest.raises(RuntimeError, match="does not require grad"):
        ta.tensor([1.0]).sum().backward()


def test_deep_graph_does_not_hit_the_recursion_limit():
    w, _ = _pair((2,))
    y = w
    for _ in range(5000):
        y = y * 1.0
    y.sum().backward()
    np.testing.assert_array_equal(w.grad, np.ones(2))


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="floating-point"):
        ta.Tensor(np.arange(3), requires_grad=True)


def test_the_reference_checks_catch_a_wrong_gradient():
    # The op-test helpers must be able to fail: an op whose backward is off by 1% is caught
    # by both the torch comparison and the finite differences.
    from tensorarena.ops._base import new_like
    from tests.reference import check_finite_differences, check_op

    def bad_square(a):
        ad = a.data
        out = new_like(ad)
        np.multiply(ad, ad, out=out)

        def backward(g):
            return (g * ad * 2.02,)

        return ta.Tensor._make(out, (a,), backward)

    x = np.random.default_rng(0).standard_normal((3, 2))
    with pytest.raises(AssertionError, match="grad of input 0"):
        check_op(bad_square, lambda t: t * t, [x])
    with pytest.raises(AssertionError, match="finite-difference"):
        check_finite_differences(bad_square, [x])


def test_slices_of_one_parent_share_one_gradient_buffer():
    # q/k/v split of a fused projection: three basic-index views of one tensor. Their gradients
    # must accumulate into one parent-sized buffer (SliceGrad), not three plus full-size adds.
    a = np.random.default_rng(4).standard_normal((8, 96))
    x = ta.tensor(a, dtype=np.float64, requires_grad=True)
    tx = torch.tensor(a, requires_grad=True)
    with ta.Arena() as arena:
        qkv = x * 1.0
        parts = [qkv[:, i * 32:(i + 1) * 32] for i in range(3)]
        y = (parts[0] * parts[1] + parts[2]).sum()
        before = arena.stats.bytes_in_use
        y.backward()
        grown = arena.stats.bytes_in_use - before
    tq = tx * 1.0
    tp = [tq[:, i * 32:(i + 1) * 32] for i in range(3)]
    (tp[0] * tp[1] + tp[2]).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-12)
    parent_bytes = a.nbytes
    # Now: one parent-sized buffer for qkv's grad, one for x's (from `* 1.0`), and slice-sized
    # temporaries (sum's ones, mul's two grads) = 3 parents. Before SliceGrad: three dense
    # parent-sized slice grads plus their sum plus x's grad = 6 parents (measured by reverting
    # ops/index.py's backward_basic to the zero-filled array).
    assert grown <= 3 * parent_bytes, f"backward grew the arena by {grown} bytes (parent is {parent_bytes})"
