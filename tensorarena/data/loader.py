"""Shuffled mini-batches copied into persistent buffers (no per-step allocation)."""

from __future__ import annotations

import numpy as np

from ..random import rng_state


class BatchLoader:
    """Endless shuffled batches of (inputs, targets) from in-memory arrays.

    Each batch is copied into the same two persistent buffers, so the loader adds
    nothing to a step's memory; consume a batch before asking for the next.
    Args:
        inputs, targets: arrays with the same first dimension.
        batch_size: rows per batch (the last partial batch of an epoch is dropped).
        rng: explicit generator for the shuffles; its state is the loader's position.
    """

    def __init__(self, inputs: np.ndarray, targets: np.ndarray, batch_size: int, *, rng: np.random.Generator) -> None:
        for name, array in (("inputs", inputs), ("targets", targets)):
            # The batch buffers copy shape and dtype from the arrays; a list has neither.
            if not isinstance(array, np.ndarray):
                raise TypeError(f"{name} must be a NumPy array (or memmap), got {type(array).__name__}; "
                                f"pass np.asarray({name})")
            if array.ndim == 0:
                raise ValueError(f"{name} must have a first (example) dimension, got a 0-d array")
        if len(inputs) != len(targets):
            raise ValueError(f"inputs have {len(inputs)} rows but targets have {len(targets)}")
        if len(inputs) == 0:
            raise ValueError("the data set has no examples (inputs and targets have 0 rows): nothing to batch")
        # bool is an int to Python, but batch_size=True is a mistake, not a batch of one.
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an integer, got {type(batch_size).__name__} {batch_size!r}")
        if not 0 < batch_size <= len(inputs):
            raise ValueError(f"batch_size must be in 1..{len(inputs)} (the data set size), got {batch_size}")
        # The generator's state is the loader's position (state()); a RandomState has no bit_generator, and
        # would fail only when a checkpoint is saved, after the training it was meant to keep.
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}; pass "
                            f"rng=np.random.default_rng(seed)")
        batch_size = int(batch_size)
        self.inputs, self.targets, self.batch_size, self.rng = inputs, targets, batch_size, rng
        self._x = np.empty((batch_size,) + inputs.shape[1:], inputs.dtype)
        self._y = np.empty((batch_size,) + targets.shape[1:], targets.dtype)
        self._order = np.empty(0, dtype=np.int64)
        self._cursor = 0
        self._before = None  # the position before the last next(), for rewind()

    def state(self) -> dict:
        """JSON-able position: RNG state, the current epoch's order and the cursor in it."""
        return {"rng": rng_state(self.rng), "order": self._order.tolist(), "cursor": self._cursor}

    def load_state(self, state: dict) -> None:
        """Restore a position from state(); ValueError if it is not one in this data set (a saved order is a
        shuffle of its rows: from a data set of another size it indexes past this one's end, or
        misses rows, and an IndexError would come only at a later step)."""
        if not isinstance(state, dict):
            raise TypeError(f"the loader's state must be a dict from BatchLoader.state(), got {type(state).__name__}")
        missing = [key for key in ("rng", "order", "cursor") if key not in state]
        if missing:
            raise ValueError(f"the loader's saved state lacks {', '.join(repr(k) for k in missing)}: pass the dict "
                             f"BatchLoader.state() returned")
        order = np.array(state["order"])  # a copy: the caller's list or array stays theirs
        # As for the cursor: a fractional index is no position state() writes, and casting it to int64 cut
        # [0.5, 1.5, ...] to a shuffle of the rows that resumed elsewhere with no word (hunt).
        if order.size and order.dtype.kind not in "iu":
            raise ValueError(f"the loader's saved order must hold integer example indices, got {order.dtype} values")
        order = order.astype(np.int64)
        if order.ndim != 1:
            raise ValueError(f"the loader's saved order must be a flat list of example indices, got shape "
                             f"{order.shape}")
        cursor = state["cursor"]
        # A fractional cursor is no position state() writes; cutting it to an int would resume elsewhere.
        if isinstance(cursor, bool) or not isinstance(cursor, (int, np.integer)):
            raise ValueError(f"the loader's saved cursor must be an integer, got {cursor!r}")
        cursor = int(cursor)
        n = len(self.inputs)
        if len(order) not in (0, n):
            raise ValueError(f"the loader's saved position is in a data set of {len(order)} examples, and this "
                             f"one has {n}")
        if len(order) and not np.array_equal(np.sort(order), np.arange(n)):
            raise ValueError(f"the loader's saved order is not a shuffle of this data set's {n} examples")
        if not 0 <= cursor <= len(order):
            raise ValueError(f"the loader's saved cursor {cursor} is outside its order of {len(order)} examples")
        try:
            self.rng.bit_generator.state = state["rng"]
        except (ValueError, TypeError, KeyError) as exc:
            # NumPy's own words ("state must be for a PCG64 PRNG", or a bare KeyError 'state') named neither the
            # loader nor what to do (hunt).
            saved = state["rng"].get("bit_generator") if isinstance(state["rng"], dict) else None
            raise ValueError(f"the loader's saved generator state ({saved or 'not a bit generator state'}) does not "
                             f"fit this loader's {type(self.rng.bit_generator).__name__} generator ({exc!r}): pass the "
                             f"dict BatchLoader.state() returned, to a loader whose rng has the saved run's bit "
                             f"generator (np.random.default_rng(seed) makes a PCG64)") from None
        self._order, self._cursor, self._before = order, cursor, None

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch, in the loader's reused buffers."""
        self._before = (self._order, self._cursor, None)  # for rewind(): the order is replaced, never written
        if self._cursor + self.batch_size > len(self._order):
            self._before = (self._order, self._cursor, self.rng.bit_generator.state)
            self._order = self.rng.permutation(len(self.inputs))
            self._cursor = 0
        idx = self._order[self._cursor:self._cursor + self.batch_size]
        try:
            # mode="clip": with the default "raise", NumPy fills `out` through a temporary the batch's size (its
            # documented buffering), 18 MiB a call for ViT-Base batch 32, which glibc kept resident. The indices
            # are a permutation's, so clipping never changes one.
            np.take(self.inputs, idx, axis=0, out=self._x, mode="clip")
            np.take(self.targets, idx, axis=0, out=self._y, mode="clip")
        except BaseException:
            # A batch that could not be read (a memmap's I/O error, no memory) was never returned: the position
            # stays before it, so a save after the error resumes with it.
            self.rewind()
            raise
        self._cursor += self.batch_size
        return self._x, self._y

    def rewind(self) -> None:
        """Undo the last next(): the position (and the generator, if that draw shuffled a new epoch) as before it,
        so that a step that failed on the batch saves a position whose next batch is that one again."""
        before = self._before
        if before is None:
            raise RuntimeError("rewind() undoes one next(), and there is none to undo")
        self._order, self._cursor, rng = before
        if rng is not None:
            self.rng.bit_generator.state = rng
        self._before = None
