"""Dtypes and float32 matmul precision across the eager, fused (python and captured replays) and streaming routes.

References: torch in float64 (MLP, ViT), the eager route (Lion, LAMB, bfloat16 products), or exact values.

Written by a bug hunt: 17 of its 149 tests failed on commit 4139106 (each failing test has a comment above it
naming the bug). To see it:
    git worktree add /tmp/old 4139106 && cp tests/test_precision_hunt.py /tmp/old/tests/
    cd /tmp/old && NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_precision_hunt.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import kernels, optim
from tensorarena.kernels import gemm_bf16
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

from test_vit_bert_parity import TorchViT

F32, F64 = np.float32, np.float64
STEPS = 20
ROUTES = ["eager", "python", "captured"]  # "python"/"captured": route="fused" with that replay
needs_bf16_gemm = pytest.mark.skipif(not gemm_bf16.available(), reason="no fast bfloat16 GEMM")


def _trainer(model, opt, route, *, clip=None, tmp_path=None, **kw):
    if route in ("python", "captured"):
        kw.update(route="fused", fused_replay=route)
    else:
        kw.update(route=route)
    if route == "streaming":
        kw["store_dir"] = tmp_path / "store"
    return Trainer(model, opt, cross_entropy, clip_grad_norm=clip, **kw)


def _replays():
    return kernels.calls[("fused_replay", "captured")], kernels.calls[("fused_replay", "python")]


def _assert_route_ran(route, trainer, reports, before):
    """The route asked for really trained every step (a silent fallback would make any parity test vacuous)."""
    want = {"python": "fused", "captured": "fused"}.get(route, route)
    assert [r.route for r in reports] == [want] * len(reports)
    captured, python = (a - b for a, b in zip(_replays(), before))
    if route == "captured":
        assert captured >= len(reports) - 2, (captured, python)  # two checking steps may run the Python replay
    if route == "python":
        assert captured == 0 and python == len(reports)


def _max_diff(a, b) -> float:
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


# -- (1) float64 MLP against torch in float64 ------------------------------------------------------

def _mlp(dtype=F64, seed=0):
    return MLP(MLPConfig(in_features=12, hidden=(16,), out_features=4, dtype=dtype), rng=np.random.default_rng(seed))


def _mlp_batches(dtype=F64, n=4, batch=16, seed=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 12)).astype(dtype), rng.integers(0, 4, batch)) for _ in range(n)]


def _torch_mlp(model):
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    net.load_state_dict({k[len("net."):]: torch.tensor(np.asarray(v), dtype=torch.float64)
                         for k, v in model.state_dict().items()})
    return net


# name -> (tensorarena optimizer, torch optimizer), same hyperparameters
TORCH_OPTIMIZERS = {
    "sgd": (lambda p: optim.SGD(p, lr=0.1, weight_decay=1e-3),
            lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=1e-3)),
    "momentum": (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1),
                 lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1)),
    "nesterov": (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
                 lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "adam": (lambda p: optim.Adam(p, lr=1e-2, weight_decay=1e-3),
             lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3)),
    "adamw": (lambda p: optim.AdamW(p, lr=1e-2, weight_decay=0.05),
              lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05)),
    "amsgrad": (lambda p: optim.Adam(p, lr=1e-2, amsgrad=True),
                lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True)),
    "nadam": (lambda p: optim.NAdam(p, lr=1e-2, weight_decay=1e-3),
              lambda p: torch.optim.NAdam(p, lr=1e-2, weight_decay=1e-3)),
    "rmsprop": (lambda p: optim.RMSprop(p, lr=1e-3, momentum=0.9, centered=True),
                lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9, centered=True)),
    "adagrad": (lambda p: optim.Adagrad(p, lr=5e-2, lr_decay=1e-3, initial_accumulator_value=0.1),
                lambda p: torch.optim.Adagrad(p, lr=5e-2, lr_decay=1e-3, initial_accumulator_value=0.1)),
}


def _torch_run(model, make_torch_opt, batches, steps, clip):
    # torch keeps optimizer scalars (NAdam's mu_product, step) in the default dtype: float32 unless set, which
    # rounds mu_product and puts torch 6e-10 off the exact float64 update tensorarena makes. The default dtype
    # float64 gives torch's own float64 arithmetic everywhere (checked: tensorarena then agrees to 1e-16).
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return _torch_steps(model, make_torch_opt, batches, steps, clip)
    finally:
        torch.set_default_dtype(saved)


def _torch_steps(model, make_torch_opt, batches, steps, clip):
    net = _torch_mlp(model)
    opt = make_torch_opt(net.parameters())
    losses = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return [p.detach().numpy() for p in net.parameters()], losses


@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(TORCH_OPTIMIZERS))
def test_float64_mlp_matches_torch_float64_on_every_route(name, route, clip):
    batches = _mlp_batches()
    make, make_torch = TORCH_OPTIMIZERS[name]
    want, want_losses = _torch_run(_mlp(), make_torch, batches, STEPS, clip)
    model = _mlp()
    trainer = _trainer(model, make(model.parameters()), route, clip=clip)
    before = _replays()
    reports = [trainer.step(*batches[i % len(batches)]) for i in range(STEPS)]
    _assert_route_ran(route, trainer, reports, before)
    assert all(p.dtype == F64 for p in model.parameters())
    assert _max_diff([p.data for p in model.parameters()], want) <= 1e-10, name
    np.testing.assert_allclose([r.loss for r in reports], want_losses, rtol=0, atol=1e-10)
    # The check can fail: training moved the parameters by far more than the tolerance.
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in _mlp().parameters()]) > 1e-3


EAGER_ONLY = {
    "lion": lambda p: optim.Lion(p, lr=1e-3, weight_decay=1e-2),
    "lamb": lambda p: optim.LAMB(p, lr=1e-2, weight_decay=1e-2),
}


@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip"])
@pytest.mark.parametrize("route", ["python", "captured"])
@pytest.mark.parametrize("name", sorted(EAGER_ONLY))
def test_float64_mlp_lion_and_lamb_fused_match_eager(name, route, clip):
    batches = _mlp_batches()
    eager = _mlp()
    et = _trainer(eager, EAGER_ONLY[name](eager.parameters()), "eager", clip=clip)
    er = [et.step(*batches[i % len(batches)]) for i in range(STEPS)]
    model = _mlp()
    trainer = _trainer(model, EAGER_ONLY[name](model.parameters()), route, clip=clip)
    before = _replays()
    reports = [trainer.step(*batches[i % len(batches)]) for i in range(STEPS)]
    _assert_route_ran(route, trainer, reports, before)
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in eager.parameters()]) <= 1e-10
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in er], rtol=0, atol=1e-10)
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in _mlp().parameters()]) > 1e-3


# -- (1) float64 ViT against torch in float64 ------------------------------------------------------

def _vit_config(dtype=F64):
    return ViTConfig(image_size=16, patch_size=4, num_classes=4, dim=32, depth=2, num_heads=4, dtype=dtype)


def _vit(dtype=F64, seed=0):
    model = ViT(_vit_config(dtype), rng=np.random.default_rng(seed))
    model.cls_token.data[...] = np.random.default_rng(7).normal(0, 0.02, model.cls_token.shape)  # not all zero
    return model


def _vit_batches(dtype=F64, n=4, batch=4, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(dtype)
        out.append((x, (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)))
    return out


VIT_ROUTES = ["eager", "python", "captured", "streaming"]


@pytest.mark.parametrize("clip", [None, 1.0], ids=["noclip", "clip"])
@pytest.mark.parametrize("route", VIT_ROUTES)
def test_float64_vit_sgd_momentum_matches_torch_float64_on_every_route(route, clip, tmp_path):
    # SGD, not Adam, against torch: the key bias's gradient is 0 in exact arithmetic and rounding noise in
    # practice, which Adam's g / sqrt(v) would blow up to lr-sized steps of random sign on either side.
    batches = _vit_batches()
    ref = TorchViT(_vit_config()).double()
    ref.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in _vit().state_dict().items()})
    topt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    want_losses = []
    for i in range(STEPS):
        x, y = batches[i % len(batches)]
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        topt.step()
        want_losses.append(loss.item())
    model = _vit()
    trainer = _trainer(model, optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4), route,
                       clip=clip, tmp_path=tmp_path)
    before = _replays()
    reports = [trainer.step(*batches[i % len(batches)]) for i in range(STEPS)]
    _assert_route_ran(route, trainer, reports, before)
    if trainer.stream is not None:
        trainer.stream.to_memory()
    theirs = dict(ref.named_parameters())
    diff = {n: float(np.abs(p.data - theirs[n].detach().numpy()).max()) for n, p in model.named_parameters()}
    assert max(diff.values()) <= 1e-10, sorted(diff.items(), key=lambda kv: -kv[1])[:3]
    np.testing.assert_allclose([r.loss for r in reports], want_losses, rtol=0, atol=1e-10)
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in _vit().parameters()]) > 1e-3  # it trained


@pytest.mark.parametrize("route", ["python", "captured", "streaming"])
def test_float64_vit_adamw_with_clipping_matches_eager(route, tmp_path):
    batches = _vit_batches()
    eager = _vit()
    et = _trainer(eager, optim.AdamW(eager.parameters(), lr=3e-3), "eager", clip=1.0)
    er = [et.step(*batches[i % len(batches)]) for i in range(STEPS)]
    model = _vit()
    trainer = _trainer(model, optim.AdamW(model.parameters(), lr=3e-3), route, clip=1.0, tmp_path=tmp_path)
    before = _replays()
    reports = [trainer.step(*batches[i % len(batches)]) for i in range(STEPS)]
    _assert_route_ran(route, trainer, reports, before)
    if trainer.stream is not None:
        trainer.stream.to_memory()
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in eager.parameters()]) <= 1e-10
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in er], rtol=0, atol=1e-10)
    np.testing.assert_allclose([r.grad_norm for r in reports], [r.grad_norm for r in er], rtol=1e-10)


# -- (2) float32 products in bfloat16 ----------------------------------------------------------------

def _bf16_products() -> int:
    return kernels.calls[("gemm_bf16", "fused")] + kernels.calls[("gemm_bf16", "reference")]


def _bf16_run(kind, route, tmp_path, *, precision, switch_to=None, switch_at=3, steps=6, dtype=F32):
    """Train `kind` ("mlp"/"vit") with AdamW; optionally set trainer.matmul_precision between steps. Returns the
    parameters, the losses and the bfloat16 products each step ran."""
    model = _mlp(dtype) if kind == "mlp" else _vit(dtype)
    batches = _mlp_batches(dtype) if kind == "mlp" else _vit_batches(dtype)
    trainer = _trainer(model, optim.AdamW(model.parameters(), lr=1e-2), route, tmp_path=tmp_path / route,
                       matmul_precision=precision)
    losses, counts = [], []
    for i in range(steps):
        if switch_to is not None and i == switch_at:
            trainer.matmul_precision = switch_to
        before = _bf16_products()
        losses.append(trainer.step(*batches[i % len(batches)]).loss)
        counts.append(_bf16_products() - before)
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return [p.data.copy() for p in model.parameters()], losses, counts


@needs_bf16_gemm
@pytest.mark.parametrize("kind,route", [("mlp", "python"), ("mlp", "captured"), ("vit", "python"),
                                        ("vit", "captured"), ("vit", "streaming")])
def test_bf16_products_give_bit_identical_training_on_every_route(kind, route, tmp_path):
    # The same kernels (the rounding kernel, MKL's bf16 GEMM) on the same operands: bit for bit, tolerance 0.
    want, want_losses, want_counts = _bf16_run(kind, "eager", tmp_path, precision="bfloat16")
    got, losses, counts = _bf16_run(kind, route, tmp_path, precision="bfloat16")
    assert all(c > 0 for c in want_counts[1:]) and all(c > 0 for c in counts[1:])
    assert _max_diff(got, want) == 0.0
    assert losses == want_losses
    # The check can fail: float32 products give other parameters.
    f32, _, f32_counts = _bf16_run(kind, "eager", tmp_path, precision="float32")
    assert sum(f32_counts) == 0 and _max_diff(f32, want) > 1e-4


# Regression (failed on 4139106): trainer.matmul_precision set between steps took effect on the eager and streaming
# routes (Trainer.step enters float32_matmul_precision(self.matmul_precision) each step) but the fused route silently
# kept the precision its FusedStep was built with, on both replays: float32 -> bfloat16 ran no bfloat16 product at
# all, bfloat16 -> float32 kept rounding. Now Trainer.matmul_precision is a property passing the value to the
# FusedStep, whose plans are keyed by it.
@needs_bf16_gemm
@pytest.mark.parametrize("start,switch_to", [("float32", "bfloat16"), ("bfloat16", "float32")])
@pytest.mark.parametrize("route", ["python", "captured", "streaming"])
def test_changing_trainer_matmul_precision_between_steps_takes_effect_like_eager(route, start, switch_to, tmp_path):
    kind = "vit" if route == "streaming" else "mlp"
    want, want_losses, want_counts = _bf16_run(kind, "eager", tmp_path, precision=start, switch_to=switch_to)
    assert [c > 0 for c in want_counts] == [start == "bfloat16"] * 3 + [switch_to == "bfloat16"] * 3
    got, losses, counts = _bf16_run(kind, route, tmp_path, precision=start, switch_to=switch_to)
    assert [c > 0 for c in counts[1:]] == [c > 0 for c in want_counts[1:]], counts
    assert _max_diff(got, want) <= 1e-6  # bit-identical kernels (previous test); 1e-6 only as a margin
    np.testing.assert_allclose(losses, want_losses, rtol=0, atol=1e-6)


@needs_bf16_gemm
@pytest.mark.parametrize("replay", ["python", "captured"])
def test_fused_step_matmul_precision_set_between_steps_retraces_and_switching_back_finds_the_first_plan(replay):
    # The FusedStep side of the test above, without the Trainer: a set precision takes effect at the next step,
    # each precision has its own plan, and a name the precision module does not know is refused at once.
    model, batches = _mlp(F32), _mlp_batches(F32)
    fused = ta.compile.compile_step(model, cross_entropy, optim.AdamW(model.parameters(), lr=1e-2), batches[0],
                                    matmul_precision="highest", replay=replay)
    assert fused.matmul_precision == "float32"
    counts = []
    for i, precision in enumerate(["float32", "medium", "medium", "highest", "bfloat16"]):
        fused.matmul_precision = precision
        before = _bf16_products()
        fused.step(*batches[i % len(batches)], index=i + 1)
        counts.append(_bf16_products() - before)
    assert [c > 0 for c in counts] == [False, True, True, False, True], counts
    assert fused.traces == 2 and {p.matmul_precision for p in fused.plans.values()} == {"float32", "bfloat16"}
    with pytest.raises(ValueError, match="'half'"):
        fused.matmul_precision = "half"
    assert fused.matmul_precision == "bfloat16"


@needs_bf16_gemm
@pytest.mark.parametrize("route", ["python", "captured"])
def test_process_default_changed_between_steps_is_ignored_alike_on_eager_and_fused(route, tmp_path):
    # Documented (Trainer's matmul_precision): the trainer keeps the thread's setting from when it was built, so
    # set_float32_matmul_precision between steps changes neither route; what matters is that both agree.
    results = {}
    for r in ("eager", route):
        model, batches = _mlp(F32), _mlp_batches(F32)
        trainer = _trainer(model, optim.AdamW(model.parameters(), lr=1e-2), r)
        before = _bf16_products()
        try:
            for i in range(6):
                if i == 3:
                    ta.set_float32_matmul_precision("bfloat16")
                trainer.step(*batches[i % len(batches)])
        finally:
            ta.set_float32_matmul_precision("float32")
        assert _bf16_products() == before
        results[r] = [p.data.copy() for p in model.parameters()]
    assert _max_diff(results["eager"], results[route]) == 0.0


@needs_bf16_gemm
@pytest.mark.parametrize("route", ["eager", "python", "captured"])
def test_trainer_built_inside_the_context_manager_keeps_bfloat16_after_it(route, tmp_path):
    want = _bf16_run("mlp", "eager", tmp_path, precision="bfloat16")[0]
    model, batches = _mlp(F32), _mlp_batches(F32)
    with ta.float32_matmul_precision("medium"):
        trainer = _trainer(model, optim.AdamW(model.parameters(), lr=1e-2), route)
    assert ta.get_float32_matmul_precision() == "float32" and trainer.matmul_precision == "bfloat16"
    before = _bf16_products()
    for i in range(6):
        trainer.step(*batches[i % len(batches)])
    assert _bf16_products() - before >= 6 * 5
    assert _max_diff([p.data for p in model.parameters()], want) == 0.0


@needs_bf16_gemm
@pytest.mark.parametrize("route", ["python", "captured"])
def test_float64_model_under_bfloat16_precision_is_never_rounded_on_the_fused_route(route, tmp_path):
    want = _bf16_run("mlp", "eager", tmp_path, precision="float32", dtype=F64)[0]
    before = _bf16_products()
    got = _bf16_run("mlp", route, tmp_path, precision="bfloat16", dtype=F64)[0]
    assert _bf16_products() == before
    assert _max_diff(got, want) == 0.0


# -- (3) batches of another dtype ------------------------------------------------------------------------

MISMATCHED = [(F32, np.float64), (F64, np.float32), (F32, np.int64), (F32, np.int32), (F32, np.bool_)]


def _route_model(route, dtype):
    return (_vit(dtype), _vit_batches) if route == "streaming" else (_mlp(dtype), _mlp_batches)


@pytest.mark.parametrize("model_dtype,batch_dtype", MISMATCHED,
                         ids=[f"{np.dtype(m).name}-model-{np.dtype(b).name}-batch" for m, b in MISMATCHED])
@pytest.mark.parametrize("route", ["eager", "python", "captured", "streaming"])
def test_a_batch_of_another_dtype_is_a_clear_error_and_loses_nothing(route, model_dtype, batch_dtype, tmp_path):
    model, make_batches = _route_model(route, model_dtype)
    good = make_batches(model_dtype)
    trainer = _trainer(model, optim.AdamW(model.parameters(), lr=1e-2), route, tmp_path=tmp_path)
    trainer.step(*good[0])  # a plan / a store exists: the bad batch comes mid-run
    if trainer.stream is not None:
        trainer.stream.to_memory()
    before = [p.data.copy() for p in model.parameters()]
    x, y = good[1]
    with pytest.raises(TypeError, match=f"input is {np.dtype(batch_dtype).name} but the weight is "
                                        f"{np.dtype(model_dtype).name}"):
        trainer.step((x * 3).astype(batch_dtype), y)
    if trainer.stream is not None:
        trainer.stream.to_memory()
    assert _max_diff([p.data for p in model.parameters()], before) == 0.0
    assert trainer.step_count == 1
    # Training goes on as an unbroken eager run on the good batches.
    for b in good[1:3]:
        trainer.step(*b)
    if trainer.stream is not None:
        trainer.stream.to_memory()
    ref, _ = _route_model(route, model_dtype)
    rt = _trainer(ref, optim.AdamW(ref.parameters(), lr=1e-2), "eager")
    for b in good[:3]:
        rt.step(*b)
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in ref.parameters()]) <= 1e-6


@pytest.mark.parametrize("route", ["eager", "python", "captured", "streaming"])
def test_a_float16_batch_trains_a_float32_model_like_its_float32_cast(route, tmp_path):
    model, make_batches = _route_model(route, F32)
    batches = make_batches(F32)
    trainer = _trainer(model, optim.AdamW(model.parameters(), lr=1e-2), route, tmp_path=tmp_path)
    losses = [trainer.step(x.astype(np.float16), y).loss for x, y in batches]
    if trainer.stream is not None:
        trainer.stream.to_memory()
    ref, _ = _route_model(route, F32)
    rt = _trainer(ref, optim.AdamW(ref.parameters(), lr=1e-2), "eager")
    want = [rt.step(x.astype(np.float16).astype(F32), y).loss for x, y in batches]
    assert losses == want
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in ref.parameters()]) == 0.0


@pytest.mark.parametrize("label_dtype", [np.int32, np.int16, np.uint8])
@pytest.mark.parametrize("route", ["python", "captured"])
def test_integer_labels_of_any_width_train_like_int64_labels(route, label_dtype):
    batches = _mlp_batches(F32)
    ref = _mlp(F32)
    rt = _trainer(ref, optim.SGD(ref.parameters(), lr=0.1), "eager")
    want = [rt.step(x, y).loss for x, y in batches]
    model = _mlp(F32)
    trainer = _trainer(model, optim.SGD(model.parameters(), lr=0.1), route)
    assert [trainer.step(x, y.astype(label_dtype)).loss for x, y in batches] == want


@pytest.mark.parametrize("route", ["python", "captured"])
def test_alternating_float16_float32_batches_and_label_widths_train_like_eager(route):
    # float16 batches share float32's signature (the plan's input buffer is float32): one plan for both, and a
    # second one for int32 labels; the captured replay must copy (cast) each batch in, never keep a stale one.
    def run(r):
        model = _mlp(F32)
        trainer = _trainer(model, optim.AdamW(model.parameters(), lr=1e-2), r)
        losses = []
        for i in range(8):
            x, y = _mlp_batches(F32)[i % 4]
            losses.append(trainer.step(x.astype(np.float16) if i % 2 else x, y.astype(np.int32) if i % 3 == 0 else y).loss)
        return model, trainer, losses
    ref, _, want = run("eager")
    model, trainer, losses = run(route)
    assert losses == want and trainer.fused.traces == 2
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in ref.parameters()]) == 0.0


# Regression (fixed; unclear error): a float16 batch for a float64 model fails, on every route, with "linear: the
# input is float32 but the weight is float64": the user never had a float32 array. Tensor() (tensor.py:39-40) turns
# float16 into float32 before the check; torch names the dtype it was given ("got Half and Double").
@pytest.mark.parametrize("route", ["eager", "python", "captured"])
def test_a_float16_batch_for_a_float64_model_names_float16_in_the_error(route):
    model = _mlp(F64)
    x, y = _mlp_batches(F64)[0]
    trainer = _trainer(model, optim.SGD(model.parameters(), lr=0.1), route)
    with pytest.raises(TypeError, match="float16"):
        trainer.step(x.astype(np.float16), y)


# Regression (fixed): a big-endian float64 batch (np.load of a file written on a big-endian machine, np.frombuffer(b,
# ">f8")) is silently rounded to float32: Tensor() (tensor.py:39-40) compares the dtype with SUPPORTED_FLOATS, where
# ">f8" != "<f8", and casts anything else to DEFAULT_DTYPE. So a float64 model refuses it ("the input is float32"),
# and a float32 model trains on it although it refuses the same values in native float64. torch refuses non-native
# byte order with a clear error; the fix is to normalise the byte order (array.dtype.newbyteorder("=")) before the
# SUPPORTED_FLOATS test.
@pytest.mark.parametrize("route", ["eager", "python", "captured"])
def test_a_big_endian_float64_batch_trains_a_float64_model_like_the_native_one(route):
    assert ta.Tensor(np.array([0.1], ">f8")).dtype == F64
    batches = _mlp_batches(F64)
    ref = _mlp(F64)
    rt = _trainer(ref, optim.SGD(ref.parameters(), lr=0.1), "eager")
    want = [rt.step(x, y).loss for x, y in batches]
    model = _mlp(F64)
    trainer = _trainer(model, optim.SGD(model.parameters(), lr=0.1), route)
    assert [trainer.step(x.astype(">f8"), y).loss for x, y in batches] == want


# -- (4) checkpoints across dtypes ---------------------------------------------------------------------

@pytest.mark.parametrize("saved_dtype,loaded_dtype", [(F32, F64), (F64, F32)], ids=["f32-into-f64", "f64-into-f32"])
@pytest.mark.parametrize("route", ["eager", "python", "captured", "streaming"])
def test_a_checkpoint_loads_into_a_model_of_the_other_dtype_with_a_cast(route, saved_dtype, loaded_dtype, tmp_path):
    # exp_avg_sq holds float64 values below float32's range (~1e-50): the cast flushes them to 0, as torch's does;
    # under the suite's np.seterr(all="raise") that cast would raise (the conftest fixture restores the setting).
    np.seterr(under="ignore")
    batches = _vit_batches(saved_dtype, n=6)
    src = _vit(saved_dtype)
    st = _trainer(src, optim.AdamW(src.parameters(), lr=3e-3), "eager")
    for b in batches[:3]:
        st.step(*b)
    st.save(tmp_path / "ckpt.safetensors")
    saved = {k: np.asarray(v).astype(loaded_dtype) for k, v in src.state_dict().items()}
    saved_state = [{k: np.asarray(v) for k, v in st.optimizer.state[p].items()} for p in src.parameters()]

    # torch's rule: load_state_dict copies with a cast; Optimizer.load_state_dict casts float state to the
    # parameter's dtype (the step count aside).
    tnet = torch.nn.Linear(3, 2).to(TORCH_DTYPE[loaded_dtype])
    topt = torch.optim.AdamW(tnet.parameters())
    tnet(torch.ones(1, 3, dtype=TORCH_DTYPE[loaded_dtype])).sum().backward()
    topt.step()
    tsd = topt.state_dict()
    for entry in tsd["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            entry[key] = entry[key].to(TORCH_DTYPE[saved_dtype])
    topt.load_state_dict(tsd)
    assert all(topt.state[p]["exp_avg"].dtype == TORCH_DTYPE[loaded_dtype] for p in tnet.parameters())

    model = _vit(loaded_dtype, seed=9)  # another init: the checkpoint must win
    trainer = _trainer(model, optim.AdamW(model.parameters(), lr=3e-3), route, tmp_path=tmp_path)
    later = _vit_batches(loaded_dtype, n=6)
    if route != "eager":
        trainer.step(*later[5])  # a plan / a store exists before the load
    trainer.load(tmp_path / "ckpt.safetensors")
    if trainer.stream is not None:
        trainer.stream.to_memory()
    assert all(p.dtype == loaded_dtype for p in model.parameters())
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), saved[k], err_msg=k)
    for p, want in zip(model.parameters(), saved_state):
        state = trainer.optimizer.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[key].dtype == loaded_dtype, key
            np.testing.assert_array_equal(state[key], want[key].astype(loaded_dtype))
        assert float(state["step"]) == 3.0
    # The run goes on like an eager run that loaded the same checkpoint.
    losses = [trainer.step(*b).loss for b in later[3:6]]
    if trainer.stream is not None:
        trainer.stream.to_memory()
    ref = _vit(loaded_dtype, seed=9)
    rt = _trainer(ref, optim.AdamW(ref.parameters(), lr=3e-3), "eager")
    rt.load(tmp_path / "ckpt.safetensors")
    want = [rt.step(*b).loss for b in later[3:6]]
    np.testing.assert_allclose(losses, want, rtol=0, atol=TOL[loaded_dtype])
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in ref.parameters()]) <= TOL[loaded_dtype]


TORCH_DTYPE = {F32: torch.float32, F64: torch.float64}
TOL = {F32: 1e-5, F64: 1e-10}


def test_module_load_state_dict_from_torch_float32_into_float64_matches_torch():
    model = _mlp(F64)
    src = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))  # float32
    model.load_state_dict({f"net.{k}": v for k, v in src.state_dict().items()})
    ref = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    ref.load_state_dict(src.state_dict())  # torch: copy_ with a cast
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.dtype == F64
        np.testing.assert_array_equal(p.data, q.detach().numpy(), err_msg=name)


# -- (5) mixed-dtype models on the fused route -----------------------------------------------------------

def _bias64_mlp():
    """A float32 MLP whose last bias is float64 (linear adds it in the output's dtype, float32)."""
    model = _mlp(F32)
    model.net[2].bias.data = model.net[2].bias.data.astype(F64)
    return model


class _Float64Head(ta.nn.Module):
    """float32 Linear, ReLU, a float64 gain (promotes), then a float64 Linear: one float64 layer in a float32 model."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.l1 = ta.nn.Linear(12, 16, rng=rng)
        self.act = ta.nn.ReLU()
        self.gain = ta.nn.Parameter(np.linspace(0.5, 1.5, 16))
        self.l2 = ta.nn.Linear(16, 4, rng=rng, dtype=F64)

    def forward(self, x):
        return self.l2(self.act(self.l1(x)) * self.gain)


def _by_dtype(model):
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dtype == F32]}, {"params": [p for p in params if p.dtype == F64]}]


@pytest.mark.parametrize("make", [_bias64_mlp, _Float64Head], ids=["float64-bias", "float64-head"])
@pytest.mark.parametrize("route", ["python", "captured"])
def test_a_mixed_dtype_model_with_a_group_per_dtype_trains_like_eager(route, make):
    batches = _mlp_batches(F32)
    ref = make()
    rt = _trainer(ref, optim.Adam(_by_dtype(ref), lr=1e-2), "eager")
    want = [rt.step(*batches[i % 4]).loss for i in range(10)]
    model = make()
    trainer = _trainer(model, optim.Adam(_by_dtype(model), lr=1e-2), route)
    reports = [trainer.step(*batches[i % 4]) for i in range(10)]
    assert {r.route for r in reports} == {"fused"}
    assert [p.dtype for p in model.parameters()] == [p.dtype for p in ref.parameters()]
    assert np.dtype(F64) in {p.dtype for p in model.parameters()}
    assert [r.loss for r in reports] == want
    assert _max_diff([p.data for p in model.parameters()], [p.data for p in ref.parameters()]) == 0.0


# Regression (fixed; unclear error): with one param group (what eager trains fine, as torch does), the fused route
# raises "a fused param group must hold one dtype, got ['float32', 'float64'] in the group with ['net.0.weight',
# 'net.0.bias', 'net.2.weight']..." - it names the group's first three parameters, not the float64 one
# (compile/flat.py:77-80, FlatGroup.__init__ prints names[:3]). It should train like eager (lay the group out as one
# flat group per dtype) or at least name the parameters of the minority dtype.
@pytest.mark.parametrize("route", ["python", "captured"])
def test_a_mixed_dtype_model_in_one_group_trains_like_eager_or_names_the_float64_layer(route):
    batches = _mlp_batches(F32)
    ref = _bias64_mlp()
    rt = _trainer(ref, optim.Adam(ref.parameters(), lr=1e-2), "eager")
    want = [rt.step(*batches[i % 4]).loss for i in range(10)]
    model = _bias64_mlp()
    trainer = _trainer(model, optim.Adam(model.parameters(), lr=1e-2), route)
    try:
        losses = [trainer.step(*batches[i % 4]).loss for i in range(10)]
    except TypeError as err:
        assert "net.2.bias" in str(err), str(err)
        return
    assert losses == want


# -- converting the model between steps (model.double() / model.float(), as in torch) --------------------

# Regression (fixed): model.to(dtype) / double() / float() between fused steps is silently undone. The eager route
# trains the converted model (as torch does); the fused route's next step finds the parameters no longer bound to its
# flat buffers, and FlatState.ensure_bound -> FlatGroup.bind (compile/flat.py:139-142) copies the new values back into
# the OLD dtype's flat buffer (np.copyto casts float64 -> float32 silently) and rebinds the parameters to it. The step
# then fails with "linear: the input is float64 but the weight is float32 ... (model.double())", advice the user has
# just followed; fed the old dtype's batch instead, it trains silently in the old dtype. Fix: FlatState.stale()
# (flat.py:278) should report a parameter whose dtype differs from its flat group's (a new layout in the new dtype,
# state cast), as it reports a requires_grad change.
@pytest.mark.parametrize("frm,to", [(F32, F64), (F64, F32)], ids=["double", "float"])
@pytest.mark.parametrize("route", ["python", "captured"])
def test_converting_the_model_dtype_between_fused_steps_trains_like_eager(route, frm, to):
    results = {}
    for r in ("eager", route):
        model = _mlp(frm)
        trainer = _trainer(model, optim.SGD(model.parameters(), lr=0.05), r)  # no state: nothing else to cast
        for b in _mlp_batches(frm)[:2]:
            trainer.step(*b)
        model.to(to)
        losses = [trainer.step(*b).loss for b in _mlp_batches(to)[2:4]]
        assert all(p.dtype == to for p in model.parameters()), r
        results[r] = [p.data.copy() for p in model.parameters()], losses
    assert _max_diff(results["eager"][0], results[route][0]) <= 1e-6
    np.testing.assert_allclose(results[route][1], results["eager"][1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("route", ["python", "captured"])
def test_converting_the_model_dtype_between_fused_steps_casts_the_optimizer_state_and_keeps_its_step(route):
    # The new layout takes Adam's moments over in the new dtype and goes on counting. The eager optimizer
    # refuses float32 moments for a float64 parameter, so its reference casts them by hand.
    results = {}
    for r in ("eager", route):
        model = _mlp(F32)
        opt = optim.Adam(model.parameters(), lr=1e-2)
        trainer = _trainer(model, opt, r)
        for b in _mlp_batches(F32)[:3]:
            trainer.step(*b)
        model.double()
        if r == "eager":
            for state in opt.state.values():
                state.update({k: v.astype(F64) for k, v in state.items() if k != "step"})
        losses = [trainer.step(*b).loss for b in _mlp_batches(F64)[:3]]
        for p in model.parameters():
            assert p.dtype == F64 and float(opt.state[p]["step"]) == 6.0
            assert {v.dtype for k, v in opt.state[p].items() if k != "step"} == {np.dtype(F64)}
        results[r] = [p.data.copy() for p in model.parameters()], losses
    assert _max_diff(results["eager"][0], results[route][0]) == 0.0
    assert results[route][1] == results["eager"][1]


# Regression (fixed; lost trained state): after trainer.stream.to_memory() (the documented way to edit the model) and
# model.double(), the next streaming step moves the float64 state into a new store (StreamingRoute._reenter,
# stream/route.py:479-491) but keeps the gradient buffer sized for the float32 layout (self._grads, sized once
# in __init__ at route.py:174-175). The step dies in _grad_views (route.py:344) with "cannot reshape array of
# size 2000 into shape (128,32)" after updating 1 of 4 stages, and the store refuses to train on ("partly
# applied ... load the last checkpoint"). Eager trains the converted model. Fix: re-size self._grads in
# _reenter from the new store's layouts (max params_bytes).
def test_converting_the_model_dtype_between_streaming_steps_trains_like_eager(tmp_path):
    results = {}
    for r in ("eager", "streaming"):
        model = _vit(F32)
        trainer = _trainer(model, optim.SGD(model.parameters(), lr=0.05), r, tmp_path=tmp_path / r)
        for b in _vit_batches(F32)[:2]:
            trainer.step(*b)
        if trainer.stream is not None:
            trainer.stream.to_memory()
        model.double()
        losses = [trainer.step(*b).loss for b in _vit_batches(F64)[2:4]]
        if trainer.stream is not None:
            trainer.stream.to_memory()
        assert all(p.dtype == F64 for p in model.parameters()), r
        results[r] = [p.data.copy() for p in model.parameters()], losses
    assert _max_diff(results["eager"][0], results["streaming"][0]) <= 1e-10
    np.testing.assert_allclose(results["streaming"][1], results["eager"][1], rtol=0, atol=1e-10)
