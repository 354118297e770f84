"""Trainer(micro_batch="auto"): the whole batch in one pass where it fits the budget, else the most rows per pass that
fit (train/micro_batch_choice.py), on route "auto" and on a route given with a memory_limit.

Before, a batch whose activations did not fit had no way to train but a micro_batch the user guessed: route="auto"
said "nothing fits" (the route plan never cut the batch). On 9a8b2dc (before) 11 of this file's 11 tests fail
("micro_batch must be a positive number of rows ... got 'auto'"; the command: "invalid positive_int value: 'auto'"):
    git worktree add /tmp/w/base 9a8b2dc && cd /tmp/w/base && PYTHONPATH=/tmp/w/base python -m pytest -q \
        -p no:cacheprovider /work/main/tests/test_micro_batch_auto.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorarena import nn, optim
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

F64 = np.float64
ROWS = 2048


@pytest.fixture(autouse=True)
def _no_process_share(monkeypatch):
    """Plans without the process's own RSS (route_plan's process_other_bytes, which grows as this test process
    imports and compiles): the needs compared below are the routes' own bytes, the same in every Trainer."""
    from tensorarena.train import route_plan

    real = route_plan.plan_routes
    monkeypatch.setattr(route_plan, "plan_routes", lambda *a, **kw: real(*a, **{**kw, "process_other_bytes": 0}))


def _mlp():
    # activations of 2048 rows x 512 wide dominate the 0.4M parameters: halving the rows halves most of the need
    return MLP(MLPConfig(in_features=64, hidden=(512, 512), out_features=5, dtype=F64), rng=np.random.default_rng(0))


def _batch(seed=1, rows=ROWS):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 64)), rng.integers(0, 5, rows)


def _needs(route="fused", **kw) -> dict:
    """What each route needs for the whole batch and for micro-batches of 1024 and 512 rows."""
    out = {}
    for micro in (None, 1024, 512):
        model = _mlp()
        trainer = Trainer(model, optim.Adam(model.parameters()), cross_entropy, route="auto", memory_limit="64G",
                          micro_batch=micro, **kw)
        out[micro] = trainer.plan(*_batch(), routes=(route,)).estimates[route].required
    assert out[None] > out[1024] > out[512]
    return out


def test_auto_keeps_the_whole_batch_where_it_fits():
    model = _mlp()
    trainer = Trainer(model, optim.Adam(model.parameters()), cross_entropy, route="auto", micro_batch="auto")
    assert trainer.step(*_batch()).route == "fused" and trainer.micro_batch is None


@pytest.mark.parametrize("route", ["auto", "fused"])
def test_auto_cuts_the_batch_to_what_fits_and_trains_the_whole_batch_step(route):
    needs = _needs()
    budget = (needs[1024] + needs[512]) // 2  # 1024 rows per pass do not fit, 512 do
    model = _mlp()
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-3), cross_entropy, route=route,
                      memory_limit=budget, micro_batch="auto")
    theirs = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                 torch.nn.ReLU(), torch.nn.Linear(512, 5)).double()
    theirs.load_state_dict({k.removeprefix("net."): torch.from_numpy(np.asarray(v))
                            for k, v in model.state_dict().items()})
    torch_opt = torch.optim.Adam(theirs.parameters(), lr=1e-3)
    for seed in (1, 2, 3):
        x, y = _batch(seed)
        report = trainer.step(x, y)
        assert report.route == "fused" and trainer.micro_batch == 512
        torch_opt.zero_grad()
        want = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()  # the whole batch at once: the micro-batches' weighted sum is its step
        torch_opt.step()
        assert report.loss == pytest.approx(want.item(), rel=1e-10)
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(np.asarray(model.state_dict()["net." + key]), value.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=key)


def test_auto_is_what_the_same_micro_batch_given_by_hand_trains():
    needs = _needs()
    states = []
    for micro in ("auto", 512):
        model = _mlp()
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3), cross_entropy, route="auto",
                          memory_limit=(needs[1024] + needs[512]) // 2, micro_batch=micro)
        losses = [trainer.step(*_batch(seed)).loss for seed in (1, 2)]
        states.append((losses, {k: np.asarray(v) for k, v in model.state_dict().items()}))
    assert states[0][0] == states[1][0]
    for key, value in states[1][1].items():
        np.testing.assert_array_equal(states[0][1][key], value, err_msg=key)


def test_nothing_fits_even_at_one_row_says_it_tried():
    model = _mlp()
    trainer = Trainer(model, optim.Adam(model.parameters()), cross_entropy, route="auto", memory_limit="1M",
                      micro_batch="auto")
    with pytest.raises(MemoryError, match=r"no training route fits before step 1: .*micro_batch='auto' tried "
                                          r"micro-batches down to 1 row, and at 1 row: nothing fits"):
        trainer.step(*_batch(rows=8))
    assert trainer.micro_batch is None  # left as it was


def test_a_model_whose_loss_couples_its_rows_is_not_cut():
    class Coupled(nn.Module):
        micro_batches_refused = "its loss compares every row with every other"

        def __init__(self):
            super().__init__()
            self.inner = _mlp()

        def forward(self, x):
            return self.inner(x)

    model = Coupled()
    trainer = Trainer(model, optim.Adam(model.parameters()), cross_entropy, route="auto", memory_limit="1M",
                      micro_batch="auto")
    with pytest.raises(MemoryError, match=r"micro_batch='auto' cannot cut this batch: .*compares every row"):
        trainer.step(*_batch(rows=8))


@pytest.mark.parametrize("kwargs, message", [
    (dict(route="fused", micro_batch="auto"), r"route='fused' is planned only against a memory_limit"),
    (dict(route="auto", micro_batch="auto", update_in_backward=True),
     r"update_in_backward=True cannot be combined with micro_batch='auto'"),
    (dict(route="auto", micro_batch="half"), r"or 'auto': as many as fit the memory budget\), got 'half'"),
])
def test_what_auto_cannot_do_is_refused(kwargs, message):
    model = _mlp()
    with pytest.raises(ValueError, match=message):
        Trainer(model, optim.Adam(model.parameters()), cross_entropy, **kwargs)


def _cli(*argv: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tensorarena", *argv], capture_output=True, text=True, timeout=300)


def test_the_command_cuts_a_batch_that_does_not_fit_and_says_so():
    shape = ["--hidden", "1024,1024", "--optimizer", "adam"]
    plan = _cli("plan", "--model", "mlp", "--batch", "2048", *shape, "--json")
    assert plan.returncode == 0, plan.stderr[-1500:]
    import json

    whole = json.loads(plan.stdout[plan.stdout.index("\n{") + 1:])["estimates"]["fused"]["required"]
    limit = whole - (12 << 20)  # the whole batch's activations (~38 MiB) do not fit; half of them do
    run = _cli("train", *shape, "--batch-size", "2048", "--train-size", "4096", "--test-size", "512", "--steps", "2",
               "--no-progress", "--memory-limit", str(limit), "--micro-batch", "auto")
    assert run.returncode == 0, run.stderr[-1500:]
    assert "micro-batch auto: the whole batch does not fit; in micro-batches of 1024 rows:" in run.stderr
    assert "for 2 steps on the fused route, in micro-batches of 1024" in run.stdout


def test_the_command_refuses_auto_where_nothing_plans():
    run = _cli("train", "--route", "fused", "--micro-batch", "auto", "--steps", "1", "--no-progress")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "--micro-batch auto cuts the batch where the route plan says it does not fit, and --route fused is " \
           "planned only against a --memory-limit" in run.stderr
