"""torch.nn's names added together: F.relu6 F.hardtanh F.logsigmoid F.mish F.cosine_similarity and their modules,
nn.Flatten nn.Unflatten, nn.init.kaiming_normal_ and xavier_normal_; values and gradients against torch, float32
and float64, and a fused step built from them against torch's loop.

On the commit before them every test here fails: none of the names existed (AttributeError).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorarena as ta
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import fused_steps_match_torch
from tests.reference import DTYPES, check_op, randn

TF = ta.nn.functional
# Each activation's inputs hold its kinks and bounds exactly (-1, 1, 0, 6), where torch picks the gradient, and
# values far out (+-30), where a naive formula overflows.
KINKS = np.r_[randn(1, 12) * 4, -1.0, 1.0, 0.0, 6.0, -30.0, 30.0, 2.0, -2.0]

ACTIVATIONS = {
    "relu6": (TF.relu6, F.relu6, ta.nn.ReLU6(), torch.nn.ReLU6()),
    "hardtanh": (TF.hardtanh, F.hardtanh, ta.nn.Hardtanh(), torch.nn.Hardtanh()),
    "hardtanh_bounds": (lambda x: TF.hardtanh(x, -2.0, 2.0), lambda x: F.hardtanh(x, -2.0, 2.0),
                        ta.nn.Hardtanh(-2.0, 2.0), torch.nn.Hardtanh(-2.0, 2.0)),
    "logsigmoid": (TF.logsigmoid, F.logsigmoid, ta.nn.LogSigmoid(), torch.nn.LogSigmoid()),
    "mish": (TF.mish, F.mish, ta.nn.Mish(), torch.nn.Mish()),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_and_its_module_match_torch(name, dtype):
    ours, theirs, module, torch_module = ACTIVATIONS[name]
    check_op(ours, theirs, [KINKS], dtype=dtype)
    check_op(module, torch_module, [KINKS.reshape(4, 5)], dtype=dtype)


def test_relu6_and_hardtanh_of_integers_clamp_without_gradient_as_torch():
    ints = np.arange(-3, 10)
    np.testing.assert_array_equal(TF.relu6(ta.tensor(ints)).numpy(), F.relu6(torch.from_numpy(ints)).numpy())
    np.testing.assert_array_equal(TF.hardtanh(ta.tensor(ints), 0, 2).numpy(),
                                  F.hardtanh(torch.from_numpy(ints), 0, 2).numpy())
    assert TF.relu6(ta.tensor(ints)).dtype == np.int64
    with pytest.raises(TypeError, match="floating point"):
        TF.logsigmoid(ta.tensor(ints))  # torch: "log_sigmoid_cpu" not implemented for 'Long'


def test_activation_modules_repr_and_refusals_as_torch():
    assert repr(ta.nn.ReLU6()) == repr(torch.nn.ReLU6())
    assert repr(ta.nn.Hardtanh(-2.0, 2.0)) == repr(torch.nn.Hardtanh(-2.0, 2.0))
    assert repr(ta.nn.Mish()) == repr(torch.nn.Mish())
    with pytest.raises(ValueError, match="max_val must be greater"):
        ta.nn.Hardtanh(1.0, -1.0)
    with pytest.raises(ValueError, match="inplace"):
        TF.relu6(ta.ones(2), inplace=True)


def _cosine_inputs(seed):
    x1, x2 = randn(seed, (4, 5)), randn(seed + 1, (4, 5))
    x1[1] *= 1e-10  # a norm below eps: torch clamps it, and its gradient passes the clamp as if there were none
    x2[2] = 0.0  # a zero row: the norm's gradient is 0 there, as torch's
    return x1, x2


@pytest.mark.parametrize("dtype", DTYPES)
def test_cosine_similarity_matches_torch_eps_and_all(dtype):
    x1, x2 = _cosine_inputs(3)
    check_op(TF.cosine_similarity, F.cosine_similarity, [x1, x2], dtype=dtype)
    check_op(lambda a, b: TF.cosine_similarity(a, b, dim=0, eps=0.5),
             lambda a, b: F.cosine_similarity(a, b, dim=0, eps=0.5), [x1, x2], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cosine_similarity_broadcasts_before_the_norms_as_torch(dtype):
    # dim 0 is the broadcast one: the norm of the broadcast x1 is sqrt(4) times its own, and torch takes that one
    x1, x2 = randn(5, (1, 3)), randn(6, (4, 3))
    check_op(lambda a, b: TF.cosine_similarity(a, b, dim=0), lambda a, b: F.cosine_similarity(a, b, dim=0),
             [x1, x2], dtype=dtype)
    check_op(TF.cosine_similarity, F.cosine_similarity, [x1, x2], dtype=dtype)
    with pytest.raises(ValueError, match="do not broadcast"):
        TF.cosine_similarity(ta.zeros(2, 3), ta.zeros(4, 3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_flatten_and_unflatten_modules_match_torch(dtype):
    x = randn(7, (2, 3, 4, 5))
    check_op(ta.nn.Flatten(), torch.nn.Flatten(), [x], dtype=dtype)
    check_op(ta.nn.Flatten(0, 2), torch.nn.Flatten(0, 2), [x], dtype=dtype)
    check_op(ta.nn.Unflatten(1, (3, 1, -1)), torch.nn.Unflatten(1, (3, 1, -1)), [randn(8, (2, 12))], dtype=dtype)
    assert repr(ta.nn.Flatten()) == repr(torch.nn.Flatten())
    assert repr(ta.nn.Unflatten(1, (3, 4))) == repr(torch.nn.Unflatten(1, (3, 4)))
    assert ta.nn.Identity(54, unused=True)(x) is x


@pytest.mark.parametrize("fill, kwargs, fan", [
    ("kaiming_normal_", {}, "in"),
    ("kaiming_normal_", {"mode": "fan_out", "nonlinearity": "relu"}, "out"),
    ("kaiming_normal_", {"a": 0.2}, "in"),
    ("xavier_normal_", {}, "both"),
    ("xavier_normal_", {"gain": 2.0}, "both"),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_inits_draw_with_torchs_std(fill, kwargs, fan, dtype):
    shape = (300, 200, 3)  # a receptive field of 3: fan_in = 600, fan_out = 900
    ours = ta.zeros(*shape, dtype=dtype)
    getattr(ta.nn.init, fill)(ours, rng=np.random.default_rng(0), **kwargs)
    theirs = torch.zeros(*shape, dtype=torch.float64)
    torch.manual_seed(0)
    getattr(torch.nn.init, fill)(theirs, **kwargs)
    if fill == "kaiming_normal_":
        gain = torch.nn.init.calculate_gain(kwargs.get("nonlinearity", "leaky_relu"), kwargs.get("a", 0))
        want = gain / math.sqrt(600 if fan == "in" else 900)
    else:
        want = kwargs.get("gain", 1.0) * math.sqrt(2.0 / (600 + 900))
    # 180 000 draws: the sample std is within 1% of the formula's, for ours and torch's alike
    assert ours.numpy().std() == pytest.approx(want, rel=0.01)
    assert theirs.numpy().std() == pytest.approx(want, rel=0.01)
    assert abs(ours.numpy().mean()) < want * 0.01
    assert ours.dtype == dtype


def test_normal_inits_refuse_as_the_uniform_ones():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ta.nn.init.xavier_normal_(ta.zeros(3))
    with pytest.raises(ValueError, match="mode"):
        ta.nn.init.kaiming_normal_(ta.zeros(3, 3), mode="fan_avg")
    empty = ta.zeros(0, 3)
    assert ta.nn.init.kaiming_normal_(empty) is empty


def _build(model, nn, eye) -> None:
    model.fc1, model.fc2, model.fc3 = nn.Linear(4, 8), nn.Linear(8, 6), nn.Linear(6, 3)
    model.mish, model.relu6 = nn.Mish(), nn.ReLU6()
    model.unflatten, model.flatten = nn.Unflatten(1, (2, 3)), nn.Flatten()
    model.mix = nn.Parameter(eye)


def _forward(model, x, lib, fn):
    h = model.mish(model.fc1(x))
    h = model.relu6(h * 3) + fn.logsigmoid(h)
    h = model.flatten(model.unflatten(model.fc2(h)))  # (8, 6) -> (8, 2, 3) -> (8, 6)
    h = fn.hardtanh(h, -2.0, 2.0).sin() + h.square() * (h.square() + 1).rsqrt()
    return model.fc3(lib.mm(h, model.mix))


class _Tiny(ta.nn.Module):
    """The new layers and ops in one model: Mish, ReLU6, Unflatten/Flatten, hardtanh, logsigmoid, sin, square,
    rsqrt, mm."""

    def __init__(self):
        super().__init__()
        _build(self, ta.nn, ta.tensor(np.eye(6, dtype=np.float32)))

    def forward(self, x):
        return _forward(self, x, ta, TF)


class _TinyTorch(torch.nn.Module):
    def __init__(self, twin: _Tiny):
        super().__init__()
        _build(self, torch.nn, torch.eye(6))
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(torch.from_numpy(np.array(twin.state_dict()[name])))

    def forward(self, x):
        return _forward(self, x, torch, F)


def test_fused_step_with_the_new_layers_matches_torch():
    model = _Tiny()
    twin = _TinyTorch(model)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1),
                      lambda out, y: TF.mse_loss(out, y) + (1 - TF.cosine_similarity(out, y)).mean(), route="fused")
    topt = torch.optim.SGD(twin.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32))
               for _ in range(3)]

    def torch_loss(x, y):
        out = twin(x)
        return F.mse_loss(out, y) + (1 - F.cosine_similarity(out, y)).mean()

    fused_steps_match_torch(trainer, topt, torch_loss, batches)
    theirs = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), theirs[name].detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
