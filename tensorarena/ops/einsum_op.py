"""einsum on np.einsum, with a backward made of einsums too (torch.einsum's common patterns).

The gradient of operand k is g contracted with every other operand, back to k's subscripts: one more einsum.
That holds when each letter appears at most once per operand; a letter repeated inside one operand (a diagonal,
'ii->i') and '...' dims that broadcast (size 1 against n) are refused with a clear error rather than
differentiated wrongly. '...' itself becomes letters the equation does not use. A letter that only
operand k has and the output lacks (summed away, 'ij->i') is broadcast back over k's gradient.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_tensor, new


def einsum(equation: str, *operands) -> Tensor:
    """torch.einsum(equation, *operands) (or a list of operands), e.g. 'bij,bjk->bik', 'ij->ji', 'i,j->ij'."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    tensors = [as_tensor(t) for t in operands]
    inputs, output = _parse(equation, [t.ndim for t in tensors])
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(f"einsum: the operands must have one dtype, got {sorted(map(str, dtypes))}; convert them "
                        f"first (e.g. t.float())")
    sizes: dict[str, int] = {}
    for sub, t in zip(inputs, tensors):
        for letter, n in zip(sub, t.shape):
            if sizes.setdefault(letter, n) != n:
                if letter not in equation:  # a letter standing in for a '...' dim
                    raise NotImplementedError(f"einsum: the '...' dims of the operands must be equal, got shapes "
                                              f"{[t.shape for t in tensors]}: broadcasting inside '...' is not "
                                              f"supported; expand the operands first (t.expand(...))")
                raise ValueError(f"einsum: subscript {letter!r} has size {sizes[letter]} in one operand and {n} in "
                                 f"another (equation {equation!r}, shapes {[t.shape for t in tensors]})")
    arrays = [t.data for t in tensors]
    out = new(tuple(sizes[c] for c in output), tensors[0].dtype)
    host(_einsum_into, f"{','.join(inputs)}->{output}", arrays, out)

    def backward(g):
        grads = []
        for k, (sub, t) in enumerate(zip(inputs, tensors)):
            if not t.requires_grad:
                grads.append(None)
                continue
            others = [(s, a) for j, (s, a) in enumerate(zip(inputs, arrays)) if j != k]
            known = set(output).union(*(s for s, _ in others))
            reached = "".join(c for c in sub if c in known)  # the letters the contraction can produce
            spec = ",".join([output] + [s for s, _ in others]) + "->" + reached
            ga = new(t.shape, g.dtype)
            host(_einsum_grad, spec, [g] + [a for _, a in others], sub, reached, ga)
            grads.append(ga)
        return tuple(grads)

    return Tensor._make(out, tuple(tensors), backward, saved=tuple(tensors))


def _parse(equation: str, ndims: list[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, arrow, output = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(ndims):
        raise ValueError(f"einsum: the equation {equation!r} names {len(inputs)} operands, got {len(ndims)}")
    inputs, batch = _expand_ellipsis(inputs, ndims, equation)
    for sub, ndim in zip(inputs, ndims):
        if not sub.isalpha() and sub:
            raise ValueError(f"einsum: subscripts must be letters (or one '...'), got {sub!r} in {equation!r}")
        if len(sub) != ndim:
            raise ValueError(f"einsum: the subscripts {sub!r} name {len(sub)} dimensions for an operand with {ndim} "
                             f"(equation {equation!r})")
        if len(set(sub)) != len(sub):
            raise NotImplementedError(f"einsum: a letter repeated within one operand ({sub!r}, a diagonal) is not "
                                      f"supported; use ta.diag or index the diagonal explicitly")
    letters = "".join(inputs)
    if not arrow:  # torch's implicit output: the '...' dims, then the letters seen once, in alphabetical order
        output = batch + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in batch))
    elif "..." in output:
        output = output.replace("...", batch, 1)
    if len(set(output)) != len(output) or not set(output) <= set(letters):
        raise ValueError(f"einsum: the output subscripts {output!r} must be distinct letters of the inputs "
                         f"(equation {equation!r})")
    return inputs, output


def _expand_ellipsis(inputs: list[str], ndims: list[int], equation: str) -> tuple[list[str], str]:
    """Each operand's '...' replaced by letters the equation does not use, aligned from the right as broadcasting
    aligns them: the same dim of every operand gets the same letter. Returns the subscripts and the letters of
    the widest '...' (what an output '...' stands for)."""
    if "..." not in "".join(inputs):
        return inputs, ""
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in equation]
    widths = [ndim - (len(sub) - 3) if "..." in sub else 0 for sub, ndim in zip(inputs, ndims)]
    if min(widths) < 0:
        raise ValueError(f"einsum: an operand has fewer dimensions than its subscripts name (equation {equation!r}, "
                         f"dimensions {ndims})")
    batch = "".join(free[:max(widths)])
    return [sub.replace("...", batch[len(batch) - w:], 1) if "..." in sub else sub
            for sub, w in zip(inputs, widths)], batch


def _einsum_into(spec, arrays, out) -> None:
    np.copyto(out, np.einsum(spec, *arrays, optimize=True))


def _einsum_grad(spec, arrays, sub, reached, ga) -> None:
    r = np.einsum(spec, *arrays, optimize=True)
    # `reached` keeps sub's order, so r lacks only the letters this operand alone had (summed away in forward):
    # a 1 in their place broadcasts the same gradient to each of their positions.
    np.copyto(ga, r.reshape(tuple(n if c in reached else 1 for n, c in zip(ga.shape, sub))))
