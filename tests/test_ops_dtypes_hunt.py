"""Operators' dtypes against torch: what a helper agent's hunt of the Tensor and autograd API found.

1. An integer tensor divided by a number its dtype cannot hold: the number was cast to the tensor's dtype first
   (uint8 / -3 divided by 253: 0.0119 for torch's -1; int8 / 128 by -128; int32 / 2**40 by 0, inf).
2. uint8 tensors with a signed 0-d tensor (+ - * // % ==, maximum, clamp, where, +=) failed in NumPy's
   same_kind cast; `uint8 += int64 tensor` was refused. torch computes in uint8, wrapping.
3. A float tensor // or % an integer tensor holding 0 raised ZeroDivisionError; torch gives inf / nan.
4. NaN, inf or 1e30 written into an integer tensor (fill_, t[i] = v, masked_fill) became -2**63; torch raises.
5. //=, %=, **=, &=, |=, ^= were not in place: Python rebound the name to a new tensor, so a view written through
   them left its base unchanged, and `w **= 2` under no_grad left the parameter as it was.
6. A string, bytes or None operand raised KeyError: 'U' (or named an Encoding); an int beyond 64 bits too.
7. Bool subtraction and negation gave NumPy's raw errors, or results where torch refuses (int - bool);
   bool // and % NumPy's UFuncTypeError.

On 8de4784 (before the fix) 53 of this file's 58 tests fail; the controls (an int64 tensor / 2.5, bool * and +,
integer //= by 0 raising and float //= by a float dividing, a finite float written into an integer tensor
truncating, clamp with a float bound promoting) pass on both:
    git worktree add /tmp/wt 8de4784 && cp tests/test_ops_dtypes_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=. python -m pytest -q -p no:cacheprovider tests/test_ops_dtypes_hunt.py)
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tensorarena as ta


def _same(ours, theirs) -> None:
    ours = ours.data if isinstance(ours, ta.Tensor) else np.asarray(ours)
    theirs = theirs.numpy()
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0, equal_nan=True)


def _pair(values, dtype):
    return ta.tensor(np.array(values, dtype)), torch.tensor(np.array(values, dtype))


# -- 1. true division by a number out of the integer dtype's range -------------------------------------------------

@pytest.mark.parametrize("values, dtype, number", [([3, 200], np.uint8, -3), ([64, -3], np.int8, 128),
                                                   ([1, 100], np.int32, 2 ** 40), ([7, 9], np.int64, 2.5)])
def test_integer_tensor_divided_by_a_number_as_torch(values, dtype, number):
    ours, theirs = _pair(values, dtype)
    _same(ours / number, theirs / number)
    _same(number / ours, number / theirs)


# -- 2. a signed 0-d tensor with uint8 tensors ---------------------------------------------------------------------

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
       "%": lambda a, b: a % b, "==": lambda a, b: a == b, "<": lambda a, b: a < b}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("zero_d", [5, 300, -2], ids=["5", "300 wraps", "-2 wraps"])
def test_uint8_with_a_signed_zero_d_tensor_as_torch(op, zero_d):
    ours, theirs = _pair([44, 9], np.uint8)
    _same(OPS[op](ours, ta.tensor(zero_d)), OPS[op](theirs, torch.tensor(zero_d)))


def test_uint8_maximum_clamp_where_and_inplace_add_with_int64_as_torch():
    ours, theirs = _pair([44, 9], np.uint8)
    _same(ta.maximum(ours, ta.tensor(50)), torch.maximum(theirs, torch.tensor(50)))
    _same(ours.clamp(ta.tensor(10)), theirs.clamp(torch.tensor(10)))
    _same(ta.where(ours > 10, ours, ta.tensor(5)), torch.where(theirs > 10, theirs, torch.tensor(5)))
    ours += ta.tensor([300, 2])  # an int64 tensor into uint8, wrapping
    theirs += torch.tensor([300, 2])
    _same(ours, theirs)


def test_clamp_of_an_integer_tensor_with_a_float_bound_promotes_as_torch():  # control
    ours, theirs = _pair([1, 5], np.int64)
    _same(ours.clamp(min=2.5), theirs.clamp(min=2.5))


# -- 3. float // and % by an integer 0 --------------------------------------------------------------------------

def test_float_floor_divide_and_remainder_by_an_integer_zero_as_torch():
    ours, theirs = ta.tensor([1.0, -2.0, 0.0]), torch.tensor([1.0, -2.0, 0.0])
    divisor = np.array([0, 2, 0])
    _same(ours // ta.tensor(divisor), theirs // torch.tensor(divisor))
    np.testing.assert_array_equal(np.isnan((ours % ta.tensor(divisor)).data),
                                  torch.isnan(theirs % torch.tensor(divisor)).numpy())
    _same(2.0 // ta.tensor(np.array([0, 2])), 2.0 // torch.tensor([0, 2]))
    with pytest.raises(ZeroDivisionError):  # an integer result still refuses, as torch's
        ta.tensor([1, 2]) // ta.tensor([0, 1])


# -- 4. non-finite or huge floats into integer tensors -------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e30])
@pytest.mark.parametrize("write", ["fill_", "setitem", "masked_fill"])
def test_a_float_an_integer_tensor_cannot_hold_is_refused(write, value):
    t = ta.tensor(np.array([1, 2], np.int32))
    theirs = torch.tensor([1, 2], dtype=torch.int32)
    ops = {"fill_": lambda x: x.fill_(value), "setitem": lambda x: x.__setitem__(0, value),
           "masked_fill": lambda x: x.masked_fill(x == 1, value)}
    with pytest.raises(RuntimeError):
        ops[write](theirs)
    with pytest.raises(OverflowError, match=re.escape(f"value {value}")):
        ops[write](t)
    assert t.data.tolist() == [1, 2]


def test_a_finite_float_written_into_an_integer_tensor_truncates_as_torch():  # control
    ours, theirs = _pair([1, 2], np.int64)
    ours.fill_(2.7)
    theirs.fill_(2.7)
    _same(ours, theirs)


# -- 5. the in-place operators --------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["//=", "%=", "**="])
def test_inplace_division_and_power_write_through_a_view(op):
    base, theirs = ta.tensor([5.0, 7.0, 9.0]), torch.tensor([5.0, 7.0, 9.0])
    view, their_view = base[1:], theirs[1:]
    namespace = {"v": view, "w": their_view}
    exec(f"v {op} 2\nw {op} 2", namespace)
    _same(base, theirs)
    assert namespace["v"] is view  # the same tensor, written in place


@pytest.mark.parametrize("op, value", [("&=", False), ("|=", True), ("^=", True)])
def test_inplace_bitwise_writes_through_a_view(op, value):
    base, theirs = ta.tensor([True, False, True]), torch.tensor([True, False, True])
    namespace = {"v": base[1:], "w": theirs[1:]}
    exec(f"v {op} {value}\nw {op} {value}", namespace)
    _same(base, theirs)
    with pytest.raises(TypeError, match="takes bool or integer tensors"):
        exec(f"f {op} 1", {"f": ta.tensor([1.0])})


def test_inplace_power_of_a_parameter_under_no_grad_and_refused_with_grad():
    w = ta.tensor([2.0, 3.0], requires_grad=True)
    params = [w]
    with ta.no_grad():
        w **= 2
    assert params[0] is w and w.data.tolist() == [4.0, 9.0]
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w **= 2


def test_inplace_integer_floor_divide_by_zero_raises_and_float_by_float_divides():
    with pytest.raises(ZeroDivisionError):
        t = ta.tensor([4, 5])
        t //= ta.tensor([0, 1])
    f = ta.tensor([7.0, -7.0])  # control
    f //= 2.0
    assert f.data.tolist() == [3.0, -4.0]


# -- 6. operands that are no numbers -------------------------------------------------------------------------------

@pytest.mark.parametrize("operand", ["a", b"x", None], ids=["str", "bytes", "None"])
def test_no_number_operand_is_a_type_error(operand):
    with pytest.raises(TypeError, match="unsupported operand"):
        ta.tensor([1.0, 2.0]) + operand


def test_an_int_beyond_64_bits_is_an_overflow_error():
    with pytest.raises(OverflowError, match="too big"):
        ta.tensor([1, 2]) + 2 ** 70


# -- 7. bool arithmetic ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expression", ["b - b", "-b", "i - b", "b - 1", "1 - b", "b // True", "b % True"])
def test_bool_subtraction_negation_and_division_are_refused_as_torch(expression):
    with pytest.raises((RuntimeError, NotImplementedError)):
        eval(expression, {"b": torch.tensor([True, False]), "i": torch.tensor([1, 2])})
    with pytest.raises(TypeError, match=r"not supported \(as in torch\)|not implemented for bool tensors"):
        eval(expression, {"b": ta.tensor([True, False]), "i": ta.tensor([1, 2])})


def test_bool_sum_and_product_as_torch():  # control
    ours, theirs = ta.tensor([True, False]), torch.tensor([True, False])
    _same(ours + ours, theirs + theirs)
    _same(ours * ours, theirs * theirs)
