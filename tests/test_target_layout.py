"""compile/targets.py: how a fused plan holds targets, one array or a structure of them."""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena.compile.targets import build, flatten, is_container
from tensorarena.tensor import Tensor


def test_flatten_and_build_round_trip_a_nested_structure():
    labels = np.array([1, 0, 2])
    weights = np.array([0.5, 1.0, 2.0], np.float32)
    boxes = Tensor(np.zeros((3, 4), np.float32))
    targets = {"class": labels, "extra": (weights, 2.5, None, [1, 2, 3]), "box": [boxes, "xyxy"]}
    spec, leaves = flatten(targets)
    # Arrays in order of appearance; the list of numbers is one array leaf; a Tensor counts by its data.
    assert [leaf.shape for leaf in leaves] == [(3,), (3,), (3,), (3, 4)]
    assert leaves[0] is labels and leaves[1] is weights and leaves[3] is boxes.data
    copies = [leaf.copy() for leaf in leaves]
    rebuilt = build(spec, copies)
    assert rebuilt["class"] is copies[0] and rebuilt["box"][0] is copies[3] and rebuilt["box"][1] == "xyxy"
    assert rebuilt["extra"][1:3] == (2.5, None) and isinstance(rebuilt["extra"], tuple)
    np.testing.assert_array_equal(rebuilt["extra"][3], [1, 2, 3])
    hash(spec)  # part of the plan's signature


def test_the_spec_tells_shapes_dtypes_and_constants_apart():
    y = np.array([1, 0])
    assert flatten((y, 2.0))[0] != flatten((y, 3.0))[0]
    assert flatten((y, 2.0))[0] != flatten((y.astype(np.int32), 2.0))[0]
    assert flatten((y, 2.0))[0] != flatten([y, 2.0])[0]  # a list is not a tuple to the loss either
    assert flatten((y, 2.0))[0] == flatten((y + 1, 2.0))[0]  # values of arrays are data, not signature


def test_one_array_and_a_list_of_labels_stay_one_array_leaf():
    assert not is_container([1, 2, 3]) and is_container([np.zeros(2)]) and is_container({"a": 1})
    spec, leaves = flatten([1, 0, 2])
    assert spec[0] == "array" and leaves[0].dtype.kind == "i" and build(spec, leaves) is leaves[0]
    spec, leaves = flatten(np.float32(3.0))  # a lone number is a 0-d array, as np.asarray made it before
    assert spec[0] == "array" and leaves[0].shape == ()


def test_what_a_plan_cannot_hold_is_named():
    with pytest.raises(TypeError, match=r"targets\[1\] is of type object"):
        flatten((np.zeros(2), object()))
    with pytest.raises(TypeError, match=r"cannot hold targets\['a'\]: NumPy cannot make one array"):
        flatten({"a": [[1, 2], [3]]})
