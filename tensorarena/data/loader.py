"""Shuffled mini-batches copied into persistent buffers (no per-step allocation)."""

from __future__ import annotations

import numpy as np


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
        if len(inputs) != len(targets):
            raise ValueError(f"inputs have {len(inputs)} rows but targets have {len(targets)}")
        if not 0 < batch_size <= len(inputs):
            raise ValueError(f"batch_size must be in 1..{len(inputs)} (the data set size), got {batch_size}")
        self.inputs, self.targets, self.batch_size, self.rng = inputs, targets, batch_size, rng
        self._x = np.empty((batch_size,) + inputs.shape[1:], inputs.dtype)
        self._y = np.empty((batch_size,) + targets.shape[1:], targets.dtype)
        self._order = np.empty(0, dtype=np.int64)
        self._cursor = 0

    def state(self) -> dict:
        """JSON-able position: RNG state, the current epoch's order and the cursor in it."""
        return {"rng": self.rng.bit_generator.state, "order": self._order.tolist(), "cursor": self._cursor}

    def load_state(self, state: dict) -> None:
        """Restore a position from state(); ValueError if it is not one in this data set (a saved order is a
        shuffle of its rows: from a data set of another size it indexes past this one's end, or
        misses rows, and an IndexError would come only at a later step)."""
        order = np.asarray(state["order"], dtype=np.int64)
        cursor = int(state["cursor"])
        n = len(self.inputs)
        if len(order) not in (0, n):
            raise ValueError(f"the loader's saved position is in a data set of {len(order)} examples, and this "
                             f"one has {n}")
        if len(order) and not np.array_equal(np.sort(order), np.arange(n)):
            raise ValueError(f"the loader's saved order is not a shuffle of this data set's {n} examples")
        if not 0 <= cursor <= len(order):
            raise ValueError(f"the loader's saved cursor {cursor} is outside its order of {len(order)} examples")
        self.rng.bit_generator.state = state["rng"]
        self._order, self._cursor = order, cursor

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch, in the loader's reused buffers."""
        if self._cursor + self.batch_size > len(self._order):
            self._order = self.rng.permutation(len(self.inputs))
            self._cursor = 0
        idx = self._order[self._cursor:self._cursor + self.batch_size]
        self._cursor += self.batch_size
        np.take(self.inputs, idx, axis=0, out=self._x)
        np.take(self.targets, idx, axis=0, out=self._y)
        return self._x, self._y
