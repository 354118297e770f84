"""The one default random generator (init, dropout, shuffling), `manual_seed`, `get_rng_state` and
`set_rng_state`.

Randomness is explicit everywhere (`rng=` arguments); this generator is only
what `rng=None` means. Like torch's global generator it starts from a fixed
seed, so an unseeded script is still reproducible, and `manual_seed` reseeds it
in place so every holder of it sees the new stream.
"""

from __future__ import annotations

import threading

import numpy as np

from .tape import host
from .tensor import Tensor

DEFAULT_SEED = 0

_default_generator = np.random.Generator(np.random.PCG64(DEFAULT_SEED))


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the default generator (weight init and dropout with rng=None); returns it."""
    _default_generator.bit_generator.state = np.random.PCG64(seed).state
    return _default_generator



# get_rng_state's bytes: PCG64's 128-bit state and increment, then its buffered half-draw (has_uint32, uinteger).
_STATE_BYTES = 16 + 16 + 1 + 4


def get_rng_state() -> Tensor:
    """The default generator's state (what manual_seed seeds) as a uint8 Tensor, for set_rng_state to restore, as
    torch.get_rng_state: the bytes are our PCG64's (37 of them), not torch's (5056), and neither takes the other's.
    A Tensor, so ta.save stores it with a checkpoint."""
    state = _default_generator.bit_generator.state
    raw = (state["state"]["state"].to_bytes(16, "little") + state["state"]["inc"].to_bytes(16, "little")
           + bytes([state["has_uint32"]]) + state["uinteger"].to_bytes(4, "little"))
    return Tensor(np.frombuffer(raw, dtype=np.uint8).copy())


def set_rng_state(new_state) -> None:
    """Put the default generator back in a state get_rng_state gave (in place: every holder of it follows), as
    torch.set_rng_state."""
    array = new_state.data if isinstance(new_state, Tensor) else new_state
    if type(new_state).__module__.split(".")[0] == "torch":
        raise TypeError("set_rng_state: this is torch's RNG state (torch.get_rng_state()); tensorarena's generator "
                        "is another one: pass what ta.get_rng_state() returned")
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
        dtype = f" of dtype {array.dtype}" if isinstance(array, np.ndarray) else ""
        raise TypeError(f"set_rng_state expects the uint8 Tensor ta.get_rng_state() returned, got "
                        f"{type(new_state).__name__}{dtype}")
    raw = array.tobytes()
    if array.shape != (_STATE_BYTES,) or raw[32] > 1 or not raw[16] & 1:  # a PCG64 increment is always odd
        raise ValueError(f"set_rng_state expects the {_STATE_BYTES} bytes ta.get_rng_state() returned; got an array "
                         f"of shape {array.shape} that is not one of them")
    _default_generator.bit_generator.state = {
        "bit_generator": "PCG64", "has_uint32": raw[32], "uinteger": int.from_bytes(raw[33:], "little"),
        "state": {"state": int.from_bytes(raw[:16], "little"), "inc": int.from_bytes(raw[16:32], "little")}}

# A job's one --seed seeds its data, its model's initialisation (and the dropout seeds drawn there) and the default
# generator. Generators seeded with the same integer are one stream: the MLP's first-layer weights were the digits'
# labels' deciles, draw for draw (a helper's hunt). The data keep np.random.default_rng(seed); every other purpose
# draws from a child of the seed's SeedSequence of its own (spawn_key), which no integer seed reproduces.
INIT_STREAM, DEFAULT_STREAM = 1, 2


def seed_stream(seed: int, purpose: int) -> np.random.Generator:
    """The generator of `seed` for one purpose (INIT_STREAM, DEFAULT_STREAM): independent of default_rng(seed)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(purpose,))))


def manual_seed_job(seed: int) -> np.random.Generator:
    """Reseed the default generator for a job run with `seed`: its own stream, not the data's (seed_stream)."""
    _default_generator.bit_generator.state = seed_stream(seed, DEFAULT_STREAM).bit_generator.state
    return _default_generator


# How many times this thread was handed the default generator (get_generator(None), default_generator()). A
# step that saves the generators and restores them afterwards (a fused trace, a capture's passes, a failed step)
# leaves the default one alone unless its own thread asked for it in between: otherwise the restore rewound the
# draws another thread's model made meanwhile, which then repeated its dropout masks (tests/test_threads_hunt.py).
_asks = threading.local()


def default_asks() -> int:
    """How many times this thread has been handed the default generator so far."""
    return getattr(_asks, "count", 0)


def default_generator() -> np.random.Generator:
    """The generator used wherever `rng=None` is passed (counted as handed to this thread: default_asks)."""
    _asks.count = getattr(_asks, "count", 0) + 1
    return _default_generator


def peek_default_generator() -> np.random.Generator:
    """The default generator for bookkeeping that draws nothing (saving and restoring its state), not counted."""
    return _default_generator


def get_generator(rng: np.random.Generator | None = None) -> np.random.Generator:
    """`rng` itself, or the default generator when it is None."""
    if rng is None:
        _asks.count = getattr(_asks, "count", 0) + 1
        return _default_generator
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)) or None, "
                        f"got {type(rng).__name__}")
    return rng


class Seed:
    """One uint64 seed (dropout's mask hash), drawn from `rng` (the default generator if None) through
    tape.host: a captured fused step draws a new one on every replay, as the ops' own Python would.
    The kernels that use it read `value` inside their own recorded calls (ops.nn_ops.dropout,
    ops.attention), never a copy taken while recording."""

    __slots__ = ("rng", "value")

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng, self.value = get_generator(rng), 0
        host(self.draw)

    def draw(self) -> None:
        self.value = int(self.rng.integers(0, 2**64, dtype=np.uint64))


def rng_state(generator: np.random.Generator) -> dict:
    """A generator's state as JSON (checkpoints, a loader's position): MT19937, Philox and SFC64 keep NumPy arrays
    and scalars in theirs (PCG64 only ints), which json.dumps refuses; NumPy's state setters take the lists back."""
    return _plain(generator.bit_generator.state)


def _plain(value):
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value
