"""ParamStore's manifest and journal: reading and checking a committed store, and writing its commit points.

StoreManifest is ParamStore's base class (stream/store.py) and StageIO's subclass (stream/store_io.py): store_io.py
moves stage data between the files and the slots, this module says what the files hold and when they are
consistent (`open` and its checks; `commit`, the step's reserved manifest room, the journal, a rewrite's token),
and store.py builds, creates, lays out again and closes the store. The crash ordering these follow is in
store.py's module docstring. Its own file so that store.py stays readable; the methods moved here unchanged,
and ParamStore inherits them under their old names (a test patching ParamStore._replace still patches the calls).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

from . import stage_checksums
from .store_files import StoreError, _fmt, _fsync_dir, _name_file, _unlink_quietly
from .store_io import StageIO
from .store_layout import _signature_diff

FORMAT = "tensorarena-stream-store"
VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_ROOM = ".manifest.json.next"  # the step's manifest commit is written here, then renamed (reserve_commit)
JOURNAL = "journal.json"

log = logging.getLogger("tensorarena")


class StoreManifest(StageIO):
    """The manifest and journal half of a ParamStore (its base class; see the module docstring).

    Works on what ParamStore holds: `directory`, `files`, `spec`, `layouts`, `durable`, `manifest`, `_journal`,
    the locks `_manifest_lock` and `_journal_lock`, `_room`, `generation`, `_superseded`, `_manifest_bytes`; and
    calls its `_set_spec` (`_adopt`, when the manifest holds more state kinds).
    """

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
        if not isinstance(manifest, dict):
            raise StoreError(f"{path} holds a JSON {type(manifest).__name__}, not a manifest; the store is damaged: "
                             f"delete {self.directory} and resume from a checkpoint")
        version = manifest.get("version")
        if (manifest.get("format") == FORMAT and isinstance(version, int) and not isinstance(version, bool)
                and version > VERSION):
            raise StoreError(f"{path} was written by a newer tensorarena (store format v{version}; this one reads "
                             f"v{VERSION}): upgrade tensorarena to resume it, or resume from a checkpoint with a new "
                             f"store_dir")
        if manifest.get("format") != FORMAT or version != VERSION:
            raise StoreError(f"{path} is not a {FORMAT} v{VERSION} manifest (format {manifest.get('format')!r}, "
                             f"version {version!r}); point store_dir at a streaming store")
        # Valid JSON can still be damaged (a bit flipped in a key name): what follows, and the resume, index it
        # unchecked, and a bare KeyError would name neither the store nor what to do.
        problem = _manifest_problem(manifest)
        if problem:
            raise StoreError(f"{path} is damaged: {problem}. Delete {self.directory} and resume from a checkpoint")
        self._adopt(manifest)
        self._check_signature(manifest)
        self._check_files()
        self._check_steps(manifest, self._read_journal())
        self._check_seal(manifest)
        self.manifest = manifest
        self._manifest_bytes = len(text.encode())
        return manifest

    def _check_seal(self, manifest: dict[str, Any]) -> None:
        """Each stage file against the checksum its last close recorded (stage_checksums.py); `sealed` says
        whether they were checked. Runs after _check_steps: a step left half written is refused for that."""
        self.sealed = stage_checksums.seal_matches(manifest, self.files)
        if not self.sealed:
            log.warning("streaming store %s: its stage files were not checked against checksums: the run that "
                        "wrote them did not close the store after its last step (killed?), so none were recorded",
                        self.directory)
            return
        bad = stage_checksums.damaged_stages(self, manifest)
        if bad:
            raise StoreError(f"the streaming store {self.directory} is damaged: " + "; ".join(bad) + f". These files "
                             f"changed after the run that wrote them closed the store at step "
                             f"{manifest.get('data_step')} (a disk error, a partial copy, another program writing "
                             f"there). Delete the directory and resume from a checkpoint")

    def seal(self) -> bool:
        """Record each stage file's checksum in the manifest (stage_checksums.py), once every write finished;
        returns whether the store is sealed. Nothing to seal: no committed manifest, a step or rewrite in flight
        (the journal says so; opening refuses that store anyway), or already sealed at this step."""
        self.drain()
        if self.manifest is None or stage_checksums.seal_matches(self.manifest, self.files):
            return self.manifest is not None
        try:
            self._check_steps(self.manifest, self._read_journal())
        except StoreError:
            return False
        crcs = [stage_checksums.file_crc32(self._fd(k), layout.total_bytes, self.directory / name)
                for k, (name, layout) in enumerate(zip(self.files, self.layouts))]
        self.commit(**{stage_checksums.SEAL: stage_checksums.seal_entry(self.manifest.get("data_step"), self.files,
                                                                          crcs)})
        return True

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
            journal = json.loads((self.directory / JOURNAL).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.directory / JOURNAL} cannot be read ({exc}); the store is damaged: delete "
                             f"{self.directory} and resume from a checkpoint") from exc
        return journal

    def _check_steps(self, manifest: dict[str, Any], journal: dict[str, Any]) -> None:
        names = [s["name"] for s in manifest.get("stages", [])]
        if len(names) != len(self.files):  # (after _check_signature: another model's stages are refused there)
            raise StoreError(f"{self.directory / MANIFEST} is damaged: it lists {len(names)} stages, the store has "
                             f"{len(self.files)}. Delete {self.directory} and resume from a checkpoint")
        problem = _journal_problem(journal, len(names))
        if problem:  # as the manifest's structure (open): what is read below must be there, of its kind
            raise StoreError(f"{self.directory / JOURNAL} is damaged: {problem}. Delete {self.directory} and resume "
                             f"from a checkpoint")
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

    # -- committing -------------------------------------------------------------
    def commit(self, **fields: Any) -> None:
        """Update manifest fields and write it atomically (after all pending writes finished).

        self.manifest changes only once the write succeeded: a failed commit leaves it the committed one (as on
        disk), so the route can take the same commit again once the cause is fixed (StreamingRoute.retry_commit).
        """
        self.drain()
        with self._manifest_lock:
            manifest = dict(self.manifest) if self.manifest is not None else {"format": FORMAT, "version": VERSION}
            manifest.pop(stage_checksums.SEAL, None)  # any commit but the seal's own may follow changed stages
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


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What of the manifest is not of the structure `commit` writes (a key whose name changed, a value of another
    JSON kind), in words; None if none. Only what the store and the resume read from it is checked."""
    for key in ("step", "data_step"):
        if not _is_count(manifest.get(key)):
            return f"its {key!r} is " + (f"{manifest[key]!r}, not a step count" if key in manifest else "missing")
    stages = manifest.get("stages")
    if not isinstance(stages, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str) for s in stages):
        return "its 'stages' is not a list of named stages"
    groups = manifest.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return "its 'param_groups' is not a list of parameter groups"
    for key in ("optimizer", "rng", "rng_default"):
        if not isinstance(manifest.get(key), dict):
            return f"its {key!r} is {_kind(manifest.get(key))}, not a JSON object"
    if not isinstance(manifest["rng_default"].get("bit_generator"), str):
        return "its 'rng_default' is no generator state (no 'bit_generator')"
    optimizer = manifest["optimizer"]
    for key in ("state_arrays", "state_scalars"):
        if not (isinstance(optimizer.get(key, []), list) and all(isinstance(k, str) for k in optimizer.get(key, []))):
            return f"its optimizer's {key!r} is not a list of names"
    signature = manifest.get("signature", [])
    if not isinstance(signature, list) or not all(isinstance(s, dict) for s in signature):
        return "its 'signature' is not a list of stages"
    if not _is_count(manifest.get("layout_generation", 0)):
        return f"its 'layout_generation' is {manifest.get('layout_generation')!r}, not a count"
    seal = manifest.get(stage_checksums.SEAL)
    if isinstance(seal, dict) and not (isinstance(seal.get("crc32"), list)
                                       and all(_is_count(crc) for crc in seal["crc32"])):
        return "its stage checksums are not a list of CRC32s"
    return None


def _journal_problem(journal: Any, stages: int) -> str | None:
    """What of the journal is not of the structure `_mark` and `begin_rewrite` write, for a store of `stages`
    stages, in words; None if none."""
    if not isinstance(journal, dict):
        return f"it holds {_kind(journal)}, not a JSON object"
    if journal.get("step") is not None and not _is_count(journal["step"]):
        return f"its 'step' is {journal['step']!r}, not a step count"
    writing = journal.get("writing")
    writing = [writing] if _is_count(writing) else (writing or [])  # as _check_steps reads it (an int, or None)
    for key, value in (("written", journal.get("written", [])), ("writing", writing)):
        if not isinstance(value, list) or not all(_is_count(k) and k < stages for k in value):
            return f"its {key!r} is {value!r}, not a list of stage indices below {stages}"
    return None


def _kind(value: Any) -> str:
    return "missing (or null)" if value is None else f"a JSON {type(value).__name__}"
