"""The small classifier the fused-route tests share, and batches for it: 12 features, 4 classes whose label is
the argmax of the first 4 features (so a few steps of training visibly lower the loss)."""

from __future__ import annotations

import numpy as np

from tensorarena.models import MLP, MLPConfig
from tensorarena.nn import Linear, Module


def small_mlp(seed=0, dropout=0.0, dtype=np.float32, hidden=(16,)) -> MLP:
    """MLP 12 -> hidden -> 4, its weights drawn from `seed`."""
    return MLP(MLPConfig(in_features=12, hidden=hidden, out_features=4, dropout=dropout, dtype=dtype),
               rng=np.random.default_rng(seed))


def labelled_rows(n=4, batch=16, features=12, classes=4, dtype=np.float32, seed=2) -> list[tuple]:
    """`n` batches (x (batch, features) of `dtype`, y int64 (batch,)) with y the argmax of x's first `classes`."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, features)).astype(dtype)
        out.append((x, x[:, :classes].argmax(axis=1).astype(np.int64)))
    return out


class HeadOnly(Module):
    """12 -> 64 -> 4 as a body and a head; tests give the optimizer the head only, the body left trainable (not
    frozen): gradients outside the optimizer (test_fused_programs_hunt, test_reports_hunt)."""

    def __init__(self):
        super().__init__()
        self.body = Linear(12, 64, rng=np.random.default_rng(0))
        self.head = Linear(64, 4, rng=np.random.default_rng(1))

    def forward(self, x):
        return self.head(self.body(x).relu())
