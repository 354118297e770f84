"""The batches a data loader really hands over, on the fused Trainer (both replays) against the eager route.

15 of these 86 tests failed on d412136, before the fixes (all under a "Regression" comment). With this file copied
into a worktree of d412136 (git worktree add /tmp/old d412136), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_fused_batches.py`.

A last smaller batch and back, batch size 1, inputs of another dtype, non-contiguous / read-only / memory-mapped
arrays, one array object reused and overwritten by the loader, reports kept across steps, empty and broken
batches, targets that are not one array (tuples and dicts of arrays and numbers, for a loss_fn taking more than
(output, labels)) and SimCSE's targets=None.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.data.loader import BatchLoader
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.tensor import Tensor
from tensorarena.train.report import NonFiniteLossError
from tensorarena.train.trainer import Trainer
from mlp_cases import labelled_rows as _rows, small_mlp as _mlp

REPLAYS = ("python", "captured")
RTOL, ATOL = 1e-5, 1e-6  # float32, eager against fused


def _vit(seed=0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, num_heads=4, dropout=0.0,
                    attention_dropout=0.0)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _trainer(route, replay="python", *, model=None, loss_fn=cross_entropy, **kw):
    model = model if model is not None else _mlp()
    return Trainer(model, optim.Adam(model.parameters(), lr=1e-2), loss_fn, route=route, fused_replay=replay, **kw)



def _images(n, batch=4, seed=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, batch))
            for _ in range(n)]


def _params(trainer):
    return [p.data.copy() for p in trainer.model.parameters()]


def _assert_params_close(a, b, **tol):
    assert len(a) == len(b)
    for p, q in zip(a, b):
        np.testing.assert_allclose(p, q, **(tol or dict(rtol=RTOL, atol=ATOL)))


def _eager(batches, **kw):
    tr = _trainer("eager", **kw)
    return tr, [tr.step(*b).loss for b in batches]


def _calls():
    return kernels.calls[("fused_replay", "captured")], kernels.calls[("fused_replay", "python")]


def _assert_captured(trainer):
    for plan in trainer.fused.plans.values():
        assert plan.capture is not None and plan.capture.tape is not None, plan.capture and plan.capture.note


# -- the last, smaller batch and back -------------------------------------------------------------------------

@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("clip", [None, 0.5], ids=["update_in_backward", "flat_grads_clipped"])
def test_a_last_smaller_batch_retraces_once_and_the_full_plan_is_reused(replay, clip):
    full, last = _rows(6), _rows(2, batch=5, seed=7)
    batches = full[:3] + last[:1] + full[3:] + last[1:] + full[:1]  # 16 16 16 5 16 16 16 5 16
    _, want = _eager(batches, clip_grad_norm=clip)
    tr = _trainer("fused", replay, clip_grad_norm=clip)
    got = [tr.step(*b).loss for b in batches[:3]]
    first_plan = tr.fused.plan
    first_capture = first_plan.capture
    got += [tr.step(*b).loss for b in batches[3:]]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert tr.fused.traces == 2 and len(tr.fused.plans) == 2  # no retrace on the way back, nor at the 2nd 5-row batch
    assert any(p is first_plan for p in tr.fused.plans.values())
    assert first_plan.capture is first_capture  # the full-size plan's recording is reused, not made again
    assert tr.step_count == len(batches)
    if replay == "captured":
        _assert_captured(tr)


def test_both_replays_agree_bit_for_bit_across_batch_sizes():
    full, last = _rows(4), _rows(2, batch=5, seed=7)
    batches = full[:2] + last[:1] + full[2:] + last[1:] + full[:1]
    runs = {}
    for replay in REPLAYS:
        tr = _trainer("fused", replay)
        runs[replay] = (tr, [tr.step(*b).loss for b in batches])
    (pt, pl), (ct, cl) = runs["python"], runs["captured"]
    assert pl == cl
    for p, q in zip(_params(pt), _params(ct)):
        np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("replay", REPLAYS)
def test_alternating_sizes_with_one_plan_slot_retrace_every_change_and_match_eager(replay):
    full, last = _rows(3), _rows(3, batch=5, seed=7)
    batches = [b for pair in zip(full, last) for b in pair]  # 16 5 16 5 16 5
    _, want = _eager(batches)
    tr = _trainer("fused", replay, max_plans=1)
    got = [tr.step(*b).loss for b in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert tr.fused.traces == len(batches) and len(tr.fused.plans) == 1


@pytest.mark.parametrize("replay", REPLAYS)
def test_vit_last_batch_of_one_image_and_back(replay):
    full, last = _images(4), _images(1, batch=1, seed=4)
    batches = full[:2] + last + full[2:] + full[:1]
    eager = _trainer("eager", model=_vit())
    want = [eager.step(*b).loss for b in batches]
    tr = _trainer("fused", replay, model=_vit())
    got = [tr.step(*b).loss for b in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(tr), _params(eager))
    assert tr.fused.traces == 2
    if replay == "captured":
        _assert_captured(tr)


@pytest.mark.parametrize("replay", REPLAYS)
def test_batch_size_one(replay):
    batches = _rows(4, batch=1)
    eager, want = _eager(batches)
    tr = _trainer("fused", replay)
    before = _calls()
    got = [tr.step(*b).loss for b in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(tr), _params(eager))
    if replay == "captured":
        _assert_captured(tr)
        assert _calls()[0] - before[0] == len(batches)


# -- dtypes ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("label_dtype", [np.int32, np.uint8, np.int16])
def test_labels_of_another_integer_dtype_train_as_int64(replay, label_dtype):
    batches = _rows(3)
    _, want = _eager(batches)
    tr = _trainer("fused", replay)
    got = [tr.step(x, y.astype(label_dtype)).loss for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    if replay == "captured":
        _assert_captured(tr)


@pytest.mark.parametrize("replay", REPLAYS)
def test_int32_and_int64_labels_in_one_run_give_two_plans_and_eager_losses(replay):
    batches = _rows(4)
    _, want = _eager(batches)
    tr = _trainer("fused", replay)
    got = [tr.step(x, y.astype(np.int32 if i % 2 else np.int64)).loss for i, (x, y) in enumerate(batches)]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert tr.fused.traces == 2


@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("dtype", [np.float64, np.uint8, np.int64])
@pytest.mark.parametrize("make", [_mlp, _vit], ids=["mlp", "vit"])
def test_inputs_of_a_dtype_the_model_does_not_take_fail_as_on_eager_and_lose_nothing(replay, dtype, make):
    batches = _rows(3) if make is _mlp else _images(3)
    bad = ((np.abs(batches[1][0]) * 40).astype(dtype), batches[1][1])
    eager, fused = _trainer("eager", model=make()), _trainer("fused", replay, model=make())
    for tr in (eager, fused):
        tr.step(*batches[0])
    saved = _params(fused)
    with pytest.raises(TypeError) as eager_err:
        eager.step(*bad)
    with pytest.raises(TypeError) as fused_err:
        fused.step(*bad)
    assert str(fused_err.value) == str(eager_err.value) and "x.astype(np.float32)" in str(fused_err.value)
    assert fused.step_count == 1
    for p, q in zip(_params(fused), saved):
        np.testing.assert_array_equal(p, q)  # nothing trained lost, nothing half-applied
    want = [eager.step(*b).loss for b in batches[1:]]
    got = [fused.step(*b).loss for b in batches[1:]]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(fused), _params(eager))


@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("dtype", ["float16", ">f4"], ids=["float16", "big-endian-float32"])
def test_float_inputs_the_tensor_converts_train_as_on_eager(replay, dtype):
    # Tensor(x) turns float16 and byte-swapped float32 into native float32 (tensor.py), on both routes.
    batches = [(x.astype(dtype), y) for x, y in _rows(4)]
    eager, want = _eager(batches)
    tr = _trainer("fused", replay)
    got = [tr.step(*b).loss for b in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(tr), _params(eager))


# Regression (failed on d412136): float16 (or byte-swapped float32) inputs lost the captured replay, with a false
# reason. The plan kept the batch in its own dtype, so every replay's Tensor(plan.inputs) made a float32 copy on
# the heap, outside the slab and memory_report()["inputs"], and the capture refused: "a recorded call reads an
# array made outside the plan's buffers ((16, 12) float32), e.g. a mask computed with NumPy from the batch". Now
# the plan's input buffer has the dtype the model reads (Tensor's rules, compile/step.py input_array) and the
# captured replay is used.
@pytest.mark.parametrize("dtype", ["float16", ">f4"], ids=["float16", "big-endian-float32"])
def test_float16_inputs_keep_the_captured_replay(dtype):
    batches = [(x.astype(dtype), y) for x, y in _rows(3)]
    tr = _trainer("fused", "captured")
    for b in batches:
        tr.step(*b)
    _assert_captured(tr)


# Regression (failed on d412136): a batch given as Python lists trained on eager (Tensor(list of floats) is
# float32, as in torch) but failed the fused trace with "linear: the input is float64 but the weight is float32":
# the plan turned the lists into float64 arrays with np.asarray / np.array. Now the fused route reads the inputs
# by Tensor's rules (input_array) and trains as eager.
@pytest.mark.parametrize("replay", REPLAYS)
def test_a_batch_given_as_python_lists_trains_as_on_eager(replay):
    batches = [(x.tolist(), y.tolist()) for x, y in _rows(3)]
    _, want = _eager(batches)
    tr = _trainer("fused", replay)
    got = [tr.step(*b).loss for b in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("replay", REPLAYS)
def test_tensor_inputs_and_targets(replay):
    batches = _rows(3)
    _, want = _eager(batches)
    tr = _trainer("fused", replay)
    got = [tr.step(Tensor(x), Tensor(y)).loss for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# -- memory layouts -------------------------------------------------------------------------------------------

def _transposed(a):
    return np.ascontiguousarray(a.T).T  # same values, a transposed (F-ordered) view


def _strided(a):
    return np.repeat(a, 2, axis=0)[::2]  # same values, every second row of a bigger array


def _read_only(a):
    a = a.copy()
    a.setflags(write=False)
    return a


def _memmap_factory(tmp_path):
    count = [0]

    def memmap(a):
        path = tmp_path / f"batch{count[0]}.bin"
        count[0] += 1
        w = np.memmap(path, dtype=a.dtype, mode="w+", shape=a.shape)
        w[...] = a
        w.flush()
        del w
        return np.memmap(path, dtype=a.dtype, mode="r", shape=a.shape)  # read-only, as a data set on disk opens
    return memmap


LAYOUTS = {"transposed": _transposed, "strided": _strided, "fortran": np.asfortranarray, "read_only": _read_only,
           "memmap": None}


@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_inputs_in_any_memory_layout(replay, layout, tmp_path):
    make = LAYOUTS[layout] or _memmap_factory(tmp_path)
    batches = _rows(4)
    eager, want = _eager(batches)
    tr = _trainer("fused", replay)
    given = [(make(x), make(y) if layout in ("read_only", "memmap", "strided") else y) for x, y in batches]
    for (x, _), (gx, _) in zip(batches, given):
        np.testing.assert_array_equal(gx, x)
    assert layout in ("read_only", "memmap") or not given[0][0].flags.c_contiguous
    got = [tr.step(*b).loss for b in given]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(tr), _params(eager))
    assert tr.fused.traces == 1
    if replay == "captured":
        _assert_captured(tr)


@pytest.mark.parametrize("replay", REPLAYS)
def test_vit_images_as_a_channels_last_view(replay):
    # An NHWC loader's batch handed over as transpose(0, 3, 1, 2): an NCHW view that is not contiguous.
    batches = _images(3)
    views = [(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2), y) for x, y in batches]
    assert not views[0][0].flags.c_contiguous
    eager = _trainer("eager", model=_vit())
    want = [eager.step(*b).loss for b in batches]
    tr = _trainer("fused", replay, model=_vit())
    got = [tr.step(*b).loss for b in views]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    if replay == "captured":
        _assert_captured(tr)


# -- the loader's array objects, and what the caller keeps ----------------------------------------------------

@pytest.mark.parametrize("replay", REPLAYS)
def test_one_array_object_overwritten_in_place_for_every_batch(replay):
    batches = _rows(5)
    _, want = _eager(batches)
    tr = _trainer("fused", replay)
    x_buf, y_buf = np.empty((16, 12), np.float32), np.empty(16, np.int64)
    got = []
    for x, y in batches:
        x_buf[...] = x
        y_buf[...] = y
        got.append(tr.step(x_buf, y_buf).loss)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert len(set(got)) == len(got)  # every step saw its own batch
    if replay == "captured":
        _assert_captured(tr)


@pytest.mark.parametrize("replay", REPLAYS)
def test_the_batch_loader_reuses_its_buffers(replay):
    x, y = (np.concatenate(a) for a in zip(*_rows(4)))
    runs = {}
    for route in ("eager", "fused"):
        loader = BatchLoader(x, y, 16, rng=np.random.default_rng(11))
        tr = _trainer(route, replay)
        runs[route] = (tr, [tr.step(*loader.next()).loss for _ in range(7)])  # crosses an epoch
        xb, _ = loader.next()
        assert xb is loader.next()[0]  # the premise: one array object for every batch
    np.testing.assert_allclose(runs["fused"][1], runs["eager"][1], rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(runs["fused"][0]), _params(runs["eager"][0]))


@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("clip", [None, 1.0])
def test_reports_kept_over_steps_and_batches_mutated_after_step(replay, clip):
    batches = _rows(5)
    eager = _trainer("eager", clip_grad_norm=clip)
    want = [eager.step(*b) for b in batches]
    tr = _trainer("fused", replay, clip_grad_norm=clip)
    reports = []
    for x, y in batches:
        x, y = x.copy(), y.copy()
        reports.append(tr.step(x, y))
        x[...] = np.nan  # the caller reuses its arrays after step() returned
        y[...] = 99
    for _ in range(2):  # more steps after: nothing kept may be overwritten by them
        tr.step(*batches[0])
    assert [r.step for r in reports] == [1, 2, 3, 4, 5]
    assert all(type(r.loss) is float for r in reports)
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in want], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose([r.lr for r in reports], [r.lr for r in want], rtol=0, atol=0)
    if clip is None:
        assert all(r.grad_norm is None for r in reports)
    else:
        assert all(type(r.grad_norm) is float for r in reports)
        np.testing.assert_allclose([r.grad_norm for r in reports], [r.grad_norm for r in want], rtol=RTOL, atol=ATOL)
    assert all(r.as_dict()["route"] == "fused" for r in reports)


# -- empty and broken batches ---------------------------------------------------------------------------------

@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("max_plans", [1, 4])
def test_an_empty_batch_fails_as_on_eager_and_nothing_trained_is_lost(replay, max_plans):
    batches = _rows(4)
    empty = (batches[0][0][:0], batches[0][1][:0])
    eager, fused = _trainer("eager"), _trainer("fused", replay, max_plans=max_plans)
    for tr in (eager, fused):
        tr.step(*batches[0])
    saved = _params(fused)
    for tr in (eager, fused):
        with pytest.raises((NonFiniteLossError, ValueError, FloatingPointError)) as err:
            tr.step(*empty)
        assert "step 2" in str(err.value) or "empty" in str(err.value) or "0 rows" in str(err.value)
    assert fused.step_count == eager.step_count == 1
    for p, q in zip(_params(fused), saved):
        np.testing.assert_array_equal(p, q)
    want = [eager.step(*b).loss for b in batches[1:]]
    got = [fused.step(*b).loss for b in batches[1:]]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(fused), _params(eager))


@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("what", ["label_too_big", "negative_label", "nan_pixel", "all_ignored"])
def test_a_broken_batch_mid_run_fails_as_on_eager_and_loses_nothing(replay, what):
    batches = _rows(4)
    x, y = batches[1]
    bad = {"label_too_big": (x, np.where(np.arange(16) == 3, 7, y)),
           "negative_label": (x, np.where(np.arange(16) == 3, -5, y)),
           "nan_pixel": (np.where(np.arange(12) == 3, np.float32(np.nan), x).astype(np.float32), y),
           "all_ignored": (x, np.full(16, -100))}[what]
    eager, fused = _trainer("eager"), _trainer("fused", replay)
    for tr in (eager, fused):
        tr.step(*batches[0])
    saved = _params(fused)
    with pytest.raises(Exception) as eager_err:
        eager.step(*bad)
    with pytest.raises(type(eager_err.value)) as fused_err:
        fused.step(*bad)
    assert str(fused_err.value) == str(eager_err.value)
    assert fused.step_count == 1
    for p, q in zip(_params(fused), saved):
        np.testing.assert_array_equal(p, q)
    want = [eager.step(*b).loss for b in batches[2:]]
    got = [fused.step(*b).loss for b in batches[2:]]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _assert_params_close(_params(fused), _params(eager))
    if replay == "captured":
        _assert_captured(fused)


# Regression (failed on d412136): when the first batch of a signature was degenerate (every label ignore_index,
# e.g. an all-padding last batch; or a NaN pixel), the capture could not check its recording ("the batch and the
# second batch give the same loss and gradients, so the recording cannot be checked") and refused for good: the
# plan kept the Python replay for the rest of the run, although the next batches were normal. Now such a batch is
# no verdict: the step runs the Python replay and the plan's next step records again (up to 3 unchecked batches).
@pytest.mark.parametrize("what", ["all_ignored", "nan_pixel"])
def test_a_degenerate_first_batch_does_not_cost_the_signature_its_captured_replay(what, caplog):
    batches = _rows(4)
    x, y = batches[0]
    bad = {"nan_pixel": (np.where(np.arange(12) == 3, np.float32(np.nan), x).astype(np.float32), y),
           "all_ignored": (x, np.full(16, -100))}[what]
    tr = _trainer("fused", "captured", on_nonfinite="skip")
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        assert tr.step(*bad).skipped
        before = _calls()
        for b in batches[1:]:
            tr.step(*b)
    assert _calls()[0] - before[0] == 3, tr.fused.plan.capture.note
    _assert_captured(tr)


# -- a loss_fn that takes more than (output, labels) ----------------------------------------------------------

def _weighted(out, targets):
    labels, weight = targets
    return cross_entropy(out, labels) * float(weight)


def _per_row(out, targets):
    labels, weights = targets
    return (cross_entropy(out, labels, reduction="none") * Tensor(weights)).mean()


def _keyed(out, targets):
    return cross_entropy(out, targets["labels"])


STRUCTURED = {
    "tuple_with_a_scale": (_weighted, lambda y: (y, 2.0)),
    "tuple_with_row_weights": (_per_row, lambda y: (y, np.linspace(0.5, 1.5, len(y), dtype=np.float32))),
    "dict": (_keyed, lambda y: {"labels": y}),
}


# Regression (failed on d412136): eager hands loss_fn the targets untouched (LossFn = Callable[[Tensor, Any],
# Tensor]), but the fused route forced them into ONE ndarray without saying so: a tuple (labels, scale) failed
# inside NumPy ("setting an array element with a sequence ... inhomogeneous shape"), (int64 labels, float32
# weights) was stacked into one float64 array that reached cross_entropy as float labels ("target must hold class
# indices"), and a dict became a 0-d object array ("only integers, slices ... are valid indices"). Now the plan
# holds each array of the targets in a buffer of its own inside the same structure (compile/targets.py), and the
# captured replay records the step as for one array.
@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("kind", list(STRUCTURED))
def test_structured_targets_train_as_on_eager(replay, kind):
    loss_fn, make = STRUCTURED[kind]
    batches = [(x, make(y)) for x, y in _rows(4)]
    eager = _trainer("eager", loss_fn=loss_fn)
    want = [eager.step(*b).loss for b in batches]
    fused = _trainer("fused", replay, loss_fn=loss_fn)
    got = [fused.step(*b).loss for b in batches]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    for a, b in zip(eager.model.parameters(), fused.model.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=RTOL, atol=ATOL)
    assert fused.fused.traces == 1
    capture = fused.fused.plan.capture
    assert (capture is not None and capture.tape is not None) == (replay == "captured")


def test_route_auto_plans_with_structured_targets():
    # The route plan before step 1 traces the step with the same targets (train/route_plan.py), and counts
    # every array of them as inputs.
    loss_fn, make = STRUCTURED["tuple_with_row_weights"]
    (x, y), = _rows(1)
    targets = make(y)
    auto = _trainer("auto", loss_fn=loss_fn)
    plan = auto.plan(x, targets)
    assert plan.chosen == "fused"
    assert plan.estimates["fused"].parts["inputs"] == x.nbytes + y.nbytes + targets[1].nbytes
    np.testing.assert_allclose(auto.step(x, targets).loss, _trainer("eager", loss_fn=loss_fn).step(x, targets).loss,
                               rtol=RTOL)


def test_a_constant_in_the_targets_is_part_of_the_signature():
    # (labels, 2.0) then (labels, 3.0): a number the loss reads in Python is baked into the trace, so another
    # value is another plan; going back to 2.0 finds the first one.
    batches = _rows(3)
    scales = [2.0, 3.0, 2.0]
    eager = _trainer("eager", loss_fn=_weighted)
    fused = _trainer("fused", "captured", loss_fn=_weighted)
    for (x, y), scale in zip(batches, scales):
        np.testing.assert_allclose(fused.step(x, (y, scale)).loss, eager.step(x, (y, scale)).loss, rtol=RTOL)
    assert fused.fused.traces == 2 and len(fused.fused.plans) == 2


def test_targets_holding_something_else_than_arrays_and_numbers_are_a_clear_error():
    x, y = _rows(1)[0]
    fused = _trainer("fused", loss_fn=_keyed)
    with pytest.raises(TypeError, match=r"targets\['extra'\] is of type object.*route='eager'"):
        fused.step(x, {"labels": y, "extra": object()})
    assert fused.step_count == 0


@pytest.mark.parametrize("replay", REPLAYS)
def test_simcse_targets_none_with_a_last_smaller_batch_and_int32_ids(replay):
    # SimCSE's job (train/simcse_job.py) steps with (ids, None); its forward returns the loss. Batches of 4, a last
    # batch of 3, back to 4, then int32 ids; float64 and no dropout, so eager and fused compute one function.
    from tensorarena.optim import AdamW
    from tensorarena.train.simcse_job import _model_loss
    from test_simcse import _padded_id_batches, _small_simcse

    ids = _padded_id_batches(3)
    batches = [ids[0], ids[1], ids[2][:3], ids[2], ids[0].astype(np.int32)]
    runs = {}
    for route in ("eager", "fused"):
        model = _small_simcse(0.0, np.float64)
        tr = Trainer(model, AdamW(model.parameters(), lr=1e-2, weight_decay=0.01), _model_loss, route=route,
                     fused_replay=replay)
        runs[route] = (tr, [tr.step(b, None).loss for b in batches])
    (et, want), (ft, got) = runs["eager"], runs["fused"]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    _assert_params_close(_params(ft), _params(et), rtol=1e-10, atol=1e-12)
    assert ft.fused.traces == 3  # (4, 7) int64, (3, 7) int64, (4, 7) int32
    if replay == "captured":
        _assert_captured(ft)
    with pytest.raises(ValueError, match="at least 2 sentences"):
        ft.step(ids[0][:1], None)
    assert ft.step_count == len(batches)
