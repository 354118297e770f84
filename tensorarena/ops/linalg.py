"""Matrix products: matmul (batched, broadcasting, torch's 1-D rules), mm and bmm (its strict forms) and linear."""

from __future__ import annotations

import math

import numpy as np

from ..kernels import elementwise
from ..kernels.blas import _slices_blasable, matmul as blas_matmul
from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, contiguous, grad_out, leaf_or_none, new, reshaped, unbroadcast
from ._products import bf16_asked, operand, product, rounded


def _matmul_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...], what: str = "matmul") -> tuple[int, ...]:
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ValueError(f"{what}: both operands need at least 1 dimension, got shapes {a_shape} and {b_shape}")
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ValueError(
            f"{what}: shapes {a_shape} and {b_shape} cannot be multiplied "
            f"({a2[-1]} columns on the left vs {b2[-2]} rows on the right)"
        )
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ValueError(f"{what}: batch dimensions of {a_shape} and {b_shape} do not broadcast") from None
    out = batch + (a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return out


def _check_float_pair(a: Tensor, b: Tensor, what: str, a_name: str, b_name: str) -> None:
    # Like torch, refuse to mix dtypes in a matrix product: a silent float64 promotion would
    # double the memory and time of everything downstream of one stray float64 batch.
    if a.dtype == b.dtype and a.dtype.kind != "f":  # "int64 but int64" read as a contradiction
        raise TypeError(f"{what}: both operands are {a.dtype}: matrix products of integers or bools are not "
                        f"supported (torch computes them); convert both, e.g. x.float()")
    if a.dtype != b.dtype or a.dtype.kind != "f":
        # Named as the caller gave them: a float16 batch is "float16 (converted to float32)", not a float32
        # array the user never had.
        raise TypeError(
            f"{what}: {a_name} is {a.dtype_description()} but {b_name} is {b.dtype_description()}; both must "
            f"be the same float dtype. "
            f"Convert the data (e.g. x.astype(np.float32)) or the model (model.double() / model.float())."
        )


def _product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b: 2-D products at the float32 matmul precision (ops._products); (..., k) @ (k, n) as one
    2-D product when a's rows are contiguous; other batched or 1-D ones on NumPy's matmul, in the
    operands' own precision. With bfloat16 asked for, every product but one of two batched operands (or of
    two vectors) is a bfloat16 one, whatever the strides (README): a strided batched left operand is copied
    into the arena first, a vector is a matrix of one row or column, and a matrix times a batch runs slice by
    slice. (Strides used to decide: a transposed view's product stayed float32 without a word.)"""
    bf16 = bf16_asked(out.dtype)
    if a.ndim == 2 and b.ndim == 2 and out.ndim == 2:
        product(a, b, out)
    elif a.ndim > 2 and b.ndim == 2 and out.ndim == a.ndim and out.flags.c_contiguous \
            and (a.flags.c_contiguous or bf16):
        # Row counts spelled out, not -1: ambiguous to NumPy when the last dim is 0 (as in linear).
        rows = math.prod(a.shape[:-1])
        product(contiguous(a).reshape(rows, a.shape[-1]), b, out.reshape(rows, out.shape[-1]))
    elif bf16 and a.ndim == 1 and b.ndim == 2:
        product(a.reshape(1, -1), b, out.reshape(1, -1))
    elif bf16 and a.ndim == 2 and b.ndim == 1:
        product(a, b.reshape(-1, 1), out.reshape(-1, 1))
    elif bf16 and a.ndim > 2 and b.ndim == 1 and out.flags.c_contiguous:
        product(contiguous(a).reshape(math.prod(a.shape[:-1]), a.shape[-1]), b.reshape(-1, 1), out.reshape(-1, 1))
    elif bf16 and a.ndim <= 2 and b.ndim > 2 and out.flags.c_contiguous:
        rows = a.reshape(1, -1) if a.ndim == 1 else a
        for i in np.ndindex(b.shape[:-2]):
            product(rows, b[i], out[i].reshape(rows.shape[0], -1))
    else:
        # One recorded call (tape.host), on operands made BLAS-ready here: copied by kernels.blas inside
        # the call instead, the copies would be written with plain NumPy and allocated out of the op's order.
        host(blas_matmul, _blas_ready(a), _blas_ready(b), out=out)


def _blas_ready(x: np.ndarray) -> np.ndarray:
    """x, or its C-contiguous copy in the arena when x is batched and BLAS cannot take its 2-D slices."""
    return x if x.ndim <= 2 or _slices_blasable(x) else contiguous(x)


def matmul(a, b) -> Tensor:
    """a @ b with torch.matmul semantics. Shape: (..., n, k) @ (..., k, m) -> (..., n, m)."""
    a = as_tensor(a)
    b = as_tensor(b, like=a)
    out_shape = _matmul_shape(a.shape, b.shape)
    _check_float_pair(a, b, "matmul", "the left operand", "the right operand")
    ad, bd = a.data, b.data
    dtype = np.result_type(ad.dtype, bd.dtype)
    out = new(out_shape, dtype)
    _product(ad, bd, out)

    def backward(g):
        # Work with the 1-D operands promoted to matrices, as forward did implicitly.
        a2 = ad[None, :] if ad.ndim == 1 else ad
        b2 = bd[:, None] if bd.ndim == 1 else bd
        g2 = g
        if ad.ndim == 1:
            g2 = g2[..., None, :] if bd.ndim != 1 else g2[..., None]
        if bd.ndim == 1:
            g2 = g2[..., None]
        ga = gb = None
        if a.requires_grad:
            full = new(g2.shape[:-1] + (a2.shape[-1],), dtype)
            _product(g2, np.swapaxes(b2, -1, -2), full)
            ga = unbroadcast(full, a2.shape).reshape(a.shape)
        if b.requires_grad:
            full = new(g2.shape[:-2] + (b2.shape[-2], g2.shape[-1]), dtype)
            _product(np.swapaxes(a2, -1, -2), g2, full)
            gb = unbroadcast(full, b2.shape).reshape(b.shape)
        return ga, gb

    # a's gradient reads b, b's reads a.
    return Tensor._make(out, (a, b), backward, saved=(b if a.requires_grad else None, a if b.requires_grad else None))


def mm(input, mat2) -> Tensor:  # noqa: A002 - torch's name
    """input @ mat2 for two matrices only (torch.mm): (n, k) @ (k, m) -> (n, m); no broadcasting, no vectors."""
    a, b = as_tensor(input), as_tensor(mat2)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"mm: both operands must be matrices (2-D), got shapes {a.shape} and {b.shape}; use "
                         f"matmul for vectors or batches")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"mm: shapes {a.shape} and {b.shape} cannot be multiplied ({a.shape[1]} columns on the "
                         f"left vs {b.shape[0]} rows on the right)")
    _check_float_pair(a, b, "mm", "the left operand", "the right operand")
    return matmul(a, b)


def bmm(input, mat2) -> Tensor:  # noqa: A002 - torch's name
    """Batched matrix product (torch.bmm): (B, n, k) @ (B, k, m) -> (B, n, m); the batch sizes must be equal (no
    broadcasting, unlike matmul)."""
    a, b = as_tensor(input), as_tensor(mat2)
    if a.ndim != 3 or b.ndim != 3:
        raise ValueError(f"bmm: both operands must be 3-D (batch, rows, columns), got shapes {a.shape} and "
                         f"{b.shape}; use matmul to broadcast")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: shapes {a.shape} and {b.shape} cannot be multiplied (the batch sizes must be "
                         f"equal and the left's columns must equal the right's rows)")
    _check_float_pair(a, b, "bmm", "the left operand", "the right operand")
    return matmul(a, b)


def linear(input, weight, bias=None) -> Tensor:
    """x @ weight.T + bias, as torch.nn.functional.linear. Shape: (..., in) -> (..., out)."""
    # Arrays taken as tensors, each of them (an ndarray weight's .data is a memoryview: it failed on .dtype)
    input, weight = as_tensor(input), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (out_features, in_features), got shape {weight.shape}")
    if input.shape[-1:] != weight.shape[1:]:
        raise ValueError(
            f"linear: input shape {input.shape} does not match weight shape {weight.shape} "
            f"(last input dim {input.shape[-1] if input.ndim else None} must equal in_features {weight.shape[1]})"
        )
    _check_float_pair(input, weight, "linear", "the input", "the weight")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias shape {bias.shape} must be ({weight.shape[0]},) for weight {weight.shape}")
    xd, wd = input.data, weight.data
    lead = xd.shape[:-1]
    # Row counts are spelled out, not -1: with 0 features (Linear(0, k), or k = 0) -1 is ambiguous to NumPy.
    rows = math.prod(lead)
    x2 = reshaped(xd, (rows, xd.shape[-1]))  # (N, in); a copy (arena) only if xd is not contiguous
    out = new(lead + (wd.shape[0],), np.result_type(xd.dtype, wd.dtype))
    out2 = out.reshape(rows, wd.shape[0])  # (N, out)
    # At bfloat16 precision the input is rounded once, and that copy (half the bytes) is all backward
    # keeps of it. The weight is rounded again in backward rather than held rounded from here: holding
    # it grew ViT-Base's slab by 108 MiB and its step by nothing (0.99x and 1.016x, A/B in one process).
    x2 = operand(x2)
    product(x2, wd.T, out2)
    if bias is not None:
        elementwise.bias_add(out2, bias.data)
    parents = (input, weight) if bias is None else (input, weight, bias)
    # Backward reads x2 (x's rows, for the weight's gradient) and wd; of the tensors it keeps
    # metadata and leaves (see leaf_or_none), so no intermediate is held alive beyond x2.
    x_shape, x_needs_grad = xd.shape, input.requires_grad
    w_leaf, w_needs_grad = leaf_or_none(weight), weight.requires_grad
    b_leaf, b_needs_grad = (leaf_or_none(bias), bias.requires_grad) if bias is not None else (None, False)
    # A bias of another dtype (torch refuses one; here it is added in the output's dtype) still gets its
    # gradient in its own dtype: column_sum rounds into that buffer, no cast copy.
    b_dtype = bias.dtype if bias is not None else None
    has_bias = bias is not None
    in_bf16 = x2.dtype != out.dtype
    x2 = x2 if w_needs_grad else None
    del xd

    def backward(g):
        g2 = reshaped(g, (rows, g.shape[-1]))  # (N, out)
        gx = gw = gbias = None
        # Rounded once (when forward rounded) for both products; the bias reads the float32 one.
        gs = rounded(g2) if in_bf16 else g2
        if x_needs_grad:
            gx = new(x_shape, g.dtype)
            product(gs, wd, gx.reshape(rows, wd.shape[1]))
        if w_needs_grad:
            gw = grad_out(w_leaf, wd.shape, g.dtype)
            product(gs.T, x2, gw)
        if b_needs_grad:
            gbias = grad_out(b_leaf, (wd.shape[0],), b_dtype)
            elementwise.column_sum(g2, gbias)
        return (gx, gw) if not has_bias else (gx, gw, gbias)

    # The input's gradient reads the weight, the weight's reads the input (x2: its rows, or their bf16 copy, which
    # counts as x: torch saves x there and refuses a write to it whatever copy the product made).
    return Tensor._make(out, parents, backward,
                        saved=(weight if x_needs_grad else None, input if w_needs_grad else None))
