"""Arenas, the block pool, memory budgets and meters."""

from .arena import Arena, StaleTensorError, current_arena, empty, heap_scope
from .pool import ArenaOutOfMemory, BlockPool, default_pool

__all__ = ["Arena", "ArenaOutOfMemory", "BlockPool", "StaleTensorError", "current_arena", "default_pool",
           "empty", "heap_scope"]
