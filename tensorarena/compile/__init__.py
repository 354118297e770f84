"""Compiling a training step: trace it, plan its buffers into one slab by liveness, replay it (the fused route)."""

from .planner import BufferSpec, MemoryPlan, plan_memory
from .trace import PlanMismatchError, UnsupportedInputError, UnsupportedOpError, is_tracing, unsupported

__all__ = ["BufferSpec", "MemoryPlan", "plan_memory", "PlanMismatchError", "UnsupportedOpError",
           "UnsupportedInputError", "is_tracing", "unsupported", "compile_step", "FusedStep"]


def __getattr__(name: str):
    # compile.step needs nn and optim, which need ops, which import compile.trace: load it on first use.
    if name in ("compile_step", "FusedStep"):
        from . import step

        return getattr(step, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
