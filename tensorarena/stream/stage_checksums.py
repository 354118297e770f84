"""Checksums of the streaming store's stage files: recorded when a store is closed, checked when it is opened.

Why at close and open, not at every stage write: a CRC32 reads every byte (zlib.crc32 ran at 2.7 GB/s on one
core of this machine), and a ViT-Base step moves 1.3 GB of stages, so checking each step would cost ~0.5 s, half
a mapped step's time, on the two cores the step computes on. The files change only inside steps, each of which is
journaled (store_manifest.py refuses a store a step left half written); what a checksum adds is the damage done to
them between runs: a disk error, a copy cut short, another program writing there. Before this, garbage bytes in a
stage (3.0 written over its weights) trained on silently.

A store closed by its process (route.close(), to_memory(), a trainer dropped, the interpreter exiting: see
`close_open_stores`) is sealed: its manifest gets each stage file's CRC32 at the store's data step. Opening checks
them and refuses a file that changed. A store whose run was killed was never sealed; it opens unchecked, and a
warning says so. Any later commit (a step, a checkpoint load) drops the seal: the stages it covered changed.
"""

from __future__ import annotations

import mmap
import os
import weakref
import zlib
from typing import Any

from .store_files import StoreError, _name_file

SEAL = "seal"  # the manifest's field: {"data_step": s, "files": [...], "crc32": [...]}
CHUNK_BYTES = 1 << 20  # one read buffer, so checking a store holds 1 MiB, not a stage

_open_stores: "weakref.WeakSet" = weakref.WeakSet()


def file_crc32(fd: int, nbytes: int, path) -> int:
    """CRC32 of the first `nbytes` of the open file `fd` (read through one CHUNK_BYTES buffer)."""
    # An anonymous mapping, not malloc's: a freed 1 MiB block would raise glibc's mmap threshold, and the next
    # buffers of that size would come from the heap and stay resident (train/tensor_file.py's _fresh).
    buffer = memoryview(mmap.mmap(-1, min(CHUNK_BYTES, max(nbytes, 1))))
    crc, done = 0, 0
    try:
        while done < nbytes:
            n = os.preadv(fd, [buffer[:min(len(buffer), nbytes - done)]], done)
            if n == 0:
                raise StoreError(f"{path} ended after {done} of {nbytes} bytes; the store was truncated: delete it "
                                 f"and resume from a checkpoint")
            crc = zlib.crc32(buffer[:n], crc)
            done += n
    except OSError as exc:
        raise _name_file(exc, path)
    return crc


def seal_entry(data_step: Any, files: list[str], crcs: list[int]) -> dict[str, Any]:
    return {"data_step": data_step, "files": list(files), "crc32": list(crcs)}


def seal_matches(manifest: dict[str, Any], files: list[str]) -> bool:
    """Whether the manifest holds a seal of these files at its own data step (a later commit drops it)."""
    seal = manifest.get(SEAL)
    return (isinstance(seal, dict) and seal.get("data_step") == manifest.get("data_step")
            and seal.get("files") == list(files) and len(seal.get("crc32", ())) == len(files))


def damaged_stages(store, manifest: dict[str, Any]) -> list[str]:
    """The stage files whose bytes differ from the seal's checksums, described (empty: all as sealed)."""
    bad = []
    for k, (name, want) in enumerate(zip(store.files, manifest[SEAL]["crc32"])):
        path = store.directory / name
        got = file_crc32(store._fd(k), store.layouts[k].total_bytes, path)
        if got != want:
            bad.append(f"{name} (stage {store.layouts[k].stage.name!r}: CRC32 {got:#010x}, sealed {want:#010x})")
    return bad


def register(store) -> None:
    """Track an open store, so that one still open when the interpreter exits is sealed then."""
    _open_stores.add(store)


def close_open_stores() -> None:
    """At interpreter exit (registered by stream/store.py): close, and so seal, every store still open. Run by
    atexit, while modules and the filesystem are still usable; a store garbage-collected earlier sealed itself
    in ParamStore.__del__. A failure only leaves that store unsealed (its next open warns)."""
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:  # noqa: BLE001 - exiting: the store stays as committed, only unsealed
            pass
