"""Bug hunt: the Trainer's public surface (evaluate, losses, on_nonfinite, StepReport, save/load) on every route,
and the nn.Module API a PyTorch user reaches for, against the eager route, torch or exact values.

20 of these 71 tests failed on 4139106, before the fixes (each under a "BUG" or "Regression" comment saying what
was wrong). With this file copied into a worktree of 4139106 (git worktree add /tmp/old 4139106), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_trainer_hunt.py`.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest
import torch

from tensorarena import kernels, nn, optim, tape
from tensorarena.models.bert import BertConfig, BertModel
from tensorarena.nn.functional import cross_entropy, mse_loss
from tensorarena.train.trainer import Trainer
from tests.mlp_cases import labelled_rows, small_mlp
from tests.test_fused import _batches, _max_param_diff, _vit

ROUTES = [("eager", "auto"), ("fused", "python"), ("fused", "captured")]
ROUTE_IDS = ["eager", "fused-python", "fused-captured"]


def _torch_mlp(model):
    """torch.nn.Sequential(Linear, ReLU, Linear) holding `model`'s weights (float64 for a sharp reference)."""
    drop = [torch.nn.Dropout(model.config.dropout)] if model.config.dropout else []
    seq = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), *drop, torch.nn.Linear(16, 4)).double()
    seq.load_state_dict({k[len("net."):]: torch.from_numpy(v.astype(np.float64))
                         for k, v in model.state_dict().items()})
    return seq


def _regression_rows(n=3, batch=16, seed=5):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 12)).astype(np.float32)
        out.append((x, (0.5 * x[:, :4] - x[:, 4:8]).astype(np.float32)))
    return out


def _trainer(model, loss_fn, route, replay, *, lr=0.1, **kw):
    opt = optim.SGD(model.parameters(), lr=lr)
    return Trainer(model, opt, loss_fn, route=route, fused_replay=replay, **kw)


# -- evaluate ----------------------------------------------------------------------------------------

def test_evaluate_uneven_batches_equals_full_batch_loss_and_accuracy():
    model = small_mlp(seed=0)
    (x, y), = labelled_rows(n=1, batch=10)
    trainer = _trainer(model, cross_entropy, "eager", "auto")
    result = trainer.evaluate(x, y, batch_size=3)  # batches of 3, 3, 3, 1
    out = _torch_mlp(model)(torch.from_numpy(x.astype(np.float64)))
    expected_loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(y)).item()
    expected_acc = float((out.argmax(-1).numpy() == y).mean())
    assert result["loss"] == pytest.approx(expected_loss, rel=1e-5, abs=1e-6)
    assert result["accuracy"] == expected_acc
    assert model.training


# Regression (fixed, efc18af): Trainer.evaluate always computes an argmax "accuracy" against the targets, so a
# regression model trained with mse_loss (float targets of shape (N, out)) crashes with "operands could not be
# broadcast together with shapes (3,) (3,4)" instead of returning the mean loss. train/trainer.py Trainer.evaluate
# (the `correct +=` line). Fix: compute accuracy only when the targets are integer class indices of shape
# outputs.shape[:-1] (else report loss only / accuracy None).
def test_evaluate_mse_regression_returns_the_torch_loss():
    model = small_mlp(seed=0)
    (x, y), = _regression_rows(n=1, batch=10)
    trainer = _trainer(model, mse_loss, "eager", "auto")
    result = trainer.evaluate(x, y, batch_size=3)
    out = _torch_mlp(model)(torch.from_numpy(x.astype(np.float64)))
    expected = torch.nn.functional.mse_loss(out, torch.from_numpy(y.astype(np.float64))).item()
    assert result["loss"] == pytest.approx(expected, rel=1e-5)


# Regression (fixed, efc18af): same cause as above for a model whose outputs are not (N, classes) logits: BERT's
# hidden states (B, T, H) against (B, T, H) regression targets crash with "shapes (2,8) (2,8,32)".
def test_evaluate_bert_hidden_states_with_mse():
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=16, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = BertModel(cfg, rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 50, (5, 8))
    target = rng.standard_normal((5, 8, 32)).astype(np.float32)
    trainer = _trainer(model, mse_loss, "eager", "auto")
    model.eval()
    expected = float(np.mean((model(ids).data.astype(np.float64) - target) ** 2))
    model.train()
    result = trainer.evaluate(ids, target, batch_size=2)  # 2, 2, 1 sequences: dropout off in eval
    assert result["loss"] == pytest.approx(expected, rel=1e-5)


# Regression (fixed, efc18af): evaluate sets model.eval() and only calls model.train() after a clean loop, not in a
# `finally`: a batch that raises (here a label out of range) leaves the model in eval mode, so dropout silently stays
# off for a user who catches the error and trains on with the model directly. train/trainer.py Trainer.evaluate. Fix:
# wrap the loop in try/finally and restore the mode the model had before (as torch users do with `was_training =
# model.training`).
def test_evaluate_restores_train_mode_after_an_error():
    model = small_mlp(seed=0, dropout=0.5)
    (x, y), = labelled_rows(n=1, batch=10)
    trainer = _trainer(model, cross_entropy, "eager", "auto")
    bad = y.copy()
    bad[7] = 9  # only 4 classes
    with pytest.raises(IndexError):
        trainer.evaluate(x, bad, batch_size=4)
    assert all(m.training for m in model.modules())


# Regression (fixed, efc18af): evaluate on no rows fails with a bare "ZeroDivisionError: float division by zero"
# (total / len(inputs)) instead of an error that says the held-out data is empty. train/trainer.py Trainer.evaluate,
# the return line. Fix: check len(inputs) == 0 up front and raise ValueError("evaluate: no rows ..."), as step() does
# for an empty batch.
def test_evaluate_on_empty_data_says_so():
    model = small_mlp(seed=0)
    (x, y), = labelled_rows(n=1, batch=4)
    trainer = _trainer(model, cross_entropy, "eager", "auto")
    with pytest.raises(ValueError, match="empty|no rows|no data"):
        trainer.evaluate(x[:0], y[:0])


def test_evaluate_is_eval_mode_and_does_not_move_the_dropout_rng():
    batches = labelled_rows(n=4)
    (xe, ye), = labelled_rows(n=1, batch=10, seed=9)

    def run(with_eval):
        model = small_mlp(seed=0, dropout=0.5)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy)
        losses = []
        for i, b in enumerate(batches):
            losses.append(trainer.step(*b).loss)
            if with_eval and i == 1:
                result = trainer.evaluate(xe, ye, batch_size=3)
                out = _torch_mlp(model).eval()(torch.from_numpy(xe.astype(np.float64)))
                expected = torch.nn.functional.cross_entropy(out, torch.from_numpy(ye)).item()
                assert result["loss"] == pytest.approx(expected, rel=1e-5)
                assert model.training
        return losses, model

    plain, m1 = run(False)
    with_eval, m2 = run(True)
    # evaluate drew nothing from the dropout generator (one draw would change every later mask: O(1) differences)
    np.testing.assert_allclose(with_eval, plain, rtol=1e-6, atol=1e-7)
    assert _max_param_diff(m1, m2) <= 1e-6


def test_evaluate_on_streaming_equals_eager(tmp_path):
    batches = _batches(3)
    xe, ye = _batches(1, batch=10, seed=7)[0]
    results = {}
    for route in ("eager", "fused", "streaming"):
        model = _vit(seed=0)
        model.pos_drop.p = 0.2
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), cross_entropy, route=route,
                          store_dir=tmp_path / route)
        for b in batches:
            trainer.step(*b)
        results[route] = trainer.evaluate(xe, ye, batch_size=4)
        assert model.training
        after = trainer.step(*batches[0]).loss  # training goes on after evaluate
        results[route]["after"] = after
    for route in ("fused", "streaming"):
        assert results[route]["accuracy"] == results["eager"]["accuracy"]
        assert results[route]["loss"] == pytest.approx(results["eager"]["loss"], rel=1e-5, abs=1e-6)
        assert results[route]["after"] == pytest.approx(results["eager"]["after"], rel=1e-5, abs=1e-6)


# -- losses through the Trainer against torch ---------------------------------------------------------

def _ignore_rows():
    """Class batches where a varying number of labels are ignore_index=1 (more ignored in later batches)."""
    out = []
    for i, (x, y) in enumerate(labelled_rows(n=3)):
        y = y.copy()
        y[: 2 + 3 * i] = -1
        out.append((x, y))
    return out


LOSSES = {
    "mse": (mse_loss, lambda o, y: torch.nn.functional.mse_loss(o, torch.from_numpy(y.astype(np.float64))),
            _regression_rows),
    "mse_sum": (functools.partial(mse_loss, reduction="sum"),
                lambda o, y: torch.nn.functional.mse_loss(o, torch.from_numpy(y.astype(np.float64)), reduction="sum"),
                _regression_rows),
    "ce_smooth": (functools.partial(cross_entropy, label_smoothing=0.1),
                  lambda o, y: torch.nn.functional.cross_entropy(o, torch.from_numpy(y), label_smoothing=0.1),
                  lambda: labelled_rows(n=3)),
    "ce_ignore": (lambda o, y: cross_entropy(o, y, ignore_index=-1),
                  lambda o, y: torch.nn.functional.cross_entropy(o, torch.from_numpy(y), ignore_index=-1),
                  _ignore_rows),
    "ce_sum": (functools.partial(cross_entropy, reduction="sum"),
               lambda o, y: torch.nn.functional.cross_entropy(o, torch.from_numpy(y), reduction="sum"),
               lambda: labelled_rows(n=3)),
}


@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize("route,replay", ROUTES, ids=ROUTE_IDS)
def test_losses_through_trainer_match_torch(loss_name, route, replay):
    ours, theirs, rows = LOSSES[loss_name]
    batches = rows()
    model = small_mlp(seed=3)
    ref = _torch_mlp(model)
    topt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.05, momentum=0.9), ours, route=route,
                      fused_replay=replay, clip_grad_norm=5.0)
    for step in range(6):
        x, y = batches[step % len(batches)]
        report = trainer.step(x, y)
        topt.zero_grad()
        tloss = theirs(ref(torch.from_numpy(x.astype(np.float64))), y)
        tloss.backward()
        tnorm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 5.0)
        topt.step()
        assert report.route == route
        assert report.loss == pytest.approx(tloss.item(), rel=2e-5, abs=1e-5), step
        assert report.grad_norm == pytest.approx(tnorm.item(), rel=2e-5, abs=1e-5), step
    got = {k: v for k, v in model.state_dict().items()}
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(got["net." + k], v.numpy(), rtol=1e-4, atol=2e-5, err_msg=k)


@pytest.mark.parametrize("loss_name", ["ce_smooth", "ce_ignore"])
def test_losses_on_streaming_equal_eager(loss_name, tmp_path):
    ours = LOSSES[loss_name][0]
    batches = _batches(3)
    if loss_name == "ce_ignore":
        batches = [(x, np.where(np.arange(len(y)) < 2 + i, -1, y)) for i, (x, y) in enumerate(batches)]
    reports, models = {}, {}
    for route in ("eager", "streaming"):
        model = _vit(seed=0)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), ours, route=route,
                          store_dir=tmp_path / route, clip_grad_norm=1.0)
        reports[route] = [trainer.step(*batches[i % 3]) for i in range(5)]
        if trainer.stream is not None:
            trainer.stream.to_memory()
        models[route] = model
    np.testing.assert_allclose([r.loss for r in reports["streaming"]], [r.loss for r in reports["eager"]],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r.grad_norm for r in reports["streaming"]], [r.grad_norm for r in reports["eager"]],
                               rtol=1e-5)
    assert _max_param_diff(models["streaming"], models["eager"]) <= 1e-5


# -- on_nonfinite="skip" -------------------------------------------------------------------------------

def _with_bad(batches, at):
    x, y = batches[0]
    bad = x.copy()
    bad[0, 0] = np.nan
    return batches[:at] + [(bad, y)] + batches[at:]


def _skip_run(route, replay, batches, *, model=None, tmp_path=None, clip=None):
    model = model if model is not None else small_mlp(seed=0)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=10)
    trainer = Trainer(model, opt, cross_entropy, scheduler=sched, route=route, fused_replay=replay,
                      on_nonfinite="skip", clip_grad_norm=clip,
                      store_dir=None if tmp_path is None else tmp_path / f"{route}-{replay}-{len(batches)}")
    with np.errstate(invalid="ignore", over="ignore"):
        reports = [trainer.step(*b) for b in batches]
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return model, opt, sched, trainer, reports


@pytest.mark.parametrize("at", [0, 2])
@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("route,replay", ROUTES, ids=ROUTE_IDS)
def test_skip_nonfinite_equals_a_run_without_the_bad_batch(route, replay, clip, at):
    good = labelled_rows(n=5)
    m_ref, opt_ref, sched_ref, _, ref = _skip_run("eager", "auto", good, clip=clip)
    model, opt, sched, trainer, reports = _skip_run(route, replay, _with_bad(good, at), clip=clip)
    assert [r.skipped for r in reports] == [i == at for i in range(6)]
    assert [r.step for r in reports] == [1, 2, 3, 4, 5, 6] and trainer.step_count == 6
    assert {r.route for r in reports} == {route}
    assert reports[at].grad_norm is None and not np.isfinite(reports[at].loss)
    kept = [r for r in reports if not r.skipped]
    np.testing.assert_allclose([r.loss for r in kept], [r.loss for r in ref], rtol=1e-5, atol=1e-6)
    assert [r.lr for r in kept] == pytest.approx([r.lr for r in ref], rel=1e-12)
    if clip is not None:
        np.testing.assert_allclose([r.grad_norm for r in kept], [r.grad_norm for r in ref], rtol=1e-5)
    assert sched.last_epoch == sched_ref.last_epoch == 5
    assert opt.param_groups[0]["lr"] == pytest.approx(opt_ref.param_groups[0]["lr"], rel=1e-12)
    assert _max_param_diff(model, m_ref) <= 1e-5
    for p, q in zip(model.parameters(), m_ref.parameters()):  # Adam's step count: 5 updates, not 6
        np.testing.assert_allclose(np.asarray(opt.state[p]["step"]), np.asarray(opt_ref.state[q]["step"]))


@pytest.mark.parametrize("clip", [None, 1.0])
def test_skip_nonfinite_on_streaming_equals_a_run_without_the_bad_batch(clip, tmp_path):
    good = _batches(4)
    m_ref, opt_ref, sched_ref, _, ref = _skip_run("eager", "auto", good, model=_vit(seed=0), clip=clip)
    model, opt, sched, trainer, reports = _skip_run("streaming", "auto", _with_bad(good, 1), model=_vit(seed=0),
                                                    tmp_path=tmp_path, clip=clip)
    assert [r.skipped for r in reports] == [False, True, False, False, False]
    assert [r.step for r in reports] == [1, 2, 3, 4, 5] and trainer.step_count == 5
    assert reports[1].grad_norm is None
    kept = [r for r in reports if not r.skipped]
    np.testing.assert_allclose([r.loss for r in kept], [r.loss for r in ref], rtol=1e-5, atol=1e-6)
    assert [r.lr for r in kept] == pytest.approx([r.lr for r in ref], rel=1e-12)
    assert sched.last_epoch == sched_ref.last_epoch == 4
    assert _max_param_diff(model, m_ref) <= 1e-5


# -- StepReport across routes ------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [None, 0.5])
def test_step_report_fields_equal_across_routes(clip, tmp_path):
    batches = _batches(3)
    runs = {}
    for route, replay in ROUTES + [("streaming", "auto")]:
        model = _vit(seed=0)
        params = list(model.parameters())
        opt = optim.AdamW([{"params": params[:4], "lr": 1e-3}, {"params": params[4:]}], lr=3e-3)
        sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=8)
        trainer = Trainer(model, opt, cross_entropy, scheduler=sched, clip_grad_norm=clip, route=route,
                          fused_replay=replay, store_dir=tmp_path / f"{route}-{replay}")
        runs[(route, replay)] = [trainer.step(*batches[i % 3]) for i in range(5)]
    eager = runs[("eager", "auto")]
    for key, reports in runs.items():
        assert [r.step for r in reports] == [1, 2, 3, 4, 5]
        assert [r.route for r in reports] == [key[0]] * 5
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in eager], rtol=1e-5, atol=1e-6)
        assert [r.lr for r in reports] == pytest.approx([r.lr for r in eager], rel=1e-12)
        if clip is None:
            assert all(r.grad_norm is None for r in reports), key
        else:
            np.testing.assert_allclose([r.grad_norm for r in reports], [r.grad_norm for r in eager], rtol=1e-5)
        assert all(r.seconds > 0 and r.rss > 0 and r.arena_high_water > 0 and not r.skipped for r in reports), key
        assert set(reports[0].as_dict()) == {"step", "loss", "route", "seconds", "arena_high_water", "rss", "lr",
                                             "grad_norm", "skipped"}


# -- save/load mid-run with a scheduler ----------------------------------------------------------------

PAIRS = [(("fused", "captured"), ("fused", "captured")), (("fused", "python"), ("eager", "auto")),
         (("eager", "auto"), ("fused", "captured")), (("streaming", "auto"), ("fused", "captured")),
         (("fused", "captured"), ("streaming", "auto"))]


@pytest.mark.parametrize("saved_on,resumed_on", PAIRS, ids=lambda p: "-".join(p))
def test_load_into_a_trainer_that_already_trained_continues_the_saved_run(saved_on, resumed_on, tmp_path):
    batches = _batches(4)
    other = _batches(2, seed=11)

    def make(route, replay, tag, seed=0):
        model = _vit(seed=seed)
        opt = optim.AdamW(model.parameters(), lr=3e-3)
        sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=10)
        return model, Trainer(model, opt, cross_entropy, scheduler=sched, route=route, fused_replay=replay,
                              clip_grad_norm=1.0, store_dir=tmp_path / tag)

    straight_model, straight = make("eager", "auto", "straight")
    expected = [straight.step(*batches[i % 4]) for i in range(8)]

    _, first = make(*saved_on, "first")
    for i in range(4):
        first.step(*batches[i % 4])
    first.save(tmp_path / "mid.safetensors")

    model, second = make(*resumed_on, "second", seed=5)
    for b in other * 2:  # plans traced, captured and optimizer state made before the load
        second.step(*b)
    second.load(tmp_path / "mid.safetensors")
    assert second.step_count == 4
    reports = [second.step(*batches[i % 4]) for i in range(4, 8)]
    assert [r.step for r in reports] == [5, 6, 7, 8]
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in expected[4:]], rtol=1e-5, atol=1e-6)
    assert [r.lr for r in reports] == pytest.approx([r.lr for r in expected[4:]], rel=1e-12)
    np.testing.assert_allclose([r.grad_norm for r in reports], [r.grad_norm for r in expected[4:]], rtol=1e-5)
    if second.stream is not None:
        second.stream.to_memory()
    assert _max_param_diff(model, straight_model) <= 1e-5


# -- nn.Module parity with torch -----------------------------------------------------------------------

class _Shared(nn.Module):
    """One Linear used twice, plus a tied parameter in a second module."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.inp = nn.Linear(4, 4, rng=rng)
        self.block = nn.Linear(4, 4, rng=rng)
        self.again = self.block
        self.out = nn.Linear(4, 4, bias=False, rng=rng)
        self.out.weight = self.inp.weight
        self.register_buffer("running", np.zeros(4, np.float32))
        self.register_buffer("scratch", np.ones(4, np.float32), persistent=False)

    def forward(self, x):
        return self.out(self.again(self.block(self.inp(x)).relu()))


class _TShared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(4, 4)
        self.block = torch.nn.Linear(4, 4)
        self.again = self.block
        self.out = torch.nn.Linear(4, 4, bias=False)
        self.out.weight = self.inp.weight
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("scratch", torch.ones(4), persistent=False)

    def forward(self, x):
        return self.out(self.again(self.block(self.inp(x)).relu()))


def test_module_names_and_state_dict_match_torch_with_shared_modules():
    ours, theirs = _Shared(), _TShared()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert len(list(ours.parameters())) == len(list(theirs.parameters())) == 4
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
    # a torch state_dict loads and gives the same outputs
    ours.load_state_dict(theirs.state_dict())
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(ours(x).data, theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_load_state_dict_strict_false_reports_keys_like_torch():
    ours, theirs = _Shared(), _TShared()
    sd_t = theirs.state_dict()
    del sd_t["block.bias"]
    sd_t["extra.weight"] = torch.zeros(2)
    sd_o = {k: v.numpy() for k, v in sd_t.items()}
    r_t = theirs.load_state_dict(sd_t, strict=False)
    r_o = ours.load_state_dict(sd_o, strict=False)
    assert sorted(r_o.missing_keys) == sorted(r_t.missing_keys)
    assert sorted(r_o.unexpected_keys) == sorted(r_t.unexpected_keys)
    np.testing.assert_array_equal(ours.inp.weight.data, sd_o["inp.weight"])
    with pytest.raises(RuntimeError, match="block.bias"):
        ours.load_state_dict(sd_o)


def test_apply_train_eval_requires_grad_and_zero_grad_like_torch():
    ours, theirs = _Shared(), _TShared()
    seen_o, seen_t = [], []
    assert ours.apply(lambda m: seen_o.append(type(m).__name__)) is ours
    theirs.apply(lambda m: seen_t.append(type(m).__name__.replace("_T", "_")))
    assert seen_o == seen_t
    assert ours.eval() is ours and not any(m.training for m in ours.modules())
    assert ours.train() is ours and all(m.training for m in ours.modules())
    assert ours.requires_grad_(False) is ours and not any(p.requires_grad for p in ours.parameters())
    ours.requires_grad_(True)
    x = np.ones((2, 4), np.float32)
    ours(x).sum().backward()
    grads = [p.grad for p in ours.parameters()]
    assert all(g is not None for g in grads)
    ours.zero_grad(set_to_none=False)
    assert all(p.grad is g and not np.any(np.asarray(g)) for p, g in zip(ours.parameters(), grads))
    ours.zero_grad()
    assert all(p.grad is None for p in ours.parameters())


@pytest.mark.parametrize("route,replay", ROUTES + [("streaming", "auto")], ids=ROUTE_IDS + ["streaming"])
def test_frozen_parameters_stay_and_the_rest_match_eager(route, replay, tmp_path):
    batches = _batches(3)

    def run(route, replay):
        model = _vit(seed=0)
        model.patch_embed.requires_grad_(False)
        model.blocks[0].requires_grad_(False)
        before = {n: p.data.copy() for n, p in model.named_parameters()}
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), cross_entropy, route=route,
                          fused_replay=replay, store_dir=tmp_path / f"{route}-{replay}")
        reports = [trainer.step(*batches[i % 3]) for i in range(4)]
        if trainer.stream is not None:
            trainer.stream.to_memory()
        return model, before, reports

    ref, _, ref_reports = run("eager", "auto")
    model, before, reports = run(route, replay)
    for n, p in model.named_parameters():
        if n.startswith(("patch_embed.", "blocks.0.")):
            np.testing.assert_array_equal(p.data, before[n], err_msg=n)
            assert not p.requires_grad
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref_reports], rtol=1e-5, atol=1e-6)
    assert _max_param_diff(model, ref) <= 1e-5


# Regression (fixed, efc18af): Trainer.step takes targets as a tuple or dict of arrays (README: `loss_fn(outputs,
# (labels, weights))`), but evaluate slices them as one array: `targets[begin:begin + batch_size]` on a tuple slices
# the tuple itself (the loss then gets every row's labels against one batch's outputs and fails), on a dict it is a
# TypeError. train/trainer.py Trainer.evaluate. Fix: slice every array leaf (compile/targets.py's flatten/unflatten,
# or a small recursive helper) before calling loss_fn; len(inputs) stays the row count.
@pytest.mark.parametrize("kind", ["tuple", "dict"])
def test_evaluate_takes_the_tuple_and_dict_targets_step_takes(kind):
    model = small_mlp(seed=0)
    (x, y), = labelled_rows(n=1, batch=10)
    w = np.linspace(0.5, 1.5, 10).astype(np.float32)

    def weighted(out, t):
        labels, weights = (t if kind == "tuple" else (t["labels"], t["weights"]))
        return (cross_entropy(out, labels, reduction="none") * weights).mean()

    targets = (y, w) if kind == "tuple" else {"labels": y, "weights": w}
    trainer = _trainer(model, weighted, "eager", "auto")
    step_targets = (y[:4], w[:4]) if kind == "tuple" else {"labels": y[:4], "weights": w[:4]}
    trainer.evaluate(x[:4], step_targets, batch_size=4)  # one batch of every row: works
    result = trainer.evaluate(x, targets, batch_size=3)
    with torch.no_grad():
        out = _torch_mlp(model)(torch.from_numpy(x.astype(np.float64)))
        per_row = torch.nn.functional.cross_entropy(out, torch.from_numpy(y), reduction="none") * torch.from_numpy(
            w.astype(np.float64))
    # batches of 3, 3, 3, 1: evaluate's row-weighted mean of batch means is the mean over rows
    assert result["loss"] == pytest.approx(per_row.mean().item(), rel=1e-5)


# Regression (fixed, efc18af): evaluate(batch_size=-1) loops over nothing and returns {"loss": 0.0, "accuracy": 0.0},
# a silently wrong result; batch_size=0 fails with Python's "range() arg 3 must not be zero", which does not name the
# argument. train/trainer.py Trainer.evaluate. Fix: raise ValueError(f"batch_size must be a positive int, got
# {batch_size}").
@pytest.mark.parametrize("batch_size", [0, -1])
def test_evaluate_rejects_a_non_positive_batch_size(batch_size):
    model = small_mlp(seed=0)
    (x, y), = labelled_rows(n=1, batch=10)
    trainer = _trainer(model, cross_entropy, "eager", "auto")
    with pytest.raises(ValueError, match="batch_size"):
        trainer.evaluate(x, y, batch_size=batch_size)


class _RunningMean(nn.Module):
    """A BatchNorm-like running statistic around another module: updated once per training forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.register_buffer("running_mean", np.zeros((), np.float64))
        self.register_buffer("num_batches_tracked", np.zeros((), np.int64))

    def forward(self, x):
        if self.training:
            self.num_batches_tracked += 1
            self.running_mean[...] = 0.9 * self.running_mean + 0.1 * float(x.data.mean())
        return self.inner(x)


# Regression: a module that updates a running statistic in forward (what torch's BatchNorm does with running_mean
# and num_batches_tracked) ended with other values on the fused and streaming routes than on eager, though the
# parameters matched: after 4 steps num_batches_tracked was 4 on eager, 5 on fused (the step-1 trace ran the
# Python forward once more, on the same batch, and kept its buffer writes: compile/step.py restored the RNGs it
# drew but not the buffers) and 8 on streaming (stream/route.py _Sweep.run recomputed every stage's forward in
# training mode in backward; 12 with clip_grad_norm's extra sweep). Checkpoints then saved those buffers.
# Fixed: the trace and the capture's checking passes snapshot the model's buffers and put them back (as the RNG
# states), so the real step's writes are the only ones kept; on streaming, stream/buffers.py notes which buffers
# each stage's real forward changed and puts them back after each recompute.
# The route planner's estimate traces the step too (route="auto", or any memory_limit): it restores the buffers
# as well (5 after 4 steps before, train/route_plan.py _trace).
@pytest.mark.parametrize("route", ["fused", "streaming", "auto", "eager-with-limit"])
def test_running_statistics_buffers_match_eager(route, tmp_path):
    batches = _batches(3)

    def run(route):
        model = _vit(seed=0)
        model.pos_drop = _RunningMean(model.pos_drop)
        limit = "8G" if route in ("auto", "eager-with-limit") else None
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), cross_entropy,
                          route=route.replace("-with-limit", ""), memory_limit=limit, store_dir=tmp_path / route)
        losses = [trainer.step(*batches[i % 3]).loss for i in range(4)]
        return model, losses

    ref, ref_losses = run("eager")
    model, losses = run(route)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    assert int(ref.pos_drop.num_batches_tracked) == 4
    assert int(model.pos_drop.num_batches_tracked) == 4
    assert float(model.pos_drop.running_mean) == pytest.approx(float(ref.pos_drop.running_mean), rel=1e-6, abs=1e-9)


# Regression: a step that ran out of memory after its forward had written a buffer was redone on streaming on
# top of that write (Trainer._step restored the generators for the redo, not the buffers): the batch counted twice.
@pytest.mark.parametrize("route", ["eager", "fused"])
def test_an_out_of_memory_redo_counts_its_batch_once_in_the_running_statistics(route, tmp_path):
    from tests.test_routes import _inject_oom

    batches = _batches(3)

    def run(route, oom_at=None):
        model = _vit(seed=0)
        model.pos_drop = _RunningMean(model.pos_drop)  # before the blocks: written before the injected failure
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), cross_entropy, route=route,
                          store_dir=tmp_path / f"{route}-{oom_at}")
        if oom_at is not None:
            _inject_oom(model, trainer, oom_at)
        reports = [trainer.step(*batches[i % 3]) for i in range(4)]
        return model, reports

    ref, _ = run("eager")
    model, reports = run(route, oom_at=2)
    assert [r.route for r in reports] == [route, "streaming", "streaming", "streaming"]
    assert int(model.pos_drop.num_batches_tracked) == int(ref.pos_drop.num_batches_tracked) == 4
    assert float(model.pos_drop.running_mean) == pytest.approx(float(ref.pos_drop.running_mean), rel=1e-6)


class _ScaledByRunningMean(_RunningMean):
    """_RunningMean whose output reads the statistic before updating it: a recomputed forward must read what the
    real one read (on streaming, the value before its update), or its gradients are of another function."""

    def forward(self, x):
        scale = 1.0 + float(self.running_mean)
        out = super().forward(x)
        return out * scale if self.training else out


# Regression (as above, with what the two fixes must also get right): clip_grad_norm's extra backward sweep on
# streaming (num_batches_tracked 12 after 4 steps before the fix), and a forward that reads its buffer before
# updating it: a streamed stage's recompute now starts from the buffers its real forward found, so the
# parameters match eager's.
@pytest.mark.parametrize("clip", [None, 0.5], ids=["no-clip", "clip"])
@pytest.mark.parametrize("route", ["fused", "streaming"])
def test_a_forward_reading_its_running_statistic_trains_as_eager(route, clip, tmp_path):
    batches = _batches(3)

    def run(route):
        model = _vit(seed=0)
        model.pos_drop = _ScaledByRunningMean(model.pos_drop)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), cross_entropy, route=route,
                          clip_grad_norm=clip, store_dir=tmp_path / route)
        losses = [trainer.step(*batches[i % 3]).loss for i in range(4)]
        if trainer.stream is not None:
            trainer.stream.to_memory()
        return model, losses

    ref, ref_losses = run("eager")
    model, losses = run(route)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    assert _max_param_diff(model, ref) <= 1e-5
    assert int(model.pos_drop.num_batches_tracked) == int(ref.pos_drop.num_batches_tracked) == 4
    assert float(model.pos_drop.running_mean) == pytest.approx(float(ref.pos_drop.running_mean), rel=1e-6, abs=1e-9)


def _update_running_mean(x, running_mean, num_batches_tracked):
    num_batches_tracked += 1
    running_mean[...] = 0.9 * running_mean + 0.1 * float(x.mean())


class _RecordedRunningMean(_RunningMean):
    """_RunningMean whose update is one call through tape.host, so a captured step records and repeats it."""

    def forward(self, x):
        if self.training:
            tape.host(_update_running_mean, x.data, self.running_mean, self.num_batches_tracked)
        return self.inner(x)


# Regression: with fused_replay="captured" forced, a running statistic updated in the module's Python (not
# through a recorded call) was never updated by the captured replay (num_batches_tracked 3 after 4 steps: the
# trace's extra update, then nothing), since the capture's checks compared the loss and gradients only. The
# capture now compares the buffers each recording pass leaves with its Python pass's and refuses a recording
# that would not write them, naming them; the plan keeps the Python replay. A write made through tape.host is
# recorded, repeated, and captured.
@pytest.mark.parametrize("module,captured", [(_RunningMean, False), (_RecordedRunningMean, True)],
                         ids=["numpy-write-refused", "recorded-write-captured"])
def test_captured_replay_updates_running_statistics_or_refuses(module, captured, caplog, tmp_path):
    batches = _batches(3)

    def run(route, replay):
        model = _vit(seed=0)
        model.pos_drop = module(model.pos_drop)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), cross_entropy, route=route,
                          fused_replay=replay)
        losses = [trainer.step(*batches[i % 3]).loss for i in range(4)]
        return model, losses, trainer

    ref, ref_losses, _ = run("eager", "auto")
    replays_before = kernels.calls[("fused_replay", "captured")]
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        model, losses, trainer = run("fused", "captured")
    capture = trainer.fused.plan.capture
    if captured:
        assert capture.tape is not None
        assert kernels.calls[("fused_replay", "captured")] - replays_before == 4
    else:
        assert capture.tape is None
        assert "writes buffers ['pos_drop.running_mean', 'pos_drop.num_batches_tracked']" in capture.note
        assert "keeps the Python replay" in caplog.text
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    assert int(model.pos_drop.num_batches_tracked) == int(ref.pos_drop.num_batches_tracked) == 4
    assert float(model.pos_drop.running_mean) == pytest.approx(float(ref.pos_drop.running_mean), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("route,replay", ROUTES[1:] + [("streaming", "auto")], ids=ROUTE_IDS[1:] + ["streaming"])
def test_freezing_mid_run_matches_eager(route, replay, tmp_path):
    batches = _batches(3)

    def run(route, replay):
        model = _vit(seed=0)
        opt = optim.AdamW(model.parameters(), lr=3e-3)
        sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=1, total_steps=8)
        trainer = Trainer(model, opt, cross_entropy, scheduler=sched, route=route, fused_replay=replay,
                          store_dir=tmp_path / f"{route}-{replay}")
        losses = [trainer.step(*batches[i % 3]).loss for i in range(2)]
        model.blocks[0].requires_grad_(False)
        losses += [trainer.step(*batches[i % 3]).loss for i in range(2, 4)]
        model.blocks[0].requires_grad_(True)
        losses += [trainer.step(*batches[i % 3]).loss for i in range(4, 6)]
        if trainer.stream is not None:
            trainer.stream.to_memory()
        return model, losses

    ref, ref_losses = run("eager", "auto")
    model, losses = run(route, replay)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    assert _max_param_diff(model, ref) <= 1e-5
