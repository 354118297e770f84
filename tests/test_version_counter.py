"""Saved-tensor version counter: an in-place write to a tensor an op saved for backward raises, as in torch.

Every tensor (and every view sharing its memory) carries a version counter that the engine's in-place write
paths bump (`+= -= *= /=`, tensorarena.autograd.increment_version); an op records the versions of the tensors
its backward reads, and backward checks them before any gradient is computed. Each program here runs in
tensorarena and in torch: both raise, or neither does and the gradients agree. Where a backward here reads a
value torch's does not (relu's input, div's quotient, cross_entropy's logits) it raises where torch does not:
stated below. Writes straight into a NumPy array (`t.data[...] = v`, `t.numpy()[...] = v`, the array a
Tensor wraps) are not seen by any counter; nothing here pretends they are.

Ops that save a tensor only for its shape (add, sum, reshape...) and writes made after backward are allowed, in
both. `x.data = y` keeps x's counter, as torch does. Optimizer.step() and Module.load_state_dict count their
writes (autograd.increment_version), and so do nn.init's fills.

Run: NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_version_counter.py

63 of these 125 tests fail on 499de7f, before the fixes (the counter: 50, among them every raise-in-both case and
every counter test; clone: 1; the four bugs found on the way: 4; Optimizer.step, load_state_dict and the 6
nn.init fills bumping: 8). With this
file copied into a worktree of 499de7f (git worktree add /tmp/old-vc 499de7f), run in /tmp/old-vc:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_version_counter.py`.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorarena as ta
from tensorarena import autograd
from tensorarena.nn import Parameter

F64 = dict(rtol=1e-10, atol=1e-12)
VERSION_ERROR = r"modified by an inplace operation.*is at version \d+; expected version \d+"


def _values(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


# The same program, written once, runs on either library through one of these namespaces.
TA = SimpleNamespace(
    name="tensorarena",
    leaf=lambda v: ta.tensor(np.asarray(v, np.float64), dtype=np.float64, requires_grad=True),
    const=lambda v: ta.tensor(np.asarray(v, np.float64), dtype=np.float64),
    ints=lambda v: ta.tensor(np.asarray(v, np.int64)),
    bools=lambda v: ta.tensor(np.asarray(v, np.bool_)),
    no_grad=ta.no_grad,
    F=SimpleNamespace(layer_norm=ta.ops.layer_norm, cross_entropy=ta.ops.cross_entropy, mse_loss=ta.ops.mse_loss,
                      embedding=ta.ops.embedding, linear=ta.ops.linear, gelu=ta.ops.gelu, where=ta.ops.where,
                      cat=ta.ops.cat, stack=ta.ops.stack, dropout=ta.ops.dropout,
                      sdpa=ta.ops.scaled_dot_product_attention),
)
TORCH = SimpleNamespace(
    name="torch",
    leaf=lambda v: torch.tensor(np.asarray(v, np.float64), requires_grad=True),
    const=lambda v: torch.tensor(np.asarray(v, np.float64)),
    ints=lambda v: torch.tensor(np.asarray(v, np.int64)),
    bools=lambda v: torch.tensor(np.asarray(v, np.bool_)),
    no_grad=torch.no_grad,
    F=SimpleNamespace(layer_norm=F.layer_norm, cross_entropy=F.cross_entropy, mse_loss=F.mse_loss,
                      embedding=F.embedding, linear=F.linear, gelu=F.gelu, where=torch.where,
                      cat=torch.cat, stack=torch.stack, dropout=F.dropout,
                      sdpa=F.scaled_dot_product_attention),
)


def _bump(t) -> None:
    """An in-place write that both libraries count: values change for floats, stay for ints and bools."""
    if t.dtype in (np.float64, torch.float64):
        t += 0.5
    elif t.dtype in (np.bool_, torch.bool):
        t *= True
    else:
        t *= 1


def _run(L, program, when="before"):
    """Build `program` in library L, write in place to the tensors it names (under no_grad) before or after
    backward; return (the RuntimeError backward raised or None, the leaves' gradients as arrays)."""
    loss, targets, leaves = program(L)
    if when == "before":
        with L.no_grad():
            for t in targets:
                _bump(t)
    try:
        loss.backward()
    except RuntimeError as e:
        return e, None
    if when == "after":
        with L.no_grad():
            for t in targets:
                _bump(t)
    return None, [np.asarray(leaf.grad) if leaf.grad is not None else None for leaf in leaves]


# Each program returns (scalar loss, tensors to write in place, leaves whose gradients are compared).
# Every program's loss multiplies by a fixed weight so the backward reaches each op with a nontrivial gradient.

def _mix(L, y, seed=99):
    return (y * L.const(_values(seed, tuple(y.shape)))).sum()


def mul_saved_operand(L):
    x, w = L.leaf(_values(0, 4)), L.leaf(_values(1, 4))
    h = x * 2.0
    return _mix(L, h * w), [h], [x, w]


def exp_output(L):
    x = L.leaf(_values(0, 3))
    y = x.exp()
    return _mix(L, y * 1.0), [y], [x]


def exp_output_through_a_slice(L):
    x = L.leaf(_values(0, 4))
    y = x.exp()
    return _mix(L, y * 1.0), [y[0:2]], [x]


def exp_output_through_detach(L):
    x = L.leaf(_values(0, 3))
    y = x.exp()
    return _mix(L, y * 1.0), [y.detach()], [x]


def exp_output_through_a_reshape_view(L):
    x = L.leaf(_values(0, (2, 3)))
    y = x.exp()
    return _mix(L, y * 1.0), [y.reshape(6)], [x]


def tanh_output(L):
    x = L.leaf(_values(0, 3))
    y = x.tanh()
    return _mix(L, y * 1.0), [y], [x]


def sigmoid_output(L):
    x = L.leaf(_values(0, 3))
    y = x.sigmoid()
    return _mix(L, y * 1.0), [y], [x]


def sqrt_output(L):
    x = L.leaf(np.abs(_values(0, 3)) + 1.0)
    y = x.sqrt()
    return _mix(L, y * 1.0), [y], [x]


def relu_output(L):
    x = L.leaf(_values(0, 6))
    y = x.relu()
    return _mix(L, y * 1.0), [y], [x]


def log_input(L):
    x = L.leaf(np.abs(_values(0, 3)) + 1.0)
    h = x * 1.0
    return _mix(L, h.log()), [h], [x]


def pow_scalar_input(L):
    x = L.leaf(_values(0, 3))
    h = x * 1.0
    return _mix(L, h ** 3), [h], [x]


def square_input(L):
    x = L.leaf(_values(0, 3))
    h = x * 1.0
    return _mix(L, h ** 2), [h], [x]


def pow_tensor_exponent(L):
    x, p = L.leaf(np.abs(_values(0, 3)) + 1.0), L.leaf(_values(1, 3))
    e = p * 1.0
    return _mix(L, x ** e), [e], [x, p]


def div_divisor(L):
    x, b = L.leaf(_values(0, 3)), L.leaf(np.abs(_values(1, 3)) + 1.0)
    d = b * 1.0
    return _mix(L, x / d), [d], [x, b]


def div_dividend_when_the_divisor_needs_grad(L):
    a, b = L.leaf(_values(0, 3)), L.leaf(np.abs(_values(1, 3)) + 1.0)
    h = a * 1.0
    return _mix(L, h / b), [h], [a, b]


def matmul_left(L):
    a, b = L.leaf(_values(0, (2, 3))), L.leaf(_values(1, (3, 4)))
    h = a * 1.0
    return _mix(L, h @ b), [h], [a, b]


def matmul_right_via_transpose_view(L):
    a, b = L.leaf(_values(0, (2, 3))), L.leaf(_values(1, (4, 3)))
    h = b * 1.0
    return _mix(L, a @ h.T), [h], [a, b]


def linear_weight_updated_before_backward(L):
    x, w, bias = L.leaf(_values(0, (5, 3))), L.leaf(_values(1, (4, 3))), L.leaf(_values(2, 4))
    return _mix(L, L.F.linear(x, w, bias)), [w], [x, w, bias]


def linear_input(L):
    x, w = L.leaf(_values(0, (5, 3))), L.leaf(_values(1, (4, 3)))
    h = x * 1.0
    return _mix(L, L.F.linear(h, w)), [h], [x, w]


def softmax_output_last_dim(L):
    x = L.leaf(_values(0, (2, 3)))
    y = x.softmax(-1)
    return _mix(L, y * 1.0), [y], [x]


def softmax_output_first_dim(L):
    x = L.leaf(_values(0, (2, 3)))
    y = x.softmax(0)
    return _mix(L, y * 1.0), [y], [x]


def log_softmax_output(L):
    x = L.leaf(_values(0, (2, 3)))
    y = x.log_softmax(-1)
    return _mix(L, y * 1.0), [y], [x]


def max_all_input(L):
    x = L.leaf(_values(0, 5))
    h = x * 1.0
    return h.max() * 2.0, [h], [x]


def max_dim_indices(L):
    x = L.leaf(_values(0, (2, 3)))
    values, indices = x.max(1)
    return _mix(L, values), [indices], [x]


def var_input(L):
    x = L.leaf(_values(0, 5))
    h = x * 1.0
    return h.var() * 2.0, [h], [x]


def layer_norm_input(L):
    x, w, b = L.leaf(_values(0, (2, 3))), L.leaf(_values(1, 3)), L.leaf(_values(2, 3))
    h = x * 1.0
    return _mix(L, L.F.layer_norm(h, (3,), w, b)), [h], [x, w, b]


def layer_norm_weight(L):
    x, w, b = L.leaf(_values(0, (2, 3))), L.leaf(_values(1, 3)), L.leaf(_values(2, 3))
    return _mix(L, L.F.layer_norm(x, (3,), w, b)), [w], [x, w, b]


def layer_norm_bias(L):
    x, w, b = L.leaf(_values(0, (2, 3))), L.leaf(_values(1, 3)), L.leaf(_values(2, 3))
    return _mix(L, L.F.layer_norm(x, (3,), w, b)), [b], [x, w, b]


def cross_entropy_target(L):
    x, t = L.leaf(_values(0, (2, 3))), L.ints([0, 2])
    return L.F.cross_entropy(x, t), [t], [x]


def mse_loss_input(L):
    x, y = L.leaf(_values(0, 3)), L.const(_values(1, 3))
    h = x * 1.0
    return L.F.mse_loss(h, y), [h], [x]


def mse_loss_target(L):
    x, y = L.leaf(_values(0, 3)), L.const(_values(1, 3))
    return L.F.mse_loss(x, y), [y], [x]


def where_condition(L):
    x, c = L.leaf(_values(0, 3)), L.bools([True, False, True])
    return _mix(L, L.F.where(c, x, 0.0)), [c], [x]


def embedding_indices(L):
    w, i = L.leaf(_values(0, (4, 2))), L.ints([0, 1, 1])
    return _mix(L, L.F.embedding(i, w)), [i], [w]


def index_tensor(L):
    x, i = L.leaf(_values(0, 4)), L.ints([0, 1, 1])
    return _mix(L, x[i]), [i], [x]


def gelu_input(L):
    x = L.leaf(_values(0, 3))
    h = x * 1.0
    return _mix(L, L.F.gelu(h)), [h], [x]


def sdpa_query(L):
    q, k, v = (L.leaf(_values(s, (1, 2, 3, 4))) for s in range(3))
    h = q * 1.0
    return _mix(L, L.F.sdpa(h, k, v)), [h], [q, k, v]


def sdpa_output(L):
    q, k, v = (L.leaf(_values(s, (1, 2, 3, 4))) for s in range(3))
    y = L.F.sdpa(q, k, v)
    return _mix(L, y * 1.0), [y], [q, k, v]


def hand_written_sgd_step_before_backward(L):
    w, x = L.leaf(_values(0, (3, 3))), L.leaf(_values(1, (2, 3)))  # x needs grad, so x @ w saves w
    return _mix(L, (x @ w).tanh()), [w], [w, x]


RAISE_IN_BOTH = [
    mul_saved_operand, exp_output, exp_output_through_a_slice, exp_output_through_detach,
    exp_output_through_a_reshape_view, tanh_output, sigmoid_output, sqrt_output, relu_output, log_input,
    pow_scalar_input, square_input, pow_tensor_exponent, div_divisor, div_dividend_when_the_divisor_needs_grad,
    matmul_left, matmul_right_via_transpose_view, linear_weight_updated_before_backward, linear_input,
    softmax_output_last_dim, softmax_output_first_dim, log_softmax_output, max_all_input, max_dim_indices,
    var_input, layer_norm_input, layer_norm_weight, layer_norm_bias, cross_entropy_target, mse_loss_input,
    mse_loss_target, where_condition, embedding_indices, index_tensor, gelu_input, sdpa_query, sdpa_output,
    hand_written_sgd_step_before_backward,
]


# Regression (fixed): an in-place write to a tensor a recorded op saved for backward went unnoticed and backward
# silently used the new values (wrong gradients); torch raises "... is at version 1; expected version 0".
@pytest.mark.parametrize("program", RAISE_IN_BOTH, ids=lambda p: p.__name__)
def test_writing_a_saved_tensor_before_backward_raises_like_torch(program):
    torch_error, _ = _run(TORCH, program)
    assert torch_error is not None and re.search(VERSION_ERROR, str(torch_error)), torch_error
    error, _ = _run(TA, program)
    assert error is not None, f"{program.__name__}: backward used the overwritten values silently"
    assert re.search(VERSION_ERROR, str(error)), error


# Programs whose written tensor no backward reads (saved for its shape only, or not saved at all).

def add_operands(L):
    x, w = L.leaf(_values(0, 4)), L.leaf(_values(1, 4))
    h, u = x * 1.0, w * 1.0
    return _mix(L, h + u - h), [h, u], [x, w]


def sum_and_mean_input(L):
    x = L.leaf(_values(0, (2, 3)))
    h = x * 1.0
    return h.sum() + h.mean(), [h], [x]


def reshape_and_transpose_input(L):
    x = L.leaf(_values(0, (2, 3)))
    h = x * 1.0
    return _mix(L, h.reshape(3, 2) + h.T), [h], [x]


def mul_operand_whose_partner_needs_no_grad(L):
    x = L.leaf(_values(0, 3))
    h = x * 1.0
    return _mix(L, h * L.const(_values(1, 3))), [h], [x]


def div_dividend_when_only_it_needs_grad(L):
    a = L.leaf(_values(0, 3))
    h = a * 1.0
    return _mix(L, h / L.const(np.abs(_values(1, 3)) + 1.0)), [h], [a]


def exp_input(L):
    x = L.leaf(_values(0, 3))
    h = x * 1.0
    return _mix(L, h.exp()), [h], [x]


def embedding_weight(L):
    w, i = L.leaf(_values(0, (4, 2))), L.ints([0, 1, 1])
    return _mix(L, L.F.embedding(i, w)), [w], [w]


def linear_bias(L):
    x, w, b = L.leaf(_values(0, (5, 3))), L.leaf(_values(1, (4, 3))), L.leaf(_values(2, 4))
    h = b * 1.0
    return _mix(L, L.F.linear(x, w, h)), [h], [x, w, b]


def where_branches(L):
    x, y = L.leaf(_values(0, 3)), L.leaf(_values(1, 3))
    h, u = x * 1.0, y * 1.0
    return _mix(L, L.F.where(L.bools([True, False, True]), h, u)), [h, u], [x, y]


def cat_and_stack_inputs(L):
    x, y = L.leaf(_values(0, 3)), L.leaf(_values(1, 3))
    h, u = x * 1.0, y * 1.0
    return _mix(L, L.F.cat([h, u])) + _mix(L, L.F.stack([h, u])), [h, u], [x, y]


def dropout_input_in_eval(L):
    x = L.leaf(_values(0, 3))
    h = x * 1.0
    return _mix(L, L.F.dropout(h, 0.5, training=False) * 2.0), [h], [x]


def basic_slice_input(L):
    x = L.leaf(_values(0, 5))
    h = x * 1.0
    return _mix(L, h[1:4]), [h], [x]


NO_RAISE_IN_BOTH = [
    add_operands, sum_and_mean_input, reshape_and_transpose_input, mul_operand_whose_partner_needs_no_grad,
    div_dividend_when_only_it_needs_grad, exp_input, embedding_weight, linear_bias, where_branches,
    cat_and_stack_inputs, dropout_input_in_eval, basic_slice_input,
]


@pytest.mark.parametrize("program", NO_RAISE_IN_BOTH, ids=lambda p: p.__name__)
def test_writing_a_tensor_no_backward_reads_is_allowed_like_torch(program):
    torch_error, expected = _run(TORCH, program)
    assert torch_error is None, torch_error
    error, grads = _run(TA, program)
    assert error is None, error
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, **F64)


@pytest.mark.parametrize("program", RAISE_IN_BOTH + NO_RAISE_IN_BOTH, ids=lambda p: p.__name__)
def test_writing_after_backward_is_allowed_and_gradients_match_torch(program):
    torch_error, expected = _run(TORCH, program, when="after")
    error, grads = _run(TA, program, when="after")
    assert torch_error is None and error is None, (torch_error, error)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, **F64)


# --- where this engine's backward reads a value torch's does not -------------------------------------------------

def relu_input(L):
    x = L.leaf(_values(0, 6))
    h = x * 1.0
    return _mix(L, h.relu()), [h], [x]


def div_quotient(L):
    a, b = L.leaf(_values(0, 3)), L.leaf(np.abs(_values(1, 3)) + 1.0)
    q = a / b
    return _mix(L, q * 1.0), [q], [a, b]


def cross_entropy_logits(L):
    x = L.leaf(_values(0, (2, 3)))
    h = x * 1.0
    return L.F.cross_entropy(h, L.ints([0, 2])), [h], [x]


# Regression (fixed): these backwards read the written values (relu its input for the mask, div its output for the
# divisor's gradient, cross_entropy the logits to recompute softmax) and gave wrong gradients silently. torch
# saves other tensors there (relu's output, div's dividend, log_softmax's output), so only this engine raises.
@pytest.mark.parametrize("program", [relu_input, div_quotient, cross_entropy_logits], ids=lambda p: p.__name__)
def test_writing_what_only_this_engine_reads_raises_here_not_in_torch(program):
    torch_error, _ = _run(TORCH, program)
    assert torch_error is None, torch_error
    error, _ = _run(TA, program)
    assert error is not None and re.search(VERSION_ERROR, str(error)), error


# --- the counter itself ---------------------------------------------------------------------------------------

# Regression (fixed): tensors had no version counter at all (torch's `t._version`).
def test_version_numbers_follow_torch_through_views_detach_and_copies():
    a = _values(0, (2, 3))
    ours, theirs = ta.tensor(a, dtype=np.float64), torch.tensor(a)

    def versions(make):
        x = make(ours) if make else ours
        t = make(theirs) if make else theirs
        return x, t

    seen = []
    for make in (None, lambda t: t[0:1], lambda t: t.detach(), lambda t: t.reshape(6), lambda t: t.T,
                 lambda t: t.T.reshape(6)):  # the last one is a copy: its own counter, in both
        x, t = versions(make)
        x += 1.0
        t += 1.0
        seen.append((ours._version, x._version, theirs._version, t._version))
    assert [(o, v) for o, v, _, _ in seen] == [(to, tv) for _, _, to, tv in seen]
    assert seen[-1][1] == 1 and seen[-1][0] == 5  # the copy counts its own write only
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), **F64)


# Regression (fixed): no way existed for the engine's other write paths (an optimizer, init, load_state_dict) to say
# they wrote a tensor; increment_version is torch.autograd.graph.increment_version's counterpart.
def test_increment_version_marks_a_write_that_backward_then_refuses():
    x = ta.tensor(_values(0, 3), requires_grad=True)
    y = x.exp()
    autograd.increment_version(y)
    assert y._version == 1
    with pytest.raises(RuntimeError, match=VERSION_ERROR):
        y.sum().backward()
    with pytest.raises(TypeError, match="Tensor"):
        autograd.increment_version(np.ones(3))


# Regression (fixed): the error must name the op, the tensor and both versions, and say what to do.
def test_error_names_op_shape_dtype_versions_and_the_fix():
    x = ta.tensor(_values(0, (2, 3)), requires_grad=True)
    y = x.tanh()
    with ta.no_grad():
        y *= 2.0
        y += 1.0
    with pytest.raises(RuntimeError) as info:
        y.sum().backward()
    message = str(info.value)
    for part in ("tanh", "(2, 3)", "float64", "its output", "is at version 2; expected version 0",
                 "clone()", "after backward"):
        assert part in message, (part, message)


# The ops that share unary.of_output and of_input name themselves, not the helper (a first sharing said
# "'of_output'"; sin and cos said "'of_input'" on 4de6ccc: those two cases fail there).
@pytest.mark.parametrize("op", ["tanh", "sqrt", "rsqrt", "sin", "cos"])
def test_elementwise_ops_are_named_by_their_own_name(op):
    x = ta.tensor(_values(0, (2, 3)) ** 2 + 1.0, requires_grad=True)
    h = x * 1.0  # a non-leaf: sin and cos save their input, written below
    y = getattr(ta, op)(h)
    with ta.no_grad():
        (h if op in ("sin", "cos") else y).add_(1.0)
    with pytest.raises(RuntimeError, match=f"saved by '{op}' for its backward"):
        y.sum().backward()


# Regression (fixed): a detected write must leave nothing half done: no leaf gets a gradient, and the graph is
# not freed, so after undoing the cause (here: a fresh forward) training goes on.
def test_the_check_runs_before_any_gradient_is_written():
    w = ta.tensor(_values(0, 3), requires_grad=True)
    b = ta.tensor(_values(1, 3), requires_grad=True)
    h = (w * 2.0).exp()  # exp saves its output h
    loss = (h + b).sum()
    with ta.no_grad():
        h += 1.0
    with pytest.raises(RuntimeError, match=VERSION_ERROR):
        loss.backward()
    assert w.grad is None and b.grad is None
    with pytest.raises(RuntimeError, match=VERSION_ERROR):  # still checked, not "backward a second time"
        loss.backward()


def test_retain_graph_then_a_write_then_a_second_backward_raises_like_torch():
    for L in (TA, TORCH):
        x = L.leaf(_values(0, 3))
        y = x.exp()
        loss = _mix(L, y * 1.0)
        loss.backward(retain_graph=True)
        with L.no_grad():
            y += 1.0
        with pytest.raises(RuntimeError, match=VERSION_ERROR):
            loss.backward()


def test_tensor_wrapping_another_tensors_memory_shares_its_counter():
    x = ta.tensor(_values(0, 3), requires_grad=True)
    y = x.exp()
    alias = ta.Tensor(y)  # same memory as y
    copy = ta.Tensor(y, dtype=np.float32)  # a converted copy: its own memory and counter
    copy += 1.0
    y.sum().backward(retain_graph=True)  # the copy's write touched nothing exp saved
    alias += 1.0
    assert y._version == 1
    with pytest.raises(RuntimeError, match=VERSION_ERROR):
        y.sum().backward()


def test_data_assignment_keeps_the_counter_like_torch():
    # torch keeps the counter when `.data` is replaced (no write happened); a later in-place write still counts.
    for L in (TA, TORCH):
        x = L.leaf(_values(0, 3))
        h = x * 1.0
        loss = _mix(L, h * x)
        h.data = L.const(np.zeros(3)).data if L is TORCH else np.zeros(3)
        assert h._version == 0
        with L.no_grad():
            h += 1.0
        with pytest.raises(RuntimeError, match=VERSION_ERROR):
            loss.backward()


def test_refused_inplace_write_does_not_count_as_a_write():
    x = ta.tensor(_values(0, 3), requires_grad=True)
    y = x.exp()
    with pytest.raises(RuntimeError, match="x = x"):
        y += 1.0  # refused with grad enabled on a non-leaf: nothing written
    with pytest.raises(ValueError):
        with ta.no_grad():
            y += ta.tensor(np.ones((2, 3)))  # a shape error: nothing written
    assert y._version == 0
    y.sum().backward()
    np.testing.assert_allclose(x.grad, np.exp(_values(0, 3)), **F64)


def test_parameter_updated_by_hand_between_forward_and_backward_raises_like_torch():
    p = Parameter(_values(0, (3, 2)), dtype=np.float64)
    tp = torch.tensor(_values(0, (3, 2)), requires_grad=True)
    x = _values(1, (4, 3))
    for param, L in ((p, TA), (tp, TORCH)):
        loss = (L.leaf(x) @ param).tanh().sum()  # an input that needs grad: the product saves the parameter
        with L.no_grad():
            param -= 0.1  # a step taken before this forward's backward (a common loop-ordering mistake)
        with pytest.raises(RuntimeError, match=VERSION_ERROR):
            loss.backward()


# Regression (fixed): Optimizer.step wrote parameters through NumPy without autograd.increment_version(p)
def test_optimizer_step_between_forward_and_backward_raises_like_torch():
    p = Parameter(_values(0, (3, 2)), dtype=np.float64)
    p.grad = np.ones((3, 2))
    opt = ta.optim.SGD([p], lr=0.1)
    loss = (ta.tensor(_values(1, (4, 3)), dtype=np.float64, requires_grad=True) @ p).tanh().sum()
    opt.step()
    with pytest.raises(RuntimeError, match=VERSION_ERROR):
        loss.backward()


# Regression (fixed): Module.load_state_dict copied into parameters without bumping their counters
def test_load_state_dict_between_forward_and_backward_raises_like_torch():
    ours, theirs = ta.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    halves = {"weight": np.full((2, 3), 0.5), "bias": np.full(2, 0.5)}
    x = _values(1, (4, 3))
    for model, L, load in ((ours, TA, halves), (theirs, TORCH, {k: torch.tensor(v) for k, v in halves.items()})):
        loss = model(L.leaf(x)).tanh().sum()  # the product saved the weight for x's gradient
        model.load_state_dict(load)
        with pytest.raises(RuntimeError, match=VERSION_ERROR):
            loss.backward()


# Regression (fixed): nn.init's fills wrote through NumPy without bumping the counter, so a re-initialised
# weight was differentiated at its new values by a graph built before the fill
@pytest.mark.parametrize("fill", ["constant_", "zeros_", "normal_", "uniform_", "kaiming_uniform_", "xavier_uniform_"])
def test_init_fill_between_forward_and_backward_raises_like_torch(fill):
    args = (0.5,) if fill == "constant_" else ()
    for L, init in ((TA, ta.nn.init), (TORCH, torch.nn.init)):
        w = (ta.nn.Parameter(_values(0, (3, 2)), dtype=np.float64) if L is TA
             else torch.tensor(_values(0, (3, 2)), requires_grad=True))
        loss = (L.leaf(_values(1, (4, 3))) @ w).tanh().sum()
        with L.no_grad():
            getattr(init, fill)(w, *args)
        with pytest.raises(RuntimeError, match=VERSION_ERROR):
            loss.backward()


def test_clone_is_the_way_out_and_its_gradient_matches_torch():
    grads = []
    for L in (TA, TORCH):
        x = L.leaf(_values(0, 3))
        y = x.exp()
        c = y.clone()  # its own memory and counter: writing it leaves what exp saved alone
        with L.no_grad():
            c += 0.5
        loss = _mix(L, y * 1.0) + _mix(L, c * 2.0, seed=98)
        loss.backward()
        grads.append(np.asarray(x.grad))
    assert y._version == 0 and c._version == 1
    np.testing.assert_allclose(grads[0], grads[1], **F64)


# --- found while adding the counter -------------------------------------------------------------------------------

# Regression (fixed): `total += w * 3` with grad enabled, total not requiring grad and w requiring it, wrote the values
# and dropped the graph: w's gradient through total was silently lost (torch records the op and gives w.grad 6).
# Autograd records no in-place op here, so the write is refused, saying what to write instead.
def test_inplace_of_a_grad_requiring_operand_into_a_plain_tensor_is_refused_not_silently_ungraded():
    tw = torch.tensor([1.0, 2.0], requires_grad=True)
    total = torch.zeros(2)
    total += tw * 3.0
    (total * 2.0).sum().backward()
    np.testing.assert_allclose(tw.grad.numpy(), [6.0, 6.0])  # torch: the gradient arrives
    w = ta.tensor([1.0, 2.0], requires_grad=True)
    ours = ta.tensor([0.0, 0.0])
    with pytest.raises(RuntimeError, match=r"total = total \+ y|x = x \+ y"):
        ours += w * 3.0
    np.testing.assert_array_equal(ours.numpy(), [0.0, 0.0])  # nothing written
    assert ours._version == 0
    with ta.no_grad():  # not differentiated: allowed, as in torch
        ours += w * 3.0
    np.testing.assert_array_equal(ours.numpy(), [3.0, 6.0])


# Regression (fixed): `x.data = other_tensor` (torch's way to swap a tensor's values) made an object array of 0-d
# Tensors, which the next op failed on far from the cause.
def test_data_assignment_of_a_tensor_shares_its_array_like_torch():
    x = ta.tensor([1.0, 2.0], requires_grad=True)
    y = ta.tensor([5.0, 6.0])
    x.data = y
    assert x.data is y.data and x.dtype == np.float32
    tx, ty = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([5.0, 6.0])
    tx.data = ty
    (x * x).sum().backward()
    (tx * tx).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy())
    with ta.Arena():
        z = ta.tensor([1.0, 2.0]) * 2.0  # arena memory
        x.data = z
    with pytest.raises(ta.StaleTensorError):  # z's arena closed: x must not read reused memory
        x.numpy()


# Regression (fixed): `.data` took anything NumPy makes an array of: an object array, or an int array under a tensor
# that requires grad (torch: "data set to a tensor that requires gradients must be floating point").
def test_data_assignment_refuses_what_no_tensor_can_hold():
    x = ta.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(TypeError, match="floating point"):
        x.data = np.array([1, 2])
    with pytest.raises(TypeError, match="object"):
        x.data = np.array([object(), object()])
    assert x.dtype == np.float32
    i = ta.tensor([1, 2])
    i.data = np.array([3, 4])  # a tensor that needs no grad may hold integers
    np.testing.assert_array_equal(i.numpy(), [3, 4])


# Regression (fixed): backward(grad=[1.0, 1.0]) failed with "AttributeError: 'list' object has no attribute 'shape'";
# torch raises a TypeError naming what a gradient may be.
def test_backward_with_a_list_gradient_is_a_clear_type_error():
    x = ta.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(TypeError, match="ndarray or Tensor"):
        (x * 2.0).backward([1.0, 1.0])
    (x * 2.0).backward(np.ones(2))
    np.testing.assert_allclose(x.grad, [2.0, 2.0])
