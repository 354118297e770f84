"""Scoped allocator for everything one training step creates.

`with Arena() as a:` makes `a` the current arena of this thread; every tensor an
op creates inside the block is carved out of blocks `a` borrows from the
process-wide `BlockPool`. Closing the arena (at any nesting depth) hands its
blocks back, so the next step reuses them and memory stays flat. A tensor that
outlives its arena's reset/close raises `StaleTensorError` when touched instead
of silently reading memory that now belongs to someone else.

Within a scope, memory is reused as soon as it is dead: every allocation is its
own NumPy base array (over a memoryview of the block, so views of it keep *it*
alive rather than the whole block), and a weak reference reports when the last
view is gone; its bytes go to a free list that later requests of the same scope
take first (best fit, neighbours merged). So an eager step's high-water is the
most bytes alive at once, as in PyTorch's caching allocator, not the sum of every
temporary the step ever made (DESIGN.md's arena bump-allocates; this keeps its
scope semantics and adds the reuse).
"""

from __future__ import annotations

import bisect
import operator
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from .pool import ALIGN, MIN_BLOCK_BYTES, ArenaOutOfMemory, Block, BlockPool, default_pool


class StaleTensorError(RuntimeError):
    """A tensor was used after the arena holding its memory was reset or closed."""


@dataclass
class ArenaStats:
    """What an arena holds now and the most it ever held."""

    bytes_in_use: int = 0
    high_water: int = 0
    blocks: int = 0
    allocations: int = 0


_local = threading.local()


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current_arena() -> "Arena | None":
    """The innermost open arena of this thread, or None (allocate from the heap)."""
    stack = _stack()
    return stack[-1] if stack else None


def _element_count(shape, dtype: np.dtype, name: str) -> int:
    """Elements of an array of `shape` (an int or a sequence of them, as np.empty takes), checked before the
    arena moves: a negative or non-integer dimension once sliced a wrong-sized array from the end of its slot,
    or left a float bump pointer that failed every later request."""
    if dtype.hasobject:
        raise TypeError(f"{name} cannot hold a {dtype} array: an arena's bytes hold numbers, not Python object "
                        f"references; make object arrays outside the arena (np.empty under heap_scope)")
    try:
        dims = (operator.index(shape),)  # np.empty(3): one dimension
    except TypeError:
        try:
            dims = tuple(shape)
        except TypeError:
            raise TypeError(f"{name} got shape {shape!r}: a shape is an integer or a sequence of integers") from None
    count = 1
    for dim in dims:
        try:
            dim = operator.index(dim)
        except TypeError:
            raise TypeError(f"{name} got shape {shape!r}: every dimension must be an integer, "
                            f"{dim!r} is a {type(dim).__name__}") from None
        if dim < 0:
            raise ValueError(f"{name} got shape {shape!r}: negative dimensions are not allowed")
        count *= dim
    return count


class Arena:
    """A nestable allocation scope; see the module docstring."""

    def __init__(self, *, pool: BlockPool | None = None, block_bytes: int = MIN_BLOCK_BYTES,
                 name: str = "arena") -> None:
        self.pool = pool or default_pool()
        self.block_bytes = block_bytes
        self.name = name
        self.generation = 0
        self.closed = False
        self.stats = ArenaStats()
        self._blocks: list[Block] = []
        self._bytes: list[memoryview] = []  # one memoryview per block, sliced per allocation
        self._block_index = 0  # the block we are bumping in
        self._offset = 0  # bump pointer inside that block
        self._free: dict[int, list[tuple[int, int]]] = {}  # block index -> sorted (start, size) dead chunks
        # The same dead chunks as (size, block, start), sorted: best fit is one bisect, where a scan of
        # every chunk cost ~12 us per allocation in an eager ViT-Tiny step (4 ms of ~450).
        self._by_size: list[tuple[int, int, int]] = []
        self._watch: dict[int, tuple] = {}  # id(weakref) -> (weakref, generation, block, start, size)
        # Deaths not yet taken back (see _dead): the free lists are changed only by the allocating thread and never
        # in the middle of an allocation.
        self._deaths: list[weakref.ref] = []
        self._busy = False
        self._thread = threading.get_ident()

    # -- scope -------------------------------------------------------------
    def __enter__(self) -> "Arena":
        if self.closed:
            raise RuntimeError(f"{self.name} is closed; create a new Arena for a new scope")
        stack = _stack()
        if any(open_arena is self for open_arena in stack):
            # Entered again while open, the inner block's exit closed it under the outer one: the outer block's
            # tensors went stale and its next allocation failed with "it is closed", naming no cause.
            raise RuntimeError(f"{self.name} is already open (its `with` block has not ended); an arena is one "
                               f"scope: nest a new ta.Arena() inside it instead")
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        stack = _stack()
        # Pop ourselves even if an inner scope forgot to exit: never leave a dead arena current.
        while stack:
            if stack.pop() is self:
                break
        self.close()

    # -- allocation --------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of `shape`/`dtype` carved from this arena."""
        if self.closed:
            raise StaleTensorError(f"cannot allocate from {self.name}: it is closed")
        dtype = np.dtype(dtype)
        count = _element_count(shape, dtype, self.name)
        nbytes = count * dtype.itemsize
        padded = (nbytes + ALIGN - 1) // ALIGN * ALIGN or ALIGN
        self._thread = threading.get_ident()
        self._busy = True
        try:
            if self._deaths:
                self._take_back_deaths()
            where = self._take_free(padded)
            if where is None:
                self._reserve(padded)
                where = (self._block_index, self._offset - padded)
        finally:
            self._busy = False
        block, start = where
        self.stats.allocations += 1
        self.stats.bytes_in_use += padded
        if self.stats.bytes_in_use > self.stats.high_water:
            self.stats.high_water = self.stats.bytes_in_use
        # Its own base array (over a memoryview, which is not an ndarray, so NumPy stops collapsing
        # bases there): when this array and every view of it are gone, the weakref fires.
        base = np.frombuffer(self._bytes[block][start:start + padded], np.uint8)
        ref = weakref.ref(base, self._dead)
        self._watch[id(ref)] = (ref, self.generation, block, start, padded)
        return base[:nbytes].view(dtype).reshape(shape)

    def _take_free(self, nbytes: int) -> tuple[int, int] | None:
        """Best-fit dead chunk of at least `nbytes` (smallest, then lowest block and address; the rest
        stays free), or None."""
        by_size = self._by_size
        i = bisect.bisect_left(by_size, (nbytes, -1, -1))
        if i == len(by_size):
            return None
        size, block, start = by_size.pop(i)
        chunks = self._free[block]
        j = bisect.bisect_left(chunks, (start, size))
        if size == nbytes:
            del chunks[j]
        else:
            chunks[j] = (start + nbytes, size - nbytes)
            bisect.insort(by_size, (size - nbytes, block, start + nbytes))
        return block, start

    def _forget(self, block: int, start: int, size: int) -> None:
        """Drop dead chunk (block, start, size) from the by-size index (it was merged or reused)."""
        by_size = self._by_size
        del by_size[bisect.bisect_left(by_size, (size, block, start))]

    def _dead(self, ref: weakref.ref) -> None:
        """An array's last reference went. That can happen in any thread (a queue's consumer drops it) and in the
        middle of an allocation (a garbage collection its Python triggers): changing the free lists there lost
        chunks or handed live memory out twice (29,208 held arrays overwritten in a two-thread hunt). So a death is
        only noted, and taken back at once only by the allocating thread outside an allocation; the others are
        taken back at that thread's next allocation. (list.append is atomic.)"""
        self._deaths.append(ref)
        if self._busy or threading.get_ident() != self._thread:
            return
        self._take_back_deaths()

    def _take_back_deaths(self) -> None:
        busy, self._busy = self._busy, True
        try:
            while self._deaths:
                self._take_back(self._deaths.pop())
        finally:
            self._busy = busy

    def _take_back(self, ref: weakref.ref) -> None:
        entry = self._watch.pop(id(ref), None)
        if entry is None or entry[1] != self.generation or self.closed:
            return  # from before a reset/close: that memory was already taken back wholesale
        _, _, block, start, size = entry
        self.stats.bytes_in_use -= size
        if block == self._block_index and start + size == self._offset:
            self._offset = start  # the top of the bump region: just move the pointer back
            chunks = self._free.get(block)
            while chunks and chunks[-1][0] + chunks[-1][1] == self._offset:
                below, below_size = chunks.pop()
                self._forget(block, below, below_size)
                self._offset = below
            return
        self._add_free(block, start, size)

    def _add_free(self, block: int, start: int, size: int) -> None:
        """Make (block, start, size) a free chunk, merged with the free chunks it touches."""
        chunks = self._free.setdefault(block, [])
        i = bisect.bisect(chunks, (start, size))
        if i < len(chunks) and start + size == chunks[i][0]:  # merge with the next dead chunk
            following = chunks.pop(i)
            self._forget(block, *following)
            size += following[1]
        if i > 0 and chunks[i - 1][0] + chunks[i - 1][1] == start:  # and with the previous one
            start, prev = chunks[i - 1]
            self._forget(block, start, prev)
            size += prev
            chunks[i - 1] = (start, size)
        else:
            chunks.insert(i, (start, size))
        bisect.insort(self._by_size, (size, block, start))

    def _reserve(self, nbytes: int) -> np.ndarray:
        blocks = self._blocks
        entry_position = (self._block_index, self._offset)
        left: list[tuple[int, int, int]] = []  # (block, start, size) tails the bump pointer moves past
        while self._block_index < len(blocks):
            block = blocks[self._block_index]
            if self._offset + nbytes <= block.nbytes:
                start = self._offset
                self._offset += nbytes
                self._free_tails(left)
                return block.buffer[start : start + nbytes]
            # A block (or, kept from before a reset, a whole one) too small for this request is left for the
            # next one; its free tail goes to the free chunks, where a smaller request finds it. It was lost
            # until reset before: 400 B, 1 MiB, 400 B under a 2 MiB budget ran out of memory with ~1 MiB free.
            if self._offset < block.nbytes:
                left.append((self._block_index, self._offset, block.nbytes - self._offset))
            self._block_index += 1
            self._offset = 0
        try:
            block = self.pool.acquire(max(nbytes, self.block_bytes))
        except MemoryError as exc:
            # Leave the arena exactly as it was so smaller requests still fit where they did.
            self._block_index, self._offset = entry_position
            if isinstance(exc, ArenaOutOfMemory) and exc.asked != nbytes:  # it named the arena's block size
                raise ArenaOutOfMemory(exc.requested, exc.budget, exc.in_use, exc.cached, asked=nbytes) from None
            raise
        self._free_tails(left)
        blocks.append(block)
        self._bytes.append(memoryview(block.buffer))
        self.stats.blocks = len(blocks)
        self._block_index = len(blocks) - 1
        self._offset = nbytes
        return block.buffer[:nbytes]

    def _free_tails(self, tails: list[tuple[int, int, int]]) -> None:
        # Only once the request is served: a failed one leaves the bump pointer where it was, in those tails.
        for block, start, size in tails:
            self._add_free(block, start, size)

    def holds(self, array: np.ndarray) -> bool:
        """Whether `array` may be memory of this arena (a bounds test against its blocks: cheap, never misses)."""
        return any(np.may_share_memory(array, block.buffer) for block in self._blocks)

    # -- lifetime ----------------------------------------------------------
    def reset(self) -> None:
        """Rewind to empty, keeping the blocks; tensors allocated before become stale."""
        self.generation += 1
        self._block_index = 0
        self._offset = 0
        self._free.clear()
        self._by_size.clear()
        self._watch.clear()  # their callbacks would only find an old generation
        self._deaths.clear()
        self.stats.bytes_in_use = 0

    def close(self) -> None:
        """Give every block back to the pool; tensors allocated here become stale."""
        if self.closed:
            return
        self.generation += 1
        self.closed = True
        self._free.clear()
        self._by_size.clear()
        self._watch.clear()
        self._deaths.clear()
        # Last block first: the pool hands cached blocks out last in, first out, so the next arena of this size
        # gets them in the order this one had them, and bumps through the same pages. In order, it got this one's
        # last block (touched only up to where it stopped) first, filled it, then this one's first: a stage of a
        # streamed step taking two blocks made both wholly resident (vit-small, 224 x 224, batch 16: 23 MiB over
        # its route plan from step 2 on).
        for block in reversed(self._blocks):
            self.pool.release(block)
        self._blocks.clear()
        self._bytes.clear()
        self.stats.blocks = 0
        self.stats.bytes_in_use = 0

    def __repr__(self) -> str:
        s = self.stats
        return (f"Arena({self.name!r}, in_use={s.bytes_in_use}, high_water={s.high_water}, "
                f"blocks={s.blocks}, allocations={s.allocations}, closed={self.closed})")


def arena_holding(array: np.ndarray) -> "Arena | None":
    """The innermost open arena of this thread whose memory `array` is, or None (heap, or another thread's)."""
    for arena in reversed(_stack()):
        if arena is not None and arena.holds(array):
            return arena
    return None


class heap_scope:
    """Route allocations to the heap inside this block, even under an open arena.

    Used for persistent memory created lazily mid-step (optimizer state, grad
    buffers): it must outlive the step arena.
    """

    def __enter__(self) -> None:
        _stack().append(None)

    def __exit__(self, *exc) -> None:
        stack = _stack()
        if stack and stack[-1] is None:
            stack.pop()


def empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Transient array from the current arena, or from the heap when none is open."""
    stack = _stack()
    arena = stack[-1] if stack else None
    if arena is None:
        return np.empty(shape, dtype)
    return arena.alloc(shape, dtype)
