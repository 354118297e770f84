"""The stage protocol: how a model tells the streaming route where it may be cut.

A model that can stream defines `stream_stages()` returning an ordered list of `Stage`s.
Each stage owns some parameters and maps the previous stage's output to its own:

    stage 0      forward(batch inputs)      -> activation
    stage i      forward(activation)        -> activation
    last stage   forward(activation)        -> model outputs (what loss_fn takes)

Composing every stage's `forward` in order must compute exactly `model(inputs)` (same ops,
same order, same dropout draws), because the streaming route recomputes each stage on its
own in backward and must reproduce the eager step. Every trainable parameter belongs to
exactly one stage, so each stage can be loaded, differentiated and updated by itself.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

from ..nn.module import Module
from ..nn.parameter import Parameter


class Stage(NamedTuple):
    """One streamable piece of a model: its name, its parameters and its forward."""

    name: str
    params: tuple[Parameter, ...]
    forward: Callable[[Any], Any]


class StreamingUnsupportedError(TypeError):
    """The model cannot be split into stages for the streaming route."""


def model_stages(model: Module) -> list[Stage]:
    """`model.stream_stages()`, checked: named uniquely, covering each trainable parameter once."""
    method = getattr(model, "stream_stages", None)
    if method is None:
        raise StreamingUnsupportedError(
            f"{type(model).__name__} has no stream_stages() method, so the streaming route cannot split it "
            f"into blocks; train it with the eager route, or give it a stream_stages() that returns "
            f"[Stage(name, params, forward), ...] (see tensorarena/stream/stages.py)")
    raw: Sequence = method()
    stages = []
    for i, entry in enumerate(raw):
        try:
            name, params, forward = entry
        except (TypeError, ValueError):
            raise StreamingUnsupportedError(
                f"{type(model).__name__}.stream_stages() entry {i} must be (name, params, forward), got "
                f"{type(entry).__name__}") from None
        if not callable(forward):
            raise StreamingUnsupportedError(f"stage {name!r}: forward must be callable, got {type(forward).__name__}")
        stages.append(Stage(str(name), tuple(params), forward))
    if not stages:
        raise StreamingUnsupportedError(f"{type(model).__name__}.stream_stages() returned no stages")

    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise StreamingUnsupportedError(f"stage names must be unique, got {names}")
    owner: dict[int, str] = {}
    for stage in stages:
        for p in stage.params:
            if not isinstance(p, Parameter):
                raise StreamingUnsupportedError(f"stage {stage.name!r} lists a {type(p).__name__}, not a Parameter")
            if id(p) in owner:
                raise StreamingUnsupportedError(
                    f"a parameter of shape {p.shape} is in stages {owner[id(p)]!r} and {stage.name!r}; shared "
                    f"(tied) parameters cannot be updated block by block")
            owner[id(p)] = stage.name
    missing = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in owner]
    if missing:
        raise StreamingUnsupportedError(
            f"stream_stages() of {type(model).__name__} leaves trainable parameters out of every stage, so "
            f"they would never be trained: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    return stages


__all__ = ["Stage", "StreamingUnsupportedError", "model_stages"]
