"""The pages a streamed step's arenas make resident, which can exceed the most bytes they hold at once.

Each arena of a streamed step bumps in one reserved block (STEP_BLOCK_BYTES,
STAGE_BLOCK_BYTES below), and only the pages it touches become resident: every page up to the furthest
point its bump pointer reached. The arena reuses a dead buffer's bytes only for a later buffer that
fits there (best fit), so that point can lie past the stage's traced slab: vit-base's backward stage
arena reached 12.2 MiB for a 9.4 MiB high-water, and peak RSS went over the plan by the difference.
`touched_bytes` replays a traced stage's buffers through a real Arena, over a block that is reserved
but never written, and returns how far it reached.

The arenas take their blocks from a SmallPagePool: NumPy advises transparent huge pages for arrays of
4 MiB and more, and with them one touched byte brings a whole 2 MiB page in (vit-base's 6.8 MiB of
step-arena boundaries were 8.0 MiB resident, a small model's two arenas up to 4 MiB over its plan),
by as much as the kernel happens to have such pages free. Its blocks are advised MADV_NOHUGEPAGE, so
what becomes resident is the touched 4 KiB pages, which the plan counts exactly.
"""

from __future__ import annotations

import ctypes
import heapq
import logging
import mmap
import sys
from pathlib import Path

import numpy as np

from ..memory.arena import Arena
from ..memory.pool import ALIGN, MIN_BLOCK_BYTES, Block, BlockPool

PAGE = mmap.PAGESIZE
MADV_NOHUGEPAGE = 15  # <linux/mman.h>
_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
log = logging.getLogger("tensorarena")

# The block each arena of a streamed step (or predict) bumps in: one reserved block, of which only the pages an
# arena touches become resident, so its RSS is what it allocated. With the pool's default 1 MiB blocks, each
# allocation that did not fit opened a block of the next power of two and left the last one's tail behind, and
# the step and stage arenas swapped cached blocks of mixed classes: vit-base's arenas held 21.7 MiB of touched
# blocks for 16.7 MiB allocated (peak RSS 1.5% over the plan). Two different size classes, so the step arena
# never takes a block a stage arena touched deeper, nor the reverse (RSS would then grow at step 2). The blocks
# come from the route's own SmallPagePool (no 2 MiB pages: see the module docstring), whose touched pages the route
# plan counts ("arena pages").
STEP_BLOCK_BYTES = 32 << 20
STAGE_BLOCK_BYTES = 64 << 20


def block_sizes(pool: BlockPool) -> tuple[int, int]:
    """(step, stage) arena block bytes for the arenas of a streamed step taking blocks from `pool`: the sizes above,
    or for a pool with a budget (a user's Trainer(pool=BlockPool(budget=...))) the largest power of two up to
    them that lets the step arena and a stage arena each open a block and two more within the budget. The fixed
    64 + 32 MiB asked for every streamed step failed under any budget below 96 MiB, whatever the step needed (a
    ViT needing 45 KiB refused at 45 MiB, and so did route auto's fallback to streaming there)."""
    if pool.budget is None:
        return STEP_BLOCK_BYTES, STAGE_BLOCK_BYTES
    share = max(pool.budget // 4, MIN_BLOCK_BYTES)
    fitting = 1 << (share.bit_length() - 1)  # a power of two, as the pool's size classes are
    return min(STEP_BLOCK_BYTES, fitting), min(STAGE_BLOCK_BYTES, fitting)


class SmallPagePool(BlockPool):
    """A block pool whose blocks are advised MADV_NOHUGEPAGE (see the module docstring): the streamed step's.

    Each new block is an anonymous mapping of its own, not malloc's: malloc may serve a block from memory a
    freed array left resident (its heap, where the mmap threshold allows), and those pages would then count
    as the arena's. A fresh mapping holds no page until the arena touches it, which is what the plan counts.
    (Two fresh-clone CI runs found the step block 2.5 and 154 pages over its plan; no run alone did.)"""

    def _new_block(self, nbytes: int) -> Block:
        return _MappedBlock(nbytes)

    def acquire(self, nbytes: int) -> Block:
        block = super().acquire(nbytes)
        # At every hand-out, cached or new: one system call per arena block, and nothing to keep in step with
        # the blocks the pool evicts or trims.
        _no_huge_pages(block.buffer)
        return block


class _MappedBlock(Block):
    """A block over an anonymous private mapping (page-aligned, so ALIGN-aligned); unmapped when the block and
    every array over it are gone (the array holds the mapping)."""

    __slots__ = ()

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.buffer = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


class _ReservingPool(BlockPool):
    """A private pool that remembers where each block it hands out starts (its blocks are never written)."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[tuple[int, int]] = []  # (address, nbytes) per block

    def acquire(self, nbytes: int) -> Block:
        block = super().acquire(nbytes)
        self.starts.append((block.buffer.ctypes.data, block.nbytes))
        return block


def touched_bytes(lifetimes: list, block_bytes: int) -> int:
    """Bytes an Arena(block_bytes=block_bytes) touches for buffers with these lifetimes (planner BufferSpecs:
    allocated in `first` order, dead after `last`), in whole pages per block."""
    pool = _ReservingPool()
    arena = Arena(pool=pool, block_bytes=block_bytes, name="streaming arena replay")
    reached: dict[int, int] = {}  # block start -> furthest byte reached
    alive: list[tuple[int, int, np.ndarray]] = []  # heap of (last use, order, array)
    try:
        for order, spec in enumerate(sorted(lifetimes, key=lambda s: s.first)):
            while alive and alive[0][0] < spec.first:
                heapq.heappop(alive)  # its last reference: the arena takes the bytes back
            array = arena.alloc((spec.nbytes,), np.uint8)
            padded = (spec.nbytes + ALIGN - 1) // ALIGN * ALIGN or ALIGN
            start = next(s for s, n in pool.starts if s <= array.ctypes.data < s + n)
            reached[start] = max(reached.get(start, 0), array.ctypes.data + padded - start)
            heapq.heappush(alive, (spec.last, order, array))
        alive.clear()
    finally:
        arena.close()
    return sum(page_rounded(n) for n in reached.values())


def page_rounded(nbytes: int) -> int:
    """`nbytes` rounded up to whole pages: what touching them from a block's start makes resident."""
    return (nbytes + PAGE - 1) // PAGE * PAGE


_warned = False


def _no_huge_pages(buffer: np.ndarray) -> None:
    """Advise the whole pages of `buffer` MADV_NOHUGEPAGE. Where that fails on a kernel that may hand out huge
    pages, say once what it costs: the arenas may hold up to 2 MiB each more than the plan counts."""
    global _warned
    if not sys.platform.startswith("linux"):
        return
    begin = -(-buffer.ctypes.data // PAGE) * PAGE
    end = (buffer.ctypes.data + buffer.nbytes) // PAGE * PAGE
    if end <= begin:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.madvise(ctypes.c_void_p(begin), ctypes.c_size_t(end - begin), MADV_NOHUGEPAGE) == 0:
        return
    if _huge_pages_possible() and not _warned:
        _warned = True
        log.warning("streaming: madvise(MADV_NOHUGEPAGE) failed on an arena block (%s): the kernel may back the "
                    "streamed step's arenas with 2 MiB pages, up to 2 MiB each more than the route plan counts",
                    ctypes.get_errno())


def _huge_pages_possible() -> bool:
    """Whether this kernel may give anonymous memory 2 MiB pages (transparent huge pages not "never")."""
    try:
        return "[never]" not in _THP_SETTING.read_text()
    except OSError:  # no THP support compiled in
        return False


__all__ = ["SmallPagePool", "STEP_BLOCK_BYTES", "STAGE_BLOCK_BYTES", "touched_bytes", "page_rounded"]
