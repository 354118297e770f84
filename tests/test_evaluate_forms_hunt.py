"""Trainer.evaluate on the batch forms step() takes (a helper agent's hunt of the evaluation API, against torch).

1. Per-position logits in torch's layout, (N, C, d...) with (N, d...) class indices, which cross_entropy takes:
   accuracy was the argmax over the last axis, silently wrong when C == d (0.2375 against torch's 0.3375) and
   None otherwise. Classes are on axis 1 for a class-index loss's logits of 3 or more dimensions now.
2. A dict batch, which step() hands to the model as it is: evaluate counted its keys as rows and blamed the
   targets. Its arrays are cut row by row now.

On 745266e (before the fix) 3 of this file's 3 tests fail:
    git worktree add /tmp/wt 745266e && cp tests/test_evaluate_forms_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_evaluate_forms_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorarena import nn, optim
from tensorarena.nn.functional import cross_entropy
from tensorarena.tensor import Tensor
from tensorarena.train.trainer import Trainer


class Tagger(nn.Module):
    """A per-position classifier returning torch-layout logits (N, C, T)."""

    def __init__(self, classes: int):
        super().__init__()
        self.lin = nn.Linear(6, classes, rng=np.random.default_rng(0))

    def forward(self, x):
        return self.lin(x).transpose(1, 2)


@pytest.mark.parametrize("classes", [4, 5])  # 4 == T: the shapes passed the last-axis check
def test_accuracy_of_per_position_logits_is_torchs(classes):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((20, 4, 6)).astype(np.float32), rng.integers(0, classes, (20, 4))
    model = Tagger(classes)
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="eager")
    trainer.step(x[:8], y[:8])
    result = trainer.evaluate(x, y, batch_size=8)
    weight, bias = (torch.from_numpy(a.astype(np.float64)) for a in (model.lin.weight.data, model.lin.bias.data))
    logits = (torch.from_numpy(x.astype(np.float64)) @ weight.T + bias).transpose(1, 2)
    np.testing.assert_allclose(result["loss"], torch.nn.functional.cross_entropy(logits, torch.from_numpy(y)).item(),
                               rtol=1e-5)
    assert result["accuracy"] == float((logits.argmax(1).numpy() == y).mean())


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 4, rng=np.random.default_rng(0))

    def forward(self, batch):
        return self.lin(Tensor(batch["x"]))


def test_evaluate_takes_the_dict_batch_step_takes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 12)).astype(np.float32)
    y = x[:, :4].argmax(1)
    model = DictModel()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="eager")
    trainer.step({"x": x}, y)
    result = trainer.evaluate({"x": x}, y, batch_size=4)
    logits = torch.from_numpy(x.astype(np.float64)) @ torch.from_numpy(model.lin.weight.data.astype(np.float64)).T \
        + torch.from_numpy(model.lin.bias.data.astype(np.float64))
    np.testing.assert_allclose(result["loss"], torch.nn.functional.cross_entropy(logits, torch.from_numpy(y)).item(),
                               rtol=1e-5)
    assert result["accuracy"] == float((logits.argmax(1).numpy() == y).mean())
