"""Choosing a route by memory budget, and the out-of-memory fallback to streaming with nothing lost."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import optim
from tensorarena.cli import main
from tensorarena.compile import compile_step
from tensorarena.memory.budget import MemoryBudget
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.route_plan import plan_routes
from tensorarena.train.trainer import Trainer
from tests.test_fused import _batches, _vit

MiB = 1 << 20


def _trainer(route, *, seed=0, dim=32, depth=2, steps=12, **kw):
    model = _vit(seed=seed, dim=dim, depth=depth)
    opt = optim.AdamW(model.parameters(), lr=3e-3)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=3, total_steps=steps)
    return model, Trainer(model, opt, cross_entropy, scheduler=sched, route=route, **kw)


# -- estimates ------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["float32", "bfloat16"])  # bfloat16: the rounded operands are traced too
def test_stage_by_stage_estimates_match_the_real_routes(precision):
    model = _vit(dim=64, depth=4)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _batches(1, batch=16)[0]
    with ta.float32_matmul_precision(precision):
        plan = plan_routes(model, opt, cross_entropy, x, y, MemoryBudget(1 << 34, "test"),
                           routes=("fused", "eager", "streaming"), fused_keeps_grads=True)  # flat gradients
    fused = plan.estimates["fused"].parts
    eager = plan.estimates["eager"].parts
    assert fused["params"] == fused["grads"] == fused["optimizer exp_avg"] == sum(p.data.nbytes for p in model.parameters())
    real_plan = compile_step(model, cross_entropy, opt, (x, y), update_in_backward=False,
                             matmul_precision=precision).plan
    # Stage traces approximate the whole step's liveness: within a few percent, rather over than under.
    real = real_plan.memory.slab_bytes
    assert -0.03 * real <= fused["activations (slab)"] - real <= 0.05 * real
    model2 = _vit(dim=64, depth=4)
    report = Trainer(model2, optim.AdamW(model2.parameters(), lr=1e-3), cross_entropy,
                     matmul_precision=precision).step(x, y)
    # The eager arena reuses dead memory: its high-water is the live peak, as estimated.
    assert abs(report.arena_high_water - eager["activations (arena)"]) <= 0.03 * report.arena_high_water
    assert plan.estimates["streaming"].total < plan.estimates["fused"].total


def test_auto_takes_fused_when_it_fits_and_says_why():
    model, trainer = _trainer("auto", memory_limit="8G")
    reports = [trainer.step(*b) for b in _batches(3)]
    assert {r.route for r in reports} == {"fused"} and trainer.route == "fused"
    assert trainer.route_plan.chosen == "fused" and "fused needs" in trainer.route_plan.reason
    assert trainer.budget.source == "set by the user"


def test_auto_streams_when_fused_does_not_fit(tmp_path):
    x, y = _batches(1, batch=64)[0]
    _, probe = _trainer("auto", dim=64, depth=6, memory_limit="8G")
    plan = probe.plan(x, y)
    fused, stream = plan.estimates["fused"].required, plan.estimates["streaming"].required
    assert fused - stream > 8 * MiB  # a budget between them must tell them apart
    limit = (fused + stream) // 2
    model, trainer = _trainer("auto", dim=64, depth=6, memory_limit=limit, store_dir=tmp_path / "store")
    reports = [trainer.step(x, y) for _ in range(3)]
    assert {r.route for r in reports} == {"streaming"}
    assert "fused would need" in trainer.route_plan.reason
    assert reports[-1].loss < reports[0].loss


def test_a_limit_below_the_streaming_minimum_fails_before_step_1():
    model, trainer = _trainer("auto", memory_limit="1M")
    before = [p.numpy() for p in model.parameters()]
    # Which route is smallest depends on the model: on this tiny ViT fused (806 KiB) is, since the streaming
    # estimate counts its two boundary-gradient buffers (840 KiB).
    with pytest.raises(MemoryError, match=r"nothing fits: the smallest, (fused|streaming), needs .* raise the limit "
                                          r"to at least"):
        trainer.step(*_batches(1)[0])
    assert trainer.step_count == 0
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))


# Regression (failed on 4139106): route="streaming" ignored memory_limit (only eager and fused were checked), so a
# limit the streamed step cannot keep was found out mid-run, if at all.
def test_a_limit_too_small_for_the_streaming_route_asked_for_fails_before_step_1(tmp_path):
    model, trainer = _trainer("streaming", memory_limit="1M", store_dir=tmp_path / "store")
    before = [p.numpy() for p in model.parameters()]
    with pytest.raises(MemoryError, match=r"route 'streaming' does not fit memory_limit: .*Raise memory_limit or "
                                          r"lower the batch size"):
        trainer.step(*_batches(1)[0])
    assert trainer.step_count == 0 and trainer.stream is None  # nothing moved to a store
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))
    roomy = _trainer("streaming", memory_limit="8G", store_dir=tmp_path / "store2")[1]
    assert [roomy.step(*b).route for b in _batches(2)] == ["streaming"] * 2


# -- out-of-memory fallback ---------------------------------------------------------------------------

def _inject_oom(model, trainer, at_step):
    """Make the second block raise ArenaOutOfMemory during step `at_step` (only off the streaming route)."""
    block = model.blocks[1]
    real = block.forward

    def forward(*args, **kw):
        if trainer.step_count + 1 == at_step and trainer.route != "streaming":
            raise ta.ArenaOutOfMemory(64 * MiB, 32 * MiB, 30 * MiB, 0)
        return real(*args, **kw)

    block.forward = forward


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_out_of_memory_moves_to_streaming_once_and_loses_nothing(route, tmp_path, caplog):
    at = int(np.random.default_rng().integers(2, 10))  # a random step: the trajectory must not care
    batches = _batches(4)
    _, straight = _trainer(route)
    expected = [straight.step(*batches[i % 4]).loss for i in range(12)]
    model, trainer = _trainer(route, store_dir=tmp_path / "store")
    _inject_oom(model, trainer, at)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        reports = [trainer.step(*batches[i % 4]) for i in range(12)]
    assert [r.route for r in reports] == [route] * (at - 1) + ["streaming"] * (13 - at), f"fault at step {at}"
    assert [s["step"] for s in trainer.route_switches] == [at]
    assert sum("ran out of memory" in r.message for r in caplog.records) == 1
    np.testing.assert_allclose([r.loss for r in reports], expected, rtol=1e-6, atol=1e-6)
    assert [r.step for r in reports] == list(range(1, 13))


def test_the_same_check_catches_a_fallback_that_loses_the_failed_steps_rng(tmp_path, monkeypatch):
    # Proof the trajectory check can fail: without restoring the RNG of the failed step, dropout
    # draws different masks on the redo and the losses part from the uninterrupted run.
    from tensorarena.compile import step_state as compiled

    def make(route, **kw):
        model = _vit()
        model.blocks[0].attn.dropout = 0.0
        model.pos_drop.p = 0.3
        opt = optim.AdamW(model.parameters(), lr=3e-3)
        return model, Trainer(model, opt, cross_entropy, route=route, **kw)

    batches = _batches(4)
    _, straight = make("eager")
    expected = [straight.step(*batches[i % 4]).loss for i in range(6)]
    monkeypatch.setattr(compiled, "restore_rng", lambda saved: None)
    model, trainer = make("eager", store_dir=tmp_path / "store")
    _inject_oom(model, trainer, 3)
    losses = [trainer.step(*batches[i % 4]).loss for i in range(6)]
    assert not np.allclose(losses, expected, rtol=1e-6, atol=1e-6)


def test_a_second_out_of_memory_on_streaming_names_the_minimum(tmp_path):
    model, trainer = _trainer("eager", store_dir=tmp_path / "store")
    block = model.blocks[0]

    def forward(*args, **kw):
        raise MemoryError("injected")

    block.forward = forward
    with pytest.raises(MemoryError, match=r"streaming route ran out of memory too at step 1.*needs at least"):
        trainer.step(*_batches(1)[0])
    assert len(trainer.route_switches) == 1


def test_out_of_memory_without_stages_is_re_raised_clearly():
    model = MLP(MLPConfig(in_features=12, hidden=(16,), out_features=4), rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy)
    before = [p.numpy() for p in model.parameters()]

    def forward(*args, **kw):
        raise ta.ArenaOutOfMemory(8 * MiB, 4 * MiB, 4 * MiB, 0)

    model.forward = forward
    with pytest.raises(MemoryError, match="stream_stages"):
        trainer.step(np.zeros((4, 12), np.float32), np.zeros(4, np.int64))
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))


# -- the command line -----------------------------------------------------------------------------------

def test_plan_command_prints_the_table_the_choice_and_why(capsys):
    main(["plan", "--model", "vit-tiny", "--batch", "2", "--image-size", "32", "--memory-limit", "4G"])
    out = capsys.readouterr().out
    assert "memory budget 4.00 GiB (set by the user)" in out
    for word in ("fused", "eager", "streaming", "activations (slab)", "stream buffers", "fits"):
        assert word in out
    assert "chosen by route=auto: fused" in out or "chosen: fused" in out
    with pytest.raises(SystemExit) as exc:  # nothing fits: status 1, as train's
        main(["plan", "--model", "vit-tiny", "--batch", "2", "--image-size", "32", "--memory-limit", "100M"])
    assert exc.value.code == 1 and "NO" in capsys.readouterr().out


def test_plan_command_estimates_the_fused_gradients_as_train_would_hold_them(capsys):
    # `tensorarena train` clips by default (--clip 1.0): flat gradients; --clip 0 updates inside backward.
    args = ["plan", "--model", "vit-tiny", "--batch", "2", "--image-size", "32", "--memory-limit", "4G", "--json"]
    fused = {}
    for clip in ("1.0", "0"):
        main(args + ["--clip", clip])
        fused[clip] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["estimates"]["fused"]
    assert "grads" in fused["1.0"]["parts"] and "gradient in flight" not in fused["1.0"]["parts"]
    assert "grads" not in fused["0"]["parts"] and "parameters updated inside backward" in fused["0"]["note"]
    assert fused["0"]["total"] < fused["1.0"]["total"] - fused["1.0"]["parts"]["grads"] / 2


def test_plan_command_plans_simcse_as_its_train_job_does(capsys):
    # `tensorarena plan` knew only mlp and vit; `tensorarena train --model simcse` plans with route=auto too.
    from tensorarena.text import locate_minilm

    try:
        locate_minilm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    main(["plan", "--model", "simcse", "--batch", "2", "--seq-len", "8", "--memory-limit", "4G", "--json"])
    out = capsys.readouterr().out
    assert out.startswith("simcse, batch 2 x 8 tokens, adamw, 22,565,376 parameters")
    estimates = json.loads(out.strip().splitlines()[-1])
    # SimCSE streams with its attention mask since 7edf13a/66c7d51: all three routes are estimated, the mask's bytes
    # as their own part (it was {"fused", "eager"}: no stream_stages() then)
    assert estimates["chosen"] == "fused" and set(estimates["estimates"]) == {"fused", "eager", "streaming"}
    assert estimates["estimates"]["fused"]["parts"]["activations (slab)"] > 0
    assert estimates["estimates"]["streaming"]["parts"]["side inputs (attention mask)"] > 0
    with pytest.raises(SystemExit, match="simcse needs --batch >= 2"):
        main(["plan", "--model", "simcse", "--batch", "1"])


# -- stores ---------------------------------------------------------------------------------------------

def test_an_unwritable_store_dir_fails_before_step_1(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match=r"store_dir .*a-file/store cannot be used for the streaming store"):
        _trainer("streaming", store_dir=blocker / "store")


def test_a_streaming_run_resumes_from_its_store_in_a_new_trainer(tmp_path):
    batches = _batches(4)
    _, straight = _trainer("streaming", store_dir=tmp_path / "straight")
    expected = [straight.step(*batches[i % 4]).loss for i in range(10)]
    straight.stream.close()
    _, first = _trainer("streaming", store_dir=tmp_path / "run")
    losses = [first.step(*batches[i % 4]).loss for i in range(5)]
    first.stream.close()  # as if the process ended here
    _, second = _trainer("streaming", seed=123, store_dir=tmp_path / "run")  # other init: the store must win
    losses += [second.step(*batches[i % 4]).loss for i in range(5, 10)]
    assert second.step_count == 10
    np.testing.assert_allclose(losses, expected, rtol=1e-6, atol=1e-7)


def test_a_store_of_another_model_is_refused_not_mixed(tmp_path):
    from tensorarena.stream.store import StoreError

    _, first = _trainer("streaming", store_dir=tmp_path / "run")
    first.step(*_batches(1)[0])
    first.stream.close()
    model, other = _trainer("streaming", dim=48, store_dir=tmp_path / "run")
    before = [p.numpy() for p in model.parameters()]
    with pytest.raises(StoreError, match="different model"):
        other.step(*_batches(1)[0])
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))


def test_stream_io_reaches_the_store_and_both_modes_train_alike(tmp_path):
    batches = _batches(3)
    losses = {}
    for io in ("map", "copy"):
        _, trainer = _trainer("streaming", store_dir=tmp_path / io, stream_io=io)
        losses[io] = [trainer.step(*batches[i % 3]).loss for i in range(4)]
        assert trainer.stream.store.io == io
        trainer.stream.close()
    np.testing.assert_allclose(losses["copy"], losses["map"], rtol=1e-6, atol=1e-7)


def test_a_bad_stream_io_is_refused_before_step_1():
    with pytest.raises(ValueError, match=r"stream_io must be one of \('map', 'copy'\), got 'mmap'"):
        _trainer("streaming", stream_io="mmap")
