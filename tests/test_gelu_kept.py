"""The transformer MLP's two ways to get GELU's gradient: from the derivative forward kept, or recomputed.

FeedForward keeps GELU's output and derivative for backward by default (ops.bias_gelu_linear; kernels
bias_gelu_forward_with_grad and bias_gelu_backward_stored), so backward evaluates no erf;
recompute_activation=True (ViTConfig.recompute_mlp_activation) keeps only fc1's output plus bias and
recomputes both. The two compute the same numbers from the same inlined functions, so a fused ViT trains
bit for bit the same either way; the recomputing plan's slab is one (tokens, mlp dim) buffer per block
smaller. Kernel-level twins and torch references: tests/test_kernels.py, tests/test_ops_attention.py.
"""

import subprocess
import sys

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train import Trainer

BATCH, IMAGE, PATCH, DEPTH = 4, 32, 8, 3


def _train(recompute: bool, steps: int = 4):
    config = ViTConfig.tiny(image_size=IMAGE, patch_size=PATCH, num_classes=10, depth=DEPTH,
                            recompute_mlp_activation=recompute)
    model = ViT(config, rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="fused")
    rng = np.random.default_rng(1)
    two = [(rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32), rng.integers(0, 10, BATCH))
           for _ in range(2)]
    batches = [two[i % 2] for i in range(steps)]  # each batch twice: its loss must fall
    report = trainer.compile(*batches[0]).memory_report()
    names = ("bias_gelu_backward_stored", "bias_gelu_backward_recompute")
    before = [kernels.calls[(name, "fused")] for name in names]
    losses = [trainer.step(x, y).loss for x, y in batches]
    ran = [kernels.calls[(name, "fused")] - b for name, b in zip(names, before)]
    return losses, {n: p.numpy() for n, p in model.named_parameters()}, report, ran, config


def test_kept_and_recomputed_gelu_train_a_fused_vit_bit_for_bit_alike():
    kept_losses, kept_params, kept_report, kept_ran, config = _train(False)
    re_losses, re_params, re_report, re_ran, _ = _train(True)
    # Each ran its own backward kernel on every block, every step (and in the capture's checking passes), and
    # never the other's.
    assert kept_ran[0] >= 4 * DEPTH and kept_ran[1] == 0
    assert re_ran[0] == 0 and re_ran[1] >= 4 * DEPTH
    assert kept_losses == re_losses
    assert kept_losses[2] < kept_losses[0] and kept_losses[3] < kept_losses[1]
    for name, p in kept_params.items():
        np.testing.assert_array_equal(p, re_params[name], err_msg=name)
    # One buffer more per block: (batch * tokens, mlp dim) for the full blocks, (batch, mlp dim) for the last,
    # which computes [CLS] alone. The planner packs both slabs by liveness, so the difference is the
    # extra buffers' bytes within what packing can move (a quarter of it).
    tokens = (IMAGE // PATCH) ** 2 + 1
    mlp = int(config.dim * config.mlp_ratio)
    extra = ((DEPTH - 1) * BATCH * tokens + BATCH) * mlp * 4
    grown = kept_report["slab"] - re_report["slab"]
    assert grown == pytest.approx(extra, rel=0.25), (grown, extra)


# -- the route plan: recomputing before streaming -------------------------------------------------------------

def _auto_trainer(memory_limit):
    config = ViTConfig.tiny(image_size=64, patch_size=8, num_classes=10, depth=6)  # 65 tokens
    model = ViT(config, rng=np.random.default_rng(0))
    return Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="auto",
                   memory_limit=memory_limit), model


def _batch():
    rng = np.random.default_rng(2)
    return rng.standard_normal((32, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, 32)


@pytest.fixture
def lean_traces(monkeypatch):
    """Counts the route plan's lean traces (every MLP recomputing GELU), which it runs only when fused does not
    fit with GELU kept."""
    from tensorarena.train import route_plan

    calls = []
    original = route_plan._lean_fused_activations

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(route_plan, "_lean_fused_activations", counted)
    return calls


def test_auto_route_recomputes_the_mlps_when_keeping_gelu_does_not_fit(caplog, lean_traces):
    """A budget under the fused route's need with GELU kept, above it with GELU recomputed: route "auto" trains
    fused with its MLPs recomputing (logged, in the plan), not on the streaming route. Without the lean
    estimate (before this), the same budget streamed."""
    from tensorarena.nn.transformer import FeedForward

    x, y = _batch()
    roomy, model = _auto_trainer(8 << 30)
    kept = roomy.plan(x, y).estimates["fused"]
    assert "recompute" not in kept.note
    assert not any(m.recompute_activation for m in model.modules() if isinstance(m, FeedForward))
    assert lean_traces == []  # fused fits as it is: no second trace

    tight, model = _auto_trainer(kept.required - 1)
    plan = tight.plan(x, y)
    assert lean_traces == [model]
    lean = plan.estimates["fused"]
    # Five full blocks keep one (32 * 65 tokens, 768) float32 buffer less each (the last computes [CLS] alone):
    # 30 MiB, more than the process's share moves between two plans (~7 MiB seen).
    slab = "activations (slab)"
    assert kept.parts[slab] - lean.parts[slab] == pytest.approx(5 * 32 * 65 * 768 * 4, rel=0.1)
    assert plan.chosen == "fused" and plan.recompute_mlp and "recompute GELU" in plan.reason
    assert "MLPs recompute GELU in backward" in plan.format()
    with caplog.at_level("INFO", logger="tensorarena"):
        result = tight.step(x, y)
    assert result.route == "fused" and "MLPs recompute GELU" in caplog.text
    mlps = [m for m in model.modules() if isinstance(m, FeedForward)]
    assert len(mlps) == 6 and all(m.recompute_activation for m in mlps)
    # What the fused plan holds is what the route plan counted on: the recomputing one's slab.
    assert tight.fused.memory_report()["slab"] <= lean.parts["activations (slab)"] * 1.02


def test_a_budget_neither_fits_keeps_the_default_mlps_and_streams():
    from tensorarena.nn.transformer import FeedForward

    x, y = _batch()
    roomy, _ = _auto_trainer(8 << 30)
    plan = roomy.plan(x, y)
    streaming = plan.estimates["streaming"].required
    # Recomputing saves ~30 MiB of the fused need (above): a budget 16 MiB over streaming's (room for the
    # process's share to move between plans) is far under the lean fused need too.
    assert plan.estimates["fused"].required - streaming > 64 << 20
    trainer, model = _auto_trainer(streaming + (16 << 20))
    plan = trainer.plan(x, y)
    assert plan.chosen == "streaming" and not plan.recompute_mlp
    assert "recompute" not in plan.estimates["fused"].note  # the plan shows the fused route as it would run
    assert not any(m.recompute_activation for m in model.modules() if isinstance(m, FeedForward))


# Regression (fixed 2026-12-05): the lean trace ran whenever fused did not fit, though recomputing GELU saves
# activations only; a model whose parameters and optimizer state alone are over the budget (any model that
# must stream) paid a second trace of every stage for nothing. Without the check in route_plan.plan_routes
# (`fused.required - fused_act <= budget.nbytes`) lean_traces below is [model].
def test_no_lean_trace_when_fused_could_not_fit_even_without_activations(lean_traces):
    x, y = _batch()
    roomy, _ = _auto_trainer(8 << 30)
    kept = roomy.plan(x, y).estimates["fused"]
    without_activations = kept.required - kept.parts["activations (slab)"]
    # 16 MiB under what fused needs with no activations at all: more than the process's share moves between two
    # plans (~7 MiB seen), so the check holds whichever way it moves.
    trainer, model = _auto_trainer(without_activations - (16 << 20))
    plan = trainer.plan(x, y)
    assert lean_traces == []
    assert not plan.estimates["fused"].fits and not plan.recompute_mlp
    assert "recompute" not in plan.estimates["fused"].note


def test_the_route_plan_loads_the_recompute_kernels_of_the_gelu_form_the_mlps_use():
    # Regression (fixed): each GELU form is a kernel of its own (kernels/gelu.py), and the route plan loaded the erf
    # form's recompute kernels alone before it measured the process; MLPs with tanh GELU then compiled theirs in the
    # lean trace, after the measurement (as tests/test_plan_cold_cache.py's docstring tells of the update kernel).
    # Shown failing with "none" in place of `approximate` in route_plan._load_mlp_recompute_kernels. A process of
    # its own: in this one earlier tests may have loaded the kernels already.
    code = (
        "import numpy as np\n"
        "from tensorarena.kernels import gelu\n"
        "from tensorarena.nn.transformer import FeedForward\n"
        "from tensorarena.train.route_plan import _load_mlp_recompute_kernels\n"
        "_load_mlp_recompute_kernels(FeedForward(8, 16, activation='gelu_tanh'))\n"
        "for name in ('_bias_forward', '_bias_backward_recompute', '_bias_backward'):\n"
        "    print(name, len(getattr(gelu, name + '_tanh').signatures), len(getattr(gelu, name + '_erf').signatures))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = {name: (int(tanh), int(erf)) for name, tanh, erf in (line.split() for line in done.stdout.splitlines())}
    # The tanh form, once (float32), and not the erf form, which no MLP here runs.
    assert loaded == {name: (1, 0) for name in ("_bias_forward", "_bias_backward_recompute", "_bias_backward")}, loaded
