"""The one default random generator (init, dropout) and `manual_seed`.

Randomness is explicit everywhere (`rng=` arguments); this generator is only
what `rng=None` means. Like torch's global generator it starts from a fixed
seed, so an unseeded script is still reproducible, and `manual_seed` reseeds it
in place so every holder of it sees the new stream.
"""

from __future__ import annotations

import numpy as np

DEFAULT_SEED = 0

_default_generator = np.random.Generator(np.random.PCG64(DEFAULT_SEED))


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the default generator (weight init and dropout with rng=None); returns it."""
    _default_generator.bit_generator.state = np.random.PCG64(seed).state
    return _default_generator


def default_generator() -> np.random.Generator:
    """The generator used wherever `rng=None` is passed."""
    return _default_generator


def get_generator(rng: np.random.Generator | None = None) -> np.random.Generator:
    """`rng` itself, or the default generator when it is None."""
    if rng is None:
        return _default_generator
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)) or None, "
                        f"got {type(rng).__name__}")
    return rng
