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

import dataclasses
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
# store_io.py: the slots and the I/O thread). __all__'s names stay importable from here, as before the split;
# a test that patches a name must patch the module that looks it up, or the patch changes nothing.
from .store_files import (StoreError, _fmt, _fsync_dir, _generation_of, _name_file, _stage_file, _unlink_quietly,
                          ensure_writable_dir)
from .store_io import StageIO
from .store_layout import ArraySpec, StageLayout, StageSpec, StageViews, StoreSpec, _signature_diff

FORMAT = "tensorarena-stream-store"
VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_ROOM = ".manifest.json.next"  # the step's manifest commit is written here, then renamed (reserve_commit)
JOURNAL = "journal.json"

log = logging.getLogger("tensorarena")


class ParamStore(StageIO):
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
        self.directory = Path(directory)
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
        self._set_spec(spec)
        self._check_writable()
        self._take_lock()

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

    # -- what is there ------------------------------------------------------------
    def has_manifest(self) -> bool:
        """Whether the directory holds a committed store (a manifest)."""
        return (self.directory / MANIFEST).exists()

    def leftovers(self) -> list[str]:
        """Stage files present without a manifest: a creation that was interrupted."""
        return sorted(p.name for p in self.directory.glob("stage-*.bin"))

    def open(self) -> dict[str, Any]:
        """Read and check the manifest and files; returns the manifest or raises StoreError saying why not."""
        path = self.directory / MANIFEST
        try:
            text = path.read_text()
            manifest = json.loads(text)
        except FileNotFoundError:
            raise StoreError(f"{self.directory} holds no streaming store (no {MANIFEST}); create one with "
                             f"StreamingRoute.from_memory(...)") from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path} cannot be read ({exc}); the store is damaged: delete {self.directory} "
                             f"and resume from a checkpoint") from exc
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise StoreError(f"{path} is not a {FORMAT} v{VERSION} manifest (format {manifest.get('format')!r}, "
                             f"version {manifest.get('version')!r}); point store_dir at a streaming store")
        self._adopt(manifest)
        self._check_signature(manifest)
        self._check_files()
        self._check_steps(manifest, self._read_journal())
        self.manifest = manifest
        self._manifest_bytes = len(text.encode())
        return manifest

    def _adopt(self, manifest: dict[str, Any]) -> None:
        """Take from the manifest what a run may have changed since the optimizer was built: the stage files
        (laid out again by `relayout`) and the state kinds when they include this optimizer's (momentum or
        amsgrad switched on mid-run: resuming restores that setting too, from the manifest's param groups)."""
        files = [s.get("file") for s in manifest.get("stages", [])]
        if len(files) == len(self.files) and all(isinstance(f, str) and f == Path(f).name for f in files):
            self.files = files
        self.generation = int(manifest.get("layout_generation", 0))
        opt = manifest.get("optimizer", {})
        arrays, scalars = tuple(opt.get("state_arrays", ())), tuple(opt.get("state_scalars", ()))
        if (opt.get("class") == self.spec.optimizer and (arrays, scalars) != (self.spec.state_arrays,
                                                                             self.spec.state_scalars)
                and set(self.spec.state_arrays) <= set(arrays) and set(self.spec.state_scalars) <= set(scalars)):
            self._set_spec(dataclasses.replace(self.spec, state_arrays=arrays, state_scalars=scalars))

    def _check_signature(self, manifest: dict[str, Any]) -> None:
        mine, theirs = self.spec.signature(), manifest.get("signature")
        problems = []
        if theirs != mine:
            problems.append(_signature_diff(theirs or [], mine))
        opt = manifest.get("optimizer", {})
        if opt.get("class") != self.spec.optimizer:
            problems.append(f"it holds {opt.get('class')} state but the optimizer is {self.spec.optimizer}")
        elif (list(opt.get("state_arrays", [])) != list(self.spec.state_arrays)
              or list(opt.get("state_scalars", [])) != list(self.spec.state_scalars)):
            problems.append(f"its optimizer state kinds {opt.get('state_arrays')}/{opt.get('state_scalars')} differ "
                            f"from this optimizer's {list(self.spec.state_arrays)}/{list(self.spec.state_scalars)} "
                            f"(amsgrad or momentum changed)")
        if problems:
            raise StoreError(f"the streaming store {self.directory} was written for a different model or optimizer: "
                             + "; ".join(problems) + ". Use a new directory for this model, or delete this one "
                             "(its training state is lost) or resume with the model it was made for")

    def _check_files(self) -> None:
        bad = []
        for name, layout in zip(self.files, self.layouts):
            path = self.directory / name
            if not path.exists():
                bad.append(f"{name} (stage {layout.stage.name!r}) is missing")
            elif path.stat().st_size != layout.total_bytes:
                bad.append(f"{name} (stage {layout.stage.name!r}) has {path.stat().st_size} bytes, expected "
                           f"{layout.total_bytes}")
        if bad:
            raise StoreError(f"the streaming store {self.directory} is damaged: " + "; ".join(bad)
                             + ". Delete the directory and resume from a checkpoint (or restart training)")

    def _read_journal(self) -> dict[str, Any]:
        try:
            return json.loads((self.directory / JOURNAL).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.directory / JOURNAL} cannot be read ({exc}); the store is damaged: delete "
                             f"{self.directory} and resume from a checkpoint") from exc

    def _check_steps(self, manifest: dict[str, Any], journal: dict[str, Any]) -> None:
        names = [s["name"] for s in manifest.get("stages", [])]
        data_step = manifest.get("data_step")
        at = {name: s.get("step") for name, s in zip(names, manifest.get("stages", []))}
        rewrite = journal.get("rewrite")
        if rewrite is not None:
            if rewrite != manifest.get("rewrite"):
                raise StoreError(
                    f"the streaming store {self.directory} was interrupted while {journal.get('what', 'rewriting')}:"
                    f" its stages may hold a mix of the old and the new state. Delete the directory and resume "
                    f"from a checkpoint")
            journal = {}  # the manifest committed that rewrite: nothing is in flight
        step = journal.get("step")
        if step is not None and data_step is not None and step > data_step:  # a step that never committed
            writing = journal.get("writing")
            writing = [writing] if isinstance(writing, int) else (writing or [])  # an int before io="map"
            if writing:
                raise StoreError(
                    f"the streaming store {self.directory} was interrupted while writing stage "
                    f"{names[writing[0]]!r} of step {step}: its file holds a mix of two steps. Delete the "
                    f"directory and resume from a checkpoint")
            written = journal.get("written", [])
            if len(written) == len(names):
                raise StoreError(
                    f"the streaming store {self.directory} was stopped at the very end of step {step} (killed, or "
                    f"its manifest commit failed): every stage holds its update but the manifest (step count, "
                    f"RNG and schedule) still says step "
                    f"{data_step}. Delete the directory and resume from a checkpoint")
            at.update({names[k]: step for k in written})
        by_step: dict[Any, list[str]] = {}
        for name, value in at.items():
            by_step.setdefault(value, []).append(name)
        if set(by_step) != {data_step}:
            detail = "; ".join(f"step {k}: {', '.join(v[:6])}{' ...' if len(v) > 6 else ''}"
                               for k, v in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))
            raise StoreError(
                f"the streaming store {self.directory} is inconsistent: the run was killed in the middle of step "
                f"{max(k for k in by_step if k is not None)}, so its stages hold different steps ({detail}; the "
                f"manifest's last complete step is {data_step}). Training on it would mix weights of different "
                f"steps: delete the directory and resume from a checkpoint")

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
            fd = self._fd(i)
            os.ftruncate(fd, layout.total_bytes)

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
            os.ftruncate(self._fd(i), layout.total_bytes)

    def commit(self, **fields: Any) -> None:
        """Update manifest fields and write it atomically (after all pending writes finished).

        self.manifest changes only once the write succeeded: a failed commit leaves it the committed one (as on
        disk), so the route can take the same commit again once the cause is fixed (StreamingRoute.retry_commit).
        """
        self.drain()
        with self._manifest_lock:
            manifest = dict(self.manifest) if self.manifest is not None else {"format": FORMAT, "version": VERSION}
            manifest.update(fields)
            self._replace(MANIFEST, manifest)
            self.manifest = manifest
        if self._superseded:
            # Committed: the stage files of the store this one replaced (and of any move killed before) go.
            self._superseded = False
            self._remove_replaced([name for name in self.leftovers() if name not in self.files])

    def _remove_replaced(self, names: list[str]) -> None:
        """Remove stage files a commit just replaced. The commit holds whatever happens here: a file the directory
        refuses to remove (EACCES, EROFS) stays, said in a warning, and the step or move is not failed for it."""
        for name in names:
            try:
                (self.directory / name).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("streaming store: could not remove %s, which a committed store replaced (%s); it holds "
                            "nothing the store uses: delete it to free its space", self.directory / name, exc)

    def reserve_commit(self, step: int) -> None:
        """Before `step` changes any stage: allocate on disk the room its manifest commit will be written into.

        The manifest is the largest file a step writes and the last: on a nearly full disk its write would
        fail after every stage was updated in place, when the step can neither be undone nor committed. Failing
        here (ENOSPC) leaves nothing of the step written. The room is twice the last manifest plus a page: a
        step changes only fields of about the same size (RNG, schedule, hyperparameters). One open and one
        fallocate per step; no byte is written here, and the commit writes its bytes into the room as before.
        """
        self.drop_reservation()
        self._check_files_linked(step)
        size = 2 * self._manifest_bytes + 4096
        path = self.directory / MANIFEST_ROOM
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:  # a read-only or unwritable directory: found before anything changed
            _name_file(exc, path)
            exc.add_note(f"the streaming store {self.directory} cannot take step {step}'s manifest: nothing of "
                         f"step {step} was written and the store still holds step {step - 1}. Fix the cause "
                         f"(permissions, a read-only mount) and take the step again")
            raise
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            os.close(fd)
            _unlink_quietly(path)
            _name_file(exc, path)
            cause = ("has no room for" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                     else f"failed ({errno.errorcode.get(exc.errno, exc.errno)}) to allocate")
            exc.add_note(f"the streaming store {self.directory} {cause} step {step}'s manifest "
                         f"({_fmt(size)}), reserved before any stage changes: nothing of step {step} was "
                         f"written. {'Free space on that disk' if 'room' in cause else 'Fix the cause'} and "
                         f"take the step again")
            raise
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._room = (fd, size)

    def lost_files(self) -> list[str]:
        """What was removed under the run (rm -r, a cleaner of /tmp): the directory, or stage files; empty if
        nothing. The open descriptors still reach a removed file's data, so training on would go on into files
        no path names, every commit naming them, and all of it would vanish when the process ends."""
        if not self.directory.is_dir():
            return [f"the directory {self.directory} itself"]
        return [str(self.directory / name) for name, fd in zip(self.files, self._fds)
                if (os.fstat(fd).st_nlink == 0 if fd is not None else not (self.directory / name).exists())]

    def _check_files_linked(self, step: int) -> None:
        """Refuse a step when the store directory or a stage file was removed under the run (lost_files)."""
        gone = self.lost_files()
        if gone:
            raise StoreError(
                f"the streaming store lost {', '.join(gone[:4])}{' ...' if len(gone) > 4 else ''}: removed while "
                f"the run trained. Nothing of step {step} was written, and this process still holds the whole "
                f"training state of step {step - 1} (its files stay open): bring it back with "
                f"trainer.stream.to_memory() (or route.to_memory()), then the next step writes a new store in "
                f"{self.directory}; or save a checkpoint (trainer.save(path)) first")

    def drop_reservation(self) -> None:
        """Give back the room reserve_commit took (a step that failed, or a store being closed)."""
        room, self._room = self._room, None
        if room is not None:
            os.close(room[0])
            _unlink_quietly(self.directory / MANIFEST_ROOM)

    def _replace(self, name: str, content: dict[str, Any]) -> None:
        """Write `content` as JSON to `name` aside, then rename over it: a kill leaves the old or the new one.

        The manifest goes into the room reserve_commit took, if it holds one (the commit that ends a step)."""
        payload = json.dumps(content, separators=(",", ":")).encode()
        if name == MANIFEST:
            self._manifest_bytes = len(payload)
            if self._room is not None:
                self._replace_in_room(payload)
                return
        path = self.directory / name
        tmp = self.directory / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
                if self.durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise _name_file(exc, tmp)
        if self.durable:
            _fsync_dir(self.directory)

    def _replace_in_room(self, payload: bytes) -> None:
        """The manifest written over the reserved room's allocated bytes (no new block is needed unless the
        manifest outgrew it), cut to its length, then renamed over manifest.json."""
        (fd, _), self._room = self._room, None  # used once, by this commit
        room = self.directory / MANIFEST_ROOM
        try:
            view, done = memoryview(payload), 0
            while done < len(payload):
                done += os.pwrite(fd, view[done:], done)
            os.ftruncate(fd, len(payload))
            if self.durable:
                os.fsync(fd)
        except BaseException as exc:
            os.close(fd)
            _unlink_quietly(room)  # the old manifest stays committed
            if isinstance(exc, OSError):
                _name_file(exc, room)
            raise
        os.close(fd)
        try:
            os.replace(room, self.directory / MANIFEST)
        except OSError as exc:
            _unlink_quietly(room)  # the old manifest stays committed; a retried commit writes a new one
            raise _name_file(exc, room)
        if self.durable:
            _fsync_dir(self.directory)

    def _mark(self, step: int, index: int, *, done: bool) -> None:
        """Journal that stage `index` of `step` is being written (done=False) or is written."""
        with self._journal_lock:
            old = self._journal if self._journal.get("step") == step else {"written": [], "writing": []}
            if not done and index in old["writing"]:
                return  # io="map": begin_write said so already; no second (fsynced, if durable) rewrite
            writing = [k for k in old["writing"] if k != index] + ([] if done else [index])
            written = old["written"] + ([index] if done else [])
            journal = {"step": step, "written": written, "writing": writing}
            # Held only once on disk: if the write fails (disk full), the journal in memory must still be
            # the one on disk, or a retried step would take "writing k" as said and update k unjournaled.
            self._replace(JOURNAL, journal)
            self._journal = journal

    def begin_rewrite(self, what: str) -> str:
        """Journal that stages are about to be rewritten outside a step (`what`: e.g. "loading a checkpoint");
        returns the token the manifest commit that completes the rewrite must carry (`commit(rewrite=token)`).

        Until that commit, opening the store refuses it (`_check_steps`): the stages may hold a mix of the
        old and the new state. The journal of any step before is replaced: the rewrite supersedes it.
        """
        self.drain()
        token = os.urandom(8).hex()
        with self._journal_lock:
            self._journal = {"rewrite": token, "what": what}
            self._replace(JOURNAL, self._journal)
        return token

    def end_rewrite(self) -> None:
        """After the commit of a rewrite: an empty journal (the next step starts its own)."""
        with self._journal_lock:
            self._journal = {}
            self._replace(JOURNAL, self._journal)

    def relayout(self, spec: StoreSpec, fill) -> None:
        """Lay every stage out again for `spec`: the same stages, more state kinds (momentum or amsgrad
        switched on mid-run). `fill(stage, param)` -> ({array kind: value}, {scalar kind: value}) for the
        kinds the store did not hold; every other byte is copied.

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
                if kind in self.spec.state_scalars:
                    new_scalars[i, j] = old_scalars[i, self.spec.state_scalars.index(kind)]
                else:
                    new_scalars[i, j] = scalar_fill[kind]
        with open(path, "wb") as f:
            f.write(memoryview(new))
            if self.durable:
                f.flush()
                os.fsync(f.fileno())

    # -- closing ------------------------------------------------------------------
    def close(self) -> None:
        """Finish pending I/O, close the files and release the directory lock."""
        if self.closed:
            return
        try:
            self.drain()
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

    def __del__(self) -> None:
        # A route dropped without close(): give the descriptors and the directory lock back.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing useful to do at garbage collection
            pass


__all__ = ["ParamStore", "StoreError", "StoreSpec", "StageSpec", "ArraySpec", "StageLayout", "StageViews"]
