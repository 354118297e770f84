"""micro_batch: one update from a batch run as smaller forward/backward passes (compile/micro_batches.py).

The reference for a micro-batched step is the same step on the whole batch: for a loss that is a mean over rows,
the rows-weighted sum of the micro-batches' gradients is the whole batch's gradient, so in float64 the two runs
agree to rounding (<= 1e-10 over several AdamW steps), on the eager route, on both fused replays, and against
torch's own accumulation loop ((loss_i * rows_i / rows).backward() for each micro-batch, then one step).
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

_CFG = MLPConfig(in_features=12, hidden=(16, 16), out_features=4)


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
    assert report["predicted_peak"] == report["persistent_total"] + report["slab"]
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
