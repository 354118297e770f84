"""What the captured replay watches between steps (watched_state.ModelState), and how a recording that could not be
made or checked on one batch is made again on the next (captured.capture).

- ModelState: a new instance attribute (a class default set on the instance), a value nested in a dict, list
  or config object, a swapped layer, a requires_grad; arrays are data, not config. describe_change names it.
- A batch that cannot check a recording (a non-finite loss, a second batch that fails) is no verdict: the
  step trains on the Python replay and the next one records again, up to captured._MAX_UNCHECKED batches.
- An exception from the Python passes on the real batch (a MemoryError here) propagates with nothing
  updated, the generators where they were, and no refusal left behind.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.compile import captured, compile_step
from tensorarena.compile.watched_state import ModelState
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy, relu
from tensorarena.random import default_generator
from tensorarena.train.trainer import Trainer


@dataclass
class _Options:
    use_b: bool = True


class _Configured(Module):
    """A model whose forward reads flags from several places: a dict, a list inside it, a dataclass, a
    namespace; and keeps an array (a cache, not config)."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.a, self.b = Linear(12, 16, rng=rng), Linear(16, 4, rng=rng)
        self.cfg = {"use_b": True, "sizes": [16, 4], "table": np.zeros(3)}
        self.options = _Options()
        self.ns = types.SimpleNamespace(scale=1.0)
        self.cache = np.zeros(4)

    def forward(self, x):
        return self.b(relu(self.a(x)))


OF = " of the model: "
CHANGES = {
    "dict_value": (lambda m: m.cfg.__setitem__("use_b", False), "_Configured.cfg['use_b']" + OF + "True -> False"),
    "list_in_dict": (lambda m: m.cfg["sizes"].append(2), "_Configured.cfg['sizes']" + OF + "[16, 4] -> [16, 4, 2]"),
    "dataclass": (lambda m: setattr(m.options, "use_b", False), "_Configured.options.use_b" + OF + "True -> False"),
    "namespace": (lambda m: setattr(m.ns, "scale", 2.0), "_Configured.ns.scale" + OF + "1.0 -> 2.0"),
    "new_attribute": (lambda m: setattr(m, "flag", False), "_Configured.flag" + OF + "set to False (new)"),
    "removed_entry": (lambda m: m.cfg.pop("use_b"), "_Configured.cfg['use_b']" + OF + "removed"),
    "child_attribute": (lambda m: setattr(m.a, "in_features", 13), "Linear.in_features of 'a': 12 -> 13"),
    "swapped_layer": (lambda m: setattr(m, "b", Linear(16, 4)),
                      "_Configured.b" + OF + "replaced (Linear -> another Linear)"),
    "replaced_dict": (lambda m: setattr(m, "cfg", dict(m.cfg)),
                      "_Configured.cfg" + OF + "replaced (dict -> another dict)"),
    "requires_grad": (lambda m: setattr(m.a.weight, "requires_grad", False),
                      "parameter 'a.weight': requires_grad True -> False"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_model_state_sees_a_change_and_names_it(change):
    model = _Configured()
    state = ModelState(model)
    assert not state.changed() and state.describe_change() == "no change"
    make, named = CHANGES[change]
    make(model)
    assert state.changed()
    assert state.describe_change() == named


def test_model_state_leaves_modes_to_the_plan_key():
    # A module's train/eval mode keys the fused plans (FusedStep.plan_for, nn/modes.py; test_trainer_modes_hunt.py):
    # a change traces the step in the new modes and a switch back finds the first plan, where a change seen here
    # would drop every plan.
    model = _Configured()
    state = ModelState(model)
    model.eval()
    assert not state.changed(), state.describe_change()


def test_model_state_leaves_arrays_alone():
    # A cache or a table an attribute holds is data: replacing it every step must not record the step again.
    model = _Configured()
    state = ModelState(model)
    model.cache = np.ones(4)
    model.cfg["table"] = np.ones(3)
    assert not state.changed(), state.describe_change()


def test_model_state_on_a_vit_base_sees_a_dropout_probability():
    from tensorarena.models.vit import ViT, ViTConfig

    model = ViT(ViTConfig.base(image_size=224, patch_size=16, num_classes=10))
    state = ModelState(model)
    assert not state.changed()
    model.blocks[3].attn.attn_drop.p = 0.5
    assert state.changed() and state.describe_change().startswith("Dropout.p of 'blocks.3.attn.attn_drop': ")


# -- a recording made again ------------------------------------------------------------------------------

def _mlp():
    return MLP(MLPConfig(in_features=12, hidden=(16,), out_features=4, dtype=np.float64),
               rng=np.random.default_rng(0))


def _good(n, seed=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((16, 12)), rng.integers(0, 4, 16)) for _ in range(n)]


def _captured_steps():
    return kernels.calls[("fused_replay", "captured")]


def test_batches_that_cannot_check_the_recording_are_tried_a_bounded_number_of_times():
    good = _good(2)
    model = _mlp()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                      fused_replay="captured", on_nonfinite="skip")
    x_nan = good[0][0].copy()
    x_nan[:, 0] = np.nan
    for tries in range(1, captured._MAX_UNCHECKED):
        assert trainer.step(x_nan, good[0][1]).skipped
        assert trainer.fused.plan.capture is None  # no verdict: the next step records again
        assert getattr(trainer.fused.plan, captured._TRIES_ATTR) == tries
    assert trainer.step(x_nan, good[0][1]).skipped
    capture = trainer.fused.plan.capture
    assert capture.tape is None and f"{captured._MAX_UNCHECKED} batches of this signature" in capture.note
    before = _captured_steps()
    trainer.step(*good[1])
    assert _captured_steps() == before  # refused for good: the Python replay


class _FailsOnCall(Module):
    """An MLP whose forward raises `exc` on its `at`-th call (1: compile_step's trace; 2: the recording's
    Python pass on the batch; 3: its Python pass on the second batch)."""

    def __init__(self, exc, at):
        super().__init__()
        self.net, self.exc, self.at = _mlp(), exc, at
        self.calls = np.zeros(1, dtype=np.int64)  # an array: not watched, or each forward would be a change

    def forward(self, x):
        self.calls += 1
        if self.calls[0] == self.at:
            raise self.exc
        return self.net(x)


def _params(model):
    return [p.data.copy() for p in model.parameters()]


def test_a_failure_on_the_second_batch_trains_the_step_and_records_at_the_next():
    good = _good(3)
    model = _FailsOnCall(RuntimeError("transient"), at=3)
    step = compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=0.1), good[0], replay="captured")
    before = _params(model)
    loss, _, skipped, _ = step.step(*good[0])
    assert not skipped and np.isfinite(loss)
    assert step.plan.capture is None  # the Python replay trained this step; no refusal
    assert any(not np.array_equal(p, q) for p, q in zip(_params(model), before))
    count = _captured_steps()
    step.step(*good[1])
    assert step.plan.capture is not None and step.plan.capture.tape is not None, step.plan.capture.note
    assert _captured_steps() == count + 1


def test_an_out_of_memory_while_recording_propagates_with_nothing_changed():
    good = _good(2)
    model = _FailsOnCall(MemoryError("no room"), at=2)
    step = compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=0.1), good[0], replay="captured")
    before = _params(model)
    state = default_generator().bit_generator.state
    with pytest.raises(MemoryError, match="no room"):
        step.step(*good[0])
    assert step.plan.capture is None  # no refusal: the next step records again
    assert default_generator().bit_generator.state == state
    for p, q in zip(_params(model), before):
        np.testing.assert_array_equal(p, q)
    count = _captured_steps()
    step.step(*good[1])
    assert step.plan.capture.tape is not None, step.plan.capture.note
    assert _captured_steps() == count + 1
