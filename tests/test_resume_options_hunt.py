"""A resumed `tensorarena train` is the uninterrupted run, and torch's init/clip signatures (a hunt of 2026-12-07).

Before: --resume left out --dtype, --matmul-precision and --micro-batch went back to the defaults without a word
(a float64 run went on in float32, its weights and Adam moments cast down); the save after a non-finite loss
kept the loader's position past the failed batch, so a resumed run never trained it; clip_grad_value_ refused
torch's foreach=; xavier_uniform_ of an empty 1-d tensor passed silently and kaiming_uniform_ refused
mode="FAN_OUT". Run on the commit before the one that added this file (a worktree of it first on PYTHONPATH),
all 8 cases failed (the two of BatchLoader.rewind, new here, with an AttributeError).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import cli
from tensorarena.data.loader import BatchLoader
from tensorarena.nn import init
from tensorarena.optim.clip import clip_grad_value_
from tensorarena.train.checkpoint import read_metadata

MLP = ["--hidden", "16", "--train-size", "300", "--test-size", "60", "--batch-size", "64", "--route", "eager",
       "--no-progress"]


def _losses(tmp_path: Path, name: str, *argv: str) -> list[float]:
    out = tmp_path / f"{name}.json"
    assert cli.main(["train", *MLP, *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())["step_losses"]


@pytest.mark.parametrize("option", [["--dtype", "float64"], ["--matmul-precision", "bfloat16"],
                                    ["--micro-batch", "16", "--dropout", "0.3"]], ids=lambda o: o[0])
def test_a_resume_keeps_dtype_matmul_precision_and_micro_batch(option, tmp_path):
    whole = _losses(tmp_path, "whole", *option, "--steps", "6")
    first = _losses(tmp_path, "first", *option, "--steps", "3", "--total-steps", "6",
                    "--save", str(tmp_path / "half.st"))
    rest = _losses(tmp_path, "rest", "--steps", "6", "--resume", str(tmp_path / "half.st"))
    assert first + rest == whole  # the same steps, bit for bit
    flag, value = option[:2]
    other = {"--dtype": "float32", "--matmul-precision": "float32", "--micro-batch": "32"}[flag]
    with pytest.raises(SystemExit, match=f"was trained with {flag} {value}, not {flag} {other}"):
        cli.main(["train", *MLP, "--steps", "6", "--resume", str(tmp_path / "half.st"), flag, other])


def test_the_save_after_a_non_finite_loss_resumes_on_the_failed_step_s_batch(tmp_path):
    save = tmp_path / "run.st"
    with pytest.raises(SystemExit, match=r"loss is nan at step 4.*The 3 steps before it are saved"):
        cli.main(["train", *MLP, "--steps", "10", "--optimizer", "sgd", "--schedule", "constant", "--clip", "0",
                  "--lr", "1e8", "--save", str(save)])
    meta = read_metadata(save)
    assert meta["step"] == 3
    assert meta["extra"]["loader"]["cursor"] == 3 * 64  # the batches of the 3 saved steps, not the failed 4th's


def test_rewind_undoes_a_draw_that_shuffled_a_new_epoch():
    loader = BatchLoader(np.arange(10.0)[:, None], np.arange(10), 4, rng=np.random.default_rng(0))
    loader.next()
    loader.next()  # 8 of the epoch's 10 rows drawn: the next batch of 4 shuffles epoch 2 first
    before = loader.state()
    drawn = loader.next()[1].copy()
    assert loader.state()["rng"] != before["rng"]  # that draw moved the generator
    loader.rewind()
    assert loader.state() == before  # order, cursor and generator as before the draw
    np.testing.assert_array_equal(loader.next()[1], drawn)  # the same shuffle, the same batch
    loader.rewind()
    with pytest.raises(RuntimeError, match="undoes one next"):
        loader.rewind()


def test_rewind_within_an_epoch():  # only the cursor moves back
    loader = BatchLoader(np.arange(12.0)[:, None], np.arange(12), 3, rng=np.random.default_rng(1))
    loader.next()
    before = loader.state()
    drawn = loader.next()[1].copy()
    loader.rewind()
    assert loader.state() == before
    np.testing.assert_array_equal(loader.next()[1], drawn)


def test_clip_grad_value_takes_foreach_as_torch():
    g = np.array([[0.3, -0.9], [2.0, -0.1]])
    p = ta.tensor(np.zeros((2, 2)), requires_grad=True)
    p.grad = g.copy()
    tp = torch.zeros(2, 2, requires_grad=True)
    tp.grad = torch.tensor(g, dtype=torch.float32)
    for foreach in (None, True, False):
        clip_grad_value_([p], 0.5, foreach=foreach)
        torch.nn.utils.clip_grad_value_([tp], 0.5, foreach=foreach)
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), rtol=1e-7)


def test_init_edges_as_torch():
    with pytest.raises(ValueError):
        torch.nn.init.xavier_uniform_(torch.empty(0))
    with pytest.raises(ValueError, match="at least 2 dimensions, got shape \\(0,\\)"):
        init.xavier_uniform_(ta.tensor(np.empty(0)))
    t = ta.tensor(np.zeros((64, 32)))
    init.kaiming_uniform_(t, mode="FAN_OUT", rng=np.random.default_rng(0))
    bound = torch.nn.init.calculate_gain("leaky_relu", 0.0) * np.sqrt(3.0 / 64)  # fan_out of (64, 32) is 64
    assert 0.9 * bound < np.abs(t.numpy()).max() <= bound
