"""Selection: indexing (basic, slices, integer arrays), where, embedding lookup."""

from __future__ import annotations

import numpy as np

from ..autograd import SliceGrad
from ..kernels import kernel
from ..compile.trace import unsupported
from ..tape import host
from ..tensor import Tensor
from ._base import (_constant, as_tensor, check_number_fits, contiguous, is_int, new, reshaped, result_dtype,
                    unbroadcast, weak_operand)
from .cast import to_dtype
from .select import nonzero


def _normalize_index(index) -> tuple:
    """The index as a tuple NumPy understands: Tensors become arrays, lists become arrays."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for item in items:
        if isinstance(item, Tensor):
            item = item.data
        elif isinstance(item, list):
            # An empty list means "no rows", which NumPy would read as a float array.
            item = np.asarray(item) if item else np.empty(0, np.intp)
        out.append(item)
    return tuple(out)


def _is_advanced(idx: tuple) -> bool:
    return any(isinstance(x, (np.ndarray, bool, np.bool_)) for x in idx)


def torch_order(idx: tuple) -> tuple[tuple, tuple] | None:
    """(basic, rest) for an index that mixes integers with index arrays, else None.

    torch applies an integer as a selection of its dim before any index array, so x[1, 1:3, [0, 0, 4]] of a
    (3, 4, 5) tensor is (2, 3); NumPy counts the integer as one more index array, and index arrays separated by a
    slice put their dims first: (3, 2). Indexing with `basic` (the integers, slices, None and Ellipsis; each array
    a full slice of the dims it indexes) and then the view with `rest` (the arrays where those dims now are) gives
    torch's shape, and NumPy's wherever the two agree (no slice between an integer and an array)."""
    if not _is_advanced(idx) or not any(is_int(x) for x in idx) or any(isinstance(x, (bool, np.bool_)) for x in idx):
        return None  # (a bool scalar index, a new dim NumPy's way, keeps NumPy's order)
    basic, rest = [], []
    for x in idx:
        if isinstance(x, np.ndarray):
            basic += [slice(None)] * (x.ndim if x.dtype == np.bool_ else 1)
            rest.append(x)
        elif is_int(x):
            basic.append(x)
        else:
            basic.append(x)
            rest.append(Ellipsis if x is Ellipsis else slice(None))  # a None's new dim is in the view already
    return tuple(basic), tuple(rest)


def _is_full(x) -> bool:
    return isinstance(x, slice) and x == slice(None)


def _take_axis(idx: tuple, ndim: int) -> tuple[int, np.ndarray] | None:
    """(axis, ids) when the index is one integer array among full slices (np.take's case), else None."""
    arrays = [i for i, x in enumerate(idx) if isinstance(x, np.ndarray)]
    if len(arrays) != 1 or any(isinstance(x, (bool, np.bool_)) for x in idx):
        return None
    if sum(x is not Ellipsis for x in idx) > ndim:
        return None  # too many indices: let NumPy raise its own error
    k = arrays[0]
    if idx[k].dtype.kind not in "iu" or idx[k].ndim == 0:
        return None
    before, after = idx[:k], idx[k + 1 :]
    if all(_is_full(x) for x in before) and all(_is_full(x) or x is Ellipsis for x in after):
        return k, idx[k]
    if before == (Ellipsis,) and not after:
        return ndim - 1, idx[k]
    return None


def _rest_as_given(index) -> tuple:
    """torch_order's `rest` made of the caller's own items (Tensors kept: getitem refuses a later in-place write
    to an index tensor that backward reads)."""
    out = []
    for item in index if isinstance(index, tuple) else (index,):
        if is_int(item):
            continue
        if item is None or isinstance(item, slice):
            out.append(slice(None))
        else:
            out.append(item)
    return tuple(out)


def getitem(a: Tensor, index) -> Tensor:
    """a[index]: ints, slices, None, Ellipsis, integer/bool arrays or Tensors (NumPy's rules, but an integer
    selects its dim before any index array is applied, as torch's: torch_order).

    Basic indexing returns a view of `a`; advanced indexing copies into the current arena.
    """
    idx = _normalize_index(index)
    split = torch_order(idx)
    if split is not None:
        basic, _ = split
        return getitem(getitem(a, basic), _rest_as_given(index))
    ad = a.data

    if not _is_advanced(idx):
        # A trailing Ellipsis makes NumPy return a 0-d view instead of a scalar copy for a[i, j].
        view_idx = idx if any(x is Ellipsis for x in idx) else idx + (Ellipsis,)
        view = ad[view_idx]
        a_shape = ad.shape  # backward keeps shapes, never `a`'s memory

        def backward_basic(g):
            # Zero except on the view: the engine scatters it into one buffer shared by every
            # slice of `a` (q, k and v of a fused qkv projection) instead of one full array each.
            return (SliceGrad(view_idx, g, a_shape),)

        return Tensor._make(view, (a,), backward_basic, view_of=a)

    take = _take_axis(idx, ad.ndim) if ad.ndim else None
    if take is not None:
        axis, ids = take
        out = new(ad.shape[:axis] + ids.shape + ad.shape[axis + 1 :], ad.dtype)
        host(_take, ad, ids, axis, out)
    else:
        if any(isinstance(x, np.ndarray) and x.dtype == np.bool_ for x in idx):
            unsupported("getitem with a boolean mask",
                        "its output shape depends on how many elements the mask selects in each batch")
        # The output's shape (and NumPy's IndexError for a bad index) from a stand-in with no bytes:
        # indexing `ad` itself here would copy its values onto the heap, outside the host call.
        shape = np.broadcast_to(_STAND_IN, ad.shape)[idx].shape
        out = new(shape, ad.dtype)
        host(_gather, ad, idx, out)
    a_shape = ad.shape
    del ad

    def backward_advanced(g):
        ga = new(a_shape, g.dtype)
        host(_scatter_add, ga, idx, g)
        return (ga,)

    # Backward scatters through the index arrays: index tensors written in place afterwards are refused.
    index_tensors = [x for x in (index if isinstance(index, tuple) else (index,)) if isinstance(x, Tensor)]
    return Tensor._make(out, (a,), backward_advanced, saved=index_tensors)


_NOTHING = object()  # where's "not given": None is a value where could be asked to choose

def where(condition, a=_NOTHING, b=_NOTHING) -> Tensor:
    """Elementwise `a if condition else b`, broadcasting all three; a, b tensors or scalars. where(condition) alone
    is torch's nonzero(condition, as_tuple=True) (eager only, as nonzero)."""
    if a is _NOTHING and b is _NOTHING:
        return nonzero(as_tensor(condition), as_tuple=True)
    if a is _NOTHING or b is _NOTHING:
        raise TypeError("where takes a condition alone (the indices where it holds) or a condition, input and other")
    cond = condition.data if isinstance(condition, Tensor) else np.asarray(condition)
    if cond.dtype != np.bool_:
        raise TypeError(f"where: condition must be a bool array or Tensor, got dtype {cond.dtype}")
    a_is_tensor, b_is_tensor = isinstance(a, Tensor), isinstance(b, Tensor)
    if a_is_tensor:
        check_number_fits(b, a.dtype, "where (other)")
        b = as_tensor(b, like=a)
    elif b_is_tensor:
        check_number_fits(a, b.dtype, "where (input)")
        a = as_tensor(a, like=b)
    else:  # two numbers: each in torch's default dtype for its kind (a Python float is float32, not float64)
        a, b = _number(a), _number(b)
    ad, bd = a.data, b.data
    try:
        shape = np.broadcast_shapes(cond.shape, ad.shape, bd.shape)
    except ValueError:
        raise ValueError(f"where: shapes do not broadcast: condition {cond.shape}, a {ad.shape}, "
                         f"b {bd.shape}") from None
    # torch's promotion (result_dtype), not NumPy's: an int64 and a float32 give float32, and a 0-d float64
    # tensor does not widen a float32 one
    dtype = result_dtype(a, b)
    # A 0-d tensor the other's dtype won over goes in that dtype (int64 () with uint8 failed NumPy's same_kind cast)
    a, b = weak_operand(a, dtype), weak_operand(b, dtype)
    ad, bd = a.data, b.data
    out = new(shape, dtype)
    host(_where_forward, cond, _operand(ad, a_is_tensor), _operand(bd, b_is_tensor), out)
    # Shapes and dtypes of the inputs needing grad: backward reads neither input's values.
    a_meta = (ad.shape, ad.dtype) if a.requires_grad else None
    b_meta = (bd.shape, bd.dtype) if b.requires_grad else None
    del ad, bd

    def backward(g):
        ga = gb = None
        if a_meta is not None:
            full = new(g.shape, g.dtype)
            host(_where_grad, g, cond, full, taken=True)
            ga = unbroadcast(full, *a_meta)  # summed and cast in one pass
        if b_meta is not None:
            full = new(g.shape, g.dtype)
            host(_where_grad, g, cond, full, taken=False)
            gb = unbroadcast(full, *b_meta)  # summed and cast in one pass
        return ga, gb

    # Backward reads the condition only (a plain array condition has no counter to check).
    return Tensor._make(out, (a, b), backward, saved=(condition if isinstance(condition, Tensor) else None,))


def masked_fill(a: Tensor, mask, value) -> Tensor:
    """torch's masked_fill: `a` with `value` (a number or a 0-d tensor, cast to a's dtype) where the bool `mask`
    (broadcast to a's shape) is True. a's gradient flows where mask is False, a tensor value's where it is True."""
    md = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    ad = a.data
    if md.dtype != np.bool_:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got dtype {md.dtype}; compare first, e.g. "
                        f"`t.masked_fill(ids == pad_id, 0.0)`")
    try:
        fits = np.broadcast_shapes(md.shape, ad.shape) == ad.shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"masked_fill: the mask's shape {md.shape} does not broadcast to the tensor's shape "
                         f"{ad.shape}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got a tensor of shape "
                             f"{value.shape}; use where(mask, values, t) for a tensor of values")
        value = to_dtype(value, ad.dtype)
    else:
        check_number_fits(value, ad.dtype, "masked_fill", floats=True)
        value = Tensor(_constant_of(value, ad.dtype))
    return where(mask, value, a)


def _constant_of(value, dtype: np.dtype) -> np.ndarray:
    """A number as a 0-d constant of `dtype` (a float into an integer tensor truncates, as torch's fill)."""
    return _constant(np.array(value).astype(dtype))


def _number(x) -> Tensor:
    """A number given to `where` for both branches, as torch types it: a Python float as float32."""
    if isinstance(x, float) and not isinstance(x, np.generic):  # np.float64 is a float subclass: it keeps float64
        return as_tensor(np.float32(x))
    return as_tensor(x)


def embedding(input, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) picked by integer `indices`. Shape: (...) -> (..., dim).

    torch's signature: the row `padding_idx` gets no gradient (as nn.Embedding's); max_norm's renormalising,
    scale_grad_by_freq and sparse gradients are refused (not implemented), not ignored."""
    # max_norm is refused whenever given (0.0 is a norm torch renormalises every row to: zeros), the flags when set.
    refused = [name for name, value in (("max_norm", max_norm is not None), ("scale_grad_by_freq", scale_grad_by_freq),
                                        ("sparse", sparse)) if value]
    if refused:
        raise ValueError(f"embedding: {', '.join(refused)} is not supported; leave it at its default")
    ids = input.data if isinstance(input, Tensor) else np.asarray(input)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got dtype {ids.dtype}")
    weight = as_tensor(weight)
    wd = weight.data
    if wd.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, dim), got shape {wd.shape}")
    num, dim = wd.shape
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) \
                or not -num <= padding_idx < num:
            raise ValueError(f"embedding: padding_idx must be an integer row index in [-{num}, {num}), got "
                             f"{padding_idx!r}")
        padding_idx = int(padding_idx) % num
    out = new(ids.shape + (dim,), wd.dtype)
    host(_lookup, wd, ids, out)

    def backward(g):
        gw = new(wd.shape, g.dtype)
        # A token seen twice gets both gradients, added in token order.
        # reshaped, not ids.reshape: ids that are a strided view of the batch (a column of it) are copied
        # into the arena through tape.host, where NumPy's reshape would copy them onto the heap, unrecorded.
        kernel("embedding_backward")(reshaped(ids, (-1,)), contiguous(reshaped(g, (ids.size, dim))), gw)
        if padding_idx is not None:
            host(_no_gradient_row, gw, padding_idx)
        return (gw,)

    # Backward reads the indices, not the weight's values (as torch's).
    return Tensor._make(out, (weight,), backward, saved=(input if isinstance(input, Tensor) else None,))


# The NumPy work of the ops above, one function each: tape.host records a call as one entry of a
# captured step (compile/captured.py), so the bounds checks, which read the ids, run on every replay
# and raise there as they do here.

def _no_gradient_row(gw: np.ndarray, row: int) -> None:
    gw[row] = 0


_STAND_IN = np.empty((), np.dtype([]))  # getitem's shape finder: a structured dtype without fields has itemsize 0


def _out_of_range(ids: np.ndarray, low: int, high: int):
    """The first id outside [low, high), or None."""
    if ids.size and (ids.min() < low or ids.max() >= high):
        return ids[(ids < low) | (ids >= high)].flat[0]
    return None


def _take(ad, ids, axis, out):
    n = ad.shape[axis]
    bad = _out_of_range(ids, -n, n)
    if bad is not None:
        raise IndexError(f"index {bad} is out of bounds for dimension {axis} with size {n}")
    # Bounds are checked above, so "wrap" only maps negatives; "raise" would buffer the output.
    np.take(ad, ids, axis=axis, out=out, mode="wrap")


def _gather(ad, idx, out):
    np.copyto(out, ad[idx])  # NumPy has no out= for general fancy indexing: a temporary, moved into the arena


def _scatter_add(ga, idx, g):
    ga.fill(0)
    np.add.at(ga, idx, g)  # repeated indices accumulate, as the chain rule requires


def _operand(d: np.ndarray, was_tensor: bool):
    """where's operand for the host call: a number the caller passed (now a 0-d array made on the heap) as a
    NumPy scalar of the same dtype, which a recording keeps as a constant instead of as an array."""
    return d[()] if not was_tensor and d.ndim == 0 else d


def _where_forward(cond, ad, bd, out):
    np.copyto(out, bd, casting="same_kind")
    np.copyto(out, ad, casting="same_kind", where=cond)


def _where_grad(g, cond, full, *, taken):
    # g where the forward took this input (cond for a, ~cond for b), zero elsewhere: zero, not g*0,
    # so inf/nan in g does not leak through.
    if taken:
        full.fill(0)
        np.copyto(full, g, where=cond)
    else:
        np.copyto(full, g)
        np.copyto(full, 0, where=cond)


def _lookup(wd, ids, out):
    num = wd.shape[0]
    bad = _out_of_range(ids, 0, num)
    if bad is not None:
        raise IndexError(f"embedding: index {bad} is out of range for num_embeddings={num} "
                         f"(valid indices are 0..{num - 1})")
    # Bounds are checked above; mode="clip" avoids the temporary copy mode="raise" makes.
    np.take(wd, ids, axis=0, out=out, mode="clip")
