"""Parameter: a persistent leaf tensor that modules register and optimizers update."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor


class Parameter(Tensor):
    """A trainable tensor. Its memory (and its gradient's) is always heap, never an arena."""

    __slots__ = ()

    def __init__(self, data, *, requires_grad: bool = True, dtype=None) -> None:
        array = np.array(data.data if isinstance(data, Tensor) else data, dtype=dtype, copy=True)
        if array.dtype.kind != "f":
            array = array.astype(np.float32)
        super().__init__(array, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
