"""The torch ops a ported training loop still missed, each against torch: values, dtypes, shapes and gradients.

1. losses and activations: F.nll_loss (weight, ignore_index, reduction), F.binary_cross_entropy and
   F.binary_cross_entropy_with_logits (weight, pos_weight, reduction, the target's gradient, the stable form at
   +-100), F.l1_loss / smooth_l1_loss / huber_loss, F.silu / leaky_relu / elu / softplus, F.normalize, F.pad
   (constant), logsumexp, and their nn modules (SiLU, LeakyReLU, ELU, Softplus, Sigmoid, Softmax, LogSoftmax,
   the *Loss classes);
2. tensor ops: flip, roll, tril, triu, diag, outer, maximum / minimum (ties split the gradient), % and //
   (torch's sign rules; no derivative for //), cumsum, prod (exact at zeros), norm (2, 1, inf, p, dims), amax /
   amin, index_select, masked_select, nonzero, einsum ('...' too), and their Tensor method forms;
3. one test per group that trains a small model with the ops on the eager, fused/python and fused/captured
   routes against torch over six steps, asserting which route and replay ran.

Every test compares with torch (the reference, imported here only) with explicit tolerances, or asserts an exact
error. Run: NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_torch_ops4.py

All 395 of these tests fail on d0c9eb9, the commit this work started from (none of the ops, modules or methods
existed there): `git worktree add /tmp/wt-ops4 d0c9eb9`, copy this file into /tmp/wt-ops4/tests/, and from inside
/tmp/wt-ops4 run `PYTHONPATH=/tmp/wt-ops4 python -m pytest -q -p no:cacheprovider tests/test_torch_ops4.py`
(then `git worktree remove --force /tmp/wt-ops4`).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import tensorarena as ta

F32 = dict(rtol=2e-6, atol=1e-7)
F64 = dict(rtol=1e-12, atol=1e-14)
TOL = {np.float32: F32, np.float64: F64}
DTYPES = [np.float32, np.float64]


def _torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(1, dtype)).dtype


def _same_dtype(ours, theirs) -> None:
    assert _torch_dtype(ours.dtype) == theirs.dtype, (ours.dtype, theirs.dtype)


def _pair(values: np.ndarray, requires_grad: bool = True):
    return ta.tensor(values, requires_grad=requires_grad), torch.tensor(values, requires_grad=requires_grad)


def _close(ours, theirs, tol) -> None:
    with np.errstate(under="ignore"):  # the comparison itself: rtol * a subnormal expected value
        np.testing.assert_allclose(ours, theirs, **tol)


def _check(y, ty, tol, leaves=(), seed: int = 2) -> None:
    """Same shape, dtype and values; then, with a random upstream gradient, the same gradient in every leaf pair."""
    assert y.shape == tuple(ty.shape)
    _same_dtype(y, ty)
    _close(y.numpy(), ty.detach().numpy(), tol)
    if not ty.requires_grad:
        assert not y.requires_grad
        return
    g = np.random.default_rng(seed).standard_normal(y.shape).astype(y.dtype)
    y.backward(g)
    ty.backward(torch.from_numpy(g))
    for ours, theirs in leaves:
        if theirs.grad is None:
            assert ours.grad is None
        else:
            _close(ours.grad, theirs.grad.numpy(), tol)


# -- 1. losses ---------------------------------------------------------------------------------------------------

RNG = np.random.default_rng(4)


def _nll_case(shape_case: str, dtype, ignore: bool):
    if shape_case == "(N, C)":
        logits, target = RNG.standard_normal((6, 4)), np.array([2, 0, 3, 1, 3, 0])
    elif shape_case == "(N, C, d)":
        logits, target = RNG.standard_normal((2, 4, 3)), np.array([[0, 3, 1], [2, 2, 0]])
    else:  # "(C,)"
        logits, target = RNG.standard_normal(4), np.array(2)
    if ignore and target.ndim:
        target = target.copy()
        target.flat[1] = -100
    logp = torch.log_softmax(torch.from_numpy(logits), dim=0 if logits.ndim == 1 else 1).numpy()
    return logp.astype(dtype), target


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape_case", ["(N, C)", "(N, C, d)", "(C,)"])
@pytest.mark.parametrize("weighted", [False, True], ids=["no-weight", "weight"])
@pytest.mark.parametrize("ignore", [False, True], ids=["all-count", "ignore_index"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_matches_torch(dtype, shape_case, weighted, ignore, reduction):
    logp, target = _nll_case(shape_case, dtype, ignore)
    weight = np.array([0.5, 2.0, 1.0, 3.0], dtype) if weighted else None
    x, tx = _pair(logp)
    y = ta.nn.functional.nll_loss(x, ta.tensor(target), None if weight is None else ta.tensor(weight),
                                  reduction=reduction)
    ty = torch.nn.functional.nll_loss(tx, torch.tensor(target), None if weight is None else torch.tensor(weight),
                                      reduction=reduction)
    _check(y, ty, TOL[dtype], [(x, tx)])


def test_nll_loss_custom_ignore_index_and_everything_ignored_as_torch():
    logp, target = _nll_case("(N, C)", np.float32, False)
    for ignore_index, t in ((3, target), (-1, np.full(6, -1))):  # an in-range ignore_index; then no position counts
        x, tx = _pair(logp)
        y = ta.nn.functional.nll_loss(x, ta.tensor(t), ignore_index=ignore_index)
        ty = torch.nn.functional.nll_loss(tx, torch.tensor(t), ignore_index=ignore_index)
        _check(y, ty, F32, [(x, tx)])  # the second: a nan loss and the gradient torch gives


def test_nll_loss_refuses_what_torch_refuses():
    logp, target = _nll_case("(N, C)", np.float32, False)
    with pytest.raises(IndexError, match="Target 4 is out of bounds"):
        torch.nn.functional.nll_loss(torch.tensor(logp), torch.tensor([4, 0, 0, 0, 0, 0]))
    with pytest.raises(IndexError, match=re.escape("nll_loss: Target 4 is out of bounds: class indices must be in "
                                                   "[0, 4) or equal ignore_index=-100")):
        ta.nn.functional.nll_loss(ta.tensor(logp), ta.tensor(np.array([4, 0, 0, 0, 0, 0])))
    with pytest.raises(ValueError, match=re.escape("nll_loss: target shape (5,) does not match input shape (6, 4)")):
        ta.nn.functional.nll_loss(ta.tensor(logp), ta.tensor(target[:5]))
    with pytest.raises(RuntimeError, match=re.escape("nll_loss: weight requires grad, but the loss has no gradient "
                                                     "for its class weights")):
        ta.nn.functional.nll_loss(ta.tensor(logp), ta.tensor(target), ta.tensor(np.ones(4, np.float32),
                                                                                requires_grad=True))
    with pytest.raises(ValueError, match=re.escape("nll_loss: weight must have shape (4,), one per class, got (3,)")):
        ta.nn.functional.nll_loss(ta.tensor(logp), ta.tensor(target), ta.tensor(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match=re.escape("nll_loss: reduction must be one of 'mean', 'sum', 'none', got "
                                                   "'avg'")):
        ta.nn.functional.nll_loss(ta.tensor(logp), ta.tensor(target), reduction="avg")


PROBS = np.array([[0.0, 0.2, 0.5, 1.0], [0.9, 1e-30, 0.3, 0.7], [0.05, 0.6, 1.0, 0.0]])  # exact 0 and 1: the clamp
TARGETS = np.array([[0.0, 1.0, 0.5, 1.0], [1.0, 0.0, 0.0, 1.0], [0.3, 1.0, 0.0, 1.0]])  # soft labels too


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True], ids=["no-weight", "weight"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_matches_torch_including_the_clamped_logs(dtype, weighted, reduction):
    # At x = 0 or 1 the input's gradient is huge and the target's infinite, as torch's; the target's is checked
    # where x is strictly inside (0, 1), the input's everywhere.
    x, tx = _pair(PROBS.astype(dtype))
    y_t, ty_t = _pair(TARGETS.astype(dtype))
    w = np.array([1.0, 0.5, 2.0, 0.0], dtype) if weighted else None
    y = ta.nn.functional.binary_cross_entropy(x, y_t, None if w is None else ta.tensor(w), reduction=reduction)
    ty = torch.nn.functional.binary_cross_entropy(tx, ty_t, None if w is None else torch.tensor(w),
                                                  reduction=reduction)
    _check(y, ty, TOL[dtype], [(x, tx)])
    inside = (PROBS > 0) & (PROBS < 1)
    np.testing.assert_allclose(y_t.grad[inside], ty_t.grad.numpy()[inside], **TOL[dtype])
    assert np.array_equal(np.isinf(y_t.grad), np.isinf(ty_t.grad.numpy()))


LOGITS = np.array([[-100.0, -3.0, 0.0, 2.5], [100.0, 0.7, -0.2, 40.0], [-40.0, 1.5, -1.0, 0.0]])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True], ids=["no-weight", "weight"])
@pytest.mark.parametrize("pos", [False, True], ids=["no-pos_weight", "pos_weight"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits_is_stable_and_matches_torch(dtype, weighted, pos, reduction):
    x, tx = _pair(LOGITS.astype(dtype))
    y_t, ty_t = _pair(TARGETS.astype(dtype))
    w = np.array([[1.0], [0.5], [2.0]], dtype) if weighted else None  # per row, broadcast
    p = np.array([3.0, 0.5, 1.0, 2.0], dtype) if pos else None  # per class (last dim)
    y = ta.nn.functional.binary_cross_entropy_with_logits(x, y_t, None if w is None else ta.tensor(w),
                                                          reduction=reduction,
                                                          pos_weight=None if p is None else ta.tensor(p))
    ty = torch.nn.functional.binary_cross_entropy_with_logits(tx, ty_t, None if w is None else torch.tensor(w),
                                                              reduction=reduction,
                                                              pos_weight=None if p is None else torch.tensor(p))
    assert np.all(np.isfinite(y.numpy()))  # +-100 logits: no overflow
    _check(y, ty, TOL[dtype], [(x, tx), (y_t, ty_t)])


@pytest.mark.parametrize("fn", ["binary_cross_entropy", "binary_cross_entropy_with_logits"])
def test_binary_cross_entropy_refuses_what_torch_refuses(fn):
    ours, theirs = getattr(ta.nn.functional, fn), getattr(torch.nn.functional, fn)
    x, t = PROBS.astype(np.float32), TARGETS.astype(np.float32)
    with pytest.raises(ValueError, match="size"):
        theirs(torch.tensor(x), torch.tensor(t[:, :1]))
    with pytest.raises(ValueError, match=re.escape(f"{fn}: target size (3, 1) must be the same as input size "
                                                   f"(3, 4); reshape one explicitly")):
        ours(ta.tensor(x), ta.tensor(t[:, :1]))
    with pytest.raises(RuntimeError, match=re.escape(f"{fn}: weight requires grad, but the loss has no gradient "
                                                     f"for it (as torch's); pass weight.detach()")):
        ours(ta.tensor(x), ta.tensor(t), ta.tensor(np.ones(4, np.float32), requires_grad=True))
    with pytest.raises(ValueError, match=re.escape(f"{fn}: weight of shape (3,) does not broadcast to the input's "
                                                   f"shape (3, 4)")):
        ours(ta.tensor(x), ta.tensor(t), ta.tensor(np.ones(3, np.float32)))


def test_binary_cross_entropy_refuses_probabilities_outside_0_1_as_torch():
    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        torch.nn.functional.binary_cross_entropy(torch.tensor([1.5]), torch.tensor([1.0]))
    with pytest.raises(RuntimeError, match=re.escape("binary_cross_entropy: all elements of input should be between "
                                                     "0 and 1 (found 1.5); for logits use "
                                                     "binary_cross_entropy_with_logits")):
        ta.nn.functional.binary_cross_entropy(ta.tensor([1.5]), ta.tensor([1.0]))
    with pytest.raises(RuntimeError, match=re.escape("binary_cross_entropy: all elements of target should be "
                                                     "between 0 and 1 (found -1.0)")):
        ta.nn.functional.binary_cross_entropy(ta.tensor([0.5]), ta.tensor([-1.0]))


REG_X = np.array([[-3.0, -1.0, -0.5, 0.0], [0.25, 1.0, 2.0, 5.0]])
REG_Y = np.array([[0.0, 0.0, 0.0, 0.0], [0.25, 0.0, 0.5, 1.0]])  # differences 0, +-1, +-0.5 and large: every branch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", [("l1_loss", {}), ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}),
                                          ("smooth_l1_loss", {"beta": 0.0}), ("huber_loss", {}),
                                          ("huber_loss", {"delta": 0.5}), ("huber_loss", {"delta": 2.0})])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses_match_torch(dtype, name, kwargs, reduction):
    x, tx = _pair(REG_X.astype(dtype))
    t, tt = _pair(REG_Y.astype(dtype))
    y = getattr(ta.nn.functional, name)(x, t, reduction=reduction, **kwargs)
    ty = getattr(torch.nn.functional, name)(tx, tt, reduction=reduction, **kwargs)
    _check(y, ty, TOL[dtype], [(x, tx), (t, tt)])


def test_regression_losses_refuse_broadcasting_and_bad_parameters():
    x, t = ta.tensor(np.ones((4, 1), np.float32)), ta.tensor(np.ones(4, np.float32))
    for name in ("l1_loss", "smooth_l1_loss", "huber_loss"):
        with pytest.raises(ValueError, match=re.escape(f"{name}: input shape (4, 1) and target shape (4,) differ; "
                                                       f"reshape one explicitly")):
            getattr(ta.nn.functional, name)(x, t)
    with pytest.raises(ValueError, match=re.escape("huber_loss: delta must be positive, got 0.0")):
        ta.nn.functional.huber_loss(t, t, delta=0.0)
    with pytest.raises(RuntimeError, match="huber_loss does not support non-positive values for delta"):
        torch.nn.functional.huber_loss(torch.ones(4), torch.ones(4), delta=0.0)
    with pytest.raises(ValueError, match=re.escape("smooth_l1_loss: beta must be non-negative, got -1.0")):
        ta.nn.functional.smooth_l1_loss(t, t, beta=-1.0)


# -- 1b. activations, normalize, pad, logsumexp -------------------------------------------------------------------

XV = np.random.default_rng(11).permutation(24).reshape(2, 3, 4).astype(np.float64) / 4 - 2  # distinct, 0 included
EXTREMES = np.array([-800.0, -30.0, -1e-3, 0.0, 1e-3, 19.9, 30.0, 800.0])  # overflow bait and the kinks

ACTIVATIONS = {
    "silu": lambda F, x: F.silu(x),
    "leaky_relu default": lambda F, x: F.leaky_relu(x),
    "leaky_relu 0.2": lambda F, x: F.leaky_relu(x, 0.2),
    "elu default": lambda F, x: F.elu(x),
    "elu alpha 0.5": lambda F, x: F.elu(x, alpha=0.5),
    "softplus default": lambda F, x: F.softplus(x),
    "softplus beta 2 threshold 3": lambda F, x: F.softplus(x, beta=2.0, threshold=3.0),
    "softplus beta 0.5": lambda F, x: F.softplus(x, beta=0.5),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("values", [XV, EXTREMES], ids=["grid", "extremes"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_matches_torch_values_and_gradient_at_the_kinks(name, values, dtype):
    x, tx = _pair(values.astype(dtype))
    with np.errstate(all="raise"):  # no overflow, underflow or invalid on the way: the stable forms
        y = ACTIVATIONS[name](ta.nn.functional, x)
    _check(y, ACTIVATIONS[name](torch.nn.functional, tx), TOL[dtype], [(x, tx)])


def test_activations_refuse_inplace_and_integer_input():
    with pytest.raises(ValueError, match=re.escape("leaky_relu: inplace=True is not supported (ops here return a new "
                                                   "tensor); write x = F.leaky_relu(x) instead")):
        ta.nn.functional.leaky_relu(ta.tensor([1.0]), 0.1, inplace=True)
    with pytest.raises(TypeError, match=re.escape("silu: the input must be floating point, got dtype int64")):
        ta.nn.functional.silu(ta.tensor(np.arange(3)))


FUNCTIONALS = {
    "normalize": lambda F, x: F.normalize(x),
    "normalize last dim": lambda F, x: F.normalize(x, dim=-1),
    "normalize p=1 dim 0": lambda F, x: F.normalize(x, p=1.0, dim=0),
    "normalize a zero row": lambda F, x: F.normalize(x * (x[:, :, :1] > 0), dim=-1),  # some rows all zero
    "pad last dim": lambda F, x: F.pad(x, (1, 2)),
    "pad two dims with a value": lambda F, x: F.pad(x, (0, 1, 2, 0), value=0.5),
    "pad crops with negatives": lambda F, x: F.pad(x, (-1, 1, 1, -2)),
    "pad all three dims": lambda F, x: F.pad(x, (1, 1, 1, 1, 1, 0), "constant", -1.0),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(FUNCTIONALS))
def test_normalize_and_pad_match_torch(name, dtype):
    x, tx = _pair(XV.astype(dtype))
    _check(FUNCTIONALS[name](ta.nn.functional, x), FUNCTIONALS[name](torch.nn.functional, tx), TOL[dtype], [(x, tx)])


def test_pad_refuses_other_modes_and_odd_padding():
    x = ta.tensor(XV)
    with pytest.raises(NotImplementedError, match=re.escape("pad: mode 'reflect' is not supported; only "
                                                            "mode='constant' is")):
        ta.nn.functional.pad(x, (1, 1), mode="reflect")
    with pytest.raises(ValueError, match=re.escape("pad: the padding (1, 1, 1) must have an even length of at most "
                                                   "2 * 3")):
        ta.nn.functional.pad(x, (1, 1, 1))


# -- 1c. the nn modules ---------------------------------------------------------------------------------------------

MODULES = [
    ("SiLU", (), {}), ("Sigmoid", (), {}), ("LeakyReLU", (0.2,), {}), ("LeakyReLU", (), {"inplace": True}),
    ("ELU", (), {"alpha": 0.3}), ("Softplus", (), {"beta": 2.0, "threshold": 4.0}), ("Softmax", (1,), {}),
    ("LogSoftmax", (), {"dim": -1}),
]


@pytest.mark.parametrize("name, args, kwargs", MODULES, ids=[f"{n}{a}{k}" for n, a, k in MODULES])
def test_activation_modules_match_torch(name, args, kwargs):
    x, tx = _pair(XV.astype(np.float32))
    # x * 1: torch refuses an in-place activation on a leaf that requires grad
    _check(getattr(ta.nn, name)(*args, **kwargs)(x * 1), getattr(torch.nn, name)(*args, **kwargs)(tx * 1), F32,
           [(x, tx)])


LOSS_MODULES = [
    ("MSELoss", {}, "regression"), ("L1Loss", {"reduction": "sum"}, "regression"),
    ("SmoothL1Loss", {"beta": 0.5}, "regression"), ("HuberLoss", {"delta": 0.5, "reduction": "none"}, "regression"),
    ("CrossEntropyLoss", {"label_smoothing": 0.1}, "classes"), ("NLLLoss", {"ignore_index": 3}, "classes"),
    ("NLLLoss", {"weight": np.array([0.5, 2.0, 1.0, 3.0], np.float32)}, "classes"),
    ("BCELoss", {"weight": np.array([1.0, 0.5, 2.0, 0.25], np.float32)}, "probabilities"),
    ("BCEWithLogitsLoss", {"pos_weight": np.array([3.0, 0.5, 1.0, 2.0], np.float32)}, "logits"),
]


@pytest.mark.parametrize("name, kwargs, kind", LOSS_MODULES, ids=[f"{n}{sorted(k)}" for n, k, _ in LOSS_MODULES])
def test_loss_modules_match_torch_and_keep_weights_as_buffers(name, kwargs, kind):
    inputs = {"regression": (REG_X, REG_Y), "classes": _nll_case("(N, C)", np.float64, False),
              "probabilities": (PROBS, TARGETS), "logits": (LOGITS, TARGETS)}
    xv, tv = inputs[kind]
    xv = xv.astype(np.float32)
    tv = tv if tv.dtype.kind in "iu" else tv.astype(np.float32)
    x, tx = _pair(xv)
    ours = getattr(ta.nn, name)(**{k: ta.tensor(v) for k, v in kwargs.items() if isinstance(v, np.ndarray)},
                                **{k: v for k, v in kwargs.items() if not isinstance(v, np.ndarray)})
    theirs = getattr(torch.nn, name)(**{k: torch.tensor(v) for k, v in kwargs.items() if isinstance(v, np.ndarray)},
                                     **{k: v for k, v in kwargs.items() if not isinstance(v, np.ndarray)})
    _check(ours(x, ta.tensor(tv)), theirs(tx, torch.tensor(tv)), F32, [(x, tx)])
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())  # weights are buffers, as torch's


def test_softmax_modules_refuse_an_implicit_dim():
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        torch.nn.Softmax()(torch.ones(2, 3))
    with pytest.raises(TypeError, match=re.escape("LogSoftmax: pass dim explicitly (e.g. dim=-1); torch's implicit "
                                                  "choice of dim is deprecated")):
        ta.nn.LogSoftmax()


def test_loss_module_refuses_a_bad_reduction_at_construction():
    with pytest.raises(ValueError, match=re.escape("NLLLoss: reduction must be 'mean', 'sum' or 'none', got 'avg'")):
        ta.nn.NLLLoss(reduction="avg")


# -- 2. tensor ops ----------------------------------------------------------------------------------------------------

INF = math.inf
IDS = np.array([2, 0, 2])

# name -> f(m, x): m is ta or torch, x a float (2, 3, 4) tensor that requires grad
OPS = {
    "flip one dim": lambda m, x: x.flip(0),
    "flip two dims (varargs)": lambda m, x: x.flip(0, 2),
    "flip a tuple": lambda m, x: m.flip(x, (1, -1)),
    "flip nothing": lambda m, x: m.flip(x, ()),
    "roll one dim": lambda m, x: x.roll(1, 2),
    "roll two dims": lambda m, x: m.roll(x, (1, -1), (0, 2)),
    "roll flattened": lambda m, x: x.roll(5),
    "roll further than the size": lambda m, x: x.roll(-7, -1),
    "tril": lambda m, x: x.tril(),
    "triu diagonal 1": lambda m, x: x.triu(1),
    "tril diagonal -1 (function)": lambda m, x: m.tril(x, -1),
    "triu a causal mask": lambda m, x: x[0].masked_fill(m.ones(3, 4, dtype=_dt(m, "bool")).triu(1), -INF)
        .softmax(-1),
    "diag vector -> matrix": lambda m, x: m.diag(x[0, 0]),
    "diag vector -> matrix, offset": lambda m, x: x[1, 2].diag(-2),
    "diag matrix -> vector": lambda m, x: m.diag(x[0]),
    "diag matrix -> vector, offset": lambda m, x: x[1].diag(1),
    "diag matrix -> empty": lambda m, x: x[1].diag(5),
    "outer": lambda m, x: m.outer(x[0, 0], x[1, 1, :3]),
    "outer method": lambda m, x: x[0, 1].outer(x[1, 0]),
    "maximum with ties (broadcast)": lambda m, x: m.maximum(x, x[:, :, :1]),
    "minimum with ties (broadcast)": lambda m, x: m.minimum(x, x[:, :1, :]),
    "maximum of two branches": lambda m, x: x.maximum(x.flip(2) * 0.5),
    "minimum with itself": lambda m, x: m.minimum(x, x),
    "% a positive number": lambda m, x: x % 1.5,
    "% a negative number": lambda m, x: x % -1.5,
    "% a tensor (its gradient too)": lambda m, x: m.remainder(x, x.flip(2).abs() + 0.5),
    "number % tensor, detached": lambda m, x: 5.0 % (x.detach().abs() + 1),
    "// a number, detached": lambda m, x: (x // 0.75).detach() * x,
    "// sign rules": lambda m, x: (x.detach() // -0.75),
    "int %, sign of the divisor": lambda m, x: m.tensor(np.array([-7, 7, -8, 8, 0])) % 3,
    "int % negative": lambda m, x: m.tensor(np.array([-7, 7, -8, 8, 0])) % -3,
    "int // floors": lambda m, x: m.tensor(np.array([-7, 7, -8, 8, 0])) // 2,
    "int // negative": lambda m, x: m.floor_divide(m.tensor(np.array([-7, 7, -8, 8, 0])), -2),
    "cumsum": lambda m, x: x.cumsum(1),
    "cumsum last dim (function)": lambda m, x: m.cumsum(x, dim=-1),
    "cumsum into float64": lambda m, x: m.cumsum(x, 0, dtype=_dt(m, "float64")),
    "cumsum of ints is int64": lambda m, x: m.tensor(np.array([1, 2, 3], np.int32)).cumsum(0),
    "cumsum of bools": lambda m, x: (x > 0).cumsum(2),
    "prod over all": lambda m, x: (x[0] * 0.5 + 1.25).prod(),
    "prod over a dim": lambda m, x: x.prod(1),
    "prod keepdim": lambda m, x: m.prod(x, -1, keepdim=True),
    "prod with one zero per slice": lambda m, x: x.masked_fill((x - x.detach()[:, :, :1]) == 0, 0.0).prod(2),
    "prod with two zeros": lambda m, x: x.masked_fill(x.abs() < 1.1, 0.0).prod(0),
    "prod into float64": lambda m, x: x.prod(2, dtype=_dt(m, "float64")),
    "prod of ints": lambda m, x: m.tensor(np.array([[1, 2], [3, 4]], np.int32)).prod(1),
    "norm": lambda m, x: x.norm(),
    "norm over a dim": lambda m, x: x.norm(dim=1),
    "norm p=1 keepdim": lambda m, x: x.norm(p=1, dim=2, keepdim=True),
    "norm inf": lambda m, x: x.norm(p=INF, dim=-1),
    "norm inf with ties": lambda m, x: m.stack([x, -x], dim=-1).norm(p=INF, dim=-1),
    "norm -inf": lambda m, x: m.norm(x, p=-INF, dim=0),
    "norm p=3 two dims": lambda m, x: m.norm(x, p=3, dim=(0, 2)),
    "norm of zero rows": lambda m, x: (x * (x[:, :1, :] > 0)).norm(dim=1),
    "norm fro": lambda m, x: m.norm(x, "fro"),
    "amax over all": lambda m, x: x.amax(),
    "amax over dims": lambda m, x: x.amax(dim=(0, 2)),
    "amin keepdim": lambda m, x: m.amin(x, 1, keepdim=True),
    "amax with ties": lambda m, x: m.stack([x, x, x.flip(2)], -1).amax(-1),
    "amin with ties over all": lambda m, x: m.cat([x, x]).amin(),
    "logsumexp": lambda m, x: x.logsumexp(1),
    "logsumexp two dims keepdim": lambda m, x: m.logsumexp(x, dim=(0, 2), keepdim=True),
    "logsumexp of large values": lambda m, x: (x * 400).logsumexp(-1),
    "logsumexp with -inf": lambda m, x: x.masked_fill(x < 0, -INF).logsumexp(-1),
    "index_select with repeats": lambda m, x: x.index_select(1, m.tensor(IDS)),
    "index_select last dim (function)": lambda m, x: m.index_select(x, -1, m.tensor(np.array([3, 0]))),
    "masked_select": lambda m, x: x.masked_select(x > 0.5),
    "masked_select broadcast mask": lambda m, x: m.masked_select(x, m.tensor(np.array([True, False, True, False]))),
    "nonzero": lambda m, x: (x > 1).nonzero(),
    "nonzero as_tuple": lambda m, x: m.stack(m.nonzero(x > 1, as_tuple=True)),
    "einsum batched matmul": lambda m, x: m.einsum("bij,bkj->bik", x, x * 2),
    "einsum transpose": lambda m, x: m.einsum("ij->ji", x[0]),
    "einsum outer, list operands": lambda m, x: m.einsum("i,j->ij", [x[0, 0], x[1, 1]]),
    "einsum sum away a letter": lambda m, x: m.einsum("bij->b", x),
    "einsum dot to a scalar": lambda m, x: m.einsum("ijk,ijk->", x, x.flip(0)),
    "einsum implicit output": lambda m, x: m.einsum("ij,jk", x[0], x[1].transpose(0, 1)),
    "einsum attention scores": lambda m, x: m.einsum("b q d, b k d -> b q k", x, x.roll(1, 1)),
    "einsum ... batched matmul": lambda m, x: m.einsum("...ij,...kj->...ik", x, x[1]),  # '...' of 1 and 0 dims
    "einsum ... transpose": lambda m, x: m.einsum("...ij->...ji", x),
    "einsum ... implicit output": lambda m, x: m.einsum("...j,jk", x, x[0].transpose(0, 1)),
    "einsum ... reduced": lambda m, x: m.einsum("b...,b...->b", x, x * x),
}


def _dt(m, name: str):
    return getattr(torch, name) if m is torch else np.dtype(name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(OPS))
def test_tensor_op_matches_torch(name, dtype):
    x, tx = _pair(XV.astype(dtype))
    y, ty = OPS[name](ta, x), OPS[name](torch, tx)
    tol = TOL[dtype] if y.dtype.kind == "f" else dict(rtol=0, atol=0)
    if name.startswith("logsumexp of large"):
        tol = dict(rtol=1e-6 if dtype == np.float32 else 1e-12, atol=0)
    _check(y, ty, tol, [(x, tx)])


def test_floor_divide_has_no_derivative_as_torch():
    x, tx = _pair(XV.astype(np.float32))
    y, ty = x // 0.75, tx // 0.75
    assert y.requires_grad and ty.requires_grad
    with pytest.raises(RuntimeError, match="derivative for aten::floor_divide is not implemented"):
        ty.sum().backward()
    with pytest.raises(RuntimeError, match=re.escape("derivative for aten::floor_divide is not implemented (as in "
                                                     "torch)")):
        y.sum().backward()
    # torch's remainder of a number by a tensor has no derivative either (its tensor % tensor and % number do)
    x.grad = None
    with pytest.raises(RuntimeError, match="derivative for aten::remainder is not implemented"):
        (5.0 % (tx.abs() + 1)).sum().backward()
    with pytest.raises(RuntimeError, match=re.escape("derivative for aten::remainder is not implemented for a "
                                                     "number % a tensor (as in torch)")):
        (5.0 % (x.abs() + 1)).sum().backward()


def test_new_tensor_ops_refuse_what_torch_refuses_by_name():
    x, tx = ta.tensor(XV), torch.tensor(XV)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.tensor([5, 3]) % torch.tensor([0, 1])
    with pytest.raises(ZeroDivisionError, match=re.escape("integer division or remainder by zero: the divisor "
                                                          "tensor holds a 0")):
        ta.tensor(np.array([5, 3])) % ta.tensor(np.array([0, 1]))
    with pytest.raises(ZeroDivisionError):
        ta.tensor(np.array([5, 3])) // 0
    with pytest.raises(RuntimeError, match="tril: input tensor must have at least 2 dimensions"):
        tx[0, 0].tril()
    with pytest.raises(ValueError, match=re.escape("tril: input tensor must have at least 2 dimensions, got shape "
                                                   "(4,)")):
        x[0, 0].tril()
    with pytest.raises(TypeError, match="dims"):
        tx.flip()
    with pytest.raises(TypeError, match=re.escape("flip() missing 1 required positional argument: 'dims'")):
        x.flip()
    with pytest.raises(ValueError, match=re.escape("diag: input must be 1-D or 2-D, got shape (2, 3, 4)")):
        x.diag()
    with pytest.raises(ValueError, match=re.escape("outer: both inputs must be 1-D, got shapes (3, 4) and (4,)")):
        ta.outer(x[0], x[0, 0])
    with pytest.raises(TypeError, match=re.escape("maximum: both arguments must be tensors, got Tensor and float")):
        ta.maximum(x, 0.0)
    with pytest.raises((IndexError, RuntimeError), match="index out of range|out of DATA bounds"):
        tx.index_select(1, torch.tensor([3]))
    with pytest.raises(IndexError, match=re.escape("index_select: index 3 is out of range for dimension 1 with size "
                                                   "3 (positions must be in [0, 3))")):
        x.index_select(1, ta.tensor(np.array([3])))
    with pytest.raises(IndexError, match=re.escape("index_select: index -1 is out of range")):
        x.index_select(1, ta.tensor(np.array([-1])))
    with pytest.raises(TypeError, match=re.escape("masked_select: mask must be a bool tensor, got dtype int64")):
        x.masked_select(ta.tensor(np.ones(4, np.int64)))
    with pytest.raises(ValueError, match=re.escape("norm: p must be a number or 'fro', got 'nuc'")):
        x.norm(p="nuc")
    with pytest.raises(NotImplementedError, match=re.escape("einsum: a letter repeated within one operand ('ii', a "
                                                            "diagonal) is not supported")):
        ta.einsum("ii->i", x[0, :, :3])
    with pytest.raises(NotImplementedError, match=re.escape("einsum: the '...' dims of the operands must be equal, "
                                                            "got shapes [(2, 3, 4), (1, 4, 3)]: broadcasting inside "
                                                            "'...' is not supported")):
        ta.einsum("...ij,...jk->...ik", x, x[:1].transpose(1, 2))
    with pytest.raises(ValueError, match=re.escape("einsum: subscript 'j' has size 4 in one operand and 3 in "
                                                   "another")):
        ta.einsum("ij,jk->ik", x[0], x[0])
    with pytest.raises(TypeError, match=re.escape("einsum: the operands must have one dtype, got ['float32', "
                                                  "'float64']")):
        ta.einsum("ij,jk->ik", x[0], ta.tensor(np.ones((4, 2), np.float32)))


# -- 3. every new op trains on every route ----------------------------------------------------------------------------

ROUTES = [("eager", None), ("fused", "python"), ("fused", "captured")]


def _loss_head(m, out, soft):
    """The item-1 losses together: out (B, 4) logits, soft (B, 4) float targets in [0, 1]; the class labels come
    from an op (argmax), so a captured step recomputes them from every batch."""
    F = m.nn.functional
    soft = soft if m is torch or isinstance(soft, ta.Tensor) else ta.Tensor(soft)  # the eager route hands the array
    labels = soft.argmax(dim=1)
    # The binary targets through a sigmoid: the capture's check runs the step on a second batch whose values it
    # moves out of [0, 1], where binary_cross_entropy (rightly) refuses its target.
    binary = soft.sigmoid()
    return (F.nll_loss(F.log_softmax(out, dim=1), labels)
            + F.binary_cross_entropy_with_logits(out, binary)
            + F.binary_cross_entropy(out.sigmoid(), binary, reduction="sum") * 0.1
            + F.l1_loss(out, soft) + F.smooth_l1_loss(out, soft, beta=0.5) + F.huber_loss(out, soft, delta=0.7)
            + F.mse_loss(out, soft))


def _activations_body(m, l1, l2, l3, x):
    F = m.nn.functional
    h = F.silu(l1(x))
    h = F.leaky_relu(h, 0.1) + F.elu(h, 0.5) * 0.5
    h = F.softplus(l2(F.pad(h, (1, 1), value=0.25)), beta=2.0)
    return l3(F.normalize(h, dim=-1))


def _ops_body(m, l1, l2, l3, x, idx):
    h = l1(x)  # (B, 8)
    h = m.maximum(h.flip(1), h.roll(1, 1)) - m.minimum(h, h * 0.5) + h % 0.7
    h = h.cumsum(1) * 0.1 + m.outer(h[:, 0], h[0]) * 0.05
    sq = m.einsum("bi,bj->bij", h, h)  # (B, 8, 8)
    h = h + (sq.tril() - sq.triu(1)).sum(-1) * 0.1 + m.diag(sq[0]) * 0.1
    h = h.index_select(1, idx) / (h.norm(dim=1, keepdim=True) + 1)
    h = m.cat([h, h.amax(dim=1, keepdim=True), h.amin(dim=1, keepdim=True), h.logsumexp(1, keepdim=True),
               (h.abs() + 0.5).prod(1, keepdim=True), h.norm(p=1, dim=1, keepdim=True),
               h.norm(p=INF, dim=1, keepdim=True)], dim=1)
    return l3(l2(h))


class _Net(ta.nn.Module):
    def __init__(self, body, widths) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.body = body
        self.l1, self.l2, self.l3 = (ta.nn.Linear(a, b, rng=rng) for a, b in widths)
        self.register_buffer("idx", ta.tensor(np.array([7, 0, 3, 3, 5, 1, 6, 2])))  # the model's own array

    def forward(self, x):
        if self.body is _ops_body:
            return _ops_body(ta, self.l1, self.l2, self.l3, x, self.idx)
        return self.body(ta, self.l1, self.l2, self.l3, x)


@pytest.mark.parametrize("route, replay", ROUTES)
@pytest.mark.parametrize("group", ["losses and activations", "tensor ops"])
def test_new_ops_train_as_torch_on_every_route(group, route, replay):
    from tensorarena import kernels
    from tensorarena.train.trainer import Trainer

    body, widths = {"losses and activations": (_activations_body, [(6, 8), (10, 8), (8, 4)]),
                    "tensor ops": (_ops_body, [(6, 8), (14, 8), (8, 4)])}[group]
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((4, 6)).astype(np.float32), rng.uniform(0, 1, (4, 4)).astype(np.float32))
               for _ in range(3)]
    model = _Net(body, widths)
    tl = [torch.nn.Linear(a, b) for a, b in widths]
    with torch.no_grad():
        for ours, theirs in zip((model.l1, model.l2, model.l3), tl):
            theirs.weight.copy_(torch.from_numpy(ours.weight.numpy()))
            theirs.bias.copy_(torch.from_numpy(ours.bias.numpy()))
    tidx = torch.tensor([7, 0, 3, 3, 5, 1, 6, 2])
    options = {} if replay is None else {"fused_replay": replay}
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.05),
                      lambda out, soft: _loss_head(ta, out, soft), route=route, **options)
    topt = torch.optim.SGD([p for layer in tl for p in layer.parameters()], lr=0.05)
    counts = {r: kernels.calls[("fused_replay", r)] for r in ("captured", "python")}
    for step in range(6):
        x, soft = batches[step % 3]
        report = trainer.step(x, soft)
        assert report.route == route
        args = (torch, *tl, torch.from_numpy(x)) + ((tidx,) if body is _ops_body else ())
        tloss = _loss_head(torch, body(*args), torch.from_numpy(soft))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        assert report.loss == pytest.approx(tloss.item(), rel=2e-5), step
    for ours, theirs in zip((model.l1, model.l2, model.l3), tl):
        np.testing.assert_allclose(ours.weight.numpy(), theirs.weight.detach().numpy(), rtol=1e-4, atol=1e-5)
    if replay is not None:  # which replay served the steps (the first step of a plan traces it)
        assert kernels.calls[("fused_replay", replay)] - counts[replay] >= 5
    if replay == "captured":
        assert trainer.fused.plan.capture.tape is not None, trainer.fused.plan.capture.note
        assert kernels.calls[("fused_replay", "captured")] - counts["captured"] == 6


class _Selecting(ta.nn.Module):
    def __init__(self, op) -> None:
        super().__init__()
        self.lin, self.op = ta.nn.Linear(4, 4, rng=np.random.default_rng(0)), op

    def forward(self, x):
        h = self.lin(x)
        return self.op(h).sum().reshape(1, 1).expand(x.shape[0], 2)


@pytest.mark.parametrize("name, op", [("masked_select", lambda h: h.masked_select(h > 0)),
                                      ("nonzero", lambda h: h * (h > 0).nonzero().shape[0])], ids=["masked_select",
                                                                                                  "nonzero"])
def test_data_dependent_ops_refuse_the_fused_route_by_name_and_fall_back_when_asked(name, op):
    from tensorarena.compile.trace import UnsupportedOpError
    from tensorarena.train.trainer import Trainer

    x, y = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32), np.array([0, 1, 1])
    model = _Selecting(op)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), ta.nn.functional.cross_entropy,
                      route="fused")
    with pytest.raises(UnsupportedOpError, match=re.escape(f"the fused route cannot trace '{name}'")):
        trainer.step(x, y)
    model = _Selecting(op)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), ta.nn.functional.cross_entropy,
                      route="fused", fallback_to_eager=True)
    report = trainer.step(x, y)
    assert report.route == "eager" and name in trainer.fallback_reason
    assert math.isfinite(report.loss)
