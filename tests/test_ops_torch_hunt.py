"""Bug hunt: the public tensor ops against torch, forward and gradients, float32 and float64.

Sweeps over indexing (ints, negatives, steps, None/Ellipsis, integer arrays with repeats, boolean masks), shape ops
with negative dims and empty pieces, reductions with dim None/int/negative/tuple and keepdim, where with
broadcasting, pow at base 0, scalar promotion, softmax/log_softmax/cross_entropy/layer_norm edges, and the GELU
gradient at +-inf. Each test compares with torch, or with an exact value or error stated next to it. Tests that
failed mark a bug, now under a "# Regression (fixed):" comment saying what was wrong.

Run: NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_ops_torch_hunt.py

26 of these 174 tests fail on 5b48d7c, before the fixes. With this file copied into a worktree of 5b48d7c
(git worktree add /tmp/old-ops-torch-hunt 5b48d7c), run in /tmp/old-ops-torch-hunt:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_ops_torch_hunt.py`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorarena as ta
from tensorarena import kernels, ops

TOL = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=2e-5, atol=1e-6)}
DTYPES = [np.float64, np.float32]
TORCH = {np.float64: torch.float64, np.float32: torch.float32}


def _rand(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _compare(fn_ta, fn_torch, arrays, dtype=np.float64, seed=0, **tol):
    """fn_ta(*tensors) against fn_torch(*torch tensors): output (shape, dtype, values) and every input's gradient."""
    tol = tol or TOL[dtype]
    xs = [ta.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, dtype=TORCH[dtype], requires_grad=True) for a in arrays]
    out, ref = fn_ta(*xs), fn_torch(*ts)
    assert out.shape == tuple(ref.shape)
    assert out.dtype == np.dtype(str(ref.dtype).replace("torch.", ""))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **tol, err_msg="forward")
    w = _rand(seed + 99, out.shape)
    (out * ta.tensor(w, dtype=dtype)).sum().backward()
    (ref * torch.tensor(w, dtype=ref.dtype)).sum().backward()
    for i, (x, t) in enumerate(zip(xs, ts)):
        gx = x.grad if x.grad is not None else np.zeros(x.shape, dtype)
        gt = t.grad.numpy() if t.grad is not None else np.zeros(x.shape, dtype)
        assert gx.dtype == np.dtype(dtype)
        np.testing.assert_allclose(gx, gt, **tol, err_msg=f"gradient of input {i}")


# -- indexing: every kind of index, gradients with repeats accumulating ------------------------------------------

_A = _rand(1, (4, 5, 6))
INDICES = [
    (1,), (-1,), (slice(None, None, 2),), (slice(1, None, 3), None, Ellipsis), (Ellipsis, 2), (None, 0, slice(None), -2),
    (np.array([0, 0, 3, 1]),), (np.array([0, 0, 3]), slice(None), np.array([1, 1, 5])),
    (slice(None), np.array([[0, 1], [4, 4]])), (np.array([True, False, True, True]),), (_A[..., 0] > 0,),
    (1, np.array([2, 2, 0]), np.array([1, 1, 1])), (np.array([0, 3]), Ellipsis, np.array(1)),
    (slice(None), np.array([1, 1]), slice(1, 3)), (np.array([-1, -4, -1]),), (Ellipsis, np.array([5, 5, -6])),
    (None, np.array([1, 1])), (np.array([[1, 1], [2, 2]]), None), (np.int64(2),), (np.array([], np.int64),),
    ([1, 1, 2],), ([True, False, True, False],), (np.array(2),), (slice(None), [0, 0]), (Ellipsis, None), (),
]


def _torch_index(ix):
    return tuple(torch.from_numpy(i.copy()) if isinstance(i, np.ndarray) else int(i) if isinstance(i, np.integer)
                 else i for i in ix)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ix", INDICES, ids=range(len(INDICES)))
def test_getitem_every_index_kind_forward_and_grad(dtype, ix):
    _compare(lambda x: x[ix], lambda t: t[_torch_index(ix)], [_A], dtype)


def test_getitem_negative_steps_index_tensors_and_zero_d():
    _compare(lambda x: x[2:0:-1, ::-2], lambda t: t[1:3].flip(0).flip(1)[:, ::2], [_A])
    _compare(lambda x: x[ta.Tensor(np.array([2, 2, 0]))], lambda t: t[torch.tensor([2, 2, 0])], [_A])
    _compare(lambda x: x[ta.Tensor(_A[:, :, 0] > 0)], lambda t: t[torch.from_numpy(_A[:, :, 0] > 0)], [_A])
    for ix in [(), None, Ellipsis, True, False]:
        _compare(lambda x: x[ix], lambda t: t[ix], [np.array(1.5)])
    _compare(lambda x: x[np.array([0, 0])], lambda t: t[torch.tensor([0, 0])], [np.zeros((2, 0))])


# -- shape ops with negative dims and empty pieces --------------------------------------------------------------

_B = _rand(2, (2, 1, 3, 1))
SHAPE_CASES = {
    "reshape -1": (lambda x: x.reshape(-1, 3), _B),
    "reshape ()": (lambda x: x.reshape(()), np.array([2.0])),
    "permute negative": (lambda x: x.permute(-1, 0, 2, 1), _B),
    "transpose negative": (lambda x: x.transpose(-1, 0), _B),
    "expand -1 and new dims": (lambda x: x.expand(5, -1, 4, 3, 2), _B),
    "expand to 0": (lambda x: x.expand(2, 0, 3, 1), _B),
    "squeeze -1": (lambda x: x.squeeze(-1), _B),
    "squeeze tuple": (lambda x: x.squeeze((1, -1)), _B),
    "squeeze all": (lambda x: x.squeeze(), _B),
    "squeeze 0-d": (lambda x: x.squeeze(0), np.array(1.0)),
    "unsqueeze -1": (lambda x: x.unsqueeze(-1), _B),
    "unsqueeze -5": (lambda x: x.unsqueeze(-5), _B),
    "flatten 1..2": (lambda x: x.flatten(1, 2), _B),
    "flatten -3..-2": (lambda x: x.flatten(-3, -2), _B),
    "flatten 0-d": (lambda x: x.flatten(), np.array(1.0)),
    "flatten empty": (lambda x: x.flatten(1), np.zeros((2, 0, 3))),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(SHAPE_CASES))
def test_shape_ops_forward_and_grad(dtype, name):
    fn, a = SHAPE_CASES[name]
    _compare(fn, fn, [a], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_stack_negative_dims_and_empty_pieces(dtype):
    c1, c2, c3 = _rand(3, (2, 3)), np.zeros((2, 0)), _rand(4, (2, 4))
    _compare(lambda *x: ops.cat(list(x), -1), lambda *x: torch.cat(list(x), -1), [c1, c2, c3], dtype)
    _compare(lambda x: ops.cat([x, x], 1), lambda x: torch.cat([x, x], 1), [c1], dtype)
    for d in (-1, -3, 1):
        _compare(lambda x, y: ops.stack([x, y], d), lambda x, y: torch.stack([x, y], d), [c1, 2 * c1], dtype)
    _compare(lambda x, y: ops.stack([x, y], 1), lambda x, y: torch.stack([x, y], 1), [c2, c2], dtype)
    _compare(lambda x, y: ops.stack([x, y], -1), lambda x, y: torch.stack([x, y], -1), [np.array(1.0), np.array(2.0)],
             dtype)


# -- reductions ----------------------------------------------------------------------------------------------------

_D = _rand(5, (3, 4, 5))
DIMS = [0, -1, (0, 2), (-1, -3), [1, 2]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", DIMS, ids=str)
def test_sum_mean_var_over_dims(dtype, dim, keepdim):
    for name in ("sum", "mean"):
        _compare(lambda x: getattr(ops, name)(x, dim, keepdim), lambda x: getattr(torch, name)(x, dim, keepdim),
                 [_D], dtype)
    for c in (0, 1, 2):
        _compare(lambda x: ops.var(x, dim, correction=c, keepdim=keepdim),
                 lambda x: torch.var(x, dim, correction=c, keepdim=keepdim), [_D], dtype)


# Regression (fixed): a dim named twice in a reduction (`sum(x, (0, -3))`) was silently reduced once; torch raises
# "dim 0 appears multiple times in the list of dims" (ops/_base.py normalize_axes deduplicated).
@pytest.mark.parametrize("name", ["sum", "mean", "var"])
def test_reduction_over_a_repeated_dim_is_refused_like_torch(name):
    with pytest.raises(RuntimeError, match="multiple times"):
        torch.sum(torch.ones(3, 4), (0, -2))
    with pytest.raises(ValueError, match="dim 0 appears more than once"):
        getattr(ops, name)(ta.tensor(np.ones((3, 4))), (0, -2))


# Regression (fixed): the mean of an empty tensor (or over an empty dim) raised FloatingPointError under
# np.seterr(all="raise") (0 / 0 inside the op); torch gives NaN. var over an empty dim: the same, from its mean.
@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_and_var_of_empty_are_nan_like_torch(dtype):
    z = np.zeros((0, 3))
    _compare(lambda x: ops.mean(x), lambda x: torch.mean(x), [z], dtype, rtol=0, atol=0, equal_nan=True)
    _compare(lambda x: ops.mean(x, 0), lambda x: torch.mean(x, 0), [z], dtype, rtol=0, atol=0, equal_nan=True)
    _compare(lambda x: ops.mean(x, 1), lambda x: torch.mean(x, 1), [z], dtype, rtol=0, atol=0, equal_nan=True)
    with pytest.warns(RuntimeWarning, match="degrees of freedom"):
        out = ops.var(ta.tensor(z, dtype=dtype), 0)
    with pytest.warns(UserWarning, match="degrees of freedom"):
        ref = torch.var(torch.zeros(0, 3, dtype=TORCH[dtype]), 0)
    assert np.isnan(ref.numpy()).all()
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


# Regression (fixed): the sum of a bool tensor was True (NumPy summed into a bool output), torch counts: 2, int64;
# an int32 sum stayed int32 where torch's is int64 (and may overflow).
def test_integer_and_bool_sums_are_int64_like_torch():
    b = np.array([[True, True, False], [True, False, False]])
    for arr in (b, b.astype(np.int32), b.astype(np.uint8), np.array([2**31 - 1, 1], np.int32)):
        for dim in (None, 0, 1):
            ref = torch.sum(torch.from_numpy(arr)) if dim is None or arr.ndim == 1 and dim else \
                torch.sum(torch.from_numpy(arr), dim)
            if arr.ndim == 1 and dim:
                continue
            out = ops.sum(ta.Tensor(arr)) if dim is None else ops.sum(ta.Tensor(arr), dim)
            assert out.dtype == np.int64 and ref.dtype == torch.int64
            np.testing.assert_array_equal(out.numpy(), ref.numpy())


# Regression (fixed): mean of an integer tensor failed inside NumPy ("Cannot cast ufunc 'divide' output"); torch
# refuses it up front, naming the dtype: now a TypeError that says to convert to a float dtype.
def test_mean_of_integer_tensor_is_refused_naming_the_dtype():
    with pytest.raises(RuntimeError, match="could not infer output dtype"):
        torch.mean(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="mean.*int64.*float"):
        ops.mean(ta.Tensor(np.array([1, 2])))


# Regression (fixed): max over an empty tensor raised NumPy's "zero-size array to reduction operation maximum",
# and along an empty dim "attempt to get argmax of an empty sequence"; torch names the op and the dim.
def test_max_of_empty_names_the_problem_like_torch():
    z = ta.tensor(np.zeros((0, 3)))
    with pytest.raises(RuntimeError, match="max.*no elements.*dim"):
        ops.max(z)
    with pytest.raises(IndexError, match="max.*dim 0.*size 0"):
        ops.max(z, 0)
    with pytest.raises(IndexError, match="max.*dim 0.*size 0"):
        ops.max(z, -2)
    out = ops.max(z, 1)  # over a non-empty dim of an empty tensor: empty results, as in torch
    ref = torch.max(torch.zeros(0, 3), 1)
    assert out.values.shape == tuple(ref.values.shape) and out.indices.shape == tuple(ref.indices.shape)


# Regression (fixed): a NumPy integer as the dim of sum/mean/var/squeeze failed with "'numpy.int64' object is not
# iterable" (only Python ints were taken as one dim); torch accepts it, as softmax/max/cat here already did.
@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_integer_dims_like_torch(dtype):
    for name in ("sum", "mean", "var"):
        _compare(lambda x: getattr(ops, name)(x, np.int64(-2)), lambda x: getattr(torch, name)(x, -2), [_D], dtype)
    _compare(lambda x: x.squeeze(np.int64(1)), lambda x: x.squeeze(1), [_B], dtype)
    _compare(lambda x: ops.sum(x, np.int32(0)), lambda x: torch.sum(x, 0), [np.array(1.5)], dtype)


# -- softmax family -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_softmax_log_softmax_every_dim(impl, dtype, dim):
    with kernels.using(impl):
        for name in ("softmax", "log_softmax"):
            _compare(lambda x: getattr(ops, name)(x, dim), lambda x: getattr(torch, name)(x, dim), [3 * _D], dtype)


# Regression (fixed): log_softmax of a 0-d tensor failed with "not enough values to unpack"; torch gives 0 (and
# softmax of it 1, which already worked), and over an empty dim it failed in NumPy's max where torch returns the
# empty result.
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_of_scalar_and_over_an_empty_dim_like_torch(dtype):
    for d in (0, -1):
        _compare(lambda x: ops.log_softmax(x, d), lambda x: torch.log_softmax(x, d), [np.array(1.5)], dtype)
        _compare(lambda x: ops.softmax(x, d), lambda x: torch.softmax(x, d), [np.array(1.5)], dtype)
    for shape, d in (((3, 0), 1), ((3, 0), -1), ((0, 3), 1), ((2, 0, 3), 1)):
        _compare(lambda x: ops.log_softmax(x, d), lambda x: torch.log_softmax(x, d), [np.zeros(shape)], dtype)
        _compare(lambda x: ops.softmax(x, d), lambda x: torch.softmax(x, d), [np.zeros(shape)], dtype)
    with pytest.raises(IndexError):
        ops.log_softmax(ta.tensor(1.5), 1)


# -- elementwise arithmetic: promotion, true division, pow ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_reflected_operators_with_python_and_numpy_scalars(dtype):
    d = _D + 5.0
    _compare(lambda x: 2.0 - x + 3.0 / x + 2.0 ** x + 2 * x, lambda x: 2.0 - x + 3.0 / x + 2.0 ** x + 2 * x, [d], dtype)
    # NumPy scalars on the left defer to Tensor (its __array_priority__) and do not promote a float32 tensor
    _compare(lambda x: np.float64(2.0) - x + np.float64(3.0) / x + np.float64(2.0) ** x + np.float32(2) * x,
             lambda x: 2.0 - x + 3.0 / x + 2.0 ** x + 2.0 * x, [d], dtype)


# Regression (fixed): `/` of integer tensors (int / int, int / 2, 2 / int) failed inside NumPy ("Cannot cast ufunc
# 'divide' output from float64 to int64"); torch's `/` is true division and gives float32.
def test_integer_true_division_gives_float32_like_torch():
    i, ti = ta.Tensor(np.array([1, 2, 7])), torch.tensor([1, 2, 7])
    j, tj = ta.Tensor(np.array([2, 4, 2], np.int32)), torch.tensor([2, 4, 2], dtype=torch.int32)
    for ours, theirs in [(i / j, ti / tj), (i / 2, ti / 2), (2 / i, 2 / ti), (ops.div(i, i), ti / ti),
                         (i / ta.Tensor(np.array(True)), ti / torch.tensor(True))]:
        assert ours.dtype == np.float32 and theirs.dtype == torch.float32
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


# Regression (fixed): an integer tensor to a float power (`i ** 0.5`) failed inside NumPy (cast to int64); torch
# gives float32. `i ** 2` stays int64 as in torch; `i ** 2.0` is float32 (a Python float is a higher category).
def test_integer_tensor_powers_follow_torch_dtypes():
    i, ti = ta.Tensor(np.array([1, 2, 3])), torch.tensor([1, 2, 3])
    for p in (0.5, 2.0, 2, 0, 3, True):
        ours, theirs = i ** p, ti ** p
        assert ours.dtype == np.dtype(str(theirs.dtype).replace("torch.", "")), p
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="negative integer powers"):
        i ** -1


# Regression (fixed 2026-12-07): an integer tensor to a tensor of negative integer exponents raised NumPy's own
# "Integers to negative integer powers are not allowed"; torch computes it (1 for base 1, +-1 for base -1 by the
# exponent's parity, 0 otherwise), as it does for a Python int to such a tensor. Only a negative int *scalar*
# exponent is refused by torch, above. This test failed before ops.arith._integer_power.
def test_integer_tensor_to_negative_integer_tensor_exponents_as_torch():
    base = np.array([0, 1, -1, -1, 2, -2, 5, 7])
    exponent = np.array([-1, -3, -2, -3, -1, -1, 0, 2])
    cases = [(ta.Tensor(base) ** ta.Tensor(exponent), torch.tensor(base) ** torch.tensor(exponent)),
             (ta.Tensor(base[:, None]) ** ta.Tensor(exponent), torch.tensor(base[:, None]) ** torch.tensor(exponent)),
             (3 ** ta.Tensor(exponent), 3 ** torch.tensor(exponent)),
             ((-1) ** ta.Tensor(exponent), (-1) ** torch.tensor(exponent)),
             (ta.Tensor(base.astype(np.int32)) ** ta.Tensor(np.int32(-1)),
              torch.tensor(base.astype(np.int32)) ** torch.tensor(-1, dtype=torch.int32)),
             (ta.Tensor(np.array([0, 1, 255], np.uint8)) ** ta.Tensor(np.array([-1, -1, -1])),
              torch.tensor([0, 1, 255], dtype=torch.uint8) ** torch.tensor([-1, -1, -1]))]
    for ours, theirs in cases:
        assert ours.dtype == np.dtype(str(theirs.dtype).replace("torch.", ""))
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


# Regression (fixed): x ** 0 at x = 0 gave a NaN gradient (0 * 0**-1 = 0 * inf), and FloatingPointError under
# np.seterr(all="raise"); torch defines the gradient of x ** 0 as 0 everywhere. The same for a tensor exponent of 0.
@pytest.mark.parametrize("dtype", DTYPES)
def test_pow_with_zero_exponent_has_zero_gradient_at_zero_like_torch(dtype):
    x = np.array([0.0, -2.0, 3.0, 0.0])
    for p in (0, 0.0, 2, 3.0, 1):
        _compare(lambda t: t ** p, lambda t: t ** p, [x], dtype)
    e = np.array([0.0, 0.0, 2.0, 1.0])  # the exponent's gradient at base 0 (exponent >= 0) is 0, as torch's
    _compare(lambda a, b: a ** b, lambda a, b: a ** b, [x, e], dtype, rtol=1e-6, atol=0, equal_nan=True)
    _compare(lambda b: 2.0 ** b, lambda b: 2.0 ** b, [e], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pow_negative_bases_where_defined(dtype):
    # negative base, integral exponents (also as tensors): finite, as torch
    x = np.array([-2.0, -0.5, 1.5, -3.0])
    for p in (2, 3, -1, -2.0):
        _compare(lambda t: t ** p, lambda t: t ** p, [x], dtype)
    e = np.array([2.0, 3.0, -1.0, 1.0])
    with np.errstate(invalid="ignore"):  # log(negative) in the exponent's gradient is NaN, as torch's
        _compare(lambda a, b: a ** b, lambda a, b: a ** b, [x, e], dtype, rtol=1e-6, atol=1e-7, equal_nan=True)


# -- where --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_where_broadcasting_forward_and_grad(dtype):
    cond = _rand(6, (3, 1, 4)) > 0
    tc = torch.from_numpy(cond)
    _compare(lambda x, y: ops.where(cond, x, y), lambda x, y: torch.where(tc, x, y), [_rand(7, (1, 5, 1)),
                                                                                     _rand(8, (4,))], dtype)
    _compare(lambda x, y: ops.where(cond, x, y), lambda x, y: torch.where(tc, x, y), [np.array(1.0), np.array(2.0)],
             dtype)
    _compare(lambda x, y: ops.where(np.zeros((0, 4), bool), x, y),
             lambda x, y: torch.where(torch.zeros((0, 4), dtype=torch.bool), x, y), [_rand(9, (4,)), np.zeros((0, 1))],
             dtype)


# Regression (fixed): where promoted with NumPy's rule: (float32 tensor, 0-d float64 tensor) gave float64, (int64,
# float32) float64 and two Python floats float64; torch gives float32 in each (as the arithmetic ops already did).
def test_where_dtypes_follow_torch_promotion():
    c, tc = np.array([True, False]), torch.tensor([True, False])
    f32, i64 = ta.tensor([1.0, 2.0]), ta.Tensor(np.array([1, 2]))
    tf32, ti64 = torch.tensor([1.0, 2.0]), torch.tensor([1, 2])
    cases = [((f32, ta.Tensor(np.array(2.0))), (tf32, torch.tensor(2.0, dtype=torch.float64))),
             ((i64, f32), (ti64, tf32)), ((1.5, 2.5), (1.5, 2.5)), ((1.5, 2), (1.5, 2)), ((1, 2), (1, 2)),
             ((i64, 2.5), (ti64, 2.5)), ((ta.Tensor(np.array(1.0)), i64), (torch.tensor(1.0, dtype=torch.float64), ti64)),
             ((f32, ta.tensor(np.ones(2))), (tf32, torch.ones(2, dtype=torch.float64)))]
    for (a, b), (ta_, tb) in cases:
        ours, theirs = ops.where(c, a, b), torch.where(tc, ta_, tb)
        assert ours.dtype == np.dtype(str(theirs.dtype).replace("torch.", "")), (a, b)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_where_mixed_dtypes_grads_keep_each_parents_dtype():
    c = np.array([True, False, True])
    a = ta.tensor([1.0, 2.0, 3.0], dtype=np.float32, requires_grad=True)
    b = ta.tensor(np.array(5.0), dtype=np.float64, requires_grad=True)
    ta_, tb = torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor(5.0, dtype=torch.float64,
                                                                               requires_grad=True)
    out, ref = ops.where(c, a, b), torch.where(torch.from_numpy(c), ta_, tb)
    assert out.dtype == np.float32 and ref.dtype == torch.float32
    out.sum().backward()
    ref.sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64
    np.testing.assert_array_equal(a.grad, ta_.grad.numpy())
    np.testing.assert_array_equal(b.grad, tb.grad.numpy())


# -- GELU at +-inf ---------------------------------------------------------------------------------------------------

# Regression (fixed): the tanh form's gradient at +inf was 1 and at -inf 0 (the input was clipped to +-40 before
# the derivative), while the exact form's was NaN; torch float64 (and float32) gives NaN at +-inf for both forms
# (x * pdf = inf * 0 in the exact form, 0.5 x (1 - tanh^2 u) ... = inf * 0 in the tanh form). Both twins, and the
# bias variants, now give NaN there; finite inputs beyond the clip still give exactly 1 / 0.
@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_gradient_at_infinities_is_nan_like_torch(impl, approximate, dtype):
    x = np.array([np.inf, -np.inf, 50.0, -50.0, 1e30, -1e30, 0.5, np.nan], dtype)
    ref = torch.tensor(x.astype(np.float64), requires_grad=True)
    F.gelu(ref, approximate=approximate).sum().backward()
    expected = ref.grad.numpy()
    assert np.isnan(expected[:2]).all() and (expected[2::2][:2] == 1).all()
    with kernels.using(impl), np.errstate(invalid="ignore"):
        t = ta.tensor(x, dtype=dtype, requires_grad=True)
        ops.gelu(t, approximate=approximate).sum().backward()
        np.testing.assert_allclose(t.grad, expected, rtol=1e-6, atol=0, equal_nan=True)
        # the bias variants: forward recomputed in backward, and the plain bias backward
        pre = x.reshape(1, -1)
        g = np.ones_like(pre)
        for name in ("bias_gelu_backward", "bias_gelu_backward_recompute"):
            dx, db = np.empty_like(pre), np.empty(pre.shape[1], dtype)
            extra = [np.empty_like(pre)] if name.endswith("recompute") else []
            kernels.kernel(name, impl)(pre, g.copy(), dx, db, *extra, approximate=approximate)
            np.testing.assert_allclose(dx[0], expected, rtol=1e-6, atol=0, equal_nan=True, err_msg=name)


# -- cross_entropy / layer_norm edges ------------------------------------------------------------------------------

# Regression (fixed): logits with 0 classes failed in NumPy ("cannot reshape array of size 0 into shape (0)"); torch
# says the target is out of bounds. Now an IndexError naming the 0 classes.
def test_cross_entropy_with_zero_classes_names_the_problem():
    with pytest.raises(IndexError, match="out of bounds"):
        F.cross_entropy(torch.zeros(3, 0), torch.tensor([0, 1, 1]))
    with pytest.raises(IndexError, match="0 classes"):
        ops.cross_entropy(ta.tensor(np.zeros((3, 0))), np.array([0, 1, 1]))


def test_cross_entropy_refuses_options_it_does_not_offer_by_name():
    x = ta.tensor(np.zeros((3, 4)))
    with pytest.raises(TypeError, match="probability targets are not supported"):
        ops.cross_entropy(x, np.full((3, 4), 0.25))
    # (a class weight is offered since tests/test_nn_torch_forms_hunt.py, label smoothing with it too)
    with pytest.raises(ValueError, match="reduction"):
        ops.cross_entropy(x, np.array([0, 1, 2]), reduction="batchmean")


@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_options_with_spatial_dims(impl, dtype, reduction):
    tgt = np.random.default_rng(3).integers(0, 4, (2, 3, 2))
    tgt[0, 1, 1] = 2
    with kernels.using(impl):
        for ls in (0.0, 0.3):
            _compare(lambda x: ops.cross_entropy(x, tgt, ignore_index=2, label_smoothing=ls, reduction=reduction),
                     lambda x: F.cross_entropy(x, torch.from_numpy(tgt), ignore_index=2, label_smoothing=ls,
                                               reduction=reduction), [3 * _rand(10, (2, 4, 3, 2))], dtype)


# Regression (fixed): layer_norm over 0 features (normalized_shape (0,)) raised FloatingPointError (a 1 / 0 in the
# kernels' row statistics); torch returns the empty result.
@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_over_zero_features_is_empty_like_torch(impl, dtype):
    with kernels.using(impl):
        _compare(lambda x, w, b: ops.layer_norm(x, (0,), w, b), lambda x, w, b: F.layer_norm(x, (0,), w, b),
                 [np.zeros((3, 0)), np.zeros(0), np.zeros(0)], dtype)
    # the twins' saved row statistics agree: 0 / 0 = NaN for each of the 3 rows
    mean, rstd = np.zeros(3), np.zeros(3)
    kernels.kernel("layer_norm_forward", impl)(np.zeros((3, 0), dtype), None, None, 1e-5, np.zeros((3, 0), dtype),
                                               mean, rstd)
    assert np.isnan(mean).all() and np.isnan(rstd).all()


# -- Tensor protocol -------------------------------------------------------------------------------------------------

# Regression (fixed): len() of a 0-d tensor raised IndexError "tuple index out of range", and iterating one gave
# nothing (list(t) == []); torch raises TypeError for both. Iterating a 1-d tensor gives its elements, as torch.
def test_len_and_iteration_of_zero_d_tensor_like_torch():
    with pytest.raises(TypeError, match="0-d"):
        len(torch.tensor(1.0))
    with pytest.raises(TypeError, match="0-d"):
        len(ta.tensor(1.0))
    with pytest.raises(TypeError, match="0-d"):
        list(ta.tensor(1.0))
    items = list(ta.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert len(items) == 2 and all(isinstance(r, ta.Tensor) for r in items)
    np.testing.assert_array_equal(items[1].numpy(), [3.0, 4.0])
