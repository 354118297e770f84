"""Process memory readings: resident set size now and at its peak."""

from __future__ import annotations

import math

import os
import resource
import sys

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process now, in bytes (cheap: one /proc read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:  # not Linux: psutil is slower but portable
        import psutil

        return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    """Highest resident set size this process has reached, in bytes."""
    # VmHWM belongs to this program's address space. ru_maxrss is not reset by exec, so a
    # command started from a big process (a test runner) would report its parent's peak.
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def format_bytes(n: float) -> str:
    """Human-readable size: 1.50 GiB, 12.0 MiB, 512 B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        # Also where the unit below would round up to 1024 of it: 1 MiB less a byte is "1.00 MiB", not the
        # "1024.00 KiB" a table shows nowhere else.
        if abs(n) >= size or (size > 1 << 10 and round(abs(n) / (size >> 10), 2) >= 1024):
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def format_bytes_up(n: float) -> str:
    """format_bytes rounded up, never down: for advice ("raise the limit to at least ..."), which must be
    enough when followed to the letter."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        # As format_bytes, the next unit where the one below would round (up) to 1024 of it.
        if n >= size or (size > 1 << 10 and math.ceil(n / (size >> 10) * 100) / 100 >= 1024):
            return f"{math.ceil(n / size * 100) / 100:.2f} {unit}"
    return f"{math.ceil(n)} B"
