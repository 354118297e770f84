"""The fused route's promises (compile/step.py, DESIGN.md) on every model and option, not only the plain ViT.

12 of its 206 tests failed on bc501d1, for three bugs, each under a "Regression" comment: the row-reducing gradient
kernels (Linear bias, LayerNorm, FeedForward) and the cross-entropy kernels allocated heap temporaries every
replayed step, and clip_grad_norm_ raised on a legitimate underflow under np.seterr(all="raise"). Every other one
passed there, and all pass now.
To see them fail: `git worktree add -q /tmp/old2 bc501d1`, copy this file into /tmp/old2/tests/, then
    cd /tmp/old2 && PYTHONPATH=/tmp/old2 NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider \
        tests/test_fused_promises.py 2>&1 | tail -40

The promises: a replayed step allocates no array memory; the slab and the arena high-water are the same every
step; the Python and the captured replay train bit for bit alike; the fused step matches eager (float64 1e-10,
float32 1e-5); the trace allocates from no step arena; memory_report() is known before step 1 and matches the
plan's real buffers. Checked on BERT (padding masks, token types, dropout), SimCSE (dropout), an MLP with
dropout, ViT with dropout / attention dropout / gelu_tanh / cls_only_last_block=False, bfloat16 products,
update_in_backward True and False, clip_grad_norm, and every optimizer (and maximize) on the captured replay.

Allocation is measured as test_fused does, by scale (tracemalloc's peak of a warm step at two batch sizes, or two
model widths: a heap temporary grows, Python objects do not).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import optim
from tensorarena.compile.step_state import rng_generators
from tensorarena.kernels import gemm_bf16 as K
from tensorarena.memory.pool import default_pool
from tensorarena.models.bert import BertConfig, BertModel
from tensorarena.models.simcse import SimCSE
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.simcse_job import _model_loss
from tensorarena.train.trainer import Trainer
from mlp_cases import labelled_rows, small_mlp

from test_fused import OPTIMIZERS  # every optimizer and its options, over two param groups
from test_captured_replay import _plain  # a generator state comparable with ==

TOL = {np.float32: 1e-5, np.float64: 1e-10}
needs_bf16_gemm = pytest.mark.skipif(not K.available(), reason=f"no fast bfloat16 GEMM: {K.why_not()}")


# -- models and batches --------------------------------------------------------------------------------

def _mlp(dtype=np.float32, dropout=0.3, hidden=(16,)):
    return small_mlp(0, dropout, dtype, hidden)


def _rows(n, batch=16, dtype=np.float32, seed=2):
    return labelled_rows(n, batch, dtype=dtype, seed=seed)


def _vit(dtype=np.float32, **options):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=4, dim=32, depth=2, num_heads=4, dtype=dtype, **options)
    return ViT(cfg, rng=np.random.default_rng(0))


def _images(n, batch=8, dtype=np.float32, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(dtype)
        out.append((x, (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)))
    return out


class BertClassifier(Module):
    """BERT over (B, 3, T) int64: ids, attention mask (1 token / 0 padding) and token types packed in one input,
    so each is a view of the plan's input buffer; a Linear head on [CLS]."""

    def __init__(self, dtype=np.float32, dropout=0.1) -> None:
        super().__init__()
        config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout, dtype=dtype)
        self.bert = BertModel(config, rng=np.random.default_rng(0))
        self.head = Linear(32, 3, rng=np.random.default_rng(1), dtype=dtype)

    def forward(self, x):
        hidden = self.bert(x.data[:, 0], attention_mask=x.data[:, 1], token_type_ids=x.data[:, 2])  # (B, T, H)
        return self.head(hidden[:, 0])  # (B, 3)


def _tokens(n, batch=4, tokens=8, seed=3):
    """(B, 3, T) ids/mask/types, right-padded with a different length per row and batch; two segments."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = np.zeros((batch, tokens), np.int64)
        mask = np.zeros((batch, tokens), np.int64)
        types = np.zeros((batch, tokens), np.int64)
        for row, length in enumerate(rng.integers(3, tokens + 1, batch)):
            ids[row, :length] = rng.integers(1, 50, length)
            mask[row, :length] = 1
            types[row, length // 2:length] = 1
        out.append((np.stack([ids, mask, types], axis=1), (ids[:, 1] % 3).astype(np.int64)))
    return out


def _simcse(dtype=np.float32, dropout=0.1):
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout, dtype=dtype)
    return SimCSE(BertModel(config, rng=np.random.default_rng(0)), temperature=0.05, pad_id=0)


def _sentences(n, batch=4, tokens=8, seed=5):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = np.zeros((batch, tokens), np.int64)
        for row, length in enumerate(rng.integers(2, tokens + 1, batch)):
            ids[row, :length] = rng.integers(1, 50, length)
        out.append((ids, None))
    return out


# name -> (make_model(dtype), make_batches(n, batch, dtype), loss_fn, a small batch size, a big one)
CASES = {
    "mlp_dropout": (lambda dt: _mlp(dt), lambda n, b, dt: _rows(n, b, dt), cross_entropy, 16, 2048),
    "vit_dropout": (lambda dt: _vit(dt, dropout=0.2, attention_dropout=0.2), lambda n, b, dt: _images(n, b, dt),
                    cross_entropy, 4, 32),
    "vit_gelu_tanh": (lambda dt: _vit(dt, activation="gelu_tanh"), lambda n, b, dt: _images(n, b, dt),
                      cross_entropy, 4, 32),
    "vit_all_tokens": (lambda dt: _vit(dt, cls_only_last_block=False), lambda n, b, dt: _images(n, b, dt),
                       cross_entropy, 4, 32),
    "bert_masks_types": (lambda dt: BertClassifier(dt), lambda n, b, dt: _tokens(n, b), cross_entropy, 4, 64),
    "simcse": (lambda dt: _simcse(dt), lambda n, b, dt: _sentences(n, b), _model_loss, 4, 64),
}

# update_in_backward (None: the default) and clip_grad_norm
UPDATES = {"in_backward": dict(update_in_backward=True), "flat": dict(update_in_backward=False),
           "flat_clip": dict(clip_grad_norm=0.5)}


def _opt(model):
    return optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


def _trainer(case, dtype=np.float32, *, route="fused", replay="captured", make_opt=_opt, **kw):
    make_model, _, loss_fn, _, _ = CASES[case]
    model = make_model(dtype)
    return model, Trainer(model, make_opt(model), loss_fn, route=route, fused_replay=replay, **kw)


def _batches(case, n, dtype=np.float32, big=0):
    """`n` batches of the case's small size, or of `big` times its big size."""
    _, make_batches, _, small, large = CASES[case]
    return make_batches(n, large * big if big else small, dtype)


def _step_peak(trainer, batch):
    """tracemalloc's peak of one warm step above what was traced before it (bytes), and the step's report."""
    trainer.step(*batch)  # warm: a new signature traces (and captures) here
    trainer.step(*batch)
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    report = trainer.step(*batch)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - base, report


def _assert_no_array_memory(trainer, case, dtype=np.float32):
    """A step's traced peak is the same on a big batch and one twice as big while the slab grows (test_fused's
    proof by scale). Both batches are big: NumPy's ufuncs take an iteration buffer of up to 8192 elements per
    operand for a broadcast or strided operand (np.add(x, bias, out=x): ~33 KB), which grows with the batch
    only until it is full, and is no array of the step."""
    big, _ = _step_peak(trainer, _batches(case, 1, dtype, big=True)[0])
    slab_big = trainer.fused.plan.memory.slab_bytes
    bigger, _ = _step_peak(trainer, _batches(case, 1, dtype, big=2)[0])
    slab_bigger = trainer.fused.plan.memory.slab_bytes
    assert slab_bigger - slab_big > 8 * 32 * 1024, (slab_big, slab_bigger)  # a batch-sized copy would show
    assert abs(bigger - big) < 32 * 1024, f"array memory outside the plan: {big} B big batch, {bigger} B 2x"


def _captured(trainer):
    capture = trainer.fused.plan.capture
    assert capture is not None and capture.tape is not None, capture and capture.note
    return capture


# -- the Python and the captured replay train bit for bit alike; slab and high-water flat -------------

@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_both_replays_train_bit_for_bit_with_a_flat_slab(case, update):
    batches = _batches(case, 3)
    runs = {}
    for replay in ("python", "captured"):
        model, trainer = _trainer(case, replay=replay, **UPDATES[update])
        pool_before = (default_pool().stats.hits, default_pool().stats.misses)
        with ta.Arena(name="outer, never reset") as outer:
            reports = [trainer.step(*batches[i % 3]) for i in range(7)]
            assert outer.stats.allocations == 0 and outer.stats.high_water == 0
        # No step (trace, capture or replay) took a block from the pool: no step arena allocated anything.
        assert (default_pool().stats.hits, default_pool().stats.misses) == pool_before
        fused = trainer.fused
        assert [r.route for r in reports] == ["fused"] * 7 and fused.traces == 1 and fused.replays == 7
        assert len({r.arena_high_water for r in reports}) == 1
        assert reports[0].arena_high_water == fused.plan.memory.slab_bytes == fused.memory_report()["slab"]
        runs[replay] = (model, trainer, reports)
    (pm, _, pr), (cm, ct, cr) = runs["python"], runs["captured"]
    _captured(ct)
    assert [r.loss for r in cr] == [r.loss for r in pr]
    assert [r.grad_norm for r in cr] == [r.grad_norm for r in pr]
    for (name, p), q in zip(pm.named_parameters(), cm.parameters()):
        np.testing.assert_array_equal(q.data, p.data, err_msg=name)
    if case in ("mlp_dropout", "vit_dropout", "bert_masks_types", "simcse"):
        assert len({r.loss for r in cr[3:]}) == 4  # new dropout masks each step (batches repeat every 3)


# -- the fused step matches eager ---------------------------------------------------------------------

@pytest.mark.parametrize("replay", ["python", "captured"])
@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fused_step_matches_eager_in_float64(case, update, replay):
    # Dropout masks come from the same generators in the same order on both routes (random.Seed).
    batches = _batches(case, 3, np.float64)
    em, et = _trainer(case, np.float64, route="eager", **UPDATES[update])
    fm, ft = _trainer(case, np.float64, replay=replay, **UPDATES[update])
    er = [et.step(*batches[i % 3]) for i in range(6)]
    fr = [ft.step(*batches[i % 3]) for i in range(6)]
    assert {r.route for r in fr} == {"fused"}
    np.testing.assert_allclose([r.loss for r in fr], [r.loss for r in er], rtol=TOL[np.float64], atol=TOL[np.float64])
    if update == "flat_clip":
        np.testing.assert_allclose([r.grad_norm for r in fr], [r.grad_norm for r in er], rtol=1e-9)
    for (name, p), q in zip(em.named_parameters(), fm.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=TOL[np.float64], err_msg=name)
        if update == "in_backward":
            assert q.grad is None, name  # no gradient buffer exists
        else:  # flat gradients: the last step's (clipped) gradient, as eager leaves it
            np.testing.assert_allclose(q.grad, p.grad, rtol=0, atol=TOL[np.float64], err_msg=name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fused_step_matches_eager_in_float32(case):
    batches = _batches(case, 3)
    em, et = _trainer(case, route="eager")
    fm, ft = _trainer(case)
    er = [et.step(*batches[i % 3]) for i in range(6)]
    fr = [ft.step(*batches[i % 3]) for i in range(6)]
    _captured(ft)
    np.testing.assert_allclose([r.loss for r in fr], [r.loss for r in er], rtol=TOL[np.float32], atol=TOL[np.float32])
    for (name, p), q in zip(em.named_parameters(), fm.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=TOL[np.float32], err_msg=name)


# -- a replayed step allocates no array memory --------------------------------------------------------

@pytest.mark.parametrize("replay", ["python", "captured"])
@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_replayed_step_allocates_no_array_memory(case, update, replay):
    _, trainer = _trainer(case, replay=replay, **UPDATES[update])
    _assert_no_array_memory(trainer, case)
    if replay == "captured":
        _captured(trainer)


# -- memory_report() before step 1 is the plan's real buffers -----------------------------------------

@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_report_before_step_1_is_the_real_buffers(case, update):
    model, trainer = _trainer(case, **UPDATES[update])
    batches = _batches(case, 3)
    before = {n: p.numpy() for n, p in model.named_parameters()}
    rng = [_plain(g.bit_generator.state) for g in rng_generators(model)]
    with ta.Arena(name="outer") as outer:
        fused = trainer.compile(*batches[0])
        assert outer.stats.allocations == 0  # the trace allocated from no step arena
    report = dict(fused.memory_report())
    # The trace updated nothing and drew nothing.
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, before[name], err_msg=name)
    assert [_plain(g.bit_generator.state) for g in rng_generators(model)] == rng

    def real():
        plan, groups = fused.plan, fused.flat.groups
        got = {"slab": plan.slab.nbytes, "params": sum(g.param.nbytes for g in groups),
               "grads": sum(g.grad.nbytes for g in groups if g.grad is not None),
               "inputs": plan.inputs.nbytes + sum(b.nbytes for b in plan.target_buffers)}
        for kind in {k for g in groups for k in g.state}:
            got[f"state.{kind}"] = sum(g.state[kind].nbytes for g in groups if kind in g.state)
        return got

    for key, value in real().items():
        assert report[key] == value, key
    n_params = sum(p.data.size for p in model.parameters())
    itemsize = next(model.parameters()).data.itemsize
    assert report["params"] == n_params * itemsize
    assert report["grads"] == (0 if trainer.update_in_backward else n_params * itemsize)
    assert report["state.exp_avg"] == report["state.exp_avg_sq"] == n_params * itemsize
    assert report["predicted_peak"] == report["persistent_total"] + report["slab"] + report["libraries_measured"]
    for i in range(4):
        trainer.step(*batches[i % 3])
    assert fused.memory_report() == report  # what step 1 was told is what training holds
    for key, value in real().items():
        assert report[key] == value, key


# -- bfloat16 products -------------------------------------------------------------------------------

@needs_bf16_gemm
@pytest.mark.parametrize("update", ["in_backward", "flat_clip"])
@pytest.mark.parametrize("case", ["mlp_dropout", "vit_dropout"])
def test_bfloat16_products_replay_bit_for_bit_and_allocate_nothing(case, update):
    batches = _batches(case, 2)
    runs = {}
    for replay in ("python", "captured"):
        model, trainer = _trainer(case, replay=replay, matmul_precision="bfloat16", **UPDATES[update])
        reports = [trainer.step(*batches[i % 2]) for i in range(4)]
        assert trainer.fused.plan.matmul_precision == "bfloat16"
        assert any(b.dtype == np.uint16 for b in trainer.fused.plan.buffers)  # rounded operands are planned
        runs[replay] = (model, trainer, reports)
    (pm, _, pr), (cm, ct, cr) = runs["python"], runs["captured"]
    _captured(ct)
    assert [r.loss for r in cr] == [r.loss for r in pr]
    for p, q in zip(pm.parameters(), cm.parameters()):
        np.testing.assert_array_equal(q.data, p.data)
    # and against an eager bfloat16 run
    em, et = _trainer(case, route="eager", matmul_precision="bfloat16", **UPDATES[update])
    er = [et.step(*batches[i % 2]) for i in range(4)]
    np.testing.assert_allclose([r.loss for r in cr], [r.loss for r in er], rtol=1e-5, atol=1e-5)
    for p, q in zip(em.parameters(), cm.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-5)
    for replay in ("python", "captured"):
        _assert_no_array_memory(runs[replay][1], case)


# -- every optimizer on the captured replay: no allocation per step ------------------------------------

def _wide(width, *, kind="no_bias"):
    """Four parameters whatever the width (so the same Python objects): a wide layer of `width` units, then
    narrow ones. "no_bias": bias-free Linears and ReLU; "linear_bias": Linear with biases (bias gradient:
    kernels' column_sum); "layer_norm": a LayerNorm over the wide layer; "feed_forward": nn.FeedForward
    (bias + GELU + Linear fused, bias_gelu_backward_recompute)."""
    from tensorarena.nn import FeedForward, LayerNorm, ReLU, Sequential

    rng = np.random.default_rng(0)
    if kind == "no_bias":
        return Sequential(Linear(12, width, bias=False, rng=rng), ReLU(), Linear(width, 8, bias=False, rng=rng),
                          ReLU(), Linear(8, 8, bias=False, rng=rng), Linear(8, 4, bias=False, rng=rng))
    if kind == "linear_bias":
        return Sequential(Linear(12, width, rng=rng), ReLU(), Linear(width, 4, rng=rng))
    if kind == "layer_norm":
        return Sequential(Linear(12, width, bias=False, rng=rng), LayerNorm(width), Linear(width, 4, bias=False, rng=rng))
    return Sequential(FeedForward(12, width, rng=rng), Linear(12, 4, bias=False, rng=rng))


def _width_peaks(kind, make_opt, replay="captured", widths=(16384, 65536), **kw):
    """{width: the traced peak of a warm step}, each on its own trainer; the plan's arena checked too."""
    peaks = {}
    batch = _rows(2, batch=16)
    for width in widths:
        model = _wide(width, kind=kind)
        trainer = Trainer(model, make_opt(model), cross_entropy, route="fused", fused_replay=replay, **kw)
        for i in range(3):
            trainer.step(*batch[i % 2])
        if replay == "captured":
            _captured(trainer)
        peaks[width], report = _step_peak(trainer, batch[0])
        assert report.arena_high_water == trainer.fused.plan.memory.slab_bytes
    return peaks


@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_on_the_captured_replay_allocates_nothing(name, update):
    """The traced peak of a step at width 16384 and 65536: a parameter- or activation-sized heap temporary
    (>= 2.3 MiB more at the wider one, for a float32 temporary of the wide weight's size) shows. Both widths fill
    NumPy's bounded ufunc/cast buffers (8192 elements). Bias-free, so this checks the update and clipping, not
    the bias gradient (below)."""
    with np.errstate(under="ignore"):  # clipping's underflow of tiny gradients: its own regression test (below)
        peaks = _width_peaks("no_bias", OPTIMIZERS[name], **UPDATES[update])
    assert abs(peaks[65536] - peaks[16384]) < 32 * 1024, f"{name}: {peaks}"


# Regression (failed on bc501d1): the fused kernels that reduce a gradient over rows (column_sum, the bias gradient
# of every Linear; layer_norm_backward; bias_gelu_backward(_recompute), nn.FeedForward's fc1 bias) took
# np.zeros((threads, D)) float64 partial rows and part.sum(axis=0) from the heap on every call, and LayerNorm's
# Numba loop two np.zeros(D) per thread chunk, so every replayed step allocated ~(threads + 1) * D * 8 bytes per
# such op outside the plan. Measured (1 thread), the traced peak at width 16384 -> 65536: 265 KB -> 1052 KB (Linear
# bias), 397 KB -> 1576 KB (LayerNorm), 266 KB -> 1052 KB (FeedForward). The batch-scale checks cannot see it (it
# grows with the width and the thread count, not the batch). Now the partial rows come from the step arena
# (planned into the slab) and are summed into the output inside Numba.
@pytest.mark.parametrize("replay", ["python", "captured"])
@pytest.mark.parametrize("kind", ["linear_bias", "layer_norm", "feed_forward"])
def test_row_reduced_gradients_allocate_no_heap_partials(kind, replay):
    peaks = _width_peaks(kind, lambda m: optim.SGD(m.parameters(), lr=0.01), replay=replay)
    assert abs(peaks[65536] - peaks[16384]) < 32 * 1024, f"{kind}: {peaks}"


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_captured_matches_the_python_replay(name):
    batches = _rows(3)
    runs = {}
    for replay in ("python", "captured"):
        model = _mlp(dropout=0.3)
        trainer = Trainer(model, OPTIMIZERS[name](model), cross_entropy, route="fused", fused_replay=replay)
        runs[replay] = (model, trainer, [trainer.step(*batches[i % 3]).loss for i in range(6)])
    (pm, _, pl), (cm, ct, cl) = runs["python"], runs["captured"]
    _captured(ct)
    assert cl == pl
    for p, q in zip(pm.parameters(), cm.parameters()):
        np.testing.assert_array_equal(q.data, p.data)


# Regression (failed on bc501d1): the fused cross-entropy kernels validated the targets with NumPy on every call
# (target != ignore_index, the range tests, their | and &, bad.any(), counted.sum()), each an (N,) heap temporary,
# in the forward and again in the backward: a replayed step allocated 4 bytes per row outside the plan, 262 KB more
# at 131072 rows than at 65536 (the kernels alone: 262528 B and 524672 B per call); a per-token loss (B * T rows)
# makes it large. (The ViT tests' batches of 8-64 rows hide it under NumPy's ufunc buffers.) Now the Numba row
# loops check the targets and count the rows themselves (the same IndexError text).
@pytest.mark.parametrize("replay", ["python", "captured"])
def test_cross_entropy_allocates_no_batch_sized_heap_temporaries(replay):
    from tensorarena.nn import Sequential

    model = Sequential(Linear(12, 4, bias=False, rng=np.random.default_rng(0)))
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.01), cross_entropy, route="fused",
                      fused_replay=replay)
    peaks, slabs = {}, {}
    for rows in (65536, 131072):
        peaks[rows], _ = _step_peak(trainer, _rows(1, batch=rows)[0])
        slabs[rows] = trainer.fused.plan.memory.slab_bytes
        if replay == "captured":
            _captured(trainer)
    assert slabs[131072] - slabs[65536] > 8 * 32 * 1024
    assert abs(peaks[131072] - peaks[65536]) < 32 * 1024, f"heap outside the plan by batch rows: {peaks}"


MAXIMIZING = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3, maximize=True),
    "adam_amsgrad": lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=1e-3, amsgrad=True, maximize=True),
    "adamw": lambda ps: optim.AdamW(ps, lr=1e-2, maximize=True),
    "nadam": lambda ps: optim.NAdam(ps, lr=1e-2, weight_decay=1e-2, maximize=True),
    "rmsprop": lambda ps: optim.RMSprop(ps, lr=1e-3, momentum=0.9, centered=True, weight_decay=1e-3, maximize=True),
    "adagrad": lambda ps: optim.Adagrad(ps, lr=5e-2, lr_decay=1e-3, weight_decay=1e-3, maximize=True),
    "lion": lambda ps: optim.Lion(ps, lr=1e-3, weight_decay=1e-2, maximize=True),
    "lamb": lambda ps: optim.LAMB(ps, lr=1e-2, weight_decay=1e-2, maximize=True),
}


@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("name", sorted(MAXIMIZING))
def test_maximize_on_the_captured_replay_matches_eager_and_allocates_nothing(name, update):
    batches = _rows(3, dtype=np.float64)
    models = {}
    for route in ("eager", "fused"):
        model = _mlp(np.float64, dropout=0.0)
        trainer = Trainer(model, MAXIMIZING[name](model.parameters()), cross_entropy, route=route,
                          fused_replay="captured", **UPDATES[update])
        # Growing logits make tiny probabilities: clipping's underflow is its own test (below)
        with np.errstate(under="ignore"):
            losses = [trainer.step(*batches[i % 3]).loss for i in range(6)]
        models[route] = (model, losses)
    _captured(trainer)
    np.testing.assert_allclose(models["fused"][1], models["eager"][1], rtol=1e-10, atol=1e-10)
    assert models["fused"][1][3] > models["fused"][1][0]  # it maximizes (steps 0 and 3: the same batch)
    for p, q in zip(models["eager"][0].parameters(), models["fused"][0].parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=1e-10)
    with np.errstate(under="ignore"):
        peaks = _width_peaks("no_bias", lambda m: MAXIMIZING[name](m.parameters()), **UPDATES[update])
    assert abs(peaks[65536] - peaks[16384]) < 32 * 1024, f"{name}: {peaks}"


# Regression (failed on bc501d1): clip_grad_norm_ let an underflow of a tiny gradient element raise under
# np.seterr(all="raise") (the tests' setting, and what a careful user sets): its errstate ignored over and invalid
# but not under. A tiny gradient scaled to a subnormal or 0 is right (torch clips it silently). Every Trainer step
# with clip_grad_norm failed on every route once probabilities got tiny, e.g. in a model that maximizes its loss.
# Now that errstate ignores under too.
def test_clipping_a_tiny_gradient_does_not_raise_on_underflow():
    import torch

    from tensorarena.nn import Parameter

    grad = np.array([1e-38, 3.0, -4.0], np.float32)  # norm 5: scaled by 0.1, the first element goes subnormal
    p = Parameter(np.zeros(3, np.float32))
    p.grad = grad.copy()
    tp = torch.zeros(3, requires_grad=True)
    tp.grad = torch.from_numpy(grad.copy())
    want = float(torch.nn.utils.clip_grad_norm_([tp], 0.5))
    with np.errstate(all="raise"):
        got = optim.clip_grad_norm_([p], 0.5)
    assert got == pytest.approx(want, rel=1e-6)
    with np.errstate(under="ignore"):  # the comparison's rtol * |subnormal| underflows too
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), rtol=1e-6, atol=0)
    assert 0 < abs(p.grad[0]) < np.finfo(np.float32).tiny  # subnormal, as torch's


# The same regression in training (failed on bc501d1 on every route): a step whose clipped gradient has an element
# that underflows.
@pytest.mark.parametrize("route, replay", [("eager", "auto"), ("fused", "python"), ("fused", "captured")])
def test_a_clipped_step_with_a_tiny_gradient_trains_under_seterr_raise(route, replay):
    from tensorarena.nn import Parameter

    class Tiny(Module):
        def __init__(self):
            super().__init__()
            self.w = Parameter(np.ones(3, np.float32))

        def forward(self, x):
            return x * self.w  # (N, 3) logits

    # Logits (1, 1, -80), class 0: gradients (-0.5, 0.5, -80 * softmax_2 ~ -7e-34), norm ~0.707; clipped to 1e-6,
    # the third goes to ~1e-39, below float32's smallest normal.
    x = np.array([[1.0, 1.0, -80.0]], np.float32)
    model = Tiny()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route=route,
                      fused_replay=replay, clip_grad_norm=1e-6)
    with np.errstate(all="raise"):
        report = trainer.step(x, np.array([0]))
    assert report.route == ("fused" if route == "fused" else "eager")
    assert report.grad_norm == pytest.approx(0.5 ** 0.5, rel=1e-5)
