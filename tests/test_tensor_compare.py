"""Comparisons (== != < <= > >=, eq/ne/lt/le/gt/ge, equal, allclose) elementwise as torch's, and the Tensor
methods a PyTorch training loop calls (argmax/argmin, abs, float/double/long/int/bool, all/any, item, tolist),
each against torch: values, result dtypes, and gradients where torch defines them.

Before this file, `Tensor.__eq__` was identity: `(logits.argmax(1) == y).float().mean()` and `t == 1.0` gave a
plain False, and `<` against a number raised Python's TypeError. The engine's own code must not rely on `==`
being identity; the last tests guard the one place that did (the fused route's watch on module attributes).

Run: NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_tensor_compare.py

127 of these 133 tests fail on 36a8d855e23aeed9cd7b30ff6603faf0fbd77ac7, before the changes. With this file copied
into a worktree of that commit (git worktree add /tmp/base-compare 36a8d85), run in /tmp/base-compare:
`NUMBA_NUM_THREADS=1 PYTHONPATH=/tmp/base-compare python -m pytest -q -p no:cacheprovider tests/test_tensor_compare.py`.
The 6 that pass there guard what the change must keep: identity hashing, `t == None` being False, bool() of one
element, and the fused route's watch on module attributes (which fails once == is elementwise, unless it compares
Parameters by identity, as compile/watched_state.py now does).
"""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.compile.watched_state import ModelState
from tensorarena.nn import Module, Parameter

TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
               np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.bool_): torch.bool,
               np.dtype(np.uint8): torch.uint8}
OPS = [operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge]
NAMES = {operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt",
         operator.ge: "ge"}


def _pair(a: np.ndarray):
    return ta.Tensor(a.copy()), torch.from_numpy(a.copy())


def _same(ours, theirs) -> None:
    """A tensorarena result equals torch's: shape, dtype and values."""
    assert isinstance(ours, ta.Tensor), f"expected a Tensor, got {type(ours).__name__}: {ours!r}"
    assert ours.shape == tuple(theirs.shape)
    assert ours.dtype == np.dtype(str(theirs.dtype).replace("torch.", "")), (ours.dtype, theirs.dtype)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


# Values with ties, NaN and both signs: every comparison has True and False cases.
A = np.array([[0.1, 1.0, -2.0], [np.nan, 1.0, 3.5]], dtype=np.float32)
B_ROW = np.array([0.1, 2.0, np.nan], dtype=np.float32)


# -- tensor against tensor, broadcasting -------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS, ids=lambda o: NAMES[o])
def test_tensor_against_tensor_broadcasts_as_torch(op):
    (a, ta_), (b, tb) = _pair(A), _pair(B_ROW)
    _same(op(a, b), op(ta_, tb))
    _same(op(b, a), op(tb, ta_))
    _same(op(a, a), op(ta_, ta_))  # the same tensor: NaN is still unequal to itself


@pytest.mark.parametrize("op", OPS, ids=lambda o: NAMES[o])
def test_functions_and_methods_match_operators(op):
    name = NAMES[op]
    (a, ta_), (b, tb) = _pair(A), _pair(B_ROW)
    _same(getattr(ta, name)(a, b), getattr(torch, name)(ta_, tb))
    _same(getattr(a, name)(b), getattr(ta_, name)(tb))
    _same(getattr(a, name)(1.0), getattr(ta_, name)(1.0))


# -- numbers, on either side, weak as in torch --------------------------------------------------------------------

NUMBERS = [1.0, 0.1, 1, -2, True, np.float64(0.1), np.float32(1.0), np.int64(3)]


@pytest.mark.parametrize("op", OPS, ids=lambda o: NAMES[o])
@pytest.mark.parametrize("number", NUMBERS, ids=repr)
def test_tensor_against_number_either_side(op, number):
    a, t = _pair(A)
    _same(op(a, number), op(t, number))
    _same(op(number, a), op(number, t))


def test_float32_tensor_equals_a_python_float_rounded_to_float32():
    # torch compares in the tensor's dtype: 0.1 becomes float32(0.1); NumPy's own rule would widen to float64
    # and answer False.
    a, t = _pair(np.array([0.1, 0.2], dtype=np.float32))
    _same(a == 0.1, t == 0.1)
    assert (a == 0.1).numpy().tolist() == [True, False]


@pytest.mark.parametrize("number", [2.5, 2.0, -1.5])
@pytest.mark.parametrize("op", OPS, ids=lambda o: NAMES[o])
def test_integer_tensor_against_float_number_promotes(op, number):
    # int64 [2, 3] < 2.5 compares as floats: the number is not truncated to 2
    a, t = _pair(np.array([2, 3, -1], dtype=np.int64))
    _same(op(a, number), op(t, number))


@pytest.mark.parametrize("op", OPS, ids=lambda o: NAMES[o])
def test_bool_tensor_against_int_promotes(op):
    a, t = _pair(np.array([True, False]))
    for number in (1, 2, 0, 0.5):
        _same(op(a, number), op(t, number))


def test_mixed_dtypes_and_zero_dim_tensors_promote_as_torch():
    cases = [
        (np.array([2, 3], np.int32), np.array([2, 5], np.int64)),
        (np.array([2, 3], np.int64), np.array([2.0, 2.5], np.float32)),
        (np.array([0.1, 0.3], np.float32), np.array(0.1, np.float64)),  # 0-d float64 does not widen float32
        (np.array(2.0, np.float32), np.array(2.0000001, np.float64)),  # two 0-d: compared in float64
        (np.array([2], np.int32), np.array(2.5, np.float64)),
        (np.array([True, False]), np.array([1.0, 0.5], np.float32)),
        (np.array([1, 200], np.uint8), np.array([1, 200], np.int64)),
    ]
    for x, y in cases:
        (a, ta_), (b, tb) = _pair(x), _pair(y)
        for op in OPS:
            _same(op(a, b), op(ta_, tb))


def test_arrays_compare_as_tensors_of_their_own_dtype():
    # An ndarray is not a weak number: a bool tensor against int64 [2, 1] compares 1 == 2 (False), not True == True.
    a, t = _pair(np.array([True, True]))
    arr = np.array([2, 1], dtype=np.int64)
    _same(a == arr, t == torch.from_numpy(arr))
    f, tf = _pair(A)
    for op in OPS:
        _same(op(f, B_ROW), op(tf, torch.from_numpy(B_ROW)))
        _same(op(B_ROW, f), op(torch.from_numpy(B_ROW), tf))  # NumPy defers to the Tensor (its priority)


def test_numpy_scalar_on_the_left_defers_to_the_tensor():
    a, t = _pair(A)
    _same(np.float32(1.0) == a, t == 1.0)
    _same(np.float64(1.0) < a, t > 1.0)


# -- the result is outside the graph ------------------------------------------------------------------------------

def test_result_is_a_bool_tensor_that_records_nothing():
    x = ta.tensor(A, requires_grad=True)
    y = ta.tensor(B_ROW, requires_grad=True)
    for op in OPS:
        r = op(x, y)
        assert r.dtype == np.bool_ and not r.requires_grad and r.is_leaf
        r2 = op(x * 2, 1.0)
        assert not r2.requires_grad and r2.is_leaf


def test_accuracy_idiom_matches_torch():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((16, 5)).astype(np.float32)
    y = rng.integers(0, 5, 16)
    x = ta.tensor(logits, requires_grad=True)
    acc = (x.argmax(1) == ta.Tensor(y)).float().mean()
    ref = (torch.from_numpy(logits).argmax(1) == torch.from_numpy(y)).float().mean()
    assert acc.dtype == np.float32 and not acc.requires_grad
    assert acc.item() == pytest.approx(ref.item(), abs=0)
    assert acc.item() not in (0.0, 1.0)  # a random batch: some right, some wrong
    # Counting with sum, and the same against a plain ndarray of labels
    _same((x.argmax(dim=1) == y).sum(), (torch.from_numpy(logits).argmax(dim=1) == torch.from_numpy(y)).sum())


def test_masking_with_a_comparison_selects_as_torch():
    a, t = _pair(A)
    np.testing.assert_array_equal(a[a > 0].numpy(), t[t > 0].numpy())
    _same(ta.where(a > 0, a, 0.0), torch.where(t > 0, t, 0.0))


# -- what torch does not compare ----------------------------------------------------------------------------------

def test_none_strings_and_lists_fall_back_to_python_as_torch():
    a, t = _pair(A)
    for other in (None, "x", [1.0, 2.0, 3.0], object()):
        assert (a == other) is (t == other) is False
        assert (a != other) is (t != other) is True
    for other in (None, "x"):
        for op in (operator.lt, operator.le, operator.gt, operator.ge):
            with pytest.raises(TypeError):
                op(t, other)
            with pytest.raises(TypeError, match="not supported between instances"):
                op(a, other)


def test_functions_name_an_operand_they_cannot_compare():
    a = ta.Tensor(A)
    with pytest.raises(TypeError, match=r"eq: compares tensors, arrays and numbers, got str"):
        ta.eq(a, "x")
    with pytest.raises(TypeError, match="got NoneType"):
        a.lt(None)


def test_shapes_that_do_not_broadcast_are_named():
    with pytest.raises(ValueError, match=r"eq: shapes \(2, 3\) and \(2,\) do not broadcast"):
        ta.Tensor(A) == ta.Tensor(np.zeros(2, np.float32))


# -- identity stays where Python needs it -------------------------------------------------------------------------

def test_hash_stays_identity_so_tensors_key_dicts_and_sets():
    a = ta.Tensor(np.ones(3, np.float32))
    b = ta.Tensor(np.ones(3, np.float32))  # equal values, another tensor
    assert hash(a) == object.__hash__(a)
    assert len({a, b}) == 2 and {a: 1, b: 2}[a] == 1
    assert a in [a] and a in (a, b)  # `in` finds the very object before asking == (of b, see below)
    p = Parameter(np.ones(3))
    assert {id(p): p}[id(p)] is p and hash(p) == object.__hash__(p)


def test_bool_of_one_element_is_its_value():
    for v in ([0.0], [2.5], [[1]], 0, True, [float("nan")]):
        assert bool(ta.tensor(v)) == bool(torch.tensor(v))


def test_bool_of_many_or_no_elements_raises_torchs_error():
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one value is ambiguous"):
        bool(ta.Tensor(A) == 1.0)
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one value is ambiguous"):
        if ta.tensor([1.0, 2.0]):
            pass
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with no values is ambiguous"):
        bool(ta.tensor(np.zeros(0)))


def test_in_with_another_tensor_asks_elementwise_as_torch():
    # `x in [y]` (y another tensor) asks bool(x == y): ambiguous for several elements, in torch and here.
    a, b = ta.tensor([1.0, 2.0]), ta.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="ambiguous"):
        a in [b]  # noqa: B015
    with pytest.raises(RuntimeError, match="ambiguous"):
        torch.tensor([1.0, 2.0]) in [torch.tensor([1.0, 2.0])]  # noqa: B015


# -- equal and allclose -------------------------------------------------------------------------------------------

def test_equal_as_torch():
    cases = [
        (np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0], np.float32)),
        (np.array([1.0, 2.0], np.float32), np.array([1.0, 2.5], np.float32)),
        (np.array([1.0, 2.0], np.float32), np.array([[1.0, 2.0]], np.float32)),  # another shape: False
        (np.array([1, 2], np.int64), np.array([1.0, 2.0], np.float32)),  # values compared across dtypes
        (np.array([np.nan], np.float32), np.array([np.nan], np.float32)),  # NaN equals nothing
        (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)),
    ]
    for x, y in cases:
        ours = ta.equal(ta.Tensor(x), ta.Tensor(y))
        assert type(ours) is bool and ours == torch.equal(torch.from_numpy(x), torch.from_numpy(y)), (x, y)
        assert ta.Tensor(x).equal(ta.Tensor(y)) == ours


def test_allclose_as_torch():
    x = np.array([1.0, 2.0, 1e-9, np.inf], np.float64)
    for y, kw in [(x + 1e-7, {}), (x * (1 + 1e-4), {}), (x * (1 + 1e-4), dict(rtol=1e-3)),
                  (np.array([1.0, 2.0, 0.0, np.inf]), dict(atol=1e-8)), (-x, {})]:
        ours = ta.allclose(ta.Tensor(x), ta.Tensor(y), **kw)
        assert type(ours) is bool and ours == torch.allclose(torch.from_numpy(x), torch.from_numpy(y), **kw)
    n = np.array([1.0, np.nan])
    for equal_nan in (False, True):
        assert ta.Tensor(n).allclose(ta.Tensor(n), equal_nan=equal_nan) == torch.allclose(
            torch.from_numpy(n), torch.from_numpy(n), equal_nan=equal_nan)
    assert ta.allclose(ta.Tensor(np.ones((2, 3))), ta.Tensor(np.ones(3)))  # broadcasts, as torch's
    with pytest.raises(TypeError, match="dtypes float32 and float64"):
        ta.allclose(ta.tensor([1.0]), ta.Tensor(np.array([1.0])))


# -- argmax / argmin ----------------------------------------------------------------------------------------------

ARG = np.array([[3.0, 1.0, 3.0, -2.0], [0.5, 0.5, -7.0, -7.0], [np.nan, 2.0, np.nan, -1.0]], np.float32)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dim,keepdim", [(None, False), (None, True), (0, False), (1, False), (-1, True),
                                         (-2, True), (np.int64(1), False)])
def test_argmax_argmin_as_torch(name, dim, keepdim):
    torch_dim = None if dim is None else int(dim)
    for data in (ARG, ARG[:2], ARG[:2].astype(np.int64), ARG[:2].T):  # ties (first wins), NaN, ints, a view
        a, t = ta.Tensor(data), torch.from_numpy(data.copy())
        _same(getattr(a, name)(dim=dim, keepdim=keepdim), getattr(t, name)(dim=torch_dim, keepdim=keepdim))
        _same(getattr(ta, name)(a, dim, keepdim), getattr(torch, name)(t, torch_dim, keepdim))
    if dim is None and not keepdim:
        _same(getattr(ta.Tensor(ARG), name)(), getattr(torch.from_numpy(ARG), name)())


def test_argmax_of_a_zero_dim_and_a_graph_tensor():
    _same(ta.tensor(2.0).argmax(), torch.tensor(2.0).argmax())
    _same(ta.tensor(2.0).argmax(0), torch.tensor(2.0).argmax(0))
    x = ta.tensor(ARG[:2], requires_grad=True)
    r = (x * 2).argmax(1)
    assert not r.requires_grad and r.dtype == np.int64


def test_argmax_refuses_empty_and_bool():
    with pytest.raises(IndexError, match="argmax: the tensor of shape \\(0,\\) has no elements"):
        ta.tensor(np.zeros(0)).argmax()
    with pytest.raises(IndexError, match="argmin: dim 1 has size 0"):
        ta.tensor(np.zeros((2, 0))).argmin(1)
    with pytest.raises(TypeError, match="argmax: .*bool"):
        ta.Tensor(np.array([True, False])).argmax()
    with pytest.raises(TypeError, match="argmax: dim must be an int"):
        ta.tensor([1.0]).argmax(dim=(0,))


# -- abs ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_abs_and_its_gradient_as_torch(dtype):
    x = np.array([[-1.5, 0.0, 2.0], [-0.0, 3.0, -4.25]], dtype)
    w = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype)
    a = ta.tensor(x, dtype=dtype, requires_grad=True)
    t = torch.tensor(x, requires_grad=True)
    out, ref = a.abs(), t.abs()
    _same(out.detach(), ref.detach())
    _same(abs(a).detach(), ref.detach())
    _same(ta.abs(a).detach(), ref.detach())
    (out * ta.tensor(w, dtype=dtype)).sum().backward()
    (ref * torch.from_numpy(w)).sum().backward()
    assert a.grad.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(a.grad, t.grad.numpy())  # sign(0) = 0: no gradient at 0, as torch


def test_abs_of_integers_and_refusal_of_bool():
    _same(*(_pair(np.array([-3, 0, 4], np.int64))[0].abs(), torch.tensor([-3, 0, 4]).abs()))
    _same(ta.Tensor(np.array([-3, 2], np.int32)).abs(), torch.tensor([-3, 2], dtype=torch.int32).abs())
    with pytest.raises(TypeError, match="abs: .*bool"):
        ta.Tensor(np.array([True])).abs()


# -- casts ---------------------------------------------------------------------------------------------------------

CASTS = ["float", "double", "long", "int", "bool"]


@pytest.mark.parametrize("cast", CASTS)
def test_casts_as_torch(cast):
    for data in (np.array([-2.7, 0.0, 0.5, 3.9], np.float32), np.array([-2.7, 0.0, 1e-300, 3.9]),
                 np.array([-3, 0, 7], np.int64), np.array([True, False]), np.array(2.5, np.float32)):
        a, t = _pair(data)
        _same(getattr(a, cast)(), getattr(t, cast)())


def test_float_rounds_tiny_and_huge_float64_to_zero_and_inf_as_torch():
    # NumPy's seterr (raise, in these tests) would make the cast an error; torch's answer is 0 and inf.
    a, t = _pair(np.array([1e-300, -1e300, 1e300, 2.0]))
    _same(a.float(), t.float())


def test_cast_to_the_same_dtype_is_the_tensor_itself():
    a = ta.tensor([1.0, 2.0])
    t = torch.tensor([1.0, 2.0])
    assert (a.float() is a) == (t.float() is t) is True
    assert a.double() is not a


def test_float_casts_carry_the_gradient_and_integer_ones_do_not():
    x = np.array([0.25, -1.5, 3.0])
    a = ta.tensor(x, dtype=np.float64, requires_grad=True)
    t = torch.tensor(x, requires_grad=True)
    out, ref = a.float() * ta.tensor([1.0, 2.0, 3.0]), t.float() * torch.tensor([1.0, 2.0, 3.0])
    assert out.dtype == np.float32 and out.requires_grad
    out.sum().backward()
    ref.sum().backward()
    assert a.grad.dtype == np.float64  # the leaf's gradient in its own dtype
    np.testing.assert_array_equal(a.grad, t.grad.numpy())
    for cast in ("long", "int", "bool"):
        r, tr = getattr(a, cast)(), getattr(t, cast)()
        assert r.requires_grad == tr.requires_grad is False and r.is_leaf


# -- all / any, item, tolist, int() -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["all", "any"])
def test_all_any_as_torch(name):
    for data in (np.array([[1.0, 0.0, 2.0], [3.0, 4.0, 5.0]], np.float32), np.array([[True, True], [False, True]]),
                 np.array([[1, 2], [0, 0]], np.uint8), np.zeros((0, 2), np.float32)):
        a, t = _pair(data)
        _same(getattr(a, name)(), getattr(t, name)())
        _same(getattr(ta, name)(a), getattr(torch, name)(t))
        for dim in (0, -1):
            for keepdim in (False, True):
                _same(getattr(a, name)(dim, keepdim=keepdim), getattr(t, name)(dim, keepdim=keepdim))


def test_item_tolist_and_int_as_torch():
    for data in (np.array([2.5], np.float32), np.array([[7]], np.int64), np.array(True), np.array(-2.7)):
        a, t = _pair(data)
        assert type(a.item()) is type(t.item()) and a.item() == t.item()
        assert int(a) == int(t) and float(a) == float(t)
    m = np.array([[1.5, 2.0], [3.0, -1.0]], np.float32)
    a, t = _pair(m)
    assert a.tolist() == t.tolist()
    assert (a > 1.6).tolist() == (t > 1.6).tolist()
    assert a.argmax(1).tolist() == t.argmax(1).tolist()


# -- the engine must not rely on == being identity ----------------------------------------------------------------

class _Scaled(Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = Parameter(np.ones(1))

    def forward(self, x):
        return x * self.scale


def test_fused_watch_sees_a_replaced_one_element_parameter_of_equal_value():
    # Regression (fixed): compile/watched_state.ModelState compared the Parameters it watches with `==` (a list
    # compare); once == is elementwise, a one-element Parameter replaced by an equal-valued one compared True and
    # the traced step would have gone on updating the old Parameter.
    model = _Scaled()
    state = ModelState(model)
    assert not state.changed()
    model.scale = Parameter(np.ones(1))
    assert state.changed()
    assert "scale" in state.describe_change() and "replaced" in state.describe_change()


def test_fused_watch_sees_a_replaced_parameter_in_a_parameter_dict():
    # Regression (fixed): a ParameterDict's entries are watched as a copied dict, compared with `==` as above.
    model = Module()
    model.scales = ta.nn.ParameterDict({"a": Parameter(np.ones(1)), "b": Parameter(np.zeros(1))})
    state = ModelState(model)
    assert not state.changed()
    model.scales["a"] = Parameter(np.ones(1))
    assert state.changed()


def test_fused_watch_unchanged_when_the_parameter_is_kept():
    model = _Scaled()
    state = ModelState(model)
    with ta.no_grad():
        model.scale += 1.0  # a new value, the same Parameter: data, not config
    assert not state.changed()
