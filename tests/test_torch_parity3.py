"""Tensor API parity with torch, third pass: the known gaps and what a hunt over common training-loop idioms found.

- clip_grad_norm_ returns the total norm as a 0-d tensor in the gradients' dtype (it returned a Python float);
- a write whose source partly overlaps the written memory (`t[1:] = t[:-1]`, copy_, `+=` on views) raises torch's
  error instead of NumPy's silent copy-first result; identical aliasing (`t[:] = t`) stays allowed, as in torch;
- clamp / clip out of place with torch's gradient (inclusive bounds; tensor bounds get their share);
- an ndarray operand promotes as NumPy does (torch hands `tensor * ndarray` to NumPy), NumPy and Python scalars
  and 0-d tensors as torch's weak scalars;
- cat accepts torch's legacy 1-D empty tensors;
- `tensorarena plan --json -` writes the JSON alone to stdout.

Every test compares with torch (the reference, imported here only) with explicit tolerances, or asserts an exact
error. Run: NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_torch_parity3.py

PRE-FIX COUNT (filled in below).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import optim
from tensorarena.nn import Parameter

F32 = dict(rtol=2e-6, atol=1e-7)
F64 = dict(rtol=1e-12, atol=1e-14)
TOL = {np.float32: F32, np.float64: F64}
OVERLAP = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
           "memory location. Please clone() the tensor before performing the operation.")


def _torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(1, dtype)).dtype


def _same_dtype(ours, theirs) -> None:
    assert _torch_dtype(ours.dtype) == theirs.dtype, (ours.dtype, theirs.dtype)


# -- 1. clip_grad_norm_ returns a 0-d tensor ---------------------------------------------------------------------

def _clip_pair(dtypes, seed=0):
    rng = np.random.default_rng(seed)
    ours, theirs = [], []
    for i, dtype in enumerate(dtypes):
        g = (3 * rng.standard_normal(4 + i)).astype(dtype)
        p = Parameter(np.zeros(4 + i, dtype))
        p.grad = g.copy()
        t = torch.zeros(4 + i, dtype=_torch_dtype(dtype), requires_grad=True)
        t.grad = torch.from_numpy(g.copy())
        ours.append(p)
        theirs.append(t)
    return ours, theirs


@pytest.mark.parametrize("dtypes", [(np.float32,), (np.float64, np.float64), (np.float32, np.float64)],
                         ids=["f32", "f64", "mixed"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, "inf"])
@pytest.mark.parametrize("foreach", [None, True, False])
def test_clip_grad_norm_returns_a_zero_d_tensor_in_the_gradients_dtype(dtypes, norm_type, foreach):
    ours, theirs = _clip_pair(dtypes)
    total = ta.nn.utils.clip_grad_norm_(ours, 1.0, norm_type=norm_type, foreach=foreach)
    want = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type=norm_type, foreach=foreach)
    assert isinstance(total, ta.Tensor) and total.shape == () == tuple(want.shape)
    _same_dtype(total, want)
    tol = F32 if np.float32 in dtypes else F64
    np.testing.assert_allclose(total.item(), want.item(), **tol)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), **tol)


def test_clip_grad_norm_result_works_as_a_number_in_the_usual_places():
    ours, theirs = _clip_pair((np.float32,))
    total = ta.nn.utils.clip_grad_norm_(ours, 100.0)
    want = torch.nn.utils.clip_grad_norm_(theirs, 100.0)
    assert f"{total:.3f}" == f"{want:.3f}" and f"{total}" == f"{want}"  # a log line, as torch formats it
    assert float(total) == pytest.approx(float(want), rel=2e-6)
    assert bool(total > 1.0) == bool(want > 1.0) and bool(total < 1e6) == bool(want < 1e6)
    assert not total.requires_grad and not want.requires_grad
    assert math.isfinite(total) and round(total.item(), 3) == round(want.item(), 3)


def test_clip_grad_norm_with_no_gradients_is_a_float32_zero_tensor_as_torch():
    total = ta.nn.utils.clip_grad_norm_([Parameter(np.zeros(3, np.float64))], 1.0)
    want = torch.nn.utils.clip_grad_norm_([torch.zeros(3, dtype=torch.float64, requires_grad=True)], 1.0)
    assert total.shape == () and total.item() == want.item() == 0.0
    _same_dtype(total, want)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_clip_grad_norm_error_if_nonfinite_as_torch(bad):
    p = Parameter(np.zeros(2, np.float32))
    p.grad = np.array([bad, 1.0], np.float32)
    t = torch.zeros(2, requires_grad=True)
    t.grad = torch.tensor([bad, 1.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_([t], 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match=re.escape(f"the total norm of order 2.0 of the gradients is non-finite "
                                                     f"({bad})")):
        ta.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    total, want = ta.nn.utils.clip_grad_norm_([p], 1.0), torch.nn.utils.clip_grad_norm_([t], 1.0)
    assert math.isnan(total.item()) == math.isnan(want.item()) and (math.isnan(bad) or total.item() == want.item())
    np.testing.assert_array_equal(p.grad, t.grad.numpy())
