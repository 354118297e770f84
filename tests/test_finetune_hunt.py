"""Fine-tuning workflows against torch, on every route: what a user fine-tuning a pretrained model does that a
from-scratch loop does not.

A frozen backbone (the optimizer over the trainable parameters, or over all of them: torch's optimizers skip a
parameter whose grad is None, AdamW's weight decay included), blocks unfrozen and frozen again mid-run (the fused
route lays its flat buffers out again), two param groups without weight decay on biases and norms under a
warmup + cosine schedule, add_param_group for a block unfrozen mid-run, a replaced classification head after a
partial load_state_dict(strict=False), pretrained weights from a torch state_dict, a checkpoint saved mid-run and
resumed on a fresh trainer (on any route) with its frozen parameters still frozen, and eval / no_grad forwards
between fused steps. Each runs as a torch program and the same Trainer program on route "eager", "fused" (both
replays) and, for ViT and BERT, "streaming"; parameters, losses, lrs and optimizer state are compared with torch
(float32: rtol and atol 1e-5 over a few steps; float64: 1e-10), and every test asserts the route that ran.

Bug found: tensorarena had no LambdaLR, the schedule of the usual fine-tuning recipe (Hugging Face's warmup +
linear/cosine decay is one): `ta.optim.lr_scheduler.LambdaLR` was an AttributeError. Now it is torch's, bit for
bit (per-group functions, state_dict, last_epoch, inside SequentialLR), and a group added mid-run follows the one
function given for all groups (torch fails there; with a function per group it is a clear ValueError).

Found here and fixed later: a checkpoint saved on the streaming route holds optimizer state (zero moments, step 0)
for every parameter in the optimizer, frozen ones never stepped included, so resuming it on eager or fused made
optimizer.state_dict() differ from torch's and held two backbone-sized arrays of zeros per frozen parameter in
memory. train/checkpoint._apply now loads no state whose step is 0 (the file still holds the rows); the test was
xfail(strict=True) until then.

25 of these 98 tests fail on 02a7b67, the commit this hunt started from: every test that builds a LambdaLR (the
xfail one is counted as not failing; the other 72 pass there too, and they guard what already matched torch). To see it: `git worktree add /tmp/wt-finetune 02a7b67`, copy this file to
/tmp/wt-finetune/tests/, and from inside /tmp/wt-finetune run
`PYTHONPATH=/tmp/wt-finetune python -m pytest -q -p no:cacheprovider tests/test_finetune_hunt.py`;
then `git worktree remove --force /tmp/wt-finetune`.
"""

from __future__ import annotations

import math
import types
from dataclasses import replace

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import optim
from tensorarena.autograd import no_grad
from tensorarena.models import BertConfig, BertModel, ViT, ViTConfig, to_hf_state_dict
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.optim import lr_scheduler
from tensorarena.train.trainer import Trainer
from mlp_cases import labelled_rows, small_mlp
from test_vit_bert_parity import TorchViT

TOL = 1e-5  # float32, a few steps
ROUTES = [("eager", "auto"), ("fused", "python"), ("fused", "captured")]
ALL_ROUTES = ROUTES + [("streaming", "auto")]
# eps 1e-5, not 1e-8: a ViT gradient entry of ~1e-8 (float32 noise around an exact ~0) would otherwise step by
# ~lr/2 with a sign that noise decides, on torch's side and ours alike. At 1e-6 the first step of such an entry
# still moved by lr*g/(|g|+eps) ~1.3e-4 with float32's ~10% error on g in it: on an AVX2 machine (Zen 3, no
# AVX-512) patch_embed.weight[10, 1, 7, 2] had g = 1.13e-8 in torch float32 and 1.28e-8 in float64, and after 4
# steps ours was 1.3e-5 from torch float32's and 0.2e-5 from float64's (the blocks-frozen test failed on all four
# routes). At 1e-5 that noise moves a weight by ~lr*2e-9/1e-5 = 2e-6, under TOL.
ADAMW = dict(lr=1e-2, weight_decay=0.1, eps=1e-5)


def _ids(routes):
    return [f"{route}-{replay}" for route, replay in routes]


def _assert_close(ours: dict, theirs: dict, what: str, tol: float = TOL) -> None:
    assert sorted(ours) == sorted(theirs), what
    for key, value in ours.items():
        np.testing.assert_allclose(value, theirs[key], rtol=tol, atol=tol, err_msg=f"{what}: {key}")


def _torch_state(module: torch.nn.Module) -> dict:
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def _trainer(model, opt, route, replay, tmp_path, **kw) -> Trainer:
    if route == "streaming":
        kw["store_dir"] = tmp_path / f"store-{len(list(tmp_path.iterdir()))}"
    return Trainer(model, opt, cross_entropy, route=route, fused_replay=replay, **kw)


def _in_memory(trainer: Trainer) -> None:
    """A streamed run's parameters and optimizer state back in the model and optimizer, to compare them."""
    if trainer.stream is not None:
        trainer.stream.to_memory()


def _torch_step(model, opt, x, y, *, sched=None, clip=None) -> float:
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    opt.zero_grad()
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], clip)
    opt.step()
    if sched is not None:
        sched.step()
    return loss.item()


def _state_keys(opt) -> list[int]:
    return sorted(opt.state_dict()["state"])


def _assert_state_like_torch(opt, topt, tol: float = TOL) -> None:
    """optimizer.state_dict(): the same parameters hold state as in torch, with the same values."""
    ours, theirs = opt.state_dict()["state"], topt.state_dict()["state"]
    assert sorted(ours) == sorted(theirs)
    for index, entry in theirs.items():
        for key, value in entry.items():
            np.testing.assert_allclose(np.asarray(ours[index][key]), value.numpy(), rtol=tol, atol=tol,
                                       err_msg=f"optimizer state {key} of parameter {index}")


# -- the MLP of mlp_cases and its torch twin --------------------------------------------------------------------

BATCHES = labelled_rows(n=6)


class TorchMLP(torch.nn.Module):
    """mlp_cases.small_mlp in torch: the same state_dict keys (net.0, net.2)."""

    def __init__(self, model, dtype=torch.float32):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dtype)
        self.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})

    def forward(self, x):
        return self.net(x)


def _freeze(*modules, flag=False):
    for module in modules:
        for p in module.parameters():
            p.requires_grad_(flag)


@pytest.mark.parametrize("over", ["trainable", "all"])
@pytest.mark.parametrize("route,replay", ROUTES, ids=_ids(ROUTES))
def test_a_frozen_layer_never_moves_and_the_rest_trains_as_torch(route, replay, over, tmp_path):
    model = small_mlp()
    ref = TorchMLP(model)
    _freeze(model.net[0], ref.net[0])
    frozen = [p.data.copy() for p in model.net[0].parameters()]
    pick = (lambda m: m.parameters()) if over == "all" else (lambda m: [p for p in m.parameters() if p.requires_grad])
    opt, topt = optim.AdamW(pick(model), **ADAMW), torch.optim.AdamW(pick(ref), **ADAMW)
    trainer = _trainer(model, opt, route, replay, tmp_path)
    for i in range(4):
        report = trainer.step(*BATCHES[i])
        assert report.route == route
        assert report.loss == pytest.approx(_torch_step(ref, topt, *BATCHES[i]), rel=TOL)
    # AdamW's decay too skipped a parameter without gradient, as torch's: bit for bit unchanged.
    for before, p in zip(frozen, model.net[0].parameters()):
        np.testing.assert_array_equal(p.data, before)
    _assert_close(model.state_dict(), _torch_state(ref), "after 4 steps")
    _assert_state_like_torch(opt, topt)


OPTIMIZERS = {
    "adamw": (lambda p: optim.AdamW(p, **ADAMW), lambda p: torch.optim.AdamW(p, **ADAMW)),
    "sgd-dampened": (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
                     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "rmsprop": (lambda p: optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True, weight_decay=0.01),
                lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True, weight_decay=0.01)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("route,replay", ROUTES, ids=_ids(ROUTES))
def test_unfreezing_and_freezing_mid_run_matches_torch(route, replay, clip, name, tmp_path):
    """Frozen from the start, unfrozen after 2 steps (its state starts then: a step count of its own), and another
    parameter frozen after 4 (the fused route lays its flat buffers out again each time)."""
    ours, theirs = OPTIMIZERS[name]
    model = small_mlp()
    ref = TorchMLP(model)
    _freeze(model.net[0], ref.net[0])
    opt, topt = ours(model.parameters()), theirs(ref.parameters())
    trainer = _trainer(model, opt, route, replay, tmp_path, clip_grad_norm=clip)
    for i in range(6):
        if i == 2:
            _freeze(model.net[0], ref.net[0], flag=True)
        if i == 4:
            model.net[2].bias.requires_grad = False
            ref.net[2].bias.requires_grad = False
        report = trainer.step(*BATCHES[i])
        assert report.route == route
        assert report.loss == pytest.approx(_torch_step(ref, topt, *BATCHES[i], clip=clip), rel=TOL)
    _assert_close(model.state_dict(), _torch_state(ref), "after 6 steps")
    _assert_state_like_torch(opt, topt)


@pytest.mark.parametrize("route,replay", ROUTES, ids=_ids(ROUTES))
def test_float64_fine_tuning_with_a_frozen_layer_matches_torch_to_1e_10(route, replay, tmp_path):
    model = small_mlp(dtype=np.float64)
    ref = TorchMLP(model, dtype=torch.float64)
    _freeze(model.net[0], ref.net[0])
    opt, topt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), \
        torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    trainer = _trainer(model, opt, route, replay, tmp_path, clip_grad_norm=1.0)
    for i in range(4):
        if i == 2:
            _freeze(model.net[0], ref.net[0], flag=True)
        x, y = BATCHES[i]
        assert trainer.step(x.astype(np.float64), y).route == route
        _torch_step(ref, topt, x.astype(np.float64), y, clip=1.0)
    _assert_close(model.state_dict(), _torch_state(ref), "float64", tol=1e-10)


# -- a tiny ViT and the torch ViT of test_vit_bert_parity --------------------------------------------------------

VIT = ViTConfig(image_size=16, patch_size=8, in_channels=3, num_classes=5, dim=16, depth=2, num_heads=2,
                mlp_ratio=2.0)
_rng = np.random.default_rng(5)
IMAGES = [(_rng.standard_normal((4, 3, 16, 16)).astype(np.float32), _rng.integers(0, 5, 4)) for _ in range(6)]


def _vit_pair(config=VIT, seed=0):
    model = ViT(config, rng=np.random.default_rng(seed))
    model.cls_token.data[...] = np.random.default_rng(1).normal(0, 0.02, model.cls_token.shape)  # not all zero
    ref = TorchViT(replace(config, dropout=0.0, attention_dropout=0.0))
    ref.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    return model, ref


def _vit_steps(trainer, ref, topt, steps, *, route, sched=None, clip=None):
    for i in steps:
        report = trainer.step(*IMAGES[i])
        assert report.route == route
        assert report.loss == pytest.approx(_torch_step(ref, topt, *IMAGES[i], sched=sched, clip=clip), rel=TOL)


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("route,replay", ALL_ROUTES, ids=_ids(ALL_ROUTES))
def test_vit_with_its_blocks_frozen_matches_torch(route, replay, clip, tmp_path):
    model, ref = _vit_pair()
    _freeze(model.blocks, ref.blocks)  # torch: for p in model.blocks.parameters(): p.requires_grad_(False)
    frozen = [p.data.copy() for p in model.blocks.parameters()]
    opt, topt = optim.AdamW(model.parameters(), **ADAMW), torch.optim.AdamW(ref.parameters(), **ADAMW)
    trainer = _trainer(model, opt, route, replay, tmp_path, clip_grad_norm=clip)
    _vit_steps(trainer, ref, topt, range(4), route=route, clip=clip)
    _in_memory(trainer)
    for before, p in zip(frozen, model.blocks.parameters()):
        np.testing.assert_array_equal(p.data, before)
    _assert_close(model.state_dict(), _torch_state(ref), "after 4 steps")
    _assert_state_like_torch(opt, topt)


@pytest.mark.parametrize("route,replay", ALL_ROUTES, ids=_ids(ALL_ROUTES))
def test_vit_block_unfrozen_then_frozen_again_matches_torch(route, replay, tmp_path):
    model, ref = _vit_pair()
    _freeze(model.blocks, ref.blocks)
    opt, topt = optim.AdamW(model.parameters(), **ADAMW), torch.optim.AdamW(ref.parameters(), **ADAMW)
    trainer = _trainer(model, opt, route, replay, tmp_path, clip_grad_norm=1.0)
    _vit_steps(trainer, ref, topt, range(2), route=route, clip=1.0)
    _freeze(model.blocks[1], ref.blocks[1], flag=True)
    _vit_steps(trainer, ref, topt, range(2, 4), route=route, clip=1.0)
    _freeze(model.blocks[1], ref.blocks[1])
    _vit_steps(trainer, ref, topt, range(4, 6), route=route, clip=1.0)
    _in_memory(trainer)
    # lr / 100, not TOL: with the per-core products on OpenBLAS (kernels.gemm_library; torch's are MKL's) single
    # weights of blocks.1 came up to 6.7e-5 from torch's after its two steps (fc2, one of 512; qkv 1.2e-5): AdamW
    # divides each gradient entry by its own root mean square, so an entry near the rounding noise of its GEMM sum
    # moves by a visibly different share of lr. A step lost, taken twice or taken while frozen moves weights by
    # ~lr (1e-2). On MKL (TENSORARENA_GEMM_KERNELS=mkl) every weight is within TOL.
    _assert_close(model.state_dict(), _torch_state(ref), "after 6 steps", tol=ADAMW["lr"] / 100)
    _assert_state_like_torch(opt, topt)


def _decay_groups(module) -> list[dict]:
    """The common recipe: weight decay on the weight matrices only, none on biases, norms and embeddings."""
    no_decay = {id(p) for n, p in module.named_parameters()
                if n.endswith("bias") or "norm" in n or n in ("cls_token", "pos_embed.weight")}
    params = [p for p in module.parameters() if p.requires_grad]
    return [{"params": [p for p in params if id(p) not in no_decay]},
            {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0, "lr": 5e-3}]


def _warmup_cosine(warmup: int, total: int):
    """Hugging Face's get_cosine_schedule_with_warmup as the LambdaLR factor of an epoch."""
    def factor(epoch: int) -> float:
        if epoch < warmup:
            return (epoch + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup) / (total - warmup)))
    return factor


def _schedules(opt, topt, kind):
    if kind == "LambdaLR":
        return (lr_scheduler.LambdaLR(opt, _warmup_cosine(2, 6)),
                torch.optim.lr_scheduler.LambdaLR(topt, _warmup_cosine(2, 6)))
    warmup = torch.optim.lr_scheduler.LinearLR(topt, start_factor=1e-3, end_factor=1.0, total_iters=2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=4)
    return (lr_scheduler.warmup_cosine(opt, 2, 6),
            torch.optim.lr_scheduler.SequentialLR(topt, [warmup, cosine], milestones=[2]))


@pytest.mark.parametrize("kind", ["LambdaLR", "warmup_cosine"])
@pytest.mark.parametrize("route,replay", ALL_ROUTES, ids=_ids(ALL_ROUTES))
def test_vit_two_param_groups_under_warmup_and_cosine_match_torch(route, replay, kind, tmp_path):
    model, ref = _vit_pair()
    _freeze(model.blocks[0], ref.blocks[0])
    opt, topt = optim.AdamW(_decay_groups(model), **ADAMW), torch.optim.AdamW(_decay_groups(ref), **ADAMW)
    sched, tsched = _schedules(opt, topt, kind)
    trainer = _trainer(model, opt, route, replay, tmp_path, scheduler=sched, clip_grad_norm=1.0)
    for i in range(5):
        _vit_steps(trainer, ref, topt, [i], route=route, sched=tsched, clip=1.0)
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
    _in_memory(trainer)
    _assert_close(model.state_dict(), _torch_state(ref), "after 5 steps")


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("route,replay", ALL_ROUTES, ids=_ids(ALL_ROUTES))
def test_vit_head_only_then_a_block_unfrozen_with_add_param_group_matches_torch(route, replay, clip, tmp_path):
    model, ref = _vit_pair()
    for m in (model, ref):
        _freeze(m)
        _freeze(m.head, flag=True)
    opt, topt = optim.AdamW(model.head.parameters(), **ADAMW), torch.optim.AdamW(ref.head.parameters(), **ADAMW)
    trainer = _trainer(model, opt, route, replay, tmp_path, clip_grad_norm=clip)
    _vit_steps(trainer, ref, topt, range(2), route=route, clip=clip)
    _freeze(model.blocks[1], ref.blocks[1], flag=True)
    opt.add_param_group({"params": list(model.blocks[1].parameters()), "lr": 3e-3, "weight_decay": 0.0})
    topt.add_param_group({"params": list(ref.blocks[1].parameters()), "lr": 3e-3, "weight_decay": 0.0})
    _vit_steps(trainer, ref, topt, range(2, 5), route=route, clip=clip)
    _in_memory(trainer)
    _assert_close(model.state_dict(), _torch_state(ref), "after 5 steps")
    _assert_state_like_torch(opt, topt)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["numpy", "torch-tensors"])
@pytest.mark.parametrize("route,replay", ALL_ROUTES, ids=_ids(ALL_ROUTES))
def test_vit_pretrained_from_torch_with_a_new_head_matches_torch(route, replay, as_tensors, tmp_path):
    """A torch model's state_dict (.numpy(), or the tensors themselves) without its 5-class head and with a key the
    model has not, loaded with strict=False (the keys reported as torch reports them), then a 7-class head."""
    _, pretrained = _vit_pair()
    saved = {k: v for k, v in pretrained.state_dict().items() if not k.startswith("head.")}
    saved["pre_logits.bias"] = torch.zeros(3)
    model = ViT(VIT, rng=np.random.default_rng(3))
    ref = TorchViT(VIT)
    result = model.load_state_dict({k: v if as_tensors else v.numpy() for k, v in saved.items()}, strict=False)
    expected = ref.load_state_dict(saved, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (expected.missing_keys, expected.unexpected_keys)
    assert (result.missing_keys, result.unexpected_keys) == (["head.weight", "head.bias"], ["pre_logits.bias"])
    model.head = Linear(VIT.dim, 7, rng=np.random.default_rng(4))
    ref.head = torch.nn.Linear(VIT.dim, 7)
    ref.head.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.head.state_dict().items()})
    _freeze(model.blocks, ref.blocks)
    pick = lambda m: [p for p in m.parameters() if p.requires_grad]  # noqa: E731
    opt, topt = optim.AdamW(pick(model), **ADAMW), torch.optim.AdamW(pick(ref), **ADAMW)
    trainer = _trainer(model, opt, route, replay, tmp_path)
    for i in range(3):
        x, y = IMAGES[i]
        y = (y + 2 * i) % 7  # classes 5 and 6 occur: the new head's rows all train
        report = trainer.step(x, y)
        assert report.route == route
        assert report.loss == pytest.approx(_torch_step(ref, topt, x, y), rel=TOL)
    _in_memory(trainer)
    _assert_close(model.state_dict(), _torch_state(ref), "after 3 steps")


def test_a_head_of_another_size_is_refused_even_with_strict_false_as_in_torch():
    _, pretrained = _vit_pair()
    model = ViT(replace(VIT, num_classes=7), rng=np.random.default_rng(3))
    with pytest.raises(RuntimeError) as ours:
        model.load_state_dict({k: v.numpy() for k, v in pretrained.state_dict().items()}, strict=False)
    with pytest.raises(RuntimeError) as theirs:
        TorchViT(replace(VIT, num_classes=7)).load_state_dict(pretrained.state_dict(), strict=False)
    for text in (str(ours.value), str(theirs.value)):
        assert "size mismatch for head.weight: copying a param with shape" in text.replace("a value", "a param")
    assert "torch.Size([5, 16])" in str(theirs.value) and "(5, 16)" in str(ours.value)
    assert "nothing was loaded" in str(ours.value)


# -- checkpoints mid-fine-tune ------------------------------------------------------------------------------------

CKPT_ROUTES = [("eager", "auto"), ("fused", "captured"), ("streaming", "auto")]


def _frozen_run(kind):
    """A ViT with blocks[0] frozen, AdamW over all its parameters in two groups, and a schedule."""
    model, ref = _vit_pair()
    _freeze(model.blocks[0], ref.blocks[0])
    opt = optim.AdamW(_decay_groups(model) if kind == "LambdaLR" else model.parameters(), **ADAMW)
    topt = torch.optim.AdamW(_decay_groups(ref) if kind == "LambdaLR" else ref.parameters(), **ADAMW)
    sched, tsched = _schedules(opt, topt, kind)
    return model, ref, opt, topt, sched, tsched


@pytest.mark.parametrize("kind", ["LambdaLR", "warmup_cosine"])
@pytest.mark.parametrize("resumed_on", CKPT_ROUTES, ids=_ids(CKPT_ROUTES))
@pytest.mark.parametrize("saved_on", CKPT_ROUTES, ids=_ids(CKPT_ROUTES))
def test_a_checkpoint_mid_fine_tune_resumes_with_its_frozen_parameters_frozen(saved_on, resumed_on, kind, tmp_path):
    model, ref, opt, topt, sched, tsched = _frozen_run(kind)
    trainer = _trainer(model, opt, *saved_on, tmp_path, scheduler=sched)
    _vit_steps(trainer, ref, topt, range(3), route=saved_on[0], sched=tsched)
    trainer.save(tmp_path / "mid.ckpt")

    fresh, _, fresh_opt, _, fresh_sched, _ = _frozen_run(kind)  # the user freezes again before loading
    resumed = _trainer(fresh, fresh_opt, *resumed_on, tmp_path, scheduler=fresh_sched)
    resumed.load(tmp_path / "mid.ckpt")
    assert resumed.step_count == 3
    frozen = [p.data for p in _vit_pair()[0].blocks[0].parameters()]  # as built: they never trained
    _vit_steps(resumed, ref, topt, range(3, 5), route=resumed_on[0], sched=tsched)
    _in_memory(resumed)
    assert not any(p.requires_grad for p in fresh.blocks[0].parameters())
    for before, p in zip(frozen, fresh.blocks[0].parameters()):
        np.testing.assert_array_equal(p.data, before)
    assert [g["lr"] for g in fresh_opt.param_groups] == [g["lr"] for g in topt.param_groups]
    _assert_close(fresh.state_dict(), _torch_state(ref), "resumed")
    if saved_on[0] != "streaming" or resumed_on[0] == "streaming":  # the xfail test below: the other case
        _assert_state_like_torch(fresh_opt, topt)


@pytest.mark.parametrize("resumed_on", [("eager", "auto"), ("fused", "captured")], ids=["eager", "fused"])
def test_a_streamed_checkpoint_loads_no_optimizer_state_for_frozen_parameters(resumed_on, tmp_path):
    # stream/checkpoint.py (_entries) writes optimizer state for every parameter in the optimizer, frozen ones
    # never stepped included (zero moments, step 0): its layout is fixed before any stage is read. Loaded into
    # memory, such rows made optimizer.state_dict() hold state torch's has not (this test was xfail(strict) until
    # train/checkpoint._apply dropped state whose step is 0; the rows still take room in the file).
    model, ref, opt, topt, sched, tsched = _frozen_run("warmup_cosine")
    trainer = _trainer(model, opt, "streaming", "auto", tmp_path, scheduler=sched)
    _vit_steps(trainer, ref, topt, range(2), route="streaming", sched=tsched)
    trainer.save(tmp_path / "mid.ckpt")
    fresh, _, fresh_opt, _, fresh_sched, _ = _frozen_run("warmup_cosine")
    _trainer(fresh, fresh_opt, *resumed_on, tmp_path, scheduler=fresh_sched).load(tmp_path / "mid.ckpt")
    assert _state_keys(fresh_opt) == _state_keys(topt)  # had 12 entries more, for blocks[0]'s parameters


# -- eval / no_grad forwards between steps ------------------------------------------------------------------------

@pytest.mark.parametrize("route,replay", ROUTES, ids=_ids(ROUTES))
def test_eval_and_no_grad_forwards_between_steps_leave_training_as_without_them(route, replay, tmp_path):
    """With dropout: an eval forward (dropout off, no draw) between steps, as a validation loop does, and a
    train-mode no_grad forward (dropout on: it draws, as in torch). The eval outputs equal torch's eval forward of
    the same weights; the trained weights equal those of a run that makes the same draws without the forwards."""
    config = replace(VIT, dropout=0.1, attention_dropout=0.1)
    held_out = IMAGES[5][0]

    def run(forwards: bool):
        model = ViT(config, rng=np.random.default_rng(0))
        trainer = _trainer(model, optim.AdamW(model.parameters(), **ADAMW), route, replay, tmp_path)
        outputs = []
        for i in range(4):
            assert trainer.step(*IMAGES[i]).route == route
            model.eval()
            if forwards:
                with no_grad():
                    outputs.append(model(held_out).numpy().copy())
            model.train()
            with no_grad():  # in train mode: dropout draws; the run without eval forwards draws the same
                model(held_out)
        return model, outputs

    model, outputs = run(True)
    plain, _ = run(False)
    for a, b in zip(model.parameters(), plain.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    ref = TorchViT(VIT)
    ref.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    ref.eval()
    with torch.no_grad():
        np.testing.assert_allclose(outputs[-1], ref(torch.from_numpy(held_out)).numpy(), rtol=TOL, atol=TOL)
    assert model.training


# -- BERT with a classification head ------------------------------------------------------------------------------

BERT = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
                  max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_rng = np.random.default_rng(9)
TOKENS = [(_rng.integers(1, 40, (4, 7)), _rng.integers(0, 3, 4)) for _ in range(5)]


class BertClassifier(Module):
    """A BERT encoder and a linear head on [CLS]; streams as the encoder's stages with the head in the last."""

    def __init__(self):
        super().__init__()
        self.encoder = BertModel(BERT, rng=np.random.default_rng(0))
        self.head = Linear(BERT.hidden_size, 3, rng=np.random.default_rng(1))

    def forward(self, ids):
        return self._head(self.encoder(ids), None)

    def _head(self, hidden, side):
        return self.head(hidden[:, 0])  # (B, hidden) -> (B, 3)

    def stream_inputs(self, batch):
        return self.encoder.encoder_inputs(batch)

    def stream_stages(self):
        return self.encoder.encoder_stages(head=self._head, head_params=tuple(self.head.parameters()),
                                           prefix="encoder.")


class TorchBertClassifier(torch.nn.Module):
    def __init__(self, model: BertClassifier):
        super().__init__()
        transformers = pytest.importorskip("transformers")
        self.encoder = transformers.BertModel(transformers.BertConfig(**BERT.to_json_dict()), add_pooling_layer=False)
        self.encoder.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in to_hf_state_dict(model.encoder).items()})
        self.head = torch.nn.Linear(BERT.hidden_size, 3)
        self.head.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.head.state_dict().items()})

    def forward(self, ids):
        return self.head(self.encoder(input_ids=ids).last_hidden_state[:, 0])


@pytest.mark.parametrize("route,replay", ALL_ROUTES, ids=_ids(ALL_ROUTES))
def test_bert_with_frozen_embeddings_and_a_layer_unfrozen_mid_run_matches_transformers(route, replay, tmp_path):
    model = BertClassifier()
    ref = TorchBertClassifier(model)
    ref.train()  # dropout probabilities are 0
    _freeze(model.encoder.embeddings, ref.encoder.embeddings)
    _freeze(model.encoder.layers[0], ref.encoder.encoder.layer[0])
    opt, topt = optim.AdamW(model.parameters(), **ADAMW), torch.optim.AdamW(ref.parameters(), **ADAMW)
    sched, tsched = lr_scheduler.LambdaLR(opt, _warmup_cosine(1, 5)), \
        torch.optim.lr_scheduler.LambdaLR(topt, _warmup_cosine(1, 5))
    trainer = _trainer(model, opt, route, replay, tmp_path, scheduler=sched, clip_grad_norm=1.0)
    for i, (ids, labels) in enumerate(TOKENS):
        if i == 3:
            _freeze(model.encoder.layers[0], ref.encoder.encoder.layer[0], flag=True)
        report = trainer.step(ids, labels)
        assert report.route == route
        assert report.loss == pytest.approx(_torch_step(ref, topt, ids, labels, sched=tsched, clip=1.0), rel=TOL)
    _in_memory(trainer)
    theirs = _torch_state(ref.encoder)
    _assert_close(dict(to_hf_state_dict(model.encoder)), {k: theirs[k] for k in to_hf_state_dict(model.encoder)},
                  "encoder")
    _assert_close(model.head.state_dict(), _torch_state(ref.head), "head")


# -- LambdaLR against torch's ---------------------------------------------------------------------------------------

class Decay:
    """A callable object: its attributes are what LambdaLR.state_dict keeps of it (torch's format)."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, epoch):
        return self.rate ** epoch


def _optimizers():
    ours = optim.AdamW([{"params": [ta.nn.Parameter(np.zeros(2))]},
                        {"params": [ta.nn.Parameter(np.zeros(2))], "lr": 3e-3}], lr=1e-2)
    theirs = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(2))]},
                                {"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 3e-3}], lr=1e-2)
    return ours, theirs


def _lrs(opt):
    return [g["lr"] for g in opt.param_groups]


@pytest.mark.parametrize("lam", ["one", "per-group", "object"])
def test_lambda_lr_sets_torchs_lrs_bit_for_bit(lam):
    make = {"one": lambda: _warmup_cosine(3, 12), "per-group": lambda: [_warmup_cosine(3, 12), Decay(0.5)],
            "object": lambda: Decay(0.9)}[lam]
    opt, topt = _optimizers()
    sched, tsched = lr_scheduler.LambdaLR(opt, make()), torch.optim.lr_scheduler.LambdaLR(topt, make())
    assert _lrs(opt) == _lrs(topt)
    for _ in range(12):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert _lrs(opt) == _lrs(topt)
        assert sched.get_last_lr() == tsched.get_last_lr()
    ours, theirs = sched.state_dict(), tsched.state_dict()
    assert ours == {k: v for k, v in theirs.items() if k not in ("_is_initial", "_get_lr_called_within_step")}


def test_lambda_lr_state_loads_torchs_and_restores_callable_objects():
    opt, topt = _optimizers()
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, Decay(0.8))
    for _ in range(4):
        topt.step()
        tsched.step()
    tsched.lr_lambdas[0].rate = 0.7  # an attribute changed mid-run: saved with the state
    state = tsched.state_dict()
    sched = lr_scheduler.LambdaLR(opt, [Decay(0.8), Decay(0.8)])
    sched.load_state_dict(state)
    assert (sched.last_epoch, sched.base_lrs, sched.lr_lambdas[0].rate) == (4, [1e-2, 3e-3], 0.7)
    sched.step()
    tsched.step()
    assert _lrs(opt) == _lrs(topt) and sched.get_last_lr() == tsched.get_last_lr()


def test_lambda_lr_resumed_by_last_epoch_and_inside_sequential_lr_match_torch():
    opt, topt = _optimizers()
    for o in (opt, topt):
        for g in o.param_groups:
            g["initial_lr"] = g["lr"]
    lr_scheduler.LambdaLR(opt, Decay(0.9), last_epoch=4)
    torch.optim.lr_scheduler.LambdaLR(topt, Decay(0.9), last_epoch=4)
    assert _lrs(opt) == _lrs(topt)

    opt, topt = _optimizers()
    seq = lr_scheduler.SequentialLR(opt, [lr_scheduler.LambdaLR(opt, lambda e: (e + 1) / 4),
                                          lr_scheduler.CosineAnnealingLR(opt, T_max=6)], milestones=[3])
    tseq = torch.optim.lr_scheduler.SequentialLR(
        topt, [torch.optim.lr_scheduler.LambdaLR(topt, lambda e: (e + 1) / 4),
               torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=6)], milestones=[3])
    for _ in range(9):
        opt.step()
        topt.step()
        seq.step()
        tseq.step()
        assert _lrs(opt) == _lrs(topt)


def test_lambda_lr_a_group_added_mid_run_follows_the_one_function():
    """torch fails at the next step (zip(strict=True)); here the group's lr is its base lr under the function."""
    opt, _ = _optimizers()
    sched = lr_scheduler.LambdaLR(opt, Decay(0.5))
    sched.step()
    opt.add_param_group({"params": [ta.nn.Parameter(np.zeros(2))], "lr": 0.2})
    sched.step()
    assert _lrs(opt) == [1e-2 * 0.25, 3e-3 * 0.25, 0.2 * 0.25]
    assert opt.param_groups[2]["initial_lr"] == 0.2


def test_lambda_lr_refuses_what_it_cannot_follow_before_changing_anything():
    opt, _ = _optimizers()
    with pytest.raises(ValueError, match=r"^LambdaLR: expected 2 lr_lambdas \(one per param group\), but got 1$"):
        lr_scheduler.LambdaLR(opt, [Decay(0.5)])
    with pytest.raises(TypeError, match="lr_lambda must be a function of the epoch returning the lr factor, "
                                        "got a float"):
        lr_scheduler.LambdaLR(opt, 0.5)
    sched = lr_scheduler.LambdaLR(opt, [Decay(0.5), Decay(0.9)])
    opt.add_param_group({"params": [ta.nn.Parameter(np.zeros(2))], "lr": 0.2})
    before = (_lrs(opt), sched.last_epoch, list(sched.base_lrs))
    with pytest.raises(ValueError, match=r"one lr_lambda per param group \(2\), and 1 group\(s\) were added since"):
        sched.step()
    assert (_lrs(opt), sched.last_epoch, sched.base_lrs) == before


def test_lambda_lr_state_dict_keeps_none_for_plain_functions():
    opt, _ = _optimizers()
    sched = lr_scheduler.LambdaLR(opt, [lambda e: 1.0, Decay(0.5)])
    assert sched.state_dict()["lr_lambdas"] == [None, {"rate": 0.5}]
    assert isinstance(sched.lr_lambdas[0], types.FunctionType)
