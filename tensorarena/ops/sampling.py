"""New tensors of random values, as torch's factory functions: randn rand randint randperm.

Each draws from `rng` (a np.random.Generator), else from tensorarena's default generator, the one
`ta.manual_seed` reseeds and weight init and dropout draw from (tensorarena/random.py), and returns a leaf on the
heap, as `ta.zeros` does. Floats are drawn in float64 and then rounded to the dtype, as nn.init draws them, so a
float32 and a float64 tensor drawn from the same seed hold the same values (to float32 precision). The draws are
NumPy's, so they match torch's statistically, never value for value.
"""

from __future__ import annotations

import numpy as np

from ..device import check_cpu
from ..random import get_generator
from ..tensor import DEFAULT_DTYPE, Tensor
from ._base import as_count
from .creation import _dims_or_size, _leaf, _shape


def randn(*dims, size=None, dtype=None, device=None, requires_grad: bool = False,
          rng: np.random.Generator | None = None) -> Tensor:
    """Standard normal values (float32 unless told otherwise), torch.randn: randn(2, 3) or randn((2, 3))."""
    check_cpu(device, "randn")
    dtype = _float_dtype(dtype, "randn")
    return _leaf(get_generator(rng).standard_normal(_dims_or_size(dims, size, "randn")).astype(dtype), requires_grad)


def rand(*dims, size=None, dtype=None, device=None, requires_grad: bool = False,
         rng: np.random.Generator | None = None) -> Tensor:
    """Uniform values in [0, 1) (float32 unless told otherwise), torch.rand."""
    check_cpu(device, "rand")
    dtype = _float_dtype(dtype, "rand")
    values = get_generator(rng).random(_dims_or_size(dims, size, "rand")).astype(dtype)
    # A float64 draw just below 1 rounds up to 1.0 in float32: keep the interval half-open, as torch's.
    np.minimum(values, np.nextafter(dtype.type(1), dtype.type(0)), out=values)
    return _leaf(values, requires_grad)


def randint(*args, low=None, high=None, size=None, dtype=None, device=None, requires_grad: bool = False,
            rng: np.random.Generator | None = None) -> Tensor:
    """Integers drawn uniformly from [low, high) (int64 unless told otherwise), torch.randint: randint(high, size)
    or randint(low, high, size), the size a tuple; any of them as torch's keywords (low=, high=, size=)."""
    check_cpu(device, "randint")
    if size is None:
        if not args:
            raise TypeError("randint: missing the size, e.g. randint(10, (2, 3)) or randint(0, 10, (2, 3))")
        *args, size = args
    if high is not None:  # keywords: positional ones before them are low (torch's order), if any
        if len(args) > (0 if low is not None else 1):
            raise TypeError(f"randint got low/high both positionally {tuple(args)} and as keywords; pass one")
        args = [low if low is not None else (args[0] if args else 0), high]
    elif low is not None:
        raise TypeError("randint: low= needs high= too (the range is [low, high))")
    if len(args) == 1:
        low, high = 0, args[0]
    elif len(args) == 2:
        low, high = args
    else:
        raise TypeError(f"randint takes (high, size) or (low, high, size), got {len(args) + 1} positional arguments")
    low, high = as_count(low, "randint: low"), as_count(high, "randint: high")
    if low >= high:
        raise ValueError(f"randint: low must be below high (the range is [low, high)), got low={low}, high={high}")
    dtype = np.dtype(dtype or np.int64)
    values = get_generator(rng).integers(low, high, size=_shape((size,)), dtype=np.int64)
    return _leaf(values.astype(dtype), requires_grad)


def randperm(n: int, *, dtype=None, device=None, requires_grad: bool = False, rng: np.random.Generator | None = None) -> Tensor:
    """A random permutation of 0 .. n-1 (int64 unless told otherwise), torch.randperm."""
    check_cpu(device, "randperm")
    n = as_count(n, "randperm: n")
    if n < 0:
        raise ValueError(f"randperm: n must be non-negative, got {n}")
    return _leaf(get_generator(rng).permutation(n).astype(dtype or np.int64), requires_grad)


def _float_dtype(dtype, what: str) -> np.dtype:
    """The dtype asked for, which must be floating point (torch has no normal or uniform draw for integers)."""
    dtype = np.dtype(dtype or DEFAULT_DTYPE)
    if dtype.kind != "f":
        raise TypeError(f"{what}: dtype must be floating point, got {dtype}; for integers use randint")
    return dtype
