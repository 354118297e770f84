"""Compiling a training step: liveness-based static memory planning (the tracer comes next)."""

from .planner import BufferSpec, MemoryPlan, plan_memory

__all__ = ["BufferSpec", "MemoryPlan", "plan_memory"]
