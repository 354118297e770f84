"""Work between fused steps (evaluation, a probe forward) in the fused slab's memory instead of new memory.

A fused step's slab holds only that step's transient buffers: every replay writes a buffer before it reads
it (the captured replay's checks prove it: compile/captured.py, pass 3), so between two steps its bytes are
dead. An eval forward in an ordinary arena took new blocks from the pool beside the held slab, memory the
route plan never counted (mlp: +2.4 MiB at the default eval batch of 1024; vit-tiny +1.6 MiB at its training
batch). `slab_arena` gives such work an arena whose first block is the slab itself, so a forward that fits
the slab (an eval forward at the training batch size keeps no activations for backward: it does) holds
nothing beyond what the plan counts. What does not fit takes ordinary pool blocks, and a warning says how
much beyond the plan that was: not silently.
"""

from __future__ import annotations

import logging

import numpy as np

from ..memory.arena import Arena
from ..memory.meter import format_bytes
from ..memory.pool import Block, BlockPool, default_pool, size_class

log = logging.getLogger("tensorarena")


class _SlabBlock(Block):
    """A pool Block over memory the fused plan owns (its slab): lent, never allocated or freed here."""

    __slots__ = ()

    def __init__(self, buffer: np.ndarray) -> None:  # no super().__init__: that would allocate
        self.nbytes = buffer.nbytes
        self.buffer = buffer


class SlabLender:
    """The block source of a `slab_arena`: the slab as the first block, then blocks of `pool` (counted)."""

    def __init__(self, slab: np.ndarray, pool: BlockPool) -> None:
        self.slab = slab
        self.pool = pool
        self.lent = False
        self.overflow_bytes = 0  # pool blocks taken because the slab was too small or already lent

    def acquire(self, nbytes: int) -> Block:
        if not self.lent and nbytes <= self.slab.nbytes:
            self.lent = True
            return _SlabBlock(self.slab)
        self.overflow_bytes += size_class(nbytes)
        return self.pool.acquire(nbytes)

    def release(self, block: Block) -> None:
        if isinstance(block, _SlabBlock):
            self.lent = False
            return
        self.pool.release(block)


class _SlabArena(Arena):
    """An arena over a SlabLender that warns, when it closes, if it needed memory beyond the slab."""

    warn = True  # False: the caller has said it once already (evaluate's later batches)

    def close(self) -> None:
        if not self.closed and self.pool.overflow_bytes and self.warn:
            log.warning("%s needed %s beyond the fused slab's %s (its high-water was %s): that memory is not in the "
                        "route plan; evaluate at the training batch size to stay within it", self.name,
                        format_bytes(self.pool.overflow_bytes), format_bytes(self.pool.slab.nbytes),
                        format_bytes(self.stats.high_water))
        super().close()


def beyond_slab(arena: Arena) -> bool:
    """Whether `arena` (from slab_arena) took memory beyond the slab."""
    return isinstance(arena, _SlabArena) and arena.pool.overflow_bytes > 0


def slab_arena(fused, *, name: str, pool: BlockPool | None = None, warn: bool = True) -> Arena:
    """An arena for work between steps of `fused` (a FusedStep) that takes the largest slab it holds first
    (see the module docstring); an ordinary arena of `pool` when it holds none yet (no step traced).
    Not while a step runs: the step writes the slab (Trainer's steps and evaluate run in one thread)."""
    pool = pool or default_pool()
    plans = list(fused.plans.values()) if fused is not None else []
    if not plans:
        return Arena(pool=pool, name=name)
    slab = max((plan.slab for plan in plans), key=lambda s: s.nbytes)
    arena = _SlabArena(pool=SlabLender(slab, pool), block_bytes=slab.nbytes, name=name)
    arena.warn = warn
    return arena
