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

Side inputs. A stage may need more of the batch than the activation it is given: every BERT layer
reads the attention mask, its last stage's pooling reads it too. Such a stage's forward is wrapped
in `SideForward` (Stage(name, params, SideForward(fn))) and is called as fn(activation, side). The
model then defines `stream_inputs(batch) -> (first, side)`: stage 0's input and `side`, a dict of
arrays computed once per step from the batch (the mask, token types). The route calls it once a
step, in the step arena (its bytes count in the step's high-water: `side_input_bytes`), and hands
the same dict to every SideForward stage, in forward, in each backward recompute and in predict.
Side inputs never carry a gradient. A model none of whose stages reads side inputs gets the batch
as stage 0's input, as before, whether or not it defines stream_inputs.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ..nn.module import Module
from ..nn.parameter import Parameter
from ..tensor import Tensor


class Stage(NamedTuple):
    """One streamable piece of a model: its name, its parameters and its forward."""

    name: str
    params: tuple[Parameter, ...]
    forward: Callable[[Any], Any]


class StreamingUnsupportedError(TypeError):
    """The model cannot be split into stages for the streaming route."""


class SideForward:
    """A stage forward that also reads the step's side inputs: called as fn(x, side); see the module docstring."""

    def __init__(self, fn: Callable[[Any, dict], Any], *, reads: str = "the step's side inputs") -> None:
        if not callable(fn):
            raise TypeError(f"SideForward needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.reads = reads  # what they are, in words, for the error below

    def __call__(self, x: Any, side: dict | None = None) -> Any:
        if side is None:
            # Computing the stage without them would silently train on a different model (BERT without its
            # attention mask: padding attended to). A caller that knows only single-activation stages lands here.
            raise StreamingUnsupportedError(
                f"this stage reads {self.reads}, and its caller passed only the activation; a caller that knows "
                f"only one-activation stages cannot run it, since without them it would compute another model "
                f"(a BERT attending to padding). route='streaming' and the route planner "
                f"run such stages (they pass model.stream_inputs(batch)); to run one yourself, use "
                f"tensorarena.stream.stages.stage_inputs and run_stage")
        return self.fn(x, side)

    def __repr__(self) -> str:
        return f"SideForward({getattr(self.fn, '__qualname__', self.fn)!r})"


def reads_side(stages: Sequence[Stage]) -> bool:
    """Whether any stage's forward reads the step's side inputs (a SideForward)."""
    return any(isinstance(s.forward, SideForward) for s in stages)


def run_stage(stage: Stage, x: Any, side: dict | None) -> Any:
    """stage.forward(x), with the step's side inputs when the stage reads them."""
    return stage.forward(x, side) if isinstance(stage.forward, SideForward) else stage.forward(x)


def stage_inputs(model: Module, stages: Sequence[Stage], batch: Any) -> tuple[Tensor, dict | None]:
    """Stage 0's input and the step's side inputs (None when no stage reads them) for `batch`, checked.

    Call it where the arrays should live (the route: in the step arena) and under no_grad: the side inputs
    are computed once per step and read by every stage, never differentiated.
    """
    if not reads_side(stages):
        return (batch if isinstance(batch, Tensor) else Tensor(batch)), None
    first, side = model.stream_inputs(batch)
    if not isinstance(side, dict):
        raise StreamingUnsupportedError(f"{type(model).__name__}.stream_inputs() must return (first, side) with side "
                                        f"a dict of arrays, got {type(side).__name__}")
    checked = {}
    for key, value in side.items():
        if isinstance(value, Tensor):
            if value.requires_grad:
                raise StreamingUnsupportedError(
                    f"{type(model).__name__}.stream_inputs() side input {key!r} requires a gradient; side inputs are "
                    f"computed once per step and never differentiated, so anything trained must flow through the "
                    f"stages' activations")
            value = value.data
        if value is not None and not isinstance(value, np.ndarray):
            raise StreamingUnsupportedError(f"{type(model).__name__}.stream_inputs() side input {key!r} is a "
                                            f"{type(value).__name__}; side inputs must be NumPy arrays (or None)")
        checked[key] = value
    return (first if isinstance(first, Tensor) else Tensor(first)), checked


def unstaged_forward(module: Module, stages_method: str = "stream_stages") -> str | None:
    """Where `module`'s forward is overridden below the class defining the method that cuts it into stages
    (`stages_method`), or on the instance itself, in words ('TempViT.forward overrides the forward
    ViT.stream_stages() computes'); else None. Stages are written for the forward they were defined next to, and
    the streaming route runs them in its place.
    """
    if stages_method in vars(module):  # stages given to this instance: nothing below them to compare
        return None
    mro = type(module).__mro__
    owner = next((i for i, cls in enumerate(mro) if stages_method in vars(cls)), None)
    if owner is None:
        return None
    where = [f"the instance attribute {name}" for name in ("forward", "__call__") if name in vars(module)]
    where += [f"{cls.__name__}.{name}" for cls in mro[:owner] for name in ("forward", "__call__") if name in vars(cls)]
    if not where:
        return None
    return f"{where[0]} overrides the forward {mro[owner].__name__}.{stages_method}() computes"


def model_stages(model: Module) -> list[Stage]:
    """`model.stream_stages()`, checked: named uniquely, covering each trainable parameter once."""
    method = getattr(model, "stream_stages", None)
    if method is None:
        raise StreamingUnsupportedError(
            f"{type(model).__name__} has no stream_stages() method, so the streaming route cannot split it "
            f"into blocks; train it with the eager route, or give it a stream_stages() that returns "
            f"[Stage(name, params, forward), ...] (see tensorarena/stream/stages.py)")
    overridden = unstaged_forward(model)
    if overridden is not None:
        # The route runs the stages, never model(x): a forward wrapped below the class that cut the model (the
        # advice of the refused register_forward_hook) would silently not run, and another model would be trained.
        raise StreamingUnsupportedError(
            f"{type(model).__name__} cannot stream: {overridden}, and the streaming route runs the stages, never "
            f"forward()/__call__, so that code would silently not run and the model trained would differ from the "
            f"eager one. Train it with route='eager' or 'fused', or override stream_stages() next to that forward "
            f"so that composing the stages computes it (return super().stream_stages() if it computes the same)")
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
    if reads_side(stages) and not callable(getattr(model, "stream_inputs", None)):
        raise StreamingUnsupportedError(
            f"stages of {type(model).__name__} read side inputs (SideForward), but the model has no "
            f"stream_inputs(batch) -> (first, side) to compute them from the batch; define it (see "
            f"tensorarena/stream/stages.py)")

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


__all__ = ["Stage", "SideForward", "StreamingUnsupportedError", "model_stages", "reads_side", "run_stage",
           "stage_inputs", "unstaged_forward"]
