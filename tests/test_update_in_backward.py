"""The fused route's update_in_backward: each parameter updated as its gradient completes, no gradient buffer.

Parity with eager for every optimizer is test_fused.py's optimizer test, parametrized over the mode.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import autograd, optim
from tensorarena.compile import compile_step
from tensorarena.compile.step import FusedStep
from tensorarena.memory.budget import MemoryBudget
from tensorarena.nn import Linear
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.route_plan import plan_routes
from tensorarena.train.trainer import Trainer
from tests.test_fused import TOL, _batches, _max_param_diff, _mlp, _mlp_batches, _train, _vit

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vit_updated_in_backward_matches_eager_with_a_schedule(dtype):
    batches = _batches(4, dtype=dtype)
    kw = dict(make_model=lambda: _vit(dtype), make_opt=lambda m: optim.AdamW(m.parameters(), lr=2e-3),
              make_sched=lambda o: optim.lr_scheduler.warmup_cosine(o, warmup_steps=5, total_steps=30),
              batches=batches, steps=30)
    eager, _, er = _train("eager", **kw)
    fused, trainer, fr = _train("fused", update_in_backward=True, **kw)
    assert [r.route for r in fr] == ["fused"] * 30 and trainer.fused.traces == 1
    assert _max_param_diff(eager, fused) <= TOL[dtype]
    np.testing.assert_allclose([r.loss for r in fr], [r.loss for r in er], rtol=TOL[dtype], atol=TOL[dtype])
    assert fr[-1].loss < fr[0].loss


def test_the_trace_updates_nothing_and_the_report_has_no_gradient_buffer():
    x, y = _batches(1)[0]
    flat_model = _vit(dim=64)
    flat = compile_step(flat_model, cross_entropy, optim.AdamW(flat_model.parameters(), lr=1e-2), (x, y),
                        update_in_backward=False)
    model = _vit(dim=64)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.numpy() for n, p in model.named_parameters()}
    fused = compile_step(model, cross_entropy, opt, (x, y))  # the default without clipping
    assert fused.update_in_backward and not flat.update_in_backward
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, before[name])
    assert all(float(s["step"]) == 0 for s in opt.state.values())
    report, flat_report = fused.memory_report(), flat.memory_report()
    assert report["grads"] == 0 and flat_report["grads"] == report["params"]
    # Each gradient lives in the slab only until its parameter's update, which follows at once.
    largest = max(p.data.nbytes for p in model.parameters())
    assert flat_report["slab"] < report["slab"] <= flat_report["slab"] + 2 * largest
    assert report["predicted_peak"] < flat_report["predicted_peak"] - report["params"] + 2 * largest
    assert any("updated as its gradient completes" in call for call in fused.plan.host_calls)
    fused.step(x, y)
    changed = [n for n, p in model.named_parameters() if not np.array_equal(p.data, before[n])]
    assert len(changed) == len(before)


def test_clipping_by_global_norm_cannot_update_in_backward():
    model = _vit()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="clip"):
        FusedStep(model, cross_entropy, opt, clip_grad_norm=1.0, update_in_backward=True)
    with pytest.raises(ValueError, match="clip_grad_norm"):
        Trainer(model, opt, cross_entropy, route="fused", clip_grad_norm=1.0, update_in_backward=True)


def test_a_leaf_gradient_is_delivered_as_soon_as_its_last_use_has_run():
    # y = l3(l2(l1(x))): the depth-first order lists l1's weights last; delivery must not wait for
    # that (with it, every gradient of a deep model would be alive at the end of backward). With
    # delivery at the leaf's place in the order (before this change) the layers came out 1, 1, 2, 2, 3, 3.
    rng = np.random.default_rng(0)
    layers = [Linear(4, 4, rng=rng, dtype=np.float64) for _ in range(3)]
    owner = {id(p): i + 1 for i, layer in enumerate(layers) for p in layer.parameters()}
    delivered = []
    h = ta.tensor(rng.standard_normal((2, 4)), dtype=np.float64)
    for layer in layers:
        h = layer(h)
    autograd.backward(h.sum(), on_leaf_grad=lambda p, g: delivered.append(owner[id(p)]))
    assert delivered == [3, 3, 2, 2, 1, 1]
    assert all(p.grad is None for layer in layers for p in layer.parameters())  # consumed, not accumulated


def test_the_route_planner_counts_a_gradient_in_flight_not_a_gradient_buffer():
    model = _vit(dim=64, depth=4)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _batches(1, batch=16)[0]
    plan = plan_routes(model, opt, cross_entropy, x, y, MemoryBudget(1 << 34, "test"), fused_keeps_grads=False)
    parts = plan.estimates["fused"].parts
    assert "grads" not in parts and parts["gradient in flight"] == max(p.data.nbytes for p in model.parameters())
    real = compile_step(model, cross_entropy, opt, (x, y), update_in_backward=True).plan.memory.slab_bytes
    estimate = parts["activations (slab)"] + parts["gradient in flight"]
    assert -0.03 * real <= estimate - real <= 0.05 * real  # as test_routes' bar for the plain fused estimate


def test_the_default_updates_in_backward_unless_clipping_needs_every_gradient():
    model = _vit()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    assert FusedStep(model, cross_entropy, opt).update_in_backward
    assert not FusedStep(model, cross_entropy, opt, clip_grad_norm=1.0).update_in_backward
    assert not FusedStep(model, cross_entropy, opt, update_in_backward=False).update_in_backward
    x, y = _batches(1)[0]
    for clip, expected in ((None, True), (1.0, False)):
        trainer = Trainer(model, opt, cross_entropy, route="fused", clip_grad_norm=clip)
        assert trainer.update_in_backward is expected
        # The route plan before step 1 counts what the fused step will really hold.
        parts = trainer.plan(x, y, routes=("fused",)).estimates["fused"].parts
        assert ("grads" in parts) is not expected and ("gradient in flight" in parts) is expected
        trainer.step(x, y)
        assert trainer.fused.update_in_backward is expected
        assert all((p.grad is None) is expected for p in model.parameters())


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_a_failure_after_some_updates_is_not_redone_as_an_out_of_memory(monkeypatch, tmp_path, replay):
    model = _mlp(np.float32)
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused",
                      update_in_backward=True, store_dir=tmp_path / "store", fused_replay=replay)
    x, y = _mlp_batches(np.float32)[0]
    trainer.step(x, y)
    calls = []

    def failing_after_one(update):
        def failing(*args):
            calls.append(args)
            if len(calls) == 2:
                raise MemoryError("simulated")
            return update(*args)
        return failing

    if replay == "python":
        monkeypatch.setattr(trainer.fused.flat, "update_param", failing_after_one(trainer.fused.flat.update_param))
    else:  # the captured replay runs each parameter's update as bound on its first step
        prepared = trainer.fused.plan.capture.prepared
        assert len(prepared) == 4
        for key, update in list(prepared.items()):
            prepared[key] = failing_after_one(update)
    with pytest.raises(RuntimeError, match=r"after 1 of 4 parameters were already updated.*partly applied"):
        trainer.step(x, y)
    assert trainer.route_switches == []  # the out-of-memory fallback did not redo (and double) the step
