"""cross_entropy(weight=...) runs nll_loss on log_softmax (ops/loss.py), and its errors named nll_loss, a function
the user never called. Each case here raises what torch raises (the type) and names cross_entropy now.
On d210856 the three cross_entropy cases fail (they said "nll_loss: ..."); nll_loss's own keep its name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.nn import functional as F

CASES = {"target out of range": (np.array([0, 1, 2, 5]), np.ones(3, np.float32), IndexError, "Target 5 is out of"),
         "weight of 4 classes": (np.array([0, 1, 2, 1]), np.ones(4, np.float32), ValueError, "weight must have shape"),
         "weight float64": (np.array([0, 1, 2, 1]), np.ones(3, np.float64), TypeError, "weight has dtype float64")}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fn", ["cross_entropy", "nll_loss"])
def test_weighted_loss_errors_name_the_function_called(fn, case):
    target, weight, ours, words = CASES[case]
    logits = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(ours, match=f"^{fn}: .*{words}"):
        getattr(F, fn)(ta.tensor(logits, requires_grad=True), ta.tensor(target), weight=ta.tensor(weight))
    # torch refuses each too (its types: IndexError, RuntimeError for a bad weight)
    with pytest.raises((IndexError, RuntimeError)):
        getattr(torch.nn.functional, fn)(torch.tensor(logits), torch.tensor(target), weight=torch.tensor(weight))
