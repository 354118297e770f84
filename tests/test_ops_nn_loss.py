"""dropout, layer_norm, cross_entropy and mse_loss against torch: forward, gradients, errors, arenas."""

from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import tensorarena as ta
from tensorarena import kernels
from tensorarena.kernels.dropout import keep_mask_reference, keep_threshold
from tensorarena.ops import cross_entropy, dropout, layer_norm, mse_loss
from tensorarena.random import manual_seed
from tests.reference import DTYPES, FAST, check_finite_differences, check_op, randn, seeds

IMPLS = ["fused", "reference"]  # layer_norm and cross_entropy run on kernels with these twins


@pytest.fixture
def restore_kernel_choice():
    # use_reference is process-wide: a using() block overrides it in its own thread but does not undo it
    saved = kernels._force_reference
    yield
    kernels.use_reference(saved)


# -- dropout ---------------------------------------------------------------------------------------

def _documented_keep(seed_rng: np.random.Generator, shape, p) -> np.ndarray:
    seed = seed_rng.integers(0, 2**64, dtype=np.uint64)
    return keep_mask_reference(int(seed), int(np.prod(shape)), keep_threshold(p)).reshape(shape)


def test_dropout_mask_is_the_documented_draw():
    x = ta.tensor(np.ones((50, 40)), dtype=np.float32)
    out = dropout(x, 0.3, rng=np.random.default_rng(5)).numpy()
    keep = _documented_keep(np.random.default_rng(5), (50, 40), 0.3)
    np.testing.assert_array_equal(out != 0, keep)
    np.testing.assert_allclose(out[keep], np.float32(1) / np.float32(0.7))
    # float64 input draws the same seed, so the mask does not depend on precision.
    out64 = dropout(ta.tensor(np.ones((50, 40)), dtype=np.float64), 0.3, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(out64.numpy() != 0, keep)
    assert out64.dtype == np.float64
    # A strided input is masked in C order of its logical shape, as a contiguous copy would be.
    xt = ta.tensor(np.ones((40, 50)), dtype=np.float32).transpose(0, 1)
    np.testing.assert_array_equal(dropout(xt, 0.3, rng=np.random.default_rng(5)).numpy() != 0, keep)


def test_dropout_same_seed_same_mask_and_saved_state_replays():
    x = ta.tensor(randn(0, (8, 16)), dtype=np.float32)
    manual_seed(123)
    a = dropout(x, 0.5).numpy()
    manual_seed(123)
    b = dropout(x, 0.5).numpy()
    np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(9)
    state = rng.bit_generator.state
    c = dropout(x, 0.5, rng=rng).numpy()
    d = dropout(x, 0.5, rng=rng).numpy()
    assert not np.array_equal(c, d)  # the draw advanced the generator
    rng.bit_generator.state = state
    np.testing.assert_array_equal(dropout(x, 0.5, rng=rng).numpy(), c)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_about_1_minus_p_and_scales(p):
    n = 200_000
    x = ta.tensor(np.full(n, 2.0), dtype=np.float64)
    out = dropout(x, p, rng=np.random.default_rng(0)).numpy()
    kept = out != 0
    # 6 standard deviations of a Binomial(n, 1-p) fraction: a false alarm is ~1e-9.
    assert abs(kept.mean() - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(out[kept], 2.0 / (1 - p), rtol=1e-15)
    assert abs(out.mean() - 2.0) < 6 * 2.0 * np.sqrt(p / ((1 - p) * n))  # inverted dropout keeps the mean


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_gradient_is_mask_times_scale(dtype):
    x = ta.tensor(randn(1, (6, 7)), dtype=dtype, requires_grad=True)
    out = dropout(x, 0.4, rng=np.random.default_rng(3))
    w = randn(2, (6, 7))
    (out * ta.tensor(w, dtype=dtype)).sum().backward()
    mask = _documented_keep(np.random.default_rng(3), (6, 7), 0.4) / dtype(0.6)
    np.testing.assert_allclose(x.grad, (w * mask).astype(dtype), rtol=1e-6)
    assert x.grad.dtype == dtype


def test_dropout_keeps_no_mask_for_backward():
    # The mask is recomputed from its seed in backward: only the output is new memory.
    x = ta.tensor(randn(4, (64, 32)), dtype=np.float32, requires_grad=True)
    with ta.Arena() as arena:
        h = x * 1.0
        out = dropout(h, 0.5, rng=np.random.default_rng(0))
        del h
        assert arena.stats.bytes_in_use == out.data.nbytes
        kept = out.numpy() != 0
        out.sum().backward()
    np.testing.assert_array_equal(x.grad, kept * np.float32(2.0))


def test_dropout_identity_cases_and_p_one():
    x = ta.tensor(randn(0, (3, 4)), requires_grad=True)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    out = dropout(x, 1.0)
    np.testing.assert_array_equal(out.numpy(), np.zeros((3, 4)))
    out.sum().backward()
    np.testing.assert_array_equal(x.grad, np.zeros((3, 4)))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            dropout(x, bad)


# -- layer_norm ------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5), seed=seeds, data=st.data())
def test_layer_norm(affine, dtype, impl, shape, seed, data):
    k = data.draw(st.integers(1, len(shape)))
    norm = shape[len(shape) - k:]
    # Over one element x - mean is exactly 0 here, but torch's float32 Welford mean leaves rounding
    # noise that rstd = 1/sqrt(eps) amplifies into its gradients: no reference to compare against.
    assume(dtype == np.float64 or np.prod(norm) > 1)
    inputs = [randn(seed, shape) * 3 + 1]
    if affine:
        inputs += [randn(seed + 1, norm), randn(seed + 2, norm)]
    # Our float32 kernels accumulate the statistics in float64, so torch's float32 is not the truth:
    # over two elements it even breaks the exact antisymmetry of the gradient. Compare to float64.
    with kernels.using(impl):
        check_op(lambda x, *wb: layer_norm(x, norm, *wb), lambda x, *wb: F.layer_norm(x, norm, *wb), inputs,
                 dtype=dtype, torch_dtype=np.float64)


@pytest.mark.parametrize("impl", IMPLS)
def test_layer_norm_int_shape_weight_only_and_finite_differences(impl):
    x, w, b = randn(0, (3, 4)), randn(1, (4,)), randn(2, (4,))
    with kernels.using(impl):
        _layer_norm_small_cases(x, w, b)


def test_layer_norm_strided_input_and_mixed_precision_weight():
    x = randn(0, (5, 4, 3))
    check_op(lambda x: layer_norm(x.transpose(0, 2), (4, 5)), lambda x: F.layer_norm(x.transpose(0, 2), (4, 5)), [x])
    # Mixed precision is refused both ways, as torch's "mixed dtype (CPU)" error (this test once asserted that
    # float64 won, which torch does not do: a float32 batch through a float64 norm widened the model silently).
    x32 = ta.tensor(randn(1, (3, 4)), dtype=np.float32, requires_grad=True)
    w64 = ta.tensor(randn(2, (4,)), dtype=np.float64, requires_grad=True)
    with pytest.raises(TypeError, match="layer_norm: the input is float32 but the weight is float64"):
        layer_norm(x32, 4, w64)
    with pytest.raises(TypeError, match="layer_norm: the input is float64 but the weight is float32"):
        layer_norm(ta.tensor(randn(1, (3, 4)), dtype=np.float64), 4, ta.tensor(randn(2, (4,)), dtype=np.float32))
    with pytest.raises(RuntimeError, match="mixed dtype"):
        F.layer_norm(torch.ones(3, 4), (4,), torch.ones(4, dtype=torch.float64))


def test_layer_norm_writes_parameter_grads_straight_into_their_buffers(monkeypatch):
    direct = {}
    accumulate = ta.Tensor._accumulate_leaf_grad

    def spy(self, g):
        direct[id(self)] = g is self._grad_buffer  # the op wrote the persistent buffer: nothing to copy
        accumulate(self, g)

    monkeypatch.setattr(ta.Tensor, "_accumulate_leaf_grad", spy)
    w, b = (ta.tensor(randn(s, (4,)), dtype=np.float64, requires_grad=True) for s in (1, 2))
    x = ta.tensor(randn(0, (3, 4)), dtype=np.float64, requires_grad=True)
    with ta.Arena():
        layer_norm(x, 4, w, b).sum().backward()
    assert direct[id(w)] and direct[id(b)]
    np.testing.assert_allclose(b.grad, np.full(4, 3.0))


def _layer_norm_small_cases(x, w, b):
    check_op(lambda x, w: layer_norm(x, 4, w), lambda x, w: F.layer_norm(x, (4,), w), [x, w])
    check_op(lambda x, b: layer_norm(x, 4, None, b), lambda x, b: F.layer_norm(x, (4,), None, b), [x, b])
    check_finite_differences(lambda x, w, b: layer_norm(x, (4,), w, b, eps=1e-3), [x, w, b])
    check_finite_differences(lambda x: layer_norm(x, (2, 2), eps=1e-3), [randn(3, (2, 2, 2))])
    one = layer_norm(ta.tensor(randn(0, (3, 1))), 1, ta.tensor(np.ones(1)), ta.tensor(np.full(1, 0.5)))
    np.testing.assert_array_equal(one.numpy(), np.full((3, 1), 0.5))  # one element: x - mean is exactly 0


def test_layer_norm_errors_name_both_shapes():
    x = ta.tensor(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError) as err:
        layer_norm(x, (3,))
    assert "(3,)" in str(err.value) and "(2, 3, 4)" in str(err.value)
    with pytest.raises(ValueError) as err:
        layer_norm(x, 4, weight=ta.tensor(np.ones(5)))
    assert "(5,)" in str(err.value) and "(4,)" in str(err.value)
    with pytest.raises(ValueError) as err:
        layer_norm(x, (3, 4), bias=ta.tensor(np.ones(4)))
    assert "(4,)" in str(err.value) and "(3, 4)" in str(err.value)


# -- cross_entropy ---------------------------------------------------------------------------------

def _ce_case(seed: int, n: int, c: int, extra: tuple, ignore_frac: float, ignore_index: int):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, c) + extra) * 3
    target = rng.integers(0, c, (n,) + extra)
    target[rng.random(target.shape) < ignore_frac] = ignore_index
    target.flat[0] = rng.integers(0, c)  # usually a counted position; all-ignored (nan mean) is fine too
    return logits, target


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(seed=seeds, n=st.integers(1, 5), c=st.integers(1, 6),
       extra=array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3),
       smoothing=st.sampled_from([0.0, 0.1, 0.5, 1.0]), ignore_frac=st.sampled_from([0.0, 0.3]),
       ignore_index=st.sampled_from([-100, 0, 2]))
def test_cross_entropy(reduction, dtype, impl, seed, n, c, extra, smoothing, ignore_frac, ignore_index):
    logits, target = _ce_case(seed, n, c, extra, ignore_frac, ignore_index)
    kw = dict(ignore_index=ignore_index, label_smoothing=smoothing, reduction=reduction)
    with kernels.using(impl):
        check_op(lambda x, t: cross_entropy(x, t, **kw), lambda x, t: F.cross_entropy(x, t, **kw),
                 [logits, target], dtype=dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", [(6, 5), (2, 3, 4, 5)], ids=["2d", "4d"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_layouts_with_ignore(layout, smoothing, reduction, impl, restore_kernel_choice):
    kernels.use_reference(impl == "reference")
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(layout)
    target = rng.integers(0, layout[1], layout[:1] + layout[2:])
    target.flat[::3] = -100
    kw = dict(label_smoothing=smoothing, reduction=reduction)
    check_op(lambda x, t: cross_entropy(x, t, **kw), lambda x, t: F.cross_entropy(x, t, **kw), [logits, target])
    check_op(lambda x, t: cross_entropy(x, t, **kw), lambda x, t: F.cross_entropy(x, t, **kw), [logits, target],
             dtype=np.float32)
    if layout == (6, 5):
        check_finite_differences(lambda x, t: cross_entropy(x, t, **kw), [logits, target])


@pytest.mark.parametrize("impl", IMPLS)
def test_cross_entropy_unbatched_large_logits_and_all_ignored(impl, restore_kernel_choice):
    kernels.use_reference(impl == "reference")
    check_op(lambda x, t: cross_entropy(x, t), lambda x, t: F.cross_entropy(x, t), [randn(0, (5,)), np.array(3)])
    big = np.array([[1000.0, -1000.0, 0.0], [-1e4, 1e4, 5.0]])  # must neither overflow nor underflow-raise
    check_op(lambda x, t: cross_entropy(x, t, label_smoothing=0.1),
             lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), [big, np.array([1, 1])])
    # torch: mean over no counted positions is nan, with a zero gradient; sum is 0.
    for smoothing in (0.0, 0.3):
        kw = dict(label_smoothing=smoothing)
        check_op(lambda x, t: cross_entropy(x, t, **kw), lambda x, t: F.cross_entropy(x, t, **kw),
                 [randn(0, (3, 4)), np.full(3, -100)])
        assert np.isnan(cross_entropy(ta.tensor(randn(0, (3, 4))), np.full(3, -100), **kw).item())
    assert cross_entropy(ta.tensor(randn(0, (3, 4))), np.full(3, -100), reduction="sum").item() == 0.0


def test_cross_entropy_strided_logits_and_narrow_int_targets():
    x = randn(0, (5, 4, 3))  # permuted to (N, C, d) = (3, 5, 4): a non-contiguous view
    t = np.random.default_rng(1).integers(0, 5, (3, 4)).astype(np.int32)
    check_op(lambda x, t: cross_entropy(x.permute(2, 0, 1), t), lambda x, t: F.cross_entropy(x.permute(2, 0, 1), t),
             [x, t.astype(np.int64)])
    ours = ta.tensor(x[:, :, 0].T.copy(), dtype=np.float64)
    expected = F.cross_entropy(torch.from_numpy(x[:, :, 0].T.copy()), torch.from_numpy(t[0].astype(np.int64)))
    np.testing.assert_allclose(cross_entropy(ours, t[0].astype(np.uint8)).item(), expected.item(), rtol=1e-12)


def test_cross_entropy_errors():
    x = ta.tensor(randn(0, (4, 3)), requires_grad=True)
    with pytest.raises(ValueError) as err:
        cross_entropy(x, np.zeros(5, dtype=np.int64))
    assert "(5,)" in str(err.value) and "(4, 3)" in str(err.value)
    with pytest.raises(ValueError) as err:
        cross_entropy(ta.tensor(randn(0, (2, 3, 4))), np.zeros((2, 3), dtype=np.int64))
    assert "(2, 3)" in str(err.value) and "(2, 3, 4)" in str(err.value)
    with pytest.raises(TypeError, match="class indices must be integers"):
        cross_entropy(x, np.zeros(4))
    with pytest.raises(TypeError, match="probability targets are not supported"):
        cross_entropy(x, ta.tensor(np.full((4, 3), 1 / 3)))
    with pytest.raises(IndexError) as err:
        cross_entropy(x, np.array([0, 1, 3, 2]))
    assert "target 3" in str(err.value) and "3 classes" in str(err.value)
    with pytest.raises(IndexError, match="-1"):
        cross_entropy(x, np.array([0, -1, 1, 2]))
    with pytest.raises(ValueError) as err:
        cross_entropy(x, np.zeros(4, dtype=np.int64), reduction="avg")
    assert all(r in str(err.value) for r in ("'mean'", "'sum'", "'none'"))
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(x, np.zeros(4, dtype=np.int64), label_smoothing=1.5)


# -- mse_loss --------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4), seed=seeds)
def test_mse_loss(reduction, dtype, shape, seed):
    # Both arguments are tensors that require grad: the gradient flows to the target too.
    check_op(lambda x, y: mse_loss(x, y, reduction=reduction), lambda x, y: F.mse_loss(x, y, reduction=reduction),
             [randn(seed, shape), randn(seed + 1, shape)], dtype=dtype)


def test_mse_loss_ndarray_target_and_finite_differences():
    y = randn(1, (3, 4))
    check_op(lambda x: mse_loss(x, y), lambda x: F.mse_loss(x, torch.from_numpy(y)), [randn(0, (3, 4))])
    x32 = ta.tensor(randn(0, (3, 4)), dtype=np.float32, requires_grad=True)
    out = mse_loss(x32, y)  # ndarray targets take the input's dtype
    assert out.dtype == np.float32
    out.backward()
    assert x32.grad.dtype == np.float32
    check_finite_differences(lambda x, y: mse_loss(x, y, reduction="sum"), [randn(0, (2, 3)), y[:2, :3]])
    check_finite_differences(lambda x, y: mse_loss(x, y, reduction="none"), [randn(0, (2, 3)), y[:2, :3]])


def test_mse_loss_errors_name_both_shapes():
    x = ta.tensor(np.zeros((4, 1)))
    with pytest.raises(ValueError) as err:
        mse_loss(x, np.zeros(4))  # would silently broadcast to (4, 4) in torch
    assert "(4, 1)" in str(err.value) and "(4,)" in str(err.value)
    with pytest.raises(ValueError, match="'none'"):
        mse_loss(x, np.zeros((4, 1)), reduction="elementwise")


# -- arena lifetime --------------------------------------------------------------------------------

ARENA_OPS = {
    "dropout": lambda x: dropout(x, 0.5, rng=np.random.default_rng(0)),
    "layer_norm": lambda x: layer_norm(x, 4),
    "cross_entropy_none": lambda x: cross_entropy(x.reshape(6, 4), np.arange(6) % 4, reduction="none"),
    "cross_entropy_mean": lambda x: cross_entropy(x.reshape(2, 3, 4).transpose(1, 2), np.zeros((2, 3), np.int64)),
    "mse_loss": lambda x: mse_loss(x, np.ones((2, 3, 4))),
}


@pytest.mark.parametrize("name", list(ARENA_OPS))
def test_outputs_are_arena_allocated(name):
    x = ta.tensor(randn(0, (2, 3, 4)), requires_grad=True)
    with ta.Arena() as arena:
        before = arena.stats.allocations
        out = ARENA_OPS[name](x)
        assert arena.stats.allocations > before
        out.sum().backward()
    with pytest.raises(ta.StaleTensorError):
        out.data
    assert x.grad is not None and np.isfinite(x.grad).all()  # leaf grads outlive the arena
