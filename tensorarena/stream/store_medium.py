"""Where a streaming store's bytes live: on a disk, or in memory because its directory is on tmpfs.

The streaming route exists to keep parameters and optimizer state out of memory. A store on tmpfs (/dev/shm, or a
temporary directory where /tmp is tmpfs, as on many distributions) keeps them in memory after all: tmpfs pages are
shared memory, charged to the memory cgroup of the process that writes them, and ParamStore allocates every stage
file in full when it creates the store (posix_fallocate). A run the plan said fits was killed by the kernel's OOM
killer at the first step (a hunt: a 96 MiB limit, a 160 MiB store on /dev/shm).

So the plan counts a store on such a filesystem as memory (train/route_plan.py), the route says so when it opens
one, and a temporary store goes where a disk is (`temporary_store_parent`).
"""

from __future__ import annotations

import os
import re
import tempfile

# Filesystems whose files are pages of memory: tmpfs (and its shmem), ramfs (never swapped), and hugetlbfs.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


def filesystem_type(path: str | os.PathLike) -> str | None:
    """The type of the filesystem `path` is (or would be) on, from the longest mount point above it in
    /proc/self/mounts; None where that cannot be read (not Linux). A path not made yet is placed by the nearest
    directory above it that exists (the one it will be made in)."""
    where = os.path.realpath(os.path.abspath(os.fspath(path)))
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        with open("/proc/self/mounts", "rb") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    target = os.fsencode(where)
    best, kind = b"", None
    for fields in mounts:
        if len(fields) < 3:
            continue
        # Mount points escape a space, tab, newline or backslash as octal (\040): undone so they compare.
        point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[1])
        inside = target == point or target.startswith(point.rstrip(b"/") + b"/")
        if inside and len(point) >= len(best):  # a later mount on the same point hides an earlier one
            best, kind = point, os.fsdecode(fields[2])
    return kind


def in_memory_filesystem(path: str | os.PathLike) -> str | None:
    """The filesystem type when `path` is on one whose files are memory (tmpfs, ramfs), else None."""
    kind = filesystem_type(path)
    return kind if kind in MEMORY_FILESYSTEMS else None


def temporary_store_parent() -> str:
    """The directory a temporary store (no store_dir given) is made in: the temporary directory Python picks
    (TMPDIR, /tmp, ...) where it is on a disk; where it is on tmpfs, /var/tmp (a disk by the filesystem
    hierarchy's convention) if that is on a disk and writable. Else the temporary directory after all: the plan
    then counts the store as memory and says so (train/route_plan.py)."""
    default = tempfile.gettempdir()
    if in_memory_filesystem(default) is None:
        return default
    fallback = "/var/tmp"
    if os.path.isdir(fallback) and os.access(fallback, os.W_OK | os.X_OK) and in_memory_filesystem(fallback) is None:
        return fallback
    return default
