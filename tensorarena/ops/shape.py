"""Shape ops (views where NumPy gives one): reshape transpose permute and friends."""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import as_count, as_dtype, as_tensor, new, reshaped, unbroadcast
from .index import getitem


def reshape(a: Tensor, *shape) -> Tensor:
    """Same data, new shape (one dim may be -1). Copies only if `a` is not contiguous."""
    return _reshape(a, shape, "reshape")


def view(a: Tensor, *shape) -> Tensor:
    """torch's Tensor.view: reshape that never copies. A layout no view can take (x.t().view(6)) is refused, as
    torch refuses it: a copy would silently cut the result off `a`, so a write to it would never reach `a`."""
    return _reshape(a, shape, "view")


def _reshape(a: Tensor, shape: tuple, op: str) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(as_count(n, f"{op}: a size") for n in shape)
    if any(n < -1 for n in shape) or shape.count(-1) > 1:
        # NumPy reads any negative size as -1; torch refuses all but a single -1
        raise ValueError(f"{op}: invalid shape {shape} for a tensor of shape {a.shape}: sizes must be "
                         f"non-negative, with at most one -1 (inferred)")
    ad = a.data
    try:
        np.broadcast_to(np.empty((), np.bool_), ad.shape).reshape(shape)  # validate; zero strides, no memory
    except ValueError:
        raise ValueError(f"{op}: cannot view shape {ad.shape} ({ad.size} elements) as {tuple(shape)}") from None
    if op == "view":
        try:
            ad.reshape(shape, copy=False)  # a view or a ValueError; nothing is copied either way
        except ValueError:
            raise RuntimeError(f"view: a tensor of shape {ad.shape} and strides {ad.strides} (bytes) is not laid "
                               f"out as {shape} without a copy; use reshape(), which copies, or "
                               f".contiguous().view()") from None
    view = reshaped(ad, shape)
    view_of = a if np.shares_memory(view, ad) else None  # a copy lives in the arena, not in `a`
    a_shape = ad.shape  # not ad: after a copy, the closure would keep `a`'s memory alive

    def backward(g):
        return (reshaped(g, a_shape),)

    return Tensor._make(view, (a,), backward, view_of=view_of)


def clone(a: Tensor) -> Tensor:
    """A copy of `a` in the current arena that stays in the graph (torch.clone): what to write in place when an
    op saved `a` for its backward (its version counter is the copy's own)."""
    ad = a.data
    out = new(ad.shape, ad.dtype)
    host(np.copyto, out, ad)
    return Tensor._make(out, (a,), lambda g: (g,))


def _dim(dim: int, ndim: int, what: str) -> int:
    """`dim` made non-negative; a 0-d tensor accepts 0 and -1, as in torch."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{what}: dimension {dim} is out of range for a tensor with {ndim} dimensions "
                         f"(expected a value in [{-n}, {n - 1}])")
    return dim % n




def transpose(a: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dimensions (a view)."""
    ad = a.data
    d0, d1 = _dim(dim0, ad.ndim, "transpose"), _dim(dim1, ad.ndim, "transpose")
    view = np.swapaxes(ad, d0, d1) if ad.ndim else ad.view()

    def backward(g):
        return (np.swapaxes(g, d0, d1) if g.ndim else g,)

    return Tensor._make(view, (a,), backward, view_of=a)


def permute(a: Tensor, *dims) -> Tensor:
    """Reorder dimensions (a view); dims as separate ints or one tuple."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    ad = a.data
    if ad.ndim == 0 and dims in ((), (0,), (-1,)):
        return Tensor._make(ad.view(), (a,), lambda g: (g,), view_of=a)
    perm = tuple(_dim(d, ad.ndim, "permute") for d in dims)
    if sorted(perm) != list(range(ad.ndim)):
        raise ValueError(f"permute: dims {tuple(dims)} are not a permutation of the {ad.ndim} dimensions "
                         f"of a tensor of shape {ad.shape}")
    inverse = tuple(np.argsort(perm))

    def backward(g):
        return (np.transpose(g, inverse),)

    return Tensor._make(np.transpose(ad, perm), (a,), backward, view_of=a)


def expand(a: Tensor, *shape) -> Tensor:
    """`a` broadcast to `shape` as a zero-stride view (torch's expand; -1 keeps a dim). No memory is used;
    the gradient sums back over the broadcast dims."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    ad = a.data
    lead = len(shape) - ad.ndim
    if lead < 0:
        raise ValueError(f"expand: target shape {tuple(shape)} has fewer dims than the tensor's {ad.shape}")
    target = tuple(ad.shape[i - lead] if n == -1 and i >= lead else n for i, n in enumerate(shape))
    try:
        view = np.broadcast_to(ad, target)
    except ValueError:
        raise ValueError(f"expand: shape {ad.shape} cannot be expanded to {tuple(shape)} (only size-1 dims "
                         f"can grow)") from None
    a_shape = ad.shape

    def backward(g):
        return (unbroadcast(g, a_shape),)

    return Tensor._make(view, (a,), backward, view_of=a)


def unsqueeze(a: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dimension at `dim` (a view; dim in [-ndim-1, ndim])."""
    ad = a.data
    d = _dim(dim, ad.ndim + 1, "unsqueeze")
    a_shape = ad.shape

    def backward(g):
        return (g.reshape(a_shape),)

    return Tensor._make(np.expand_dims(ad, d), (a,), backward, view_of=a)


def squeeze(a: Tensor, dim=None) -> Tensor:
    """Drop size-1 dimensions (all, or only those in `dim`, an int or tuple; others are kept)."""
    ad = a.data
    if dim is None:
        axes = tuple(i for i, n in enumerate(ad.shape) if n == 1)
    else:
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        # torch leaves a named dim alone when its size is not 1 instead of raising.
        axes = tuple(sorted({d for d in (_dim(x, ad.ndim, "squeeze") for x in dims)
                             if ad.ndim and ad.shape[d] == 1}))
    view = np.squeeze(ad, axis=axes) if axes else ad.view()
    a_shape = ad.shape

    def backward(g):
        return (g.reshape(a_shape),)

    return Tensor._make(view, (a,), backward, view_of=a)


def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one (a view when `a` is contiguous there)."""
    shape = a.shape
    if not shape:
        return reshape(a, (1,))  # torch flattens a 0-d tensor to shape (1,)
    s, e = _dim(start_dim, len(shape), "flatten"), _dim(end_dim, len(shape), "flatten")
    if s > e:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {shape}")
    merged = 1
    for n in shape[s : e + 1]:
        merged *= n
    return reshape(a, shape[:s] + (merged,) + shape[e + 1 :])


def unflatten(a: Tensor, dim: int, sizes) -> Tensor:
    """Split dim `dim` into `sizes` (one may be -1), torch's unflatten: flatten's inverse (a view when it can be)."""
    shape = a.shape
    d = _dim(dim, len(shape), "unflatten")
    sizes = tuple(as_count(n, "unflatten: a size") for n in sizes)
    if not sizes:
        raise ValueError("unflatten: sizes must name at least one size")
    known = 1
    for n in sizes:
        known *= 1 if n == -1 else n
    fits = known == shape[d] if -1 not in sizes else known > 0 and shape[d] % known == 0
    if sizes.count(-1) > 1 or not fits:
        raise ValueError(f"unflatten: sizes {sizes} do not multiply to dim {d}'s size {shape[d]} (shape {shape}); "
                         f"one of them, at most, may be -1")
    return reshape(a, shape[:d] + sizes + shape[d + 1 :])

def contiguous(a: Tensor) -> Tensor:
    """`a` itself when its memory is C-contiguous, else a copy that is (torch's contiguous, in the graph)."""
    return a if a.data.flags.c_contiguous else clone(a)


def split(a: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of `a` along `dim` (torch.split): pieces of split_size (the last may be smaller), or of the sizes in
    a list, which must add up to the dim's size."""
    if a.ndim == 0:
        raise ValueError("split: a 0-d tensor has no dimension to split; reshape it first")
    n = a.shape[_dim(dim, a.ndim, "split")]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [as_count(k, "split: a section size") for k in split_size_or_sections]
        if sum(sizes) != n or any(k < 0 for k in sizes):
            raise ValueError(f"split: the sizes {sizes} must be non-negative and add up to {n}, the size of dim "
                             f"{dim} of a tensor of shape {a.shape}")
    else:
        size = as_count(split_size_or_sections, "split: split_size")
        if size <= 0 and n:
            raise ValueError(f"split: split_size must be positive, got {size}")
        sizes = [min(size, n - lo) for lo in range(0, n, size)] if n else [0]
    return _pieces(a, dim, sizes)


def chunk(a: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """`chunks` views of `a` along `dim`, each ceil(size / chunks) long (torch.chunk: fewer when they run out)."""
    chunks = as_count(chunks, "chunk: chunks")
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    if a.ndim == 0:
        raise ValueError("chunk: a 0-d tensor has no dimension to chunk; reshape it first")
    n = a.shape[_dim(dim, a.ndim, "chunk")]
    if n == 0:  # torch: `chunks` empty pieces (split would give one)
        return _pieces(a, dim, [0] * chunks)
    return split(a, -(-n // chunks), dim)


def _pieces(a: Tensor, dim: int, sizes: list[int]) -> tuple[Tensor, ...]:
    lead = (slice(None),) * _dim(dim, a.ndim, "split")
    bounds = np.cumsum([0] + sizes)
    return tuple(getitem(a, lead + (slice(int(lo), int(hi)),)) for lo, hi in zip(bounds[:-1], bounds[1:]))


def unbind(a: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of `a` along `dim`, that dim removed (torch.unbind), each a view."""
    if a.ndim == 0:
        raise ValueError("unbind: a 0-d tensor has no dimension to unbind")
    d = _dim(dim, a.ndim, "unbind")
    return tuple(getitem(a, (slice(None),) * d + (i,)) for i in range(a.shape[d]))


def repeat(a: Tensor, *sizes) -> Tensor:
    """`a` tiled `sizes` times along each dim (torch's Tensor.repeat; extra leading sizes add dims). A copy, whose
    gradient sums over the tiles."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    sizes = tuple(as_count(n, "repeat: a size") for n in sizes)
    ad = a.data
    if len(sizes) < ad.ndim:
        raise ValueError(f"repeat: {len(sizes)} repeat sizes for a tensor of {ad.ndim} dims (shape {ad.shape}); "
                         f"give at least one per dim")
    if any(n < 0 for n in sizes):
        raise ValueError(f"repeat: sizes must be non-negative, got {sizes}")
    shape = (1,) * (len(sizes) - ad.ndim) + ad.shape  # (s0, s1, ...)
    out = new(tuple(r * n for r, n in zip(sizes, shape)), ad.dtype)
    host(_repeat_forward, ad.reshape(shape), sizes, out)
    a_shape = ad.shape

    def backward(g):
        ga = new(shape, g.dtype)
        host(_repeat_backward, g, sizes, ga)
        return (ga.reshape(a_shape),)

    return Tensor._make(out, (a,), backward)


def _tiles(sizes: tuple, shape: tuple) -> tuple:
    """The repeated array's shape as (r0, s0, r1, s1, ...): tile index and position within the tile per dim."""
    return tuple(x for pair in zip(sizes, shape) for x in pair)


def _repeat_forward(src, sizes, out):
    # every tile is `src` broadcast over the r axes
    np.copyto(out.reshape(_tiles(sizes, src.shape)), src.reshape(_tiles((1,) * src.ndim, src.shape)))


def _repeat_backward(g, sizes, ga):
    np.sum(g.reshape(_tiles(sizes, ga.shape)), axis=tuple(range(0, 2 * ga.ndim, 2)), out=ga)


def _promoted_dtype(dtypes) -> np.dtype:
    """torch's promotion for a list: floats win over ints (int64 + float32 -> float32), widest float wins."""
    floats = [d for d in dtypes if d.kind == "f"]
    return np.result_type(*(floats or dtypes))


def _inputs(tensors, what: str) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what}: expected a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{what}: expected a non-empty list of tensors")
    return [as_tensor(t) for t in tensors]


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate along an existing dim (torch.cat / concat); dtypes promote like torch.

    torch's legacy empty tensor, a 1-D one of size 0 (torch.empty(0)), goes with any shape, as in torch: it adds
    nothing but its dtype to the result (and gets an empty gradient).
    """
    ts = _inputs(tensors, "cat")
    datas = [t.data for t in ts]
    if any(d.ndim == 0 for d in datas):
        raise ValueError(f"cat: zero-dimensional tensors cannot be concatenated; got shapes "
                         f"{[d.shape for d in datas]}")
    dtype = _promoted_dtype([x.dtype for x in datas])
    pieces = [i for i, x in enumerate(datas) if x.shape != (0,)]  # the rest are legacy empties
    if not pieces:
        return _cat_of_empties(ts, dtype)
    first = datas[pieces[0]].shape
    d = _dim(dim, len(first), "cat")
    bad = [(i, datas[i].shape) for i in pieces if datas[i].ndim != len(first)
           or datas[i].shape[:d] + datas[i].shape[d + 1:] != first[:d] + first[d + 1:]]
    if bad:
        listed = ", ".join(f"tensor {i} has shape {s}" for i, s in bad)
        raise ValueError(f"cat: tensors must have the same shape except in dim {dim}; tensor {pieces[0]} has "
                         f"shape {first} but {listed} (only a 1-D empty tensor, shape (0,), goes with any shape)")
    sizes = [datas[i].shape[d] for i in pieces]
    out = new(first[:d] + (sum(sizes),) + first[d + 1:], dtype)
    host(np.concatenate, [datas[i] for i in pieces], axis=d, out=out, casting="same_kind")
    bounds = dict(zip(pieces, zip(np.cumsum([0] + sizes[:-1]), np.cumsum(sizes))))
    # Per input: its dtype when it needs a gradient, and its rows of the output (None: a legacy empty).
    wanted = [(t.dtype if t.requires_grad else None, bounds.get(i)) for i, t in enumerate(ts)]

    def backward(g):
        lead = (slice(None),) * d
        return tuple(None if dtype is None else _empty_grad(dtype) if rows is None
                     else as_dtype(g[lead + (slice(*rows),)], dtype) for dtype, rows in wanted)

    return Tensor._make(out, ts, backward)


def _cat_of_empties(ts: list[Tensor], dtype: np.dtype) -> Tensor:
    """cat of legacy empty tensors only: an empty one of the promoted dtype, whatever the dim (as torch)."""
    wanted = [t.dtype if t.requires_grad else None for t in ts]
    return Tensor._make(new((0,), dtype), ts, lambda g: tuple(None if w is None else _empty_grad(w) for w in wanted))


def _empty_grad(dtype: np.dtype) -> np.ndarray:
    return new((0,), dtype)


def stack(tensors, dim: int = 0) -> Tensor:
    """Stack equally shaped tensors along a new dim (dim in [-ndim-1, ndim])."""
    ts = _inputs(tensors, "stack")
    datas = [t.data for t in ts]
    first = datas[0].shape
    bad = [(i, x.shape) for i, x in enumerate(datas) if x.shape != first]
    if bad:
        listed = ", ".join(f"tensor {i} has shape {s}" for i, s in bad)
        raise ValueError(f"stack: all tensors must have the same shape to stack along dim {dim}; "
                         f"tensor 0 has shape {first} but {listed}")
    d = _dim(dim, len(first) + 1, "stack")
    out = new(first[:d] + (len(datas),) + first[d:], _promoted_dtype([x.dtype for x in datas]))
    host(np.stack, datas, axis=d, out=out, casting="same_kind")
    wanted = [t.dtype if t.requires_grad else None for t in ts]  # not ts: that would keep every input alive

    def backward(g):
        lead = (slice(None),) * d
        return tuple(as_dtype(g[lead + (i,)], dtype) if dtype is not None else None
                     for i, dtype in enumerate(wanted))

    return Tensor._make(out, ts, backward)
