"""The model's buffers on the streaming route: each stage's writes kept once per step, as the eager step keeps them.

A forward in training may write buffers (register_buffer: BatchNorm's running_mean and
num_batches_tracked). The eager step runs each stage's forward once; the streaming route runs it
once more per backward sweep, to recompute the stage with grad (two sweeps with clip_grad_norm), so
without care the buffers see every batch two or three times. So `StageBuffers` notes which buffers
each stage's real forward changed (their values before and after it), and around each recompute:
  - before: those buffers go back to their values before the real forward, so the recompute reads what
    the real forward read and computes the same outputs;
  - after: back to those values again, so the next stage down, recomputed next, finds what it found;
and once a sweep ends, however it ends, every buffer goes back to where the real forwards left it.
With micro-batches (StreamingRoute(micro_batch=m)) each stage runs once per micro-batch, in order, as the eager
route's micro-batches run it; so the writes are noted per (stage, micro-batch). In a sweep, micro-batch i + 1 of a
stage runs on what micro-batch i left, as its real forward did, and after the stage's last one every buffer the
stage changed goes back to its value before the stage's first.
A stage whose recompute writes a buffer its real forward did not change (a forward that branches on
something besides its input, the generators and the buffers) is still put right by that last step.

A model without buffers (tensorarena's own) costs one walk over its modules per step, nothing more.
"""

from __future__ import annotations

from ..compile.step_state import BufferStates, buffer_slots, buffer_states, buffer_unchanged, restore_buffers
from ..nn.module import Module


class StageBuffers:
    """The buffers' values before and after each stage's real forwards (their writes) in one step."""

    def __init__(self, model: Module, stages: int, micro_batches: int = 1) -> None:
        self.slots = buffer_slots(model)  # found once a step: a snapshot per stage reads only these
        self.last = buffer_states(slots=self.slots)  # as the real forwards so far left them
        self.micro_batches = micro_batches
        # Per stage and micro-batch, once its real forward ran: (before, after), the entries of the buffers it changed.
        self.writes: list[list[tuple[BufferStates, BufferStates] | None]] = [[None] * micro_batches
                                                                             for _ in range(stages)]

    def ran(self, k: int, m: int = 0) -> None:
        """Stage k's real forward on micro-batch m (its first this step) has just run: note the buffers it changed."""
        now = buffer_states(slots=self.slots)
        changed = [i for i, entry in enumerate(self.last) if not buffer_unchanged(entry)]
        self.writes[k][m] = (BufferStates(self.last[i] for i in changed), BufferStates(now[i] for i in changed))
        self.last = now

    def before(self, k: int, m: int = 0) -> None:
        """Before stage k's forward on micro-batch m in a backward sweep: a recompute finds the values its real
        forward found (the last stage's first forwards, in the first sweep, are its real ones: nothing to do)."""
        if self.writes[k][m] is not None:
            restore_buffers(self.writes[k][m][0])

    def after(self, k: int, m: int = 0) -> None:
        """After stage k's forward on micro-batch m in a backward sweep: note its writes if it was the real one.
        The stage's next micro-batch goes on from there; after its last, the stage's buffers go back to the values
        the stage found, for the stage below it."""
        if self.writes[k][m] is None:
            self.ran(k, m)
        if m == self.micro_batches - 1:
            for writes in reversed(self.writes[k]):
                restore_buffers(writes[0])

    def sweep_ended(self) -> None:
        """A sweep ended (done, a non-finite loss, an error): every buffer as the real forwards left it."""
        restore_buffers(self.last)
