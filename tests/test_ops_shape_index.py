"""Shape and selection ops against torch: forward, gradients, errors and arena lifetime."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import tensorarena as ta
from tensorarena.ops import embedding, getitem, where
from tests.reference import DTYPES, FAST, check_finite_differences, check_op, randn, seeds, shapes



def _torch_index(idx):
    """The same index for torch: arrays become tensors (torch has no negative steps; callers avoid them)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    return tuple(torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in items)


# -- transpose / permute / unsqueeze / squeeze / flatten ---------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_transpose(dtype, shape, seed, data):
    n = len(shape)
    d0, d1 = data.draw(st.integers(-n, n - 1)), data.draw(st.integers(-n, n - 1))
    check_op(lambda x: ta.transpose(x, d0, d1), lambda x: torch.transpose(x, d0, d1), [randn(seed, shape)],
             dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_permute(dtype, shape, seed, data):
    perm = data.draw(st.permutations(range(len(shape))))
    perm = [p - len(shape) if data.draw(st.booleans()) else p for p in perm]  # mix in negative dims
    check_op(lambda x: x.permute(*perm), lambda x: x.permute(*perm), [randn(seed, shape)], dtype=dtype)
    check_op(lambda x: ta.permute(x, tuple(perm)), lambda x: x.permute(tuple(perm)), [randn(seed, shape)],
             dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_unsqueeze_squeeze(dtype, shape, seed, data):
    n = len(shape)
    d = data.draw(st.integers(-n - 1, n))
    check_op(lambda x: x.unsqueeze(d), lambda x: x.unsqueeze(d), [randn(seed, shape)], dtype=dtype)
    check_op(lambda x: x.squeeze(), lambda x: x.squeeze(), [randn(seed, shape)], dtype=dtype)
    s = data.draw(st.integers(-n, n - 1))  # size-1 or not: torch leaves other sizes alone
    check_op(lambda x: x.squeeze(s), lambda x: x.squeeze(s), [randn(seed, shape)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,target", [((1, 1, 4), (3, 1, 4)), ((2, 1), (2, 5)), ((3,), (2, 4, 3)),
                                          ((1, 3), (4, -1))])
def test_expand_matches_torch_and_uses_no_memory(shape, target, dtype):
    check_op(lambda x: x.expand(*target), lambda x: x.expand(*target), [randn(0, shape)], dtype=dtype)
    out = ta.tensor(randn(0, shape), dtype=dtype).expand(target)
    assert 0 in out.data.strides  # a zero-stride view, no copy
    with pytest.raises(ValueError, match=r"cannot be expanded"):
        ta.tensor(randn(0, (2, 3))).expand(4, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_flatten(dtype, shape, seed, data):
    n = len(shape)
    s = data.draw(st.integers(-n, n - 1))
    e = data.draw(st.integers(s % n, n - 1))  # end at or after start
    e = e - n if data.draw(st.booleans()) else e
    check_op(lambda x: x.flatten(s, e), lambda x: x.flatten(s, e), [randn(seed, shape)], dtype=dtype)
    # A non-contiguous source: flatten must copy (into the arena) and still route gradients.
    check_op(lambda x: x.T.flatten(), lambda x: x.permute(*reversed(range(n))).flatten(), [randn(seed, shape)],
             dtype=dtype)


def test_view_ops_share_memory_and_T():
    x = ta.tensor(np.arange(24.0).reshape(2, 3, 4))
    for view in (x.transpose(0, 2), x.permute(1, 0, 2), x.unsqueeze(1), x[:, None].squeeze(1), x.T, x.flatten()):
        assert np.shares_memory(view.data, x.data)
    assert x.T.shape == (4, 3, 2)
    s = ta.tensor(3.0)
    assert s.T.shape == () and s.flatten().shape == (1,) and s.unsqueeze(0).shape == (1,)


def test_shape_errors():
    x = ta.tensor(np.zeros((2, 3)))
    with pytest.raises(IndexError, match="out of range"):
        x.transpose(0, 2)
    with pytest.raises(ValueError, match="permutation"):
        x.permute(0, 0)
    with pytest.raises(IndexError):
        x.unsqueeze(3)
    with pytest.raises(ValueError, match="start_dim"):
        x.flatten(1, 0)


# -- cat / stack -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_cat(dtype, shape, seed, data):
    n = len(shape)
    dim = data.draw(st.integers(-n, n - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    arrays = []
    for i, k in enumerate(sizes):
        s = list(shape)
        s[dim] = k
        arrays.append(randn(seed + i, tuple(s)))
    check_op(lambda *xs: ta.cat(list(xs), dim), lambda *xs: torch.cat(xs, dim), arrays, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_stack(dtype, shape, seed, data):
    n = len(shape)
    dim = data.draw(st.integers(-n - 1, n))
    arrays = [randn(seed + i, shape) for i in range(data.draw(st.integers(1, 3)))]
    check_op(lambda *xs: ta.stack(xs, dim), lambda *xs: torch.stack(xs, dim), arrays, dtype=dtype)


def test_cat_stack_promote_dtypes_and_grads_keep_parent_dtype():
    a = ta.tensor(np.ones((2, 3)), dtype=np.float32, requires_grad=True)
    b = ta.tensor(np.ones((1, 3)), dtype=np.float64, requires_grad=True)
    out = ta.cat([a, b])
    assert out.dtype == np.float64 and out.shape == (3, 3)
    out.sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64
    assert ta.stack([a[:1], b]).dtype == np.float64
    ints = ta.Tensor(np.array([[1, 2, 3]]))
    assert ta.cat([a, ints]).dtype == np.float32  # torch: int64 + float32 -> float32
    assert ta.concat is ta.cat


def test_cat_error_names_every_offending_shape_and_dim():
    a, b, c = (ta.tensor(np.zeros(s)) for s in [(2, 3), (2, 4), (5, 2)])
    with pytest.raises(ValueError) as err:
        ta.cat([a, b, c], dim=0)
    msg = str(err.value)
    assert "(2, 3)" in msg and "(2, 4)" in msg and "(5, 2)" in msg and "dim 0" in msg
    with pytest.raises(ValueError) as err:
        ta.stack([a, b])
    assert "(2, 3)" in str(err.value) and "(2, 4)" in str(err.value)
    with pytest.raises(ValueError, match="non-empty"):
        ta.cat([])
    with pytest.raises(ValueError, match="zero-dimensional"):
        ta.cat([ta.tensor(1.0), ta.tensor(2.0)])


def test_shape_finite_differences():
    x = randn(1, (2, 3, 2))
    check_finite_differences(lambda t: t.transpose(0, 2).permute(1, 0, 2).unsqueeze(1).squeeze(1).flatten(0, 1),
                             [x])
    check_finite_differences(lambda a, b: ta.cat([a, b], 1), [x, randn(2, (2, 1, 2))])
    check_finite_differences(lambda a, b: ta.stack([a, b], -1), [x, randn(3, (2, 3, 2))])


# -- getitem ---------------------------------------------------------------------------------------

MASK = np.random.default_rng(7).random((3, 4, 5)) > 0.5
INDEX_CASES = [
    1, -1, (slice(1, None),), (slice(None, None, 2),), (None, 0), (Ellipsis, 1), (0, Ellipsis, None),
    (1, 2, 3), (slice(0, 3, 2), slice(None), -2), ([0, 0, 1],), np.array([[0, 1], [1, 1]]),
    (slice(None), [2, 0, 2, 2]), ([0, 1], [1, 1]), ([0, 2], slice(None), [1, 0]), (Ellipsis, [0, 0, 4]),
    (1, [3, 3], None), MASK, (MASK[:, :, 0],), (np.array([True, False, True]), 1),
    (slice(None), np.array([False, True, True, False])), (np.array([2, -1, -3]), slice(1, 3)),
    ([], slice(None)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("idx", INDEX_CASES, ids=lambda i: repr(i)[:40])
def test_getitem_matches_torch(dtype, idx):
    check_op(lambda x: x[idx], lambda x: x[_torch_index(idx)], [randn(0, (3, 4, 5))], dtype=dtype)


@st.composite
def basic_indices(draw, shape):
    """ints, slices with any step (negative too), None and maybe one Ellipsis."""
    items = []
    used = draw(st.integers(0, len(shape)))
    for n in shape[:used]:
        if draw(st.integers(0, 3)) == 0:
            items.append(None)  # a new axis consumes no dim of the source
        if draw(st.booleans()):
            items.append(draw(st.integers(-n, n - 1)))
        else:
            bound = st.none() | st.integers(-n - 1, n + 1)
            items.append(slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3, -1, -2]))))
    if draw(st.booleans()):  # anywhere when it stands for no dims, else where the rest begins
        items.insert(draw(st.integers(0, len(items))) if used == len(shape) else len(items), Ellipsis)
    return tuple(items)


@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_getitem_basic_is_a_view_with_numpy_semantics(shape, seed, data):
    idx = data.draw(basic_indices(shape))
    x = randn(seed, shape)
    t = ta.tensor(x, dtype=np.float64, requires_grad=True)
    out = t[idx]
    np.testing.assert_array_equal(out.numpy(), x[idx])
    assert np.shares_memory(out.data, t.data) or out.data.size == 0
    w = randn(seed + 1, out.shape)
    (out * ta.tensor(w, dtype=np.float64)).sum().backward()
    expected = np.zeros_like(x)
    expected[idx] += w  # basic indexing selects each element at most once
    np.testing.assert_array_equal(t.grad, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shape=shapes, seed=seeds, data=st.data())
def test_getitem_integer_arrays_with_repeats(dtype, shape, seed, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    ids = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=6)))
    idx = (slice(None),) * axis + (ids,)
    check_op(lambda x: x[idx], lambda x: x[_torch_index(idx)], [randn(seed, shape)], dtype=dtype)


def test_getitem_repeated_indices_accumulate():
    x = ta.tensor(np.arange(4.0), dtype=np.float64, requires_grad=True)
    getitem(x, [1, 1, 3, 1, -1]).sum().backward()  # the function form of x[...]
    np.testing.assert_array_equal(x.grad, [0.0, 3.0, 0.0, 2.0])
    y = ta.tensor(np.zeros((2, 3)), dtype=np.float64, requires_grad=True)
    y[ta.Tensor(np.array([[0, 0], [1, 0]])), 2].sum().backward()  # an int Tensor as the index
    np.testing.assert_array_equal(y.grad, [[0, 0, 3], [0, 0, 1]])


def test_getitem_bool_mask_and_negative_steps():
    x = randn(3, (4, 5))
    t = ta.tensor(x, dtype=np.float64, requires_grad=True)
    mask = x > 0
    out = t[ta.Tensor(mask)]
    np.testing.assert_array_equal(out.numpy(), x[mask])
    out.sum().backward()
    np.testing.assert_array_equal(t.grad, mask.astype(np.float64))
    check_finite_differences(lambda a: a[::-2, 3:0:-1], [x])
    check_finite_differences(lambda a: a[[2, 2, 0], ::-1], [x])
    check_finite_differences(lambda a: a[x < 0.3], [x])


def test_getitem_errors():
    t = ta.tensor(np.zeros((2, 3)))
    with pytest.raises(IndexError):
        t[5]
    with pytest.raises(IndexError, match="out of bounds"):
        t[[0, 3]]
    with pytest.raises(IndexError):
        t[:, [0, 1], 0, 0]
    with pytest.raises(IndexError):
        t[np.array([True, False, True])]


# -- where -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(shapes3=mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3), seed=seeds)
def test_where(dtype, shapes3, seed):
    cs, as_, bs = shapes3.input_shapes
    cond = np.asarray(np.random.default_rng(seed).random(cs) > 0.5)
    check_op(lambda a, b: where(cond, a, b), lambda a, b: torch.where(torch.from_numpy(cond), a, b),
             [randn(seed, as_), randn(seed + 1, bs)], dtype=dtype)


def test_where_scalars_and_dtypes():
    cond = np.array([True, False, True])
    a = ta.tensor([1.0, 2.0, 3.0], dtype=np.float32, requires_grad=True)
    out = where(ta.Tensor(cond), a, 0.0)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.numpy(), [1.0, 0.0, 3.0])
    out.sum().backward()
    np.testing.assert_array_equal(a.grad, [1.0, 0.0, 1.0])
    b = ta.tensor(np.ones(3), dtype=np.float64, requires_grad=True)
    a.grad = None
    mixed = where(cond, a, b)
    assert mixed.dtype == np.float64
    mixed.sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64
    np.testing.assert_array_equal(b.grad, [0.0, 1.0, 0.0])
    with pytest.raises(TypeError, match="bool"):
        where(np.array([1, 0, 1]), a, b)
    check_finite_differences(lambda a, b: where(cond[:, None], a, b), [randn(0, (3, 2)), randn(1, (2,))])


# -- embedding -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@FAST
@given(ishape=array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4), num=st.integers(1, 6),
       dim=st.integers(1, 4), seed=seeds)
def test_embedding(dtype, ishape, num, dim, seed):
    ids = np.random.default_rng(seed).integers(0, num, ishape)  # small vocab: repeats are common
    check_op(lambda i, w: embedding(i, w), lambda i, w: F.embedding(i, w), [ids, randn(seed, (num, dim))],
             dtype=dtype)


def test_embedding_repeats_accumulate_and_finite_differences():
    w = ta.tensor(np.zeros((4, 2)), dtype=np.float64, requires_grad=True)
    embedding(np.array([[1, 1], [3, 1]]), w).sum().backward()
    np.testing.assert_array_equal(w.grad, [[0, 0], [3, 3], [0, 0], [1, 1]])
    check_finite_differences(lambda i, w: embedding(i, w), [np.array([[0, 2, 2], [1, 0, 2]]), randn(0, (3, 2))])


def test_embedding_errors():
    w = ta.tensor(np.zeros((4, 2)))
    with pytest.raises(IndexError) as err:
        embedding(np.array([0, 7, 1]), w)
    assert "7" in str(err.value) and "num_embeddings=4" in str(err.value)
    with pytest.raises(IndexError, match="-1"):
        embedding(np.array([-1]), w)
    with pytest.raises(TypeError, match="integers"):
        embedding(np.array([0.0, 1.0]), w)


# -- arena lifetime --------------------------------------------------------------------------------

ARENA_OPS = {
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.permute(1, 0, 2),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "squeeze": lambda x: x[:1].squeeze(0),
    "flatten": lambda x: x.flatten(),
    "cat": lambda x: ta.cat([x, x], 1),
    "stack": lambda x: ta.stack([x, x]),
    "getitem_basic": lambda x: x[0, ::-1],
    "getitem_advanced": lambda x: x[[1, 1, 0]],
    "getitem_mask": lambda x: x[x.data > 0],
    "where": lambda x: where(x.data > 0, x, 1.0),
    "embedding": lambda x: embedding(np.array([[0, 1], [1, 1]]), x.reshape(6, 4)),
}


@pytest.mark.parametrize("name", list(ARENA_OPS))
def test_outputs_and_views_live_in_the_arena(name):
    op = ARENA_OPS[name]
    x = ta.tensor(randn(0, (2, 3, 4)), requires_grad=True)  # a heap leaf
    with ta.Arena():
        y = x * 2.0  # arena-allocated: views of it must die with it
        out = op(y)
        out.sum().backward()
    with pytest.raises(ta.StaleTensorError):
        out.data
    assert x.grad is not None and x.grad.shape == x.shape  # leaf grads are persistent


def test_views_of_heap_tensors_outlive_the_arena():
    x = ta.tensor(randn(0, (2, 3)))
    with ta.Arena():
        v = x.T[::-1]
    np.testing.assert_array_equal(v.numpy(), x.numpy().T[::-1])
