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


def check_save_room(save: str | os.PathLike, optimizer: Optimizer, command: str = "train", *,
                    need: int | None = None, what: str = "the checkpoint takes about {need} (parameters and "
                                                         "optimizer state)") -> None:
    """SystemExit before step 1 when the disk of --save has less free space than the checkpoint will take (it is
    written beside the old file and renamed over it, so all of it is needed even where a checkpoint is there).
    `need` and `what`: another output's bytes and words (simcse's model directory: the parameters alone)."""
    folder = Path(save).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    need = checkpoint_bytes(optimizer) if need is None else need
    free = shutil.disk_usage(folder).free
    if free < need:
        raise SystemExit(f"tensorarena {command}: --save {save}: its disk has {format_bytes(free)} free and "
                         f"{what.format(need=format_bytes(need))}; free space or pass a --save on another disk")


def save_or_rescue(trainer, target: str | os.PathLike, extra: dict) -> None:
    """trainer.save(target); where that fails (an OSError: no room, the disk gone read-only), the same checkpoint
    into the first of the temporary directory, /var/tmp and the working directory that takes it, and a
    CheckpointNotSaved saying where it went (or that no place took it)."""
    write_or_rescue(lambda path: trainer.save(path, extra=extra), target, trainer.step_count,
                    suffix=".safetensors", what="checkpoint", then="move it where it should be and --resume it from "
                                                                  "there")


def write_or_rescue(write, target: str | os.PathLike, steps: int, *, suffix: str, what: str, then: str) -> None:
    """write(target); where that raises an OSError, write(path) for a path in the first of the temporary
    directory, /var/tmp and the working directory that takes it, then CheckpointNotSaved saying where the `what`
    of the run's `steps` went and `then` what to do (or that no place took it: it is lost)."""
    try:
        write(target)
        return
    except OSError as err:
        failed = err
    steps_text = f"{steps} step{'s' if steps != 1 else ''}"
    name = f"tensorarena-rescue-{os.getpid()}-step{steps}{suffix}"
    tried = list(dict.fromkeys([tempfile.gettempdir(), "/var/tmp", os.getcwd()]))
    for folder in tried:
        path = Path(folder) / name
        try:
            write(path)
        except OSError:
            continue
        raise CheckpointNotSaved(f"--save {target} could not be written ({failed}); the {what} of the {steps_text} "
                                 f"was saved to {path} instead: {then}") from None
    raise CheckpointNotSaved(f"--save {target} could not be written ({failed}), nor could the {what} of the "
                             f"{steps_text} be written to {', '.join(tried)}: it is lost; free disk space before the "
                             f"next run") from None
