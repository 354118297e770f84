"""ParamStore: every parameter and optimizer-state array of a model, in one file per stage on disk.

Why files and not memory: the streaming route trains models whose parameters plus optimizer
state do not fit in RAM. Only two stages are resident ("slots"): the stage being computed and
the one a background thread is bringing in next, so resident memory is two stages whatever the
depth, and the page cache (which the kernel can drop) holds the rest. How a slot gets its stage:

  io="map" (default)  the stage file is memory-mapped (MAP_SHARED, its page tables filled on the
                      I/O thread: see StageIO._map), so the arrays ARE the file's page-cache pages:
                      nothing is copied in, and the optimizer's writes go straight to the file
                      (the kernel writes them back). The mapping is dropped when the stage is
                      written.
  io="copy"           two slot buffers, filled with os.preadv and written back with os.pwritev.

Why mapping is the default, with measurements: stream/store_io.py, which reads and writes the stages.
Opening and checking a store, its commits and its journal (the ordering below): stream/store_manifest.py.

Per stage file, at 64-byte aligned offsets: the parameters (first, so the forward pass can
read just them), then each state kind's arrays, then a (params, scalar kinds) float64 table
(stream/store_layout.py).

manifest.json says what the files hold: the model signature (stage names; parameter names,
shapes, dtypes in order), the optimizer class and its state kinds, the step count, the
schedule position, RNG states, the optimizer hyperparameters, and per stage the step whose
update it holds. journal.json follows the step in flight: which stage is being written and
which are done. It is tiny, so rewriting it twice per stage costs O(stages) per step, where
rewriting the manifest (which grows with the model) would cost O(stages^2).

Crash ordering, for a run killed at any instant (a process kill; pass durable=True to also
fsync against power loss):

  create:  stage files are written, then the manifest appears (no manifest = unfinished)
  step s:  room for the manifest allocated (.manifest.json.next, `reserve_commit`: a full disk fails here,
           before anything changed) -> per stage: journal "writing k" -> stage k's data -> journal "k written";
           after the last stage: manifest at step s (every stage, RNG, schedule) written into that room, one rename
  a failure: one of a data write (copy), its journal entries or the manifest commit stops the step and is raised,
           naming the file and errno; the route then knows from `changed` whether a stage file changed (see
           StreamingRoute: nothing changed -> take the step again; commit failed -> retry the commit)

With io="map" the stage's pages change while the optimizer runs, so the route journals
"writing k" (`begin_write`) before it updates stage k, not when the write is queued; two stages
can be "writing" at once (one being updated, the previous one being flushed), so the journal
keeps a list of them.

A journal for a step later than the manifest's says how far that step got, so opening a
store tells a finished run (no stage of a later step written) from an interrupted one (a
stage being written, or some stages at step s and the others at s - 1), and refuses the
latter rather than mixing two steps' weights.

Outside a step (a checkpoint loaded, optimizer state moved in, stream/follow.py):

  rewrite: journal {"rewrite": token} -> the stages' data -> manifest carrying the same token
           (a journal token the manifest lacks = interrupted: refused) -> empty journal
  relayout (more state kinds, e.g. momentum switched on): every stage written to a new file
           (stage-NNNN.gG.bin) -> manifest naming the new files, one rename -> old files removed
  move back in (the state, maybe changed, returns after to_memory(): create(keep_committed=True)):
           empty journal -> every stage written to a new file of the next generation -> manifest, one
           rename -> old files removed
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..memory.pool import aligned_bytes
# ParamStore in parts (store_layout.py: what a stage file holds where; store_files.py: file names and helpers;
# store_io.py: the slots and the I/O thread; store_manifest.py: opening, commits and the journal). __all__'s names
# stay importable from here, as before the split (MANIFEST, MANIFEST_ROOM and JOURNAL, which tests read, included);
# a test that patches a name must patch the module that looks it up, or the patch changes nothing.
from . import stage_checksums
from .store_files import (StoreError, _fmt, _fsync_dir, _generation_of, _stage_file, _unlink_quietly,
                          ensure_writable_dir)
from .store_layout import ArraySpec, StageLayout, StageSpec, StageViews, StoreSpec
from .store_manifest import JOURNAL, MANIFEST, MANIFEST_ROOM, StoreManifest
from .store_medium import in_memory_filesystem

log = logging.getLogger("tensorarena")


class ParamStore(StoreManifest):
    """A directory of stage files plus manifest.json; see the module docstring.

    Args:
        directory: where the files live; created if missing. Must be writable (checked now).
        spec: the stages and state kinds this store holds.
        durable: fsync data and manifest at each commit point (survives power loss, slower).
        io: "map" (stage files memory-mapped into the slots) or "copy" (read into and written from
            two slot buffers); see the module docstring.
    """

    def __init__(self, directory: str | os.PathLike, spec: StoreSpec, *, durable: bool = False,
                 io: str = "map") -> None:
        super().__init__(io, len(spec.stages))  # checks `io`; the slots' and the I/O thread's state: store_io.py
        # Absolute once, here: the stage files stay open by descriptor, but the manifest, journal and seal are
        # written by path, and a relative one followed os.chdir() (a step committed into another run's store).
        self.directory = Path(os.path.abspath(directory))
        self.durable = durable
        self.files = [_stage_file(i, 0) for i in range(len(spec.stages))]
        self.manifest: dict[str, Any] | None = None
        self._journal: dict[str, Any] = {}
        self._lock_fd: int | None = None
        self._manifest_lock = threading.Lock()
        # The step's manifest commit, reserved before the step changes any stage (reserve_commit): the open
        # file MANIFEST_ROOM and its allocated bytes, or None. _manifest_bytes sizes the next reservation.
        self._room: tuple[int, int] | None = None
        # The layout generation of self.files (create(keep_committed=True) may start a later one), and whether
        # other stage files here go once the manifest is committed (they held the store this one replaces).
        self.generation = 0
        self._superseded = False
        self._manifest_bytes = 0
        self._journal_lock = threading.Lock()  # io="map": begin_write (caller) and _write (I/O thread)
        self.sealed = False  # whether open() checked the stage files against their checksums (stage_checksums.py)
        self._set_spec(spec)
        self._check_writable()
        self._say_if_in_memory()
        self._take_lock()
        stage_checksums.register(self)

    def _set_spec(self, spec: StoreSpec) -> None:
        """Hold `spec`: its layouts and two slots sized for its largest stage (no slot may be in use)."""
        self.spec = spec
        self.layouts = [StageLayout(s, spec) for s in spec.stages]
        self.slot_bytes = max(layout.total_bytes for layout in self.layouts)
        # Two slots: one stage computes in one while the next stage is read into the other.
        # io="copy": two buffers. io="map": per slot (stage index, mmap, mapped bytes) or None; the mmap is
        # None for a stage of 0 bytes (see _read).
        self.slots = ([aligned_bytes(self.slot_bytes), aligned_bytes(self.slot_bytes)] if self.io == "copy"
                      else None)

    # -- construction checks ----------------------------------------------------
    def _check_writable(self) -> None:
        where = self.directory
        try:
            ensure_writable_dir(where)
        except OSError as exc:
            raise StoreError(
                f"cannot use {where} as a streaming store: {exc.strerror or exc} ({type(exc).__name__}). "
                f"The store writes every parameter and optimizer state there; pass a writable directory "
                f"(store_dir=...) on a disk with room for {_fmt(self.disk_bytes)}") from exc

    def _say_if_in_memory(self) -> None:
        # A store on tmpfs holds its files in memory (stream/store_medium.py): allowed (a machine with RAM to
        # spare may want it), never silent. route_plan counts it as memory when it plans the route.
        kind = in_memory_filesystem(self.directory)
        if kind is not None:
            log.warning("the streaming store %s is on %s, whose files are memory: its %s of parameters and "
                        "optimizer state count against the memory limit as if they were not streamed. Pass a "
                        "store_dir on a disk to keep them out of memory", self.directory, kind, _fmt(self.disk_bytes))

    def _take_lock(self) -> None:
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreError(
                    f"the streaming store {self.directory} is in use by another StreamingRoute (in this or "
                    f"another process); close that route first (route.close()) or use another directory") from None
            raise
        self._lock_fd = fd

    @property
    def disk_bytes(self) -> int:
        """Bytes the stage files take on disk."""
        return sum(layout.total_bytes for layout in self.layouts)

    @property
    def resident_bytes(self) -> int:
        """Bytes the two slots hold at most (buffers, or mapped stage pages), independent of depth."""
        return 2 * self.slot_bytes


    # -- creating -----------------------------------------------------------------
    def create(self, *, keep_committed: bool = False) -> None:
        """Start a new store here: drop any manifest and stage files, make empty files of the right sizes.

        keep_committed: a committed store here stays whole until this one's commit (the state moving back in
        after to_memory(), which leaves that store as it was): see _create_beside.
        """
        self.drain()
        if keep_committed and self.has_manifest():
            self._create_beside()
            return
        (self.directory / MANIFEST).unlink(missing_ok=True)  # first: a half-made store must look unfinished
        (self.directory / JOURNAL).unlink(missing_ok=True)
        self.manifest = None
        self._journal = {}
        for name in self.leftovers():
            (self.directory / name).unlink()
        free = shutil.disk_usage(self.directory).free
        if free < self.disk_bytes:
            raise StoreError(f"the streaming store needs {_fmt(self.disk_bytes)} on disk but {self.directory} has "
                             f"{_fmt(free)} free; free space or pass another store_dir")
        for i, layout in enumerate(self.layouts):
            self._allocate(i, layout.total_bytes)

    def _allocate(self, index: int, nbytes: int) -> None:
        """Stage `index`'s file at `nbytes`, its blocks allocated on the disk now. ftruncate made it sparse, and
        the free-space check above counts bytes, not the whole blocks they take: with a few pages too few, the
        first write through a mapping (io="map") found no block and the process died of SIGBUS, with no error and
        the state in memory lost. Allocated here, no room is a StoreError before any stage is written."""
        fd = self._fd(index)
        os.ftruncate(fd, nbytes)
        if not nbytes:
            return
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise StoreError(f"the streaming store needs {_fmt(self.disk_bytes)} on disk, and "
                             f"{self.directory / self.files[index]} could not be given its {_fmt(nbytes)} (no room "
                             f"left: the files take whole blocks); nothing was moved into the store. Free space or "
                             f"pass another store_dir") from exc

    def _create_beside(self) -> None:
        """New stage files next to the committed store's, in a layout generation no file here has yet; the
        commit's manifest rename switches to them and removes the others (as relayout does), so a kill before
        it leaves the committed store, and one after it the new one. Needs room for both meanwhile."""
        generation = 1 + max((_generation_of(name) for name in self.leftovers()), default=0)
        free = shutil.disk_usage(self.directory).free
        if free < self.disk_bytes:
            raise StoreError(f"moving the training state back into the streaming store needs {_fmt(self.disk_bytes)}"
                             f" on disk next to the committed store's files (they stay until the move is done), but "
                             f"{self.directory} has {_fmt(free)} free; nothing was changed and the state is still "
                             f"in memory. Free space, or delete the directory (the state in memory moves into a new "
                             f"store there)")
        # The committed store is consistent (the route that moved it out was usable), so its journal holds
        # nothing in flight; emptied now because a checkpoint load's rewrite token in it would make the new
        # manifest, which lacks that token, look like an interrupted rewrite.
        with self._journal_lock:
            self._replace(JOURNAL, {})
            self._journal = {}
        self.manifest = None
        self.generation = generation
        self.files = [_stage_file(i, generation) for i in range(len(self.layouts))]
        self._superseded = True
        for i, layout in enumerate(self.layouts):
            self._allocate(i, layout.total_bytes)


    def relayout(self, spec: StoreSpec, fill) -> None:
        """Lay every stage out again for `spec`: the same stages, more state kinds (momentum or amsgrad
        switched on mid-run). `fill(stage, param)` -> ({array kind: value}, {scalar kind: value}) for the
        kinds the store did not hold, and for a scalar kind it did hold that the new state restarts (SGD's
        step when its momentum buffer is first made); every other byte is copied.

        New files (the next layout generation) are written next to the old ones, then one manifest commit
        switches to them, then the old ones go: a kill at any point leaves the old store or the new one. A
        failure before the commit (e.g. no room on the disk, checked first) leaves the old store as it was.
        Holds two copies of one stage in memory at a time (old and new), as the two slots would.
        """
        if self.manifest is None:
            raise StoreError("relayout needs a committed store")
        self.release_slots()
        layouts = [StageLayout(stage, spec) for stage in spec.stages]
        generation = int(self.manifest.get("layout_generation", 0)) + 1
        files = [_stage_file(i, generation) for i in range(len(layouts))]
        need = sum(layout.total_bytes for layout in layouts)
        free = shutil.disk_usage(self.directory).free
        if free < need:
            raise StoreError(f"laying the streaming store out again for the optimizer state kinds {spec.state_arrays}"
                             f" needs {_fmt(need)} on disk next to the current files, but {self.directory} has "
                             f"{_fmt(free)} free; nothing was changed. Free space, or switch the setting back")
        try:
            for k, (layout, name) in enumerate(zip(layouts, files)):
                self._relayout_stage(k, layout, spec, self.directory / name, fill)
            if self.durable:
                _fsync_dir(self.directory)
            manifest = json.loads(json.dumps(self.manifest))  # a copy: self.manifest changes only once committed
            manifest["optimizer"].update(state_arrays=list(spec.state_arrays), state_scalars=list(spec.state_scalars))
            for entry, name in zip(manifest["stages"], files):
                entry["file"] = name
            manifest["layout_generation"] = generation
            with self._manifest_lock:
                self._replace(MANIFEST, manifest)
                self.manifest = manifest
        except BaseException:
            for name in files:
                _unlink_quietly(self.directory / name)  # never hides why the relayout failed
            raise
        old = self.files
        for i, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[i] = None
        self.files = files
        self.generation = generation
        self._set_spec(spec)
        self._remove_replaced(old)

    def _relayout_stage(self, k: int, layout: StageLayout, spec: StoreSpec, path: Path, fill) -> None:
        old_layout, stage = self.layouts[k], self.layouts[k].stage
        old = np.empty(old_layout.total_bytes, np.uint8)
        with open(self.directory / self.files[k], "rb") as f:
            if f.readinto(old) != old.nbytes:
                raise StoreError(f"{self.directory / self.files[k]} is shorter than its layout: the store is "
                                 f"damaged; delete it and resume from a checkpoint")
        new = np.zeros(layout.total_bytes, np.uint8)
        new[:layout.params_bytes] = old[:old_layout.params_bytes]  # parameters come first in both layouts
        n = len(stage.params)
        old_scalars = old[old_layout.scalar_offset:old_layout.scalar_offset + 8 * n * old_layout.n_scalars]
        old_scalars = old_scalars.view(np.float64).reshape(n, old_layout.n_scalars)
        new_scalars = new[layout.scalar_offset:layout.scalar_offset + 8 * n * layout.n_scalars]
        new_scalars = new_scalars.view(np.float64).reshape(n, layout.n_scalars)
        for i, a in enumerate(stage.params):
            array_fill, scalar_fill = fill(k, i)
            for kind, offset in ((kind, offsets[i]) for kind, offsets in layout.state_offsets.items()):
                target = new[offset:offset + a.nbytes]
                if kind in old_layout.state_offsets:
                    start = old_layout.state_offsets[kind][i]
                    target[:] = old[start:start + a.nbytes]
                else:
                    target.view(a.dtype).fill(array_fill[kind])
            for j, kind in enumerate(spec.state_scalars):
                if kind in scalar_fill:  # a new kind, or one the new arrays restart (SGD's step, a new buffer)
                    new_scalars[i, j] = scalar_fill[kind]
                else:
                    new_scalars[i, j] = old_scalars[i, self.spec.state_scalars.index(kind)]
        with open(path, "wb") as f:
            f.write(memoryview(new))
            if self.durable:
                f.flush()
                os.fsync(f.fileno())

    # -- closing ------------------------------------------------------------------
    def close(self) -> None:
        """Finish pending I/O, seal the store (its stage files' checksums into the manifest, stage_checksums.py),
        close the files and release the directory lock."""
        if self.closed:
            return
        try:
            self.drain()
            self._seal_quietly()
        finally:
            self.closed = True
            if self._io is not None:
                self._io.shutdown(wait=True)
            self.drop_reservation()
            for slot in range(len(self._maps)):
                self._release(slot)
            for i, fd in enumerate(self._fds):
                if fd is not None:
                    os.close(fd)
                    self._fds[i] = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing the descriptor drops the flock
                self._lock_fd = None

    def _seal_quietly(self) -> None:
        """Seal on close; a store that cannot take the commit (a read-only or full disk, a removed directory)
        stays as committed, unsealed, and closing goes on: a warning says so (its next open warns too). A directory
        already gone (a temporary store its trainer's finalizer removed before the store was collected, or at
        exit) has nothing to seal, and nothing is said."""
        if not self.directory.is_dir():
            return
        try:
            self.seal()
        except (OSError, StoreError) as exc:
            log.warning("streaming store %s closed without checksums of its stage files (%s); it holds what it held",
                        self.directory, exc)

    def __del__(self) -> None:
        # A route dropped without close(): give the descriptors and the directory lock back.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing useful to do at garbage collection
            pass


atexit.register(stage_checksums.close_open_stores)

__all__ = ["ParamStore", "StoreError", "StoreSpec", "StageSpec", "ArraySpec", "StageLayout", "StageViews",
           "MANIFEST", "MANIFEST_ROOM", "JOURNAL"]
