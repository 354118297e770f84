"""Which replay a fused step runs: the captured recording (compile/captured.py) or the Python replay.

A recording assumes the step does the same work for every batch of its signature: the checks that
vet it (captured.py) cannot see a branch on the data's values that both checking batches take the
same way. So `replay="auto"`, the default, takes the captured replay only when every module class of
the model and the loss function are tensorarena's own, whose Python is kept free of such branches
(BertModel passes its padding mask even for a batch without padding; the masks, positions and dropout
seeds the layers make from the batch are written by recorded calls), and the Python replay, with the
reason logged, as soon as any is the user's (a Module subclass, a forward set on an instance, a loss
function of one's own). `replay="captured"` opts such code in; "python" opts out.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..nn.module import Module

REPLAYS = ("auto", "python", "captured")


def _foreign_code(model: "Module", loss_fn: Any) -> str | None:
    """The first class or function in the step that is not tensorarena's own, or None when the whole
    step's Python is this package's (audited not to branch on data values: see the module docstring)."""
    for module in model.modules():
        cls = type(module)
        if not cls.__module__.startswith("tensorarena."):
            return f"{cls.__module__}.{cls.__qualname__}"
        if "forward" in vars(module):  # a forward set on the instance (a wrapper, a patch) is not ours either
            return f"the forward set on a {cls.__qualname__} instance"
    fn = loss_fn
    while isinstance(fn, functools.partial):
        fn = fn.func
    where = getattr(fn, "__module__", None) or ""
    if not where.startswith("tensorarena."):
        return f"the loss function {getattr(fn, '__qualname__', repr(fn))} ({where or 'no module'})"
    return None


def choose_replay(replay: str, model: "Module", loss_fn: Any) -> tuple[str, str]:
    """(the replay a FusedStep runs, why): "auto" takes the captured replay when every module class and the
    loss function are tensorarena's, the Python replay when any is the user's, whose branches on data
    values a recording could not follow (pass "captured" to opt in for such code)."""
    if replay not in REPLAYS:
        raise ValueError(f"replay must be 'auto' (captured for tensorarena's own models and losses), 'python' "
                         f"(re-run the ops each step) or 'captured' (replay their recorded calls, "
                         f"compile/captured.py), got {replay!r}")
    if replay != "auto":
        return replay, "asked for"
    foreign = _foreign_code(model, loss_fn)
    if foreign is None:
        return "captured", "auto: the model's modules and the loss are all tensorarena's"
    return "python", (f"auto: {foreign} is not tensorarena's, and a recording cannot follow a branch its Python "
                      f"might take on the data's values (fused_replay='captured' opts in)")
