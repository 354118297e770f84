"""Tensor: an ndarray view plus what autograd needs, with operator sugar.

Memory comes from the arena that was current when the op ran (or the heap);
the tensor remembers that arena's generation and refuses to be read once the
arena is reset or closed.

Each tensor also carries a version counter (`_version`, as torch's), shared by every view of the same memory:
the in-place writes the engine makes (`+=` etc., `autograd.increment_version`) bump it, and backward refuses
an op whose saved tensors were written since the op ran (autograd.check_saved). A write straight into the
NumPy array (`t.data[...] = v`, `t.numpy()[...] = v`) bypasses the counter and cannot be seen.
"""

from __future__ import annotations

import operator
import sys
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .device import check_cpu
from . import autograd
from .tape import host, note_host_read
from .memory.arena import StaleTensorError, arena_holding, current_arena

DEFAULT_DTYPE = np.float32
SUPPORTED_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

BackwardFn = Callable[[np.ndarray], Sequence["np.ndarray | None"]]


class Tensor:
    """An n-dimensional array that can record the ops that produced it."""

    __slots__ = ("_data", "requires_grad", "_grad", "_grad_buffer", "_node", "_arena", "_generation",
                 "_converted_from", "_version_counter", "__weakref__")
    _parents: tuple = ()  # in the graph a tensor is always a leaf node (autograd.graph_node)
    _saved: tuple = ()  # ... which saved nothing for a backward (autograd.check_saved)
    __array_priority__ = 1000  # make `ndarray + Tensor` defer to Tensor.__radd__
    # == is elementwise (ops/_sugar.py), as torch's; hashing stays identity, as torch's, so a tensor keys a dict
    # or a set by the object it is (dict and set lookups try `is` before ==). Lists are another matter:
    # `p in params` / `params.index(p)` ask == of every other tensor they meet: the engine compares ids instead.
    __hash__ = object.__hash__

    def __init__(self, data: Any, *, dtype=None, requires_grad: bool = False) -> None:
        source = data.data if isinstance(data, Tensor) else data  # .data: a stale tensor raises here
        hint = ("Pass arrays of numbers (e.g. an Encoding's .input_ids); Trainer(route='eager') hands a batch "
                "that is not array-like to the model as it is")
        try:
            array = np.asarray(source)
        except ValueError as exc:
            # A sequence whose items are sequences of themselves (an Encoding indexes to a batch of one)
            # nests without end, and NumPy gives up at 64 dimensions with a message naming nothing.
            if isinstance(source, (np.ndarray, list, tuple)):
                raise
            raise TypeError(f"cannot make a Tensor of {type(source).__name__}: NumPy could not make an array of "
                            f"numbers of it ({exc}). {hint}") from exc
        if array.dtype == object:  # NumPy's last resort for what is no array of numbers (a tokenizer's Encoding)
            raise TypeError(f"cannot make a Tensor of {type(source).__name__}: NumPy made a {array.shape} object "
                            f"array of it. {hint}")
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
        if isinstance(data, (int, float, list, tuple)) and not isinstance(data, np.generic) \
                and array.dtype == np.float64 and dtype is None:
            # Python floats default to float32, as in torch; a NumPy float64 scalar (a float subclass) keeps its
            # dtype, as torch.tensor(np.float64(0.1)) does
            array = array.astype(DEFAULT_DTYPE)
        if requires_grad:  # after every cast: an explicit dtype=np.int64 must be refused too
            _check_can_require_grad(array.dtype)
        self._data = array
        self.requires_grad = requires_grad
        self._grad: np.ndarray | None = None
        self._grad_buffer: np.ndarray | None = None
        self._node: autograd.Node | None = None  # the op that made it; None for a leaf
        # Wrapping another tensor's memory (Tensor(y) shares y's array) keeps y's arena: once that arena is
        # reset or closed the memory belongs to other tensors, and reading it must raise, as y would.
        shared = isinstance(data, Tensor) and np.may_share_memory(array, source)
        self._arena = data._arena if shared else None
        self._generation = data._generation if shared else 0
        # [version]: a list so that views of the same memory share one counter (a write through any bumps it).
        self._version_counter = data._version_counter if shared else [0]

    @classmethod
    def _make(cls, data: np.ndarray, parents: Sequence["Tensor"] = (), backward: BackwardFn | None = None,
              *, view_of: "Tensor | None" = None, saved: Sequence["Tensor | None"] = (),
              saved_output: bool = False) -> "Tensor":
        """Wrap an op's output; record the graph when any parent needs grad.

        saved: the tensors whose values `backward` reads (None entries are skipped), and saved_output whether it
        reads the output's: their versions now are what backward checks before it runs (autograd.check_saved).
        """
        t = object.__new__(Tensor)
        t._data = data
        t._grad = None
        t._grad_buffer = None
        if view_of is not None:  # a view lives and dies with the tensor it views, and shares its writes' count
            t._arena, t._generation = view_of._arena, view_of._generation
            t._version_counter = view_of._version_counter
        else:
            arena = current_arena()
            t._arena = arena
            t._generation = arena.generation if arena is not None else 0
            t._version_counter = [0]
        if backward is not None and autograd.is_grad_enabled() and any(p.requires_grad for p in parents):
            t.requires_grad = True
            # Parents' nodes, not the parents: the graph must not keep their data alive.
            t._node = autograd.Node(tuple(autograd.graph_node(p) for p in parents), backward,
                                    autograd.saved_versions(saved, t if saved_output else None)
                                    if saved or saved_output else ())
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
    def data(self, value: "np.ndarray | Tensor") -> None:
        """Replace the array (no copy); a Tensor's is shared as in torch, and stays tied to its arena's lifetime."""
        if isinstance(value, Tensor):
            array, arena, generation = value.data, value._arena, value._generation  # .data: a stale one raises
        else:
            # An array an open arena holds (`t.data = (t * 2).data` inside a step) is that arena's memory: without
            # its arena recorded, reading it after the arena closed gave whatever the next step wrote there, with
            # no StaleTensorError.
            array = np.asarray(value)
            arena = arena_holding(array)
            generation = arena.generation if arena is not None else 0
        if array.dtype == object or array.dtype.kind == "c":
            raise TypeError(f"cannot set .data to an array of dtype {array.dtype} ({type(value).__name__}); pass a "
                            f"real-valued ndarray or Tensor")
        if self.requires_grad and array.dtype.kind != "f":
            raise TypeError(f"data set to a tensor that requires gradients must be floating point, got dtype "
                            f"{array.dtype}; cast it (e.g. .astype(np.float32)) or requires_grad_(False) first")
        # The version counter stays, as with torch's `x.data = y`: replacing the array is no write (ops that saved
        # the old one go on reading it), and a later in-place write still counts for every op that saved x.
        self._data = array
        self._arena = arena
        self._generation = generation

    @property
    def _version(self) -> int:
        """How many in-place writes this tensor's memory has had (torch's `t._version`), views' included."""
        return self._version_counter[0]

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
        if self._data.ndim == 0:  # torch's TypeError; shape[0] would raise "tuple index out of range"
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        """The sub-tensors along dim 0, as torch. Without this Python would iterate through __getitem__ until an
        IndexError, and a 0-d tensor would silently iterate as empty."""
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def item(self) -> float:
        """The value of a one-element tensor as a Python number."""
        d = self.data
        if d.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {d.shape}")
        note_host_read(f"item() of a {d.shape} tensor")
        return d.reshape(()).item()

    def numpy(self) -> np.ndarray:
        """The values as an ndarray; a copy when the tensor lives in an arena (which recycles it)."""
        d = self.data
        note_host_read(f"numpy() of a {d.shape} tensor")
        return d.copy() if self._arena is not None else d

    def tolist(self):
        note_host_read(f"tolist() of a {self._data.shape} tensor")
        return self.data.tolist()

    # -- autograd ------------------------------------------------------------
    def backward(self, grad: "np.ndarray | Tensor | None" = None, *, retain_graph: bool = False) -> None:
        """Accumulate gradients of this tensor into `.grad` of the leaves.

        retain_graph=True keeps the graph (and the arrays its ops saved) for another backward, as in torch;
        by default the graph is freed as backward walks it, so a step's activations die with it.
        """
        if isinstance(grad, Tensor):
            grad = grad.data
        autograd.backward(self, grad, retain_graph=retain_graph)

    # .grad is read in hot loops (optimizers, clipping): a C getter (attrgetter) keeps the read at ~30 ns over
    # a plain slot; the setter is where the rules live (`_set_grad`).
    def _set_grad(self, value: "np.ndarray | None") -> None:
        """`t.grad = value`: an array of t's shape and dtype, or None.

        Replacing a gradient (by None or another array) lets go of it as torch does: if anything else still
        holds the old array (`kept = x.grad; x.grad = None`), the next backward must not write into it, so it
        stops being the reusable buffer (see `_release_grad`).
        """
        old = self._grad
        if value is old:
            return
        if value is not None and value is not self._grad_buffer:
            self._check_grad(value)
            if arena_holding(value) is not None:
                # A gradient outlives the step (backward accumulates into it, the optimizer reads it): an open arena's
                # array (`p.grad = (g * 0.5).data`) was kept as it was, and once the arena closed the next backward
                # added into memory that was by then another step's activations, silently.
                value = value.copy()
        self._grad = value
        # The refcount is read here, in this frame, with the same references `_calibrate_unshared_refs`
        # counts: the buffer slot, the local `old`, and `_refcount`'s argument.
        if old is not None and old is self._grad_buffer and old.base is None and _refcount(old) > _UNSHARED_REFS:
            self._grad_buffer = None

    grad = property(operator.attrgetter("_grad"), _set_grad, doc="The accumulated gradient (an ndarray) or None.")

    def _check_grad(self, value: Any) -> None:
        """Refuse at assignment what no backward or optimizer could use, naming both sides (as torch does).

        A gradient of another float dtype is taken (optimizers cast it on the fly; backward accumulates into it);
        a non-float or read-only one is refused here, where the next backward would fail on it.
        """
        if not isinstance(value, np.ndarray):
            raise TypeError(f"assigned grad must be an ndarray or None, got {type(value).__name__}"
                            + ("; use t.numpy()" if isinstance(value, Tensor) else ""))
        if value.shape != self._data.shape:
            raise ValueError(f"assigned grad has shape {value.shape}, but the tensor has shape {self._data.shape}")
        if value.dtype.kind != "f":  # as torch; the next backward accumulating into it failed with NumPy's casting error
            raise TypeError(f"assigned grad has dtype {value.dtype}, but a gradient is floating point (the tensor's "
                            f"is {self._data.dtype}): assign e.g. grad.astype({str(self._data.dtype)!r})")
        if not value.flags.writeable:  # backward accumulates into .grad in place
            raise ValueError("assigned grad is read-only (a broadcast view or a frozen array), and backward adds "
                             "into .grad in place: assign a writable array (np.array(grad))")

    def _accumulate_leaf_grad(self, g: np.ndarray) -> None:
        # Leaf gradients are persistent: one heap buffer per leaf, reused every step,
        # so a step arena never owns a parameter's gradient.
        if g.dtype != self._data.dtype:
            g = g.astype(self._data.dtype)
        grad = self._grad
        if grad is None and g is self._grad_buffer:
            self._grad = g  # the op already wrote into our persistent buffer (autograd.direct_leaf_grad_buffer)
        elif grad is None:
            buf = self._grad_buffer
            if buf is None or buf.shape != self._data.shape or buf.dtype != self._data.dtype:
                buf = self._grad_buffer = np.empty(self._data.shape, self._data.dtype)
            host(np.copyto, buf, g)
            self._grad = buf
        else:
            host(np.add, grad, g, out=grad)

    def _accumulate_retained_grad(self, g: np.ndarray) -> None:
        # g is transient (arena memory autograd may still add into): a retained gradient is a heap copy.
        if self._grad is None:
            self._grad = np.array(g, dtype=self._data.dtype, copy=True)
        else:
            np.add(self._grad, g, out=self._grad, casting="same_kind")

    def retain_grad(self) -> None:
        """Have backward also store this non-leaf tensor's gradient in `.grad` (a leaf always does)."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on a tensor that does not require grad")
        if self._node is not None:
            self._node._retained = weakref.ref(self)  # weak: the graph must not keep the tensor's memory alive

    def detach(self) -> "Tensor":
        """Same memory, no graph."""
        return Tensor._make(self.data, view_of=self)

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        """Set requires_grad on a leaf; on a non-leaf (which always requires grad) only True is allowed."""
        if self._node is not None:
            if flag:
                return self  # already requires grad, as in torch
            raise RuntimeError("requires_grad_(False) only applies to leaf tensors; use t.detach() for a "
                               "tensor that is cut from the graph")
        if flag:
            _check_can_require_grad(self._data.dtype)
        self.requires_grad = flag
        return self

    def zero_grad(self) -> None:
        """Forget the gradient (`grad = None`), as torch's set_to_none; see `_release_grad`."""
        self.grad = None

    def _release_grad(self) -> None:
        """`grad = None`, keeping the array as the next backward's buffer only if nothing else can see it.

        The next backward writes into `_grad_buffer` (no parameter-sized allocation per step). If the user
        still holds the old gradient (`g = p.grad; opt.zero_grad(); loss.backward()`), reusing it would
        overwrite their values; torch gives them a new gradient instead, so the buffer is dropped then and
        autograd allocates another. "Holds" is CPython's reference count: anything beyond the slot (a name, a
        list, a view's base, torch.from_numpy) keeps the old values intact. A gradient that is a view into a
        larger buffer (a flat layout's or the streaming store's, compile/flat.py) stays bound: that buffer's
        owner updates from it, so such a gradient is, as on the fused route, overwritten by the next backward.
        The rule lives in the `grad` setter, so `t.grad = None` by hand follows it too.
        """
        self.grad = None

    def __repr__(self) -> str:
        try:
            body = np.array2string(self.data, precision=4, separator=", ", threshold=20)
        except StaleTensorError:
            body = "<stale: arena reset or closed>"
        extra = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}, dtype={self._data.dtype}{extra})"

    def __bool__(self) -> bool:
        """The truth of a one-element tensor; more or fewer elements raise, as in torch."""
        d = self.data
        if d.size != 1:
            what = "no values" if d.size == 0 else "more than one value"
            raise RuntimeError(f"Boolean value of Tensor with {what} is ambiguous (shape {d.shape}): reduce it "
                               f"first, e.g. `(a == b).all()` or `t.any()`, or compare whole tensors with "
                               f"`ta.equal(a, b)`")
        note_host_read(f"bool() of a {d.shape} tensor")
        return bool(d.reshape(()))

    def __float__(self) -> float:
        return float(self.item())

    def __format__(self, spec: str) -> str:
        """f"{t:.3f}" of a 0-d tensor formats its value, as torch's (a loss or a gradient norm in a log line);
        any other tensor formats as its repr, and refuses a format spec as object() does."""
        if self._data.ndim == 0:
            return format(self.item(), spec)
        return super().__format__(spec)

    def __int__(self) -> int:
        """int() of a one-element tensor, truncated toward zero (as int() of its float)."""
        return int(self.item())

    def __index__(self) -> int:
        """A one-element integer (or bool) tensor as an index, as torch's: `x[:, :lengths.max()]`, `range(n)`,
        `names[t]`. A float tensor is refused with torch's words (its int() would truncate silently)."""
        d = self._data
        if d.size != 1 or d.dtype.kind not in "biu":
            raise TypeError(f"only integer tensors of a single element can be converted to an index; this one is "
                            f"{d.dtype} with shape {d.shape}")
        return int(self.item())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """np.asarray(t), np.concatenate([t, ...]), a metric library's input: the values (a copy when the tensor
        lives in an arena, as numpy()), as torch's CPU tensors convert. Without it NumPy built object arrays of
        0-d tensors. A tensor that requires grad is refused, as torch's: a NumPy function of it would leave the
        graph without a word."""
        if self.requires_grad:
            raise RuntimeError("Can't convert a tensor that requires grad to a NumPy array (np.asarray, a NumPy "
                               "function); use tensor.detach().numpy() for its values")
        values = self.numpy()
        needs_copy = values is not self._data or (dtype is not None and np.dtype(dtype) != values.dtype)
        if copy is False and needs_copy:  # NumPy 2's "never copy"
            raise ValueError(f"a copy is needed to convert this tensor to a NumPy array (it lives in an arena or "
                             f"dtype={dtype} differs from {values.dtype}); call np.asarray without copy=False")
        if dtype is not None:
            values = values.astype(dtype, copy=False)
        return values.copy() if copy and values is self._data else values


def tensor(data: Any, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor holding a copy of `data` (float32 unless told otherwise)."""
    check_cpu(device, "tensor")
    raw = data.data if isinstance(data, Tensor) else data
    array = np.array(raw, copy=True)
    if dtype is None and array.dtype == np.float64 and not isinstance(raw, (np.ndarray, np.generic)):
        dtype = DEFAULT_DTYPE  # Python floats and lists of them are float32, as in torch
    return Tensor(array, dtype=dtype, requires_grad=requires_grad)


def _check_can_require_grad(dtype: np.dtype) -> None:
    if dtype.kind != "f":
        raise TypeError(f"only floating-point tensors can require grad, got dtype {dtype}")


def _refcount(g: np.ndarray) -> int:
    return sys.getrefcount(g)


def _calibrate_unshared_refs() -> int:
    """`_refcount` of a replaced gradient in `Tensor._set_grad` when only the tensor's buffer slot refers to it.

    Measured on this interpreter with the same references rather than assumed (the buffer slot, a local name,
    `_refcount`'s argument): getrefcount's own count differs between CPython versions (3.14 borrows references).
    """
    probe = object.__new__(Tensor)
    probe._grad_buffer = np.empty(1)
    old = probe._grad_buffer
    return _refcount(old)


_UNSHARED_REFS = _calibrate_unshared_refs()
