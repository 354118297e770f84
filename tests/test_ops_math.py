"""Math ops against torch (forward and gradients, float64 and float32) and finite differences.

Random inputs keep away from the points where an op is not smooth (relu at 0, ties at a max,
log/sqrt/pow near 0); those points get their own explicit tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorarena as ta
from tensorarena import kernels
from tensorarena.ops.reduce import MaxResult
from tests.reference import check_finite_differences, check_op

IMPLS = ["fused", "reference"]
KERNEL_OPS = {"gelu", "gelu_tanh", "softmax"}  # ops that run on kernels with reference/fused twins


@pytest.fixture
def restore_kernel_choice():
    # use_reference is process-wide: a using() block overrides it in its own thread but does not undo it
    saved = kernels._force_reference
    yield
    kernels.use_reference(saved)


def with_impls(names):
    """(name, impl) pairs: both implementations for kernel-backed ops, the default for the rest."""
    return [(n, impl) for n in sorted(names) for impl in (IMPLS if n in KERNEL_OPS else ["default"])]


# Deterministic examples: a tolerance test that fails once in a thousand runs helps nobody.
FAST = settings(max_examples=20, deadline=None, database=None, derandomize=True)
DTYPES = [np.float64, np.float32]

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4)
nonscalar_shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)
pair_shapes = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=1, max_side=4)
seeds = st.integers(0, 2**32 - 1)


def normal(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def positive(shape, seed, low=0.5, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, shape)


def away_from_zero(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 2.0, shape)


# name -> (tensorarena fn, torch fn, input generator)
UNARY = {
    "neg": (ta.ops.neg, torch.neg, normal),
    "exp": (ta.ops.exp, torch.exp, normal),
    "log": (ta.ops.log, torch.log, positive),
    "sqrt": (ta.ops.sqrt, torch.sqrt, positive),
    "tanh": (ta.ops.tanh, torch.tanh, normal),
    "relu": (ta.ops.relu, torch.relu, away_from_zero),
    "sigmoid": (ta.ops.sigmoid, torch.sigmoid, normal),
    "gelu": (ta.ops.gelu, F.gelu, normal),
    "gelu_tanh": (lambda x: ta.ops.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"), normal),
    "pow_scalar_2": (lambda x: ta.ops.pow(x, 2), lambda x: torch.pow(x, 2), normal),
    "pow_scalar_3": (lambda x: ta.ops.pow(x, 3), lambda x: torch.pow(x, 3), normal),
    "pow_scalar_frac": (lambda x: ta.ops.pow(x, -1.5), lambda x: torch.pow(x, -1.5), positive),
}

# name -> (tensorarena fn, torch fn, generator of the first input, generator of the second)
BINARY = {
    "add": (ta.ops.add, torch.add, normal, normal),
    "sub": (ta.ops.sub, torch.sub, normal, normal),
    "mul": (ta.ops.mul, torch.mul, normal, normal),
    "div": (ta.ops.div, torch.div, normal, away_from_zero),
    "pow_tensor": (ta.ops.pow, torch.pow, positive, normal),
}


# -- elementwise vs torch --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, impl", with_impls(UNARY))
@FAST
@given(shape=shapes, seed=seeds)
def test_unary_matches_torch(name, impl, dtype, shape, seed):
    fn, ref, gen = UNARY[name]
    with kernels.using(impl):
        check_op(fn, ref, [gen(shape, seed)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BINARY))
@FAST
@given(shapes=pair_shapes, seed=seeds)
def test_binary_broadcasting_matches_torch(name, dtype, shapes, seed):
    fn, ref, gen_a, gen_b = BINARY[name]
    sa, sb = shapes.input_shapes
    check_op(fn, ref, [gen_a(sa, seed), gen_b(sb, seed + 1)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, p=st.floats(-2.5, 2.5))
def test_pow_any_scalar_exponent_matches_torch(dtype, shape, seed, p):
    check_op(lambda x: ta.ops.pow(x, p), lambda x: torch.pow(x, p), [positive(shape, seed)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_at_exactly_zero_has_zero_gradient(dtype):
    x = np.array([-1.0, 0.0, -0.0, 2.0])
    check_op(ta.ops.relu, torch.relu, [x], dtype=dtype)
    t = ta.tensor(x, dtype=dtype, requires_grad=True)
    ta.ops.relu(t).sum().backward()
    np.testing.assert_array_equal(t.grad, [0.0, 0.0, 0.0, 1.0])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_saturating_activations_are_stable_at_large_inputs(dtype, impl, restore_kernel_choice):
    kernels.use_reference(impl == "reference")
    # No overflow/underflow errors (conftest makes NumPy raise), and torch's values and grads.
    # (Points whose result is subnormal are left out: check_op's own `out * weights` would underflow.)
    x = np.array([-1e4, -1000.0, -50.0, -30.0, -1.0, 0.0, 1.0, 30.0, 50.0, 1000.0, 1e4])
    check_op(ta.ops.sigmoid, torch.sigmoid, [x], dtype=dtype)
    check_op(ta.ops.tanh, torch.tanh, [x], dtype=dtype)
    check_op(ta.ops.gelu, F.gelu, [x], dtype=dtype)
    check_op(lambda t: ta.ops.gelu(t, approximate="tanh"), lambda t: F.gelu(t, approximate="tanh"), [x],
             dtype=dtype)
    huge = np.array([-1e30, 1e30]) if dtype == np.float32 else np.array([-1e200, 1e200])
    for form in ("none", "tanh"):
        # torch's gradient overflows to nan out here; ours takes the limits 0 and 1.
        check_op(lambda t: ta.ops.gelu(t, approximate=form), lambda t: F.gelu(t, approximate=form), [huge],
                 dtype=dtype, grad=False)
        t = ta.tensor(huge, dtype=dtype, requires_grad=True)
        ta.ops.gelu(t, approximate=form).sum().backward()
        np.testing.assert_array_equal(t.grad, [0.0, 1.0])


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="'none' or 'tanh'"):
        ta.ops.gelu(ta.tensor([1.0]), approximate="fast")


# -- reductions vs torch -----------------------------------------------------------------------

@st.composite
def shape_and_dims(draw, min_side=1):
    """A shape and a dim argument for it: None, an int, or a non-empty tuple."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=min_side, max_side=4))
    ndim = len(shape)
    dim = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                         hnp.valid_tuple_axes(ndim, min_size=1).map(lambda t: tuple(sorted(t)))))
    return shape, dim


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["sum", "mean"])
@FAST
@given(sd=shape_and_dims(), keepdim=st.booleans(), seed=seeds)
def test_sum_mean_match_torch(name, dtype, sd, keepdim, seed):
    shape, dim = sd
    ours, theirs = getattr(ta.ops, name), getattr(torch, name)
    if dim is None:
        check_op(ours, theirs, [normal(shape, seed)], dtype=dtype)
    else:
        check_op(lambda x: ours(x, dim, keepdim), lambda x: theirs(x, dim, keepdim), [normal(shape, seed)],
                 dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(sd=shape_and_dims(min_side=2), keepdim=st.booleans(), correction=st.sampled_from([0, 1]), seed=seeds)
def test_var_matches_torch(dtype, sd, keepdim, correction, seed):
    shape, dim = sd
    check_op(lambda x: ta.ops.var(x, dim, correction=correction, keepdim=keepdim),
             lambda x: torch.var(x, dim, correction=correction, keepdim=keepdim), [normal(shape, seed)], dtype=dtype)


def test_reductions_follow_torch_on_empty_dims_and_scalars():
    x = normal((2, 3), 0)
    check_op(lambda t: ta.ops.sum(t, ()), lambda t: torch.sum(t, ()), [x])
    # torch's own var(dim=()) backward is wrong (inf), so its gradient is checked against dim=None.
    check_op(lambda t: ta.ops.var(t, ()), lambda t: torch.var(t), [x])
    check_op(lambda t: ta.ops.var(t, ()), lambda t: torch.var(t, ()), [x], grad=False)
    s = np.array(1.5)
    check_op(lambda t: ta.ops.sum(t, 0), lambda t: torch.sum(t, 0), [s])
    check_op(lambda t: ta.ops.mean(t, -1, True), lambda t: torch.mean(t, -1, True), [s])
    check_op(lambda t: ta.ops.max(t, -1).values, lambda t: torch.max(t, -1).values, [s])
    check_op(lambda t: ta.ops.var(t, 0, correction=0), lambda t: torch.var(t, 0, correction=0), [s])
    with pytest.raises(IndexError):
        ta.ops.sum(ta.tensor(1.0), 1)


def test_var_without_degrees_of_freedom_warns_and_gives_nan_like_torch():
    with pytest.warns(RuntimeWarning, match="degrees of freedom"):
        out = ta.ops.var(ta.tensor([3.0], dtype=np.float64))
    assert math.isnan(out.item())


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds)
def test_max_all_matches_torch(dtype, shape, seed):
    check_op(ta.ops.max, torch.max, [normal(shape, seed)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=nonscalar_shapes, data=st.data(), keepdim=st.booleans(), seed=seeds)
def test_max_dim_matches_torch(dtype, shape, data, keepdim, seed):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = normal(shape, seed)
    check_op(lambda t: ta.ops.max(t, dim, keepdim).values, lambda t: torch.max(t, dim, keepdim).values, [x],
             dtype=dtype)
    res = ta.ops.max(ta.tensor(x, dtype=dtype), dim, keepdim)
    ref = torch.max(torch.from_numpy(x.astype(dtype)), dim, keepdim)
    assert isinstance(res, MaxResult)
    assert res.indices.dtype == np.int64 and not res.indices.requires_grad
    np.testing.assert_array_equal(res.indices.numpy(), ref.indices.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_ties_match_torch(dtype):
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0], [3.0, -1.0, 3.0]])
    check_op(ta.ops.max, torch.max, [x], dtype=dtype)  # gradient split evenly among the three 3s
    for dim in (0, 1):
        check_op(lambda t: ta.ops.max(t, dim).values, lambda t: torch.max(t, dim).values, [x], dtype=dtype)
        got = ta.ops.max(ta.tensor(x, dtype=dtype), dim).indices.numpy()
        np.testing.assert_array_equal(got, torch.max(torch.from_numpy(x), dim).indices.numpy())
    t = ta.tensor(x, dtype=dtype, requires_grad=True)
    ta.ops.max(t).backward()
    np.testing.assert_allclose(t.grad, np.where(x == 3.0, 1 / 4, 0.0))


def test_max_rejects_tuple_dims_and_keepdim_without_dim():
    x = ta.tensor(np.ones((2, 3)))
    with pytest.raises(TypeError, match="dim must be an int"):
        ta.ops.max(x, (0, 1))
    with pytest.raises(TypeError, match="keepdim"):
        ta.ops.max(x, keepdim=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, impl", with_impls(["softmax", "log_softmax"]))
@FAST
@given(shape=nonscalar_shapes, data=st.data(), seed=seeds, scale=st.sampled_from([1.0, 8.0]))
def test_softmax_family_matches_torch(name, impl, dtype, shape, data, seed, scale):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    ours, theirs = getattr(ta.ops, name), getattr(torch, name)
    with kernels.using(impl):
        check_op(lambda t: ours(t, dim), lambda t: theirs(t, dim), [scale * normal(shape, seed)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_of_a_scalar_and_of_a_strided_input(dtype):
    check_op(lambda t: ta.ops.softmax(t, 0), lambda t: torch.softmax(t, 0), [np.array(1.5)], dtype=dtype)
    x = normal((4, 3, 5), 2)
    check_op(lambda t: ta.ops.softmax(ta.ops.transpose(t, 0, 2), -1), lambda t: torch.softmax(t.transpose(0, 2), -1),
             [x], dtype=dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_family_is_stable_for_huge_logits(dtype, impl, restore_kernel_choice):
    kernels.use_reference(impl == "reference")
    x = np.array([[1000.0, 0.0, -1000.0], [-1e4, -1e4 + 1.0, -1e4 + 2.0]])
    check_op(lambda t: ta.ops.softmax(t, 1), lambda t: torch.softmax(t, 1), [x], dtype=dtype)
    check_op(lambda t: ta.ops.log_softmax(t, 1), lambda t: torch.log_softmax(t, 1), [x], dtype=dtype)


# -- matmul and linear vs torch ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shapes=hnp.mutually_broadcastable_shapes(signature="(m?,n),(n,p?)->(m?,p?)", max_dims=3, max_side=4),
       seed=seeds)
def test_matmul_matches_torch(dtype, shapes, seed):
    sa, sb = shapes.input_shapes
    check_op(ta.ops.matmul, torch.matmul, [normal(sa, seed), normal(sb, seed + 1)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(lead=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4), n_in=st.integers(1, 5),
       n_out=st.integers(1, 5), bias=st.booleans(), seed=seeds)
def test_linear_matches_torch(dtype, lead, n_in, n_out, bias, seed):
    inputs = [normal(lead + (n_in,), seed), normal((n_out, n_in), seed + 1)]
    if bias:
        inputs.append(normal((n_out,), seed + 2))
    check_op(ta.ops.linear, F.linear, inputs, dtype=dtype)


def test_matmul_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError) as err:
        ta.ops.matmul(ta.tensor(np.ones((3, 4))), ta.tensor(np.ones((5, 2))))
    assert "(3, 4)" in str(err.value) and "(5, 2)" in str(err.value)


def test_linear_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError) as err:
        ta.ops.linear(ta.tensor(np.ones((3, 4))), ta.tensor(np.ones((5, 2))))
    assert "(3, 4)" in str(err.value) and "(5, 2)" in str(err.value)


# -- finite differences --------------------------------------------------------------------------

FD_CASES = {
    **{name: (fn, [gen((2, 3), 7)]) for name, (fn, _, gen) in UNARY.items()},
    **{name: (fn, [ga((2, 3), 7), gb((3,), 8)]) for name, (fn, _, ga, gb) in BINARY.items()},
    "sum": (lambda x: ta.ops.sum(x, 1), [normal((2, 3), 7)]),
    "mean": (lambda x: ta.ops.mean(x, (0, 2), keepdim=True), [normal((2, 3, 2), 7)]),
    "max_all": (ta.ops.max, [normal((2, 3), 7)]),
    "max_dim": (lambda x: ta.ops.max(x, 0).values, [normal((2, 3), 7)]),
    "var": (lambda x: ta.ops.var(x, 1), [normal((2, 3), 7)]),
    "var_all": (lambda x: ta.ops.var(x, correction=0), [normal((2, 3), 7)]),
    "softmax": (lambda x: ta.ops.softmax(x, 0), [normal((2, 3), 7)]),
    "log_softmax": (lambda x: ta.ops.log_softmax(x, -1), [normal((2, 3), 7)]),
    "matmul": (ta.ops.matmul, [normal((2, 3), 7), normal((3, 2), 8)]),
    "matmul_batched_1d": (ta.ops.matmul, [normal((2, 1, 3), 7), normal((3,), 8)]),
    "linear": (ta.ops.linear, [normal((2, 3), 7), normal((4, 3), 8), normal((4,), 9)]),
}


@pytest.mark.parametrize("name", sorted(FD_CASES))
def test_gradients_match_finite_differences(name):
    fn, inputs = FD_CASES[name]
    check_finite_differences(fn, inputs)


# -- kernels: erf twins and dispatch -------------------------------------------------------------

def _erf_grid() -> np.ndarray:
    with np.errstate(under="ignore"):
        tiny = np.logspace(-320, -1, 200)
    wide = np.concatenate([np.linspace(-8.0, 8.0, 40001), np.logspace(0, 300, 200), tiny,
                           [0.46875, np.nextafter(0.46875, 1), 4.0, np.nextafter(4.0, 5), 6.0, 27.0,
                            np.finfo(np.float64).max, np.inf]])
    return np.concatenate([wide, -wide, [0.0, -0.0]])


def test_erf_twins_match_math_erf_in_float64():
    x = _erf_grid()
    expected = np.array([math.erf(v) for v in x])
    for impl in ("reference", "fused"):
        fn = kernels.kernel("erf", impl)
        out = np.empty_like(x)
        assert fn(x, out) is out
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-14, err_msg=impl)
        assert np.array_equal(np.signbit(out), np.signbit(x)), f"{impl}: erf is odd, signs (incl. -0.0) must follow x"
    assert np.isnan(kernels.kernel("erf", "reference")(np.array([np.nan]))).all()


def test_erf_twins_agree_in_float32_and_work_in_place():
    x = np.linspace(-6.0, 6.0, 4001).astype(np.float32)
    expected = np.array([math.erf(v) for v in x.astype(np.float64)])
    results = {}
    for impl in ("reference", "fused"):
        out = np.empty_like(x)
        kernels.kernel("erf", impl)(x, out)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=0, atol=2e-7, err_msg=impl)
        inplace = x.copy()
        kernels.kernel("erf", impl)(inplace, inplace)
        np.testing.assert_array_equal(inplace, out)
        results[impl] = out
    np.testing.assert_allclose(results["reference"], results["fused"], rtol=0, atol=2e-7)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_reference_and_fused_routes_agree_and_are_recorded(dtype, approximate, restore_kernel_choice):
    x = normal((64, 33), 3) * 3
    routes = {}
    for impl in IMPLS:
        kernels.use_reference(impl == "reference")
        before = {name: kernels.calls[(name, impl)] for name in ("gelu_forward", "gelu_backward")}
        t = ta.tensor(x, dtype=dtype, requires_grad=True)
        y = ta.ops.gelu(t, approximate=approximate)
        y.sum().backward()
        for name, count in before.items():
            assert kernels.calls[(name, impl)] == count + 1, f"{impl} {name} should have served gelu"
        routes[impl] = (y.numpy(), t.grad.copy())
    tol = dict(rtol=1e-14, atol=1e-15) if dtype == np.float64 else dict(rtol=1e-6, atol=1e-7)
    with np.errstate(under="ignore"):  # rtol * |tiny gelu(-9)| underflowing inside the check is no failure
        np.testing.assert_allclose(routes["reference"][0], routes["fused"][0], **tol)
        np.testing.assert_allclose(routes["reference"][1], routes["fused"][1], **tol)


# -- every op allocates from the current arena ---------------------------------------------------

ARENA_CASES = {
    **{name: (fn, [gen((3, 4), 1)]) for name, (fn, _, gen) in UNARY.items()},
    **{name: (fn, [ga((3, 4), 1), gb((4,), 2)]) for name, (fn, _, ga, gb) in BINARY.items()},
    "sum": (ta.ops.sum, [normal((3, 4), 1)]),
    "mean": (lambda x: ta.ops.mean(x, 0), [normal((3, 4), 1)]),
    "max_all": (ta.ops.max, [normal((3, 4), 1)]),
    "max_dim": (lambda x: ta.ops.max(x, 1), [normal((3, 4), 1)]),
    "var": (lambda x: ta.ops.var(x, 1), [normal((3, 4), 1)]),
    "softmax": (lambda x: ta.ops.softmax(x, -1), [normal((3, 4), 1)]),  # dim is needed (ops.reduce._dim_given)
    "log_softmax": (lambda x: ta.ops.log_softmax(x, -1), [normal((3, 4), 1)]),
    "matmul": (ta.ops.matmul, [normal((3, 4), 1), normal((4, 2), 2)]),
    "linear": (ta.ops.linear, [normal((3, 4), 1), normal((2, 4), 2), normal((2,), 3)]),
}


@pytest.mark.parametrize("name", sorted(ARENA_CASES))
def test_op_outputs_and_gradients_come_from_the_open_arena(name):
    fn, arrays = ARENA_CASES[name]
    inputs = [ta.tensor(a, dtype=np.float64, requires_grad=True) for a in arrays]
    with ta.Arena() as arena:
        out = fn(*inputs)
        outputs = list(out) if isinstance(out, MaxResult) else [out]
        assert arena.stats.allocations > 0
        after_forward = arena.stats.allocations
        ta.ops.sum(outputs[0]).backward()
        assert arena.stats.allocations > after_forward, "backward temporaries belong to the step arena"
    for t in outputs:
        with pytest.raises(ta.StaleTensorError):
            t.data
    for t in inputs:  # leaf gradients are persistent and survive the arena
        assert t.grad is not None and np.isfinite(t.grad).all()
