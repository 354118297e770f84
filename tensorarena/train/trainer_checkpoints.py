"""Trainer.save/load on every route: one checkpoint file, written from and read into wherever the route keeps
the training state (the model in memory, the fused plan's flat buffers through the module's views, or the
streaming store stage by stage), and a load that waits for route auto's choice on a deferred model.

The file format itself is train/checkpoint.py's (and stream/checkpoint.py's for the store); this module only
decides, per route, which of them runs and what the trainer's step count becomes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from .interrupt import SigintDeferred

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("tensorarena")


def save(trainer: Trainer, path, extra: dict | None) -> None:
    """Trainer.save's work: the route's state (the store's when streaming) to one checkpoint file."""
    from .checkpoint import json_extra, save_checkpoint

    extra = json_extra(extra or {})  # a TypeError naming the bad entry before any route writes, on every route
    # Before step 1 a checkpoint may wait for the route choice (load on a deferred model): it is the state
    # to save, so it is loaded now, into the model made whole (no route is chosen yet to keep it elsewhere).
    make_whole(trainer, "save() before step 1 writes what it holds")
    # After to_memory() the state is the model's and the optimizer's (the eager checkpoint below): saving through
    # the store first moved it back in, which a read-only or full disk refused, so nothing could be saved anywhere.
    if trainer.stream is not None and not trainer.stream.in_memory:
        from ..stream.checkpoint import save_streaming_checkpoint

        save_streaming_checkpoint(trainer.stream, path, step=trainer.step_count, extra=extra)
        return
    save_checkpoint(path, model=trainer.model, optimizer=trainer.optimizer, scheduler=trainer.scheduler,
                    step=trainer.step_count, extra=extra)


def load(trainer: Trainer, path) -> dict:
    """Trainer.load's work: check the file, then load it where the route keeps the state; returns its extra."""
    from .checkpoint import check_checkpoint, load_checkpoint, open_checkpoint, path_identity

    if trainer.route == "streaming":
        path = Path(path)
        identity = path_identity(path)  # the file checked by path below must be the one opened and loaded
        # The file checked against the model, optimizer and schedule first, on this route too: a bad file
        # must not start the route (moving the whole state into the store) nor fail after the store's
        # rewrite began (a schedule of another class), and is named alike on every route.
        check_checkpoint(path, model=trainer.model, optimizer=trainer.optimizer, scheduler=trainer.scheduler)
        from ..stream.checkpoint import load_into_streaming, verify_checkpoint_file

        # One open file from here to the last stage: a save renaming a new checkpoint over the path meanwhile
        # is neither mixed in nor loaded unverified.
        with open_checkpoint(path, identity) as file:
            # The data against its checksums too, before the route starts: a corrupt file must not move the
            # whole state into a new store first (nothing would be lost, but nothing should change).
            verify_checkpoint_file(file)
            if trainer.stream is None:
                trainer._start_streaming(for_checkpoint=True)
            meta = load_into_streaming(trainer.stream, file, verified=True)
        trainer.step_count = meta["step"]
        return meta.get("extra") or {}
    from ..nn.deferred import has_deferred

    if trainer.route == "auto" and has_deferred(trainer.model):
        # A deferred model before route auto's choice: loading now would make it whole in memory (and the
        # optimizer's state beside it) before the plan measures the process, so a run that streamed within
        # its limit could not resume at that limit ("nothing fits"). Checked now, as a load on any route is
        # (a bad file changes nothing), and loaded at step 1 where the chosen route keeps the model.
        path = Path(path)
        identity = path_identity(path)
        meta = check_checkpoint(path, model=trainer.model, optimizer=trainer.optimizer, scheduler=trainer.scheduler)
        from ..stream.checkpoint import verify_checkpoint_file

        with open_checkpoint(path, identity) as file:
            verify_checkpoint_file(file)
        # With its identity: the file loaded at step 1 must be this one, checked and verified now.
        trainer._pending_checkpoint = (path, identity)
        trainer.step_count = meta["step"]
        log.info("checkpoint %s checked; it is loaded at step %d, once route auto has chosen where the model "
                 "lives (the model is deferred: loading it now would make it whole in memory)", path,
                 meta["step"] + 1)
        return meta.get("extra") or {}
    trainer._pending_checkpoint = None  # a later load replaces one that was waiting
    # A Ctrl-C is held until the load is whole: the model, then the optimizer, the schedule and the step count
    # are written in turn, and one stopped between them left a silent mix of two states to train on or save.
    with SigintDeferred("the checkpoint's load", lambda: _load_abandoned(path)):
        meta = load_checkpoint(path, model=trainer.model, optimizer=trainer.optimizer, scheduler=trainer.scheduler)
        trainer.step_count = meta["step"]
    return meta.get("extra") or {}


def _load_abandoned(path) -> str:
    return (f"the load of {path} was abandoned part-way by a second Ctrl-C (the first was held until it completed): "
            f"the model, the optimizer's state, the schedule and the step count may each be the file's or the ones "
            f"before. Load it again before training or saving")


def make_whole(trainer: Trainer, why: str) -> None:
    """Before step 1, give what reads the model (save, evaluate) a model with values: a waiting checkpoint is
    loaded (load_pending), and a deferred model without one is made where the route keeps it: the streaming
    store (the route starts), else memory. Both raised DeferredParameterError before step 1, its advice ("hand
    the model to a Trainer") naming what had been done."""
    load_pending(trainer, why)
    from ..nn.deferred import has_deferred

    if trainer.stream is not None or not has_deferred(trainer.model):
        return
    if trainer.route == "streaming":
        log.info("starting the streaming route now (%s): it makes the deferred model in its store", why)
        trainer._start_streaming()
    else:
        trainer._materialize(why)


def load_pending(trainer: Trainer, why: str) -> None:
    """Load the checkpoint load() left waiting (if any) where the route now keeps the model: into the store
    when streaming (stage by stage), else into the model made whole in memory."""
    pending, trainer._pending_checkpoint = trainer._pending_checkpoint, None
    if pending is None:
        return
    from .checkpoint import _replaced, open_checkpoint, path_identity

    path, identity = pending
    if path_identity(path) != identity:
        # Refused before anything changes, and left waiting: every use before a new load() refuses the same
        # way, where going on would train the model as built under the checkpoint's step count.
        trainer._pending_checkpoint = pending
        raise _replaced(path, "after trainer.load() checked it")
    log.info("loading the checkpoint %s now (%s)", path, why)
    if trainer.route == "streaming":
        from ..stream.checkpoint import load_into_streaming

        with open_checkpoint(path, identity) as file:
            if trainer.stream is None:
                trainer._start_streaming(for_checkpoint=True)
            # Its checksums were checked by load() (on this file: its identity is the same); reading it once
            # more here would cost RSS the plan does not count (the resumed vit-tiny of
            # test_streaming_rss_under_cgroup.py went 1.7% over its need).
            meta = load_into_streaming(trainer.stream, file, verified=True)
    else:
        from .checkpoint import load_checkpoint

        trainer._materialize(f"the checkpoint {path} is loaded into it ({why})")
        meta = load_checkpoint(path, model=trainer.model, optimizer=trainer.optimizer, scheduler=trainer.scheduler)
    trainer.step_count = meta["step"]
