"""BERT attention masks on the streaming route: padded batches stream as they train eagerly.

Before: BertModel and SimCSE had no stream_stages(), and the stage protocol handed each stage one activation,
so a streamed BERT could not get its attention mask to the layers. Trainer(route="streaming") refused both
(StreamingUnsupportedError), `tensorarena train --model simcse --route streaming` exited, and route="auto" with
a budget fused does not fit raised MemoryError. Nothing trained with the mask dropped; nothing streamed either.
Now a stage may read side inputs (stream/stages.py SideForward): the mask and token types, computed once per
step from the batch by model.stream_inputs and read by every encoder layer and by the pooling, no gradient.

Each test compares the streamed run with the eager run on the same padded batches (rows of every length down
to one real token; float64: 1e-10, float32: 1e-5, losses and every parameter), with transformers' BertModel,
or an exact expectation (bytes in the step arena, an error's text). Tiny models: hidden 16, 3 layers.

Before the changes, 22 of its 23 tests fail on commit 36a8d855e23aeed9cd7b30ff6603faf0fbd77ac7; the other is
the premise check (a dropped mask changes the loss). Six also fail on d79847b: the five route-planner tests
(train/route_plan.py traced stages with one activation; there, one was a strict xfail) and --store-dir. To see it:
    git worktree add /tmp/base-masks 36a8d855e23aeed9cd7b30ff6603faf0fbd77ac7 && \\
        cp tests/test_streaming_masks.py /tmp/base-masks/tests/ && cd /tmp/base-masks && \\
        PYTHONPATH=/tmp/base-masks NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider \\
        tests/test_streaming_masks.py
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import optim
from tensorarena.memory.arena import Arena
from tensorarena.memory.pool import ALIGN
from tensorarena.models.bert import BertConfig, BertModel, to_hf_state_dict
from tensorarena.models.simcse import SimCSE
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.nn.transformer import mean_pool
from tensorarena.stream import Stage, StreamingUnsupportedError, model_stages
from tensorarena.stream import stages as stage_protocol  # SideForward: read in the tests, so the base runs them
from tensorarena.text import Encoding
from tensorarena.train.simcse_job import _model_loss
from tensorarena.train.trainer import Trainer

TOL = {np.float64: 1e-10, np.float32: 1e-5}
VOCAB, T = 40, 7


def _config(dtype=np.float64, dropout=0.1, layers=3):
    return BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=12, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout, dtype=dtype)


def _padded(seed, lengths=(7, 4, 1, 2, 5)):
    """An Encoding of right-padded rows ([PAD] = 0) of these lengths; a length-1 row is [CLS] alone."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(1, VOCAB, (len(lengths), T)), 0)
    types = np.where((np.arange(T) >= 3) & (mask == 1), 1, 0)  # a second segment in the long rows
    return Encoding(ids, mask, types)


BATCHES = [_padded(s) for s in range(4)]


def _simcse(dtype, seed=0, dropout=0.1):
    return SimCSE(BertModel(_config(dtype, dropout), rng=np.random.default_rng(seed)), temperature=0.05)


class BertClassifier(Module):
    """A plain BERT classifier: mean-pooled encoder output -> Linear, taking an Encoding; streamed by building on
    BertModel.encoder_stages as a user would (the head joins the last layer's stage, the pooling reads the mask)."""

    def __init__(self, config, classes=3, *, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.encoder = BertModel(config, rng=rng)
        self.head = Linear(config.hidden_size, classes, rng=rng, dtype=config.dtype)

    def forward(self, batch):
        hidden = self.encoder(batch.input_ids, attention_mask=batch.attention_mask,
                              token_type_ids=batch.token_type_ids)
        return self.head(mean_pool(hidden, batch.attention_mask))

    def stream_inputs(self, batch):
        first, side = self.encoder.encoder_inputs(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        return first, dict(side, pool_mask=batch.attention_mask)

    def stream_stages(self):
        head = lambda hidden, side: self.head(mean_pool(hidden, side["pool_mask"]))  # noqa: E731
        return self.encoder.encoder_stages(head=head, head_params=tuple(self.head.parameters()), prefix="encoder.")


def _train(route, model, batches, targets, loss_fn, tmp_path, *, clip=None):
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    trainer = Trainer(model, opt, loss_fn, route=route, clip_grad_norm=clip, store_dir=tmp_path / route)
    reports = [trainer.step(b, y) for b, y in zip(batches, targets)]
    assert {r.route for r in reports} == {route}
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return [r.loss for r in reports], model, opt


def _assert_same(eager, streamed, tol):
    (l1, m1, o1), (l2, m2, o2) = eager, streamed
    np.testing.assert_allclose(l2, l1, rtol=0, atol=tol)
    for (name, p), q in zip(m1.named_parameters(), m2.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=0, atol=tol, err_msg=name)
        for key, value in o1.state.get(p, {}).items():
            np.testing.assert_allclose(np.asarray(o2.state[q][key]), np.asarray(value), rtol=0, atol=tol,
                                       err_msg=f"{name} {key}")


# -- parity with the eager route -------------------------------------------------------------------------------
# Regression (fixed): SimCSE (and BertModel) had no stream_stages(): route="streaming" refused them, and a stage
# could not be given the attention mask. Now every layer stage and the pooling read it as a side input.
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("batch_kind", ["encoding", "input_ids"])
def test_simcse_streams_padded_batches_as_eager_trains(tmp_path, dtype, batch_kind):
    batches = BATCHES if batch_kind == "encoding" else [b.input_ids for b in BATCHES]  # ids: mask from [PAD]
    clip = 0.5 if (dtype, batch_kind) == (np.float64, "encoding") else None  # the two-sweep path too
    runs = [_train(route, _simcse(dtype), batches, [None] * 4, _model_loss, tmp_path, clip=clip)
            for route in ("eager", "streaming")]
    _assert_same(*runs, TOL[dtype])
    assert runs[0][0][-1] != runs[0][0][0]  # it trained


# Regression (fixed): a BERT classifier could not be cut into stages that get the mask (one activation per stage).
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_a_bert_classifier_streams_padded_encodings_as_eager_trains(tmp_path, dtype):
    targets = [np.array([0, 2, 1, 1, 0]), np.array([1, 0, 2, 2, 1])] * 2
    runs = [_train(route, BertClassifier(_config(dtype)), BATCHES, targets, cross_entropy, tmp_path)
            for route in ("eager", "streaming")]
    _assert_same(*runs, TOL[dtype])
    model = runs[1][1]
    assert not model.encoder.embeddings.word_embeddings.weight.data[0].any()  # [PAD]'s row: no gradient, no decay


def test_the_parity_tests_can_see_a_dropped_mask():
    """Attending to the padding changes the loss far beyond the tolerances above: the parity is not vacuous."""
    with Arena(), ta.no_grad():
        model = _simcse(np.float64, dropout=0.0)
        masked = model(BATCHES[0]).item()
        b = BATCHES[0]
        unmasked = model(Encoding(b.input_ids, np.ones_like(b.attention_mask), b.token_type_ids)).item()
        classifier = BertClassifier(_config(dropout=0.0))
        enc = classifier.encoder
        hidden_masked = enc(b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids).numpy()
        hidden_unmasked = enc(b.input_ids, token_type_ids=b.token_type_ids).numpy()
    assert abs(masked - unmasked) > 1e-4
    real = b.attention_mask[:, :, None] == 1
    assert np.abs(np.where(real, hidden_masked - hidden_unmasked, 0)).max() > 1e-3


# Regression (fixed): refused before (SimCSE had no stages).
def test_a_streamed_simcse_step_matches_transformers(tmp_path):
    """One streamed SGD step on a padded batch against transformers.BertModel + the paper's loss (float64)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    F = torch.nn.functional
    model = _simcse(np.float64, dropout=0.0)
    hf_config = transformers.BertConfig(**model.encoder.config.to_json_dict(), attn_implementation="eager")
    theirs = transformers.BertModel(hf_config, add_pooling_layer=False).double()
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in to_hf_state_dict(model.encoder).items()})
    b = BATCHES[1]
    ids, mask, types = (torch.from_numpy(np.concatenate([a, a])) for a in (b.input_ids, b.attention_mask,
                                                                          b.token_type_ids))
    hidden = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    m = mask[:, :, None].double()
    z = F.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)
    n = len(b.input_ids)
    ref = F.cross_entropy(z[:n] @ z[n:].T / 0.05, torch.arange(n))
    ref.backward()
    lr = 0.5
    with torch.no_grad():
        for p in theirs.parameters():
            p -= lr * p.grad
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=lr), _model_loss, route="streaming",
                      store_dir=tmp_path / "store")
    loss = trainer.step(b, None).loss
    trainer.stream.to_memory()
    np.testing.assert_allclose(loss, ref.item(), rtol=1e-10)
    ours = to_hf_state_dict(model.encoder)
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(ours[name], p.detach().numpy(), rtol=0, atol=1e-10, err_msg=name)


# -- checkpoints, resume, predict -------------------------------------------------------------------------------
# Regression (fixed): refused before; now the store and a checkpoint resume a masked run.
def test_a_streamed_simcse_checkpoint_and_store_resume_go_on_as_eager(tmp_path):
    batches = BATCHES * 2
    eager = _train("eager", _simcse(np.float64), batches, [None] * 8, _model_loss, tmp_path)

    def streamer(seed, store):
        model = _simcse(np.float64, seed=seed)
        opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        return Trainer(model, opt, _model_loss, route="streaming", store_dir=tmp_path / store), model, opt

    first, _, _ = streamer(0, "a")
    losses = [first.step(b, None).loss for b in batches[:3]]
    first.save(tmp_path / "step3.ckpt")
    losses += [first.step(batches[3], None).loss]
    first.stream.close()
    # the store itself resumed by a new trainer (another init: everything comes from the store) ...
    again, _, _ = streamer(5, "a")
    losses_store = losses + [again.step(b, None).loss for b in batches[4:]]
    # ... and the checkpoint of step 3 loaded into a new store
    loaded, model, opt = streamer(7, "b")
    loaded.load(tmp_path / "step3.ckpt")
    losses_ckpt = losses[:3] + [loaded.step(b, None).loss for b in batches[3:]]
    loaded.stream.to_memory()
    np.testing.assert_allclose(losses_store, eager[0], rtol=0, atol=1e-10)
    _assert_same(eager, (losses_ckpt, model, opt), 1e-10)


# Regression (fixed): predict handed stage 0 the batch alone; stages reading the mask get it there too.
def test_predict_streams_with_the_mask_as_the_eval_forward(tmp_path):
    model = BertClassifier(_config())
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="streaming",
                      store_dir=tmp_path / "store")
    trainer.step(BATCHES[0], np.array([0, 1, 2, 0, 1]))
    got = trainer.stream.predict(BATCHES[2])
    trainer.stream.to_memory()
    model.eval()
    with Arena(), ta.no_grad():
        want = model(BATCHES[2]).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# -- memory ------------------------------------------------------------------------------------------------------
def _padded_bytes(nbytes):
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


# Regression (fixed): new accounting: the side inputs' bytes are part of the step arena and reported.
def test_the_side_inputs_are_counted_in_the_step_arena_and_do_not_grow(tmp_path):
    """The step arena holds exactly the side inputs, the kept boundary activations and two gradient buffers."""
    model = _simcse(np.float32)
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-3), _model_loss, route="streaming",
                      store_dir=tmp_path / "store")
    stats = []
    for b in BATCHES:
        trainer.step(b, None)
        stats.append(trainer.stream.last_stats)
    with Arena() as arena, ta.no_grad():  # what stream_inputs allocates for one batch, measured on its own
        model.stream_inputs(BATCHES[0])
        side = arena.stats.high_water
    B2, H = 2 * len(BATCHES[0].input_ids), 16
    boundary = _padded_bytes(B2 * T * H * 4)  # (2B, T, H) float32, kept by all stages but the last
    n_stages = 1 + 3
    assert side > 0 and {s.side_input_bytes for s in stats} == {side}
    assert {s.step_arena_high_water for s in stats} == {side + (n_stages - 1) * boundary + 2 * boundary}


# -- refusals -------------------------------------------------------------------------------------------------
class _TinyEncoder(Module):
    """An encoder with BERT's call signature but no stages."""

    def __init__(self):
        super().__init__()
        self.emb = ta.nn.Embedding(VOCAB, 8, rng=np.random.default_rng(0))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.emb(input_ids)


# Regression (fixed): the refusal said SimCSE has no stream_stages(); now it names the encoder that has none.
def test_simcse_over_an_encoder_without_stages_is_refused_naming_why(tmp_path):
    model = SimCSE(_TinyEncoder())
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), _model_loss, route="streaming",
                      store_dir=tmp_path / "store")
    with pytest.raises(StreamingUnsupportedError, match="_TinyEncoder.*encoder_stages"):
        trainer.step(BATCHES[0], None)
    assert not list((tmp_path / "store").glob("stage-*"))
    assert np.isfinite(Trainer(model, trainer.optimizer, _model_loss).step(BATCHES[0], None).loss)


# Regression (fixed): refused before; a batch stream_inputs rejects fails before any stage changes, and the run goes on.
def test_a_batch_simcse_rejects_changes_nothing_and_the_run_goes_on(tmp_path):
    eager = _train("eager", _simcse(np.float64), BATCHES[:2], [None] * 2, _model_loss, tmp_path)
    model = _simcse(np.float64)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    trainer = Trainer(model, opt, _model_loss, route="streaming", store_dir=tmp_path / "store")
    losses = [trainer.step(BATCHES[0], None).loss]
    with pytest.raises(ValueError, match="at least 2 sentences"):
        trainer.step(BATCHES[1][:1], None)
    losses.append(trainer.step(BATCHES[1], None).loss)
    trainer.stream.to_memory()
    assert trainer.step_count == 2
    _assert_same(eager, (losses, model, opt), 1e-10)


# Regression (fixed): new protocol: a mask-reading stage refuses to run unmasked.
def test_a_stage_reading_the_mask_is_never_run_without_it():
    """A caller that hands a mask-reading stage one activation gets an error, not an unmasked result."""
    model = _simcse(np.float64)
    stages = model_stages(model)
    assert all(isinstance(s.forward, stage_protocol.SideForward) for s in stages)
    with Arena(), pytest.raises(StreamingUnsupportedError, match="attention mask"):
        stages[1].forward(ta.Tensor(np.zeros((10, T, 16))))


def test_stages_reading_side_inputs_need_stream_inputs():
    class NoInputs(Module):
        def __init__(self):
            super().__init__()
            self.lin = Linear(2, 2, rng=np.random.default_rng(0))

        def forward(self, x):
            return self.lin(x)

        def stream_stages(self):
            forward = stage_protocol.SideForward(lambda x, side: self.lin(x))
            return [Stage("lin", tuple(self.lin.parameters()), forward)]

    with pytest.raises(StreamingUnsupportedError, match="stream_inputs"):
        model_stages(NoInputs())


# -- the command line and route="auto" ----------------------------------------------------------------------
# Regression (fixed): `--route streaming` exited for simcse (no stream_stages()).
def test_simcse_cli_takes_route_streaming():
    from tensorarena.train.simcse_job import _check_args

    _check_args(SimpleNamespace(steps=1, batch_size=4, seq_len=8, temperature=0.05, resume=None, route="streaming"))


# Regression (fixed): cli.py's MODEL_OPTIONS gave --store-dir to mlp and vit only, so `--model simcse --route
# streaming --store-dir DIR` exited ("does not apply to --model simcse") though the job streams into it; and the
# --route help said "simcse has no streaming route".
def test_simcse_cli_takes_store_dir_and_the_route_help_says_it_streams():
    from tensorarena.cli import build_parser, check_model_options

    check_model_options("simcse", {"route", "store_dir"})  # raised SystemExit
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    route_help = next(a.help for a in train._actions if a.dest == "route")
    assert "no streaming" not in route_help and "else streaming" in route_help, route_help


# Regression (fixed): train/route_plan.py trace_stages called each stage with one activation, so every SideForward
# stage raised, the plan said "streaming: not possible" and route="auto" never streamed BERT or SimCSE. Now the
# stages are traced with stream_inputs' side inputs, whose bytes are their own part of the estimate.
@pytest.mark.parametrize("clip", [None, 0.5], ids=["no-clip", "clip"])
def test_the_route_planner_estimates_streaming_for_simcse(tmp_path, clip):
    """As for ViT (tests/test_streaming_hunt.py): the planned streaming activations (one stage's slab, boundary
    activations and gradients, side inputs) equal the step's measured transient peak exactly."""
    model = _simcse(np.float32)
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-3), _model_loss, route="streaming",
                      clip_grad_norm=clip, store_dir=tmp_path / "store")
    plan = trainer.plan(BATCHES[0].input_ids, None, routes=("streaming",))
    assert "streaming" in plan.estimates, plan.unavailable
    parts = plan.estimates["streaming"].parts
    for b in BATCHES[:2]:
        trainer.step(b.input_ids, None)
    stats = trainer.stream.last_stats
    assert parts["side inputs (attention mask)"] == stats.side_input_bytes > 0
    assert parts["activations (one stage)"] == stats.stage_arena_high_water
    planned = sum(parts[k] for k in ("side inputs (attention mask)", "activations (one stage)",
                                     "boundary activations", "boundary gradients"))
    assert planned == stats.arena_high_water, (planned, stats.arena_high_water)
    assert "side inputs (attention mask)" in plan.format()


# With stages, the planner traces SimCSE stage by stage for every route; the stage traces start after the side
# inputs, which the eager and fused forward compute too, so they are a part of those estimates as well.
@pytest.mark.parametrize("rows", [5, 42])
def test_the_staged_fused_estimate_of_simcse_counts_the_side_inputs_and_is_within_the_bar(rows):
    """The -3%..+5% bar of tests/test_routes.py for stage-traced fused estimates, against compile_step's real slab."""
    from tensorarena.compile.step import compile_step
    from tensorarena.memory.budget import MemoryBudget
    from tensorarena.train.route_plan import plan_routes

    x = _padded(5, lengths=tuple(range(1, T + 1)) * 6).input_ids if rows == 42 else BATCHES[0].input_ids
    model = _simcse(np.float32)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    plan = plan_routes(model, opt, _model_loss, x, None, MemoryBudget(1 << 40, "test"), routes=("fused", "eager"),
                       fused_keeps_grads=True, process_other_bytes=0)
    assert plan.activation_source.startswith("traced stage by stage")
    parts = plan.estimates["fused"].parts
    with Arena() as arena, ta.no_grad():
        kept = model.stream_inputs(x)  # ids given: the mask is made from [PAD], its temporaries freed
        side = arena.stats.bytes_in_use
        del kept
    assert parts["side inputs (attention mask)"] == plan.estimates["eager"].parts["side inputs (attention mask)"]
    assert parts["side inputs (attention mask)"] == side
    real = compile_step(model, _model_loss, opt, (x, None), update_in_backward=False).memory_report()["slab"]
    estimate = parts["activations (slab)"] + parts["side inputs (attention mask)"]
    assert -0.03 * real <= estimate - real <= 0.05 * real, (estimate, real)


# Regression (fixed): with the planner unable to trace SimCSE's stages, route="auto" under a budget fused does not
# fit raised MemoryError ("streaming is not possible"); now it picks streaming and trains as eager does.
def test_auto_streams_simcse_when_fused_does_not_fit(tmp_path):
    # 6 layers, 48 rows (96 stacked): fused's activations (every layer's) exceed streaming's (one layer's) by MiBs,
    # far more than the process's RSS (part of each plan) moves between the probe's plan and the trainer's.
    batches = [_padded(s, lengths=tuple(range(1, T + 1)) * 6 + (T,) * 6).input_ids for s in range(3)]

    def simcse():
        return SimCSE(BertModel(_config(np.float64, layers=6), rng=np.random.default_rng(0)), temperature=0.05)

    eager = _train("eager", simcse(), batches, [None] * 3, _model_loss, tmp_path)
    probe = simcse()
    plan = Trainer(probe, optim.AdamW(probe.parameters(), lr=1e-2, weight_decay=0.01), _model_loss).plan(
        batches[0], None, routes=("fused", "streaming"))
    fused, streaming = (plan.estimates[r].required for r in ("fused", "streaming"))
    assert fused - streaming > 3 << 20, plan.format()
    model = simcse()
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    trainer = Trainer(model, opt, _model_loss, route="auto", memory_limit=(streaming + fused) // 2,
                      store_dir=tmp_path / "auto")
    reports = [trainer.step(b, None) for b in batches]
    assert {r.route for r in reports} == {"streaming"}, trainer.route_plan.format()
    trainer.stream.to_memory()
    _assert_same(eager, ([r.loss for r in reports], model, opt), TOL[np.float64])


# Regression (fixed): refused before; the job now brings the streamed state back for the probe and --save.
def test_simcse_cli_streams_minilm_as_eager_trains_it(tmp_path):
    """`tensorarena train --model simcse --route streaming` (small sizes) against --route eager: the same step
    losses, probe and saved weights (the streamed parameters come back into memory for the probe and --save)."""
    pytest.importorskip("tokenizers")
    from safetensors.numpy import load_file

    from tensorarena.cli import main
    from tensorarena.text import locate_minilm

    try:
        locate_minilm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    runs = {}
    for route in ("eager", "streaming"):
        out = tmp_path / route
        assert main(["train", "--model", "simcse", "--route", route, "--steps", "2", "--batch-size", "3",
                     "--seq-len", "12", "--no-progress", "--save",
                     str(out / "model"), "--json", str(out / "summary.json")]) == 0
        runs[route] = json.loads((out / "summary.json").read_text()), load_file(str(out / "model" /
                                                                                    "model.safetensors"))
    (eager, w1), (streamed, w2) = runs["eager"], runs["streaming"]
    assert streamed["route"] == "streaming" and eager["route"] == "eager"
    # InfoNCE of a pretrained encoder is ~1e-5: relative tolerances
    np.testing.assert_allclose(streamed["step_losses"], eager["step_losses"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(streamed["probe_loss_after"], eager["probe_loss_after"], rtol=1e-5, atol=0)
    assert w1.keys() == w2.keys()
    for name in w1:
        np.testing.assert_allclose(w2[name], w1[name], rtol=0, atol=1e-5, err_msg=name)
