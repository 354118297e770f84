"""torch's names added together: sin cos square rsqrt sign round, mm bmm, scatter scatter_add, unflatten, the
dtypes, from_numpy, randn rand randint randperm, set_grad_enabled inference_mode, and the Tensor methods new_zeros
new_ones new_full new_tensor type_as +t. Values and gradients against torch, float32 and float64.

On the commit before them every test here fails: none of the names existed (AttributeError).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tests.fused_vs_torch import fused_steps_match_torch
from tests.reference import DTYPES, check_op, randn

UNARY = {
    "sin": (lambda x: x.sin(), torch.sin, lambda seed: randn(seed, (3, 4)) * 3),
    "cos": (lambda x: ta.cos(x), torch.cos, lambda seed: randn(seed, (3, 4)) * 3),
    "square": (lambda x: x.square(), torch.square, lambda seed: randn(seed, (3, 4))),
    "rsqrt": (lambda x: x.rsqrt(), torch.rsqrt, lambda seed: np.abs(randn(seed, (3, 4))) + 0.5),
    # 0.5, 1.5, 2.5 and -0.5 test the halves (to even); the gradient of both is zeros, as torch's
    "round": (lambda x: x.round(), torch.round, lambda seed: np.r_[randn(seed, 8) * 3, 0.5, 1.5, 2.5, -0.5]),
    "sign": (lambda x: x.sign(), torch.sign, lambda seed: np.r_[randn(seed, 8), 0.0]),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_matches_torch(name, dtype):
    ours, theirs, make = UNARY[name]
    check_op(ours, theirs, [make(1)], dtype=dtype)


@pytest.mark.parametrize("decimals", [2, 1, -1, -2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_decimals_matches_torch(decimals, dtype):
    x = np.r_[randn(2, 10) * 300, 1234.5678, 0.125, 2.5, 250.0]
    check_op(lambda t: ta.round(t, decimals=decimals), lambda t: torch.round(t, decimals=decimals), [x], dtype=dtype,
             rtol=0, atol=0)


def test_round_and_sign_of_integers_and_bools_as_torch():
    ints = np.array([-3, 0, 2, 7])
    np.testing.assert_array_equal(ta.tensor(ints).round().numpy(), torch.round(torch.from_numpy(ints)).numpy())
    np.testing.assert_array_equal(ta.tensor(ints).sign().numpy(), torch.sign(torch.from_numpy(ints)).numpy())
    bools = np.array([True, False])
    assert ta.tensor(bools).sign().dtype == np.bool_
    np.testing.assert_array_equal(ta.tensor(bools).sign().numpy(), torch.sign(torch.from_numpy(bools)).numpy())
    with pytest.raises(TypeError, match="decimals"):
        ta.tensor(ints).round(decimals=1)
    assert ta.tensor(ints).square().dtype == np.int64  # torch: pow(int, 2) stays int64


def test_positive_is_the_tensor_itself_and_round_of_a_tensor_is_refused_as_torch():
    t = ta.tensor(2.5)
    assert (+t) is t and (+torch.tensor(2.5)) is not None
    with pytest.raises(TypeError):
        +ta.tensor([True])
    with pytest.raises(TypeError):  # torch 2.13's Tensor has no __round__: round(t) is a TypeError there too
        round(torch.tensor(2.5))
    with pytest.raises(TypeError):
        round(t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_and_bmm_match_torch(dtype):
    check_op(ta.mm, torch.mm, [randn(3, (2, 3)), randn(4, (3, 5))], dtype=dtype)
    check_op(ta.bmm, torch.bmm, [randn(5, (4, 2, 3)), randn(6, (4, 3, 5))], dtype=dtype)


def test_mm_and_bmm_refuse_what_torch_refuses_naming_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\)"):
        ta.mm(ta.zeros(2, 3), ta.zeros(4, 5))
    with pytest.raises(ValueError, match=r"matrices.*\(2, 3, 1\) and \(4, 5\)"):
        ta.mm(ta.zeros(2, 3, 1), ta.zeros(4, 5))
    with pytest.raises(ValueError, match=r"\(2, 2, 3\) and \(3, 3, 5\)"):  # no broadcasting of the batch
        ta.bmm(ta.zeros(2, 2, 3), ta.zeros(3, 3, 5))
    with pytest.raises(ValueError, match=r"\(2, 2, 3\) and \(2, 4, 5\)"):
        ta.bmm(ta.zeros(2, 2, 3), ta.zeros(2, 4, 5))
    with pytest.raises(ValueError, match=r"3-D.*\(2, 3\) and \(2, 3, 5\)"):
        ta.bmm(ta.zeros(2, 3), ta.zeros(2, 3, 5))


def _permuted_rows(seed, shape, size):
    """An index along dim 0 with no repeats in any column (scatter's order of repeated writes is undefined)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(size)[: shape[0]] for _ in range(shape[1])], axis=1).astype(np.int64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_matches_torch(dtype):
    x, src = randn(7, (5, 3)), randn(8, (4, 3))
    index = _permuted_rows(9, (4, 3), 5)
    check_op(lambda a, i, s: a.scatter(0, i, s), lambda a, i, s: a.scatter(0, i, s), [x, index, src], dtype=dtype)
    check_op(lambda a, i: ta.scatter(a, 1, i, 2.5), lambda a, i: a.scatter(1, i, 2.5),
             [x, np.array([[2], [0], [1], [1], [0]])], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_add_matches_torch_with_repeated_positions(dtype):
    x, src = randn(10, (3, 4)), randn(11, (3, 6))
    index = np.random.default_rng(12).integers(0, 4, (3, 6))  # repeats: their values add up
    check_op(lambda a, i, s: a.scatter_add(1, i, s), lambda a, i, s: a.scatter_add(1, i, s), [x, index, src],
             dtype=dtype)


def test_scatter_with_an_index_smaller_than_src_reads_its_corner_and_gives_the_rest_no_gradient():
    # torch's forward agrees; its backward raises on the shape (2, 2) of gather(g, index): here src's other
    # elements get the gradient they have, 0.
    x, src, index = np.zeros((3, 4)), randn(13, (3, 4)), np.array([[0, 1], [2, 0]])
    s = ta.tensor(src, dtype=np.float64, requires_grad=True)
    out = ta.tensor(x, dtype=np.float64).scatter_add(0, ta.tensor(index), s)
    want = torch.from_numpy(x).scatter_add(0, torch.from_numpy(index), torch.from_numpy(src))
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    out.sum().backward()
    expected = np.zeros((3, 4))
    expected[:2, :2] = 1
    np.testing.assert_array_equal(s.grad, expected)


def test_scatter_refuses_as_torch():
    x = ta.zeros(3, 4)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        x.scatter(0, ta.tensor([[3]]), ta.ones(3, 4))
    with pytest.raises(IndexError, match="index -1 is out of bounds"):
        x.scatter(0, ta.tensor([[-1]]), ta.ones(3, 4))
    with pytest.raises(TypeError, match="same dtype"):
        x.scatter(0, ta.tensor([[1]]), ta.ones(3, 4, dtype=np.float64))
    with pytest.raises(ValueError, match="as many dims"):
        x.scatter(0, ta.tensor([1]), ta.ones(3, 4))
    with pytest.raises(ValueError, match=r"no larger than input of shape \(3, 4\) apart from dim 0"):
        x.scatter(0, ta.zeros(2, 5, dtype=np.int64), ta.ones(3, 4))
    with pytest.raises(TypeError, match="integer"):
        x.scatter(0, ta.tensor([[1.0]]), ta.ones(3, 4))
    ints = ta.zeros(2, 3, dtype=np.int64).scatter(1, ta.tensor([[1], [0]]), 2.7)  # truncated, as torch's
    np.testing.assert_array_equal(ints.numpy(), [[0, 2, 0], [2, 0, 0]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_unflatten_matches_torch(dtype):
    check_op(lambda x: x.unflatten(1, (2, -1)), lambda x: x.unflatten(1, (2, -1)), [randn(14, (3, 6, 2))],
             dtype=dtype)
    with pytest.raises(ValueError, match="do not multiply"):
        ta.zeros(3, 6).unflatten(1, (4, -1))


def test_dtypes_are_numpy_dtypes_every_dtype_argument_takes():
    assert ta.float32 == np.float32 and ta.float64 == np.float64 and ta.int64 == np.int64
    assert ta.int32 == np.int32 and ta.bool == np.bool_
    assert ta.float is ta.float32 and ta.double is ta.float64 and ta.long is ta.int64 and ta.int is ta.int32
    assert ta.zeros(2, dtype=ta.int64).dtype is ta.int64
    assert ta.tensor([1, 2], dtype=ta.float64).dtype == ta.float64
    assert ta.ones(2).to(ta.int32).dtype == np.int32
    assert ta.full((2,), 1, dtype=ta.bool).dtype == np.bool_
    assert "float32" in ta.__all__ and "bool" not in ta.__all__  # a star import must not shadow Python's bool


def test_from_numpy_shares_memory_and_tensor_copies():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    shared, copied = ta.from_numpy(a), ta.tensor(a)
    a[0, 0] = 42
    assert shared[0, 0].item() == 42 and copied[0, 0].item() == 0
    shared.data[1, 2] = -1  # and the other way
    assert a[1, 2] == -1
    for dtype in (np.float64, np.int64, np.int32, np.uint8, np.bool_):
        b = np.zeros(3, dtype)
        assert ta.from_numpy(b).dtype == dtype and np.shares_memory(ta.from_numpy(b).data, b)
    with pytest.raises(TypeError, match="float16"):
        ta.from_numpy(np.zeros(3, np.float16))  # the engine keeps float16 as float32: no sharing possible
    with pytest.raises(TypeError, match="byte order"):
        ta.from_numpy(np.zeros(3, ">f4"))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        ta.from_numpy([1.0, 2.0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_factories_draw_from_the_default_generator(dtype):
    ta.manual_seed(5)
    x = ta.randn(2, 3, dtype=dtype)
    assert x.shape == (2, 3) and x.dtype == dtype and x.is_leaf and x._arena is None
    np.testing.assert_array_equal(x.numpy(), np.random.Generator(np.random.PCG64(5)).standard_normal((2, 3))
                                  .astype(dtype))
    ta.manual_seed(5)
    np.testing.assert_array_equal(ta.randn((2, 3), dtype=dtype).numpy(), x.numpy())  # reseeded: the same draws
    u = ta.rand(1000, dtype=dtype, requires_grad=True)
    assert u.requires_grad and u.dtype == dtype and 0 <= u.numpy().min() and u.numpy().max() < 1
    assert ta.randn(3, rng=np.random.default_rng(1)).dtype == np.float32
    with pytest.raises(TypeError, match="floating point"):
        ta.randn(3, dtype=ta.int64)


def test_random_moments_match_torchs():
    ta.manual_seed(0)
    torch.manual_seed(0)
    n = 200_000
    for ours, theirs in ((ta.randn(n), torch.randn(n)), (ta.rand(n), torch.rand(n))):
        assert ours.numpy().mean() == pytest.approx(theirs.numpy().mean(), abs=0.01)
        assert ours.numpy().std() == pytest.approx(theirs.numpy().std(), abs=0.01)


def test_randint_and_randperm_as_torch():
    ta.manual_seed(3)
    a = ta.randint(10, (4, 5))
    b = ta.randint(-3, 3, (1000,))
    c = ta.randint(0, 4, size=(2,), dtype=ta.int32)
    assert a.dtype == np.int64 and a.shape == (4, 5) and 0 <= a.numpy().min() and a.numpy().max() < 10
    assert b.numpy().min() == -3 and b.numpy().max() == 2 and c.dtype == np.int32
    p = ta.randperm(7)
    assert p.dtype == np.int64 and sorted(p.tolist()) == list(range(7))
    assert torch.randint(10, (4, 5)).dtype == torch.int64 and torch.randperm(7).dtype == torch.int64
    with pytest.raises(ValueError, match="low must be below high"):
        ta.randint(5, 5, (2,))


def test_set_grad_enabled_as_function_context_manager_and_decorator():
    x = ta.ones(2, requires_grad=True)
    try:
        ta.set_grad_enabled(False)  # the function form: at once, and it stays
        assert not ta.is_grad_enabled() and not (x * 2).requires_grad
    finally:
        ta.set_grad_enabled(True)
    with ta.set_grad_enabled(False):
        assert not (x * 2).requires_grad
        with ta.set_grad_enabled(True):
            assert (x * 2).requires_grad
        assert not ta.is_grad_enabled()
    assert ta.is_grad_enabled()

    @ta.set_grad_enabled(False)
    def double(t):
        return t * 2

    assert ta.is_grad_enabled()  # decorating changed nothing outside the calls
    assert not double(x).requires_grad and ta.is_grad_enabled()
    with pytest.raises(TypeError, match="bool"):
        ta.set_grad_enabled(0)


def test_inference_mode_is_no_grad():
    x = ta.ones(2, requires_grad=True)
    with ta.inference_mode():
        assert not (x * 2).requires_grad
    with ta.inference_mode(False):  # changes nothing, as torch's
        assert (x * 2).requires_grad
        with ta.no_grad(), ta.inference_mode(False):
            assert not ta.is_grad_enabled()

    @ta.inference_mode
    def bare(t):
        return t * 2

    @ta.inference_mode()
    def called(t):
        return t * 2

    assert not bare(x).requires_grad and not called(x).requires_grad and ta.is_grad_enabled()


def test_top_level_ops_are_the_ops():
    x = ta.tensor(randn(15, (2, 3)))
    np.testing.assert_array_equal(ta.sigmoid(x).numpy(), x.sigmoid().numpy())
    np.testing.assert_array_equal(ta.relu(x).numpy(), x.relu().numpy())
    np.testing.assert_array_equal(ta.softmax(x, 1).numpy(), x.softmax(1).numpy())
    np.testing.assert_array_equal(ta.sin(x).numpy(), x.sin().numpy())


@pytest.mark.parametrize("dtype", DTYPES)
def test_new_factories_take_selfs_dtype_and_are_heap_leaves(dtype):
    base = ta.ones(3, dtype=dtype)
    with ta.Arena():
        made = [base.new_zeros(2, 3), base.new_ones((2, 3)), base.new_full((2, 3), 3), base.new_tensor([[1, 2, 3]])]
    for t, want in zip(made, (0, 1, 3, None)):
        assert t.dtype == dtype and t.is_leaf and t._arena is None  # heap: usable after the arena closed
        if want is not None:
            assert t.shape == (2, 3) and (t.numpy() == want).all()
    ref = torch.ones(3, dtype=torch.float64 if dtype == np.float64 else torch.float32)
    assert str(ref.new_full((2,), 3).dtype).endswith(np.dtype(dtype).name)
    assert base.new_zeros(2, dtype=ta.int64).dtype == np.int64
    g = base.new_zeros(2, requires_grad=True)
    assert g.requires_grad
    source = ta.tensor([1.0, 2.0], requires_grad=True) * 2
    copy = base.new_tensor(source)
    assert copy.is_leaf and not copy.requires_grad and copy.dtype == dtype
    with pytest.raises(TypeError, match="floating-point"):
        base.new_zeros(2, dtype=ta.int64, requires_grad=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_type_as_converts_as_torch(dtype):
    x = ta.tensor([1.7, -2.2], dtype=np.float32, requires_grad=True)
    y = x.type_as(ta.zeros(1, dtype=dtype))
    assert y.dtype == dtype
    assert (x.type_as(x) is x) and x.type_as(ta.zeros(1, dtype=ta.int64)).tolist() == [1, -2]
    y.sum().backward()
    assert x.grad.dtype == np.float32 and (x.grad == 1).all()


class _Mixer(ta.nn.Module):
    """bmm, scatter_add, scatter, cos, sign and round in one model, for the fused route."""

    def __init__(self, index: np.ndarray):
        super().__init__()
        self.fc = ta.nn.Linear(4, 6)
        self.index = index

    def forward(self, x):
        h = self.fc(x).unflatten(1, (2, 3))  # (8, 2, 3)
        g = ta.bmm(h, h.transpose(1, 2)).flatten(1)  # (8, 4)
        spread = g.new_zeros(8, 4).scatter_add(1, self.index, g.cos())
        kept = spread.scatter(1, self.index[:, :1], g[:, :1] * g.sign()[:, :1])
        return kept + g.round() * 0.01


def _mixer_torch(x, weight, bias, index):
    h = (x @ weight.T + bias).unflatten(1, (2, 3))
    g = torch.bmm(h, h.transpose(1, 2)).flatten(1)
    spread = g.new_zeros(8, 4).scatter_add(1, index, g.cos())
    kept = spread.scatter(1, index[:, :1], g[:, :1] * g.sign()[:, :1])
    return kept + g.round() * 0.01


def test_fused_step_with_the_new_ops_matches_torch():
    from tensorarena.train.trainer import Trainer

    rng = np.random.default_rng(1)
    index = rng.integers(0, 4, (8, 4))
    model = _Mixer(index)
    weight = torch.from_numpy(model.fc.weight.numpy().copy()).requires_grad_()
    bias = torch.from_numpy(model.fc.bias.numpy().copy()).requires_grad_()
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.05), ta.nn.functional.mse_loss, route="fused")
    topt = torch.optim.SGD([weight, bias], lr=0.05)
    batches = [(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32))
               for _ in range(3)]
    fused_steps_match_torch(trainer, topt, lambda x, y: torch.nn.functional.mse_loss(
        _mixer_torch(x, weight, bias, torch.from_numpy(index)), y), batches)
    np.testing.assert_allclose(model.fc.weight.numpy(), weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.fc.bias.numpy(), bias.detach().numpy(), rtol=1e-5, atol=1e-6)
