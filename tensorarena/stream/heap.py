"""Giving the heap pages of freed parameters back to the kernel once the streaming store holds them.

NumPy takes its arrays from malloc. glibc serves most of a model's parameter arrays from its heap (its mmap
threshold rises to the size of the first large block freed, often while the model is built), and free() of
a chunk inside the heap keeps its pages: RSS stayed ~81 MiB above the route plan's figure on vit-small after
the parameters moved to the store. malloc_trim(0) hands every free page back (madvise), so after the move RSS
is what the plan counts: the process without the parameters. Where there is no malloc_trim (not glibc) the
pages may stay, and the route plan counts the parameters for the whole run (HEAP_RETURNS_PAGES).
"""

from __future__ import annotations

import ctypes
import sys


def _find_malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # the C library this process already runs on
    except (OSError, AttributeError):  # musl and other C libraries have no malloc_trim
        return None


_MALLOC_TRIM = _find_malloc_trim()
HEAP_RETURNS_PAGES = _MALLOC_TRIM is not None


def return_freed_pages() -> bool:
    """Give the heap's free pages back to the kernel; False where this C library cannot (see module docstring)."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
