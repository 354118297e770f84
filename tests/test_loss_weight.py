"""torch 2.13's elementwise weight= of mse_loss, l1_loss and huber_loss: values and gradients of input, target and
weight against torch, the errors, and a fused step with a weighted loss against torch's loop.

Before loss_weight.py the three refused weight= as an unexpected keyword: on the commit before it,
`python -m pytest -q tests/test_loss_weight.py` fails 33 of 33 (each test passes weight=).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorarena as ta
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import fused_steps_match_torch
from tests.reference import check_op, randn

LOSSES = {"mse_loss": {}, "l1_loss": {}, "huber_loss": {"delta": 0.7}}


def _inputs(seed, shape=(5, 3)):
    x, y = randn(seed, shape), randn(seed + 1, shape)
    weight = np.abs(randn(seed + 2, shape)) + 0.1  # torch's mean divides by sum(weight): keep it away from 0
    return x, y, weight


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weighted_loss_matches_torch(name, reduction, dtype):
    ours, theirs, kw = getattr(ta.nn.functional, name), getattr(F, name), LOSSES[name]
    check_op(lambda x, y, w: ours(x, y, reduction=reduction, weight=w, **kw),
             lambda x, y, w: theirs(x, y, reduction=reduction, weight=w, **kw), _inputs(3), dtype=dtype)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_two_means_differ_as_torchs(name):
    # mse/l1 divide by the weights' sum, huber by the element count: a weight of 2 everywhere shows which.
    x, y, _ = _inputs(7)
    weight = np.full_like(x, 2.0)
    ours = getattr(ta.nn.functional, name)(ta.tensor(x), ta.tensor(y), weight=weight, **LOSSES[name]).item()
    plain = getattr(ta.nn.functional, name)(ta.tensor(x), ta.tensor(y), **LOSSES[name]).item()
    assert ours == pytest.approx(plain if name != "huber_loss" else 2 * plain, rel=1e-6)
    want = getattr(F, name)(torch.tensor(x), torch.tensor(y), weight=torch.tensor(weight), **LOSSES[name]).item()
    assert ours == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_weight_as_data_takes_the_input_dtype(name):
    x, y, weight = _inputs(11)
    out = getattr(ta.nn.functional, name)(ta.tensor(x, dtype=np.float32), ta.tensor(y, dtype=np.float32),
                                         weight=weight.tolist(), reduction="none", **LOSSES[name])
    assert out.dtype == np.float32
    want = getattr(F, name)(torch.tensor(x), torch.tensor(y), weight=torch.tensor(weight), reduction="none",
                            **LOSSES[name])
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_weight_of_another_shape_is_refused_naming_both(name):
    x, y, _ = _inputs(13)
    with pytest.raises(ValueError, match=r"weight shape \(3,\) differs from input shape \(5, 3\)"):
        getattr(ta.nn.functional, name)(ta.tensor(x), ta.tensor(y), weight=np.ones(3), **LOSSES[name])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_bad_reduction_is_refused_with_a_weight(name):
    x, y, weight = _inputs(17)
    with pytest.raises(ValueError, match="reduction must be one of"):
        getattr(ta.nn.functional, name)(ta.tensor(x), ta.tensor(y), reduction="avg", weight=weight,
                                       **LOSSES[name])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_fused_step_with_a_weighted_loss_matches_torch(name):
    # The weighted loss is built from recorded ops, so it traces into the plan; three steps against torch's loop.
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    model = ta.nn.Linear(4, 3)
    tmodel = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.data[...] = w0
        model.bias.data[...] = 0
        tmodel.weight.copy_(torch.from_numpy(w0))
        tmodel.bias.zero_()
    weight = np.abs(rng.standard_normal((8, 3))).astype(np.float32) + 0.1
    loss_fn = getattr(ta.nn.functional, name)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1),
                      lambda out, y: loss_fn(out, y, weight=weight, **LOSSES[name]), route="fused")
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1)
    batches = [(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32))
               for _ in range(3)]
    fused_steps_match_torch(trainer, topt, lambda x, y: getattr(F, name)(
        tmodel(x), y, weight=torch.from_numpy(weight), **LOSSES[name]), batches)
    np.testing.assert_allclose(model.weight.numpy(), tmodel.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
