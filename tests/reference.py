"""One helper to check an op's forward and gradients against torch and finite differences.

Usage: check_op(fn_ta, fn_torch, [arrays], dtype=np.float64), where fn_ta takes
tensorarena tensors and fn_torch the matching torch tensors (same order). Keep
outputs away from subnormals: the tests run with np.seterr(all="raise").
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import tensorarena as ta

# Shared by the op tests: derandomized so float32 tolerances cannot fail at random in CI.
FAST = settings(max_examples=20, deadline=None, database=None, derandomize=True)
DTYPES = [np.float64, np.float32]
shapes = array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)
seeds = st.integers(0, 2**16)


def torch_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 by torch (Tensor.bfloat16()), as float64: the bf16-precision tests' reference."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).bfloat16().double().numpy()


def torch_bf16_bits(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 by torch, as uint16 bit patterns (tensorarena's bfloat16 storage)."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).bfloat16().view(torch.int16).numpy().view(
        np.uint16)


def randn(seed: int, shape) -> np.ndarray:
    """Standard normal float64 values, reproducible from `seed`."""
    return np.random.default_rng(seed).standard_normal(shape)


TOL = {np.float64: dict(rtol=1e-9, atol=1e-10), np.float32: dict(rtol=1e-4, atol=1e-5)}


def _to_ta(a: np.ndarray, dtype, grad: bool):
    if a.dtype.kind in "iub":
        return ta.Tensor(a.copy())
    return ta.tensor(a, dtype=dtype, requires_grad=grad)


def _to_torch(a: np.ndarray, dtype, grad: bool):
    if a.dtype.kind in "iub":
        return torch.from_numpy(a.copy())
    return torch.tensor(a, dtype=torch.float64 if dtype == np.float64 else torch.float32, requires_grad=grad)


def check_op(fn_ta: Callable, fn_torch: Callable, inputs: Sequence[np.ndarray], *, dtype=np.float64,
             grad: bool = True, rtol: float | None = None, atol: float | None = None, seed: int = 0,
             torch_dtype=None) -> None:
    """Forward and all input gradients of fn_ta(*tensors) match fn_torch(*torch_tensors).

    torch_dtype=np.float64 runs the torch side in float64: the ground truth for ops whose float32
    kernels accumulate in float64 and so beat torch's own float32 arithmetic.
    """
    tol = dict(TOL[dtype])
    if rtol is not None:
        tol["rtol"] = rtol
    if atol is not None:
        tol["atol"] = atol
    ours = [_to_ta(a, dtype, grad) for a in inputs]
    theirs = [_to_torch(a, torch_dtype or dtype, grad) for a in inputs]
    out = fn_ta(*ours)
    ref = fn_torch(*theirs)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **tol, err_msg="forward")
    assert out.dtype == np.dtype(dtype), f"output dtype {out.dtype}, expected {np.dtype(dtype)}"
    if not grad:
        return
    weights = np.random.default_rng(seed).standard_normal(out.shape)  # a random cotangent
    (out * ta.tensor(weights, dtype=dtype)).sum().backward()
    (ref * torch.tensor(weights, dtype=ref.dtype)).sum().backward()  # same cotangent on both sides
    for i, (o, t) in enumerate(zip(ours, theirs)):
        if not o.requires_grad:
            continue
        assert o.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(o.grad, t.grad.numpy(), **tol, err_msg=f"grad of input {i}")


def check_finite_differences(fn_ta: Callable, inputs: Sequence[np.ndarray], *, eps: float = 1e-6,
                             rtol: float = 1e-5, atol: float = 1e-7, seed: int = 0) -> None:
    """Analytic float64 gradients of sum(w * fn(x)) match central differences."""
    ours = [_to_ta(a, np.float64, a.dtype.kind == "f") for a in inputs]
    out = fn_ta(*ours)
    weights = np.random.default_rng(seed).standard_normal(out.shape)
    (out * ta.tensor(weights, dtype=np.float64)).sum().backward()
    for i, a in enumerate(inputs):
        if a.dtype.kind != "f":
            continue
        numeric = np.zeros(a.shape, dtype=np.float64)
        perturbed = [x.astype(np.float64) if x.dtype.kind == "f" else x for x in inputs]
        flat = perturbed[i].reshape(-1)  # a view: editing it edits perturbed[i]
        for j in range(flat.size):
            saved = flat[j]
            values = []
            for delta in (eps, -eps):
                flat[j] = saved + delta
                with ta.no_grad():
                    out_d = fn_ta(*[_to_ta(x, np.float64, False) for x in perturbed])
                values.append(float((out_d.numpy() * weights).sum()))
            flat[j] = saved
            numeric.reshape(-1)[j] = (values[0] - values[1]) / (2 * eps)
        np.testing.assert_allclose(ours[i].grad, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"finite-difference grad of input {i}")
