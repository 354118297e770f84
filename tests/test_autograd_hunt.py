"""Bug hunt: autograd engine edge cases against torch.

In-place updates and views, backward twice, non-scalar backward, gradient accumulation and the .grad buffer,
grad modes, requires_grad_ and integer tensors, graphs outliving their arena, repeated-index scatter, broadcast
reduction, max ties, where, inf/nan from division and log, dtype mixes, deep graphs and shape errors.
Each test compares against torch, finite differences or an exact value. Tests that failed mark a bug, now under a
"# Regression (fixed):" comment saying what was wrong; the sections "added with the fixes" cover what they added.
Run: NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_autograd_hunt.py

25 of these 125 tests fail on 4139106, before the fixes (the hunt's 16, two of them fixed since by others, and 9 of the
13 added with the fixes). With this file copied into a worktree of 4139106 (git worktree add /tmp/old 4139106), run in
/tmp/old: `NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_autograd_hunt.py`.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.nn import Parameter

F64 = dict(rtol=1e-12, atol=1e-12)
F32 = dict(rtol=1e-5, atol=1e-6)


def _pair(values, dtype=np.float64):
    """A tensorarena leaf and a torch leaf holding the same values, both requiring grad."""
    values = np.asarray(values, dtype=dtype)
    t = torch.tensor(values, requires_grad=True)
    return ta.tensor(values, dtype=dtype, requires_grad=True), t


def _rand(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


# --- in-place updates and views ----------------------------------------------------------------------------

# Regression (fixed): `w -= lr * w.grad` under no_grad (the hand-written SGD step every torch tutorial has) does not
# update the Parameter: Tensor defines no __isub__/__iadd__/..., so Python falls back to `w = w - lr * w.grad`, which
# rebinds the name to a new non-leaf tensor. The Parameter (what the model holds) is left unchanged, silently.
def test_inplace_sub_under_no_grad_updates_the_parameter_like_torch():
    w = Parameter(np.array([1.0, 2.0, 3.0]))
    held = w  # what a Module (or an optimizer's param list) holds
    (w * w).sum().backward()
    with ta.no_grad():
        w -= 0.5 * w.grad
    np.testing.assert_allclose(held.numpy(), [0.0, 0.0, 0.0], **F64)  # 1 - 0.5*2, 2 - 0.5*4, 3 - 0.5*6
    assert w is held, "in-place update rebound the name to a new tensor"


# Regression (fixed): `x += 1` on a leaf that requires grad: torch raises "a leaf Variable that requires grad is being
# used in an in-place operation"; tensorarena silently rebinds x to a new non-leaf tensor (no __iadd__), so x.grad of
# what the user thinks is the leaf never arrives.
def test_inplace_add_on_a_leaf_requiring_grad_is_refused_like_torch():
    tx = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        tx += 1
    x = ta.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        x += 1


# Regression (fixed): an in-place write through a view did not reach the base: `v = y[0:2]; v += 1` left y as
# it was (no __iadd__: v was rebound to a new tensor). Expectation changed: torch records an in-place op on a
# non-leaf view with grad enabled (CopySlices rewrites the base's history); tensorarena has no such rewrite, so
# there it raises, saying to write `v = v + 1`. Under no_grad() the write goes through (and bumps the version
# counter the view shares with its base: see tests/test_version_counter.py).
def test_inplace_add_through_a_view_changes_the_base_like_torch():
    x, tx = _pair([1.0, 2.0, 3.0])
    y, ty = x * 2.0, tx * 2.0
    v, tv = y[0:2], ty[0:2]
    with pytest.raises(RuntimeError, match=r"x = x \+ y"):
        v += 1.0
    np.testing.assert_allclose(y.numpy(), [2.0, 4.0, 6.0], **F64)  # the refused write changed nothing
    with ta.no_grad():
        v += 1.0
    with torch.no_grad():
        tv += 1.0
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **F64)


def test_item_assignment_on_a_grad_leaf_is_refused_as_torch():
    # Expectation changed: Tensor now has __setitem__ (tests/test_torch_idioms.py); on a leaf that requires grad,
    # outside no_grad, `x[0] = 5` is refused as torch refuses it (RuntimeError), and writes nothing.
    tx = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        tx[0] = 5.0
    x = ta.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        x[0] = 5.0
    np.testing.assert_array_equal(x.numpy(), [1.0, 1.0, 1.0])


# --- backward twice, retain_graph, non-scalar backward ----------------------------------------------------

def test_second_backward_raises_clearly_and_first_grads_are_correct():
    x, tx = _pair([0.5, 1.5])
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()
    (tx.exp() * tx).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)  # the failed second call added nothing


# Regression (fixed): backward had no retain_graph: `y.backward(retain_graph=True)` is a TypeError ("unexpected keyword
# argument"), so torch's way to backward twice through one graph (two losses over a shared trunk, a
# gradient-penalty term) does not exist; torch accumulates 2 * dy/dx.
def test_backward_retain_graph_twice_accumulates_like_torch():
    x, tx = _pair([0.5, 1.5])
    y, ty = (x.exp() * x).sum(), (tx.exp() * tx).sum()
    ty.backward(retain_graph=True)
    ty.backward()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


def test_non_scalar_backward_needs_grad_and_names_shapes():
    x, tx = _pair(_rand(0, (2, 3)))
    y = x * 3.0
    with pytest.raises(RuntimeError, match=r"\(2, 3\)"):
        y.backward()
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(2, 3\)"):
        y.backward(np.ones((3, 2)))
    g = _rand(1, (2, 3))
    y.backward(g)
    (tx * 3.0).backward(torch.tensor(g))
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


def test_one_element_non_scalar_backward_without_grad_like_torch():
    # torch allows the implicit gradient for any one-element output, whatever its shape.
    x, tx = _pair([[2.0]])
    (x * x).backward()
    (tx * tx).backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


def test_backward_on_a_leaf_itself():
    x, tx = _pair(3.0)
    x.backward()
    tx.backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


# --- .grad accumulation and the persistent buffer ---------------------------------------------------------

def test_grad_accumulates_across_two_backwards_over_different_graphs():
    x, tx = _pair(_rand(2, (3,)))
    (x * x).sum().backward()
    (x.exp()).sum().backward()
    (tx * tx).sum().backward()
    (tx.exp()).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


# Regression (fixed): `g = x.grad; x.grad = None; loss.backward()` (torch's documented way to clear a gradient)
# overwrites the array the user kept: the next backward writes x's new gradient into the same persistent buffer
# (`_grad_buffer`, reused when .grad is None). torch allocates a new .grad and g keeps the old values. zero_grad()
# checks the reference count for this; assigning None directly bypasses it.
def test_grad_set_to_none_by_hand_does_not_overwrite_a_kept_gradient():
    x = ta.tensor(np.arange(1.0, 4.0), requires_grad=True)
    (x * 2.0).sum().backward()
    kept = x.grad
    x.grad = None
    (x * 5.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [5.0, 5.0, 5.0])
    np.testing.assert_array_equal(kept, [2.0, 2.0, 2.0])


def test_zero_grad_does_not_overwrite_a_kept_gradient():
    x = ta.tensor(np.arange(1.0, 4.0), requires_grad=True)
    (x * 2.0).sum().backward()
    kept = x.grad
    x.zero_grad()
    (x * 5.0).sum().backward()
    np.testing.assert_array_equal(kept, [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(x.grad, [5.0, 5.0, 5.0])


def test_leaf_grad_of_float32_leaf_from_float64_graph_is_float32():
    x = ta.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    c = ta.tensor(np.array([0.1, 0.3]), dtype=np.float64)
    (x * c).sum().backward()
    (tx * torch.tensor([0.1, 0.3], dtype=torch.float64)).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F32)


def test_non_leaf_grad_stays_none_like_torch():
    x, _ = _pair([1.0, 2.0])
    y = x * 2.0
    (y * y).sum().backward()
    assert y.grad is None and not y.is_leaf and x.is_leaf


# Regression (fixed): no Tensor.retain_grad(): torch's way to read an intermediate's gradient is an AttributeError here
# (there are no hooks either), so a non-leaf's gradient cannot be inspected at all.
def test_retain_grad_on_a_non_leaf_like_torch():
    x, tx = _pair([1.0, 2.0])
    y, ty = x * 2.0, tx * 2.0
    y.retain_grad()
    ty.retain_grad()
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.grad, ty.grad.numpy(), **F64)


# --- grad modes, detach, requires_grad_ ---------------------------------------------------------------------

def test_no_grad_enable_grad_nesting_restores_each_level():
    x = ta.tensor(np.ones(2), requires_grad=True)
    with ta.no_grad():
        assert not (x * 2.0).requires_grad
        with ta.enable_grad():
            assert (x * 2.0).requires_grad
            with ta.no_grad():
                assert not (x * 2.0).requires_grad
            assert ta.is_grad_enabled()
        assert not ta.is_grad_enabled()
    assert ta.is_grad_enabled()
    with pytest.raises(ZeroDivisionError):
        with ta.no_grad():
            1 / 0
    assert ta.is_grad_enabled()


# Regression (fixed): `@ta.no_grad()` as a decorator (torch's `@torch.no_grad()`, the usual way to mark an evaluate
# function) fails: _GradMode (autograd.py) has no __call__, so TypeError "'_GradMode' object is not callable".
def test_no_grad_works_as_a_decorator_like_torch():
    x = ta.tensor(np.ones(2), requires_grad=True)

    @ta.no_grad()
    def evaluate(t):
        return t * 2.0

    out = evaluate(x)
    assert not out.requires_grad
    assert ta.is_grad_enabled()


def test_grad_mode_is_per_thread_like_torch():
    import threading
    seen = []
    with ta.no_grad():
        t = threading.Thread(target=lambda: seen.append(ta.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]


def test_detach_shares_memory_cuts_graph_and_can_require_grad_again():
    x, tx = _pair([1.0, 2.0])
    y = x * 3.0
    d = y.detach()
    assert d.is_leaf and not d.requires_grad and np.shares_memory(d.numpy(), y.numpy())
    d.requires_grad_()
    (d * d).sum().backward()
    np.testing.assert_allclose(d.grad, 2 * np.array([3.0, 6.0]), **F64)
    assert x.grad is None


# Regression (fixed): requires_grad_() on a non-leaf that already requires grad raises RuntimeError; torch allows
# requires_grad_(True) there (a no-op) and refuses only requires_grad_(False) on a non-leaf.
# Cause: Tensor.requires_grad_ (tensor.py) raises for any `_node is not None`, whatever the flag.
def test_requires_grad_true_on_a_non_leaf_is_a_no_op_like_torch():
    x, tx = _pair([1.0, 2.0])
    ty = (tx * 2.0).requires_grad_()
    assert ty.requires_grad
    y = (x * 2.0).requires_grad_()
    assert y.requires_grad
    with pytest.raises(RuntimeError):
        (tx * 2.0).requires_grad_(False)
    with pytest.raises(RuntimeError):
        (x * 2.0).requires_grad_(False)


# Regression (fixed): an explicit integer dtype skipped the check: ta.tensor([1, 2, 3], dtype=np.int64,
# requires_grad=True) makes an int64 tensor that requires grad (torch raises "Only Tensors of floating point ... can
# require gradients"). Its gradient is then cast to int64, silently truncating: d(sum(0.4*x))/dx = 0.4 arrives as 0.
# Cause: Tensor.__init__ (tensor.py) tests `array.dtype.kind in "iub" and requires_grad` in an `elif` after `if dtype is
# not None`, so the check never runs when a dtype is given.
def test_integer_dtype_given_explicitly_cannot_require_grad():
    with pytest.raises(RuntimeError):
        torch.tensor([1, 2, 3], dtype=torch.int64, requires_grad=True)
    with pytest.raises(TypeError, match="floating"):
        ta.tensor([1, 2, 3], dtype=np.int64, requires_grad=True)
    with pytest.raises(TypeError, match="floating"):
        ta.Tensor(np.array([1.5, 2.5]), dtype=np.int32, requires_grad=True)


def test_integer_tensors_requiring_grad_refused_without_dtype():
    with pytest.raises(TypeError, match="floating"):
        ta.tensor([1, 2, 3], requires_grad=True)
    with pytest.raises(TypeError, match="float"):
        ta.Tensor(np.arange(3)).requires_grad_()
    with pytest.raises(TypeError, match="floating"):
        ta.Tensor(np.array([True, False]), requires_grad=True)


# --- graphs and tensors outliving their arena -------------------------------------------------------------

def test_backward_after_the_arena_closed_raises_stale_tensor_error():
    x = ta.tensor(np.arange(1.0, 5.0), requires_grad=True)
    with ta.Arena():
        loss = (x.exp() * 2.0).sum()
    with pytest.raises(ta.StaleTensorError, match="closed"):
        loss.backward()


# Regression (fixed): backward(grad) on an output whose arena has closed does not check staleness: the saved arrays of
# the graph (exp's output here) were returned to the pool and reused by the next arena, and backward silently reads
# them: x.grad comes out as whatever the next step wrote there (all 1.0 here) instead of exp(x) or a StaleTensorError.
# Cause: autograd.backward touches root.data (the generation check) only when grad is None; with a grad it reads
# root.shape (the raw _data) and the closures read their captured arrays unchecked.
def test_backward_with_explicit_grad_after_the_arena_closed_is_not_silent():
    x = ta.tensor(np.arange(1.0, 5.0), requires_grad=True)
    with ta.Arena():
        y = x.exp() * 1.0
    with ta.Arena():  # the next step reuses the freed blocks
        for _ in range(8):
            ta.ops.add(ta.tensor(np.zeros(4)), 0.0)
        try:
            y.backward(np.ones(4))
        except ta.StaleTensorError:
            return  # a clear error is an acceptable outcome
    np.testing.assert_allclose(x.grad, np.exp(np.arange(1.0, 5.0)), **F64)


# Regression (fixed): ta.Tensor(t) of a tensor that lives in an arena wraps the same memory but forgets the arena: the
# new tensor has _arena None, so after the arena closes it reads whatever the next step wrote there (9.0 here) instead
# of raising StaleTensorError. torch.Tensor(t)/torch.as_tensor(t) share storage that stays valid. Cause: Tensor.__init__
# (tensor.py) does np.asarray(data.data) and sets self._arena = None unconditionally; it should take
# data._arena/_generation when the array is shared (as _make's view_of does), or copy.
def test_tensor_wrapping_an_arena_tensor_keeps_the_stale_check():
    x = ta.tensor(np.arange(1.0, 5.0))
    with ta.Arena():
        y = x * 2.0
        wrapped = ta.Tensor(y)
        np.testing.assert_array_equal(wrapped.numpy(), [2.0, 4.0, 6.0, 8.0])
    with ta.Arena():  # the next step reuses the freed blocks
        for _ in range(5):
            ta.ops.add(ta.tensor(np.full(4, 9.0)), 0.0)
        try:
            values = wrapped.numpy()
        except ta.StaleTensorError:
            return
    np.testing.assert_array_equal(values, [2.0, 4.0, 6.0, 8.0])


def test_backward_after_arena_reset_raises_stale_tensor_error():
    x = ta.tensor(np.arange(1.0, 5.0), requires_grad=True)
    with ta.Arena() as arena:
        loss = (x * x).sum()
        arena.reset()
        with pytest.raises(ta.StaleTensorError, match="reset"):
            loss.backward()


def test_tensor_kept_across_steps_raises_on_use_and_leaf_grad_persists():
    w = Parameter(np.array([1.0, 2.0]))
    kept = None
    for step in range(2):
        with ta.Arena():
            if kept is not None:
                with pytest.raises(ta.StaleTensorError, match="closed"):
                    kept + 1.0
            out = w * 3.0
            out.sum().backward()
            kept = out
    np.testing.assert_array_equal(w.grad, [6.0, 6.0])  # two steps accumulated, grad outlives both arenas
    with pytest.raises(ta.StaleTensorError):
        kept.numpy()
    assert "stale" in repr(kept)


# --- indexing with repeated indices -----------------------------------------------------------------------

@pytest.mark.parametrize("index", [
    [0, 0, 2, 0],
    np.array([[1, 1], [3, 1]]),
    (slice(None), [2, 2, 0]),
    ([0, 0, 3], [1, 1, 2]),
    (Ellipsis, [-1, -1]),
    np.array([-1, 3, 3]),
], ids=["list", "2d-array", "cols", "pairs", "ellipsis", "negative"])
def test_getitem_repeated_indices_scatter_add_like_torch(index):
    a = _rand(3, (4, 3))
    x, tx = _pair(a)
    tindex = tuple(torch.tensor(i) if isinstance(i, (list, np.ndarray)) else i for i in index) \
        if isinstance(index, tuple) else torch.tensor(np.asarray(index))
    y, ty = x[index], tx[tindex]
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **F64)
    w = _rand(4, y.shape)
    (y * ta.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


def test_getitem_index_tensor_and_bool_mask_grads_like_torch():
    a = _rand(5, (4, 3))
    x, tx = _pair(a)
    ids = ta.Tensor(np.array([2, 2, 2]))
    mask = a > 0
    loss = (x[ids] * 2.0).sum() + (x[mask] * 3.0).sum() + x[1, None].sum() + x[::-2].sum()
    tloss = (tx[torch.tensor([2, 2, 2])] * 2.0).sum() + (tx[torch.tensor(mask)] * 3.0).sum() \
        + tx[1, None].sum() + tx.flip(0)[::2].flip(0).sum()
    # torch has no negative steps: x[::-2] of 4 rows is rows 3, 1
    loss.backward()
    tloss.backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


def test_slices_of_one_parent_overlapping_accumulate():
    x, tx = _pair(_rand(6, (5,)))
    loss = (x[0:3] * x[2:5]).sum() + x[2].sum() * 4.0
    tloss = (tx[0:3] * tx[2:5]).sum() + tx[2] * 4.0
    loss.backward()
    tloss.backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


# --- broadcasting gradients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [
    ((3, 1), (1, 4)), ((2, 3, 4), ()), ((), (2, 3)), ((1,), (2, 3)), ((2, 1, 4), (3, 1)),
    ((1, 1), (1,)), ((0, 3), (3,)), ((4, 1, 1), (1, 5, 1)),
])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "where"])
def test_broadcast_gradients_reduce_to_each_input_shape(sa, sb, op):
    a = np.abs(_rand(7, sa)) + 0.5
    b = np.abs(_rand(8, sb)) + 0.5
    x, tx = _pair(a)
    y, ty = _pair(b)
    if op == "where":
        shape = np.broadcast_shapes(sa, sb)
        cond = _rand(9, shape) > 0
        out, tout = ta.where(cond, x, y), torch.where(torch.tensor(cond), tx, ty)
    else:
        fn = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q, "mul": lambda p, q: p * q,
              "div": lambda p, q: p / q, "pow": lambda p, q: p ** q}[op]
        out, tout = fn(x, y), fn(tx, ty)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **F64)
    w = _rand(10, out.shape)
    (out * ta.tensor(w)).sum().backward()
    (tout * torch.tensor(w)).sum().backward()
    assert x.grad.shape == sa and y.grad.shape == sb
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(y.grad, ty.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_broadcast_with_python_scalar_and_expand_and_0d_reductions():
    x, tx = _pair(_rand(11, (2, 1, 3)))
    s, ts = _pair(1.5)
    out = (2.0 - x) * s + x.expand(2, 4, 3) / 3.0
    tout = (2.0 - tx) * ts + tx.expand(2, 4, 3) / 3.0
    (out.sum(dim=(0, 2)) * ta.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    (tout.sum(dim=(0, 2)) * torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)
    np.testing.assert_allclose(s.grad, ts.grad.numpy(), **F64)
    assert s.grad.shape == ()


def test_reductions_on_0d_tensors_like_torch():
    x, tx = _pair(2.5)
    out = x.sum(0) * 2.0 + x.mean(-1) + x.max(0).values * 3.0
    tout = tx.sum(0) * 2.0 + tx.mean(-1) + tx.max(0).values * 3.0
    out.backward()
    tout.backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


# --- max ties ----------------------------------------------------------------------------------------------

def test_max_over_all_elements_splits_ties_evenly_like_torch():
    a = np.array([[1.0, 3.0, 3.0], [3.0, 0.0, 2.0]])
    x, tx = _pair(a)
    (ta.max(x) * 6.0).backward()
    (torch.max(tx) * 6.0).backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)
    np.testing.assert_allclose(x.grad, [[0, 2, 2], [2, 0, 0]], **F64)


def test_max_along_dim_with_ties_sends_grad_to_the_first_like_torch():
    a = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    x, tx = _pair(a)
    r, tr = ta.max(x, 1), torch.max(tx, 1)
    np.testing.assert_array_equal(r.indices.numpy(), tr.indices.numpy())
    (r.values * ta.tensor([1.0, 2.0])).sum().backward()
    (tr.values * torch.tensor([1.0, 2.0], dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


def test_max_keepdim_and_negative_dim_grads_like_torch():
    a = _rand(12, (2, 3, 4)).round(0)  # rounding makes ties
    x, tx = _pair(a)
    r, tr = ta.max(x, -2, keepdim=True), torch.max(tx, -2, keepdim=True)
    assert r.values.shape == tuple(tr.values.shape)
    w = _rand(13, r.values.shape)
    (r.values * ta.tensor(w)).sum().backward()
    (tr.values * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


# --- where and masks ---------------------------------------------------------------------------------------

def test_where_does_not_leak_nan_from_the_unselected_branch_forward():
    # The classic torch trap: where(x > 0, log(x), 0) is fine in forward; its gradient at x < 0 is 0 from
    # where and then 0 / x from log's backward, so finite (x != 0).
    a = np.array([-2.0, 0.5, 3.0])
    x, tx = _pair(a)
    with np.errstate(invalid="ignore"):  # log of a negative is nan, as in torch
        out = ta.where(a > 0, ta.log(x), 0.0)
    tout = torch.where(torch.tensor(a > 0), torch.log(tx), 0.0)
    out.sum().backward()
    tout.sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **F64)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


def test_where_with_scalar_branches_and_tensor_condition():
    a = _rand(14, (3, 4))
    x, tx = _pair(a)
    cond = ta.Tensor(a > 0.2)
    out = ta.where(cond, x * 2.0, -1.0) + ta.where(cond, 0.5, x)
    tc = torch.tensor(a > 0.2)
    tout = torch.where(tc, tx * 2.0, -1.0) + torch.where(tc, 0.5, tx)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **F64)
    out.sum().backward()
    tout.sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


# --- inf / nan from division and log ------------------------------------------------------------------------

def test_conftest_makes_numpy_raise_so_log0_is_a_floating_point_error():
    # tests/conftest.py sets np.seterr(all="raise"): under it, log(0) raising is the process-wide setting's doing.
    assert np.geterr()["divide"] == "raise"
    with pytest.raises(FloatingPointError):
        ta.log(ta.tensor([0.0, 1.0]))


def test_division_by_zero_and_log0_give_torch_inf_nan_when_numpy_does_not_raise():
    a = np.array([0.0, 1.0, -1.0, 0.0])
    b = np.array([0.0, 0.0, 0.0, 2.0])
    x, tx = _pair(a)
    y, ty = _pair(b)
    with np.errstate(all="ignore"):
        out = x / y + ta.log(x * x) + ta.sqrt(x * x)
        (out * ta.tensor([1.0, 1.0, 1.0, 1.0])).sum().backward()
    tout = tx / ty + torch.log(tx * tx) + torch.sqrt(tx * tx)
    tout.sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(y.grad, ty.grad.numpy(), rtol=1e-12, equal_nan=True)


def test_relu_and_pow_at_zero_gradients_like_torch():
    a = np.array([0.0, 2.0, -1.0])
    x, tx = _pair(a)
    out = ta.ops.relu(x).sum() + (x ** 2.0).sum() + (x ** 3.0).sum()
    tout = torch.relu(tx).sum() + (tx ** 2.0).sum() + (tx ** 3.0).sum()
    out.backward()
    tout.backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F64)


# --- dtype mixes --------------------------------------------------------------------------------------------

def test_float32_float64_mix_output_and_grad_dtypes_like_torch():
    x, tx = _pair(_rand(15, (3,)), np.float32)
    y, ty = _pair(_rand(16, (3,)), np.float64)
    out, tout = x * y + x, tx * ty + tx
    assert out.dtype == np.float64 and tout.dtype == torch.float64
    out.sum().backward()
    tout.sum().backward()
    assert x.grad.dtype == np.float32 and y.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), **F32)
    np.testing.assert_allclose(y.grad, ty.grad.numpy(), **F64)


# Regression (fixed): an integer tensor in arithmetic with a float32 tensor promotes to float64 (np.result_type(int64,
# float32)); torch gives float32 (a float tensor wins over an integer one). Every op downstream then runs in float64:
# twice the memory, and a float32 matmul after it raises the mixed-dtype TypeError. cat/stack already follow torch
# (shape._promoted_dtype); arith does not. Cause: ops/_base.py result_dtype uses np.result_type.
def test_integer_tensor_times_float32_tensor_stays_float32_like_torch():
    x, tx = _pair([1.0, 2.0, 3.0], np.float32)
    i = np.array([1, 2, 3])
    out, tout = x * ta.Tensor(i), tx * torch.tensor(i)
    assert tout.dtype == torch.float32
    assert out.dtype == np.float32


# Regression (fixed): a 0-d float64 tensor combined with a float32 tensor promotes the result to float64; torch's
# promotion gives float32 (a zero-dim tensor does not promote a dimensioned one of the same category). A loss scale or a
# learning-rate tensor kept as float64 thus turns a float32 model's gradients float64 from there on. Cause: ops/_base.py
# result_dtype (np.result_type) ignores dimensionality.
def test_zero_dim_float64_tensor_does_not_promote_float32_like_torch():
    x, tx = _pair([1.0, 2.0], np.float32)
    scale = ta.Tensor(np.array(2.0))
    tscale = torch.tensor(2.0, dtype=torch.float64)
    assert (tx * tscale).dtype == torch.float32
    assert (x * scale).dtype == np.float32


def test_float16_input_is_converted_and_named():
    x = ta.tensor(np.array([1.0, 2.0], np.float16), requires_grad=True)
    assert x.dtype == np.float32
    assert "float16" in x.dtype_description()
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])


# Regression (fixed): a float16 tensor can be made with requires_grad=True (ta.tensor(..., dtype=np.float16,
# requires_grad=True)) and runs backward, but requires_grad_() on the same tensor raises TypeError "only
# float32/float64": the two entry points disagree; torch allows both. Cause: tensor.py requires_grad_ checks
# SUPPORTED_FLOATS while __init__ with an explicit dtype checks nothing.
def test_float16_requires_grad_is_consistent_between_constructor_and_requires_grad_():
    a = np.array([1.0, 2.0], np.float16)
    x = ta.tensor(a, dtype=np.float16, requires_grad=True)
    (x * x).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    (tx * tx).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-3)
    y = ta.tensor(a, dtype=np.float16)
    y.requires_grad_()  # torch: fine
    assert y.requires_grad


# --- deep graphs --------------------------------------------------------------------------------------------

def test_ten_thousand_chained_ops_backward_without_recursion_error():
    x, tx = _pair([1.0, -0.5])
    y = x
    for _ in range(10_000):
        y = y * 1.0001 + 0.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad, np.full(2, 1.0001 ** 10_000), rtol=1e-9)
    del y  # dropping a 20,000-node chain must not overflow the C stack either


def test_deep_graph_dropped_without_backward_frees_its_saved_arrays():
    import weakref
    x = ta.tensor(np.ones(2), requires_grad=True)
    y = x.exp()
    saved = weakref.ref(y._data)  # exp's backward keeps its output: alive exactly as long as the graph
    for _ in range(20_000):
        y = y + 1.0
    assert saved() is not None
    del y  # no gc.collect(): reference counting alone must free the chain, without a C-stack overflow
    assert saved() is None


def test_wide_diamond_graph_matches_torch():
    x, tx = _pair(_rand(17, (4,)))
    hs, ths = [x], [tx]
    for k in range(30):  # each level reads both previous ones: shared subgraphs, many paths
        prev2 = hs[-2] if len(hs) > 1 else hs[-1]
        tprev2 = ths[-2] if len(ths) > 1 else ths[-1]
        hs.append(ta.tanh(hs[-1] * 0.9 + prev2 * 0.1))
        ths.append(torch.tanh(ths[-1] * 0.9 + tprev2 * 0.1))
    sum(h.sum() for h in hs[1:]).backward()
    sum(h.sum() for h in ths[1:]).backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-12)


# --- shape-mismatch errors name both shapes -----------------------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
    lambda a, b: ta.pow(a, b), lambda a, b: ta.where(np.ones((2, 3), bool), a, b),
    lambda a, b: a @ b, lambda a, b: ta.ops.mse_loss(a, b), lambda a, b: ta.cat([a, b], 1),
    lambda a, b: ta.stack([a, b]),
], ids=["add", "sub", "mul", "div", "pow", "where", "matmul", "mse", "cat", "stack"])
def test_shape_mismatch_errors_name_both_shapes(fn):
    a = ta.tensor(np.ones((2, 3)), requires_grad=True)
    b = ta.tensor(np.ones((4, 2)), requires_grad=True)
    with pytest.raises(ValueError) as info:
        fn(a, b)
    msg = str(info.value)
    assert "(2, 3)" in msg and "(4, 2)" in msg, msg


def test_reshape_and_expand_errors_name_the_shapes():
    a = ta.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 2\)"):
        a.reshape(4, 2)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        a.expand(4, 5)


# --- added with the fixes: in-place operators ----------------------------------------------------------------

def test_inplace_operators_match_torch_under_no_grad_and_return_the_same_tensor():
    a = _rand(20, (2, 3))
    x, tx = _pair(a)
    row = _rand(21, (3,))
    with ta.no_grad(), torch.no_grad():
        for op in (operator.iadd, operator.isub, operator.imul, operator.itruediv):
            assert op(x, ta.tensor(row)) is x
            op(tx, torch.tensor(row))
    np.testing.assert_allclose(x.numpy(), tx.detach().numpy(), **F64)


def test_inplace_on_a_tensor_outside_any_graph_works_with_grad_enabled():
    x = ta.tensor(np.ones(3))
    x += 2.0
    x *= ta.tensor([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(x.numpy(), [3.0, 6.0, 9.0])


def test_inplace_refused_on_a_non_leaf_with_grad_enabled_and_says_what_to_write():
    x = ta.tensor(np.ones(3), requires_grad=True)
    y = x.exp()
    for op, symbol in ((operator.iadd, "+"), (operator.isub, "-"), (operator.imul, "*"), (operator.itruediv, "/")):
        with pytest.raises(RuntimeError, match=f"x = x \\{symbol} y"):
            op(y, 1.0)
    y.sum().backward()  # the refused writes changed nothing exp's backward reads
    np.testing.assert_allclose(x.grad, np.exp(np.ones(3)), **F64)


def test_inplace_dtype_shape_and_read_only_errors_like_torch():
    i = ta.Tensor(np.array([1, 2, 3]))
    with pytest.raises(TypeError, match="int64"):
        i += 2.5  # torch: result type Float can't be cast to Long
    with pytest.raises(TypeError, match="int64"):
        i /= 2  # true division makes a float
    f = ta.tensor(np.ones(3, np.float32))
    f += ta.tensor(np.ones(3), dtype=np.float64)  # a wider float is cast down into f, as in torch
    assert f.dtype == np.float32
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3,\)"):
        f += ta.tensor(np.ones((2, 3)))
    e = ta.tensor(np.ones(3)).expand(2, 3)
    with pytest.raises(RuntimeError, match="read-only"):
        e += 1.0


def test_inplace_on_a_stale_tensor_raises_instead_of_writing_reused_memory():
    with ta.Arena():
        y = ta.tensor(np.ones(4)) * 2.0
    with pytest.raises(ta.StaleTensorError):
        y += 1.0


def test_integer_tensor_with_python_float_is_float32_like_torch():
    i = np.array([1, 2, 3])
    out, tout = ta.Tensor(i) * 2.5, torch.tensor(i) * 2.5
    assert tout.dtype == torch.float32 and out.dtype == np.float32
    np.testing.assert_array_equal(out.numpy(), tout.numpy())  # not truncated to the int64 2
    assert (ta.tensor(np.ones(2, np.float32)) * 2.5).dtype == np.float32  # a Python float stays weak
    assert (ta.Tensor(np.array([True, False])) + 1).dtype == np.int64


# --- added with the fixes: assigning .grad ------------------------------------------------------------------

def test_grad_assignment_refuses_a_wrong_shape_or_a_tensor_naming_both():
    x = ta.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        x.grad = np.ones(2)
    with pytest.raises(TypeError, match="ndarray"):
        x.grad = ta.tensor(np.ones(3))
    x.grad = np.full(3, 2.0)
    (x * 1.0).sum().backward()  # accumulates into the assigned array, as in torch
    np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])


def test_grad_set_to_none_unheld_keeps_reusing_the_buffer():
    import weakref
    x = ta.tensor(np.arange(1.0, 4.0), requires_grad=True)
    (x * 2.0).sum().backward()
    buffer = weakref.ref(x.grad)  # a weakref does not count as holding it
    x.grad = None
    (x * 5.0).sum().backward()
    assert x.grad is buffer(), "no one held the old gradient: the buffer should have been reused"


# --- added with the fixes: retain_graph, retain_grad, grad-mode decorators ----------------------------------

def test_retain_graph_through_linear_softmax_cross_entropy_layer_norm_like_torch():
    import torch.nn.functional as tF
    a, w, b = _rand(30, (4, 5)), _rand(31, (3, 5)), _rand(32, (3,))
    x, tx = _pair(a)
    wt, twt = _pair(w)
    bt, tbt = _pair(b)
    target = np.array([0, 2, 1, 2])
    h = ta.ops.layer_norm(ta.ops.linear(x, wt, bt), (3,))
    th = tF.layer_norm(tF.linear(tx, twt, tbt), (3,))
    loss = ta.ops.cross_entropy(h, target) + (ta.ops.softmax(h, -1) * h).sum()
    tloss = tF.cross_entropy(th, torch.tensor(target)) + (torch.softmax(th, -1) * th).sum()
    for _ in range(2):
        loss.backward(retain_graph=True)
        tloss.backward(retain_graph=True)
    loss.backward()
    tloss.backward()
    for ours, theirs in ((x, tx), (wt, twt), (bt, tbt)):
        np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="second time"):  # the last backward, without retain_graph, freed it
        loss.backward()


def test_retain_grad_accumulates_across_retained_backwards_and_is_a_heap_copy():
    x, tx = _pair([1.0, 2.0])
    with ta.Arena():
        y, ty = x * 3.0, tx * 3.0
        y.retain_grad()
        ty.retain_grad()
        x.retain_grad()  # a leaf: nothing to do, as in torch
        for _ in range(2):
            (y * y).sum().backward(retain_graph=True)
            (ty * ty).sum().backward(retain_graph=True)
        kept = y.grad
    np.testing.assert_allclose(kept, ty.grad.numpy(), **F64)  # still readable: not arena memory
    with pytest.raises(RuntimeError, match="does not require grad"):
        ta.tensor(np.ones(2)).retain_grad()


def test_enable_grad_as_a_decorator_inside_no_grad_and_wraps_keeps_the_name():
    x = ta.tensor(np.ones(2), requires_grad=True)

    @ta.enable_grad()
    def differentiable(t):
        return t * 2.0

    with ta.no_grad():
        assert differentiable(x).requires_grad
        assert not ta.is_grad_enabled()
    assert differentiable.__name__ == "differentiable"


def test_grad_mode_decorator_refuses_a_generator_function():
    with pytest.raises(TypeError, match="generator"):
        @ta.no_grad()
        def batches():
            yield 1


# --- added with the fixes: Tensor(t) and staleness ------------------------------------------------------------

def test_tensor_of_an_arena_tensor_copied_by_a_dtype_change_outlives_the_arena():
    x = ta.tensor(np.arange(1.0, 5.0))
    with ta.Arena():
        y = x * 2.0
        copied = ta.Tensor(y, dtype=np.float32)  # a cast copies onto the heap: nothing to go stale
    np.testing.assert_array_equal(copied.numpy(), [2.0, 4.0, 6.0, 8.0])
    assert ta.Tensor(x)._arena is None
