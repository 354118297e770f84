"""Micro-batches on the streaming route (stream/sweep.py): each loaded stage runs every micro-batch, then one update.

References: without dropout, the whole batch's eager step (float64, <= 1e-10 over AdamW steps: for a loss that is a
mean over rows the rows-weighted sum of the micro-batches' gradients is the whole batch's gradient). With dropout,
the streamed step draws its masks stage by stage (every micro-batch through stage 0, then stage 1, ...), so its
reference is an eager step over the same stages in that order (`_stage_major_step`): one graph through all of them,
the same draws, the same masks, if and only if every recompute in the sweeps restores the generators of its
(stage, micro-batch).

These checks can fail: with _Sweep._generators restoring each stage's first micro-batch's generators for every
micro-batch (`self.route._rng_restore(self.rng_before[k][0])`), both test_dropout_masks_are_drawn_stage_by_stage cases fail
(losses 3e-3 apart); with the loss seeded 1 instead of its weight, 10 of these 20 tests fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.models.bert import BertConfig, BertModel
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.nn.transformer import mean_pool
from tensorarena.stream import Stage, model_stages
from tensorarena.stream.stages import SideForward, run_stage
from tensorarena.tensor import Tensor
from tensorarena.train.report import NonFiniteLossError
from tensorarena.train.trainer import Trainer

# Writes two buffers in training (a running mean and a count) and scales its output by the mean, so a statistic
# recomputed twice, or rolled back to the wrong micro-batch, changes the losses.
from test_streaming_followups import _RunningMean


def _vit(dropout=0.0, dtype=np.float64, depth=3):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=32, depth=depth, num_heads=4, dropout=dropout,
                    attention_dropout=dropout, dtype=dtype)
    return ViT(cfg, rng=np.random.default_rng(0))  # the dropout layers keep this generator


def _images(n, batch=10, dtype=np.float64, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 3, 16, 16)).astype(dtype), rng.integers(0, 5, batch)) for _ in range(n)]


def _trainer(model, route, tmp_path, micro_batch=None, **kw):
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=10)
    return Trainer(model, opt, kw.pop("loss", cross_entropy), scheduler=sched, route=route, micro_batch=micro_batch,
                   store_dir=tmp_path / f"{route}-{micro_batch}", **kw)


def _trained(trainer, batches):
    reports = [trainer.step(x, y) for x, y in batches]
    assert {r.route for r in reports} == {trainer.route}
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return [r.loss for r in reports], [p.data.copy() for p in trainer.model.parameters()]


def _assert_same(a, b, tol=1e-10):
    np.testing.assert_allclose(a[0], b[0], rtol=0, atol=tol)
    for p, q in zip(a[1], b[1]):
        np.testing.assert_allclose(p, q, rtol=0, atol=tol)


# -- what is computed ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("clip", [None, 0.5], ids=["no-clip", "clip"])
@pytest.mark.parametrize("io", ["map", "copy"])
def test_streamed_micro_batches_train_as_the_whole_batch(tmp_path, clip, io):
    batches = _images(3)  # 10 rows: micro-batches of 4, 4 and 2
    whole = _trained(_trainer(_vit(), "eager", tmp_path, clip_grad_norm=clip), batches)
    streamed = _trainer(_vit(), "streaming", tmp_path, 4, clip_grad_norm=clip, stream_io=io)
    _assert_same(whole, _trained(streamed, batches))


def test_the_store_is_read_and_written_as_often_as_for_the_whole_batch(tmp_path):
    batches = _images(2)
    stats = {}
    for micro_batch in (None, 3):
        trainer = _trainer(_vit(), "streaming", tmp_path, micro_batch)
        for x, y in batches:
            trainer.step(x, y)
        stats[micro_batch] = trainer.stream.last_stats
    whole, micro = stats[None], stats[3]
    assert (micro.bytes_read, micro.bytes_written) == (whole.bytes_read, whole.bytes_written)
    # The boundaries and their gradients are the whole batch's; a stage holds one micro-batch (4 of 10 rows).
    assert micro.step_arena_high_water == whole.step_arena_high_water
    assert micro.stage_arena_high_water < 0.5 * whole.stage_arena_high_water


def _stage_major_step(model, optimizer, x, y, micro_batch):
    """The streamed micro-batched step, eagerly: every micro-batch through stage 0, then stage 1 ..., the last stage
    (with its loss, weighted by rows_i / rows) micro-batch by micro-batch, one graph through all, one update."""
    stages = model_stages(model)
    rows = len(x)
    cuts = [slice(s, min(s + micro_batch, rows)) for s in range(0, rows, micro_batch)]
    model.train()
    optimizer.zero_grad(set_to_none=True)
    h = [Tensor(x[c]) for c in cuts]
    for stage in stages[:-1]:
        h = [run_stage(stage, hi, None) for hi in h]
    total = None
    for c, hi in zip(cuts, h):
        term = cross_entropy(run_stage(stages[-1], hi, None), y[c]) * ((c.stop - c.start) / rows)
        total = term if total is None else total + term
    total.backward()
    optimizer.step()
    return float(total.item())


@pytest.mark.parametrize("clip", [None, 0.5], ids=["no-clip", "clip"])
def test_dropout_masks_are_drawn_stage_by_stage(tmp_path, clip):
    batches = _images(3)
    streamed = _trainer(_vit(dropout=0.2), "streaming", tmp_path, 4, clip_grad_norm=clip)
    got = _trained(streamed, batches)
    model = _vit(dropout=0.2)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=10)
    losses = []
    for x, y in batches:
        if clip is None:
            losses.append(_stage_major_step(model, opt, x, y, 4))
        else:  # clipping between backward and the update, as Trainer does
            step, opt.step = opt.step, lambda: None
            losses.append(_stage_major_step(model, opt, x, y, 4))
            opt.step = step
            from tensorarena.optim.clip import clip_grad_norm_

            clip_grad_norm_(model.parameters(), clip)
            opt.step()
        sched.step()
    _assert_same((losses, [p.data.copy() for p in model.parameters()]), got)
    # ... and not the masks the eager route's micro-batches draw (micro-batch by micro-batch): a different step.
    eager = _trained(_trainer(_vit(dropout=0.2), "eager", tmp_path, 4, clip_grad_norm=clip), batches)
    assert max(np.abs(p - q).max() for p, q in zip(eager[1], got[1])) > 1e-6


@pytest.mark.parametrize("clip", [None, 0.5], ids=["no-clip", "clip"])
def test_buffers_see_each_micro_batch_once_as_on_the_eager_route(tmp_path, clip):
    """Stage k's buffers see micro-batch 1, 2, ... in the same order on both routes (only stage k writes them)."""
    runs = {}
    for route in ("eager", "streaming"):
        model = _vit()
        model.pos_drop = _RunningMean(model.pos_drop)  # in stage 0 (embed): later micro-batches read its writes
        model.blocks[1].mlp = _RunningMean(model.blocks[1].mlp)  # a middle stage
        trainer = _trainer(model, route, tmp_path, 4, clip_grad_norm=clip)
        runs[route] = _trained(trainer, _images(3))
        runs[route + " buffers"] = [(m.running_mean.copy(), int(m.num_batches_tracked))
                                    for m in (model.pos_drop, model.blocks[1].mlp)]
    _assert_same(runs["eager"], runs["streaming"])
    assert runs["streaming buffers"] == runs["eager buffers"]
    assert [count for _, count in runs["streaming buffers"]] == [9, 9]  # 3 steps x 3 micro-batches


class _MaskedClassifier(Module):
    """BERT over a padded batch given as one int array (B, 2, T): ids and attention mask stacked, so that the batch
    can be cut into micro-batches; mean-pooled under the mask, then a Linear. Streamed on BertModel.encoder_stages
    with the mask and token types as side inputs, which each micro-batch must get its rows of."""

    def __init__(self, dtype=np.float64, dropout=0.0):
        super().__init__()
        rng = np.random.default_rng(0)
        config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=12, hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout, dtype=dtype)
        self.encoder = BertModel(config, rng=rng)
        self.head = Linear(16, 3, rng=rng, dtype=dtype)

    def forward(self, batch):
        batch = batch.data if isinstance(batch, Tensor) else batch
        hidden = self.encoder(batch[:, 0], attention_mask=batch[:, 1])
        return self.head(mean_pool(hidden, batch[:, 1]))

    def stream_inputs(self, batch):
        batch = batch.data if isinstance(batch, Tensor) else batch
        first, side = self.encoder.encoder_inputs(batch[:, 0], batch[:, 1])
        return first, dict(side, pool_mask=batch[:, 1])

    def stream_stages(self):
        head = lambda hidden, side: self.head(mean_pool(hidden, side["pool_mask"]))  # noqa: E731
        return self.encoder.encoder_stages(head=head, head_params=tuple(self.head.parameters()), prefix="encoder.")


def _padded_batches(n, rows=7, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lengths = rng.integers(1, 9, rows)
        mask = (np.arange(9)[None, :] < lengths[:, None]).astype(np.int64)
        ids = np.where(mask == 1, rng.integers(1, 40, (rows, 9)), 0)
        out.append((np.stack([ids, mask], axis=1), rng.integers(0, 3, rows)))
    return out


@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip"])
def test_side_inputs_are_cut_with_the_batch(tmp_path, clip):
    batches = _padded_batches(3)  # 7 rows: micro-batches of 3, 3 and 1
    whole = _trained(_trainer(_MaskedClassifier(), "eager", tmp_path, clip_grad_norm=clip), batches)
    streamed = _trainer(_MaskedClassifier(), "streaming", tmp_path, 3, clip_grad_norm=clip)
    _assert_same(whole, _trained(streamed, batches))


# -- memory: the plan is the step -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip"])
@pytest.mark.parametrize("kind", ["vit", "bert"])
def test_the_planned_streaming_parts_are_the_measured_step(tmp_path, kind, clip, dropout):
    """As for whole batches (tests/test_streaming_hunt.py, test_streaming_masks.py): one stage's slab, the boundary
    activations and gradients and the side inputs sum to the step's measured transient peak exactly; here the slab
    is a micro-batch's and the rest the whole batch's (those of the plan without micro-batches)."""
    # Regression (fixed): the stage part was the offline slab placement, 4% above the arena's high-water for a ViT
    # block without dropout (whole batches too); it is the traced live peak now.
    if kind == "vit":
        model, batches, loss, micro = _vit(dropout, np.float32), _images(2, dtype=np.float32), cross_entropy, 4
    else:
        model, batches, loss, micro = _MaskedClassifier(np.float32, dropout), _padded_batches(2), cross_entropy, 3
    whole_plan = _trainer(model, "streaming", tmp_path, None, loss=loss).plan(*batches[0], routes=("streaming",))
    trainer = _trainer(model, "streaming", tmp_path, micro, clip_grad_norm=clip, loss=loss)
    plan = trainer.plan(*batches[0], routes=("streaming",))
    parts, whole = plan.estimates["streaming"].parts, whole_plan.estimates["streaming"].parts
    for x, y in batches:
        trainer.step(x, y)
    stats = trainer.stream.last_stats
    assert parts["activations (one stage)"] == stats.stage_arena_high_water < whole["activations (one stage)"]
    side = [k for k in parts if k.startswith("side inputs")]
    assert [parts[k] for k in side] == [whole[k] for k in side] == ([stats.side_input_bytes] if kind == "bert" else [])
    for key in ("boundary activations", "boundary gradients", "inputs"):
        assert parts[key] == whole[key], key
    planned = sum(parts[k] for k in ["activations (one stage)", "boundary activations", "boundary gradients", *side])
    assert planned == stats.arena_high_water, (planned, stats.arena_high_water)
    # Between steps: two store slots, one stage's gradients and their sum over the micro-batches.
    assert parts["stream buffers"] + parts["grad accumulator"] == stats.resident_bytes
    assert parts["grad accumulator"] == trainer.stream._grad_sums.nbytes > 0 and "grad accumulator" not in whole


def test_route_auto_streams_in_micro_batches_where_only_that_fits(tmp_path):
    model = _vit(dtype=np.float32)
    x, y = _images(1, dtype=np.float32)[0]
    probe = _trainer(model, "auto", tmp_path, 4, memory_limit="16G").plan(x, y)
    streaming, fused = probe.estimates["streaming"].required, probe.estimates["fused"].required
    assert streaming < fused
    limit = (streaming + fused) // 2  # streaming fits, fused does not (a limit given is the budget: no margin)
    trainer = _trainer(model, "auto", tmp_path, 4, memory_limit=limit)
    report = trainer.step(x, y)
    assert report.route == trainer.route == "streaming" and trainer.stream.micro_batch == 4


# -- refusals ------------------------------------------------------------------------------------------------------
class _PoolsRows(Module):
    """Two stages, the first of which averages over the batch's rows: no micro-batch can fill its rows of that.
    `doubled`: stream_inputs stacks the batch twice (as SimCSE does its two views), so stage 0 has other rows."""

    def __init__(self, doubled=False):
        super().__init__()
        rng = np.random.default_rng(0)
        self.a, self.b = Linear(4, 4, rng=rng, dtype=np.float64), Linear(4, 3, rng=rng, dtype=np.float64)
        self.doubled = doubled

    def _pool(self, x, side=None):
        return self.a(x).mean(dim=0, keepdim=True)

    def forward(self, x):
        return self.b(self._pool(x))

    def stream_inputs(self, batch):
        return np.concatenate([batch, batch]), {}

    def stream_stages(self):
        pool = SideForward(self._pool) if self.doubled else self._pool
        return [Stage("pool", tuple(self.a.parameters()), pool), Stage("head", tuple(self.b.parameters()), self.b)]


def _squares(out, targets):
    return (out * out).mean()


def test_a_stage_that_does_not_keep_the_rows_is_refused_naming_it(tmp_path):
    model = _PoolsRows()
    trainer = _trainer(model, "streaming", tmp_path, 2, loss=_squares)
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"stage 'pool' returned shape \(1, 4\) for micro-batch 1 of 3 \(2 rows of "
                                         r"5\): micro-batches on the streaming route need every stage to keep"):
        trainer.step(np.ones((5, 4)), None)
    assert trainer.step_count == 0
    trainer.stream.to_memory()
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
    _trainer(_PoolsRows(), "streaming", tmp_path / "whole", None, loss=_squares).step(np.ones((5, 4)), None)  # fine


def test_stage_inputs_of_other_rows_are_refused(tmp_path):
    trainer = _trainer(_PoolsRows(doubled=True), "streaming", tmp_path, 3, loss=_squares)
    with pytest.raises(ValueError, match=r"cut stage 0's input along its first dimension, but it has shape "
                                         r"\(14, 4\) for a batch of 7 rows"):
        trainer.step(np.ones((7, 4)), None)
    assert trainer.step_count == 0


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_non_finite_micro_batch_updates_no_stage(tmp_path, on_nonfinite):
    model = _vit()
    trainer = _trainer(model, "streaming", tmp_path, 4, on_nonfinite=on_nonfinite)
    (x, y), = _images(1)
    trainer.step(x, y)
    trainer.stream.to_memory()
    before = [p.data.copy() for p in model.parameters()]
    bad = x.copy()
    bad[9] = np.nan  # the last micro-batch: the first two ran through the last stage already
    if on_nonfinite == "raise":
        with pytest.raises(NonFiniteLossError, match="the parameters were not updated"):
            trainer.step(bad, y)
        assert trainer.step_count == 1
    else:
        assert trainer.step(bad, y).skipped
    trainer.stream.to_memory()
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


# -- the command line --------------------------------------------------------------------------------------------
def test_train_streams_in_micro_batches_from_the_command_line(tmp_path):
    import json

    from tensorarena import cli

    out = tmp_path / "summary.json"
    assert cli.main(["train", "--model", "vit-tiny", "--steps", "2", "--batch-size", "8", "--micro-batch", "3",
                     "--route", "streaming", "--store-dir", str(tmp_path / "store"), "--test-size", "16",
                     "--no-progress", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["route"] == "streaming" and summary["micro_batch"] == 3 and summary["steps"] == 2
    assert np.isfinite(summary["final_loss"]) and np.isfinite(summary["test_loss"])


# -- the generators' snapshots ----------------------------------------------------------------------------------------
def test_a_step_in_many_micro_batches_keeps_only_the_generator_states_that_moved(tmp_path):
    """A streamed step keeps a generator snapshot per stage and micro-batch until it ends (sweep.py); unplanned copies
    of Python's `random` and NumPy's global state (~30 KB) each made a step of 8 stages in 48 micro-batches hold 11.7
    MB more Python memory at its peak (tracemalloc), 0.78 MB now that unchanged states are shared (with or without
    dropout, whose draws move the model's own generator). Here 24 micro-batches, with dropout.
    Regression (fixed): fails on 5ec2dec (5.92 MB here, 0.54 MB now); see test_store_on_tmpfs.py's recipe for running a
    file against an older commit."""
    dropout = 0.1
    import tracemalloc

    cfg = ViTConfig(image_size=8, patch_size=4, num_classes=3, dim=16, depth=6, num_heads=2, dropout=dropout,
                    attention_dropout=dropout, dtype=np.float32)
    trainer = _trainer(ViT(cfg, rng=np.random.default_rng(0)), "streaming", tmp_path, 1)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((24, 3, 8, 8)).astype(np.float32), rng.integers(0, 3, 24)
    trainer.step(x, y)
    assert len(trainer.stream.stages) == 8
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        trainer.step(x, y)
        grown = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert grown < 2e6, f"the step's Python peak grew {grown / 1e6:.2f} MB"


def test_shared_generator_states_are_equal_ones_only():
    import random

    from tensorarena.stream.generator_states import share_unchanged

    np_state = np.random.get_state(legacy=False)
    gen = np.random.default_rng(0)
    before = [gen.bit_generator.state, np_state, random.getstate()]
    same = [gen.bit_generator.state, np.random.get_state(legacy=False), random.getstate()]
    gen.standard_normal()
    moved_key = dict(np_state, state=dict(np_state["state"], key=np_state["state"]["key"].copy()))
    moved_key["state"]["key"][0] ^= 1
    after = share_unchanged(before, [gen.bit_generator.state, moved_key, random.getstate()])
    assert [a is b for a, b in zip(share_unchanged(before, same), before)] == [True, True, True]
    assert [a is b for a, b in zip(after, before)] == [False, False, True]
    assert after[1] is moved_key and share_unchanged(None, same) is same
