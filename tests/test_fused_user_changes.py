"""What a PyTorch user changes between steps, on the fused route (both replays) against the eager route.

22 of these 55 tests failed on d412136, before the fixes (all under a "Regression" comment), and the thread-count
one on 4139106. With this file copied
into a worktree of d412136 (git worktree add /tmp/old d412136), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_fused_user_changes.py`.

Hyperparameters set by hand in optimizer.param_groups, add_param_group, model/optimizer load_state_dict,
optimizer.state_dict() contents, eval()/train() toggles with dropout, in-place writes to parameters,
freezing a parameter (requires_grad_) and changing trainer.clip_grad_norm / trainer.scheduler mid-run.
Every scenario runs the same code on Trainer(route="eager") and Trainer(route="fused") with
fused_replay="python" and "captured": the fused runs must match eager (float32 1e-5) and each other bit for bit.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.autograd import no_grad
from tensorarena.nn.functional import cross_entropy
from tensorarena.optim import clip_grad_norm_
from tensorarena.tensor import Tensor
from tensorarena.train.trainer import Trainer
from mlp_cases import labelled_rows as _rows, small_mlp as _mlp

TOL = 1e-5  # float32
REPLAYS = ("python", "captured")


BATCHES = _rows()


def _steps(trainer, start, stop):
    return [trainer.step(*BATCHES[i % len(BATCHES)]) for i in range(start, stop)]


def _run(route, make_opt, scenario, *, replay="auto", make_model=_mlp, make_sched=None, **kw):
    """Build model/optimizer/trainer on `route`, run `scenario(model, opt, trainer)`; return all four."""
    model = make_model()
    opt = make_opt(model)
    trainer = Trainer(model, opt, cross_entropy, route=route, fused_replay=replay,
                      scheduler=make_sched(opt) if make_sched else None, **kw)
    out = scenario(model, opt, trainer)
    return model, opt, trainer, out


def _params(model):
    return [p.data.copy() for p in model.parameters()]


def _assert_close(got, want, tol=TOL, what=""):
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{what} parameter {i}")


def _compare_all(make_opt, scenario, **kw):
    """The scenario on eager and on both fused replays: fused == eager within TOL, python == captured bit for bit.
    Returns {"eager"|"python"|"captured": (model, opt, trainer, scenario's result)}."""
    runs = {"eager": _run("eager", make_opt, scenario, **kw)}
    for replay in REPLAYS:
        runs[replay] = _run("fused", make_opt, scenario, replay=replay, **kw)
    want = _params(runs["eager"][0])
    for replay in REPLAYS:
        assert runs[replay][2].fused is not None and runs[replay][2].fused.replay == replay
        _assert_close(_params(runs[replay][0]), want, what=f"fused {replay} vs eager:")
    for p, q in zip(runs["python"][0].parameters(), runs["captured"][0].parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    return runs


# -- hyperparameters set by hand ------------------------------------------------------------------

HAND_SET = {
    "sgd": (lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
            dict(lr=0.03, weight_decay=0.1, momentum=0.5, dampening=0.2)),
    "adam": (lambda m: optim.Adam(m.parameters(), lr=1e-2),
             dict(lr=3e-3, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-4)),
    "adamw": (lambda m: optim.AdamW(m.parameters(), lr=1e-2),
              dict(lr=3e-3, weight_decay=0.3, betas=(0.8, 0.99), eps=1e-4)),
    "nadam": (lambda m: optim.NAdam(m.parameters(), lr=1e-2),
              dict(lr=3e-3, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-4)),
    "rmsprop": (lambda m: optim.RMSprop(m.parameters(), lr=1e-2, momentum=0.9),
                dict(lr=3e-3, weight_decay=0.1, momentum=0.5, alpha=0.9, eps=1e-4)),
    "adagrad": (lambda m: optim.Adagrad(m.parameters(), lr=1e-2), dict(lr=3e-2, weight_decay=0.1, eps=1e-4)),
    "lion": (lambda m: optim.Lion(m.parameters(), lr=1e-3), dict(lr=3e-4, weight_decay=0.1, betas=(0.8, 0.9))),
    "lamb": (lambda m: optim.LAMB(m.parameters(), lr=1e-2),
             dict(lr=3e-3, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-4)),
}


@pytest.mark.parametrize("name, clip", [(name, None) for name in sorted(HAND_SET)]
                         + [(name, 1.0) for name in ("adam", "lamb", "sgd")])
def test_hyperparameters_set_by_hand_between_steps_match_eager(name, clip):
    make_opt, change = HAND_SET[name]

    def scenario(model, opt, trainer):
        _steps(trainer, 0, 2)
        opt.param_groups[0].update(change)
        _steps(trainer, 2, 4)
        opt.param_groups[0]["lr"] *= 0.5  # and once more, later
        return [r.loss for r in _steps(trainer, 4, 5)]

    runs = _compare_all(make_opt, scenario, clip_grad_norm=clip)
    np.testing.assert_allclose(runs["python"][3], runs["eager"][3], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_the_second_groups_hyperparameters_set_by_hand_match_eager(clip):
    def make_opt(model):
        params = list(model.parameters())
        return optim.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 3e-3}], lr=1e-2)

    def scenario(model, opt, trainer):
        _steps(trainer, 0, 2)
        opt.param_groups[1].update(lr=0.05, weight_decay=0.2, betas=(0.5, 0.9))
        _steps(trainer, 2, 5)

    _compare_all(make_opt, scenario, clip_grad_norm=clip)


def test_lr_set_by_hand_with_a_scheduler_running_matches_eager():
    # The schedule goes on from the hand-set lr as torch's chainable StepLR does: 0.5, halved at epochs 4 and 6,
    # ends at 0.125. The fused route must do the same.
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        opt.param_groups[0]["lr"] = 0.5
        reports = _steps(trainer, 3, 7)
        return [r.lr for r in reports] + [g["lr"] for g in opt.param_groups]

    runs = _compare_all(lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9), scenario,
                        make_sched=lambda o: optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5))
    for replay in REPLAYS:
        assert runs[replay][3] == runs["eager"][3]
    # Regression (fixed): the closed-form schedule overwrote the hand-set lr at its next decay (0.1 * 0.5 ** 3)
    assert runs["eager"][3][0] == 0.5 and runs["eager"][3][-1] == 0.5 * 0.5 ** 2  # torch's value


# Regression (failed on d412136): momentum switched on by hand (0 -> 0.9) mid-run trained on eager (lazy momentum
# buffer, as the SGD docstring describes) but raised a bare KeyError('momentum_buffer') on both fused replays: the
# flat layout fixed its state kinds once, when the FusedStep was built. Now FlatState.stale sees the new state
# kind; the layout is rebuilt and the step retraces.
@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_momentum_switched_on_by_hand_mid_run_matches_eager(clip):
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        opt.param_groups[0]["momentum"] = 0.9
        _steps(trainer, 3, 6)

    _compare_all(lambda m: optim.SGD(m.parameters(), lr=0.1), scenario, clip_grad_norm=clip)


# Regression (failed on d412136): amsgrad switched on by hand mid-run. Eager added max_exp_avg_sq and used it; the
# Python replay raised a bare KeyError('max_exp_avg_sq') (same cause as above); the captured replay silently kept
# plain Adam (its prepared update had bound max_exp_avg_sq = None once), so state_dict() had no max_exp_avg_sq.
# Now the layout is rebuilt for the new state kind and Adam's prepared update looks amsgrad up per call.
def test_amsgrad_switched_on_by_hand_mid_run_matches_eager():
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        opt.param_groups[0]["amsgrad"] = True
        _steps(trainer, 3, 8)
        return sorted(opt.state_dict()["state"][0])

    runs = _compare_all(lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario)
    assert runs["eager"][3] == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"]
    for replay in REPLAYS:
        assert runs[replay][3] == runs["eager"][3], replay


# Regression (failed on d412136): a failed fused update left the optimizer's step counts inconsistent. When
# update_flat raised (then: the KeyError of momentum switched on by hand), one parameter's "step" had already been
# incremented though no parameter was updated: state_dict() showed steps [3, 3, 4, 3] after a step the Trainer did
# not count. Now step counts are stored only after the kernel ran. The failure is injected here (momentum switched
# on now trains), on the first update of step 4, on both update modes.
@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
@pytest.mark.parametrize("replay", REPLAYS)
def test_a_fused_update_that_raises_leaves_the_step_counts_alone(replay, clip):
    model = _mlp()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay=replay, clip_grad_norm=clip)
    _steps(trainer, 0, 3)
    before = _params(model)

    def fails(*args, **kwargs):
        raise RuntimeError("injected update failure")

    opt.update_flat = fails  # the instance attribute: both replays call opt.update_flat when they update
    with pytest.raises(RuntimeError, match="injected update failure"):
        _steps(trainer, 3, 4)
    assert trainer.step_count == 3
    assert [float(s["step"]) for s in opt.state_dict()["state"].values()] == [3.0] * 4
    for a, p in zip(before, model.parameters()):
        np.testing.assert_array_equal(a, p.data)
    del opt.update_flat
    _steps(trainer, 3, 5)  # and training goes on, every count moving together
    assert [float(s["step"]) for s in opt.state_dict()["state"].values()] == [5.0] * 4


# Regression (failed on d412136): optimizer.load_state_dict mid-run from an SGD with momentum into one without (a
# user restoring a checkpoint made with other hyperparameters): eager adopted the loaded momentum and buffers; the
# fused route raised KeyError('momentum_buffer'), its flat layout keeping the old group's state kinds, so the
# loaded buffers were never bound. Now FlatState.stale sees the other state kinds and the layout is rebuilt,
# taking the loaded values over.
def test_optimizer_load_state_dict_with_other_state_kinds_mid_run_matches_eager():
    source = _mlp(seed=3)
    source_opt = optim.SGD(source.parameters(), lr=0.1, momentum=0.9)
    _steps(Trainer(source, source_opt, cross_entropy), 0, 3)
    saved = copy.deepcopy(source_opt.state_dict())

    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        opt.load_state_dict(saved)
        _steps(trainer, 3, 6)

    _compare_all(lambda m: optim.SGD(m.parameters(), lr=0.1), scenario)


# Regression (failed on d412136, captured replay only): group["fused"] set by hand (False: the reference kernel)
# mid-run was followed by eager and the Python replay, not by the captured replay, which kept calling the fused
# Adam kernel (Adam.prepare_flat looked the kernel up once, and the prepared update was kept). Now Adam's prepared
# update looks group["fused"] up per call.
def test_a_kernel_choice_set_in_the_group_mid_run_is_followed():
    for route, replay in (("eager", "auto"), ("fused", "python"), ("fused", "captured")):
        def scenario(model, opt, trainer):
            _steps(trainer, 0, 3)
            opt.param_groups[0]["fused"] = False
            before = kernels.calls.copy()
            _steps(trainer, 3, 5)
            return kernels.calls - before

        *_, calls = _run(route, lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario, replay=replay)
        assert calls[("adam", "reference")] == 2 * 4 and calls[("adam", "fused")] == 0, (route, replay)


# -- add_param_group --------------------------------------------------------------------------------

# Regression (failed on d412136): add_param_group mid-run with parameters that were trainable all along
# (requires_grad=True, not in the optimizer: e.g. a backbone first left out, then added with a smaller lr). Eager
# trained the new group from the next step; the fused route (both replays) silently never updated it: the flat
# layout was built once from the groups of the first step, so the new group's gradients went to .grad, where they
# accumulated. Now FlatState.stale sees the added group; the layout is rebuilt and the step retraces.
def test_add_param_group_mid_run_trains_the_new_group_as_eager_does():
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        rest = list(model.parameters())[2:]
        before = [p.data.copy() for p in rest]
        opt.add_param_group({"params": rest, "lr": 0.05})
        _steps(trainer, 3, 6)
        return max(float(np.abs(a - p.data).max()) for a, p in zip(before, rest))

    runs = _compare_all(lambda m: optim.SGD(list(m.parameters())[:2], lr=0.1), scenario)
    assert runs["eager"][3] > 1e-3  # the new group moved on eager


# Regression (failed on d412136): the fine-tuning pattern "train the head with the rest frozen, then unfreeze the
# rest and add it as a new param group" trained on eager, but the fused route raised PlanMismatchError "this step
# diverged from its trace ... The step's control flow depends on the data; use route='eager'" - a wrong diagnosis
# (the user unfroze parameters): plans were keyed by batch signature and dispatch only, and the flat layout was
# not rebuilt for the new group. Now the requires_grad change and the new group make the layout stale: it is
# rebuilt and the step retraces.
@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_unfreeze_and_add_param_group_mid_run_matches_eager(clip):
    def make_opt(model):
        params = list(model.parameters())
        for p in params[:2]:
            p.requires_grad_(False)
        return optim.SGD(params[2:], lr=0.1, momentum=0.9)

    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        first = list(model.parameters())[:2]
        for p in first:
            p.requires_grad_(True)
        opt.add_param_group({"params": first, "lr": 0.05})
        _steps(trainer, 3, 6)

    _compare_all(make_opt, scenario, clip_grad_norm=clip)


def test_add_param_group_of_a_parameter_outside_the_model_is_harmless():
    # A parameter the model never uses gets no gradient: eager's optimizer skips it, and so must the fused route.
    from tensorarena.nn import Parameter

    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        extra = Parameter(np.ones(3, np.float32))
        opt.add_param_group({"params": [extra]})
        _steps(trainer, 3, 6)
        return extra.data.copy()

    runs = _compare_all(lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario)
    for run in runs.values():
        np.testing.assert_array_equal(run[3], np.ones(3, np.float32))


# -- load_state_dict, state_dict ---------------------------------------------------------------------

@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_model_load_state_dict_mid_run_trains_from_the_loaded_weights(clip):
    other = _mlp(seed=5)
    want = other.state_dict()

    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        model.load_state_dict(want)
        for key, value in model.state_dict().items():  # visible at once, before any step
            np.testing.assert_array_equal(value, want[key])
        with no_grad():
            out = model(Tensor(BATCHES[0][0])).numpy().copy()
        with no_grad():
            np.testing.assert_array_equal(out, other(Tensor(BATCHES[0][0])).numpy())
        return [r.loss for r in _steps(trainer, 3, 6)]

    runs = _compare_all(lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario, clip_grad_norm=clip)
    for replay in REPLAYS:  # the first step after the load computes its loss from the loaded weights
        np.testing.assert_allclose(runs[replay][3], runs["eager"][3], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_optimizer_and_model_rewound_to_a_snapshot_mid_run_match_eager(clip):
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 2)
        saved_opt, saved_model = copy.deepcopy(opt.state_dict()), model.state_dict()
        _steps(trainer, 2, 4)
        opt.load_state_dict(saved_opt)
        model.load_state_dict(saved_model)
        _steps(trainer, 4, 7)

    _compare_all(lambda m: optim.NAdam(m.parameters(), lr=1e-2), scenario, clip_grad_norm=clip)


def test_optimizer_state_reset_from_a_fresh_optimizer_mid_run_matches_eager():
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        opt.load_state_dict(optim.Adam(_mlp(seed=9).parameters(), lr=3e-3).state_dict())
        _steps(trainer, 3, 6)
        return [float(s["step"]) for s in opt.state_dict()["state"].values()]

    runs = _compare_all(lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario)
    for run in runs.values():
        assert run[3] == [3.0] * 4 and run[1].param_groups[0]["lr"] == 3e-3


STATE_OPTIMIZERS = {
    "adam": lambda m: optim.Adam(m.parameters(), lr=1e-2, amsgrad=True),
    "nadam": lambda m: optim.NAdam(m.parameters(), lr=1e-2),
    "sgd_momentum": lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    "sgd": lambda m: optim.SGD(m.parameters(), lr=0.1),
    "rmsprop_centered": lambda m: optim.RMSprop(m.parameters(), lr=1e-2, momentum=0.9, centered=True),
}


@pytest.mark.parametrize("name, clip", [(name, None) for name in sorted(STATE_OPTIMIZERS)]
                         + [(name, 1.0) for name in ("adam", "nadam")])
def test_optimizer_state_dict_after_fused_steps_equals_eager(name, clip):
    runs = _compare_all(STATE_OPTIMIZERS[name], lambda m, o, t: _steps(t, 0, 4), clip_grad_norm=clip)
    want = runs["eager"][1].state_dict()
    for replay in REPLAYS:
        got = runs[replay][1].state_dict()
        assert got["param_groups"] == want["param_groups"]
        assert sorted(got["state"]) == sorted(want["state"])
        for i, entry in want["state"].items():
            assert sorted(got["state"][i]) == sorted(entry), (replay, i)
            for key, value in entry.items():
                a, b = np.asarray(got["state"][i][key]), np.asarray(value)
                assert a.shape == b.shape and a.dtype == b.dtype, (replay, i, key)
                np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL, err_msg=f"{replay} {i} {key}")


# -- eval / train ------------------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_eval_forwards_between_fused_steps_use_the_trained_weights(clip):
    x = BATCHES[1][0]

    def scenario(model, opt, trainer):
        outs = []
        with no_grad():
            model.eval()
            first = model(Tensor(x)).numpy().copy()
            model.train()
        _steps(trainer, 0, 3)
        model.eval()
        with no_grad():
            outs.append(model(Tensor(x)).numpy().copy())
        outs.append(model(Tensor(x)).numpy().copy())  # with grad recording on: no backward, nothing changes
        assert not np.array_equal(outs[0], first)  # trained weights, not the initial ones
        np.testing.assert_array_equal(outs[0], outs[1])  # eval: no dropout
        model.train()
        _steps(trainer, 3, 6)
        outs.append(trainer.evaluate(x, BATCHES[1][1])["loss"])
        model.eval()  # left in eval: the trainer's step must train (dropout on) all the same
        losses = [r.loss for r in _steps(trainer, 6, 8)]
        assert model.training
        return outs, losses

    runs = _compare_all(lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario, clip_grad_norm=clip,
                        make_model=lambda: _mlp(dropout=0.3))
    (eo, el) = runs["eager"][3]
    for replay in REPLAYS:
        outs, losses = runs[replay][3]
        for a, b in zip(outs, eo):
            np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(losses, el, rtol=TOL, atol=TOL)
    assert runs["python"][3][1] == runs["captured"][3][1]


# -- writes into parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_in_place_writes_into_parameters_between_steps_are_trained_from(clip):
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        w, b, w2, _ = model.parameters()
        w.data[...] = 0.01  # in place: the flat view
        b.data[:3] = 1.0
        _steps(trainer, 3, 5)
        w2.data = np.full(w2.shape, -0.02, np.float32)  # rebinding to a new array, as torch's p.data = ...
        assert float(w2.data[0, 0]) == np.float32(-0.02)
        reports = _steps(trainer, 5, 8)
        assert w2.data.flags.owndata is False or trainer.route == "eager"  # adopted back into the flat buffer
        return [r.loss for r in reports]

    runs = _compare_all(lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario, clip_grad_norm=clip)
    for replay in REPLAYS:
        np.testing.assert_allclose(runs[replay][3], runs["eager"][3], rtol=TOL, atol=TOL)


# -- freezing ---------------------------------------------------------------------------------------------

# Regression (failed on d412136): requires_grad_(False) on a parameter mid-run, then back. Eager: the frozen
# parameter stays put and the rest trains. Fused, before:
#  - update_in_backward (no clip), both replays: RuntimeError "step 4 failed inside backward after 2 of 4
#    parameters were already updated ... the step is partly applied ... Restore the last checkpoint" - half a step
#    applied, and the inner message blamed "control flow depends on the data".
#  - flat gradients (clip), Python replay: PlanMismatchError "parameters ['net.0.weight'] got no gradient in this
#    step but did in its trace" (raised before the update: no state lost, but training stopped).
#  - flat gradients (clip), captured replay: SILENTLY WRONG. ModelState saw the requires_grad change and recorded
#    again, but the capture never checked that every flat parameter got a gradient, so the frozen parameter's
#    stale flat gradient was applied again every step (and entered the clip norm): the frozen weight kept moving.
# Now freezing or unfreezing makes the flat layout stale (FlatState.stale): it is rebuilt without (or again with)
# the parameter and the step retraces, so every case trains as eager.
@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
def test_freezing_a_parameter_mid_run_and_back_matches_eager(clip):
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        frozen = list(model.parameters())[0]
        frozen.requires_grad_(False)
        before = frozen.data.copy()
        _steps(trainer, 3, 5)
        np.testing.assert_array_equal(frozen.data, before)  # a frozen parameter does not move
        frozen.requires_grad_(True)
        _steps(trainer, 5, 7)

    _compare_all(lambda m: optim.Adam(m.parameters(), lr=1e-2), scenario, clip_grad_norm=clip)


# Regression (3 of 4 cases failed on d412136): the weaker requirement for the same change, freezing a parameter
# mid-run: whatever the fused route does, it must not move the frozen parameter, and if it refuses the step, it
# must refuse before updating anything. in_backward on both replays half-applied the step (2 of 4 parameters
# updated, then RuntimeError), and flat_clip on the captured replay kept updating the frozen parameter from its
# stale flat gradient; flat_clip on the Python replay passed (PlanMismatchError before the update). Now no case
# refuses: the layout is rebuilt without the frozen parameter and both steps train, the frozen one untouched.
@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_clip"])
@pytest.mark.parametrize("replay", REPLAYS)
def test_a_parameter_frozen_mid_run_never_moves_and_no_step_is_half_applied(replay, clip):
    model = _mlp()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay=replay, clip_grad_norm=clip)
    _steps(trainer, 0, 3)
    frozen = list(model.parameters())[0]
    frozen.requires_grad_(False)
    before = _params(model)
    steps_before = [float(s["step"]) for s in opt.state_dict()["state"].values()]
    try:
        _steps(trainer, 3, 5)
    except Exception:  # noqa: BLE001 - a refusal is acceptable, if it comes before any update
        assert trainer.step_count == 3
        for a, p in zip(before, model.parameters()):
            np.testing.assert_array_equal(p.data, a)
        assert [float(s["step"]) for s in opt.state_dict()["state"].values()] == steps_before
        return
    np.testing.assert_array_equal(frozen.data, before[0])


# Regression (failed on d412136, eager Trainer): a parameter frozen when the Trainer was built and unfrozen later
# was left out of gradient clipping for good: the Trainer snapshotted its requires_grad parameters in __init__ and
# the eager step clipped only those. A PyTorch loop (clip_grad_norm_(model.parameters(), ...)) clips every
# gradient that exists. Now the eager step clips the optimizer's parameters, read each step.
def test_eager_clipping_covers_a_parameter_unfrozen_after_the_trainer_was_built():
    def manual():
        model = _mlp()
        params = list(model.parameters())
        params[0].requires_grad_(False)
        opt = optim.SGD(params, lr=0.5)
        for i in range(4):
            if i == 2:
                params[0].requires_grad_(True)
            opt.zero_grad()
            cross_entropy(model(Tensor(BATCHES[i][0])), BATCHES[i][1]).backward()
            clip_grad_norm_(model.parameters(), 0.1)
            opt.step()
        return model

    model = _mlp()
    params = list(model.parameters())
    params[0].requires_grad_(False)
    trainer = Trainer(model, optim.SGD(params, lr=0.5), cross_entropy, route="eager", clip_grad_norm=0.1)
    for i in range(4):
        if i == 2:
            params[0].requires_grad_(True)
        trainer.step(*BATCHES[i])
    _assert_close(_params(model), _params(manual()))


# -- trainer settings changed mid-run ---------------------------------------------------------------------

# Regression (failed on d412136): trainer.clip_grad_norm changed mid-run was honoured by eager but silently ignored
# by the fused route on both replays (Trainer.compile copied it into the FusedStep once), reports included. Now
# Trainer.clip_grad_norm is a property that passes the value on, and switching clipping on or off rebuilds the
# fused step (updates inside backward or flat gradients, see the next test).
@pytest.mark.parametrize("change", [(1.0, 0.01), (0.01, None)], ids=["tighter", "off"])
def test_changing_trainer_clip_grad_norm_mid_run_takes_effect(change):
    start, then = change

    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        trainer.clip_grad_norm = then
        return [r.grad_norm for r in _steps(trainer, 3, 6)]

    runs = _compare_all(lambda m: optim.SGD(m.parameters(), lr=0.1), scenario, clip_grad_norm=start)
    for replay in REPLAYS:
        assert (runs[replay][3][0] is None) == (then is None)


# Regression (failed on d412136): clipping switched on mid-run (trainer.clip_grad_norm None -> 0.01) on a fused run
# whose step updates in backward (no gradient buffer, resolved when there was no clipping) was silently ignored;
# eager clipped. Now it is followed, not refused: the fused step is built again with flat gradients and clips
# (each report has a grad_norm).
def test_clipping_switched_on_mid_run_is_followed_or_refused_clearly():
    for replay in REPLAYS:
        model = _mlp()
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                          fused_replay=replay)
        _steps(trainer, 0, 3)
        trainer.clip_grad_norm = 0.01
        try:
            reports = _steps(trainer, 3, 5)
        except (ValueError, RuntimeError) as err:
            assert "clip" in str(err)
            continue
        assert all(r.grad_norm is not None for r in reports), replay  # it clipped: a norm is reported


# Regression (failed on d412136): trainer.scheduler replaced mid-run: eager stepped the new scheduler, the fused
# route kept stepping the one it was built with (Trainer.compile copied it into the FusedStep once). Now
# Trainer.scheduler is a property that hands a new schedule to the fused (and streaming) step.
def test_replacing_trainer_scheduler_mid_run_takes_effect():
    def scenario(model, opt, trainer):
        _steps(trainer, 0, 3)
        trainer.scheduler = optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
        _steps(trainer, 3, 6)
        return opt.param_groups[0]["lr"]

    runs = _compare_all(lambda m: optim.SGD(m.parameters(), lr=0.1), scenario)
    for replay in REPLAYS:
        assert runs[replay][3] == runs["eager"][3] == 0.1 * 0.5 ** 3


def _tiny_vit():
    from tensorarena.models import ViT, ViTConfig

    return ViT(ViTConfig(image_size=16, patch_size=4, num_classes=4, dim=32, depth=2, num_heads=4),
               rng=np.random.default_rng(0))


# Regression (failed on 4139106): numba.set_num_threads between steps changes how many per-core partial rows
# (bias and LayerNorm gradients) and attention tiles a kernel asks for, so the plan traced under 2 threads
# diverged at its first such buffer: "step 3 failed inside backward after 2 of 32 parameters were already
# updated ... partly applied", on both replays. Plans are now keyed by the thread count as well.
@pytest.mark.skipif(__import__("numba").config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads to switch from")
def test_the_kernel_thread_count_changed_between_steps_traces_its_own_plan():
    import numba

    rng = np.random.default_rng(1)
    images = [(rng.standard_normal((8, 3, 16, 16)).astype(np.float32), rng.integers(0, 4, 8)) for _ in range(6)]

    def scenario(model, opt, trainer):
        before = numba.get_num_threads()
        try:
            for threads, batch in zip((2, 2, 1, 1, 2, 2), images):
                numba.set_num_threads(threads)
                trainer.step(*batch)
        finally:
            numba.set_num_threads(before)
        return trainer.fused.traces if trainer.fused is not None else None

    runs = _compare_all(lambda m: optim.AdamW(m.parameters(), lr=1e-3), scenario, make_model=_tiny_vit)
    for replay in REPLAYS:
        assert runs[replay][3] == 2  # one plan per thread count; switching back finds the first
