"""Parameter: a persistent leaf tensor that modules register and optimizers update."""

from __future__ import annotations

import numpy as np

from ..tensor import DEFAULT_DTYPE, SUPPORTED_FLOATS, Tensor
from .deferred import DeferredInit, DeferredParameterError, is_deferring, placeholder


def _check_float_dtype(dtype) -> None:
    """A float dtype a parameter cannot hold (float16, longdouble) is refused: made into a Tensor, it became
    float32 without a word."""
    if dtype is not None and np.dtype(dtype).kind == "f" and np.dtype(dtype) not in SUPPORTED_FLOATS:
        raise TypeError(f"parameters are float32 or float64, got dtype {np.dtype(dtype)}; tensorarena has no "
                        f"half-precision parameters (see matmul_precision='bfloat16' for faster products)")


class Parameter(Tensor):
    """A trainable tensor. Its memory (and its gradient's) is always heap, never an arena."""

    __slots__ = ()

    def __init__(self, data, *, requires_grad: bool = True, dtype=None) -> None:
        """A copy of `data` (torch's Parameter shares a tensor's memory; a parameter here is always its own heap
        array). Python numbers and lists of them are float32 unless `dtype` says otherwise, as Tensor makes them."""
        _check_float_dtype(dtype)
        array = np.array(data.data if isinstance(data, Tensor) else data, dtype=dtype, copy=True)
        if dtype is None and array.dtype == np.float64 and not isinstance(data, (Tensor, np.ndarray, np.generic)):
            array = array.astype(np.float32)  # Parameter(3.0) was float64 where Tensor(3.0) is float32
        if array.dtype.kind != "f" and requires_grad:
            # As torch: converting would silently drop a complex value's imaginary part or round integers.
            raise TypeError(f"Parameter: only floating-point data can require gradients, got dtype {array.dtype}; "
                            f"convert it (dtype=np.float32) or pass requires_grad=False")
        super().__init__(array, requires_grad=requires_grad)

    @classmethod
    def empty(cls, shape: tuple[int, ...], dtype=np.float32, *, requires_grad: bool = True) -> "Parameter":
        """An uninitialised parameter for a constructor to fill with tensorarena.nn.init; under
        nn.deferred_init() a deferred one (no memory; the fills recorded: nn/deferred.py)."""
        # dtype=None is the default float32, as torch's factory_kwargs (np.dtype(None) is float64: a ported layer
        # built with dtype=None trained in float64 at twice the memory).
        dt = np.dtype(DEFAULT_DTYPE if dtype is None else dtype)
        if dt.kind != "f":
            raise TypeError(f"parameters must be floating point, got dtype {dt}")
        _check_float_dtype(dt)
        if not is_deferring():
            return cls(np.empty(shape, dt), dtype=dt, requires_grad=requires_grad)
        p = cls.__new__(cls)
        Tensor.__init__(p, placeholder(tuple(shape), dt), requires_grad=requires_grad)
        # Private slots on purpose: the arena slot is where Tensor.data looks, so every read raises (deferred.py).
        p._arena, p._generation = DeferredInit(tuple(shape), dt), 0
        return p

    @property
    def is_deferred(self) -> bool:
        """Whether the values are not made yet (built under nn.deferred_init(); see materialize)."""
        return isinstance(self._arena, DeferredInit)

    def _set_data(self, value) -> None:
        """Tensor's setter, but a parameter stays heap memory (the class docstring): an arena's array or tensor
        (`p.data = (p * 0.5).data` under `with ta.Arena()`, as a torch loop writes `p.data = ...`) is copied out.
        Shared, the parameter read the next step's activations once the arena closed (a raw array: silently), or
        raised StaleTensorError at its next use (a tensor)."""
        Tensor.data.fset(self, value)
        if self._arena is not None and not isinstance(self._arena, DeferredInit):
            self._data, self._arena, self._generation = self._data.copy(), None, 0

    data = property(Tensor.data.fget, _set_data, doc=Tensor.data.__doc__)

    def materialize(self) -> "Parameter":
        """Make a deferred parameter's values in memory (exactly an eager build's); nothing if it has values."""
        if self.is_deferred:
            record = self._arena
            self.data = record.fill_into(np.empty(record.shape, record.dtype))  # the setter forgets the record
        return self

    def defer_as(self, dtype) -> None:
        """A deferred parameter to be made in `dtype` (Module.to): still no values; made later, they are the eager
        build's cast to dtype (DeferredInit.fill_into)."""
        record = self._arena
        record.dtype = np.dtype(dtype)
        self._data = placeholder(record.shape, record.dtype)

    def __repr__(self) -> str:
        if self.is_deferred:  # repr must not raise: a debugger or a log line shows it
            return f"Parameter(deferred, shape={self.shape}, dtype={self.dtype}, requires_grad={self.requires_grad})"
        return "Parameter containing:\n" + super().__repr__()


__all__ = ["Parameter", "DeferredParameterError"]
