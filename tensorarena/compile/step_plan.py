"""A traced step's plan for one batch signature, and the arenas that replay it.

`StepPlan` holds what compile/step.py's trace found: the buffers in the order the step asks for them, their
places in the one slab (compile/planner.py), the persistent inputs, and the memory report known before
step 1. `PlannedArena` hands a replayed step those slab views in order, checking each request against the
trace, so a step whose control flow depends on the data fails loudly instead of running on a wrong plan;
`TapeArena` does the same for a captured replay's kernel scratch (compile/captured.py).
"""

from __future__ import annotations

import bisect
import gc
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import tape
from ..memory.arena import Arena
from ..memory.meter import format_bytes
from .planner import MemoryPlan
from .trace import PlanMismatchError, TracedBuffer

Signature = tuple  # ((input shape, dtype), targets' layout): what batch_signature gives, one plan each


@dataclass
class StepPlan:
    """One traced step for one batch signature: buffers, their slab placement and the persistent inputs."""

    signature: Signature
    buffers: list[TracedBuffer]
    memory: MemoryPlan
    slab: np.ndarray
    views: list[np.ndarray]  # views[i]: traced buffer i inside the slab
    inputs: np.ndarray
    targets: Any  # what loss_fn gets: one buffer, None, or the caller's structure around target_buffers
    host_calls: list[str]
    persistent: dict[str, int] = field(default_factory=dict)  # filled by FusedStep: params, grads, state...
    matmul_precision: str = "float32"  # of float32 products, traced and replayed (tensorarena.precision)
    capture: Any = None  # replay="captured": its recording or why there is none (compile/captured.py)
    target_buffers: list[np.ndarray] = field(default_factory=list)  # each array of the targets, in order
    # occupants[j]: the buffers whose slab bytes buffer j takes over (previous_occupants): the trace let them go
    # before j was asked for, so a Python replay still holding one has left its trace (PlannedArena.alloc)
    occupants: list[tuple[int, ...]] = field(default_factory=list)
    # What the traced run left the process holding that no plan buffer is (compile/step_trace.py measures the
    # resident bytes around it, freed memory returned): the GEMM libraries' working memory (MKL keeps bfloat16
    # and float32 copies of the largest product operand; OpenBLAS touches a buffer per thread), their code pages
    # run for the first time, kernels compiled for this step. Replays hold it too, so the prediction counts it.
    libraries_measured: int = 0

    def __post_init__(self) -> None:
        if not self.target_buffers and isinstance(self.targets, np.ndarray):
            self.target_buffers = [self.targets]

    @property
    def program(self) -> list[tuple[str, str, str]]:
        """The flat list the plan runs: (kind, what, where) for every buffer-producing op, then the host calls."""
        rows = [("op", b.op, f"{b.shape} {b.dtype} @ slab+{self.memory.offsets[str(b.index)]}") for b in self.buffers]
        rows += [("host", call, "flat buffers") for call in self.host_calls]
        return rows

    def memory_report(self) -> dict[str, int]:
        """Bytes by kind, known before step 1: persistent (params, grads, state.*, inputs; "grads outside the
        optimizer": the .grad kept for trainable parameters in no param group), slab, the predicted peak
        (everything training holds, with what the libraries kept from the trace: libraries_measured) and predicted
        growth (what it adds to a process that has the model)."""
        report = dict(self.persistent)
        report["inputs"] = self.inputs.nbytes + sum(b.nbytes for b in self.target_buffers)
        persistent = sum(report.values())
        report["persistent_total"] = persistent
        report["slab"] = self.memory.slab_bytes
        report["slab_lower_bound"] = self.memory.peak_live_bytes
        report["saved_by_reuse"] = self.memory.saved_bytes
        report["libraries_measured"] = self.libraries_measured
        report["predicted_peak"] = persistent + self.memory.slab_bytes + self.libraries_measured
        # The parameters existed before: flattening moves them (the old arrays are freed and
        # returned), so what training adds to the process is the peak less one copy of them.
        report["predicted_growth"] = (report["predicted_peak"] - report["params"]
                                      - report.get("params_not_trained", 0))
        return report

    def format_report(self) -> str:
        lines = [f"fused plan for inputs {self.signature[0]}, targets {self.signature[1]}: "
                 f"{len(self.buffers)} buffers, {len(self.host_calls)} host calls, float32 products in "
                 f"{self.matmul_precision}"]
        for key, value in self.memory_report().items():
            lines.append(f"  {key:<20} {format_bytes(value):>12}")
        return "\n".join(lines)


def previous_occupants(buffers: list[TracedBuffer], offsets: dict[str, int]) -> list[tuple[int, ...]]:
    """For each buffer j, in the order the step asks for them, the buffers last placed on any of its slab bytes
    before it: the ones the plan lets j overwrite because the trace saw them die first. (Older occupants of
    those bytes were taken over, and so checked, by an earlier buffer.)"""
    starts: list[int] = []  # disjoint byte ranges of the slab, sorted, each with the buffer placed there last
    ends: list[int] = []
    owners: list[int] = []
    out: list[tuple[int, ...]] = []
    for b in buffers:
        lo = offsets[str(b.index)]
        hi = lo + b.nbytes
        if not b.nbytes:
            out.append(())
            continue
        k = max(bisect.bisect_right(starts, lo) - 1, 0)
        if k < len(starts) and ends[k] <= lo:
            k += 1
        end, found, pieces, tail = k, [], [], None
        while end < len(starts) and starts[end] < hi:
            found.append(owners[end])
            if starts[end] < lo:  # the part before j's bytes stays its previous occupant's
                pieces.append((starts[end], lo, owners[end]))
            if ends[end] > hi:  # and the part after them
                tail = (hi, ends[end], owners[end])
            end += 1
        pieces.append((lo, hi, b.index))
        if tail is not None:
            pieces.append(tail)
        starts[k:end] = [p[0] for p in pieces]
        ends[k:end] = [p[1] for p in pieces]
        owners[k:end] = [p[2] for p in pieces]
        out.append(tuple(dict.fromkeys(found)))
    return out


class PlannedArena(Arena):
    """A step arena whose i-th allocation is the plan's precomputed slab view i; it owns no blocks."""

    def __init__(self, plan: StepPlan, name: str) -> None:
        super().__init__(name=name)
        self.plan = plan
        self.cursor = 0
        self.stats.high_water = plan.memory.slab_bytes
        self._held: list[int] | None = None  # each view's reference count before the step (see _check_let_go)

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        i = self.cursor
        buffers = self.plan.buffers
        if i >= len(buffers):
            raise PlanMismatchError(
                f"this step asked for more buffers than its trace ({len(buffers)}): buffer #{i} {tuple(shape)} "
                f"{np.dtype(dtype)}. The step's control flow depends on the data (or on Python state outside "
                f"the model's modules); use route='eager' for it.")
        b = buffers[i]
        if b.shape != tuple(shape) or b.dtype != np.dtype(dtype):
            raise PlanMismatchError(
                f"this step diverged from its trace at buffer #{i}: the trace had {b.op} -> {b.shape} {b.dtype}, "
                f"this step asked for {tuple(shape)} {np.dtype(dtype)}. The step's control flow depends on "
                f"the data (or on Python state outside the model's modules); use route='eager' for it.")
        recording = tape.active()
        if recording is None and i < len(self.plan.occupants):
            if self._held is None:  # before the step holds any: what holds each view from outside it
                views = self.plan.views
                self._held = [sys.getrefcount(views[k]) for k in range(len(views))]
            if self.plan.occupants[i]:
                self._check_let_go(i)
        self.cursor = i + 1
        self.stats.allocations += 1
        if recording is not None and recording.depth:  # scratch a recorded kernel takes: its replay needs it too
            recording.allocations.append(i)
        return self.plan.views[i]

    def holds(self, array: np.ndarray) -> bool:
        """Whether `array` may be memory of the plan's slab (its allocations are the slab's views)."""
        return np.may_share_memory(array, self.plan.slab)

    def _check_let_go(self, j: int) -> None:
        """PlanMismatchError if a buffer whose bytes j takes over is still held: the trace had let it go, so this
        step's control flow left the trace's, though it asked for the same buffers (a branch on the data that
        keeps a value longer). Without the check its bytes were overwritten while read: wrong results, no error.

        Held means referenced beyond what referenced it before the step began (the plan's list; a caller's
        object kept from the last step): the op's Tensor, a backward closure or a local holds the view itself,
        since a view of it takes the slab as its base. A reference held only by garbage in a cycle is not a
        hold: one collection is run before refusing."""
        views = self.plan.views
        held = [i for i in self.plan.occupants[j] if sys.getrefcount(views[i]) > self._held[i]]
        if held:
            gc.collect()
            held = [i for i in held if sys.getrefcount(views[i]) > self._held[i]]
        if held:
            i = held[0]
            b, now = self.plan.buffers[i], self.plan.buffers[j]
            raise PlanMismatchError(
                f"this step still holds buffer #{i} ({b.op} -> {b.shape} {b.dtype}) when it asks for buffer #{j} "
                f"({now.op} -> {now.shape} {now.dtype}), which the plan puts in its memory because the trace had "
                f"let #{i} go by then. The step's control flow depends on the data (or on Python state outside "
                f"the model's modules); use route='eager' for it.")


class TapeArena(PlannedArena):
    """The arena of a captured replay: hands out, in order, the plan buffers the recorded calls allocated
    inside themselves (kernel scratch, e.g. attention's per-core tiles), and nothing else."""

    def __init__(self, plan: StepPlan, order: list[int], name: str) -> None:
        super().__init__(plan, name)
        self.order = order

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if self.cursor >= len(self.order):
            raise PlanMismatchError(f"a captured replay asked for more scratch buffers than its recording "
                                    f"({len(self.order)}): {tuple(shape)} {np.dtype(dtype)}")
        i = self.order[self.cursor]
        b = self.plan.buffers[i]
        if b.shape != tuple(shape) or b.dtype != np.dtype(dtype):
            raise PlanMismatchError(f"a captured replay diverged from its recording at scratch buffer #{i}: "
                                    f"recorded {b.shape} {b.dtype}, asked {tuple(shape)} {np.dtype(dtype)}")
        self.cursor += 1
        self.stats.allocations += 1
        return self.plan.views[i]
