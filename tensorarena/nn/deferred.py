"""Deferred construction: build a model whose parameters hold no values yet, and make them later, exactly.

    with nn.deferred_init():
        model = ViT(ViTConfig.base(), rng=np.random.default_rng(0))   # shapes and dtypes, no weights
    model.materialize()           # in memory: the very values ViT(...) would have made without deferred_init
    # or hand it to Trainer(route="streaming"|"auto"): each stage is made straight into the store

A PyTorch user knows the idea from `torch.device("meta")` + materialisation and torchdistx's `deferred_init`.
Here the values are exact: a parameter made under `deferred_init()` is a `Parameter.empty` whose constructor's
fills (tensorarena.nn.init: uniform_, normal_, trunc_normal_, constant_ and those built on them) are recorded
instead of run. A fill that draws random numbers records the state of the generator it drew from and moves that
generator on exactly as the real draw would (the same NumPy call, into a small throwaway buffer chunk by chunk:
Generator.uniform and .normal consume the stream sample by sample, so a chunked draw consumes what one big draw
does), so the model's later fills and every other user of the generator see the same stream as in an eager
build. Making the values replays the last fill (each fill overwrites the whole tensor) on a copy of the recorded
generator state: bit-identical to the eager build, never allocating more than the parameter itself (plus what
the fill's own draw takes, as in the eager build).

The deferred parameter's storage is a zero-stride placeholder (no memory; shape and dtype true), and its arena
slot holds its `DeferredInit`, whose `generation` raises: so reading or writing its values through `.data`, as
every op and `state_dict` does, fails with a `DeferredParameterError` naming the parameter and what to do. A
constructor that writes into a deferred parameter other than through tensorarena.nn.init (`weight.data[0] = 0`)
fails there, at that line, with the same error. Parameters made from given values (`Parameter(np.zeros(3))`)
are not deferred: their values exist already.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Callable, Iterator

import numpy as np

_CHUNK = 1 << 16  # samples per throwaway draw while recording (512 KiB of float64)
_local = threading.local()


class DeferredParameterError(RuntimeError):
    """A deferred parameter's values were read or written before they were made (materialize them first)."""


@contextlib.contextmanager
def deferred_init() -> Iterator[None]:
    """Within it, modules get deferred parameters: shapes and dtypes only, their init recorded (module docstring)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def is_deferring() -> bool:
    """Whether this thread is inside deferred_init()."""
    return getattr(_local, "depth", 0) > 0


class _Fill:
    """One recorded init call: the nn.init function's name, its arguments, and the generator state it drew from."""

    __slots__ = ("fn", "kwargs", "bit_generator", "state")

    def __init__(self, fn: str, kwargs: dict[str, Any], gen: np.random.Generator | None) -> None:
        self.fn, self.kwargs = fn, kwargs
        self.bit_generator = None if gen is None else type(gen.bit_generator)
        self.state = None if gen is None else gen.bit_generator.state  # a copy (a dict), as NumPy returns it

    def generator(self) -> np.random.Generator | None:
        """A new generator at the recorded state: replaying draws exactly what the eager fill drew."""
        if self.bit_generator is None:
            return None
        bit_generator = self.bit_generator(0)  # any seed: the state is replaced next
        bit_generator.state = self.state
        return np.random.Generator(bit_generator)

    def describe(self) -> str:
        args = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.kwargs.items())
        return f"{self.fn}({args})"


class DeferredInit:
    """What a deferred parameter will hold: shape, dtype and the recorded fill. It sits in the parameter's
    arena slot: Tensor.data reads `generation` there, which raises DeferredParameterError (module docstring)."""

    closed = True  # as a closed arena: nothing may be read from it

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        # The dtype the constructor filled in. Module.to(dtype) on a deferred model changes `dtype` only: the values
        # are then made in this dtype and cast, as the eager build's float32 values cast by .to(np.float64) are.
        self.built_dtype = dtype
        self.fill: _Fill | None = None
        self.fills = 0  # how many fills the constructor made (only the last decides the values)
        self.label = "a parameter"  # named when assigned to a module, fully by name_deferred(model)

    @property
    def name(self) -> str:
        return f"deferred_init (the values of {self.label} are not made yet)"

    @property
    def generation(self) -> int:
        raise DeferredParameterError(self.message())

    def message(self) -> str:
        """Which parameter, why it has no values, and what to do."""
        made = (f"its constructor recorded {self.fill.describe()}" if self.fill is not None
                else "its constructor recorded no init yet")
        return (f"{self.label} (shape {self.shape}, {np.dtype(self.dtype)}) was built under "
                f"tensorarena.nn.deferred_init(), so it holds no values yet ({made}); they cannot be read or written "
                f"in place. Make them first: model.materialize() (or parameter.materialize()), or hand the model to "
                f"a Trainer, which makes them where its route keeps them (straight into the store when streaming). "
                f"A constructor that writes into a parameter other than through tensorarena.nn.init cannot be "
                f"deferred: build that module outside deferred_init()")

    def record(self, fill: _Fill) -> None:
        self.fill, self.fills = fill, self.fills + 1

    def fill_into(self, out: np.ndarray) -> np.ndarray:
        """Write the values into `out` (an array of the parameter's shape and dtype: memory, or a store slot)."""
        from . import init

        if out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError(f"cannot make {self.label} (shape {self.shape}, {np.dtype(self.dtype)}) into an array "
                             f"of shape {out.shape}, {out.dtype}")
        if self.fill is None:
            # The eager build would hold whatever np.empty gave: no value to reproduce, so no silent zeros either.
            raise DeferredParameterError(
                f"{self.label} (shape {self.shape}) was created empty under deferred_init() and never filled by a "
                f"tensorarena.nn.init function, so it has no defined values to make; fill it in its constructor "
                f"(e.g. nn.init.zeros_) or build the module outside deferred_init()")
        fn: Callable = getattr(init, self.fill.fn)
        gen = self.fill.generator()
        target = out if self.built_dtype == self.dtype else np.empty(self.shape, self.built_dtype)
        fn(target, **self.fill.kwargs, **({} if gen is None else {"rng": gen}))
        if target is not out:
            np.copyto(out, target, casting="same_kind")  # astype's rounding: the eager build's .to()
        return out


def placeholder(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A read-only zero-stride array of `shape`: no memory, but the shape and dtype a deferred parameter reports."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def record_fill(t, fn: str, kwargs: dict[str, Any], gen: np.random.Generator | None,
                advance: Callable[[np.random.Generator], None] | None = None):
    """Record an nn.init call on deferred parameter `t` instead of running it; `advance(gen)` consumes from `gen`
    exactly what the real call would draw. Returns `t` (init functions return their target)."""
    t._arena.record(_Fill(fn, kwargs, gen))
    if advance is not None:
        advance(gen)
    return t


def skip_draws(draw: Callable[[int], np.ndarray], count: int) -> None:
    """Call `draw(n)` for chunks adding up to `count` samples, discarding them: the generator ends where one
    draw(count) leaves it, without a `count`-sized array."""
    while count > 0:
        n = min(count, _CHUNK)
        draw(n)
        count -= n


def skip_trunc_normal(gen: np.random.Generator, count: int, mean: float, std: float, a: float, b: float) -> None:
    """Consume what init.trunc_normal_ draws for `count` values: a round of `count` normals, then one normal for
    each value that fell outside [a, b] in the round before, until none does. Only how many fell outside
    decides the next round's size, so counting them chunk by chunk reproduces the rounds exactly."""
    while count > 0:
        outside, left = 0, count
        while left > 0:
            n = min(left, _CHUNK)
            values = gen.normal(mean, std, size=n)
            outside += int(np.count_nonzero((values < a) | (values > b)))
            left -= n
        count = outside


def fill_bytes(p) -> int:
    """Scratch bytes making deferred parameter `p` takes beside its own: nn.init draws in float64 (8 per value)
    and casts into the target; trunc_normal_ also holds three bool masks while it compares and the indices of
    the values it draws again (at most a few percent of 8 bytes each: 1 is counted). A constant takes none."""
    record = p._arena
    fill = record.fill
    per_value = {"constant_": 0, "trunc_normal_": 12}.get(fill.fn, 8) if fill is not None else 0
    if record.built_dtype != record.dtype:  # made in the constructor's dtype, then cast (Module.to)
        per_value += np.dtype(record.built_dtype).itemsize
    return per_value * math.prod(p.shape)


def name_deferred(module) -> None:
    """Label each deferred parameter of `module` with its dotted name, for errors (before a Trainer or a
    materialize uses them)."""
    for name, p in module.named_parameters():
        if p.is_deferred:
            p._arena.label = f"parameter {name!r}"


def deferred_bytes(params) -> int:
    """Bytes the deferred parameters among `params` will take once made (each counted once)."""
    return sum(math.prod(p.shape) * p.dtype.itemsize for p in {id(p): p for p in params}.values() if p.is_deferred)


def has_deferred(module) -> bool:
    """Whether any parameter of `module` is deferred."""
    return any(p.is_deferred for p in module.parameters())


__all__ = ["deferred_init", "is_deferring", "DeferredParameterError", "DeferredInit", "name_deferred",
           "has_deferred", "deferred_bytes", "fill_bytes"]
