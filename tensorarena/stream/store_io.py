"""How the streaming store moves stages between their files and the two slots, on one I/O thread.

ParamStore (stream/store.py) is a StageIO: this is its half that reads and writes stage data (read, write,
views, drain), and store_manifest.py (its StoreManifest subclass, ParamStore's base) the half that says what
the files hold and when they are consistent (manifest, journal, commit). A slot gets its stage as store.py's table of io modes says: io="map" maps the stage file
(see _map), io="copy" reads it into one of two slot buffers and writes it back.

Copying moved ~2.3 GB per ViT-Base step through the CPU (read 1.3, written 1.0), on the same two
cores as the compute: `python bench/streaming_interleaved.py` (the three taking turns in one
process) measured a warm ViT-Base step at 1.08 s mapped, 1.52 s copied, 0.65 s fused. Mapping a
110 MiB stage, touching every page and unmapping took 3 ms where reading and writing it back
took 47 ms.

Each write journals its stage through the store's _mark (store_manifest.py), before its data ("writing k") and after
("k written"), so a run killed mid-write is refused on resume instead of mixing two steps' weights.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .store_files import StoreError, _name_file
from .store_layout import ArraySpec, StageViews

IO_MODES = ("map", "copy")
MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python's mmap module does not name it (3.11)

log = logging.getLogger("tensorarena")


class StageIO:
    """The slots and the I/O thread of a ParamStore (its base class; see the module docstring).

    Works on what ParamStore holds: `directory`, `files` (one per stage), `layouts`, `spec`, `durable`, and
    `slots` (io="copy": the two buffers, sized by ParamStore._set_spec for the largest stage).
    """

    def __init__(self, io: str, n_stages: int) -> None:
        if io not in IO_MODES:
            raise ValueError(f"io must be one of {IO_MODES}, got {io!r}")
        self.io = io
        self.bytes_read = 0
        self.bytes_written = 0
        self._fds: list[int | None] = [None] * n_stages
        self._pending: list[Future] = []
        # Stages whose file the step in flight may have changed (begin_write with io="map", a started data write
        # with io="copy"): the route asks it after a failure, to tell a step that changed nothing (take it again)
        # from one partly applied. A write that failed stops the step's later ones (_write_failed) until drain().
        self.changed = 0
        self._write_failed: BaseException | None = None
        self._io: ThreadPoolExecutor | None = None
        self.closed = False
        self._maps: list[tuple[int, mmap.mmap, int] | None] = [None, None]
        # Mappings that still had arrays over them when their slot was released: they unmap when the
        # last such array goes. Stays 0 in a healthy step (the route drops its views first; tested).
        self.late_unmaps = 0
        # How a stage about to be updated gets its pages (io="map", see _map): "write" (prefaulted
        # writable on the I/O thread) or "faults" (this kernel refused; logged once). None: io="copy".
        self.populate = "write" if io == "map" else None

    def _mark(self, step: int, index: int, *, done: bool) -> None:
        """Journal that stage `index` of `step` is being written (done=False) or is written: ParamStore's."""
        raise NotImplementedError

    # -- a step's writes: journaled first, stopped by the first that fails ---------
    def begin_write(self, index: int, step: int) -> None:
        """Call before changing stage `index`'s arrays for `step`: io="map" changes the file itself, so
        the journal must say "writing" first. With io="copy" the write task journals (nothing to do).
        Refused once a write of this step failed: a stage changed after it could only widen the damage."""
        self.raise_failed_write()
        if self.io == "map":
            self._mark(step, index, done=False)
            self.changed += 1

    def raise_failed_write(self) -> None:
        """Raise the error of a write of this step that failed on the I/O thread, itself (it names the file and
        errno), so the step stops there; nothing if none failed. The caller's own check: later writes are refused
        on the I/O thread too (_refuse_after_failed_write), but the step should not compute stages it cannot keep."""
        failed = self._write_failed
        if failed is not None:
            raise failed

    def _refuse_after_failed_write(self, index: int) -> None:
        failed = self._write_failed
        if failed is not None:
            raise StoreError(f"stage {index} was left as it was: writing an earlier stage of this step failed "
                             f"({type(failed).__name__}: {failed})") from failed

    # -- slots and I/O ------------------------------------------------------------
    def views(self, slot: int, index: int) -> StageViews:
        """Arrays of stage `index` inside slot `slot` (0 or 1); with io="map" the slot must hold that stage
        (read it first), and a parameters-only read gives no state views."""
        layout = self.layouts[index]
        if self.io == "copy":
            buf = self.slots[slot]
        else:
            held = self._maps[slot]
            if held is None or held[0] != index:
                raise StoreError(f"slot {slot} holds {'nothing' if held is None else f'stage {held[0]}'}, not stage "
                                 f"{index}: read(index={index}, slot={slot}) it first")
            buf = np.frombuffer(held[1], np.uint8) if held[1] is not None else _NOTHING

        def at(offset: int, a: ArraySpec) -> np.ndarray:
            return buf[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)

        params = [at(o, a) for o, a in zip(layout.param_offsets, layout.stage.params)]
        if buf.nbytes < layout.total_bytes:
            return StageViews(params, None, None)
        state = [{kind: at(layout.state_offsets[kind][i], a) for kind in self.spec.state_arrays}
                 for i, a in enumerate(layout.stage.params)]
        n = len(layout.stage.params) * layout.n_scalars
        scalars = buf[layout.scalar_offset:layout.scalar_offset + 8 * n].view(np.float64)
        return StageViews(params, state, scalars.reshape(len(layout.stage.params), layout.n_scalars))

    def read(self, index: int, slot: int, *, params_only: bool = False) -> Future:
        """Read stage `index` into `slot` on the I/O thread (parameters only, or everything)."""
        layout = self.layouts[index]
        nbytes = layout.params_bytes if params_only else layout.total_bytes
        return self._submit(self._read, index, slot, nbytes)

    def write(self, index: int, slot: int, step: int | None) -> Future:
        """Write stage `index` from `slot` on the I/O thread; `step` journals it (None: creating, no journal).

        With io="map" the slot's read of the whole stage must have completed (as for `views`).
        """
        if self.io == "map":
            held = self._maps[slot]
            if held is None or held[0] != index or held[2] < self.layouts[index].total_bytes:
                raise StoreError(f"write of stage {index} from slot {slot}, which does not hold all of it "
                                 f"({'nothing' if held is None else f'stage {held[0]}, {held[2]} bytes'}); read it "
                                 f"with params_only=False first")
        return self._submit(self._write, index, slot, step)

    def _submit(self, fn, *args) -> Future:
        if self.closed:
            raise StoreError(f"the streaming store {self.directory} is closed")
        if self._io is None:
            # One worker: reads and writes run in submission order, so a slot is never read
            # into before the write that empties it has finished.
            self._io = ThreadPoolExecutor(1, thread_name_prefix="tensorarena-stream-io")
        future = self._io.submit(fn, *args)
        # Forget only what finished well: a failed write must stay until drain() raises it, or the step would
        # commit a stage its file never received (a copied write's EIO was lost this way: the store resumed
        # holding one stage of the step before).
        self._pending = [f for f in self._pending if not _succeeded(f)] + [future]
        return future

    def _read(self, index: int, slot: int, nbytes: int) -> None:
        if self.io == "map":
            self._release(slot)
            # A stage without parameters (a frozen embedding left out of its stage, a pooling stage) has a
            # 0-byte file, which mmap refuses: it holds nothing, so the slot holds no mapping either.
            self._maps[slot] = (index, self._map(index, nbytes) if nbytes else None, nbytes)
            self.bytes_read += nbytes
            return
        view = memoryview(self.slots[slot])[:nbytes]
        fd, done = self._fd(index), 0
        while done < nbytes:
            n = os.preadv(fd, [view[done:]], done)
            if n == 0:
                raise StoreError(f"{self.directory / self.files[index]} ended after {done} of {nbytes} bytes; the "
                                 f"store was truncated: delete it and resume from a checkpoint")
            done += n
        self.bytes_read += nbytes

    def _write(self, index: int, slot: int, step: int | None) -> None:
        try:
            self._refuse_after_failed_write(index)
            self._write_stage(index, slot, step)
        except BaseException as exc:
            self._write_failed = self._write_failed or exc
            raise

    def _write_stage(self, index: int, slot: int, step: int | None) -> None:
        nbytes = self.layouts[index].total_bytes
        if step is not None:
            self._mark(step, index, done=False)  # with io="map", begin_write did this already
        if self.io == "map":
            held = self._maps[slot]
            if self.durable and held[1] is not None:
                try:
                    held[1].flush()  # msync: the pages are the file's, so this is its write to disk
                except OSError as exc:
                    raise _name_file(exc, self.directory / self.files[index])
            self._release(slot)
            self.bytes_written += nbytes
            if step is not None:
                self._mark(step, index, done=True)
            return
        view = memoryview(self.slots[slot])[:nbytes]
        fd, done = self._fd(index), 0
        if step is not None:
            self.changed += 1  # journaled "writing": from here on the file may hold part of the step
        try:
            while done < nbytes:
                done += os.pwritev(fd, [view[done:]], done)
            if self.durable:
                os.fsync(fd)
        except OSError as exc:
            raise _name_file(exc, self.directory / self.files[index])
        self.bytes_written += nbytes
        if step is not None:
            self._mark(step, index, done=True)

    def _map(self, index: int, nbytes: int) -> mmap.mmap:
        """Map the first `nbytes` of stage `index`'s file, its page tables filled here on the I/O thread.

        A parameters-only map is read by the forward pass: MAP_POPULATE. A whole stage is about to
        be updated, and MAP_POPULATE fills a shared mapping read-only, so each page's first write
        would still fault, in the optimizer's kernel: ~0.2 s of a ViT-Base step (a 110 MiB update
        took 36-60 ms instead of 13). MADV_POPULATE_WRITE (Linux 5.14) takes those faults here.
        """
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        size = os.fstat(self._fd(index)).st_size
        if size < nbytes:  # mmap would refuse with a ValueError naming no file (and a page past the end is SIGBUS)
            raise StoreError(f"{self.directory / self.files[index]} ended after {size} of {nbytes} bytes; the "
                             f"store was truncated: delete it and resume from a checkpoint")
        if nbytes < self.layouts[index].total_bytes:
            return mmap.mmap(self._fd(index), nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=prot)
        mapped = mmap.mmap(self._fd(index), nbytes, flags=mmap.MAP_SHARED, prot=prot)
        if self.populate == "write":
            try:
                mapped.madvise(MADV_POPULATE_WRITE)
            except OSError as exc:
                if exc.errno == errno.EFAULT:  # a page the file cannot back (no room on its disk): a write would
                    mapped.close()             # be SIGBUS, the process killed with no error
                    raise StoreError(f"{self.directory / self.files[index]}: its pages cannot all be written (no "
                                     f"room on its disk?), so the stage was not written; free space on that "
                                     f"disk") from exc
                self.populate = "faults"
                log.warning("streaming store: madvise(MADV_POPULATE_WRITE) failed (%s; it needs Linux 5.14): the "
                            "optimizer takes a page fault at the first write of every page of a stage", exc)
        return mapped

    def mapped_stages(self) -> list[int]:
        """Stages whose files are mapped into a slot now (io="map"); empty between steps."""
        return [held[0] for held in self._maps if held is not None]

    def _release(self, slot: int) -> None:
        """Unmap slot `slot` (io="map"); if arrays over it are still alive it unmaps when they go."""
        held, self._maps[slot] = self._maps[slot], None
        if held is not None and held[1] is not None:
            try:
                held[1].close()
            except BufferError:
                self.late_unmaps += 1

    def _fd(self, index: int) -> int:
        fd = self._fds[index]
        if fd is None:
            fd = self._fds[index] = os.open(self.directory / self.files[index], os.O_RDWR | os.O_CREAT, 0o644)
        return fd

    def drain(self) -> None:
        """Wait for every queued read and write; re-raise the first failure."""
        pending, self._pending = self._pending, []
        error = None
        for future in pending:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - keep draining, raise the first below
                error = error or exc
        self._write_failed = None  # every write queued has run: the caller hears of a failure below
        if error is not None:
            raise error

    def release_slots(self) -> None:
        """Wait for queued I/O and unmap both slots (io="map"), e.g. after a failed step."""
        try:
            self.drain()
        finally:
            for slot in range(len(self._maps)):
                self._release(slot)


_NOTHING = np.empty(0, np.uint8)  # the slot buffer of a stage that holds no bytes (io="map")


def _succeeded(future: Future) -> bool:
    """Whether `future` finished without an exception (never waits)."""
    return future.done() and not future.cancelled() and future.exception() is None
