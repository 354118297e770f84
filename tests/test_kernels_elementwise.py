"""kernels.elementwise (add, bias_add, column_sum): fused twins against the NumPy ones, and the ops' routes."""

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import kernels
from tensorarena.kernels import elementwise, elementwise_fused

DTYPES = [np.float32, np.float64]
SHAPES = [(3, 5), (300, 130)]  # the twins take any size; the dispatchers only 2**15 elements and up


def _arr(rng, shape, dt):
    return rng.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_twins_agree_bit_for_bit_also_in_place(dt, shape):
    rng = np.random.default_rng(0)
    a, b = _arr(rng, shape, dt), _arr(rng, shape, dt)
    ref, ours = np.empty_like(a), np.empty_like(a)
    elementwise.add_reference(a, b, ref)
    elementwise_fused.add_fused(a, b, ours)
    np.testing.assert_array_equal(ours, ref)
    for into_first in (True, False):  # out is a (gradient accumulation) or out is b
        x, y = a.copy(), b.copy()
        elementwise_fused.add_fused(x, y, x if into_first else y)
        np.testing.assert_array_equal(x if into_first else y, ref)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_add_twins_agree_bit_for_bit(dt, shape):
    rng = np.random.default_rng(1)
    x, bias = _arr(rng, shape, dt), _arr(rng, shape[1], dt)
    ref, ours = x.copy(), x.copy()
    elementwise.bias_add_reference(ref, bias)
    elementwise_fused.bias_add_fused(ours, bias)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_column_sum_matches_the_float64_sum(dt, shape):
    rng = np.random.default_rng(2)
    x = _arr(rng, shape, dt) + dt(3)  # an offset: float32 running sums would drift from the exact one
    exact = x.astype(np.float64).sum(axis=0)
    ref, ours = np.empty(shape[1], dt), np.empty(shape[1], dt)
    elementwise.column_sum_reference(x, ref)
    elementwise_fused.column_sum_fused(x, ours)
    np.testing.assert_array_equal(ref, exact.astype(dt))  # the twin rounds the float64 sum once
    tol = 1e-12 if dt == np.float64 else 1e-7
    np.testing.assert_allclose(ours, exact, rtol=tol, atol=tol * np.abs(exact).max())


def test_dispatchers_take_the_kernel_only_for_arrays_that_fit_it():
    rng = np.random.default_rng(3)
    a = _arr(rng, (400, 100), np.float32)
    assert a.size >= elementwise.PARALLEL_MIN
    before = kernels.calls[("add", "fused")]
    out = np.empty_like(a)
    elementwise.add(a, a, out)
    assert kernels.calls[("add", "fused")] == before + 1
    # broadcasting, a transposed view, mixed dtypes, a small array: NumPy's own add, the kernel not called
    row, bt, a64, small = a[:1], np.ascontiguousarray(a.T).T, a.astype(np.float64), a[:10]
    for x, y, o in ((a, row, np.empty_like(a)), (a, bt, np.empty_like(a)), (a, a64, np.empty_like(a64)),
                    (small, small, np.empty_like(small))):
        elementwise.add(x, y, o)
        np.testing.assert_array_equal(o, x + y)
    assert kernels.calls[("add", "fused")] == before + 1
    strided = a[:, ::2]
    s_out = np.empty(50, np.float32)
    elementwise.column_sum(strided, s_out)
    np.testing.assert_allclose(s_out, strided.sum(axis=0), rtol=1e-6)


def test_linear_and_add_ops_run_the_kernels():
    rng = np.random.default_rng(4)
    x = ta.tensor(_arr(rng, (512, 16), np.float32), requires_grad=True)
    layer = ta.nn.Linear(16, 64, rng=rng)  # a (512, 64) output: 2**15 elements, the kernels' smallest
    names = [("bias_add", "fused"), ("column_sum", "fused"), ("add", "fused")]
    before = {k: kernels.calls[k] for k in names}
    y = layer(x)
    (y + y).sum().backward()  # y's two uses: its gradients meet in the accumulation add
    ran = {k: kernels.calls[k] - before[k] for k in names}
    assert ran == {("bias_add", "fused"): 1, ("column_sum", "fused"): 1, ("add", "fused"): 2}
    np.testing.assert_allclose(layer.bias.grad, np.full(64, 2 * 512, np.float32))


def test_bias_gelu_linear_runs_the_bias_kernels():
    from tensorarena.ops import bias_gelu_linear

    rng = np.random.default_rng(5)
    x = ta.tensor(_arr(rng, (1024, 12), np.float32), requires_grad=True)
    bias, weight, out_bias = (ta.tensor(_arr(rng, s, np.float32), requires_grad=True) for s in ((12,), (32, 12), (32,)))
    names = [("bias_add", "fused"), ("column_sum", "fused")]
    before = {k: kernels.calls[k] for k in names}
    bias_gelu_linear(x, bias, weight, out_bias).sum().backward()
    assert {k: kernels.calls[k] - before[k] for k in names} == {("bias_add", "fused"): 1, ("column_sum", "fused"): 1}
    np.testing.assert_allclose(out_bias.grad, np.full(32, 1024, np.float32))
