"""micro_batch: one update from a batch run as smaller forward/backward passes (compile/micro_batches.py).

The reference for a micro-batched step is the same step on the whole batch: for a loss that is a mean over rows,
the rows-weighted sum of the micro-batches' gradients is the whole batch's gradient, so in float64 the two runs
agree to rounding (<= 1e-10 over several AdamW steps), on the eager route, on both fused replays, and against
torch's own accumulation loop ((loss_i * rows_i / rows).backward() for each micro-batch, then one step).

These checks can fail: with GradAccumulator.add summing the gradients unweighted (its np.multiply left out), the
fused parity tests and the fused torch comparison fail (5 of the 6 selected by
`python -m pytest tests/test_micro_batches.py -k "fused_micro_batches_train_as_the_whole or torch"`).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import kernels, optim
from tensorarena.compile.micro_batches import check_micro_batch, split_batch
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.tensor import Tensor

from test_fused import _batches as _images, _traced_peak, _vit

_CFG = MLPConfig(in_features=12, hidden=(16,), out_features=4)


def _mlp(dtype=np.float64):
    return MLP(_CFG, rng=np.random.default_rng(0)).to(dtype)


def _rows(n, batch=10, dtype=np.float64, seed=2):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 12)).astype(dtype), rng.integers(0, 4, batch)) for _ in range(n)]


def _fused_run(micro_batch, batches, replay="auto", **kw):
    model = _mlp()
    fused = ta.compile_step(model, cross_entropy, optim.AdamW(model.parameters(), lr=1e-2), batches[0],
                            micro_batch=micro_batch, replay=replay, **kw)
    losses = [fused.step(x, y, index=i + 1)[0] for i, (x, y) in enumerate(batches)]
    return np.array(losses), [p.data.copy() for p in model.parameters()], fused


# -- cutting the batch ------------------------------------------------------------------------------------------
def test_a_batch_is_cut_into_views_weighted_by_their_rows():
    x = np.arange(20.0).reshape(10, 2)
    y = {"labels": np.arange(10), "scale": 2.0, "pair": (np.arange(10) * 2, Tensor(np.ones(10)))}
    chunks = split_batch(x, y, 4)
    assert [c[0].shape[0] for c in chunks] == [4, 4, 2]
    assert [c[2] for c in chunks] == [0.4, 0.4, 0.2]
    assert all(np.shares_memory(c[0], x) for c in chunks)  # views: nothing copied
    np.testing.assert_array_equal(chunks[2][1]["labels"], [8, 9])
    np.testing.assert_array_equal(chunks[1][1]["pair"][0], [8, 10, 12, 14])
    assert chunks[1][1]["pair"][1].shape == (4,) and chunks[2][1]["scale"] == 2.0


def test_a_batch_within_the_micro_batch_is_passed_as_it_is():
    x, y = np.zeros((4, 3)), np.zeros(4)
    assert split_batch(x, y, 4) == [(x, y, 1.0)]
    assert split_batch(x, y, None) == [(x, y, 1.0)]


def test_targets_of_other_rows_are_refused_with_both_shapes():
    with pytest.raises(ValueError, match=r"targets\['w'\] has shape \(3,\) while the inputs have 10 rows"):
        split_batch(np.zeros((10, 2)), {"y": np.zeros(10), "w": np.zeros(3)}, 4)


def test_inputs_that_are_no_array_are_refused_naming_their_type():
    with pytest.raises(ValueError, match="the inputs are a dict: pass them as one array or Tensor"):
        split_batch({"ids": np.zeros((8, 3))}, np.zeros(8), 4)
    with pytest.raises(ValueError, match="the inputs are a float"):
        split_batch(3.0, None, 4)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "4"])
def test_micro_batch_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="micro_batch must be a positive number of rows"):
        check_micro_batch(bad)


# -- the fused route -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("replay", ["python", "captured"])
@pytest.mark.parametrize("micro_batch", [3, 5])
def test_fused_micro_batches_train_as_the_whole_batch(replay, micro_batch):
    batches = _rows(5)
    whole_losses, whole_params, _ = _fused_run(None, batches, replay=replay)
    before = kernels.calls[("fused_replay", replay)]
    losses, params, fused = _fused_run(micro_batch, batches, replay=replay)
    # Every micro-batch ran on the replay asked for (10 rows: 3+3+3+1 or 5+5); none fell back.
    assert kernels.calls[("fused_replay", replay)] - before == 5 * -(-10 // micro_batch)
    assert not fused.update_in_backward
    np.testing.assert_allclose(losses, whole_losses, rtol=0, atol=1e-12)
    for p, q in zip(params, whole_params):
        np.testing.assert_allclose(p, q, rtol=0, atol=1e-10)


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_a_fused_vit_in_micro_batches_trains_as_the_whole_batch(replay):
    # Shared parameters and sums over tokens (the class token, position embedding, LayerNorm): every gradient
    # the recorded backward writes must overwrite the scaled one the accumulator left in the flat buffer.
    runs = []
    for micro_batch in (None, 3):  # 8 images: 3 + 3 + 2
        model = _vit(dtype=np.float64)
        fused = ta.compile_step(model, cross_entropy, optim.AdamW(model.parameters(), lr=1e-2),
                                _images(1, dtype=np.float64)[0], micro_batch=micro_batch, replay=replay)
        losses = [fused.step(x, y, index=i + 1)[0] for i, (x, y) in enumerate(_images(4, dtype=np.float64))]
        runs.append((losses, [p.data.copy() for p in model.parameters()]))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=0, atol=1e-12)
    for p, q in zip(runs[1][1], runs[0][1]):
        np.testing.assert_allclose(p, q, rtol=0, atol=1e-10)


def test_fused_micro_batches_with_clipping_and_a_schedule_match_the_whole_batch():
    batches = _rows(4)
    runs = []
    for micro_batch in (None, 4):
        model = _mlp()
        opt = optim.AdamW(model.parameters(), lr=5e-2)
        fused = ta.compile_step(model, cross_entropy, opt, batches[0], micro_batch=micro_batch, clip_grad_norm=0.1,
                                scheduler=optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=8))
        norms = [fused.step(x, y, index=i + 1)[1] for i, (x, y) in enumerate(batches)]
        runs.append((norms, [p.data.copy() for p in model.parameters()]))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-12)  # the norm clipped is the whole batch's
    for p, q in zip(runs[1][1], runs[0][1]):
        np.testing.assert_allclose(p, q, rtol=0, atol=1e-10)


def test_the_accumulator_is_in_the_memory_report_and_the_slab_is_a_micro_batch_s():
    batches = _rows(1, batch=64)
    *_, whole = _fused_run(None, batches)
    *_, micro = _fused_run(8, batches)
    report = micro.memory_report()
    assert report["grad_accumulator"] == report["grads"] > 0
    assert report["predicted_peak"] == report["persistent_total"] + report["slab"] + report["libraries_measured"]
    assert micro.plan.signature[0][0][0] == 8  # traced at the micro-batch's rows
    assert report["slab"] < whole.memory_report()["slab"] / 4


def test_a_micro_batched_step_allocates_no_array_memory():
    # As test_fused's check: the traced peak does not grow with the number of micro-batches (batch 8 is one
    # micro-batch, batch 64 eight of them) while each runs on the same plan.
    model = _vit()
    fused = ta.compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=1e-3), _images(1)[0],
                            micro_batch=8, replay="captured")
    small, _ = _traced_peak(fused, *_images(1, batch=8)[0])
    big, arena = _traced_peak(fused, *_images(1, batch=64)[0])
    assert fused.plan.capture.tape is not None and arena.cursor == len(fused.plan.capture.tape.allocations)
    assert abs(big - small) < 32 * 1024, f"array memory outside the plan: {small} B for 1 micro-batch, {big} B for 8"


def test_update_in_backward_cannot_wait_for_micro_batches():
    model = _mlp()
    with pytest.raises(ValueError, match="update_in_backward=True cannot be combined with micro_batch=4"):
        ta.compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=0.1), _rows(1)[0], micro_batch=4,
                        update_in_backward=True)


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_non_finite_micro_batch_updates_nothing(on_nonfinite):
    from tensorarena.train.report import NonFiniteLossError

    (x, y), = _rows(1)
    model = _mlp()
    fused = ta.compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=0.1), (x, y), micro_batch=4)
    fused.step(x, y, index=1)
    before = [p.data.copy() for p in model.parameters()]
    bad = x.copy()
    bad[5] = np.inf  # the second micro-batch: the first one's gradient is summed already
    if on_nonfinite == "raise":
        with pytest.raises(NonFiniteLossError, match="not updated"):
            fused.step(bad, y, index=2, on_nonfinite=on_nonfinite)
    else:
        assert fused.step(bad, y, index=2, on_nonfinite=on_nonfinite)[2]  # skipped
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
        assert p.grad is None  # no partial sum left to pass for a gradient
    loss, _, skipped, _ = fused.step(x, y, index=3)  # and the next step trains
    assert not skipped and np.isfinite(loss)


# -- the Trainer -----------------------------------------------------------------------------------------------
def _trainer(route, micro_batch, **kw):
    from tensorarena.train import Trainer

    model = _mlp()
    opt = optim.AdamW(model.parameters(), lr=5e-2, weight_decay=1e-2)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=8)
    return model, Trainer(model, opt, cross_entropy, route=route, micro_batch=micro_batch, scheduler=sched,
                          clip_grad_norm=0.5, **kw)


def _torch_accumulated(batches, micro_batch):
    """torch's gradient-accumulation loop on the same MLP and data: (loss_i * rows_i / rows).backward() for each
    micro-batch, then clipping, AdamW and the schedule once per batch. Returns (losses, parameters)."""
    import torch

    model = _mlp()
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    net.load_state_dict({k[len("net."):]: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    opt = torch.optim.AdamW(net.parameters(), lr=5e-2, weight_decay=1e-2)
    ours = optim.lr_scheduler.warmup_cosine(optim.SGD(_mlp().parameters(), lr=5e-2), warmup_steps=2, total_steps=8)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        total = 0.0
        for start in range(0, len(x), micro_batch):
            xs, ys = torch.from_numpy(x[start:start + micro_batch]), torch.from_numpy(y[start:start + micro_batch])
            loss = torch.nn.functional.cross_entropy(net(xs), ys) * (len(xs) / len(x))
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        for group in opt.param_groups:  # our warmup-cosine's value for this step (tests/test_optim checks those)
            group["lr"] = ours.optimizer.param_groups[0]["lr"]
        opt.step()
        ours.step()
        losses.append(total)
    return np.array(losses), [p.detach().numpy().copy() for p in net.parameters()]


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_trainer_micro_batches_match_torch_s_accumulation_loop(route):
    batches = _rows(4)
    model, trainer = _trainer(route, 3)
    reports = [trainer.step(x, y) for x, y in batches]
    assert {r.route for r in reports} == {route}
    torch_losses, torch_params = _torch_accumulated(batches, 3)
    np.testing.assert_allclose([r.loss for r in reports], torch_losses, rtol=0, atol=1e-12)
    for p, q in zip(model.parameters(), torch_params):
        np.testing.assert_allclose(p.data, q, rtol=0, atol=1e-10)


def test_eager_micro_batches_train_as_the_whole_batch_in_a_smaller_arena():
    batches = _rows(4, batch=64)
    whole_model, whole = _trainer("eager", None)
    micro_model, micro = _trainer("eager", 16)
    for x, y in batches:
        a, b = whole.step(x, y), micro.step(x, y)
        assert abs(a.loss - b.loss) <= 1e-12 and abs(a.grad_norm - b.grad_norm) <= 1e-12 * a.grad_norm
        assert b.arena_high_water < a.arena_high_water / 2  # one micro-batch's activations at a time
    for p, q in zip(micro_model.parameters(), whole_model.parameters()):
        np.testing.assert_allclose(p.data, q.data, rtol=0, atol=1e-10)


def test_route_auto_plans_a_micro_batch_and_the_accumulator():
    from tensorarena.train import Trainer

    model = _vit()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _images(1, batch=16)[0]
    trainer = Trainer(model, opt, cross_entropy, route="auto", micro_batch=4, memory_limit="16G")
    plan = trainer.plan(x, y)
    assert "at batch 4" in plan.activation_source
    fused = plan.estimates["fused"].parts
    assert fused["grad accumulator"] == fused["grads"] == sum(p.data.nbytes for p in model.parameters())
    assert "streaming" in plan.estimates and not plan.unavailable  # tests/test_stream_micro_batches.py: its parts
    report = trainer.step(x, y)
    assert report.route == trainer.route == "fused"
    memory = trainer.fused.memory_report()
    assert memory["grad_accumulator"] == fused["grad accumulator"]
    assert memory["inputs"] == fused["inputs"]  # the plan holds a micro-batch: 4 images and their labels
    # The route plan's whole-step estimate is the fused plan's slab (tests/test_memory_reports.py's bar).
    assert 0.97 <= fused["activations (slab)"] / memory["slab"] <= 1.05


# Regression (failed while this was written): Trainer.compile traced the whole batch before step 1, so a 10-row batch
# in micro-batches of 4 kept three plans (10, 4 and 2 rows), the largest the very slab micro-batches avoid. Now it
# traces the first micro-batch: two plans.
def test_the_fused_report_counts_every_array_micro_batched_training_holds():
    model, trainer = _trainer("fused", 4)
    x, y = _rows(1, batch=10)[0]  # 4 + 4 + 2 rows: two plans
    trainer.step(x, y)
    fused = trainer.fused
    assert len(fused.plans) == 2
    state = sum(v.nbytes for s in trainer.optimizer.state.values() for v in s.values() if isinstance(v, np.ndarray))
    layout = sum(p.data.nbytes for p in model.parameters()) + state
    layout += sum(g.grad.nbytes for g in fused.flat.groups) + fused.accumulator.nbytes
    plans = sum(p.slab.nbytes + p.inputs.nbytes + sum(b.nbytes for b in p.target_buffers) for p in fused.plans.values())
    report = fused.memory_report()
    assert report["predicted_peak"] - report["libraries_measured"] == layout + plans


def test_update_in_backward_refuses_micro_batches():
    from tensorarena.train import Trainer

    model = _mlp()
    with pytest.raises(ValueError, match="update_in_backward=True cannot be combined with micro_batch=2"):
        Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused", micro_batch=2,
                update_in_backward=True)
    with pytest.raises(ValueError, match="micro_batch must be a positive number of rows"):
        Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, micro_batch=0)


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_an_eager_non_finite_micro_batch_updates_nothing(on_nonfinite):
    from tensorarena.train.report import NonFiniteLossError

    model, trainer = _trainer("eager", 4, on_nonfinite=on_nonfinite)
    (x, y), = _rows(1)
    trainer.step(x, y)
    before = [p.data.copy() for p in model.parameters()]
    bad = x.copy()
    bad[9] = np.nan  # the last micro-batch: two gradients are summed in .grad already
    if on_nonfinite == "raise":
        with pytest.raises(NonFiniteLossError, match=r"micro-batch 3 of 3\); the parameters were not updated"):
            trainer.step(bad, y)
        assert trainer.step_count == 1
    else:
        assert trainer.step(bad, y).skipped
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
        assert p.grad is None


def test_evaluation_defaults_to_micro_batches_and_stays_in_the_slab(caplog):
    import logging

    from tensorarena.train import Trainer

    model = _vit()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=1e-3), cross_entropy, route="fused", micro_batch=4)
    x, y = _images(1, batch=16)[0]
    trainer.step(x, y)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        default = trainer.evaluate(x, y)  # 4 rows at a time: the slab is a 4-image step's
        assert "beyond the fused slab" not in caplog.text
        whole = trainer.evaluate(x, y, batch_size=16)  # the training batch's rows do not fit it
        assert "beyond the fused slab" in caplog.text
    assert abs(default["loss"] - whole["loss"]) < 1e-6 and default["accuracy"] == whole["accuracy"]


# -- the command line --------------------------------------------------------------------------------------------
def test_train_with_micro_batches_runs_fused_and_plans_the_micro_batch(tmp_path):
    import json

    from tensorarena import cli

    out = tmp_path / "summary.json"
    assert cli.main(["train", "--model", "vit-tiny", "--steps", "3", "--batch-size", "16", "--micro-batch", "4",
                     "--test-size", "32", "--memory-limit", "16G", "--no-progress", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["route"] == "fused" and summary["micro_batch"] == 4
    parts = summary["route_plan_estimates"]["fused"]["parts"]
    assert parts["grad accumulator"] == parts["grads"] > 0
    assert summary["route_plan_estimates"]["streaming"]["parts"]["boundary activations"] > 0
    assert summary["final_loss"] < summary["first_loss"]


@pytest.mark.parametrize("command", ["train", "plan"])
def test_simcse_refuses_micro_batches_naming_its_in_batch_negatives(command, capsys):
    from tensorarena import cli

    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--model", "simcse", "--micro-batch", "2", "--steps", "1"])
    assert "micro-batch is not supported for simcse" in str(exc.value.code) and "negative" in str(exc.value.code)


# Before the streaming route ran micro-batches, such a step was re-raised instead ("not moved to the streaming route").
@pytest.mark.parametrize("route", ["eager", "fused"])
def test_an_out_of_memory_micro_batch_moves_to_streaming_and_is_redone_there(route, tmp_path):
    from tensorarena.train import Trainer

    model, reference = _vit(np.float64), _vit(np.float64)
    # The Python replay: it runs the forward set below on every micro-batch (a captured one would not call it).
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route=route, micro_batch=4,
                      store_dir=tmp_path / "store", fused_replay="python")
    eager = Trainer(reference, optim.AdamW(reference.parameters(), lr=1e-3), cross_entropy, route="eager")
    batches = _images(3, batch=10, dtype=np.float64)
    trainer.step(*batches[0])
    eager.step(*batches[0])
    if route == "fused":
        for total in trainer.fused.accumulator.sums:
            total.fill(0)  # (step 1's sum is left in it; a fresh one shows when step 2 has summed a micro-batch)

    def partial_sum():  # whether a micro-batch's gradient is summed already: then fail the next one
        if route == "eager":
            return any(p.grad is not None for p in model.parameters())
        return any(total.any() for total in trainer.fused.accumulator.sums)

    block, real = model.blocks[1], model.blocks[1].forward
    failed = []

    def forward(*args, **kw):
        if trainer.step_count == 1 and trainer.route == route and partial_sum():
            failed.append(trainer.step_count + 1)
            raise ta.ArenaOutOfMemory(64 << 20, 32 << 20, 30 << 20, 0)
        return real(*args, **kw)

    block.forward = forward
    for x, y in batches[1:]:
        report = trainer.step(x, y)
        eager.step(x, y)
    assert failed == [2] and trainer.route_switches[0]["from"] == route
    assert report.route == trainer.route == "streaming" and trainer.step_count == 3
    assert trainer.stream.micro_batch == 4
    trainer.stream.to_memory()
    for p, q in zip(model.parameters(), reference.parameters()):  # the redone step summed every micro-batch
        np.testing.assert_allclose(p.data, q.data, rtol=0, atol=1e-10)


def _weighted_rows(out, targets):  # a per-row weighted mean: still a mean over rows, so micro-batches are exact
    from tensorarena.tensor import Tensor as T

    labels, weights = targets["labels"], targets["pair"][0]
    return (cross_entropy(out, labels, reduction="none") * T(weights)).mean() * targets["pair"][1]


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_structured_targets_are_cut_with_the_batch(route):
    from tensorarena.train import Trainer

    rng = np.random.default_rng(7)
    batches = [(x, {"labels": y, "pair": (rng.uniform(0.5, 1.5, len(y)), 2.0)}) for x, y in _rows(3)]
    runs = []
    for micro_batch in (None, 3):
        model = _mlp()
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), _weighted_rows, route=route,
                          micro_batch=micro_batch, fused_replay="captured")
        losses = [trainer.step(x, y).loss for x, y in batches]
        runs.append((losses, [p.data.copy() for p in model.parameters()]))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=0, atol=1e-12)
    for p, q in zip(runs[1][1], runs[0][1]):
        np.testing.assert_allclose(p, q, rtol=0, atol=1e-10)
