"""compile/flat.FlatState against the eager optimizer when the user changes things mid-run, driven directly.

FlatState.stale() must say when the layout no longer matches the optimizer (a group added, a parameter frozen
or unfrozen, momentum or amsgrad switched on, a state dict with other kinds loaded); a new FlatState built then
takes the values over and updates exactly as the eager optimizer does (float64, 1e-12), a parameter unfrozen
mid-run going on with its own, smaller step count. A failed update leaves the step counts alone, and one that
fails after another group was updated says that the step is partly applied.
"""

from __future__ import annotations

import copy
import gc
import time
import weakref

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.compile.flat import FlatState
from tensorarena.nn.containers import ParameterList
from tensorarena.nn.parameter import Parameter

TOL = 1e-12
SHAPES = [(4, 3), (3,), (5, 4), (4,), (2, 5)]


def _model(seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return ParameterList([Parameter(rng.standard_normal(shape)) for shape in shapes])


def _grads(model, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.shape) for p in model.parameters()]


class Pair:
    """The same model and optimizer twice: one stepped eagerly (Optimizer.step), one through a FlatState."""

    def __init__(self, make_opt, keep_grads=True):
        self.eager_model, self.flat_model = _model(), _model()
        self.eager, self.opt = make_opt(self.eager_model), make_opt(self.flat_model)
        self.keep_grads = keep_grads
        self.flat = FlatState(self.flat_model, self.opt, keep_grads=keep_grads)
        self.seed = 100

    def step(self):
        """One step on both from the same gradients; frozen parameters get none (as backward gives them)."""
        self.seed += 1
        for model in (self.eager_model, self.flat_model):
            for p, g in zip(model.parameters(), _grads(model, self.seed)):
                p.grad = g if p.requires_grad else None
        self.eager.step()
        if self.keep_grads:
            for p in self.flat.params():
                np.copyto(p._grad_buffer, p.grad)
            self.flat.update()
        else:
            for p in self.flat.params():
                self.flat.update_param(p, p.grad)

    def relayout(self):
        reason = self.flat.stale()
        assert reason is not None
        self.flat = FlatState(self.flat_model, self.opt, keep_grads=self.keep_grads)
        assert self.flat.stale() is None
        return reason

    def both(self, fn):
        fn(self.eager_model, self.eager)
        fn(self.flat_model, self.opt)

    def check(self):
        for p, q in zip(self.flat_model.parameters(), self.eager_model.parameters()):
            np.testing.assert_allclose(p.data, q.data, rtol=0, atol=TOL)
        a, b = self.opt.state_dict()["state"], self.eager.state_dict()["state"]
        assert a.keys() == b.keys()
        for i in a:
            assert a[i].keys() == b[i].keys(), i
            for k in a[i]:
                np.testing.assert_allclose(np.asarray(a[i][k]), np.asarray(b[i][k]), rtol=0, atol=TOL,
                                           err_msg=f"state {i} {k}")


MODES = pytest.mark.parametrize("keep_grads", [True, False], ids=["flat_update", "per_parameter"])


@MODES
def test_nothing_changed_is_not_stale(keep_grads):
    pair = Pair(lambda m: optim.Adam(m.parameters(), lr=1e-2), keep_grads)
    for _ in range(3):
        pair.step()
        assert pair.flat.stale() is None
    pair.opt.param_groups[0]["lr"] = 3e-3  # a hyperparameter without state of its own: still the same layout
    assert pair.flat.stale() is None
    pair.check()


@MODES
def test_add_param_group_is_stale_and_the_new_layout_trains_it_as_eager(keep_grads):
    def make(m):
        return optim.SGD(list(m.parameters())[:2], lr=0.1, momentum=0.9)

    pair = Pair(make, keep_grads)
    pair.step()
    pair.step()
    pair.both(lambda m, o: o.add_param_group({"params": list(m.parameters())[2:], "lr": 0.05}))
    assert "add_param_group" in pair.relayout()
    for _ in range(3):
        pair.step()
    pair.check()
    assert len(pair.flat.params()) == len(SHAPES)


@MODES
@pytest.mark.parametrize("name", ["adam", "nadam", "sgd"])
def test_freeze_then_unfreeze_trains_as_eager_with_the_unfrozen_parameters_own_step_counts(keep_grads, name):
    make = {"adam": lambda m: optim.Adam(m.parameters(), lr=1e-2),
            "nadam": lambda m: optim.NAdam(m.parameters(), lr=1e-2),
            "sgd": lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9)}[name]
    pair = Pair(make, keep_grads)
    pair.step()
    pair.step()
    pair.both(lambda m, o: [p.requires_grad_(False) for p in list(m.parameters())[1:3]])
    reason = pair.relayout()
    assert "frozen" in reason and "1" in reason
    frozen = list(pair.flat_model.parameters())[1:3]
    before = [p.data.copy() for p in frozen]
    steps_before = [float(pair.opt.state[p]["step"]) for p in frozen]
    assert not any(pair.flat.owns(p) for p in frozen)
    for _ in range(3):
        pair.step()
    for p, b, s in zip(frozen, before, steps_before):
        np.testing.assert_array_equal(p.data, b)  # not updated
        assert float(pair.opt.state[p]["step"]) == s
    pair.check()
    pair.both(lambda m, o: [p.requires_grad_(True) for p in m.parameters()])
    assert "unfrozen" in pair.relayout()
    # Two step counts in one optimizer group: 5 for the rest, 2 for the unfrozen ones, each in its own FlatGroup.
    assert sorted(float(g.steps[0]) for g in pair.flat.groups) == [2.0, 5.0]
    for _ in range(3):
        pair.step()
    pair.check()
    assert sorted({float(s["step"]) for s in pair.opt.state.values()}) == [5.0, 8.0]


@MODES
def test_momentum_switched_on_is_stale_and_starts_as_eager_starts_it(keep_grads):
    pair = Pair(lambda m: optim.SGD(m.parameters(), lr=0.1), keep_grads)
    pair.step()
    pair.step()
    pair.both(lambda m, o: o.param_groups[0].update(momentum=0.9, dampening=0.3))
    assert "momentum_buffer" in pair.relayout()
    for _ in range(3):
        pair.step()
    pair.check()


@MODES
def test_amsgrad_switched_on_is_stale_and_trains_as_eager(keep_grads):
    pair = Pair(lambda m: optim.Adam(m.parameters(), lr=1e-2), keep_grads)
    pair.step()
    pair.both(lambda m, o: o.param_groups[0].update(amsgrad=True))
    assert "max_exp_avg_sq" in pair.relayout()
    for _ in range(3):
        pair.step()
    pair.check()


def test_momentum_switched_off_keeps_the_buffer_in_the_state_as_eager_does():
    pair = Pair(lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    pair.step()
    pair.both(lambda m, o: o.param_groups[0].update(momentum=0.0))
    # The buffer stays laid out (no new layout, no retrace: a momentum schedule passing through 0 retraced at each
    # crossing, tests/test_momentum_cycling_fused_hunt.py), unread while the momentum is 0, as torch keeps it.
    assert pair.flat.stale() is None
    pair.step()
    pair.check()
    pair.both(lambda m, o: o.param_groups[0].update(momentum=0.5))  # and it goes on from the kept buffer
    assert pair.flat.stale() is None
    pair.step()
    pair.check()


@MODES
def test_a_loaded_state_dict_with_other_kinds_is_stale_and_trains_as_eager(keep_grads):
    source = _model(seed=3)
    source_opt = optim.SGD(source.parameters(), lr=0.1, momentum=0.9)
    for p, g in zip(source.parameters(), _grads(source, 7)):
        p.grad = g
    source_opt.step()
    saved = copy.deepcopy(source_opt.state_dict())
    pair = Pair(lambda m: optim.SGD(m.parameters(), lr=0.1), keep_grads)
    pair.step()
    pair.both(lambda m, o: o.load_state_dict(saved))
    assert "momentum_buffer" in pair.relayout()
    for _ in range(3):
        pair.step()
    pair.check()


def test_a_loaded_state_with_unequal_step_counts_is_stale_and_still_updates_each_with_its_own_count():
    pair = Pair(lambda m: optim.Adam(m.parameters(), lr=1e-2))
    pair.step()
    pair.step()
    saved = copy.deepcopy(pair.eager.state_dict())
    saved["state"][1]["step"] = np.array(7.0)  # as after a partly applied step in a checkpoint
    pair.both(lambda m, o: o.load_state_dict(saved))
    assert pair.flat.ensure_bound()
    assert "step" in pair.flat.stale()
    pair.step()  # before a new layout: parameter by parameter, each with its own count
    pair.check()
    pair.relayout()
    pair.step()
    pair.check()


def test_a_new_layout_lets_the_old_buffers_go():
    pair = Pair(lambda m: optim.Adam(m.parameters(), lr=1e-2))
    pair.step()
    old = [weakref.ref(g.param) for g in pair.flat.groups]
    frozen = list(pair.flat_model.parameters())[0]
    frozen.requires_grad_(False)
    pair.eager_model.parameters().__next__().requires_grad_(False)
    pair.relayout()
    gc.collect()
    assert all(ref() is None for ref in old), "the old layout's parameter buffer is still referenced"
    pair.step()
    pair.check()


# -- step counts and partly applied steps --------------------------------------------------------------

class Raiser:
    def __init__(self, fn, exc, at=1):
        self.fn, self.exc, self.at, self.calls = fn, exc, at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise self.exc
        return self.fn(*args, **kwargs)


def _two_groups(model, name="adam"):
    params = list(model.parameters())
    groups = [{"params": params[:2], "lr": 3e-3}, {"params": params[2:]}]
    return optim.NAdam(groups, lr=1e-2) if name == "nadam" else optim.Adam(groups, lr=1e-2)


def _scalars(opt):
    return [(float(s["step"]), float(s.get("mu_product", 1.0))) for s in opt.state.values()]


@pytest.mark.parametrize("name", ["adam", "nadam"])
@pytest.mark.parametrize("route", ["flat_update", "update_param", "prepare_param", "eager"])
def test_an_update_that_raises_leaves_the_step_counts_alone(route, name):
    pair = Pair(lambda m: _two_groups(m, name), keep_grads=route == "flat_update")
    pair.step()
    opt = pair.eager if route == "eager" else pair.opt
    before = _scalars(opt)
    if route == "prepare_param":
        prepare = opt.prepare_flat  # Adam's prepared update calls its bound kernel, not update_flat
        opt.prepare_flat = lambda *args: Raiser(prepare(*args), MemoryError("injected"))
    else:
        opt.update_flat = Raiser(opt.update_flat, MemoryError("injected"))
    if route == "eager":
        with pytest.raises(MemoryError):
            pair.eager.step()
    elif route == "flat_update":
        with pytest.raises(MemoryError):  # the first group's kernel: nothing updated, so not partly applied
            pair.flat.update()
    else:
        p = pair.flat.params()[0]
        grad = np.ones(p.shape)
        run = (lambda: pair.flat.update_param(p, grad)) if route == "update_param" else \
            pair.flat.prepare_update(p, grad)
        with pytest.raises(MemoryError):
            run()
        assert _scalars(opt) == before
        run()  # and once it succeeds, the count goes up by one
        assert float(opt.state[p]["step"]) == before[0][0] + 1
        return
    assert _scalars(opt) == before


@pytest.mark.parametrize("exc", [RuntimeError("injected"), MemoryError("injected")], ids=["runtime", "memory"])
def test_a_later_groups_failure_says_the_step_is_partly_applied(exc):
    pair = Pair(_two_groups)
    pair.step()
    pair.opt.update_flat = Raiser(pair.opt.update_flat, exc, at=2)
    with pytest.raises(RuntimeError, match=r"step 7 failed .* after 1 of 2 flat groups \(2 of 5 parameters\) "
                                           r"were already updated: the step is partly applied") as info:
        pair.flat.update(index=7)
    assert not isinstance(info.value, MemoryError)  # the out-of-memory fallback must not redo it
    assert info.value.__cause__ is exc
    steps = [float(pair.opt.state[p]["step"]) for p in pair.flat.params()]
    assert steps == [2.0, 2.0, 1.0, 1.0, 1.0]


def test_a_keyboard_interrupt_after_a_group_was_updated_goes_on_with_a_note():
    pair = Pair(_two_groups)
    pair.step()
    pair.opt.update_flat = Raiser(pair.opt.update_flat, KeyboardInterrupt(), at=2)
    with pytest.raises(KeyboardInterrupt) as info:
        pair.flat.update()
    assert any("this step" in note and "partly applied" in note for note in info.value.__notes__)


# -- the kernel choice of a prepared update ------------------------------------------------------------

def test_a_prepared_adam_update_follows_the_kernel_choice_set_in_the_group():
    pair = Pair(lambda m: optim.Adam(m.parameters(), lr=1e-2), keep_grads=False)
    p = pair.flat.params()[0]
    grad = np.ones(p.shape)
    run = pair.flat.prepare_update(p, grad)
    run()
    before = kernels.calls.copy()
    pair.opt.param_groups[0]["fused"] = False
    run()
    pair.opt.param_groups[0]["fused"] = None
    run()
    calls = kernels.calls - before
    assert calls[("adam", "reference")] == 1
    assert calls[("adam", "fused")] == (0 if kernels.choose("adam", None) == "reference" else 1)


# -- cost --------------------------------------------------------------------------------------------

def test_stale_is_cheap_on_a_vit_base_sized_parameter_list():
    # ViT-Base has 152 parameters; two groups (decay / no decay), as a fine-tuning run has them.
    model = _model(shapes=[(2, 2)] * 152)
    params = list(model.parameters())
    opt = optim.AdamW([{"params": params[::2]}, {"params": params[1::2], "weight_decay": 0.0}], lr=1e-3)
    flat = FlatState(model, opt)
    assert flat.stale() is None
    runs = 2000
    start = time.perf_counter()
    for _ in range(runs):
        flat.stale()
    per_call = (time.perf_counter() - start) / runs
    print(f"FlatState.stale(): {per_call * 1e6:.1f} us on 152 parameters in 2 groups")
    assert per_call < 100e-6  # tens of microseconds; generous for a loaded machine


def test_parameters_left_out_are_not_laid_out_nor_updated_and_the_layout_is_not_stale_for_them():
    pair = Pair(lambda m: optim.Adam(m.parameters(), lr=1e-2))
    pair.step()
    skipped = list(pair.flat_model.parameters())[1]
    pair.flat = FlatState(pair.flat_model, pair.opt, leave_out=[skipped])
    assert not pair.flat.owns(skipped) and pair.flat.stale() is None
    before = skipped.data.copy()
    for p in pair.flat.params():
        p._grad_buffer[...] = 1.0
    pair.flat.update()
    np.testing.assert_array_equal(skipped.data, before)
