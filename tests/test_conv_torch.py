"""F.unfold / F.fold, F.conv1d / F.conv2d and nn.Conv1d / nn.Conv2d (ops/conv.py, nn/conv.py) against torch 2.13.0:
values and the gradients of input, weight and bias over a grid of stride, padding ("same" and "valid" too),
dilation, groups and odd sizes (float64 1e-10, float32 1e-5); the modules' arguments, repr, state_dict (torch's
loads) and default init; the refusals; and a small CNN trained with SGD on the eager route and both replays of the
fused route as torch trains it (tests/test_pool_torch.py checks that a fused CNN replay allocates no array memory).

On 96541a0 (before convolutions existed) all 57 tests fail (57 of 57: AttributeError, no Conv2d / conv2d / unfold;
the README test: convolution listed as missing):
    git archive 96541a0 | tar -x -C /tmp/hunt/conv/base && cp tests/test_conv_torch.py /tmp/hunt/conv/base/tests/ && \
        cd /tmp/hunt/conv/base && NUMBA_NUM_THREADS=1 PYTHONPATH=$PWD \
        python -m pytest -q -p no:cacheprovider tests/test_conv_torch.py
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.kernels import gemm_bf16
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import fused_steps_match_torch, module_matches_torch, steps_match_torch

F, TF = ta.nn.functional, torch.nn.functional
TOL = {np.float64: 1e-10, np.float32: 1e-5}
README = Path(__file__).resolve().parent.parent / "README.md"
# torch's own note that its "same" padding of an even kernel copies the input (ours never does)
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths:UserWarning")


def _both(our_fn, their_fn, arrays, dtype=np.float64, seed=1):
    """our_fn and their_fn on the same arrays (a None stays None), backward from the same random upstream
    gradient: the output and every array's gradient agree to TOL[dtype]."""
    ours = [None if a is None else ta.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    theirs = [None if a is None else torch.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    got, want = our_fn(*ours), their_fn(*theirs)
    assert tuple(got.shape) == tuple(want.shape)
    g = np.random.default_rng(seed).standard_normal(tuple(want.shape)).astype(dtype)
    (got * ta.tensor(g)).sum().backward()
    (want * torch.from_numpy(g)).sum().backward()
    tol = TOL[dtype]
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a is not None:
            np.testing.assert_allclose(np.asarray(a.grad), b.grad.numpy(), rtol=tol, atol=tol, err_msg=f"grad {i}")


def _randn(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape)


# -- unfold and fold ---------------------------------------------------------------------------------------------

BLOCKS = [  # (H, W), kernel_size, dilation, padding, stride
    ((5, 6), 3, 1, 0, 1), ((7, 5), (2, 3), (2, 1), (1, 2), (2, 3)), ((4, 4), 4, 1, 3, 5),
    ((6, 7), (3, 1), 1, (0, 1), (1, 2)), ((1, 9), (1, 4), (1, 2), 0, (1, 1)), ((3, 3), 1, 1, 2, 2)]


@pytest.mark.parametrize("size,kernel,dilation,padding,stride", BLOCKS)
@pytest.mark.parametrize("batched", [True, False])
def test_unfold_and_fold_match_torch(size, kernel, dilation, padding, stride, batched):
    lead = (2, 3) if batched else (3,)
    args = (kernel, dilation, padding, stride)
    _both(lambda x: F.unfold(x, *args), lambda x: TF.unfold(x, *args), [_randn(*lead, *size)])
    blocks = TF.unfold(torch.zeros((1, 3) + size), *args).shape[1:]
    _both(lambda c: F.fold(c, size, *args), lambda c: TF.fold(c, size, *args),
          [_randn(*lead[:-1], *blocks, seed=1)])


# -- conv2d and conv1d -------------------------------------------------------------------------------------------

CONV2D = [  # input shape, weight shape, bias, options
    ((2, 3, 7, 6), (4, 3, 3, 3), True, {}),
    ((2, 4, 7, 6), (6, 2, 3, 2), True, dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    ((2, 4, 7, 6), (4, 1, 4, 3), False, dict(padding="same", dilation=2, groups=4)),
    ((2, 4, 8, 5), (6, 4, 2, 2), True, dict(padding="same")),  # even kernel: the odd padding goes after
    ((3, 7, 6), (4, 3, 2, 2), True, dict(padding="valid", stride=3)),  # unbatched
    ((1, 6, 5, 9), (9, 2, 5, 1), True, dict(stride=(1, 4), padding=(2, 0), groups=3)),
    ((3, 2, 4, 4), (5, 2, 4, 4), True, dict(padding=1, stride=2)),  # kernel = input: padding makes the blocks
    ((2, 3, 6, 6), (2, 3, 1, 1), True, dict(stride=2)),  # 1x1
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("x_shape,w_shape,bias,options", CONV2D)
def test_conv2d_values_and_gradients_match_torch(x_shape, w_shape, bias, options, dtype):
    arrays = [_randn(*x_shape), _randn(*w_shape, seed=1), _randn(w_shape[0], seed=2) if bias else None]
    _both(lambda x, w, b: F.conv2d(x, w, b, **options), lambda x, w, b: TF.conv2d(x, w, b, **options), arrays, dtype)


def test_conv2d_of_a_channels_last_input_permuted_to_nchw_matches_torch():
    # images often arrive (N, H, W, C) and are permuted: the unfold reads the strided view as it is
    nhwc = _randn(2, 7, 6, 4)
    _both(lambda x, w, b: F.conv2d(x.permute(0, 3, 1, 2), w, b, padding=1, groups=2),
          lambda x, w, b: TF.conv2d(x.permute(0, 3, 1, 2), w, b, padding=1, groups=2),
          [nhwc, _randn(6, 2, 3, 3, seed=1), _randn(6, seed=2)])


CONV1D = [
    ((2, 3, 9), (4, 3, 3), True, {}),
    ((2, 4, 9), (6, 2, 3), True, dict(stride=2, padding=1, groups=2)),
    ((2, 4, 9), (6, 4, 4), True, dict(padding="same")),
    ((4, 11), (6, 4, 4), False, dict(padding="same", dilation=3)),
    ((3, 6, 10), (3, 2, 5), True, dict(stride=3, padding=4, dilation=2, groups=3)),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("x_shape,w_shape,bias,options", CONV1D)
def test_conv1d_values_and_gradients_match_torch(x_shape, w_shape, bias, options, dtype):
    arrays = [_randn(*x_shape), _randn(*w_shape, seed=1), _randn(w_shape[0], seed=2) if bias else None]
    _both(lambda x, w, b: F.conv1d(x, w, b, **options), lambda x, w, b: TF.conv1d(x, w, b, **options), arrays, dtype)


# -- the modules -------------------------------------------------------------------------------------------------

MODULES = [("Conv2d", (3, 6, 3), {}, (2, 3, 7, 8)),
           ("Conv2d", (4, 6, (3, 2)), dict(stride=2, padding=(1, 0), dilation=(2, 1), groups=2, bias=False),
            (2, 4, 9, 6)),
           ("Conv2d", (4, 8, 2), dict(padding="same", groups=4), (4, 5, 5)),
           ("Conv2d", (3, 2, 3), dict(padding="valid"), (1, 3, 4, 5)),
           ("Conv1d", (4, 6, 3), dict(padding="same", groups=2), (2, 4, 7)),
           ("Conv1d", (2, 3, 4), dict(stride=3, padding=2, dilation=2), (3, 2, 11))]


@pytest.mark.parametrize("cls,args,options,shape", MODULES)
def test_modules_load_torchs_state_dict_and_match_it(cls, args, options, shape):
    theirs = getattr(torch.nn, cls)(*args, **options, dtype=torch.float64)
    ours = getattr(ta.nn, cls)(*args, **options, dtype=np.float64)
    assert repr(ours) == repr(theirs)
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for name in ("kernel_size", "stride", "padding", "dilation", "groups", "in_channels", "out_channels",
                 "padding_mode"):
        assert getattr(ours, name) == getattr(theirs, name), name
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    module_matches_torch(ours, theirs, _randn(*shape), _randn(*theirs(torch.zeros(shape, dtype=torch.float64)).shape,
                                                                seed=3), tol=1e-10)
    np.testing.assert_allclose(np.asarray(ours.weight.grad), theirs.weight.grad.numpy(), rtol=1e-10, atol=1e-10)
    if theirs.bias is not None:
        np.testing.assert_allclose(np.asarray(ours.bias.grad), theirs.bias.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_default_init_is_torchs_kaiming_uniform_and_bias_bound():
    # torch: kaiming_uniform_(a=sqrt(5)) gives U(+-1/sqrt(fan_in)) for the weight, and the bias U(+-1/sqrt(fan_in));
    # fan_in = in_channels / groups * kh * kw = 4 * 9 = 36, so both bounds are 1/6.
    conv = ta.nn.Conv2d(8, 64, 3, groups=2, rng=np.random.default_rng(0))
    assert conv.weight.shape == (64, 4, 3, 3) and conv.bias.shape == (64,) and conv.weight.dtype == np.float32
    bound = 1 / 6
    w = conv.weight.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert w.std() == pytest.approx(bound / math.sqrt(3), rel=0.03)  # a uniform's std; 2304 draws
    b = conv.bias.numpy()
    assert np.abs(b).max() <= bound and np.abs(b).max() > 0.8 * bound
    one = ta.nn.Conv1d(2, 3, 5, bias=False, rng=np.random.default_rng(0))
    assert one.bias is None and list(one.state_dict()) == ["weight"]
    assert np.abs(one.weight.numpy()).max() <= 1 / math.sqrt(10)
    # the same seed draws the same weights
    np.testing.assert_array_equal(ta.nn.Conv2d(8, 64, 3, groups=2, rng=np.random.default_rng(0)).weight.numpy(), w)


# -- refusals ----------------------------------------------------------------------------------------------------

def test_clear_errors_for_wrong_shapes_and_arguments():
    x, w = ta.randn(2, 4, 5, 5), ta.randn(8, 3, 3, 3)
    with pytest.raises(ValueError, match=r"input of shape \[2, 4, 5, 5\] has 4 channels, but the weight of shape "
                                         r"\[8, 3, 3, 3\] with groups=1 expects 3"):
        F.conv2d(x, w)
    with pytest.raises(ValueError, match=r"input of shape \[2, 4, 5, 5\] has 4 channels.*\[8, 3, 3, 3\]"):
        ta.nn.Conv2d(3, 8, 3)(x)
    with pytest.raises(ValueError, match=r"kernel \(8, 8\).*larger than the padded input \(7, 7\).*\[2, 4, 5, 5\]"):
        F.conv2d(x, ta.randn(1, 4, 8, 8), padding=1)
    assert F.conv2d(x, ta.randn(1, 4, 7, 7), padding=1).shape == (2, 1, 1, 1)  # as large as it: one block
    with pytest.raises(ValueError, match=r"kernel \(4,\) \(dilation \(2,\), spanning \(7,\)\) is larger"):
        F.conv1d(ta.randn(1, 2, 6), ta.randn(1, 2, 4), dilation=2)
    with pytest.raises(ValueError, match=r"weight's 6 output channels.*divisible by groups=4"):
        F.conv2d(x, ta.randn(6, 1, 3, 3), groups=4)
    with pytest.raises(ValueError, match=r"in_channels \(3\) must be divisible by groups \(2\)"):
        ta.nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"out_channels \(3\) must be divisible by groups \(2\)"):
        ta.nn.Conv2d(4, 3, 3, groups=2)
    with pytest.raises(ValueError, match=r"padding='same' is not supported for strided convolutions"):
        ta.nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match=r"invalid padding string 'full'"):
        F.conv1d(ta.randn(1, 2, 6), ta.randn(1, 2, 3), padding="full")
    with pytest.raises(ValueError, match=r"unbatched \(3-D\) or batched \(4-D\) input, got shape \[5, 5\]"):
        F.conv2d(ta.randn(5, 5), w)
    with pytest.raises(TypeError, match=r"input is float64 but the weight is float32"):
        ta.nn.Conv2d(4, 2, 3)(ta.randn(1, 4, 5, 5, dtype=ta.float64))
    with pytest.raises(NotImplementedError, match=r"padding_mode 'reflect' is not supported"):
        ta.nn.Conv2d(3, 4, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match=r"stride must be positive"):
        F.conv2d(x, ta.randn(2, 4, 3, 3), stride=0)
    with pytest.raises(ValueError, match=r"fold: output_size \(4, 4\).*3 \* 3 = 9 blocks, but the input"):
        F.fold(ta.randn(1, 4, 8), (4, 4), 2)
    with pytest.raises(ValueError, match=r"fold: the input's dimension 1 \(5"):
        F.fold(ta.randn(1, 5, 9), (4, 4), 2)
    with pytest.raises(TypeError, match=r"unfold: the input must be a float tensor"):
        F.unfold(ta.ones(1, 1, 3, 3, dtype=ta.int64), 2)


@pytest.mark.skipif(not gemm_bf16.available(), reason=f"no fast bfloat16 GEMM: {gemm_bf16.why_not()}")
def test_conv2d_takes_bfloat16_products_when_asked_for():
    # the convolution's product is the engine's 2-D matmul, so the float32 matmul precision applies to it
    rng = np.random.default_rng(0)
    x, conv = ta.tensor(rng.standard_normal((2, 8, 9, 9)).astype(np.float32)), ta.nn.Conv2d(8, 16, 3)
    full = conv(x).numpy()
    before = ta.kernels.calls[("gemm_bf16", "fused")]
    with ta.float32_matmul_precision("bfloat16"):
        rounded = conv(x).numpy()
    assert ta.kernels.calls[("gemm_bf16", "fused")] == before + 1
    assert 0 < np.abs(rounded - full).max() < 0.02  # bfloat16's 8-bit mantissa on 72-term sums of O(1) values


# -- a small CNN trains as torch's, on every route ---------------------------------------------------------------

def _cnn(dtype):
    ta.manual_seed(0)  # the same initial weights whichever tests ran before
    nn = ta.nn
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, 3, stride=2, groups=2, dtype=dtype), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 4, dtype=dtype))


def _torch_cnn(model):
    nn = torch.nn
    twin = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, 3, stride=2, groups=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    twin.to(torch.float64 if next(model.parameters()).dtype == np.float64 else torch.float32)
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    return twin


def _images(n, dtype, rows=5):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((rows, 3, 10, 9)).astype(dtype), rng.integers(0, 4, rows)) for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("route,replay", [("eager", "auto"), ("fused", "python"), ("fused", "captured"),
                                          ("fused", "auto")])
def test_a_small_cnn_trains_as_torchs(route, replay, dtype):
    model = _cnn(dtype)
    twin = _torch_cnn(model)
    opt = ta.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    trainer = Trainer(model, opt, F.cross_entropy, route=route, fused_replay=replay)
    batches, tol = _images(4, dtype), TOL[dtype] * 10 if dtype == np.float32 else 1e-9
    their_loss = lambda x, y: TF.cross_entropy(twin(x), y)  # noqa: E731
    if route == "fused":
        fused_steps_match_torch(trainer, topt, their_loss, batches, rel=tol)
        # auto takes the captured replay: every module here is tensorarena's
        assert trainer.fused.replay == ("captured" if replay == "auto" else replay)
        if trainer.fused.replay == "captured":
            assert trainer.fused.plan.capture.tape is not None, trainer.fused.plan.capture.note
    else:
        steps_match_torch(trainer, topt, their_loss, batches, rel=tol, route="eager")
    named = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), named[name].detach().numpy(), rtol=tol, atol=tol, err_msg=name)


def test_readme_lists_the_layers_and_no_longer_lists_convolution_as_missing():
    text = README.read_text()
    missing = text[text.index("- Not here (yet)"):]
    missing = missing[:missing.index("\n- ") if "\n- " in missing else missing.index("\n\n")]
    assert "convolution" not in missing and "recurrent layers" in missing
    layers = text[text.index("- Layers (`tensorarena.nn`)"):]
    layers = layers[:layers.index("\n- ")]
    for name in ("Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"):
        assert f"`{name}`" in layers and hasattr(ta.nn, name), name
