"""Define-by-run reverse-mode autodiff.

Each op that needs a gradient records a graph node on its output tensor: the
parents' nodes and a backward closure (micrograd style: forward and backward sit
side by side in the op's file). `backward` walks that graph in reverse
topological order. Leaf tensors (parameters) are their own nodes.

The graph holds nodes, never op outputs: an intermediate tensor's memory lives
only as long as the caller holds it or a backward closure saved it (as
PyTorch's saved tensors). Were the graph to hold the tensors, every forward
intermediate (a linear's output feeding a residual add, a projection whose
q/k/v the attention copied) would stay alive until backward reached it.
Gradients of intermediates come from the current arena; gradients of leaves
(parameters) accumulate into persistent buffers that outlive every step.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import TYPE_CHECKING, Callable, TypeVar

import numpy as np

from .kernels import elementwise
from .memory.arena import StaleTensorError, empty
from .tape import host

if TYPE_CHECKING:
    from .tensor import Tensor

_state = threading.local()
_F = TypeVar("_F", bound=Callable)


def is_grad_enabled() -> bool:
    """Whether ops on this thread record the graph for backward."""
    return getattr(_state, "enabled", True)


class _GradMode:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self.prev = is_grad_enabled()
        _state.enabled = self.enabled

    def __exit__(self, *exc) -> None:
        _state.enabled = self.prev

    def __call__(self, fn: _F) -> _F:
        """As a decorator (`@no_grad()`): each call of `fn` runs in this mode."""
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
            # Their bodies run when iterated or awaited, after the call has left the mode: it would not apply.
            raise TypeError(f"{'no_grad' if not self.enabled else 'enable_grad'}() cannot decorate generator or "
                            f"coroutine function {fn.__qualname__}; use it as a `with` block inside the function")
        enabled = self.enabled

        @functools.wraps(fn)
        def run(*args, **kwargs):
            with _GradMode(enabled):  # a fresh mode per call: `prev` must not be shared by recursive calls
                return fn(*args, **kwargs)
        return run  # type: ignore[return-value]


def no_grad() -> _GradMode:
    """Context manager or decorator: ops inside record no graph (evaluation, optimizer updates)."""
    return _GradMode(False)


def enable_grad() -> _GradMode:
    """Context manager or decorator: re-enable graph recording inside a no_grad block."""
    return _GradMode(True)


class set_grad_enabled(_GradMode):  # noqa: N801 - torch's name, a class there too
    """Turn graph recording on or off (torch.set_grad_enabled): as a function it takes effect at once and stays;
    as a `with` block (or a decorator) the mode before it comes back at the end."""

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, (bool, np.bool_)):  # torch refuses set_grad_enabled(0) / (None) too
            raise TypeError(f"set_grad_enabled: mode must be a bool, got {mode!r}")
        super().__init__(bool(mode))
        self.prev = is_grad_enabled()
        _state.enabled = self.enabled  # now, for the function form: `with` has nothing left to do on entry

    def __enter__(self) -> None:
        pass

    def __call__(self, fn: _F) -> _F:
        """As a decorator the mode applies to each call only: the one set at construction is undone here."""
        _state.enabled = self.prev
        return _GradMode(self.enabled)(fn)


def inference_mode(mode: "bool | Callable" = True):
    """torch.inference_mode, which here is no_grad (there are no inference tensors): a `with` block or a
    decorator, with or without parentheses; inference_mode(False) changes nothing, as torch's."""
    if callable(mode):  # @inference_mode without parentheses
        return _GradMode(False)(mode)
    return _GradMode(False) if mode else _KeepGradMode()


class _KeepGradMode(_GradMode):
    """A mode block that keeps whatever mode is on when it is entered (inference_mode(False))."""

    def __init__(self) -> None:
        super().__init__(True)

    def __enter__(self) -> None:
        self.prev = is_grad_enabled()

    def __call__(self, fn: _F) -> _F:
        return fn


def _fill_slice(full: np.ndarray, index: tuple, values: np.ndarray) -> None:
    full.fill(0)
    full[index] = values  # basic indexing never selects an element twice


def _add_to_slice(acc: np.ndarray, index: tuple, values: np.ndarray) -> None:
    acc[index] += values


class SliceGrad:
    """A gradient that is zero except on one basic-index region of its parent.

    Basic indexing (a[:, :D], the q/k/v split of a fused projection) returns this instead of a
    zero-filled parent-sized array, so several slices of one parent accumulate into ONE buffer
    (one fill, then in-place writes) rather than one full buffer per slice plus full-size adds.
    """

    __slots__ = ("index", "values", "shape", "dtype")

    def __init__(self, index: tuple, values: np.ndarray, shape: tuple[int, ...]) -> None:
        self.index, self.values, self.shape, self.dtype = index, values, shape, values.dtype

    def dense(self) -> np.ndarray:
        full = empty(self.shape, self.dtype)
        host(_fill_slice, full, self.index, self.values)
        return full


class Node:
    """One recorded op: the nodes of its parents, its backward closure, and the versions of what it saved."""

    __slots__ = ("_parents", "_backward", "_retained", "_saved")
    requires_grad = True  # a node exists only where a gradient is needed

    def __init__(self, parents: tuple, backward, saved: tuple = ()) -> None:
        self._parents = parents
        self._backward = backward
        self._retained = None  # weakref to the output tensor after its retain_grad()
        self._saved = saved  # saved_versions(...): checked before backward runs (check_saved)


# -- saved-tensor versions ---------------------------------------------------------------------------------------
# An op's backward reads arrays it kept from forward. If one of them is written in place in between, the gradient
# would silently come from the new values; torch raises instead, and so do we. Every tensor carries a counter
# (Tensor._version_counter, one list shared by the views of its memory) that each in-place write bumps; an op
# records the counters and their values for the tensors its backward reads (Tensor._make's `saved`), and backward
# compares them before running any op: one int compare per saved tensor, on the eager route only (a fused
# step's replay runs no autograd). Writes straight into a NumPy array bypass the counter and are not seen.

def saved_versions(saved, output=None) -> tuple:
    """What a Node records of the tensors its backward reads: (counter, version now, shape, dtype, is_output,
    arena, its generation now)."""
    # Shape and dtype only (for the error), never the array: the closure decides what memory stays alive.
    # The arena and generation: an output made under heap_scope() outlives the arena its inputs came from, and
    # backward after that arena ended read memory that other tensors had taken (a wrong gradient, no error).
    record = [(t._version_counter, t._version_counter[0], t._data.shape, t._data.dtype, False, t._arena,
               t._generation) for t in saved if t is not None]
    if output is not None:
        record.append((output._version_counter, output._version_counter[0], output._data.shape,
                       output._data.dtype, True, output._arena, output._generation))
    return tuple(record)


def increment_version(*tensors: "Tensor") -> None:
    """Count an in-place write to each tensor's memory (torch.autograd.graph.increment_version).

    For code that writes a tensor's array directly (an optimizer step, an init function, load_state_dict):
    afterwards, backward through an op that saved the tensor raises instead of reading the new values.
    """
    for t in tensors:
        counter = getattr(t, "_version_counter", None)
        if counter is None:
            raise TypeError(f"increment_version takes Tensors, got {type(t).__name__}; a raw array has no version "
                            f"counter (wrap it in a Tensor before recording ops on it)")
        counter[0] += 1


def check_saved(node: Node) -> None:
    """Raise if a tensor `node`'s backward reads was written in place after the op ran (torch's message), or
    lived in an arena that was reset or closed since (StaleTensorError)."""
    for counter, version, shape, dtype, is_output, arena, generation in node._saved:
        if arena is not None and arena.generation != generation:
            role = "its output" if is_output else "one of its inputs"
            raise StaleTensorError(
                f"backward of {_op_name(node._backward)} reads a {dtype} tensor of shape {tuple(shape)}, {role}, "
                f"that was allocated from {arena.name}, which has since been "
                f"{'closed' if arena.closed else 'reset'}: its memory now belongs to other tensors, and the "
                f"gradient would come from their values. Call backward() before the arena ends, or compute the "
                f"graph outside it.")
        if counter[0] != version:
            op = _op_name(node._backward)
            role = "its output" if is_output else "one of its inputs"
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: a {dtype} tensor of shape {tuple(shape)}, {role}, saved by {op} for its backward, "
                f"is at version {counter[0]}; expected version {version} instead. Backward would read the new "
                f"values and give wrong gradients. Write to a copy (`x.clone()`, or `x = x + y` instead of "
                f"`x += y`), or make the write after backward (an optimizer step after loss.backward()).")


def _op_name(backward) -> str:
    """The op that made a backward closure, from its qualified name ("mul.<locals>.backward" -> "mul")."""
    name = getattr(backward, "__qualname__", "") or type(backward).__name__
    return f"'{name.split('.')[0].lstrip('_') or name}'"


def graph_node(t: "Tensor"):
    """The node standing for `t` in the graph: its op's Node, or the tensor itself for a leaf; NOT_TRACKED for one
    that did not require grad when the op ran."""
    if not t.requires_grad:
        return NOT_TRACKED
    return t._node if t._node is not None else t


class _NotTracked:
    """A parent that did not require grad when its op ran. Read later, its requires_grad_(True) gave it a gradient
    from a graph recorded without it (torch gives None); the graph keeps this stand-in instead, so no gradient goes
    there and the graph holds no reference to the tensor."""

    __slots__ = ()
    requires_grad = False


NOT_TRACKED = _NotTracked()


def _freed_backward(_grad):
    raise RuntimeError(
        "trying to backward through the graph a second time: its saved tensors were "
        "freed after the first backward. Run the forward pass again."
    )


def _topological_order(root) -> tuple[list, dict[int, int]]:
    """Nodes in topological order, and how many graph edges lead into each node."""
    # Iterative DFS: deep graphs (long sequences, many blocks) must not hit the recursion limit.
    order: list = []
    visited: set[int] = set()
    uses: dict[int, int] = {}
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in node._parents:
            if parent.requires_grad:
                uses[id(parent)] = uses.get(id(parent), 0) + 1
                if id(parent) not in visited:
                    stack.append((parent, False))
    return order, uses


def direct_leaf_grad_buffer(parent: "Tensor", shape: tuple[int, ...], dtype) -> np.ndarray | None:
    """The persistent gradient buffer of `parent` if a backward op may write its gradient there.

    Allowed only for a leaf that receives exactly one gradient in this backward pass and has
    no `.grad` yet: then writing in place is the same as copying the one result over, minus
    the copy (a parameter-sized memcpy per parameter per step).
    """
    direct = getattr(_state, "direct", None)
    if not direct or id(parent) not in direct:
        return None
    data = parent._data
    if shape != data.shape or np.dtype(dtype) != data.dtype:
        return None
    buf = parent._grad_buffer
    if buf is None or buf.shape != data.shape or buf.dtype != data.dtype:
        buf = parent._grad_buffer = np.empty(data.shape, data.dtype)  # persistent: heap, not arena
    return buf


def backward(root: "Tensor", grad: np.ndarray | None = None, *, on_leaf_grad=None,
             retain_graph: bool = False, seed: np.ndarray | None = None) -> None:
    """Accumulate d(root)/d(leaf) into `.grad` of every leaf that requires grad.

    on_leaf_grad(leaf, g), if given, receives each leaf's complete gradient instead of `.grad`
    (the fused route updates the parameter right there, so no gradient outlives its update);
    it returns False to have `g` accumulated into `.grad` as usual. A leaf's turn comes after
    every op that read it has run its backward, so updating it in place then is safe. Gradients
    are then never written straight into persistent buffers: they are transient arena memory.

    retain_graph=True keeps every node's saved arrays and edges for another backward (which then
    accumulates, as in torch); by default each node is freed once its backward has run.

    seed: a persistent 0-d array whose value seeds a scalar root's gradient instead of 1 (read when the seed
    buffer is filled, so a captured step reads it again at each replay): the fused route's micro-batches seed
    with their weight, as the eager route does.
    """
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad (it has no graph)")
    # Always through .data (the arena generation check), also with an explicit grad: if the root's
    # arena was reset or closed, the arrays its graph saved now belong to other tensors.
    data = root.data
    if grad is not None and not isinstance(grad, np.ndarray):
        grad = _grad_array(grad)
    if grad is None:
        if data.size != 1:
            raise RuntimeError(
                f"backward() without a gradient needs a scalar output, got shape {root.shape}; "
                f"pass grad= of that shape or reduce (e.g. .sum()) first"
            )
        grad = empty(root.shape, root.dtype)  # from the step's arena: a captured step (tape.host) refills it
        host(np.copyto, grad, 1 if seed is None else seed)
    elif grad.shape != root.shape:
        raise ValueError(f"grad shape {grad.shape} does not match output shape {root.shape}")
    elif grad.dtype != root.dtype:
        # As torch: the gradient is taken in the output's dtype. Passed on as it was, a float32 gradient of a
        # float64 graph failed in the first matrix product's backward (gemm refuses mixed dtypes) and elsewhere
        # ran the graph's backward in float32.
        cast = empty(root.shape, root.dtype)
        host(np.copyto, cast, grad, casting="unsafe")
        grad = cast

    start = graph_node(root)
    if isinstance(start, Node) and start._backward is _freed_backward:
        _freed_backward(grad)
    order, uses = _topological_order(start)
    for node in order:  # before any op runs: a refused backward leaves no gradient half accumulated
        if node._saved:
            check_saved(node)
    _state.direct = set() if on_leaf_grad is not None else {
        id(n) for n in order if not isinstance(n, Node) and n._grad is None and uses.get(id(n)) == 1}
    try:
        # A gradient that underflows into the subnormal range (or to 0) is a result, as in torch, not an error a
        # process-wide np.seterr(all="raise") would make of it: MiniLM's SimCSE gradients reach it in
        # l2_normalize's backward (tests/test_text_models_hunt.py). Overflow and invalid values still follow seterr.
        with np.errstate(under="ignore"):
            _run_backward(order, start, grad, uses, on_leaf_grad, retain_graph)
    finally:
        _state.direct = None


def _grad_array(grad) -> np.ndarray:
    """backward's `grad` given as a NumPy scalar or a Tensor, as an ndarray; anything else is refused (as torch)."""
    from .tensor import Tensor  # here: tensor.py imports this module

    if isinstance(grad, np.generic):
        return np.asarray(grad)
    if isinstance(grad, Tensor):
        return grad.data
    raise TypeError(f"backward's grad must be an ndarray or Tensor of the output's shape (or None for a one-element "
                    f"output), got {type(grad).__name__}; wrap it with np.asarray(..., dtype=...)")


def _run_backward(order: list, root, grad: np.ndarray, uses: dict[int, int], on_leaf_grad=None,
                  retain_graph: bool = False) -> None:
    grads: dict[int, np.ndarray] = {id(root): grad}
    owned: set[int] = set()  # grads we allocated ourselves, safe to add into in place
    pending = dict(uses)  # edges into each node whose op has not run its backward yet
    for node in reversed(order):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if not isinstance(node, Node):
            _deliver_leaf(node, g, on_leaf_grad)
            continue
        if node._backward is _freed_backward:  # an op whose saved tensors an earlier backward freed
            _freed_backward(g)
        if node._retained is not None:
            _deliver_retained(node, g)
        parent_grads = node._backward(g)
        if not retain_graph:
            node._backward = _freed_backward
            node._saved = ()
        for parent, pg in zip(node._parents, parent_grads):
            if not parent.requires_grad:
                continue
            key = id(parent)
            if pg is not None:
                _add_grad(grads, owned, key, pg)
            pending[key] -= 1
            # A leaf whose every use has run is complete now: deliver it at once rather than at its
            # place in the order (a depth-first order puts a block's weights after every earlier
            # block), so a gradient the caller consumes (update_in_backward) dies straight away.
            if not pending[key] and not isinstance(parent, Node) and key in grads:
                _deliver_leaf(parent, grads.pop(key), on_leaf_grad)
        if not retain_graph:
            node._parents = ()


def _deliver_leaf(leaf: "Tensor", g: np.ndarray, on_leaf_grad) -> None:
    if on_leaf_grad is None or on_leaf_grad(leaf, g) is False:
        leaf._accumulate_leaf_grad(g)


def _deliver_retained(node: Node, g: np.ndarray) -> None:
    t = node._retained()
    if t is not None:
        t._accumulate_retained_grad(g)


def _add_grad(grads: dict[int, np.ndarray], owned: set[int], key: int, pg) -> None:
    """Add one incoming gradient `pg` (an array or a SliceGrad) into grads[key]."""
    prev = grads.get(key)
    if isinstance(pg, SliceGrad):
        if prev is None:
            grads[key] = pg.dense()
            owned.add(key)
            return
        if key not in owned:  # never add into an array some op may still alias
            acc = empty(prev.shape, prev.dtype)
            host(np.copyto, acc, prev)
            grads[key] = prev = acc
            owned.add(key)
        host(_add_to_slice, prev, pg.index, pg.values)
    elif prev is None:
        grads[key] = pg
    elif key in owned:
        elementwise.add(prev, pg, prev)
    else:
        acc = empty(prev.shape, prev.dtype)
        elementwise.add(prev, pg, acc)
        grads[key] = acc
        owned.add(key)
