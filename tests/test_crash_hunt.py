"""Crashes: a real process killed (SIGKILL from inside a patched function, at a chosen point) during a streaming
step, a checkpoint save or load, the move into the store; and a full disk (a small tmpfs) during a step and a
save. Afterwards a new process resumes from the store or the last checkpoint: it must go on bit for bit like the
uninterrupted run, or refuse clearly (naming what to do) and lose no committed step.

3 of its 28 tests failed on 04a3a9b, before the fixes (each under a "Regression (fixed)" comment saying what was
wrong); the tests added with the fixes (the "journal" case of the retried-step test, a failed commit's message, no
room to move back in) fail there too: 6 of 31 now. With this file copied into a worktree of 04a3a9b (git worktree
add /tmp/old 04a3a9b), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_crash_hunt.py`.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numba
import numpy as np
import pytest

from tensorarena import optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import StoreError, StreamingRoute
from tensorarena.stream import store as store_module
from tensorarena.train.checkpoint import read_metadata
from tensorarena.train.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
STEPS = 6


def _model(seed=0, depth=2):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=32, depth=depth, num_heads=4, dropout=0.1,
                    attention_dropout=0.0, dtype=np.float32)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _batches():
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((4, 3, 16, 16)).astype(np.float32), rng.integers(0, 5, 4)) for _ in range(STEPS)]


BATCHES = _batches()


def _parts(seed=0, depth=2):
    model = _model(seed, depth)
    opt = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=12)
    return model, opt, sched


def _trainer(route, store_dir=None, *, seed=0, io="map", depth=2):
    model, opt, sched = _parts(seed, depth)
    return Trainer(model, opt, cross_entropy, scheduler=sched, route=route,
                   store_dir=None if store_dir is None else str(store_dir), stream_io=io)


def _final_params(trainer):
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return [p.data.copy() for p in trainer.model.parameters()]


@functools.lru_cache(maxsize=None)
def _reference(route, io="map", depth=2):
    """The uninterrupted run: losses of every step and the final parameters. Its store is removed once the
    parameters are back in memory (it was left in /tmp, one per route, io and depth, by every run of this file)."""
    store = tempfile.mkdtemp(prefix="crash-hunt-ref-")
    try:
        tr = _trainer(route, store, io=io, depth=depth)
        losses = [tr.step(x, y).loss for x, y in BATCHES]
        return losses, _final_params(tr)
    finally:
        shutil.rmtree(store)


def _assert_continues(losses, params, route="streaming", io="map", start=0, depth=2):
    ref_losses, ref_params = _reference(route, io, depth)
    assert losses == ref_losses[start:], f"losses {losses} vs uninterrupted {ref_losses[start:]}"
    for i, (a, b) in enumerate(zip(params, ref_params)):
        np.testing.assert_array_equal(a, b, err_msg=f"parameter {i}")


def _continue_with_trainer(tr, start):
    losses = [tr.step(*BATCHES[i]).loss for i in range(start, STEPS)]
    assert tr.step_count == STEPS
    return losses, _final_params(tr)


def _resume_store(store, io="map", depth=2):
    """A new process's view: a fresh model (other init) resumes the store with the raw route."""
    model, opt, sched = _parts(seed=7, depth=depth)
    return StreamingRoute.resume(model, opt, cross_entropy, store, scheduler=sched, io=io), model


def _continue_route(route, model):
    start = route.step_count
    losses = [route.step(*BATCHES[i]) for i in range(start, STEPS)]
    route.to_memory()
    return losses, [p.data.copy() for p in model.parameters()]


# -- children ------------------------------------------------------------------------------------------------
def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _run_child(name, **kwargs):
    """Run `_child_<name>(**kwargs)` in a new Python process; it must end SIGKILLed."""
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import tests.test_crash_hunt as t; "
              f"t._child_{name}(**{kwargs!r})")
    # The child computes with the parent's kernel thread count: the reductions split by it, so only then are
    # its steps bit for bit the parent's uninterrupted run (a CI run at 2 threads failed with 1 here).
    env = {**os.environ, "NUMBA_NUM_THREADS": str(numba.get_num_threads())}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == -signal.SIGKILL, f"child was not killed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def _kill_at_call(owner, attr, n, *, after=False, then=None):
    """Patch owner.attr so its n-th call SIGKILLs the process (before the real call, or after it)."""
    real, calls = getattr(owner, attr), [0]

    def patched(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n and not after:
            _die()
        out = real(*args, **kwargs)
        if calls[0] == n and after:
            _die()
        return out

    setattr(owner, attr, patched)


def _child_step(store, ckpt, io, n, after):
    """Two committed streaming steps and a checkpoint at step 2, then step 3 killed at the n-th journal/manifest
    write (ParamStore._replace: per stage "writing k" and "k written", then the manifest)."""
    tr = _trainer("streaming", store, io=io)
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    tr.save(ckpt)
    _kill_at_call(store_module.ParamStore, "_replace", n, after=after)
    tr.step(*BATCHES[2])


def _child_half_pwritev(store, ckpt):
    """io="copy": step 3 killed half-way through writing the second stage's file."""
    tr = _trainer("streaming", store, io="copy")
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    tr.save(ckpt)
    real, calls = os.pwritev, [0]

    def pwritev(fd, buffers, offset):
        calls[0] += 1
        if calls[0] == 2:
            view = memoryview(buffers[0])
            real(fd, [view[:len(view) // 2]], offset)
            _die()
        return real(fd, buffers, offset)

    store_module.os.pwritev = pwritev
    tr.step(*BATCHES[2])


def _child_save(route, store, ckpt):
    """Checkpoint at step 2, two more steps, then a second save to the same path killed half-way."""
    tr = _trainer(route, store)
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    tr.save(ckpt)
    for x, y in BATCHES[2:4]:
        tr.step(x, y)
    if route == "streaming":
        _kill_at_call(tr.stream.store, "read", 3)  # the file's header and first stages are written
    else:
        from tensorarena.train import checkpoint as ckpt_module

        _kill_at_call(ckpt_module.os, "fsync", 1)  # the temporary file is written, not yet renamed
    tr.save(ckpt)


def _child_move_in(store):
    """The first streaming step moves the state into a new store; killed after the second stage file."""
    tr = _trainer("streaming", store)
    _kill_at_call(store_module.ParamStore, "write", 2)
    tr.step(*BATCHES[0])


def _child_reenter(store):
    """Three committed steps, to_memory() (the store is unchanged), then the next step moves the state back
    into the store and is killed half-way through that move."""
    tr = _trainer("streaming", store)
    for x, y in BATCHES[:3]:
        tr.step(x, y)
    tr.stream.to_memory()
    _kill_at_call(store_module.ParamStore, "write", 2)
    tr.step(*BATCHES[3])


def _child_load(store, ckpt, where):
    """Checkpoint at step 2, two more steps, then loading that checkpoint into the store is killed: half-way
    through the stage rewrites (where="stages") or after its commit, before the journal is emptied ("end")."""
    tr = _trainer("streaming", store)
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    tr.save(ckpt)
    for x, y in BATCHES[2:4]:
        tr.step(x, y)
    if where == "stages":
        _kill_at_call(tr.stream.store, "write", 2)
    else:
        _kill_at_call(tr.stream.store, "end_rewrite", 1)
    tr.load(ckpt)


# -- a streaming step killed at every commit point ------------------------------------------------------------
# 4 stages (embed, blocks.0, blocks.1, head): _replace calls 1..8 journal the stages, 9 writes the manifest.
STEP_KILLS = [("map", 1, False), ("map", 2, False), ("map", 5, False), ("map", 9, False), ("map", 9, True),
              ("copy", 1, False), ("copy", 4, False), ("copy", 9, True)]


@pytest.mark.parametrize("io,n,after", STEP_KILLS, ids=[f"{io}-{'after' if a else 'before'}-{n}"
                                                         for io, n, a in STEP_KILLS])
def test_a_step_killed_at_a_commit_point_resumes_bit_for_bit_or_is_refused_and_the_checkpoint_recovers(
        tmp_path, io, n, after):
    store, ckpt = tmp_path / "store", tmp_path / "step2.ckpt"
    _run_child("step", store=str(store), ckpt=str(ckpt), io=io, n=n, after=after)
    nothing_written = n == 1 and not after  # killed before the first "writing" entry: the store is at step 2
    committed = n == 9 and after  # killed right after the manifest's rename: the store is at step 3
    _check_after_kill(store, ckpt, io, 2 if nothing_written else 3 if committed else None)


def _check_after_kill(store, ckpt, io, at):
    """The store resumes at step `at` and goes on bit for bit; or (at=None) it is refused, and the checkpoint of
    step 2 recovers the run."""
    if at is not None:
        route, model = _resume_store(store, io)
        assert route.step_count == at
        _assert_continues(*_continue_route(route, model), io=io, start=at)
        return
    with pytest.raises(StoreError, match=r"(?s)step 3.*[Dd]elete the directory and resume from a checkpoint"):
        _resume_store(store, io)
    # What the refusal says to do: delete it, resume from the checkpoint; the run goes on as if never killed.
    shutil.rmtree(store)
    tr = _trainer("streaming", store, seed=7, io=io)
    tr.load(ckpt)
    _assert_continues(*_continue_with_trainer(tr, 2), io=io, start=2)


def _child_durable_fsync(store, ckpt, n):
    """A durable store (fsync at every commit point): step 3 killed at its n-th fsync."""
    from tensorarena.stream.checkpoint import save_streaming_checkpoint

    model, opt, sched = _parts()
    route = StreamingRoute.from_memory(model, opt, cross_entropy, store, scheduler=sched, durable=True)
    for x, y in BATCHES[:2]:
        route.step(x, y)
    save_streaming_checkpoint(route, ckpt, step=2)
    _kill_at_call(store_module.os, "fsync", n)
    route.step(*BATCHES[2])


# Per stage: the journal's file and directory fsync for "writing k", the same for "k written" (the mapped pages are
# msynced, not fsynced); then the manifest's two: 4 * 4 + 2 = 18.
@pytest.mark.parametrize("n,at", [(1, 2), (10, None), (17, None), (18, 3)])
def test_a_durable_step_killed_at_an_fsync_resumes_or_is_refused(tmp_path, n, at):
    store, ckpt = tmp_path / "store", tmp_path / "step2.ckpt"
    _run_child("durable_fsync", store=str(store), ckpt=str(ckpt), n=n)
    _check_after_kill(store, ckpt, "map", at)


def test_a_stage_file_half_written_is_refused(tmp_path):
    store, ckpt = tmp_path / "store", tmp_path / "step2.ckpt"
    _run_child("half_pwritev", store=str(store), ckpt=str(ckpt))
    with pytest.raises(StoreError, match=r"interrupted while writing stage 'blocks.1' of step 3"):
        _resume_store(store, "copy")


# -- Trainer.save killed half-way ------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
def test_a_save_killed_half_way_leaves_the_previous_checkpoint_loadable(tmp_path, route):
    store, ckpt = tmp_path / "store", tmp_path / "run.ckpt"
    _run_child("save", route=route, store=str(store), ckpt=str(ckpt))
    assert read_metadata(ckpt)["step"] == 2
    tr = _trainer(route, tmp_path / "other", seed=7)
    tr.load(ckpt)
    _assert_continues(*_continue_with_trainer(tr, 2), route=route, start=2)
    if route == "streaming":  # saving only reads the store: it is still at step 4 and goes on
        route_, model = _resume_store(store)
        assert route_.step_count == 4
        _assert_continues(*_continue_route(route_, model), start=4)


# -- the move into the store ------------------------------------------------------------------------------------
def test_a_kill_while_the_state_first_moves_into_the_store_is_refused_clearly(tmp_path):
    store = tmp_path / "store"
    _run_child("move_in", store=str(store))
    tr = _trainer("streaming", store, seed=7)  # a fresh model must not silently start a store there
    with pytest.raises(StoreError, match=r"creating a store there was interrupted.*delete the directory"):
        tr.step(*BATCHES[0])
    shutil.rmtree(store)
    tr = _trainer("streaming", store)
    _assert_continues(*_continue_with_trainer(tr, 0))


# Regression (fixed): after to_memory() the store still holds the committed step 3 ("resume: the store is
# unchanged"), but the next step's move back into the store (_reenter -> _move_in(overwrite=True) ->
# ParamStore.create) first deleted the manifest and then rewrote the stage files in place. A kill during that move
# left a directory with no manifest: the committed step 3 was gone (resume said "holds no streaming store"), though
# nothing about it had changed. Now the move writes the next layout generation's files next to the committed ones
# and switches with the manifest's rename (as relayout does); the old files and a killed move's leftovers go then.
def test_a_kill_while_the_state_moves_back_in_after_to_memory_keeps_the_committed_store(tmp_path):
    store = tmp_path / "store"
    _run_child("reenter", store=str(store))
    route, model = _resume_store(store)
    assert route.step_count == 3
    _assert_continues(*_continue_route(route, model), start=3)
    route.step(*BATCHES[0])  # moves back in: generation 2, past the killed move's leftovers (generation 1)
    assert sorted(p.name for p in store.glob("stage-*.bin")) == [f"stage-{i:04d}.g2.bin" for i in range(4)]
    route.close()
    route, _ = _resume_store(store)
    assert route.step_count == 7
    route.close()


# The move back in needs room for a second copy while the committed one stays: without it, it is refused before
# anything is written, the state stays in memory, and the run goes on once there is room.
def test_no_room_to_move_back_in_is_refused_and_the_run_goes_on(tmp_path, monkeypatch):
    tr = _trainer("streaming", tmp_path / "store")
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    tr.stream.to_memory()
    with monkeypatch.context() as patch:
        patch.setattr(store_module.shutil, "disk_usage", lambda _: type("Usage", (), {"free": 1024})())
        with pytest.raises(StoreError, match=r"needs .* next to the committed store's files.*nothing was changed"):
            tr.step(*BATCHES[2])
    assert sorted(p.name for p in (tmp_path / "store").glob("stage-*.bin")) == [f"stage-{i:04d}.bin" for i in range(4)]
    _assert_continues(*_continue_with_trainer(tr, 2), start=2)


# -- a checkpoint load into the store killed -------------------------------------------------------------------
def test_a_load_killed_half_way_is_refused_and_a_load_after_deleting_recovers(tmp_path):
    store, ckpt = tmp_path / "store", tmp_path / "step2.ckpt"
    _run_child("load", store=str(store), ckpt=str(ckpt), where="stages")
    tr = _trainer("streaming", store, seed=7)
    with pytest.raises(StoreError, match=r"interrupted while loading the checkpoint .*step2.ckpt.*[Dd]elete"):
        tr.load(ckpt)
    shutil.rmtree(store)
    tr = _trainer("streaming", store, seed=7)
    tr.load(ckpt)
    _assert_continues(*_continue_with_trainer(tr, 2), start=2)


def test_a_load_killed_after_its_commit_resumes_at_the_checkpoint(tmp_path):
    store, ckpt = tmp_path / "store", tmp_path / "step2.ckpt"
    _run_child("load", store=str(store), ckpt=str(ckpt), where="end")
    route, model = _resume_store(store)
    assert route.step_count == 2
    _assert_continues(*_continue_route(route, model), start=2)


# -- a copy of the store ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("io", ["map", "copy"])
def test_a_copy_of_an_open_store_between_steps_resumes_bit_for_bit(tmp_path, io):
    tr = _trainer("streaming", tmp_path / "store", io=io)
    for x, y in BATCHES[:3]:
        tr.step(x, y)
    shutil.copytree(tmp_path / "store", tmp_path / "copy")  # the route is open (io="map": pages not synced)
    tr.step(*BATCHES[3])  # the original goes on; the copy must not see it
    route, model = _resume_store(tmp_path / "copy", io)
    assert route.step_count == 3
    _assert_continues(*_continue_route(route, model), io=io, start=3)


# -- a full disk (a small tmpfs) --------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "disk"
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(where)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _fill(where: Path, leave_pages: int = 0) -> Path:
    """Fill the filesystem of `where` with one file, then give `leave_pages` pages back."""
    filler = where / "filler"
    chunk = b"\1" * 4096
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    size = filler.stat().st_size // 4096 * 4096
    os.truncate(filler, max(size - 4096 * leave_pages, 0))
    return filler


def test_a_full_disk_refuses_the_move_into_the_store_clearly_and_keeps_the_state_in_memory(small_disk):
    _fill(small_disk, leave_pages=8)
    tr = _trainer("streaming", small_disk / "store")
    with pytest.raises(StoreError, match=r"needs .* on disk but .* free"):
        tr.step(*BATCHES[0])
    (small_disk / "filler").unlink()
    _assert_continues(*_continue_with_trainer(tr, 0))


@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_a_full_disk_during_save_keeps_the_previous_checkpoint(small_disk, tmp_path, route):
    tr = _trainer(route, tmp_path / "store")
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    ckpt = small_disk / "run.ckpt"
    tr.save(ckpt)
    for x, y in BATCHES[2:4]:
        tr.step(x, y)
    filler = _fill(small_disk)
    with pytest.raises(OSError) as info:
        tr.save(ckpt)
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "run.ckpt"]  # no temporary file left
    filler.unlink()
    assert read_metadata(ckpt)["step"] == 2
    again = _trainer(route, tmp_path / "other", seed=7)
    again.load(ckpt)
    _assert_continues(*_continue_with_trainer(again, 2), route=route, start=2)
    _assert_continues(*_continue_with_trainer(tr, 4), route=route, start=4)  # the run itself goes on too


def test_a_full_disk_at_a_steps_first_journal_write_leaves_the_route_usable(small_disk):
    tr = _trainer("streaming", small_disk / "store")
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    filler = _fill(small_disk)
    with pytest.raises(OSError) as info:
        tr.step(*BATCHES[2])
    assert info.value.errno == errno.ENOSPC
    filler.unlink()
    _assert_continues(*_continue_with_trainer(tr, 2), start=2)


def _child_journal_enospc_then_kill(store, fail):
    """The first journal write of step 3 fails (disk full; nothing was written, the route stays usable); space is
    freed and step 3 is taken again, killed while the head's mapped file is being updated. fail="disk": a real
    full disk; fail="journal": only the journal's write fails, as it would on a disk with room for all else."""
    from tensorarena.stream import optim_state

    tr = _trainer("streaming", store)
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    if fail == "disk":
        filler = _fill(Path(store).parent)  # the store is on a small tmpfs
    else:
        real_replace = store_module.ParamStore._replace

        def replace(self, name, content):
            if name == store_module.JOURNAL:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            return real_replace(self, name, content)

        store_module.ParamStore._replace = replace
    try:
        tr.step(*BATCHES[2])
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    if fail == "disk":
        filler.unlink()
    else:
        store_module.ParamStore._replace = real_replace
    assert tr.stream._broken is None
    real_update = optim_state.update

    def update_then_die(*args):
        real_update(*args)  # the head's file now holds step 3's update
        _die()

    optim_state.update = update_then_die
    tr.step(*BATCHES[2])


# Regression (fixed): after a step whose first journal write failed (ENOSPC: "writing head" never reached the
# disk), the store's in-memory journal still listed the head as "writing" (ParamStore._mark appended to it before
# self._replace(JOURNAL, ...) wrote it, and nothing undid that when the write raised). The retried step's
# begin_write(head) then saw `index in writing` and returned without journaling, so the head's file was updated
# while the journal on disk still said step 2 was complete. Killed there, resume silently accepted a store whose
# head held (part of) step 3 and whose other stages held step 2: mixed weights, no error. Now _mark builds the new
# journal aside and keeps it only once written.
@pytest.mark.parametrize("fail", ["disk", "journal"])
def test_a_kill_in_a_step_retried_after_a_failed_journal_write_is_still_refused(small_disk, fail):
    store = small_disk / "store"
    _run_child("journal_enospc_then_kill", store=str(store), fail=fail)
    with pytest.raises(StoreError, match="interrupted while writing stage 'head' of step 3"):
        _resume_store(store)


# Regression (fixed): disk full at a step's manifest commit lost the committed run: every stage was already updated
# in place (journal: all written), the manifest rename failed with ENOSPC, and the route marked itself broken
# ("6 of 6 stages ... partly applied"); once space was freed neither the route nor the store ("killed at the very
# end of step 3") went on, so steps 1-2 (committed) and 3 (fully on disk) were lost unless a checkpoint existed.
# The manifest is the largest file a step writes and is written last, so a nearly full disk hit exactly there. Now
# the step allocates its manifest's room (ParamStore.reserve_commit) before any stage changes: a full disk fails
# there, nothing of the step written, and the route takes the step again once space is freed.
def test_a_full_disk_at_the_manifest_commit_loses_no_committed_step(small_disk):
    tr = _trainer("streaming", small_disk / "store", depth=4)  # a manifest of two pages
    for x, y in BATCHES[:2]:
        tr.step(x, y)
    manifest = len((small_disk / "store" / "manifest.json").read_bytes())
    assert manifest > 4096, "the manifest fits one page: this test needs a larger one"
    filler = _fill(small_disk, leave_pages=1)  # room for the journal's rewrites, not for the manifest
    with pytest.raises(OSError) as info:
        tr.step(*BATCHES[2])
    assert info.value.errno == errno.ENOSPC
    filler.unlink()
    try:
        losses = [tr.step(*BATCHES[i]).loss for i in range(tr.step_count, STEPS)]
        _assert_continues(losses, _final_params(tr), start=2, depth=4)
    except StoreError:
        tr.stream.close()
        route, model = _resume_store(small_disk / "store", depth=4)  # or at least the store resumes (step 2 or 3)
        start = route.step_count
        _assert_continues(*_continue_route(route, model), start=start, depth=4)


# A commit that fails for another reason after the stages were written (an I/O error; the room was reserved): the step
# is whole in every stage and in the process, only the manifest recording it is missing. The error says so (not
# "partly applied"); while the cause lasts the route refuses, training nothing; once it is fixed the next step
# commits step 3 first and trains step 4, so the run is the uninterrupted one (step 3's batch was used: the caller
# goes on with the next), and the store resumes after close.
def test_a_commit_that_fails_after_every_stage_was_written_says_so(tmp_path, monkeypatch):
    store = tmp_path / "store"
    tr = _trainer("streaming", store)
    losses = [tr.step(x, y).loss for x, y in BATCHES[:2]]

    real = store_module.ParamStore._replace

    def fail(self, name, content):  # every manifest write (into the step's reserved room or not); journals pass
        if name == store_module.MANIFEST:
            raise OSError(errno.EIO, "Input/output error (injected)")
        real(self, name, content)

    with monkeypatch.context() as patch:
        patch.setattr(store_module.ParamStore, "_replace", fail)
        with pytest.raises(OSError) as info:
            tr.step(*BATCHES[2])
        notes = " ".join(getattr(info.value, "__notes__", []))
        assert "step 3 was applied to every stage" in notes and "commits step 3 first" in notes, notes
        assert "partly applied" not in notes, notes
        assert not list(store.glob(".manifest.json*")), "the reserved room was left behind"
        assert read_metadata_step(store) == 2
        with pytest.raises(StoreError, match="step 3 was applied to every stage"):  # the cause is still there
            tr.step(*BATCHES[3])
        assert read_metadata_step(store) == 2 and tr.stream.step_count == 2
    report = tr.step(*BATCHES[3])  # the cause fixed: commits step 3, then trains step 4
    assert report.step == 4 and tr.step_count == 4 and read_metadata_step(store) == 4
    losses.append(report.loss)
    tr.stream.close()
    route, model = _resume_store(store)
    assert route.step_count == 4
    more, params = _continue_route(route, model)
    ref_losses, ref_params = _reference("streaming")
    assert losses + more == ref_losses[:2] + ref_losses[3:], (losses + more, ref_losses)
    for i, (a, b) in enumerate(zip(params, ref_params)):
        np.testing.assert_array_equal(a, b, err_msg=f"parameter {i}")


def read_metadata_step(store):
    """The step the store's manifest on disk records."""
    import json

    return json.loads((store / "manifest.json").read_text())["step"]
