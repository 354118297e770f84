"""Tensor: an ndarray view plus what autograd needs, with operator sugar.

Memory comes from the arena that was current when the op ran (or the heap);
the tensor remembers that arena's generation and refuses to be read once the
arena is reset or closed.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import numpy as np

from . import autograd
from .tape import host
from .memory.arena import Arena, StaleTensorError, current_arena

DEFAULT_DTYPE = np.float32
SUPPORTED_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

BackwardFn = Callable[[np.ndarray], Sequence["np.ndarray | None"]]


class Tensor:
    """An n-dimensional array that can record the ops that produced it."""

    __slots__ = ("_data", "requires_grad", "grad", "_grad_buffer", "_node", "_arena", "_generation",
                 "_converted_from", "__weakref__")
    _parents: tuple = ()  # in the graph a tensor is always a leaf node (autograd.graph_node)
    __array_priority__ = 1000  # make `ndarray + Tensor` defer to Tensor.__radd__

    def __init__(self, data: Any, *, dtype=None, requires_grad: bool = False) -> None:
        array = np.asarray(data.data if isinstance(data, Tensor) else data)
        if array.dtype.kind == "c" or (dtype is not None and np.dtype(dtype).kind == "c"):
            raise TypeError(f"complex tensors are not supported (got {array.dtype}); pass real and "
                            f"imaginary parts as separate float tensors")
        if not array.dtype.isnative:
            # A big-endian array (np.load of a file from a big-endian machine) holds the same values as the
            # native one; compared as it is, ">f8" is not float64 and would be rounded to float32 below.
            array = array.astype(array.dtype.newbyteorder("="))
        # The dtype the caller gave when it is not the one the tensor holds, for errors (ops.linalg names it).
        self._converted_from = getattr(data, "_converted_from", None) if isinstance(data, Tensor) else None
        if dtype is not None:
            array = array.astype(dtype, copy=False)
        elif array.dtype.kind == "f" and array.dtype not in SUPPORTED_FLOATS:
            self._converted_from = array.dtype
            array = array.astype(DEFAULT_DTYPE)
        elif array.dtype.kind in "iub" and requires_grad:
            raise TypeError(f"only floating-point tensors can require grad, got dtype {array.dtype}")
        if isinstance(data, (int, float, list, tuple)) and array.dtype == np.float64 and dtype is None:
            array = array.astype(DEFAULT_DTYPE)  # Python floats default to float32, as in torch
        self._data = array
        self.requires_grad = requires_grad
        self.grad: np.ndarray | None = None
        self._grad_buffer: np.ndarray | None = None
        self._node: autograd.Node | None = None  # the op that made it; None for a leaf
        self._arena: Arena | None = None
        self._generation = 0

    @classmethod
    def _make(cls, data: np.ndarray, parents: Sequence["Tensor"] = (), backward: BackwardFn | None = None,
              *, view_of: "Tensor | None" = None) -> "Tensor":
        """Wrap an op's output; record the graph when any parent needs grad."""
        t = object.__new__(Tensor)
        t._data = data
        t.grad = None
        t._grad_buffer = None
        if view_of is not None:  # a view lives and dies with the tensor it views
            t._arena, t._generation = view_of._arena, view_of._generation
        else:
            arena = current_arena()
            t._arena = arena
            t._generation = arena.generation if arena is not None else 0
        if backward is not None and autograd.is_grad_enabled() and any(p.requires_grad for p in parents):
            t.requires_grad = True
            # Parents' nodes, not the parents: the graph must not keep their data alive.
            t._node = autograd.Node(tuple(autograd.graph_node(p) for p in parents), backward)
        else:
            t.requires_grad = False
            t._node = None
        return t

    # -- storage -------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        """The underlying array (raises if its arena was reset or closed)."""
        arena = self._arena
        if arena is not None and arena.generation != self._generation:
            raise StaleTensorError(
                f"tensor of shape {self._data.shape} was allocated from {arena.name} which has since "
                f"been {'closed' if arena.closed else 'reset'}; its memory now belongs to other "
                f"tensors. Keep results you need with .numpy() (a copy) or .item() before the arena ends."
            )
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = np.asarray(value)
        self._arena = None
        self._generation = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    def dtype_description(self) -> str:
        """The dtype as the caller gave it, for an error: "float16 (converted to float32)" for a tensor made
        from a float16 array, else just the dtype. Tensors ops make say only their own dtype."""
        source = getattr(self, "_converted_from", None)  # not set on op outputs (_make)
        return str(self._data.dtype) if source is None else f"{source} (converted to {self._data.dtype})"

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def size(self, dim: int | None = None):
        """Shape, or one dimension of it (torch's `size`)."""
        return self._data.shape if dim is None else self._data.shape[dim]

    def numel(self) -> int:
        return self._data.size

    def __len__(self) -> int:
        return self._data.shape[0]

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def item(self) -> float:
        """The value of a one-element tensor as a Python number."""
        d = self.data
        if d.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {d.shape}")
        return d.reshape(()).item()

    def numpy(self) -> np.ndarray:
        """The values as an ndarray; a copy when the tensor lives in an arena (which recycles it)."""
        d = self.data
        return d.copy() if self._arena is not None else d

    def tolist(self):
        return self.data.tolist()

    # -- autograd ------------------------------------------------------------
    def backward(self, grad: "np.ndarray | Tensor | None" = None) -> None:
        """Accumulate gradients of this tensor into `.grad` of the leaves."""
        if isinstance(grad, Tensor):
            grad = grad.data
        autograd.backward(self, grad)

    def _accumulate_leaf_grad(self, g: np.ndarray) -> None:
        # Leaf gradients are persistent: one heap buffer per leaf, reused every step,
        # so a step arena never owns a parameter's gradient.
        if g.dtype != self._data.dtype:
            g = g.astype(self._data.dtype)
        if self.grad is None and g is self._grad_buffer:
            self.grad = g  # the op already wrote into our persistent buffer (autograd.direct_leaf_grad_buffer)
        elif self.grad is None:
            buf = self._grad_buffer
            if buf is None or buf.shape != self._data.shape or buf.dtype != self._data.dtype:
                buf = self._grad_buffer = np.empty(self._data.shape, self._data.dtype)
            host(np.copyto, buf, g)
            self.grad = buf
        else:
            host(np.add, self.grad, g, out=self.grad)

    def detach(self) -> "Tensor":
        """Same memory, no graph."""
        return Tensor._make(self.data, view_of=self)

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        if flag and self._data.dtype not in SUPPORTED_FLOATS:
            raise TypeError(f"only float32/float64 tensors can require grad, got {self._data.dtype}")
        if self._node is not None:
            raise RuntimeError("requires_grad_ only applies to leaf tensors")
        self.requires_grad = flag
        return self

    def zero_grad(self) -> None:
        """Forget the gradient (`grad = None`), as torch's set_to_none; see `_release_grad`."""
        self._release_grad()

    def _release_grad(self) -> None:
        """`grad = None`, keeping the array as the next backward's buffer only if nothing else can see it.

        The next backward writes into `_grad_buffer` (no parameter-sized allocation per step). If the user
        still holds the old gradient (`g = p.grad; opt.zero_grad(); loss.backward()`), reusing it would
        overwrite their values; torch gives them a new gradient instead, so the buffer is dropped then and
        autograd allocates another. "Holds" is CPython's reference count: anything beyond the slot (a name, a
        list, a view's base, torch.from_numpy) keeps the old values intact. A gradient that is a view into a
        larger buffer (a flat layout's or the streaming store's, compile/flat.py) stays bound: that buffer's
        owner updates from it, so such a gradient is, as on the fused route, overwritten by the next backward.
        """
        g = self.grad
        self.grad = None
        if g is not None and g is self._grad_buffer and g.base is None and sys.getrefcount(g) > _UNSHARED_REFS:
            self._grad_buffer = None

    def __repr__(self) -> str:
        try:
            body = np.array2string(self.data, precision=4, separator=", ", threshold=20)
        except StaleTensorError:
            body = "<stale: arena reset or closed>"
        extra = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}, dtype={self._data.dtype}{extra})"

    def __bool__(self) -> bool:
        return bool(self.data)

    def __float__(self) -> float:
        return float(self.item())


def tensor(data: Any, *, dtype=None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor holding a copy of `data` (float32 unless told otherwise)."""
    raw = data.data if isinstance(data, Tensor) else data
    array = np.array(raw, copy=True)
    if dtype is None and array.dtype == np.float64 and not isinstance(raw, np.ndarray):
        dtype = DEFAULT_DTYPE  # Python floats and lists of them are float32, as in torch
    return Tensor(array, dtype=dtype, requires_grad=requires_grad)


def _unshared_refcount() -> int:
    """sys.getrefcount of a gradient in `_release_grad` when only the tensor's buffer slot refers to it.

    Measured on this interpreter with the same steps rather than assumed: the count includes the local
    name and getrefcount's own argument, which differ between CPython versions (3.14 borrows references).
    """
    probe = object.__new__(Tensor)
    probe.grad = probe._grad_buffer = np.empty(1)
    g = probe.grad
    probe.grad = None
    return sys.getrefcount(g)


_UNSHARED_REFS = _unshared_refcount()

