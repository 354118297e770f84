"""StreamingRoute.estimate's sums: what streaming a model would hold, before a route or its store exists.

Its own file because it needs none of the route's state, only the store's layouts (store.py) of the model's stages;
train/route_plan.py calls it through StreamingRoute.estimate, whose docstring says what each field is.
"""

from __future__ import annotations

from typing import Any

from ..nn.deferred import fill_bytes
from ..nn.module import Module
from ..optim.optimizer import Optimizer
from . import optim_state
from .on_disk import _in_memory_bytes
from .stages import model_stages
from .store import ArraySpec, StageLayout, StageSpec, StoreSpec


def estimate(model: Module, optimizer: Optimizer) -> dict[str, Any]:
    """StreamingRoute.estimate's work (its docstring says what each field is)."""
    kinds = optim_state.state_kinds(optimizer)
    stages = model_stages(model)
    spec = StoreSpec(tuple(StageSpec(s.name, tuple(ArraySpec(f"{s.name}.{i}", tuple(p.shape), p.dtype.str)
                                                    for i, p in enumerate(s.params))) for s in stages),
                     kinds.optimizer, kinds.arrays, kinds.scalars)
    layouts = [StageLayout(stage, spec) for stage in spec.stages]
    largest = max(layouts, key=lambda layout: layout.total_bytes)
    in_memory = _in_memory_bytes(stages, optimizer)
    fill = max((fill_bytes(p) for s in stages for p in s.params if p.is_deferred), default=0)
    return {"stages": len(layouts), "largest_stage": largest.stage.name,
            "resident_bytes": 2 * largest.total_bytes + max(lay.params_bytes for lay in layouts),
            # one stage's gradients: with micro_batch, the route holds a second buffer of this, their sum
            "grad_bytes": max(lay.params_bytes for lay in layouts),
            "disk_bytes": sum(lay.total_bytes for lay in layouts),
            # forward reads parameters (all stages but the last), backward reads and writes everything
            "read_bytes_per_step": sum(lay.params_bytes + lay.total_bytes for lay in layouts[:-1])
            + layouts[-1].total_bytes,
            "written_bytes_per_step": sum(lay.total_bytes for lay in layouts),
            "in_memory_bytes": in_memory, "fill_bytes": fill,
            "move_in_bytes": in_memory + largest.total_bytes + fill}
