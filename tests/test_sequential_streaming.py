"""nn.Sequential and models.MLP stream (Sequential.stream_stages), and a streamed `tensorarena train` run ends inside
its budget.

Before, a Sequential had no stream_stages(): route="streaming" refused it and route="auto" could only fail with
"nothing fits" where it did not fit, so the main job's MLP could not "train anyway by streaming". And every streamed
`tensorarena train` run (the ViT presets too) read its temporary store's parameters and optimizer state back into
memory once the run was over, when the trainer went: `train --model vit-small --image-size 32 --memory-limit 300M`
(streaming needs 245 MiB) trained, printed its summary and was then killed by a 300M cgroup (now
trainer_streaming.drop_temporary_store after the summary).
On 96541a0 (before) 9 of this file's 9 tests fail (no stream_stages, no Conv2d; the subclass's refusal said "has no
stream_stages"; the CLI run was refused, nothing fitting; an out-of-memory on eager re-raised). With the stages but
without drop_temporary_store the CLI test still fails: killed by its cgroup (status -9) after the run.
    git worktree add /tmp/w/base 96541a0 && cd /tmp/w/base && PYTHONPATH=/tmp/w/base python -m pytest -q \
        -p no:cacheprovider /work/main/tests/test_sequential_streaming.py
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn, optim
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import StreamingUnsupportedError
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import steps_match_torch

F64 = np.float64


def _ours_and_torch():
    """One Sequential with parameterless entries before, between and after the trained ones, BatchNorm's buffers
    among them, and its torch twin with the same weights."""
    # No bias before BatchNorm (its gradient is rounding noise there)
    ours = nn.Sequential(nn.Flatten(), nn.Linear(12, 16, dtype=F64), nn.ReLU(),
                         nn.Linear(16, 16, bias=False, dtype=F64),
                         nn.BatchNorm1d(16, dtype=F64), nn.Tanh(), nn.Linear(16, 3, dtype=F64))
    theirs = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 16), torch.nn.ReLU(),
                                 torch.nn.Linear(16, 16, bias=False),
                                 torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    theirs.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in ours.state_dict().items()})
    return ours, theirs


def _batches(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 3, 4)), rng.integers(0, 3, 8)) for _ in range(n)]


def _state(trainer, model) -> dict:
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return {k: np.asarray(v, F64) for k, v in model.state_dict().items()}


def test_stages_are_the_trained_entries_with_the_parameterless_ones_after_them():
    ours, _ = _ours_and_torch()
    stages = ours.stream_stages()
    assert [s.name for s in stages] == ["0-2", "3", "4-5", "6"]  # Flatten rides with the first Linear
    assert [len(s.params) for s in stages] == [2, 1, 2, 2]
    named = nn.Sequential({"fc": nn.Linear(4, 4), "act": nn.GELU(), "out": nn.Linear(4, 2)})
    assert [s.name for s in named.stream_stages(prefix="net.")] == ["net.fc-act", "net.out"]
    x = ta.tensor(np.random.default_rng(1).standard_normal((5, 3, 4)))
    y = x
    for stage in stages:  # composed in order, the stages are the forward
        y = stage.forward(y)
    np.testing.assert_array_equal(y.numpy(), ours(x).numpy())


def test_a_streamed_sequential_trains_as_torch_buffers_included(tmp_path):
    ours, theirs = _ours_and_torch()
    # SGD with momentum: Adam divides by sqrt(v), so where a gradient is near zero its rounding differences become
    # whole steps (a bias element 1.1e-9 off torch once, under another thread split)
    trainer = Trainer(ours, optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), cross_entropy, route="streaming",
                      store_dir=tmp_path / "store")
    torch_opt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    steps_match_torch(trainer, torch_opt, lambda x, y: torch.nn.functional.cross_entropy(theirs(x), y), _batches(),
                      rel=1e-10, route="streaming")
    got = _state(trainer, ours)
    for key, value in theirs.state_dict().items():  # BatchNorm's running statistics moved once a step, as torch's
        np.testing.assert_allclose(got[key], value.numpy().astype(F64), rtol=1e-10, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_streamed_mlp_is_the_eager_one_bit_for_bit(tmp_path, dropout):
    states = {}
    for route in ("eager", "streaming"):
        model = MLP(MLPConfig(in_features=12, hidden=(16, 16), out_features=3, dropout=dropout, dtype=F64),
                    rng=np.random.default_rng(0))
        nn.init.manual_seed(7)  # dropout's masks: the same draws on both routes (the recompute draws them again)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route=route,
                          store_dir=tmp_path / route if route == "streaming" else None)
        losses = [trainer.step(x.reshape(8, 12), y).loss for x, y in _batches()]
        assert [s.name for s in model.stream_stages()] == (["net.0-1", "net.2-3", "net.4"] if dropout == 0 else
                                                           ["net.0-2", "net.3-5", "net.6"])
        states[route] = (losses, _state(trainer, model))
    assert states["eager"][0] == states["streaming"][0]
    for key, value in states["eager"][1].items():
        np.testing.assert_array_equal(states["streaming"][1][key], value, err_msg=key)


def test_route_auto_streams_an_mlp_that_does_not_fit_whole():
    # Adam's state makes fused need ~4x the parameters; a budget between the two needs leaves streaming
    model = MLP(MLPConfig(in_features=64, hidden=(512,) * 6, out_features=10), rng=np.random.default_rng(0))
    x, y = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32), np.arange(16) % 10
    probe = Trainer(model, optim.Adam(model.parameters()), cross_entropy, route="auto", memory_limit="64G")
    plan = probe.plan(x, y, routes=("fused", "streaming"))
    fused, streaming = plan.estimates["fused"].required, plan.estimates["streaming"].required
    assert streaming < fused
    budget = (fused + streaming) // 2
    trainer = Trainer(model, optim.Adam(model.parameters()), cross_entropy, route="auto", memory_limit=budget)
    assert trainer.step(x, y).route == "streaming"


def test_a_sequential_subclass_with_a_forward_of_its_own_is_refused():
    class Scaled(nn.Sequential):
        def forward(self, x):
            return super().forward(x) * 2.0

    model = Scaled(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="streaming")
    with pytest.raises(StreamingUnsupportedError, match=r"Scaled\.forward overrides the forward Sequential"):
        trainer.step(np.ones((2, 4), np.float32), np.zeros(2, np.int64))


def test_a_streamed_cli_run_ends_inside_its_budget():
    from tests.cgroup_harness import CgroupUnavailable, run_limited

    # 30M parameters: fused needs ~675 MiB, streaming ~364; read back at the end, params and Adam's state (360 MiB)
    # took the process over the 380M it was given
    command = [sys.executable, "-m", "tensorarena", "train", "--hidden", ",".join(["2048"] * 8), "--steps", "2",
               "--memory-limit", "380M", "--no-progress", "--train-size", "512", "--test-size", "128"]
    try:
        run = run_limited(command, 380 << 20)
    except CgroupUnavailable as why:
        pytest.skip(str(why))
    assert not run.oom_killed and run.returncode == 0, (run.returncode, run.stderr[-1500:])
    assert "chosen: streaming" in run.stdout + run.stderr and "on the streaming route" in run.stdout


def test_an_mlp_out_of_memory_on_eager_goes_on_streaming(monkeypatch, tmp_path):
    # The Trainer's oom_fallback: before, the MLP re-raised (no stages); now step 3 is redone on the streaming route
    # and training goes on there, the run ending where an eager run without the error ends.
    def run(fail_at):
        model = MLP(MLPConfig(in_features=12, hidden=(16, 16), out_features=3, dtype=F64),
                    rng=np.random.default_rng(0))
        trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), cross_entropy, route="eager",
                          store_dir=tmp_path / f"store{fail_at}")
        real, calls = MLP.forward, {"n": 0}

        def forward(self, x):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise MemoryError("Unable to allocate 64.0 MiB for an array (injected)")
            return real(self, x)

        with monkeypatch.context() as patch:
            patch.setattr(MLP, "forward", forward)
            routes = [trainer.step(x.reshape(8, 12), y).route for x, y in _batches(5)]
        return routes, _state(trainer, model), trainer.route_switches

    clean_routes, clean, _ = run(fail_at=0)
    routes, state, switches = run(fail_at=3)
    assert clean_routes == ["eager"] * 5 and routes == ["eager", "eager"] + ["streaming"] * 3
    assert len(switches) == 1
    for key, value in clean.items():
        np.testing.assert_array_equal(state[key], value, err_msg=key)


def test_a_cnn_sequential_trains_alike_on_every_route():
    # Conv2d, BatchNorm2d (its buffers), pooling and Flatten in stages of their own; fused and streaming end where
    # eager ends (float64, bit for bit here)
    def build():
        rng = np.random.default_rng(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, dtype=F64, rng=rng), nn.BatchNorm2d(8, dtype=F64),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1, dtype=F64, rng=rng), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4, dtype=F64, rng=rng))

    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((6, 3, 8, 8)), rng.integers(0, 4, 6)) for _ in range(4)]
    states = {}
    for route in ("eager", "fused", "streaming"):
        model = build()
        assert [s.name for s in model.stream_stages()] == ["0", "1-3", "4-7", "8"]
        trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), cross_entropy, route=route)
        assert [trainer.step(x, y).route for x, y in batches] == [route] * 4
        states[route] = _state(trainer, model)
    for route in ("fused", "streaming"):
        for key, value in states["eager"].items():
            np.testing.assert_allclose(states[route][key], value, rtol=1e-12, atol=1e-14, err_msg=f"{route} {key}")
