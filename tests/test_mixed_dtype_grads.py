"""Binary ops over a float32 and a float64 input: each input gets its gradient in its own dtype, as in torch.

float32 + float64 promotes to float64 (as torch), and before the fix the backward of every binary op handed
both parents the float64 output gradient; a float32 parent's own backward (a float32 GEMM) then failed with
"gemm: MKL takes one float32 or float64 dtype". A leaf casts what it receives into .grad, which hid the
wrong dtype, so these tests read the gradient each leaf is handed (autograd.backward's on_leaf_grad) before
that cast. Before the fix all but `where`'s cases failed (where already cast back): a float64 gradient for the
float32 input, the GEMM TypeError, and unbroadcast taking no dtype. Checked with the ops files reverted:
NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_mixed_dtype_grads.py  (34 of 40 failed)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import autograd
from tensorarena.ops import bias_gelu_linear, linear, where
from tensorarena.ops._base import unbroadcast

ATOL = 1e-6
F32, F64 = np.float32, np.float64
TORCH = {F32: torch.float32, F64: torch.float64}

# (name, tensorarena op, torch op, positive inputs only)
BINARY = [
    ("add", lambda a, b: a + b, lambda a, b: a + b, False),
    ("sub", lambda a, b: a - b, lambda a, b: a - b, False),
    ("mul", lambda a, b: a * b, lambda a, b: a * b, False),
    ("div", lambda a, b: a / b, lambda a, b: a / b, True),
    ("pow", lambda a, b: ta.pow(a, b), lambda a, b: torch.pow(a, b), True),
    ("where", lambda a, b: where(_COND, a, b), lambda a, b: torch.where(torch.from_numpy(_COND), a, b), False),
]
# a's shape, b's shape: equal (no sum in backward) and b broadcast over a's rows (a sum, then the cast)
SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4))]
DTYPES = [(F32, F64), (F64, F32)]
_COND = np.array([[True, False, True, False]] * 3)


def _values(seed: int, shape, positive: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape)


def _handed_grads(root: ta.Tensor) -> dict[int, np.ndarray]:
    """The gradient autograd hands each leaf (by id), before the leaf casts it into .grad."""
    seen: dict[int, np.ndarray] = {}

    def grab(leaf, g):
        seen[id(leaf)] = np.array(g)  # a copy: g may be transient arena memory
        return False

    autograd.backward(root, on_leaf_grad=grab)
    return seen


def _torch_grads(fn, arrays, dtypes, weight):
    ts = [torch.tensor(x, dtype=TORCH[d], requires_grad=True) for x, d in zip(arrays, dtypes)]
    (fn(*ts) * torch.from_numpy(weight)).sum().backward()
    return [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("a_dtype,b_dtype", DTYPES, ids=["f32_f64", "f64_f32"])
@pytest.mark.parametrize("a_shape,b_shape", SHAPES, ids=["same", "b_broadcast", "a_broadcast"])
@pytest.mark.parametrize("name,op,torch_op,positive", BINARY, ids=[b[0] for b in BINARY])
def test_each_input_gets_its_gradient_in_its_own_dtype_as_torch(name, op, torch_op, positive, a_shape, b_shape,
                                                                 a_dtype, b_dtype):
    if name == "where" and (a_shape, b_shape) != ((3, 4), (3, 4)):
        a_shape, b_shape = b_shape, a_shape  # the condition is (3, 4): keep one side full, the other broadcast
    x, y = _values(1, a_shape, positive), _values(2, b_shape, positive)
    weight = np.random.default_rng(3).standard_normal((3, 4))  # float64: the loss is not a plain sum
    a = ta.tensor(x, dtype=a_dtype, requires_grad=True)
    b = ta.tensor(y, dtype=b_dtype, requires_grad=True)
    out = op(a, b)
    assert out.dtype == np.float64  # promoted, as torch
    grads = _handed_grads((out * ta.Tensor(weight)).sum())
    want_a, want_b = _torch_grads(torch_op, [x, y], [a_dtype, b_dtype], weight)
    for t, want in ((a, want_a), (b, want_b)):
        got = grads[id(t)]
        assert got.dtype == t.dtype, f"{name}: a {t.dtype} input was handed a {got.dtype} gradient"
        assert got.shape == t.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=ATOL)


def test_a_float32_linear_plus_a_float64_bias_backpropagates_into_the_float32_gemm():
    # The failure this file is about: the float32 Linear's backward got a float64 gradient.
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((5, 3)), rng.standard_normal((4, 3)), rng.standard_normal(4)
    tx = ta.tensor(x, dtype=F32, requires_grad=True)
    tw = ta.tensor(w, dtype=F32, requires_grad=True)
    tb = ta.tensor(b, dtype=F64, requires_grad=True)
    (linear(tx, tw) + tb).sum().backward()
    px, pw = (torch.tensor(v, dtype=torch.float32, requires_grad=True) for v in (x, w))
    pb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    (torch.nn.functional.linear(px, pw) + pb).sum().backward()
    for t, p in ((tx, px), (tw, pw), (tb, pb)):
        assert t.grad.dtype == t.dtype
        np.testing.assert_allclose(t.grad, p.grad.numpy(), rtol=1e-5, atol=ATOL)


def test_a_bias_of_another_dtype_than_the_linear_gets_its_gradient_in_its_own_dtype():
    # torch refuses this mix; tensorarena adds the bias in the output's dtype, and its gradient is a
    # column sum of the output's gradient, handed over in the bias's own dtype.
    rng = np.random.default_rng(1)
    x = ta.tensor(rng.standard_normal((5, 3)), dtype=F32)
    w = ta.tensor(rng.standard_normal((4, 3)), dtype=F32, requires_grad=True)
    b = ta.tensor(rng.standard_normal(4), dtype=F64, requires_grad=True)
    g = rng.standard_normal((5, 4)).astype(F32)
    out = linear(x, w, b)
    assert out.dtype == F32
    seen = {}
    autograd.backward(out, g, on_leaf_grad=lambda leaf, grad: seen.update({id(leaf): np.array(grad)}) or False)
    assert seen[id(b)].dtype == F64
    np.testing.assert_allclose(seen[id(b)], g.astype(F64).sum(axis=0), rtol=1e-6, atol=ATOL)
    assert seen[id(w)].dtype == F32


def test_bias_gelu_linear_hands_each_bias_its_own_dtype():
    # A float64 weight promotes the fused MLP to float64 (torch's linear refuses the mix: the reference is
    # torch in float64); the float32 input and biases still get float32 gradients.
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s) for s in ((5, 3), (3,), (4, 3), (4,))]  # x, bias, weight, out_bias
    dtypes = [F32, F32, F64, F32]
    ts = [ta.tensor(v, dtype=d, requires_grad=True) for v, d in zip(arrays, dtypes)]
    weight = rng.standard_normal((5, 4))
    out = bias_gelu_linear(*ts)
    assert out.dtype == F64
    grads = _handed_grads((out * ta.Tensor(weight)).sum())
    ps = [torch.tensor(v.astype(d).astype(F64), requires_grad=True) for v, d in zip(arrays, dtypes)]
    x, b, w, ob = ps
    (torch.nn.functional.linear(torch.nn.functional.gelu(x + b), w, ob) * torch.from_numpy(weight)).sum().backward()
    for t, p in zip(ts, ps):
        assert grads[id(t)].dtype == t.dtype
        np.testing.assert_allclose(grads[id(t)], p.grad.numpy(), rtol=1e-5, atol=ATOL)


def test_agreeing_dtypes_cost_no_copy():
    # The hot path: with one dtype and one shape, add hands both parents the very gradient it received.
    a = ta.tensor(np.ones((2, 3)), dtype=F32, requires_grad=True)
    b = ta.tensor(np.ones((2, 3)), dtype=F32, requires_grad=True)
    root_grad = np.ones((2, 3), F32)
    handed = {}
    autograd.backward(a + b, root_grad, on_leaf_grad=lambda leaf, g: handed.update({id(leaf): g}) or False)
    assert handed[id(a)] is root_grad and handed[id(b)] is root_grad
    g = np.ones((2, 3), F64)
    assert unbroadcast(g, (2, 3)) is g and unbroadcast(g, (2, 3), F64) is g
