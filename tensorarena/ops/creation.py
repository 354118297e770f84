"""New tensors, as torch's factory functions make them: zeros ones full empty (and *_like), eye, arange linspace,
one_hot, from_numpy, and the methods new_zeros new_ones new_full new_tensor.

Each returns a leaf on the heap (as `ta.tensor` does), in torch's default dtype for what it is given: float32 for
floats, int64 for integers, bool for bools. `dtype` takes a NumPy dtype (np.float64, "float64").
"""

from __future__ import annotations

import numpy as np

from ..device import check_cpu
from ..tensor import DEFAULT_DTYPE, SUPPORTED_FLOATS, Tensor, _check_can_require_grad
from ._base import as_count


def _shape(size) -> tuple[int, ...]:
    """zeros(2, 3) and zeros((2, 3)) alike, as torch."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(as_count(n, "a size") for n in size)


def _dims_or_size(dims: tuple, size, what: str) -> tuple[int, ...]:
    """The shape given as positional dims, zeros(2, 3) / zeros((2, 3)), or as torch's keyword, zeros(size=(2, 3))."""
    if size is None:
        return _shape(dims)
    if dims:
        raise TypeError(f"{what}() got the size twice: positionally {dims} and as size={size!r}; pass one")
    return _shape((size,))


def _leaf(array: np.ndarray, requires_grad: bool) -> Tensor:
    if requires_grad:
        _check_can_require_grad(array.dtype)
    return Tensor(array, requires_grad=requires_grad)


def zeros(*dims, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros (float32 unless told otherwise), torch.zeros."""
    check_cpu(device, "zeros")
    return _leaf(np.zeros(_dims_or_size(dims, size, "zeros"), dtype or DEFAULT_DTYPE), requires_grad)


def ones(*dims, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones (float32 unless told otherwise), torch.ones."""
    check_cpu(device, "ones")
    return _leaf(np.ones(_dims_or_size(dims, size, "ones"), dtype or DEFAULT_DTYPE), requires_grad)


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of `fill_value`; its dtype from the value as torch's (float -> float32, int -> int64, bool)."""
    check_cpu(device, "full")
    return _leaf(np.full(_shape((size,)), fill_value, dtype or _number_dtype(fill_value)), requires_grad)


def empty(*dims, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor whose values are whatever its memory held (torch.empty): write it before reading it."""
    check_cpu(device, "empty")
    return _leaf(np.empty(_dims_or_size(dims, size, "empty"), dtype or DEFAULT_DTYPE), requires_grad)


def eye(n, m=None, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An n x m matrix (m = n unless given) with ones on its main diagonal, zeros elsewhere (torch.eye)."""
    check_cpu(device, "eye")
    rows = as_count(n, "eye's n")
    cols = rows if m is None else as_count(m, "eye's m")
    if rows < 0 or cols < 0:
        raise ValueError(f"eye: n and m must be >= 0, got n={rows}, m={cols}")
    return _leaf(np.eye(rows, cols, dtype=dtype or DEFAULT_DTYPE), requires_grad)


def zeros_like(a: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Zeros of a's shape and dtype (torch.zeros_like)."""
    check_cpu(device, "zeros_like")
    return _leaf(np.zeros(a.shape, dtype or a.dtype), requires_grad)


def ones_like(a: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Ones of a's shape and dtype (torch.ones_like)."""
    check_cpu(device, "ones_like")
    return _leaf(np.ones(a.shape, dtype or a.dtype), requires_grad)


def empty_like(a: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An unwritten tensor of a's shape and dtype (torch.empty_like): write it before reading it."""
    check_cpu(device, "empty_like")
    return _leaf(np.empty(a.shape, dtype or a.dtype), requires_grad)


def full_like(a: Tensor, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """`fill_value` in a's shape and dtype (torch.full_like: the value is cast to a's dtype)."""
    check_cpu(device, "full_like")
    return _leaf(np.full(a.shape, fill_value, dtype or a.dtype), requires_grad)


def new_zeros(self: Tensor, *dims, size=None, dtype=None, device=None, requires_grad: bool = False
              ) -> Tensor:
    """Zeros of `size` in self's dtype unless told otherwise (torch's Tensor.new_zeros)."""
    check_cpu(device, "new_zeros")
    return _leaf(np.zeros(_dims_or_size(dims, size, "new_zeros"), dtype or self.dtype), requires_grad)


def new_ones(self: Tensor, *dims, size=None, dtype=None, device=None, requires_grad: bool = False
             ) -> Tensor:
    """Ones of `size` in self's dtype unless told otherwise (torch's Tensor.new_ones)."""
    check_cpu(device, "new_ones")
    return _leaf(np.ones(_dims_or_size(dims, size, "new_ones"), dtype or self.dtype), requires_grad)


def new_full(self: Tensor, size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """`fill_value` in `size`, in self's dtype unless told otherwise, whatever the value's type (torch's
    Tensor.new_full: torch.zeros(2).new_full((2,), 3) is float32)."""
    check_cpu(device, "new_full")
    return _leaf(np.full(_shape((size,)), fill_value, dtype or self.dtype), requires_grad)


def new_tensor(self: Tensor, data, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A copy of `data` in self's dtype unless told otherwise (torch's Tensor.new_tensor), a leaf cut from any
    graph `data` belongs to."""
    check_cpu(device, "new_tensor")
    raw = data.data if isinstance(data, Tensor) else data
    return _leaf(np.array(raw, dtype=dtype or self.dtype, copy=True), requires_grad)


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """A tensor sharing `ndarray`'s memory (torch.from_numpy): a write to either shows in the other, and the dtype
    is the array's. `ta.tensor(array)` copies instead. An array the engine cannot hold as it is (float16 or
    another float it keeps as float32, a non-native byte order) is refused here rather than silently copied;
    torch too refuses a non-native byte order (it holds float16, which tensorarena does not)."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(ndarray).__name__}; use ta.tensor for "
                        f"other data")
    if not ndarray.dtype.isnative:
        raise TypeError(f"from_numpy: the array's byte order ({ndarray.dtype}) is not the machine's; convert it "
                        f"first (array.astype(array.dtype.newbyteorder('='))) or copy it with ta.tensor")
    if ndarray.dtype.kind not in "biuf" or (ndarray.dtype.kind == "f" and ndarray.dtype not in SUPPORTED_FLOATS):
        raise TypeError(f"from_numpy: an array of dtype {ndarray.dtype} cannot be shared (tensors hold float32, "
                        f"float64, integers and bool); copy and convert it with ta.tensor(array)")
    return Tensor(ndarray)  # Tensor wraps an array of a dtype it holds as it is: no copy


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """[start, end) by step, torch.arange: int64 when every argument is an integer, else float32."""
    check_cpu(device, "arange")
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if all(_is_integer(x) for x in (start, end, step)):
        values = np.arange(int(start), int(end), int(step), dtype=np.int64)
        return _leaf(values.astype(dtype or np.int64), requires_grad)
    # As torch: ceil((end - start) / step) values, each start + i * step computed in float64, then rounded once.
    count = max(int(np.ceil((float(end) - float(start)) / float(step))), 0)
    values = float(start) + np.arange(count, dtype=np.float64) * float(step)
    return _leaf(values.astype(dtype or DEFAULT_DTYPE), requires_grad)


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """`steps` evenly spaced values from start to end inclusive (float32 unless told otherwise), torch.linspace."""
    check_cpu(device, "linspace")
    if int(steps) < 0:
        raise ValueError(f"linspace: number of steps must be non-negative, got {steps}")
    return _leaf(np.linspace(float(start), float(end), int(steps)).astype(dtype or DEFAULT_DTYPE), requires_grad)


def one_hot(input, num_classes: int = -1) -> Tensor:
    """torch.nn.functional.one_hot: int64 labels (...) -> int64 (..., num_classes); -1: one more than the
    largest label."""
    ids = input.data if isinstance(input, Tensor) else np.asarray(input)
    if ids.dtype != np.int64:
        raise TypeError(f"one_hot: labels must be an int64 tensor (torch's rule), got dtype {ids.dtype}; "
                        f"use labels.long()")
    if num_classes == -1:
        if ids.size == 0:
            raise ValueError("one_hot: cannot infer the number of classes from an empty tensor; pass num_classes")
        num_classes = int(ids.max()) + 1
    if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
        raise ValueError(f"one_hot: labels must be in [0, {num_classes}), got values from {ids.min()} to "
                         f"{ids.max()}")
    out = np.zeros(ids.shape + (num_classes,), np.int64)
    np.put_along_axis(out, ids[..., None], 1, axis=-1)
    return Tensor(out)


def _is_integer(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _number_dtype(x) -> np.dtype:
    """torch's dtype for a fill value: bool, int64 for an integer, else float32."""
    if isinstance(x, (bool, np.bool_)):
        return np.dtype(np.bool_)
    return np.dtype(np.int64 if _is_integer(x) else DEFAULT_DTYPE)
