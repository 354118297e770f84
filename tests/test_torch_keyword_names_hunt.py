"""nn.functional and nn.init take torch's keyword names (input=, tensor=, val=), as ported code passes them.

Found by a helper's hunt of nn.functional against torch 2.13: F.softmax(input=x, dim=1), F.linear(input=x, ...),
F.cross_entropy(input=logits, target=y), F.one_hot(input=y), init.constant_(w, val=0.1) and init.normal_(tensor=w)
were refused with "unexpected keyword argument": the first parameters were named a, x, logits, indices, labels, t
and value.

On ff5a179 (before the rename) every test here fails:
    git worktree add /tmp/wt ff5a179 && cp tests/test_torch_keyword_names_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_torch_keyword_names_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn
from tensorarena.nn import functional as F
from tensorarena.nn import init

X = np.random.default_rng(0).standard_normal((4, 5))
W = np.random.default_rng(1).standard_normal((3, 5))
Y = np.array([0, 2, 1, 4])

CALLS = {  # ours, torch's: the same keyword call
    "softmax": (lambda f, t: f.softmax(input=t(X), dim=1)),
    "log_softmax": (lambda f, t: f.log_softmax(input=t(X), dim=1)),
    "gelu": (lambda f, t: f.gelu(input=t(X), approximate="tanh")),
    "relu": (lambda f, t: f.relu(input=t(X))),
    "sigmoid": (lambda f, t: f.sigmoid(input=t(X))),
    "tanh": (lambda f, t: f.tanh(input=t(X))),
    "dropout": (lambda f, t: f.dropout(input=t(X), p=0.5, training=False)),
    "layer_norm": (lambda f, t: f.layer_norm(input=t(X), normalized_shape=(5,))),
    "linear": (lambda f, t: f.linear(input=t(X), weight=t(W))),
    "embedding": (lambda f, t: f.embedding(input=t(Y), weight=t(X.T.copy()))),
    "one_hot": (lambda f, t: f.one_hot(input=t(Y), num_classes=6)),
    "cross_entropy": (lambda f, t: f.cross_entropy(input=t(X), target=t(Y))),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_functional_takes_torchs_keyword_names(name):
    ours = CALLS[name](F, ta.tensor).numpy()
    theirs = CALLS[name](torch.nn.functional, torch.tensor).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_init_takes_torchs_keyword_names():
    w = nn.Parameter(np.zeros((3, 4)))
    init.constant_(tensor=w, val=0.25)
    np.testing.assert_array_equal(w.numpy(), np.full((3, 4), 0.25))
    for fill in (init.zeros_, init.ones_):
        fill(tensor=w)
    for draw in (init.uniform_, init.normal_, init.trunc_normal_, init.kaiming_uniform_, init.xavier_uniform_):
        draw(tensor=w, rng=np.random.default_rng(0))
    assert np.isfinite(w.numpy()).all() and w.numpy().std() > 0
    assert init.calculate_fan_in_and_fan_out(tensor=w) == (4, 3)


def test_a_deferred_constant_fill_still_replays():
    with nn.deferred_init():
        layer = nn.Linear(4, 3)
        init.constant_(layer.bias, val=0.5)
    layer.materialize()
    np.testing.assert_array_equal(layer.bias.numpy(), np.full(3, 0.5, np.float32))
