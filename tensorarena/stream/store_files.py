"""The streaming store's error, its stage file names and the small filesystem helpers its modules share.

Kept apart from ParamStore (stream/store.py) so that the stage I/O (stream/store_io.py) and the manifest and
journal code use one definition of each: how a file is named, how an OSError names the file that failed,
how a temporary file is removed after a failure without hiding it.
"""

from __future__ import annotations

import os
from pathlib import Path


class StoreError(RuntimeError):
    """The streaming store cannot be used as asked; the message says what is wrong and what to do."""


def ensure_writable_dir(where: Path) -> None:
    """Create `where` and write and remove a probe file there; raises the OSError if that fails."""
    where.mkdir(parents=True, exist_ok=True)
    probe = where / f".write-probe-{os.getpid()}"
    with open(probe, "wb") as f:
        f.write(b"ok")
    probe.unlink()


def _stage_file(index: int, generation: int) -> str:
    """Stage `index`'s file name in layout generation `generation` (a `relayout` makes the next one)."""
    return f"stage-{index:04d}.bin" if generation == 0 else f"stage-{index:04d}.g{generation}.bin"


def _generation_of(name: str) -> int:
    """The layout generation in a stage file's name (see _stage_file)."""
    parts = name.split(".")  # stage-NNNN.bin or stage-NNNN.gG.bin
    return int(parts[1][1:]) if len(parts) == 3 and parts[1][:1] == "g" and parts[1][1:].isdigit() else 0


def _name_file(exc: OSError, path: Path) -> OSError:
    """`exc` naming `path` if it names no file (os.pwrite and friends on a descriptor name none), so the
    error says which file of the store failed, with its errno."""
    if exc.filename is None:
        exc.filename = str(path)
    return exc


def _unlink_quietly(path: Path) -> None:
    """Remove a temporary file after a failure, never hiding that failure: where the directory refuses the
    unlink too (read-only, removed), the file stays, and the next write of it truncates or replaces it."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"
