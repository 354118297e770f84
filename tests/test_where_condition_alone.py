"""torch.where(condition) alone is nonzero(condition, as_tuple=True); with one of input/other missing, the error says
which forms there are. On b0f5ff6 (`python -m pytest -q tests/test_where_condition_alone.py` from a worktree of it,
with an absolute PYTHONPATH) 3 of 3 fail: "where() missing 2 required positional arguments: 'a' and 'b'".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta


@pytest.mark.parametrize("shape", [(5,), (3, 4)])
def test_where_of_a_condition_alone_is_torchs_nonzero_tuple(shape):
    cond = np.random.default_rng(0).random(shape) > 0.5
    ours, theirs = ta.where(ta.tensor(cond)), torch.where(torch.tensor(cond))
    assert len(ours) == len(theirs) == len(shape)
    for o, t in zip(ours, theirs):
        assert o.dtype == np.int64
        np.testing.assert_array_equal(o.numpy(), t.numpy())


def test_where_with_one_branch_missing_names_the_forms():
    with pytest.raises(TypeError, match="a condition alone .* or a condition, input and other"):
        ta.where(ta.tensor([True, False]), 1.0)
