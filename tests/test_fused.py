"""The fused route: trace once, one slab, replay without allocating; parity with eager; bounded memory."""

from __future__ import annotations

import logging
import tracemalloc

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import kernels, optim
from tensorarena.compile import PlanMismatchError, UnsupportedOpError, compile_step
from tensorarena.memory.meter import rss_bytes
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

TOL = {np.float32: 1e-5, np.float64: 1e-10}


def _vit(dtype=np.float32, seed=0, dim=32, depth=2):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=10, dim=dim, depth=depth, num_heads=4, dtype=dtype)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _batches(n, batch=8, dtype=np.float32, seed=1, image=16):
    """`n` fixed (inputs, labels) batches whose labels depend on the images, so loss can fall."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 3, image, image)).astype(dtype)
        y = (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)
        out.append((x, y))
    return out


def _max_param_diff(a: Module, b: Module) -> float:
    return max(float(np.max(np.abs(p.data - q.data))) for p, q in zip(a.parameters(), b.parameters()))


def _train(route, make_model, make_opt, batches, steps, *, make_sched=None, clip=None, **trainer_kw):
    model = make_model()
    opt = make_opt(model)
    sched = make_sched(opt) if make_sched else None
    trainer = Trainer(model, opt, cross_entropy, scheduler=sched, clip_grad_norm=clip, route=route, **trainer_kw)
    reports = [trainer.step(*batches[i % len(batches)]) for i in range(steps)]
    return model, trainer, reports


# -- parity -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_vit_matches_eager_step_for_step(dtype):
    batches = _batches(4, dtype=dtype)
    kw = dict(make_model=lambda: _vit(dtype), make_opt=lambda m: optim.AdamW(m.parameters(), lr=2e-3),
              make_sched=lambda o: optim.lr_scheduler.warmup_cosine(o, warmup_steps=5, total_steps=50), clip=1.0)
    eager, _, er = _train("eager", batches=batches, steps=50, **kw)
    fused, trainer, fr = _train("fused", batches=batches, steps=50, **kw)
    assert [r.route for r in fr] == ["fused"] * 50 and trainer.fused.replays == 50 and trainer.fused.traces == 1
    assert _max_param_diff(eager, fused) <= TOL[dtype]
    np.testing.assert_allclose([r.loss for r in fr], [r.loss for r in er], rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose([r.grad_norm for r in fr], [r.grad_norm for r in er], rtol=1e-6)
    assert fr[-1].loss < fr[0].loss


def _mlp(dtype, seed=0):
    return MLP(MLPConfig(in_features=12, hidden=(16,), out_features=4, dtype=dtype), rng=np.random.default_rng(seed))


def _two_groups(model, **kw):
    params = list(model.parameters())
    return [{"params": params[:2], **kw}, {"params": params[2:]}]


OPTIMIZERS = {
    "sgd": lambda m: optim.SGD(_two_groups(m, lr=0.05), lr=0.1),
    "sgd_momentum": lambda m: optim.SGD(_two_groups(m, lr=0.05), lr=0.1, momentum=0.9, dampening=0.1,
                                        weight_decay=1e-3),
    "sgd_nesterov": lambda m: optim.SGD(_two_groups(m), lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda m: optim.Adam(_two_groups(m, lr=3e-3), lr=1e-2, weight_decay=1e-3),
    "adamw": lambda m: optim.AdamW(_two_groups(m, lr=3e-3), lr=1e-2),
    "amsgrad": lambda m: optim.Adam(_two_groups(m), lr=1e-2, amsgrad=True),
    "nadam": lambda m: optim.NAdam(_two_groups(m, lr=3e-3), lr=1e-2),
    "nadam_decoupled": lambda m: optim.NAdam(_two_groups(m), lr=1e-2, weight_decay=1e-2,
                                             decoupled_weight_decay=True),
    "rmsprop": lambda m: optim.RMSprop(_two_groups(m, lr=3e-3), lr=1e-2),
    "rmsprop_centered_momentum": lambda m: optim.RMSprop(_two_groups(m), lr=1e-3, momentum=0.9, centered=True),
    "adagrad": lambda m: optim.Adagrad(_two_groups(m, lr=3e-2), lr=5e-2, lr_decay=1e-3,
                                       initial_accumulator_value=0.1),
    "lion": lambda m: optim.Lion(_two_groups(m, lr=3e-4), lr=1e-3, weight_decay=1e-2),
    "lamb": lambda m: optim.LAMB(_two_groups(m, lr=3e-3), lr=1e-2, weight_decay=1e-2),
}


def _mlp_batches(dtype, n=5, batch=16):
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((batch, 12)).astype(dtype), rng.integers(0, 4, batch)) for _ in range(n)]


@pytest.mark.parametrize("update_in_backward", [False, True], ids=["flat", "in_backward"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_fused_optimizer_matches_eager_over_50_steps(name, dtype, update_in_backward):
    batches = _mlp_batches(dtype)
    kw = dict(make_model=lambda: _mlp(dtype), make_opt=OPTIMIZERS[name], batches=batches, steps=50)
    eager, _, _ = _train("eager", **kw)
    before = kernels.calls.copy()
    fused, trainer, reports = _train("fused", update_in_backward=update_in_backward, **kw)
    assert {r.route for r in reports} == {"fused"} and trainer.fused.update_in_backward == update_in_backward
    assert _max_param_diff(eager, fused) <= TOL[dtype], name
    optimizer_calls = sum(n for (kname, _), n in (kernels.calls - before).items()
                          if kname in {"sgd", "adam", "nadam", "rmsprop", "adagrad", "lion", "lamb"})
    if not update_in_backward:
        # The fused update is one kernel call per group per step (the eager one is one per parameter).
        assert optimizer_calls == 50 * 2
        return
    # In backward: one kernel call per parameter per step, and no gradient is kept.
    assert optimizer_calls == 50 * len(list(fused.parameters()))
    assert all(g.grad is None for g in trainer.fused.flat.groups)
    assert all(p.grad is None and p._grad_buffer is None for p in fused.parameters())


SCHEDULES = {
    "constant": lambda o: optim.lr_scheduler.ConstantLR(o, factor=0.5, total_iters=10),
    "linear_warmup": lambda o: optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=20),
    "cosine": lambda o: optim.lr_scheduler.CosineAnnealingLR(o, T_max=30),
    "step": lambda o: optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5),
    "exponential": lambda o: optim.lr_scheduler.ExponentialLR(o, gamma=0.95),
    "warmup_cosine": lambda o: optim.lr_scheduler.warmup_cosine(o, warmup_steps=5, total_steps=40),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_advances_on_the_fused_route_without_retracing(name):
    batches = _mlp_batches(np.float64)
    kw = dict(make_model=lambda: _mlp(np.float64), make_opt=lambda m: optim.AdamW(m.parameters(), lr=1e-2),
              make_sched=SCHEDULES[name], batches=batches, steps=40)
    eager, _, er = _train("eager", **kw)
    fused, trainer, fr = _train("fused", **kw)
    assert [r.lr for r in fr] == [r.lr for r in er]
    assert len({r.lr for r in fr}) > 1  # the schedule really moved
    assert trainer.fused.traces == 1
    assert _max_param_diff(eager, fused) <= 1e-10


# -- the trace and the replay ---------------------------------------------------------------------

def test_trace_updates_nothing_and_allocates_from_no_arena():
    model = _vit()
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.numpy() for n, p in model.named_parameters()}
    rng_state = ta.random.default_generator().bit_generator.state
    x, y = _batches(1)[0]
    with ta.Arena(name="outer") as outer:
        # Flat gradients asked for, so the test can read the first replay's gradients after it.
        fused = compile_step(model, cross_entropy, opt, (x, y), update_in_backward=False)
        assert outer.stats.allocations == 0  # tracing took nothing from the caller's (or any) step arena
        report = fused.memory_report()  # known before step 1
        for name, p in model.named_parameters():
            np.testing.assert_array_equal(p.data, before[name])
        assert all(float(s["step"]) == 0 for s in opt.state.values())
        assert ta.random.default_generator().bit_generator.state == rng_state
        assert report["slab"] > 0 and report["predicted_peak"] == (report["persistent_total"] + report["slab"]
                                                          + report["libraries_measured"])
        assert report["slab"] <= report["saved_by_reuse"] + report["slab"]
        assert report["state.exp_avg"] == report["params"] == report["grads"]

        fused.step(x, y)
        assert outer.stats.allocations == 0
    # The first replay trained on real gradients (the system we learned from got zeros here).
    grads = np.concatenate([g.grad for g in fused.flat.groups])
    assert np.count_nonzero(grads) > 0.9 * grads.size
    changed = [n for n, p in model.named_parameters() if not np.array_equal(p.data, before[n])]
    assert len(changed) == len(before)


def test_parameters_stay_visible_to_the_module_and_state_dict():
    model = _vit()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    trainer = Trainer(model, opt, cross_entropy, route="fused")
    for x, y in _batches(3):
        trainer.step(x, y)
    group = trainer.fused.flat.groups[0]
    sd = model.state_dict()
    flat_from_module = np.concatenate([np.asarray(sd[name]).reshape(-1) for name in group.names])
    np.testing.assert_array_equal(flat_from_module, group.param)
    p0 = group.params[0]
    assert np.shares_memory(p0.data, group.param) and np.shares_memory(opt.state[p0]["exp_avg"], group.state["exp_avg"])


@pytest.mark.parametrize("update_in_backward", [True, False], ids=["update_in_backward", "flat_grads"])
def test_the_slab_every_planned_buffer_and_the_flat_state_start_on_a_cache_line(update_in_backward):
    """64-byte aligned, as the eager arena's blocks: NumPy's own large arrays start 16 bytes into a
    page, and a step on such a slab (every 512-bit vector straddling two cache lines) ran 1-3% slower.
    Fails with the slab and flat buffers back on np.empty: slab base 16 mod 64."""
    model = _vit(dim=64)
    fused = compile_step(model, cross_entropy, optim.AdamW(model.parameters(), lr=1e-3), _batches(1)[0],
                         update_in_backward=update_in_backward)
    plan = fused.plan
    assert plan.slab.ctypes.data % 64 == 0
    assert all(view.ctypes.data % 64 == 0 for view in plan.views if view.size)
    group = fused.flat.groups[0]
    flat = [group.param, *group.state.values()] + ([group.grad] if group.grad is not None else [])
    assert len(flat) == (4 if not update_in_backward else 3)
    assert all(a.ctypes.data % 64 == 0 for a in flat)
    fused.step(*_batches(1)[0])  # and they train: the step runs on exactly these buffers
    assert fused.plan.slab is plan.slab and np.shares_memory(model.head.weight.data, group.param)


def _traced_peak(fused, x, y):
    fused.step(x, y)  # warm
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    arena = fused.step(x, y)[3]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - base, arena


def test_replay_allocates_no_array_memory():
    """Every transient buffer of a replayed step is a slab view, and no other array memory appears.

    tracemalloc also counts Python objects (graph nodes, closures), so the proof is by scale: the
    traced peak of a step is the same at batch 8 and batch 64 while the slab grows eightfold.
    (Before ops.reshape stopped letting NumPy copy onto the heap, it grew by ~1 MiB here.)
    """
    model = _vit(dim=64)
    # The Python replay's own allocations (test_captured_replay checks the captured one's)
    fused = compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=1e-3), _batches(1)[0],
                         replay="python")
    small, arena_small = _traced_peak(fused, *_batches(1, batch=8)[0])
    slab_small = fused.plan.memory.slab_bytes
    big, arena_big = _traced_peak(fused, *_batches(1, batch=64)[0])
    slab_big = fused.plan.memory.slab_bytes
    assert slab_big > 6 * slab_small > 0
    assert abs(big - small) < 32 * 1024, f"array memory outside the plan: {small} B at batch 8, {big} B at 64"
    for arena in (arena_small, arena_big):
        assert arena.stats.allocations == len(arena.plan.buffers) and arena.cursor == len(arena.plan.buffers)


def test_the_allocation_scale_check_catches_a_heap_temporary(monkeypatch):
    # Proof the check above can fail: the same measurement with one op copying onto the heap.
    from tensorarena.ops import nn_ops

    real = nn_ops.layer_norm

    def leaky_layer_norm(a, *args, **kw):
        np.array(a.data, copy=True)  # a batch-sized heap temporary, as np.reshape's copy was
        return real(a, *args, **kw)

    monkeypatch.setattr(ta.nn.functional, "layer_norm", leaky_layer_norm)
    model = _vit(dim=64)
    fused = compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=1e-3), _batches(1)[0],
                         replay="python")  # whose forward runs the leaky op on every step
    small, _ = _traced_peak(fused, *_batches(1, batch=8)[0])
    big, _ = _traced_peak(fused, *_batches(1, batch=64)[0])
    assert big - small > 32 * 1024


def test_boundedness_100_fused_steps_inside_one_outer_arena_never_reset():
    model = _vit()
    opt = optim.AdamW(model.parameters(), lr=3e-3)
    trainer = Trainer(model, opt, cross_entropy, route="fused")
    batches = _batches(4)
    high_waters, slabs, rss, losses, routes = [], [], [], [], []
    with ta.Arena(name="outer harness arena, never reset") as outer:
        for i in range(100):
            report = trainer.step(*batches[i % 4])
            routes.append(report.route)
            high_waters.append((report.arena_high_water, outer.stats.high_water))
            slabs.append(trainer.fused.plan.memory.slab_bytes)
            rss.append(rss_bytes())
            losses.append(report.loss)
    assert routes == ["fused"] * 100, "a step silently left the fused route"
    assert trainer.fused.replays == 100 and trainer.fused.traces == 1
    assert len(set(high_waters[2:])) == 1 and high_waters[-1][1] == 0
    assert len(set(slabs)) == 1
    growth = rss[99] - rss[9]
    assert growth < 2 * 2**20, f"RSS grew {growth / 2**20:.2f} MiB from step 10 to 100"
    assert np.mean(losses[-4:]) < np.mean(losses[:4])


def test_two_models_trained_alternately_keep_their_own_plans():
    def solo(seed, dim):
        return _train("fused", lambda: _vit(seed=seed, dim=dim), lambda m: optim.AdamW(m.parameters(), lr=3e-3),
                      _batches(3, seed=seed), 12)

    alone_a, _, ra = solo(0, 32)
    alone_b, _, rb = solo(5, 48)
    models, trainers, losses = [], [], {0: [], 1: []}
    for seed, dim in ((0, 32), (5, 48)):
        m = _vit(seed=seed, dim=dim)
        models.append(m)
        trainers.append(Trainer(m, optim.AdamW(m.parameters(), lr=3e-3), cross_entropy, route="fused"))
    data = [_batches(3, seed=0), _batches(3, seed=5)]
    for i in range(12):
        for k in (0, 1):
            losses[k].append(trainers[k].step(*data[k][i % 3]).loss)
    assert losses[0] == [r.loss for r in ra] and losses[1] == [r.loss for r in rb]
    assert _max_param_diff(models[0], alone_a) == 0 and _max_param_diff(models[1], alone_b) == 0
    assert trainers[0].fused.plans is not trainers[1].fused.plans


def test_a_new_batch_shape_retraces_into_a_bounded_lru():
    batches = {b: _batches(1, batch=b)[0] for b in (4, 8, 16)}
    order = [4, 8, 4, 16, 8, 4, 4]
    kw = dict(make_model=_vit, make_opt=lambda m: optim.AdamW(m.parameters(), lr=3e-3))
    seq = [batches[b] for b in order]
    eager, _, _ = _train("eager", batches=seq, steps=len(seq), **kw)
    fused, trainer, _ = _train("fused", batches=seq, steps=len(seq), max_plans=2, **kw)
    # 4, 8 traced; 4 hit; 16 traced (evicts 8); 8 traced again (evicts 4); 4 traced again; 4 hit.
    assert trainer.fused.traces == 5 and len(trainer.fused.plans) == 2
    assert _max_param_diff(eager, fused) <= 1e-5


# -- what the tracer refuses ----------------------------------------------------------------------

class _MaskedMean(Module):
    """Uses a data-dependent boolean mask: the output shape depends on the values."""

    def __init__(self):
        super().__init__()
        self.fc = Linear(6, 3, rng=np.random.default_rng(0))

    def forward(self, x):
        h = self.fc(x)
        kept = h[h.data > 0]  # how many elements survive depends on the batch
        return h + kept.sum() * 0.0


def _tab(n=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)) for _ in range(n)]


def test_an_unsupported_op_raises_a_clear_error_naming_it():
    model = _MaskedMean()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused")
    before = [p.numpy() for p in model.parameters()]
    with pytest.raises(UnsupportedOpError, match="getitem with a boolean mask.*route='eager'"):
        trainer.step(*_tab()[0])
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))  # nothing trained, nothing lost
    assert trainer.step_count == 0


def test_fallback_to_eager_only_when_allowed_and_logged(caplog):
    model = _MaskedMean()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                      fallback_to_eager=True)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        reports = [trainer.step(x, y) for x, y in _tab()]
    assert [r.route for r in reports] == ["eager"] * 3
    assert "boolean mask" in trainer.fallback_reason
    assert sum("fused route unavailable" in r.message for r in caplog.records) == 1


class _Branchy(Module):
    """Control flow that depends on the data: an extra op only for some batches."""

    def __init__(self):
        super().__init__()
        self.fc = Linear(6, 3, rng=np.random.default_rng(0))

    def forward(self, x):
        h = self.fc(x)
        if float(x.data.mean()) > 0:
            h = h * 2.0
        return h


def test_data_dependent_control_flow_is_caught_on_replay():
    model = _Branchy()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused")
    x = np.ones((5, 6), np.float32)
    y = np.zeros(5, np.int64)
    trainer.step(x, y)  # traced with the branch taken
    with pytest.raises(PlanMismatchError, match="trace|buffers"):
        trainer.step(-x, y)


def test_a_parameter_without_gradient_is_left_out_as_the_eager_optimizer_skips_it():
    # An optimizer parameter the step never uses: eager's optimizer (as torch's) skips it, weight decay too, and
    # the fused step leaves it out of its layout. Before, compile_step refused with "received no gradient".
    def run(route):
        model = _vit()
        unused = ta.nn.Parameter(np.ones(3, np.float32))
        opt = optim.AdamW(list(model.parameters()) + [unused], lr=1e-3, weight_decay=0.5)
        trainer = Trainer(model, opt, cross_entropy, route=route)
        losses = [trainer.step(*batch).loss for batch in _batches(3)]
        return model, unused, losses, trainer

    eager, eager_unused, eager_losses, _ = run("eager")
    fused, fused_unused, fused_losses, trainer = run("fused")
    np.testing.assert_array_equal(fused_unused.data, np.ones(3, np.float32))
    np.testing.assert_array_equal(eager_unused.data, np.ones(3, np.float32))
    np.testing.assert_allclose(fused_losses, eager_losses, rtol=1e-5)
    assert trainer.fused.left_out == {id(fused_unused): fused_unused} and trainer.fused.traces == 1


# -- checkpoints across routes ---------------------------------------------------------------------

def test_a_fused_checkpoint_resumes_on_eager_and_an_eager_one_on_fused(tmp_path):
    batches = _batches(4)
    make = dict(make_model=_vit, make_opt=lambda m: optim.AdamW(m.parameters(), lr=3e-3),
                make_sched=lambda o: optim.lr_scheduler.warmup_cosine(o, warmup_steps=3, total_steps=20))
    straight, _, _ = _train("fused", batches=batches, steps=20, **make)

    first, trainer, _ = _train("fused", batches=batches, steps=10, **make)
    trainer.save(tmp_path / "fused.safetensors")
    second, trainer2, _ = _train("eager", batches=batches, steps=0, **make)
    trainer2.load(tmp_path / "fused.safetensors")
    for i in range(10, 15):
        trainer2.step(*batches[i % 4])
    trainer2.save(tmp_path / "eager.safetensors")
    third, trainer3, _ = _train("fused", batches=batches, steps=0, **make)
    trainer3.load(tmp_path / "eager.safetensors")
    reports = [trainer3.step(*batches[i % 4]) for i in range(15, 20)]
    assert {r.route for r in reports} == {"fused"}
    assert _max_param_diff(straight, third) <= 1e-5


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_a_checkpoint_loaded_into_a_running_fused_trainer_resumes_its_run(tmp_path, replay):
    # optimizer.load_state_dict replaces the param-group dicts: the fused updates must read the new ones (the
    # scheduler writes its lr there), not those they were built with.
    batches = _batches(4)
    make = dict(make_model=_vit, make_opt=lambda m: optim.AdamW(m.parameters(), lr=3e-3),
                make_sched=lambda o: optim.lr_scheduler.warmup_cosine(o, warmup_steps=3, total_steps=20),
                fused_replay=replay)
    straight, trainer, _ = _train("fused", batches=batches, steps=5, **make)
    trainer.save(tmp_path / "at5.safetensors")
    for i in range(5, 10):
        trainer.step(*batches[i % 4])
    resumed, other, _ = _train("fused", batches=batches, steps=8, **make)  # ahead, then back to step 5
    other.load(tmp_path / "at5.safetensors")
    for i in range(5, 10):
        other.step(*batches[i % 4])
    assert other.fused.replay == replay
    assert _max_param_diff(straight, resumed) == 0.0
