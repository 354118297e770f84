"""Elementwise functions and activations: exp log sqrt tanh abs relu gelu sigmoid."""

from __future__ import annotations

import numpy as np

from ..kernels import kernel
from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, contiguous, new_like
from .cast import float_input, refuse_integers


def exp(a: Tensor) -> Tensor:
    """e ** a."""
    a = float_input(a)
    ad = a.data
    out = new_like(ad)
    host(np.exp, ad, out=out)

    def backward(g):
        ga = new_like(out)  # from the output: the closure keeps no input
        host(np.multiply, g, out, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved_output=True)


def log(a: Tensor) -> Tensor:
    """Natural log."""
    a = float_input(a)
    ad = a.data
    out = new_like(ad)
    host(np.log, ad, out=out)

    def backward(g):
        ga = new_like(ad)
        host(np.divide, g, ad, out=ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,))


def sqrt(a: Tensor) -> Tensor:
    """Square root."""
    return of_output("sqrt", float_input(a), np.sqrt, _sqrt_grad)


def sqrt_of_variance(a: Tensor) -> Tensor:
    """sqrt for std: where the result is 0 (a constant slice) the gradient is 0, as torch's std backward
    masks it, not sqrt's inf times var's 0 = NaN."""
    return of_output("sqrt", a, np.sqrt, _sqrt_grad_zero_at_zero)


def tanh(input: Tensor) -> Tensor:
    """Hyperbolic tangent."""
    return of_output("tanh", float_input(input), np.tanh, _tanh_grad)


def of_output(op: str, a: Tensor, forward, grad) -> Tensor:
    """An elementwise op whose gradient is read from its output alone (sqrt, tanh, pointwise.rsqrt):
    `forward(a.data, out=out)`, and in backward `grad(out, g, ga)`; the closure keeps no input."""
    return _elementwise(op, a, forward, grad, reads_output=True)


def of_input(op: str, a: Tensor, forward, grad) -> Tensor:
    """An elementwise op whose gradient is read from its input (pointwise.sin, cos): `forward(a.data, out=out)`,
    and in backward `grad(a.data, g, ga)`; the input is saved for it."""
    return _elementwise(op, a, forward, grad, reads_output=False)


def _elementwise(op: str, a: Tensor, forward, grad, *, reads_output: bool) -> Tensor:
    # `op` names the backward closure: the version counter's error about a saved tensor names the op by its
    # backward's qualified name (autograd._op_name), which would otherwise be this helper's.
    ad = a.data
    out = new_like(ad)
    host(forward, ad, out=out)
    read = out if reads_output else ad

    def backward(g):
        ga = new_like(read)
        host(grad, read, g, ga)
        return (ga,)

    backward.__qualname__ = f"{op}.<locals>.backward"
    if reads_output:
        return Tensor._make(out, (a,), backward, saved_output=True)
    return Tensor._make(out, (a,), backward, saved=(a,))


def abs(a: Tensor) -> Tensor:  # noqa: A001 - torch's name
    """|a|; the gradient is sign(a) * g, so 0 at 0, as torch's."""
    a = as_tensor(a)
    ad = a.data
    if ad.dtype == np.bool_:  # as torch, which has no abs for bool
        raise TypeError("abs: the tensor is bool, which has no absolute value; convert it first (t.long() or "
                        "t.float())")
    out = new_like(ad)
    host(np.abs, ad, out=out)

    def backward(g):
        ga = new_like(ad)
        host(_abs_grad, ad, g, ga)
        return (ga,)

    return Tensor._make(out, (a,), backward, saved=(a,))


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(a, 0); gradient 0 at 0 and g at NaN, as torch. `inplace` is torch's argument: only False (the ops here
    return a new tensor, and an ignored result would silently not activate)."""
    if inplace:
        raise ValueError("relu: inplace=True is not supported (ops here return a new tensor); write "
                         "x = F.relu(x) instead")
    input = as_tensor(input)
    ad = input.data
    if ad.dtype == np.bool_:  # NumPy's maximum would name neither relu nor the dtype
        raise TypeError("relu: Boolean inputs are not supported (as torch's); cast them first (e.g. x.float())")
    out = new_like(ad)
    host(np.maximum, ad, 0, out=out)

    def backward(g):
        ga = new_like(ad)
        host(_relu_grad, ad, g, ga)
        return (ga,)

    # It reads its input for the mask, where torch's reads the output: a write to either is refused.
    return Tensor._make(out, (input,), backward, saved=(input,), saved_output=True)


def sigmoid(input: Tensor) -> Tensor:
    """1 / (1 + e^-a), computed stably for large |a|."""
    input = float_input(input)
    ad = input.data
    out = new_like(ad)
    den = new_like(ad)
    host(_sigmoid_forward, ad, out, den)

    def backward(g):
        ga = new_like(out)  # from the output: the closure keeps no input
        host(_sigmoid_grad, out, g, ga)
        return (ga,)

    return Tensor._make(out, (input,), backward, saved_output=True)


# The NumPy work of the ops above, one function each: tape.host records a call as one entry of a
# captured step (compile/captured.py), so a multi-line computation goes in as one function.

def _sqrt_grad(out, g, ga):
    np.multiply(out, 2.0, out=ga)
    np.divide(g, ga, out=ga)


def _sqrt_grad_zero_at_zero(out, g, ga):
    np.multiply(out, 2.0, out=ga)
    zero = out == 0
    np.divide(g, ga, out=ga, where=~zero)
    ga[zero] = 0


def _tanh_grad(out, g, ga):
    np.square(out, out=ga)
    np.subtract(1.0, ga, out=ga)
    ga *= g


def _abs_grad(ad, g, ga):
    np.sign(ad, out=ga)  # 0 at +-0: the subgradient torch picks
    ga *= g


def _relu_grad(ad, g, ga):
    # 1 - (a <= 0): 0 where a <= 0 and 1 elsewhere, NaN included (torch's backward passes g where its output is
    # not <= 0, and relu(NaN) is NaN); the mask goes straight into the float buffer, no bool temporary.
    np.less_equal(ad, 0, out=ga)
    np.subtract(1, ga, out=ga)
    ga *= g


def _sigmoid_forward(ad, out, den):
    # e = exp(-|a|) never overflows; sigmoid(-|a|) = e / (1 + e) and sigmoid(|a|) = 1 / (1 + e).
    # exp and the quotient may underflow to 0 for large |a|, which is the right limit.
    with np.errstate(under="ignore"):
        np.abs(ad, out=out)
        np.negative(out, out=out)
        np.exp(out, out=out)
        np.add(out, 1.0, out=den)
        negative = ad < 0
        np.divide(out, den, out=out, where=negative)
        np.divide(1.0, den, out=out, where=~negative)


def _sigmoid_grad(out, g, ga):
    np.subtract(1.0, out, out=ga)
    with np.errstate(under="ignore"):  # a saturated sigmoid's gradient is ~0, possibly subnormal
        ga *= out
        ga *= g


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """GELU; approximate="none" (erf form) or "tanh", as torch.nn.functional.gelu (gelu kernels)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    input = refuse_integers(input, "gelu")
    x = contiguous(input.data)
    out = new_like(x)
    kernel("gelu_forward")(x, out, approximate)

    def backward(g):
        ga = new_like(x)
        kernel("gelu_backward")(x, contiguous(g), ga, approximate)
        return (ga,)

    return Tensor._make(out, (input,), backward, saved=(input,))


