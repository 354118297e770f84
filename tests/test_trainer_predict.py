"""Trainer.predict: the model's outputs in eval mode, batch by batch, on every route (tensorarena/train/predict.py).
A hunt found evaluate the only way to run a trained Trainer's model on data; on 46fdccd every test here fails
(Trainer has no predict)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer


def _mlp_and_twin(dropout=0.5):
    model = ta.nn.Sequential(ta.nn.Linear(6, 16), ta.nn.ReLU(), ta.nn.Dropout(dropout), ta.nn.Linear(16, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(16, 3))
    return model, twin


def _copy(model, twin):
    with torch.no_grad():
        for p, q in zip(twin.parameters(), model.parameters()):
            p.copy_(torch.from_numpy(q.numpy().copy()))


@pytest.mark.parametrize("route", ["eager", "fused"])
@pytest.mark.parametrize("batch_size", [1, 4, 7, 50, None])
def test_predict_gives_torchs_eval_outputs_after_training(route, batch_size):
    rng = np.random.default_rng(0)
    model, twin = _mlp_and_twin()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route=route)
    for _ in range(3):
        trainer.step(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8))
    _copy(model, twin)
    x = rng.standard_normal((23, 6)).astype(np.float32)
    got = trainer.predict(x, batch_size=batch_size)
    twin.eval()
    with torch.no_grad():
        want = twin(torch.from_numpy(x)).numpy()
    assert isinstance(got, np.ndarray) and got.shape == (23, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # dropout off: eval mode
    assert model.training and all(m.training for m in model.modules())  # modes put back


def test_predict_on_the_fused_route_neither_retraces_nor_changes_training():
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8)) for _ in range(6)]
    x = rng.standard_normal((8, 6)).astype(np.float32)
    runs = []
    for with_predict in (False, True):
        ta.manual_seed(0)
        model, _ = _mlp_and_twin()
        trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused")
        losses = []
        for xb, yb in batches:
            losses.append(trainer.step(xb, yb).loss)
            if with_predict:
                trainer.predict(x)
        runs.append((losses, [p.numpy().copy() for p in model.parameters()], trainer.fused.traces))
    assert runs[0][0] == runs[1][0]  # bit for bit: predict draws no dropout mask and changes nothing
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)
    assert runs[1][2] == runs[0][2] == 1


def test_predict_on_the_streaming_route_equals_eager(tmp_path):
    config = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=32, depth=2, num_heads=4, dropout=0.1,
                       attention_dropout=0.1, dtype=np.float64)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3, 16, 16))
    outs = {}
    for route in ("eager", "streaming"):
        model = ViT(config, rng=np.random.default_rng(3))
        kw = {"store_dir": tmp_path / "store"} if route == "streaming" else {}
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route=route, **kw)
        trainer.step(rng.standard_normal((3, 3, 16, 16)), rng.integers(0, 5, 3))
        outs[route] = trainer.predict(x, batch_size=2)
        rng = np.random.default_rng(2)
        x = rng.standard_normal((5, 3, 16, 16))
        if route == "streaming":
            trainer.stream.close()
    assert outs["streaming"].shape == (5, 5)
    np.testing.assert_allclose(outs["streaming"], outs["eager"], rtol=0, atol=1e-12)


def test_predict_refuses_what_it_cannot_stack_saying_what_to_do():
    class Pair(ta.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = ta.nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x), x

    pair = Pair()
    trainer = Trainer(pair, optim.SGD(pair.parameters(), lr=0.1), lambda out, y: out[0].sum())
    with pytest.raises(TypeError, match="predict returns one array of outputs, and the model returned a tuple"):
        trainer.predict(np.ones((3, 2), np.float32))
    linear = ta.nn.Linear(2, 2)
    plain = Trainer(linear, optim.SGD(linear.parameters(), lr=0.1), cross_entropy)
    with pytest.raises(ValueError, match="the inputs have no rows"):
        plain.predict(np.ones((0, 2), np.float32))
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        plain.predict(np.ones((3, 2), np.float32), batch_size=0)
    assert plain.predict(ta.tensor(np.ones((3, 2), np.float32))).shape == (3, 2)  # a Tensor too
