"""The streaming store's layout: what a store holds (its specs) and where each array sits in a stage file.

Per stage file, at 64-byte aligned offsets: the parameters (first, so the forward pass can read just them),
then each state kind's arrays, then a (params, scalar kinds) float64 table. A slot (stream/store_io.py)
holds a stage in the same layout, so one StageLayout places the arrays in both.

Kept apart from ParamStore (stream/store.py) because it is plain data: the route builds the specs, and
reading the offsets needs none of the store's files, journal or I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

ALIGN = 64


@dataclass(frozen=True)
class ArraySpec:
    """One parameter: its dotted name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @cached_property  # asked for every view of every load
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class StageSpec:
    """One stage: its name and its parameters in order."""

    name: str
    params: tuple[ArraySpec, ...]


@dataclass(frozen=True)
class StoreSpec:
    """What a store holds: the stages and the optimizer state kinds kept per parameter."""

    stages: tuple[StageSpec, ...]
    optimizer: str
    state_arrays: tuple[str, ...]
    state_scalars: tuple[str, ...]

    def signature(self) -> list:
        """The model signature as the manifest records it (JSON-ready)."""
        return [{"stage": s.name, "params": [[a.name, list(a.shape), a.dtype] for a in s.params]}
                for s in self.stages]


def _signature_diff(theirs: list, mine: list) -> str:
    """The first differences between two signatures, in words."""
    if [s.get("stage") for s in theirs] != [s["stage"] for s in mine]:
        return (f"its stages are {[s.get('stage') for s in theirs][:6]}... ({len(theirs)}) but this model's are "
                f"{[s['stage'] for s in mine][:6]}... ({len(mine)})")
    for a, b in zip(theirs, mine):
        if a.get("params") != b["params"]:
            pa, pb = a.get("params") or [], b["params"]
            for x, y in zip(pa, pb):
                if x != y:
                    return (f"in stage {b['stage']!r} it holds {x[0]} {tuple(x[1])} {x[2]} where this model has "
                            f"{y[0]} {tuple(y[1])} {y[2]}")
            return f"stage {b['stage']!r} has {len(pa)} parameters in the store but {len(pb)} in this model"
    return "the signatures differ"


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class StageLayout:
    """Byte offsets of one stage's arrays inside its file (and inside a slot buffer)."""

    def __init__(self, stage: StageSpec, spec: StoreSpec) -> None:
        self.stage = stage
        offset = 0
        self.param_offsets = []
        for a in stage.params:
            self.param_offsets.append(offset)
            offset = _align(offset + a.nbytes)
        self.params_bytes = offset  # the forward pass reads [0, params_bytes)
        self.state_offsets: dict[str, list[int]] = {}
        for kind in spec.state_arrays:
            self.state_offsets[kind] = []
            for a in stage.params:
                self.state_offsets[kind].append(offset)
                offset = _align(offset + a.nbytes)
        self.scalar_offset = offset
        self.n_scalars = len(spec.state_scalars)
        offset = _align(offset + 8 * self.n_scalars * len(stage.params))
        self.total_bytes = offset


@dataclass
class StageViews:
    """Arrays of one stage inside a slot: writes to them are writes to the slot buffer (io="copy") or,
    through the mapping, to the stage file's pages (io="map")."""

    params: list[np.ndarray]
    state: list[dict[str, np.ndarray]] | None  # per parameter: kind -> array (None: parameters-only read)
    scalars: np.ndarray | None  # (params, scalar kinds) float64; row i belongs to parameter i

