"""A Tensor meets NumPy and Python as torch's CPU tensors do: np.asarray / np.concatenate give real arrays
(__array__), a one-element integer tensor is an index (__index__).

On d674c72 (`python -m pytest -q tests/test_tensor_numpy_protocols.py` from a worktree of it, with an absolute
PYTHONPATH) 9 of 9 fail: NumPy built object arrays of 0-d tensors (1.5 s for 100k values) and
`x[:, :lengths.max()]`, range(t), names[t] raised Python's TypeErrors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta


def test_asarray_gives_the_values_in_the_tensors_dtype():
    for values, dtype in (([0, 2, 1, 1], np.int64), ([0.5, -1.0], np.float32), ([True, False], np.bool_)):
        got = np.asarray(ta.tensor(values))
        want = torch.tensor(values).numpy()
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(got, want)


def test_concatenate_of_batch_predictions_is_an_array():
    # An evaluation loop collecting per-batch predictions, as with torch CPU tensors.
    batches = [ta.tensor([1, 2]), ta.tensor([3])]
    got = np.concatenate(batches)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.concatenate([torch.tensor([1, 2]), torch.tensor([3])]))


def test_asarray_with_a_dtype_and_copy():
    t = ta.tensor([1.5, 2.5])
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), [1.5, 2.5])
    copied = np.array(t, copy=True)
    copied[0] = 9
    assert t.numpy()[0] == 1.5  # a copy asked for is a copy
    with pytest.raises(ValueError, match="a copy is needed"):
        np.array(t, dtype=np.float64, copy=False)


def test_an_arena_tensor_converts_to_a_copy_that_outlives_the_arena():
    with ta.Arena():
        doubled = ta.tensor([1.0, 2.0]) * 2
        values = np.asarray(doubled)
    np.testing.assert_array_equal(values, [2.0, 4.0])


def test_a_tensor_that_requires_grad_is_refused_as_torchs():
    w = ta.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"requires grad.*detach\(\)\.numpy\(\)"):
        np.asarray(w)
    with pytest.raises(RuntimeError, match="requires grad"):
        np.asarray(torch.tensor([1.0, 2.0], requires_grad=True))  # torch refuses it too
    # Arithmetic with an ndarray still records the op (Tensor.__radd__ runs, not NumPy's conversion).
    y = np.ones(2) + w
    assert isinstance(y, ta.Tensor) and y.requires_grad


def test_index_of_a_one_element_integer_tensor():
    lengths = ta.tensor([3, 5])
    x = ta.zeros((2, 8))
    assert x[:, :lengths.max()].shape == (2, 5)
    assert list(range(lengths[0])) == [0, 1, 2]
    assert ["a", "b", "c"][ta.tensor(2)] == "c"
    assert ["a", "b"][ta.tensor(True)] == ["a", "b"][torch.tensor(True)] == "b"
    assert np.arange(10)[ta.tensor(4)] == 4


@pytest.mark.parametrize("bad", [ta.tensor(1.0), ta.tensor([1, 2])])
def test_index_of_a_float_or_longer_tensor_is_refused(bad):
    with pytest.raises(TypeError, match="only integer tensors of a single element can be converted to an index"):
        [1, 2, 3][bad]


def test_numpy_functions_of_tensors_compute_on_the_values():
    t = ta.tensor([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_allclose(np.linalg.norm(t), np.linalg.norm(torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
    np.testing.assert_array_equal(np.argsort(np.asarray(ta.tensor([3, 1, 2]))), [1, 2, 0])
