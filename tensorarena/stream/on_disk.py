"""The mark of a parameter whose values the streaming store holds: what it points at while on disk.

StreamingRoute (route.py) offloads a streamed parameter by pointing it at a placeholder array and at `_ON_DISK`
as its arena, so that code reading it outside the route gets ON_DISK_MESSAGE instead of the placeholder's zeros or
the stale-arena error. `_in_memory_bytes` counts what is not so marked (for StreamingRoute.estimate).
"""

from __future__ import annotations

import numpy as np

from ..memory.arena import StaleTensorError
from ..optim.optimizer import Optimizer
from .stages import Stage


class _OnDisk:
    """Stands in for the arena of a parameter the store holds, so reading it raises a clear error.

    Tensor.data reads the arena's generation to compare it with the tensor's; here that read raises,
    with a message of its own: the stale-arena one ("its memory now belongs to other tensors") would be
    wrong, and would not say what to do.
    """

    closed = True
    name = "the streaming store"
    on_disk = True  # what Optimizer.state_dict looks for (optim cannot import this module: it imports optim)

    @property
    def generation(self) -> int:
        raise StaleTensorError(ON_DISK_MESSAGE)

    def __reduce_ex__(self, protocol):
        # copy.deepcopy and pickle reach the marker through each parameter on disk: copied, it made a model whose
        # parameters point at no store (every read raised, and to_memory() could not help the copy). Refused at
        # the copy instead, where the advice still works.
        raise StaleTensorError(COPY_MESSAGE)


ON_DISK_MESSAGE = (
    "this parameter lives on disk, in the store of a StreamingRoute that trains it, so it cannot be read or "
    "changed in place (a forward outside the route, model.load_state_dict, ...). Bring the training state back "
    "into memory first with trainer.stream.to_memory() (a route of your own: route.to_memory(); after "
    "route.close(): StreamingRoute.resume(...).to_memory()); read or change it there, and the next training "
    "step moves it into the store again. To restore a checkpoint, trainer.load(path) writes it into the store "
    "directly.")

COPY_MESSAGE = (
    "cannot copy or pickle a model (or a parameter) whose parameters live on disk, in the store of a StreamingRoute "
    "that trains them: the copy would have no store behind it, so none of its parameters could ever be read. "
    "Bring the training state back into memory first with trainer.stream.to_memory() (a route of your own: "
    "route.to_memory()), then copy (copy.deepcopy(model), pickle); the next training step moves it into the store "
    "again. To keep a snapshot without leaving the store, save a checkpoint (trainer.save(path)).")


_ON_DISK = _OnDisk()


def _in_memory_bytes(stages: list[Stage], optimizer: Optimizer) -> int:
    """Bytes of the stages' parameters (and their optimizer state arrays) that are in memory, not on disk."""
    total = 0
    for p in {id(p): p for s in stages for p in s.params}.values():
        if p._arena is _ON_DISK or p.is_deferred:  # a deferred one has no values yet (made into the slot)
            continue
        total += p._data.nbytes
        total += sum(v.nbytes for v in (optimizer.state.get(p) or {}).values() if isinstance(v, np.ndarray))
    return total
