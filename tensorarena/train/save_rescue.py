"""A train job's --save when its disk cannot take the checkpoint: refused before step 1 where the free space is
known to be too small, and, where a write fails anyway at the end (the disk filled during the run), the state saved
elsewhere and the place said, instead of a traceback after the whole run and every trained step lost (a hunt: a
--save on a 600 KiB disk trained, then failed twice with ENOSPC and printed a traceback).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..memory.meter import format_bytes
from ..optim.optimizer import Optimizer


class CheckpointNotSaved(OSError):
    """--save could not be written; the message says where the state went instead (or that it went nowhere)."""


def checkpoint_bytes(optimizer: Optimizer) -> int:
    """About the bytes a checkpoint of this run takes: parameters and optimizer state (its header and schedule are
    small beside them), from shapes alone (route_plan.persistent_bytes, less the gradients a checkpoint leaves)."""
    from .route_plan import persistent_bytes

    parts = persistent_bytes(optimizer)
    return sum(size for kind, size in parts.items() if kind != "grads")


def check_save_room(save: str | os.PathLike, optimizer: Optimizer, command: str = "train") -> None:
    """SystemExit before step 1 when the disk of --save has less free space than the checkpoint will take (it is
    written beside the old file and renamed over it, so all of it is needed even where a checkpoint is there)."""
    folder = Path(save).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    need, free = checkpoint_bytes(optimizer), shutil.disk_usage(folder).free
    if free < need:
        raise SystemExit(f"tensorarena {command}: --save {save}: its disk has {format_bytes(free)} free and the "
                         f"checkpoint takes about {format_bytes(need)} (parameters and optimizer state); free space "
                         f"or pass a --save on another disk")


def save_or_rescue(trainer, target: str | os.PathLike, extra: dict) -> None:
    """trainer.save(target); where that fails (an OSError: no room, the disk gone read-only), the same checkpoint
    into the first of the temporary directory, /var/tmp and the working directory that takes it, and a
    CheckpointNotSaved saying where it went (or that no place took it)."""
    try:
        trainer.save(target, extra=extra)
        return
    except OSError as err:
        failed = err
    steps = f"{trainer.step_count} step{'s' if trainer.step_count != 1 else ''}"
    name = f"tensorarena-rescue-{os.getpid()}-step{trainer.step_count}.safetensors"
    tried = list(dict.fromkeys([tempfile.gettempdir(), "/var/tmp", os.getcwd()]))
    for folder in tried:
        path = Path(folder) / name
        try:
            trainer.save(path, extra=extra)
        except OSError:
            continue
        raise CheckpointNotSaved(f"--save {target} could not be written ({failed}); the checkpoint of the "
                                 f"{steps} was saved to {path} instead: move it where it should be and --resume "
                                 f"it from there") from None
    raise CheckpointNotSaved(f"--save {target} could not be written ({failed}), nor could the checkpoint of the "
                             f"{steps} be written to {', '.join(tried)}: it is lost; free disk space before the "
                             f"next run") from None
