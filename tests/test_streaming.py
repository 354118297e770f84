"""The streaming route (tensorarena.stream): step-for-step parity with eager training, memory that
does not grow with depth, a store that resumes what is consistent and refuses what is not, and
moving the training state in and out of memory. Tiny ViTs (16 px, 4 px patches, dim 32)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import optim
from tensorarena.memory.arena import StaleTensorError
from tensorarena.memory.pool import BlockPool
from tensorarena.models import MLP, MLPConfig, ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import Stage, StoreError, StreamingRoute, StreamingUnsupportedError
from tensorarena.train.report import NonFiniteLossError
from tensorarena.train.trainer import Trainer
from tests.unstaged_model import Unstaged

STEPS = 20
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def _config(*, depth=2, dim=32, dropout=0.0, dtype=np.float32) -> ViTConfig:
    return ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=dim, depth=depth, num_heads=4,
                     dropout=dropout, attention_dropout=dropout, dtype=dtype)


def _setup(*, opt="adamw", seed=0, schedule=True, **config):
    """A tiny ViT with its own generator (init and dropout), an optimizer and a warmup-cosine schedule."""
    model = ViT(_config(**config), rng=np.random.default_rng(seed))
    if opt == "adamw":
        optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    else:
        optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = optim.lr_scheduler.warmup_cosine(optimizer, warmup_steps=3, total_steps=40) if schedule else None
    return model, optimizer, sched


def _batches(n=STEPS, batch=3, dtype=np.float32, seed=1):
    """n steps cycling over 4 fixed random batches (so the loss can fall)."""
    rng = np.random.default_rng(seed)
    pool = [(rng.standard_normal((batch, 3, 16, 16)).astype(dtype), rng.integers(0, 5, batch)) for _ in range(4)]
    return [pool[i % 4] for i in range(n)]


def _eager(batches, *, clip=None, **setup):
    """Train a fresh _setup(**setup) with the eager Trainer; returns model, optimizer, schedule and losses."""
    model, optimizer, sched = _setup(**setup)
    trainer = Trainer(model, optimizer, cross_entropy, scheduler=sched, clip_grad_norm=clip)
    losses = [trainer.step(x, y).loss for x, y in batches]
    return model, optimizer, sched, losses


def _max_param_diff(a, b) -> float:
    return max(float(np.abs(p.data - q.data).max()) for p, q in zip(a.parameters(), b.parameters()))


def _assert_same_optimizer_state(o1, o2, m1, m2, tol):
    for p, q in zip(m1.parameters(), m2.parameters()):
        s1, s2 = o1.state.get(p, {}), o2.state.get(q, {})
        assert sorted(s1) == sorted(s2)
        for key in s1:
            np.testing.assert_allclose(np.asarray(s2[key]), np.asarray(s1[key]), rtol=0, atol=tol, err_msg=key)


# -- parity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_streaming_matches_eager_step_for_step(tmp_path, opt, dropout, dtype):
    batches = _batches(dtype=dtype)
    ta.manual_seed(0)
    m1, o1, s1, eager_losses = _eager(batches, opt=opt, dropout=dropout, dtype=dtype)

    ta.manual_seed(0)
    m2, o2, s2 = _setup(opt=opt, dropout=dropout, dtype=dtype)
    with StreamingRoute.from_memory(m2, o2, cross_entropy, tmp_path / "store", scheduler=s2) as route:
        losses = [route.step(x, y) for x, y in batches]
        assert route.step_count == STEPS
        route.to_memory()

    tol = TOL[dtype]
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=tol)
    assert losses[-4] < losses[0]  # it trained (same batch)
    assert _max_param_diff(m1, m2) <= tol
    _assert_same_optimizer_state(o1, o2, m1, m2, tol)
    assert s2.state_dict() == s1.state_dict()


def _grouped_adam(model):
    """Two groups: no weight decay and a lower lr for biases and norms (the usual ViT recipe), AMSGrad on."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0, "lr": 3e-3}], lr=1e-2, amsgrad=True)


@pytest.mark.parametrize("make", [
    _grouped_adam,
    lambda m: optim.NAdam(m.parameters(), lr=1e-2),  # an extra per-parameter scalar (mu_product)
    lambda m: optim.RMSprop(m.parameters(), lr=1e-3, momentum=0.9, centered=True),
    lambda m: optim.Adagrad(m.parameters(), lr=1e-2, initial_accumulator_value=0.1),  # non-zero state fill
    lambda m: optim.Lion(m.parameters(), lr=1e-3),
    lambda m: optim.LAMB(m.parameters(), lr=1e-2),
], ids=["adamw-2-groups-amsgrad", "nadam", "rmsprop", "adagrad", "lion", "lamb"])
def test_every_optimizer_and_param_groups_match_eager(tmp_path, make):
    batches = _batches(6)
    m1 = ViT(_config(dropout=0.1), rng=np.random.default_rng(0))
    o1 = make(m1)
    trainer = Trainer(m1, o1, cross_entropy)
    eager_losses = [trainer.step(x, y).loss for x, y in batches[:5]]
    m2 = ViT(_config(dropout=0.1), rng=np.random.default_rng(0))
    o2 = make(m2)
    trainer2 = Trainer(m2, o2, cross_entropy)
    losses = [trainer2.step(x, y).loss for x, y in batches[:2]]  # state exists when it moves in
    with StreamingRoute.from_memory(m2, o2, cross_entropy, tmp_path, step=2) as route:
        losses += [route.step(x, y) for x, y in batches[2:5]]
        route.to_memory()
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    assert _max_param_diff(m1, m2) <= 1e-6
    _assert_same_optimizer_state(o1, o2, m1, m2, 1e-6)


def test_clip_grad_norm_runs_two_backward_sweeps_and_matches_eager(tmp_path):
    batches = _batches(10)
    m1, o1, s1 = _setup(dropout=0.1)
    trainer = Trainer(m1, o1, cross_entropy, scheduler=s1, clip_grad_norm=0.5)
    eager_norms = [trainer.step(x, y).grad_norm for x, y in batches]
    m2, o2, s2 = _setup(dropout=0.1)
    with StreamingRoute.from_memory(m2, o2, cross_entropy, tmp_path, scheduler=s2, clip_grad_norm=0.5) as route:
        norms = []
        for x, y in batches:
            route.step(x, y)
            norms.append(route.last_stats.grad_norm)
        route.to_memory()
    assert min(eager_norms) > 0.5  # the clip was active
    np.testing.assert_allclose(norms, eager_norms, rtol=1e-6)
    assert _max_param_diff(m1, m2) <= 1e-5


# -- memory ------------------------------------------------------------------------------------
def _block_bytes(model: ViT) -> int:
    """One transformer block's footprint in the route: weights, gradients and AdamW's two moments."""
    return 4 * sum(p.data.nbytes for p in model.blocks[0].parameters())


def _memory_at_depth(tmp_path: Path, depth: int) -> dict:
    batches = _batches(3, batch=4)
    pool = BlockPool()
    tracemalloc.start()
    try:
        model, optimizer, sched = _setup(depth=depth, dim=64)
        block = _block_bytes(model)
        route = StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / f"d{depth}", scheduler=sched,
                                           pool=pool)
        with route:
            route.step(*batches[0])  # warm-up: kernels compiled, pool blocks cached
            held, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            route.step(*batches[1])
            route.step(*batches[2])
            _, peak = tracemalloc.get_traced_memory()
            stats = route.last_stats
    finally:
        tracemalloc.stop()
    return {"held": held, "step_peak": peak - held, "high_water": stats.arena_high_water,
            "resident": stats.resident_bytes, "block": block, "read": stats.bytes_read}


def test_memory_does_not_grow_with_depth(tmp_path):
    _memory_at_depth(tmp_path, 1)  # first use in the process: kernel compilation, caches
    shallow, deep = _memory_at_depth(tmp_path, 2), _memory_at_depth(tmp_path, 8)
    block = shallow["block"]
    assert deep["resident"] == shallow["resident"]  # the store's slots hold the largest stage, not the model
    assert deep["high_water"] - shallow["high_water"] < block, (shallow, deep)
    assert deep["held"] - shallow["held"] < block, (shallow, deep)  # all process memory held between steps
    assert deep["step_peak"] - shallow["step_peak"] < block, (shallow, deep)
    # ... while the model itself did grow by six blocks, all of them read every step
    assert deep["read"] - shallow["read"] > 6 * block * 3 // 4


def test_estimate_predicts_resident_memory_and_io_before_creating_anything(tmp_path):
    model, optimizer, sched = _setup(depth=3)
    estimate = StreamingRoute.estimate(model, optimizer)
    assert not list(tmp_path.iterdir())
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched) as route:
        route.step(*_batches(1)[0])
        stats = route.last_stats
        assert estimate["disk_bytes"] == sum(f.stat().st_size for f in tmp_path.glob("stage-*.bin"))
    assert (estimate["stages"], estimate["largest_stage"]) == (5, "blocks.0")
    assert estimate["resident_bytes"] == stats.resident_bytes
    assert (estimate["read_bytes_per_step"], estimate["written_bytes_per_step"]) == (stats.bytes_read,
                                                                                     stats.bytes_written)


def test_parameters_live_on_disk_while_streaming(tmp_path):
    model, optimizer, sched = _setup()
    route = StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    with route:
        assert not optimizer.state  # moved into the store
        with pytest.raises(StaleTensorError, match="to_memory"):
            model.head.weight.data
        with pytest.raises(StaleTensorError, match="to_memory"):
            model.state_dict()
        assert model.head.weight.shape == (5, 32)  # shape and dtype still answer
        route.step(*_batches(1)[0])
        route.to_memory()
    assert np.isfinite(model.head.weight.data).all() and len(optimizer.state) == len(list(model.parameters()))


# -- moving state in and out -------------------------------------------------------------------
@pytest.mark.parametrize("release", [True, False], ids=["release", "keep-arrays"])
def test_eager_then_streaming_then_eager_equals_pure_eager(tmp_path, release):
    batches = _batches(15)
    m1, o1, s1, eager_losses = _eager(batches, dropout=0.1)

    model, optimizer, sched = _setup(dropout=0.1)
    trainer = Trainer(model, optimizer, cross_entropy, scheduler=sched)
    losses = [trainer.step(x, y).loss for x, y in batches[:5]]
    weight = model.head.weight.data  # identity survives a round trip with release=False
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched,
                                    step=trainer.step_count, release=release) as route:
        losses += [route.step(x, y) for x, y in batches[5:10]]
        assert route.step_count == 10
        route.to_memory()
    assert (model.head.weight.data is weight) == (not release)
    losses += [trainer.step(x, y).loss for x, y in batches[10:]]

    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-5)
    assert _max_param_diff(m1, model) <= 1e-5
    _assert_same_optimizer_state(o1, optimizer, m1, model, 1e-5)


def test_predict_streams_an_eval_forward(tmp_path):
    model, optimizer, _ = _setup(dropout=0.1, schedule=False)
    x, _ = _batches(1)[0]
    model.eval()
    expected = model(ta.Tensor(x)).numpy()
    model.train()
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path) as route:
        np.testing.assert_array_equal(route.predict(x), expected)


# -- the store ---------------------------------------------------------------------------------
def test_resume_continues_the_same_trajectory(tmp_path):
    batches = _batches(10)
    m1, o1, s1, eager_losses = _eager(batches, dropout=0.1)

    model, optimizer, sched = _setup(dropout=0.1)
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched) as route:
        losses = [route.step(x, y) for x, y in batches[:6]]
    # A new process would build fresh objects: different init, RNG and schedule position.
    model, optimizer, sched = _setup(dropout=0.1, seed=123)
    with StreamingRoute(model, optimizer, cross_entropy, tmp_path, scheduler=sched, durable=True) as route:  # resumes
        assert route.step_count == 6
        losses += [route.step(x, y) for x, y in batches[6:]]
        route.to_memory()
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-5)
    assert _max_param_diff(m1, model) <= 1e-5
    assert sched.state_dict() == s1.state_dict()


def _fail_in_backward(route: StreamingRoute, stage: int, exc: BaseException) -> None:
    """Make stage `stage` raise on its recompute in backward: its second call of a step (the last
    stage, whose forward runs only in backward, its first)."""
    name, params, forward = route.stages[stage]
    calls = []
    per_step = 1 if stage == len(route.stages) - 1 else 2

    def failing(x):
        calls.append(1)
        if len(calls) % per_step == 0:
            raise exc
        return forward(x)

    route.stages[stage] = Stage(name, params, failing)


def test_a_step_killed_after_some_blocks_is_refused(tmp_path):
    batches = _batches(3)
    model, optimizer, sched = _setup(depth=3)
    route = StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    route.step(*batches[0])
    # Backward runs head, blocks.2 .. blocks.0, embed: failing in embed leaves the others written.
    _fail_in_backward(route, 0, RuntimeError("simulated crash"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        route.step(*batches[1])
    with pytest.raises(StoreError, match="holds two different steps"):
        route.step(*batches[2])
    route.close()
    model, optimizer, sched = _setup(depth=3)
    with pytest.raises(StoreError, match=r"killed in the middle of step 2.*step 1: embed.*step 2: blocks.0.*"
                                         r"delete the directory and resume from a checkpoint"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path, scheduler=sched)


def test_a_failure_before_any_write_leaves_the_route_usable(tmp_path):
    model, optimizer, sched = _setup()
    route = StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    _fail_in_backward(route, len(route.stages) - 1, MemoryError("simulated OOM in the head"))
    with route:
        with pytest.raises(MemoryError):
            route.step(*_batches(1)[0])
        route.stages[:] = model.stream_stages()
        route.step(*_batches(1)[0])
        assert route.step_count == 1


def killed_mid_step_then_resumed(tmp_path: Path, sabotage: str, refusal: str) -> None:
    """In a child: a depth-3 ViT streams one step into `tmp_path`, runs `sabotage` (code that makes the
    process SIGKILL itself during the next step; `route` is in scope), takes that step. Then resuming
    here must raise StoreError matching `refusal`."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from tests.test_streaming import _setup, _batches
        from tensorarena.nn.functional import cross_entropy
        from tensorarena.stream import StreamingRoute, optim_state
        model, optimizer, sched = _setup(depth=3)
        route = StreamingRoute.from_memory(model, optimizer, cross_entropy, {str(tmp_path)!r}, scheduler=sched)
        route.step(*_batches(1)[0])
    """) + textwrap.dedent(sabotage) + "route.step(*_batches(2)[1])\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    model, optimizer, sched = _setup(depth=3)
    with pytest.raises(StoreError, match=refusal):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path, scheduler=sched)


def test_a_real_kill_mid_step_is_detected(tmp_path):
    killed_mid_step_then_resumed(tmp_path, """
        name, params, forward = route.stages[1]
        calls = []
        def die(x):
            calls.append(1)
            if len(calls) == 2:
                route.store.drain()  # the later stages' writes are done: then the process dies
                os.kill(os.getpid(), signal.SIGKILL)
            return forward(x)
        route.stages[1] = type(route.stages[1])(name, params, die)
    """, "killed in the middle of step 2")


def test_a_stage_being_written_or_all_stages_ahead_of_the_manifest_are_refused(tmp_path):
    model, optimizer, sched = _setup()  # stages: embed, blocks.0, blocks.1, head
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched) as route:
        route.step(*_batches(1)[0])
    assert json.loads((tmp_path / "manifest.json").read_text())["data_step"] == 1
    journal = tmp_path / "journal.json"
    # Killed while writing blocks.0 of step 2 (head and blocks.1 already written):
    # (the journal lists the stages being written; stores from before io="map" wrote one int)
    for writing, stage in (([1], "blocks.0"), (1, "blocks.0"), ([2, 1], "blocks.1")):
        journal.write_text(json.dumps({"step": 2, "written": [3], "writing": writing}))
        model, optimizer, sched = _setup()
        with pytest.raises(StoreError, match=rf"interrupted while writing stage '{stage}' of step 2"):
            StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    # Killed after the last stage's write but before the manifest's commit:
    journal.write_text(json.dumps({"step": 2, "written": [3, 2, 1, 0], "writing": None}))
    with pytest.raises(StoreError, match="very end of step 2"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    # Killed after the forward pass of step 2, before any write: nothing mixed, resumes at step 1.
    journal.write_text(json.dumps({"step": 2, "written": [], "writing": None}))
    with StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path, scheduler=sched) as route:
        assert route.step_count == 1


def test_a_store_of_another_model_or_optimizer_is_refused(tmp_path):
    model, optimizer, sched = _setup(depth=2)
    StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, scheduler=sched).close()
    model, optimizer, sched = _setup(depth=3)
    with pytest.raises(StoreError, match=r"different model.*stages are.*Use a new directory"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    model, optimizer, sched = _setup(dim=16)
    with pytest.raises(StoreError, match=r"in stage 'embed' it holds patch_embed.weight \(32, 3, 4, 4\)"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    model, optimizer, sched = _setup(opt="sgd")
    with pytest.raises(StoreError, match="holds AdamW state but the optimizer is SGD"):
        StreamingRoute(model, optimizer, cross_entropy, tmp_path, scheduler=sched)
    model, optimizer, _ = _setup()
    with pytest.raises(StoreError, match="trained with an LR scheduler"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path)


def test_missing_or_short_files_are_refused(tmp_path):
    model, optimizer, _ = _setup(schedule=False)
    StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path).close()
    stage_file = tmp_path / "stage-0001.bin"
    size = stage_file.stat().st_size
    os.truncate(stage_file, size - 8)
    with pytest.raises(StoreError, match=r"stage-0001.bin \(stage 'blocks.0'\) has .* bytes, expected"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path)
    stage_file.unlink()
    with pytest.raises(StoreError, match=r"stage-0001.bin \(stage 'blocks.0'\) is missing"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path)


def test_an_existing_store_is_not_overwritten_and_a_busy_one_not_shared(tmp_path):
    model, optimizer, _ = _setup(schedule=False)
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path) as route:
        with pytest.raises(StoreError, match="in use by another StreamingRoute"):
            StreamingRoute.resume(*_setup(schedule=False)[:2], cross_entropy, tmp_path)
        route.to_memory()
    with pytest.raises(StoreError, match="already holds a streaming store.*overwrite=True"):
        StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path)
    StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, overwrite=True, release=False).close()
    with pytest.raises(StoreError, match="no streaming store"):
        StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path / "empty")
    (tmp_path / "manifest.json").unlink()  # as if creating the store had been killed
    with pytest.raises(StoreError, match="creating a store there was interrupted"):
        StreamingRoute.from_memory(*_setup(schedule=False)[:2], cross_entropy, tmp_path)


def test_a_closed_route_keeps_the_parameters_on_disk_until_resumed(tmp_path):
    model, optimizer, _ = _setup(schedule=False)
    StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path).close()
    with pytest.raises(StoreError, match="not in memory: a StreamingRoute holds them on disk"):
        StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / "other")
    StreamingRoute.resume(model, optimizer, cross_entropy, tmp_path).to_memory()
    assert np.isfinite(model.head.weight.data).all()


def test_an_unwritable_directory_fails_before_step_one(tmp_path):
    model, optimizer, _ = _setup(schedule=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match=r"cannot use .*a-file/store as a streaming store.*writable directory"):
        StreamingRoute.from_memory(model, optimizer, cross_entropy, blocker / "store")
    assert np.isfinite(model.head.weight.data).all()  # nothing was moved out
    if os.geteuid() != 0:  # root ignores permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(StoreError, match="cannot use .*locked as a streaming store"):
            StreamingRoute.from_memory(model, optimizer, cross_entropy, locked)


def test_nonfinite_loss_raises_or_skips_without_updating(tmp_path):
    batches = _batches(3)
    calls = []

    def loss_fn(out, y):
        calls.append(1)
        loss = cross_entropy(out, y)
        return loss * float("nan") if len(calls) == 2 else loss  # the second step's loss is NaN

    model, optimizer, _ = _setup(schedule=False)
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / "a") as route:
        route.loss_fn = loss_fn
        route.step(*batches[0])
        with pytest.raises(NonFiniteLossError, match="step 2"):
            route.step(*batches[1])
        assert route.step_count == 1
        route.step(*batches[2])
    calls.clear()
    model, optimizer, _ = _setup(schedule=False)
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / "b",
                                    on_nonfinite="skip") as route:
        route.loss_fn = loss_fn
        route.step(*batches[0])
        route.step(*batches[1])
        assert route.last_stats.skipped and route.step_count == 2
        route.to_memory()
    assert all(float(s["step"]) == 1 for s in optimizer.state.values())  # one update, not two


def test_models_without_stages_and_unsupported_setups_are_refused(tmp_path):
    mlp = Unstaged(MLP(MLPConfig(in_features=4, hidden=(8,), out_features=2)))
    with pytest.raises(StreamingUnsupportedError, match="Unstaged has no stream_stages"):
        StreamingRoute.from_memory(mlp, optim.SGD(mlp.parameters(), lr=0.1), cross_entropy, tmp_path)
    model, optimizer, _ = _setup(schedule=False)
    with pytest.raises(ValueError, match="clip_grad_norm must be positive"):
        StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path, clip_grad_norm=0)

    class Incomplete(ViT):
        def stream_stages(self):
            return super().stream_stages()[:-1]

    bad = Incomplete(_config(), rng=np.random.default_rng(0))
    with pytest.raises(StreamingUnsupportedError, match=r"leaves trainable parameters out.*norm.weight"):
        StreamingRoute.from_memory(bad, optim.SGD(bad.parameters(), lr=0.1), cross_entropy, tmp_path)


def test_a_failed_streaming_update_kernel_leaves_the_step_counts_alone(monkeypatch):
    # optim_state.update used to add 1 to a parameter's step before its update_flat kernel ran, so an
    # out-of-memory error inside the kernel left the count advanced, and the redo's bias correction used
    # step + 2 (the eager and fused optimizers had the same order: fixed in 03d7c82 and 05237f1). Now the
    # count moves only after the kernel ran; on the previous order this test fails at the first assert.
    from tensorarena.stream import optim_state

    p = ta.nn.Parameter(np.ones(4, np.float32))
    p.grad = np.full(4, 0.5, np.float32)
    opt = optim.AdamW([p], lr=0.1)
    kinds = optim_state.state_kinds(opt)
    group = opt.param_groups[0]
    arrays = [{k: np.zeros(4, np.float32) for k in kinds.arrays}]
    scalars = [np.zeros(len(kinds.scalars), np.float64)]
    real = type(opt).update_flat

    def out_of_memory(*args, **kwargs):
        raise MemoryError("simulated OOM in the update kernel")

    monkeypatch.setattr(type(opt), "update_flat", out_of_memory)
    with pytest.raises(MemoryError):
        optim_state.update(kinds, opt, group, [p], arrays, scalars)
    assert scalars[0][0] == 0.0 and np.array_equal(p.data, np.ones(4, np.float32))
    monkeypatch.setattr(type(opt), "update_flat", real)
    optim_state.update(kinds, opt, group, [p], arrays, scalars)
    assert scalars[0][0] == 1.0
    # The first AdamW step (bias correction at step 1) moves each weight by lr (less decay) against the gradient.
    np.testing.assert_allclose(p.data, np.ones(4) * (1 - 0.1 * 0.01) - 0.1, rtol=1e-5)
