"""einsum on np.einsum, with a backward made of einsums too (torch.einsum's common patterns).

The gradient of operand k is g contracted with every other operand, back to k's subscripts: one more einsum.
That holds when each letter appears at most once per operand; a letter repeated inside one operand (a diagonal,
'ii->i') and '...' are refused with a clear error rather than differentiated wrongly. A letter that only
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
    if "." in eq:
        raise NotImplementedError(f"einsum: '...' is not supported (equation {equation!r}); name every dimension "
                                  f"with a letter")
    lhs, arrow, output = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(ndims):
        raise ValueError(f"einsum: the equation {equation!r} names {len(inputs)} operands, got {len(ndims)}")
    for sub, ndim in zip(inputs, ndims):
        if not sub.isalpha() and sub:
            raise ValueError(f"einsum: subscripts must be letters, got {sub!r} in {equation!r}")
        if len(sub) != ndim:
            raise ValueError(f"einsum: the subscripts {sub!r} name {len(sub)} dimensions for an operand with {ndim} "
                             f"(equation {equation!r})")
        if len(set(sub)) != len(sub):
            raise NotImplementedError(f"einsum: a letter repeated within one operand ({sub!r}, a diagonal) is not "
                                      f"supported; use ta.diag or index the diagonal explicitly")
    letters = "".join(inputs)
    if not arrow:  # torch's implicit output: the letters seen once, in alphabetical order
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(set(output)) != len(output) or not set(output) <= set(letters):
        raise ValueError(f"einsum: the output subscripts {output!r} must be distinct letters of the inputs "
                         f"(equation {equation!r})")
    return inputs, output


def _einsum_into(spec, arrays, out) -> None:
    np.copyto(out, np.einsum(spec, *arrays, optimize=True))


def _einsum_grad(spec, arrays, sub, reached, ga) -> None:
    r = np.einsum(spec, *arrays, optimize=True)
    # `reached` keeps sub's order, so r lacks only the letters this operand alone had (summed away in forward):
    # a 1 in their place broadcasts the same gradient to each of their positions.
    np.copyto(ga, r.reshape(tuple(n if c in reached else 1 for n, c in zip(ga.shape, sub))))
