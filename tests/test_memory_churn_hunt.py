"""Memory under churn: steps that retrace or lay the state out again, over and over, on the fused route (both
replays) and on eager. What is checked: live plans, slabs and flat groups stay bounded (weak references; with
the cyclic collector off, so "freed" means freed when the last reference goes, as the memory model promises:
owned by the module/optimizer/plan that uses it), tracemalloc and pool bytes flat after warm-up,
memory_report() equal to what is really held, RSS not climbing.

6 of these 35 tests failed on ca729f1, before the fix (each under a "Regression" comment): the FusedStep <->
GradSink reference cycle. With this file copied into a worktree of ca729f1 (git worktree add /tmp/old ca729f1),
run in /tmp/old: `NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_memory_churn_hunt.py`.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import tracemalloc
import weakref

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import optim
from tensorarena.compile import flat as flat_module
from tensorarena.memory.meter import rss_bytes
from tensorarena.memory.pool import BlockPool
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

REPLAYS = ["python", "captured"]
MiB = 1 << 20


# -- helpers ----------------------------------------------------------------------------------------------

def _mlp(in_features=32, hidden=(64, 64), out=4, seed=0):
    return MLP(MLPConfig(in_features=in_features, hidden=hidden, out_features=out), rng=np.random.default_rng(seed))


def _rows(n, features=32, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    return x, x[:, :classes].argmax(axis=1).astype(np.int64)


def _vit(seed=0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, num_heads=4)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _images(batch=8, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
    return x, (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64)


class _Seen:
    """Weak references to every slab and flat group a FusedStep ever had (each object once, by identity: an id
    may be reused after a free, so the dict is keyed by id but checked by `is`)."""

    def __init__(self) -> None:
        self.refs: dict[str, list[weakref.ref]] = {"slab": [], "group": [], "fused": []}

    def _add(self, kind: str, obj) -> None:
        if not any(r() is obj for r in self.refs[kind]):
            self.refs[kind].append(weakref.ref(obj))

    def see(self, fused) -> None:
        if fused is None:
            return
        self._add("fused", fused)
        for plan in fused.plans.values():
            self._add("slab", plan.slab)
        for group in fused.flat.groups:
            self._add("group", group)

    def live(self, kind: str) -> int:
        return sum(r() is not None for r in self.refs[kind])

    def seen(self, kind: str) -> int:
        return len(self.refs[kind])


@pytest.fixture
def no_gc():
    """The cyclic collector off for the test: what is freed is freed by reference counting, at once."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _plan_bytes(plan) -> int:
    return plan.slab.nbytes + plan.inputs.nbytes + sum(b.nbytes for b in plan.target_buffers)


def _layout_bytes(fused) -> int:
    return sum(sum(a.nbytes for a in g.buffers()) for g in fused.flat.groups)


def _traced_growth(run, steps: int, warm: int) -> int:
    """tracemalloc's net growth (bytes) over `steps` calls of run(i), measured after `warm` calls made while
    tracing too (what was allocated before tracing started is not seen when freed: a first round would count
    each replaced object's new copy and not its freed old one)."""
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(warm):
            run(i)
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(warm, warm + steps):
            run(i)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before


# -- evicted plans --------------------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [None, 1.0], ids=["in_backward", "flat_grads"])
@pytest.mark.parametrize("replay", REPLAYS)
def test_evicted_plans_are_freed_at_once_and_live_plans_stay_at_max_plans(replay, clip, no_gc):
    # Six signatures cycling through max_plans=2: every step traces and evicts. A leak of one evicted plan
    # (its slab kept by a recording, a prepared update, the GradSink...) would make live slabs exceed 2.
    model = _mlp()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay, max_plans=2, clip_grad_norm=clip)
    seen = _Seen()
    for i in range(24):
        trainer.step(*_rows(4 + i % 6, seed=i))
        seen.see(trainer.fused)
        assert len(trainer.fused.plans) <= 2
        assert seen.live("slab") == len(trainer.fused.plans), f"step {i}: evicted slabs still alive"
    assert seen.seen("slab") == 24  # every step traced a plan of its own (LRU thrash): the check had work
    assert trainer.fused.traces == 24 and seen.live("group") == len(trainer.fused.flat.groups)
    if replay == "captured":
        assert all(p.capture is not None and p.capture.tape is not None for p in trainer.fused.plans.values())


@pytest.mark.parametrize("replay", REPLAYS)
def test_cycling_signatures_keeps_traced_memory_flat(replay):
    # After the first pass over 6 signatures (max_plans=3), 60 more steps that keep tracing and evicting
    # must not add memory: one leaked plan here (batch 64-144, width 256) is a slab of 0.4-0.9 MB plus its
    # recording, several times the 48-72 KB of noise a full CI run showed (log records, caches) on a 50 KB plan.
    model = _mlp(hidden=(256, 256))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay, max_plans=3)
    batches = [_rows(64 + 16 * k, seed=k) for k in range(6)]
    for i in range(6):
        trainer.step(*batches[i % 6])
    growth = _traced_growth(lambda i: trainer.step(*batches[i % 6]), 60, warm=12)
    assert trainer.fused.traces == 78  # every step traced: 6 + 12 + 60
    assert growth < 256 * 1024, f"{growth} B more after 60 steps that each traced and evicted a plan"


# -- a FusedStep let go: a new Trainer per epoch, clipping switched, the out-of-memory fallback ---------------

# Regression (fixed: GradSink holds a weakref.proxy of its step): a dropped Trainer's (or FusedStep's) fused memory --
# every plan's slab and input buffers and the whole flat layout (a copy of the parameters, optimizer state, flat
# gradients) -- is not freed when the last reference goes: FusedStep.grad_sink = captured.GradSink(self)
# (compile/step.py:233, :339) holds the FusedStep back (GradSink.step, compile/captured.py GradSink.__init__), a
# reference cycle that only the cyclic collector breaks. Should be: freed at once, as the Trainer itself is (its
# weakref dies at `del`). Fix: GradSink keeps weakref.proxy(step) (or is given step.flat per call), so the FusedStep
# has no cycle.
@pytest.mark.parametrize("replay", REPLAYS)
def test_a_dropped_trainer_frees_its_plans_and_flat_layout_at_once(replay, no_gc):
    model = _mlp()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay)
    for _ in range(3):
        trainer.step(*_rows(8))
    seen = _Seen()
    seen.see(trainer.fused)
    trainer_ref = weakref.ref(trainer)
    del trainer
    assert trainer_ref() is None  # the Trainer itself has no cycle: this is what "dropped" means here
    assert (seen.live("fused"), seen.live("slab"), seen.live("group")) == (0, 0, 0), \
        "the dropped trainer's FusedStep, slab and flat groups wait for the cyclic collector"


# Regression (fixed: GradSink holds a weakref.proxy of its step): same cause (the FusedStep <-> GradSink cycle). A new
# Trainer per epoch for the same model leaves every earlier Trainer's flat copy of the parameters, optimizer state and
# slab resident until a full collection, which a captured replay (almost no Python objects per step) rarely triggers:
# RSS climbs by about one predicted_peak per epoch. Measured (MLP 256-1024-1024-10, batch 256, AdamW, 5 steps/epoch, 8
# epochs): up to 7 FusedSteps alive at once, RSS +140 MiB while memory_report()["predicted_peak"] is 23 MiB. Should
# be: one FusedStep alive, RSS flat after epoch 1. The bound below (1.5 x predicted_peak over 7 epochs) is several
# times the noise of one epoch's steps; each leaked epoch adds a whole predicted_peak.
def test_a_new_trainer_each_epoch_does_not_pile_up_fused_copies():
    model = _mlp(in_features=256, hidden=(1024, 1024), out=10)
    opt = optim.AdamW(model.parameters(), lr=1e-4)
    x, y = _rows(256, features=256, classes=10)
    seen = _Seen()
    rss = []
    for epoch in range(8):
        trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay="captured")
        for _ in range(4):
            trainer.step(x, y)
        seen.see(trainer.fused)
        rss.append(rss_bytes())
    peak = trainer.fused.memory_report()["predicted_peak"]
    assert peak > 20 * MiB  # a leaked copy is big enough to see in RSS
    live = seen.live("fused")
    grown = rss[-1] - rss[0]
    assert live <= 2 and grown < 1.5 * peak, \
        f"{live} FusedSteps alive after 8 epochs; RSS grew {grown / MiB:.0f} MiB (predicted_peak {peak / MiB:.0f} MiB)"


# Regression (fixed: GradSink holds a weakref.proxy of its step): Trainer.clip_grad_norm switched on or off rebuilds
# the fused step (train/trainer.py clip_grad_norm setter: `self.fused = None`), and the old FusedStep -- its slabs and
# the previous flat layout -- stays alive until the cyclic collector runs (the GradSink cycle, compile/step.py:233).
# Toggled 20 times: 20 layouts and slabs alive at once. Should be: one flat layout and the live plans' slabs. Fix as
# above.
@pytest.mark.parametrize("replay", REPLAYS)
def test_toggling_clip_grad_norm_keeps_one_flat_layout_alive(replay, no_gc):
    model = _mlp()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay)
    seen = _Seen()
    x, y = _rows(8)
    for i in range(20):
        trainer.clip_grad_norm = 1.0 if i % 2 else None
        trainer.step(x, y)
        seen.see(trainer.fused)
    assert seen.seen("fused") == 20  # each switch really rebuilt the step
    assert seen.live("group") == len(trainer.fused.flat.groups), f"{seen.live('group')} flat groups alive"
    assert seen.live("slab") == len(trainer.fused.plans), f"{seen.live('slab')} slabs alive"


# Regression (fixed: GradSink holds a weakref.proxy of its step): the out-of-memory fallback ("the trainer closes the
# step arena, moves the state into the streaming store, redoes the step", DESIGN.md) sets `self.fused = None` in
# Trainer._start_streaming with the comment "its flat buffers and slab held the state the store now has; let them go"
# -- but they do not go: the FusedStep <-> GradSink cycle (compile/step.py:233) keeps the slab and the flat
# parameter/state copy resident until a cyclic collection, right when the process is out of memory. Should be: freed
# as the fallback starts streaming.
def test_the_out_of_memory_fallback_lets_the_fused_buffers_go(tmp_path, no_gc, monkeypatch):
    # Not to pytest's log capture: the fallback's warning passes the exception object as a logging argument,
    # and a handler that keeps records (pytest's) keeps its traceback, whose frames hold the FusedStep too.
    monkeypatch.setattr(logging.getLogger("tensorarena"), "propagate", False)
    model = _vit()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay="python", store_dir=tmp_path / "s")
    real = model.blocks[1].forward

    def forward(*args, **kw):
        if trainer.step_count + 1 == 3 and trainer.route != "streaming":
            raise ta.ArenaOutOfMemory(64 * MiB, 32 * MiB, 32 * MiB, 0)
        return real(*args, **kw)

    model.blocks[1].forward = forward
    x, y = _images()
    trainer.step(x, y)
    trainer.step(x, y)
    seen = _Seen()
    seen.see(trainer.fused)
    assert trainer.step(x, y).route == "streaming" and trainer.fused is None
    assert (seen.live("fused"), seen.live("slab"), seen.live("group")) == (0, 0, 0), \
        "after the fallback the fused slab and flat buffers are still held"


# -- layout churn: freezing, add_param_group, state dicts ------------------------------------------------------

@pytest.mark.parametrize("replay", REPLAYS)
def test_freezing_and_unfreezing_every_step_keeps_one_layout_and_flat_memory(replay, no_gc):
    # Each toggle builds a new FlatState (a new layout) and traces again: the old layout's buffers must go at
    # once (a leak would keep one copy of the parameters and AdamW's two moments per toggle alive).
    model = _mlp()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay)
    seen = _Seen()
    x, y = _rows(8)

    def churn(i):
        model.net[0].weight.requires_grad = i % 2 == 0
        trainer.step(x, y)
        seen.see(trainer.fused)
        assert seen.live("group") == len(trainer.fused.flat.groups), f"step {i}: old flat groups alive"
        assert seen.live("slab") == len(trainer.fused.plans), f"step {i}: slabs of dropped plans alive"

    growth = _traced_growth(churn, 30, warm=6)
    assert trainer.fused.layouts == 36  # 35 toggles (step 0 keeps it trainable), each laid out again
    # _LIVE is process-wide: in a full run other tests' layouts may still be alive; this model's are counted
    ids = {id(p) for p in model.parameters()}
    ours = [g for g in list(flat_module._LIVE) if any(id(p) in ids for p in g.params)]
    assert len(ours) == len(trainer.fused.flat.groups)
    # One leaked layout (parameters + AdamW's two moments) is ~78 KB, so 30 leaked would be ~2.3 MB; a full CI run
    # showed 56-58 KB of noise (log records of each relayout, caches) against the old 48 KB bound.
    assert growth < 256 * 1024, f"{growth} B more after 30 layouts"


@pytest.mark.parametrize("replay", REPLAYS)
def test_add_param_group_frees_the_old_layout_and_the_report_is_the_new_one(replay, no_gc):
    model = _mlp(hidden=(64, 64, 64, 64))
    params = list(model.parameters())
    opt = optim.AdamW(params[:2], lr=1e-3)
    for p in params[2:]:
        p.requires_grad = False
    trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay=replay)
    seen = _Seen()
    x, y = _rows(8)
    trainer.step(x, y)
    seen.see(trainer.fused)
    for k in range(2, len(params), 2):
        for p in params[k:k + 2]:
            p.requires_grad = True
        opt.add_param_group({"params": params[k:k + 2], "lr": 1e-3})
        for _ in range(2):
            trainer.step(x, y)
        seen.see(trainer.fused)
        assert seen.live("group") == len(trainer.fused.flat.groups)
        assert seen.live("slab") == len(trainer.fused.plans) == 1
        report = trainer.fused.memory_report()
        untrained = report.get("params_not_trained", 0) + report.get("state_not_trained", 0)
        assert report["predicted_peak"] - report["libraries_measured"] == \
            _layout_bytes(trainer.fused) + _plan_bytes(trainer.fused.plan) + untrained, report
    assert trainer.fused.layouts == len(params) // 2


@pytest.mark.parametrize("what", ["optimizer", "model", "both"])
@pytest.mark.parametrize("replay", REPLAYS)
def test_load_state_dict_every_step_neither_relays_out_nor_grows(replay, what, no_gc):
    # A state dict loaded every step (a "reset to the best weights" loop) must be adopted into the same flat
    # buffers: no new layout, no retrace, and the loaded copies freed. A leak of the loaded arrays would be one
    # copy of parameters or moments (~80 KB here) per step.
    model = _mlp(hidden=(128, 128))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay=replay)
    x, y = _rows(8)
    for _ in range(3):
        trainer.step(x, y)
    msd, osd = model.state_dict(), opt.state_dict()
    seen = _Seen()
    losses = []

    def churn(i):
        if what in ("model", "both"):
            model.load_state_dict(msd)
        if what in ("optimizer", "both"):
            opt.load_state_dict(osd)
        losses.append(trainer.step(x, y).loss)
        seen.see(trainer.fused)

    growth = _traced_growth(churn, 30, warm=4)
    assert trainer.fused.layouts == 1 and trainer.fused.traces == 1
    assert seen.live("group") == seen.seen("group") == len(trainer.fused.flat.groups)
    assert growth < 48 * 1024, f"{growth} B more after 30 loads"
    if what != "optimizer":  # the weights loaded every step are really used: every step is step 4 again
        assert len(set(losses)) == 1, losses[:5]


# -- plans keyed by precision, eval between steps -----------------------------------------------------------

@pytest.mark.parametrize("replay", REPLAYS)
def test_matmul_precision_toggled_finds_its_two_plans_and_the_report_counts_both(replay, no_gc):
    model = _mlp()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay)
    seen = _Seen()
    x, y = _rows(8)
    for i in range(20):
        trainer.matmul_precision = "bfloat16" if i % 2 else "float32"
        trainer.step(x, y)
        seen.see(trainer.fused)
    fused = trainer.fused
    assert fused.traces == 2 and len(fused.plans) == 2 and seen.seen("slab") == seen.live("slab") == 2
    report = fused.memory_report()
    other = [p for p in fused.plans.values() if p is not fused.plan]
    assert report["other_plans"] == sum(_plan_bytes(p) for p in other)
    assert report["predicted_peak"] - report["libraries_measured"] == \
        _layout_bytes(fused) + sum(_plan_bytes(p) for p in fused.plans.values())


@pytest.mark.parametrize("replay", REPLAYS)
def test_evaluate_between_steps_neither_retraces_nor_grows(replay):
    model = _mlp(hidden=(128, 128))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay)
    x, y = _rows(16)
    held_x, held_y = _rows(100, seed=9)

    def churn(i):
        trainer.step(x, y)
        trainer.evaluate(held_x, held_y, batch_size=32)
        model.eval()
        model.train()

    growth = _traced_growth(churn, 30, warm=4)
    assert trainer.fused.traces == 1 and len(trainer.fused.plans) == 1
    assert growth < 48 * 1024, f"{growth} B more after 30 evaluations between steps"


@pytest.mark.parametrize("replay", REPLAYS)
def test_the_report_equals_what_is_held_while_signatures_churn(replay, no_gc):
    # After every step of a churn over 5 signatures with max_plans=3, predicted_peak == flat layout + every
    # live plan's slab and inputs, and other_plans == those of the plans other than the latest.
    model = _mlp()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay, max_plans=3)
    for i in range(15):
        trainer.step(*_rows([4, 8, 12, 16, 20][(i * 2) % 5], seed=i))
        fused = trainer.fused
        report = fused.memory_report()
        held = sum(_plan_bytes(p) for p in fused.plans.values())
        assert report["predicted_peak"] - report["libraries_measured"] == _layout_bytes(fused) + held
        assert report.get("other_plans", 0) == held - _plan_bytes(fused.plan)


# -- eager: arena high-water and pool under varying batches --------------------------------------------------

@pytest.mark.parametrize("outer", [False, True], ids=["plain", "under_an_outer_arena"])
def test_eager_high_water_and_pool_are_flat_over_200_steps_of_varying_batches(outer):
    model = _mlp(hidden=(128, 128))
    pool = BlockPool()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="eager", pool=pool)
    sizes = [16, 48, 8, 64, 32]
    batches = {n: _rows(n, seed=n) for n in sizes}
    first: dict[int, int] = {}
    outer_arena = ta.Arena(name="outer, never reset") if outer else None
    if outer_arena is not None:
        outer_arena.__enter__()
    try:
        for i in range(200):
            n = sizes[i % len(sizes)]
            report = trainer.step(*batches[n])
            assert pool.stats.bytes_in_use == 0, f"step {i}: the step arena kept blocks"
            hw = first.setdefault(n, report.arena_high_water)
            assert report.arena_high_water == hw, f"step {i}, batch {n}: high-water {report.arena_high_water} != {hw}"
            if i == len(sizes) - 1:
                after_warmup = (pool.stats.misses, pool.stats.bytes_cached, pool.stats.peak_bytes)
        assert (pool.stats.misses, pool.stats.bytes_cached, pool.stats.peak_bytes) == after_warmup
        if outer_arena is not None:
            assert outer_arena.stats.bytes_in_use == 0 and outer_arena.stats.blocks == 0
    finally:
        if outer_arena is not None:
            outer_arena.__exit__(None, None, None)
    assert len(set(first.values())) == len(sizes)  # the sizes really differ in high-water


def test_eager_varying_batches_rss_is_flat():
    # One step of batch 256 on 256-1024-1024 holds ~10 MiB of activations: a step arena kept per step would add
    # that every step; 150 steps would be > 1 GiB.
    model = _mlp(in_features=256, hidden=(1024, 1024), out=10)
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-4), cross_entropy, route="eager")
    batches = [_rows(n, features=256, classes=10, seed=n) for n in (256, 128, 192, 64)]
    for i in range(8):
        trainer.step(*batches[i % 4])
    before = rss_bytes()
    for i in range(60):
        trainer.step(*batches[i % 4])
    grown = rss_bytes() - before
    assert grown < 24 * MiB, f"RSS grew {grown / MiB:.1f} MiB over 60 eager steps"


# -- streaming: a dropped trainer -------------------------------------------------------------------------

def test_a_dropped_streaming_trainer_releases_its_store_threads_and_files(no_gc):
    model = _vit()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    fds_before = len(os.listdir("/proc/self/fd"))
    threads_before = threading.active_count()
    trainer = Trainer(model, opt, cross_entropy, route="streaming")
    x, y = _images()
    for _ in range(3):
        trainer.step(x, y)
    store_dir = trainer.store_dir
    stream, store = weakref.ref(trainer.stream), weakref.ref(trainer.stream.store)
    assert threading.active_count() > threads_before and len(os.listdir("/proc/self/fd")) > fds_before
    del trainer
    assert stream() is None and store() is None
    assert not os.path.exists(store_dir)  # the temporary store went with its route
    assert threading.active_count() == threads_before
    assert len(os.listdir("/proc/self/fd")) == fds_before


# -- RSS under heavy fused churn; plans keyed by the thread count ---------------------------------------------

@pytest.mark.parametrize("replay", REPLAYS)
def test_fused_rss_is_bounded_while_signatures_and_layouts_churn(replay):
    # Every step traces (4 batch sizes, max_plans=2) and every 6th step freezes or unfreezes the first layer (a
    # new layout): 48 traces, 9 layouts. A slab kept per trace would be ~8 MiB each (384 MiB); a layout kept per
    # toggle ~15 MiB. Measured: RSS within ~25 MiB of step 8's all along (python replay's Python objects vary).
    model = _mlp(in_features=256, hidden=(1024, 1024), out=10)
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-4), cross_entropy, route="fused",
                      fused_replay=replay, max_plans=2)
    batches = [_rows(n, features=256, classes=10, seed=n) for n in (256, 224, 192, 160)]
    rss = []
    for i in range(48):
        if i % 6 == 5:
            model.net[0].weight.requires_grad = not model.net[0].weight.requires_grad
        trainer.step(*batches[i % 4])
        if i % 8 == 7:
            rss.append(rss_bytes())
    assert trainer.fused.traces == 48 and trainer.fused.layouts == 9
    grown = max(rss) - rss[0]
    assert grown < 40 * MiB, f"RSS {[r // MiB for r in rss]} MiB over the churn"


_THREADS_SCRIPT = r"""
import gc, json, sys
import numba
sys.path.insert(0, "tests")
from test_memory_churn_hunt import _mlp, _rows, _Seen, _plan_bytes, _layout_bytes
from tensorarena import optim
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

out = {}
gc.disable()
for replay in ("python", "captured"):
    model = _mlp()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      fused_replay=replay, max_plans=4)
    seen, (x, y) = _Seen(), _rows(8)
    for i in range(20):
        numba.set_num_threads(1 + i % 2)
        trainer.step(x, y)
        seen.see(trainer.fused)
    f = trainer.fused
    out[replay] = [f.traces, len(f.plans), seen.live("slab"), seen.seen("slab"),
                   f.memory_report()["predicted_peak"] - f.memory_report()["libraries_measured"] - _layout_bytes(f)
                   - sum(_plan_bytes(p) for p in f.plans.values())]
print(json.dumps(out))
"""


def test_toggling_the_thread_count_finds_its_two_plans_again():
    # Plans are keyed by numba's thread count: switching 1 <-> 2 for 20 steps must trace twice, keep two plans
    # and two slabs, and report exactly them. In a child process: this suite runs with NUMBA_NUM_THREADS=1,
    # under which set_num_threads(2) is refused.
    import json
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], capture_output=True, text=True, timeout=300,
                         env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # traces, plans, live slabs, slabs ever made, report - held
    assert result == {"python": [2, 2, 2, 2, 0], "captured": [2, 2, 2, 2, 0]}, result
