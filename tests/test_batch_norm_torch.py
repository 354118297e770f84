"""nn.BatchNorm1d / BatchNorm2d and F.batch_norm (tensorarena/nn/batch_norm.py) against torch 2.13.0: values,
gradients, running statistics (momentum and cumulative), eval mode, state_dict, and training on the fused route
(both replays) with the running statistics moving as torch's. On 6bfe3c2 all 16 tests fail (README listed
BatchNorm as missing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import fused_steps_match_torch, module_matches_torch

TOL = {np.float32: 2e-5, np.float64: 1e-11}


def _pair(cls, features, dtype=np.float64, **kw):
    ours = getattr(ta.nn, cls)(features, dtype=dtype, **kw)
    theirs = getattr(torch.nn, cls)(features, dtype=torch.float64 if dtype == np.float64 else torch.float32, **kw)
    with torch.no_grad():
        if theirs.weight is not None:
            theirs.weight.uniform_(0.5, 1.5)
        if theirs.bias is not None:
            theirs.bias.uniform_(-0.5, 0.5)
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def _stats_equal(ours, theirs, tol):
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name).numpy(), rtol=tol, atol=tol,
                                   err_msg=name)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked)


@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (6, 4)), ("BatchNorm1d", (5, 4, 3)),
                                       ("BatchNorm2d", (3, 4, 2, 5))])
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("affine", [True, False])
def test_training_values_gradients_and_running_stats_match_torch(cls, shape, momentum, affine):
    ours, theirs = _pair(cls, 4, momentum=momentum, affine=affine)
    assert repr(ours) == repr(theirs) and list(ours.state_dict()) == list(theirs.state_dict())
    rng = np.random.default_rng(0)
    for _ in range(3):
        module_matches_torch(ours, theirs, rng.standard_normal(shape) * 2 + 1, rng.standard_normal(shape), tol=1e-10)
    _stats_equal(ours, theirs, 1e-12)
    if affine:
        np.testing.assert_allclose(np.asarray(ours.weight.grad), theirs.weight.grad.numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(np.asarray(ours.bias.grad), theirs.bias.grad.numpy(), rtol=1e-10, atol=1e-10)
    ours.eval()
    theirs.eval()
    x = rng.standard_normal(shape)
    np.testing.assert_allclose(ours(ta.tensor(x)).numpy(), theirs(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-12, atol=1e-12)
    _stats_equal(ours, theirs, 1e-12)  # eval mode leaves them alone


def test_without_running_stats_it_normalises_by_the_batch_in_eval_mode_too():
    ours, theirs = _pair("BatchNorm1d", 3, track_running_stats=False)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    ours.eval()
    theirs.eval()
    x = np.random.default_rng(1).standard_normal((7, 3))
    np.testing.assert_allclose(ours(ta.tensor(x)).numpy(), theirs(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-12, atol=1e-12)


def test_bad_input_is_refused_saying_what_is_wrong():
    bn = ta.nn.BatchNorm1d(4)
    with pytest.raises(ValueError, match=r"Expected more than 1 value per channel when training, got input size "
                                         r"\(1, 4\)"):
        bn(ta.randn(1, 4))
    bn.eval()
    assert bn(ta.randn(1, 4)).shape == (1, 4)  # eval mode takes a single row, as torch
    with pytest.raises(ValueError, match=r"BatchNorm1d\(4\) expects input of 2-D or 3-D shape \(N, 4, \.\.\.\), "
                                         r"got \(2, 3\)"):
        bn(ta.randn(2, 3))
    with pytest.raises(ValueError, match=r"BatchNorm2d\(4\) expects input of 4-D"):
        ta.nn.BatchNorm2d(4)(ta.randn(2, 4))


@pytest.mark.parametrize("replay", ["captured", "python"])
def test_an_mlp_with_batch_norm_trains_on_the_fused_route_as_torch(replay):
    ta.manual_seed(0)  # the same initial weights whichever tests ran before in this process
    model = ta.nn.Sequential(ta.nn.Linear(6, 8), ta.nn.BatchNorm1d(8), ta.nn.ReLU(), ta.nn.Linear(8, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), ta.nn.functional.cross_entropy,
                      route="fused", fused_replay=replay)
    topt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((16, 6)).astype(np.float32), rng.integers(0, 3, 16)) for _ in range(6)]
    fused_steps_match_torch(trainer, topt, lambda x, y: torch.nn.functional.cross_entropy(twin(x), y), batches)
    assert trainer.fused.replay == replay
    _stats_equal(model[1], twin[1], 1e-5)  # the running statistics moved on every replayed step
    x = rng.standard_normal((9, 6)).astype(np.float32)
    twin.eval()
    with torch.no_grad():
        want = twin(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-4, atol=1e-5)  # eval mode: running statistics
    assert model.training and model[1].training
