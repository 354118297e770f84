"""SimCSE through the Trainer's API as step() takes it: a helper agent's hunt of the text models on every route.

1. Trainer.evaluate(inputs, None), for a model that returns its own loss, failed on every route with the fused
   route's message about array targets ("targets is of type ndarray"), though step(inputs, None) trains it.
2. micro_batch with SimCSE trained another loss on eager and fused, silently (InfoNCE over each micro-batch's
   sentences: 0.034 against the whole batch's 0.130); the CLI refused it, the streaming route failed at step 1
   with a shape error, and route="auto" chose streaming for it. Every route refuses it when it is built now.

On 745266e (before the fix) 8 of this file's 9 tests fail (the control passes: a classifier over rows still takes
micro_batch):
    git worktree add /tmp/wt 745266e && cp tests/test_simcse_routes_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_simcse_routes_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.compile import compile_step
from tensorarena.models.bert import BertConfig, BertModel
from tensorarena.models.simcse import SimCSE
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import StreamingRoute
from tensorarena.train.simcse_job import _model_loss
from tensorarena.train.trainer import Trainer

CFG = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 max_position_embeddings=16)
IDS = np.array([[5, 6, 7, 0], [8, 9, 0, 0], [3, 4, 5, 6], [11, 12, 13, 0], [20, 21, 0, 0], [30, 31, 32, 0]])


def _simcse() -> SimCSE:
    return SimCSE(BertModel(CFG, rng=np.random.default_rng(0)))


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
def test_evaluate_without_targets_gives_the_models_own_eval_loss(route, tmp_path):
    model = _simcse()
    trainer = Trainer(model, ta.optim.AdamW(model.parameters(), lr=1e-3), _model_loss, route=route,
                      store_dir=tmp_path / "store")
    trainer.step(IDS, None)
    result = trainer.evaluate(IDS, None, batch_size=len(IDS))
    if trainer.stream is not None:
        trainer.stream.to_memory()
    model.eval()
    with ta.no_grad():
        expected = float(model(ta.tensor(IDS)).item())
    assert result["accuracy"] is None
    np.testing.assert_allclose(result["loss"], expected, rtol=1e-5)


@pytest.mark.parametrize("route", ["eager", "fused", "streaming", "auto"])
def test_simcse_refuses_micro_batches_on_every_route(route, tmp_path):
    model = _simcse()
    with pytest.raises(ValueError, match="micro_batch=2 is not supported for SimCSE: its InfoNCE loss takes every "
                                         "other sentence"):
        Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), _model_loss, route=route, micro_batch=2,
                store_dir=tmp_path / "store")


def test_compile_step_and_the_streaming_route_refuse_it_too(tmp_path):
    model = _simcse()
    opt = ta.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not supported for SimCSE"):
        compile_step(model, _model_loss, opt, (IDS, None), micro_batch=2)
    with pytest.raises(ValueError, match="not supported for SimCSE"):
        StreamingRoute.from_memory(model, opt, _model_loss, tmp_path / "store", micro_batch=2)


def test_a_classifier_over_rows_still_takes_micro_batches():
    model = ta.nn.Sequential(ta.nn.Linear(4, 8), ta.nn.ReLU(), ta.nn.Linear(8, 3))
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), cross_entropy, micro_batch=2)
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    assert np.isfinite(trainer.step(x, np.array([0, 1, 2, 0, 1, 2])).loss)
