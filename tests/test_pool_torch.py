"""F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d and nn.MaxPool2d / AvgPool2d / AdaptiveAvgPool2d (ops/pool.py,
nn/pool.py) against torch 2.13.0: values and input gradients over a grid of kernel, stride, padding, dilation,
ceil_mode, count_include_pad, divisor_override and odd sizes (float64 1e-10, float32 1e-5), ties, NaN and -inf
in max pooling (torch's choice of the winner), integer max pooling, the modules' defaults and reprs, the refusals,
pooling layers trained on both replays of the fused route as torch trains them, and a fused CNN replay (convolution,
every pooling) that allocates no array memory.

On 96541a0 (before pooling existed) all 82 tests fail (82 of 82: AttributeError, no max_pool2d / MaxPool2d):
    git archive 96541a0 | tar -x -C /tmp/hunt/conv/base && cp tests/test_pool_torch.py /tmp/hunt/conv/base/tests/ && \
        cd /tmp/hunt/conv/base && NUMBA_NUM_THREADS=1 PYTHONPATH=$PWD \
        python -m pytest -q -p no:cacheprovider tests/test_pool_torch.py
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import fused_steps_match_torch, module_matches_torch

F, TF = ta.nn.functional, torch.nn.functional
TOL = {np.float64: 1e-10, np.float32: 1e-5}


def _match(name, x, *args, dtype=np.float64, **options):
    """F.<name> and torch's on x (values and the input's gradient from one random upstream gradient) to TOL."""
    ours, theirs = ta.tensor(x.astype(dtype), requires_grad=True), torch.tensor(x.astype(dtype), requires_grad=True)
    got, want = getattr(F, name)(ours, *args, **options), getattr(TF, name)(theirs, *args, **options)
    assert tuple(got.shape) == tuple(want.shape)
    g = np.random.default_rng(5).standard_normal(tuple(want.shape)).astype(dtype)
    (got * ta.tensor(g)).sum().backward()
    (want * torch.from_numpy(g)).sum().backward()
    tol = TOL[dtype]
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(ours.grad), theirs.grad.numpy(), rtol=tol, atol=tol)


def _x(*shape, ties=False):
    x = np.random.default_rng(sum(shape)).standard_normal(shape)
    return np.round(x * 2) / 2 if ties else x  # few distinct values: windows with several maxima


MAX = [  # shape, kernel_size, stride, padding, dilation, ceil_mode
    ((2, 3, 7, 6), 2, None, 0, 1, False), ((2, 3, 7, 6), 3, 2, 1, 1, False), ((2, 3, 7, 6), 3, 2, 1, 1, True),
    ((2, 3, 7, 6), (3, 2), (2, 1), (1, 1), (2, 1), True), ((3, 7, 6), 3, 1, 1, 1, True),
    ((1, 2, 9, 5), (2, 4), (3, 1), (1, 2), (3, 1), False), ((2, 1, 5, 5), 5, 5, 2, 1, True),
    ((2, 2, 5, 6), 2, 2, 1, 1, True)]  # ceil_mode's last window would start in the right padding: dropped


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil_mode", MAX)
def test_max_pool2d_matches_torch(shape, kernel, stride, padding, dilation, ceil_mode, ties, dtype):
    _match("max_pool2d", _x(*shape, ties=ties), kernel, stride, padding, dilation, ceil_mode=ceil_mode, dtype=dtype)


def test_max_pool2d_picks_torchs_winner_among_nan_and_minus_inf_and_pools_integers():
    x = np.full((1, 1, 4, 5), -np.inf)
    x[0, 0, 1, 1] = x[0, 0, 0, 1] = x[0, 0, 3, 4] = np.nan
    ours, theirs = ta.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    got, want = F.max_pool2d(ours, 2, 1, 1), TF.max_pool2d(theirs, 2, 1, 1)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())  # NaN where torch's is
    got.sum().backward()
    want.sum().backward()
    np.testing.assert_array_equal(np.asarray(ours.grad), theirs.grad.numpy())  # the same element of each window
    ints = np.random.default_rng(0).integers(-50, 50, (2, 3, 7, 6))
    np.testing.assert_array_equal(F.max_pool2d(ta.tensor(ints), 3, 2, 1).numpy(),
                                  TF.max_pool2d(torch.from_numpy(ints), 3, 2, 1).numpy())


AVG = [  # shape, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    ((2, 3, 7, 6), 2, None, 0, False, True, None), ((2, 3, 7, 6), 3, 2, 1, False, True, None),
    ((2, 3, 7, 6), 3, 2, 1, False, False, None), ((2, 3, 7, 6), 3, 2, 1, True, True, None),
    ((2, 3, 7, 6), 3, 2, 1, True, False, None), ((2, 3, 8, 6), (3, 2), (2, 3), (1, 1), True, True, 5),
    ((4, 9, 5), (4, 2), (3, 2), (2, 1), True, False, None), ((1, 2, 5, 5), 5, 1, 2, False, False, 3),
    ((2, 2, 5, 6), 2, 2, 1, True, True, None)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode,count_include_pad,divisor", AVG)
def test_avg_pool2d_matches_torch(shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor, dtype):
    _match("avg_pool2d", _x(*shape), kernel, stride, padding, ceil_mode=ceil_mode,
           count_include_pad=count_include_pad, divisor_override=divisor, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,size", [((2, 3, 7, 6), 1), ((2, 3, 7, 6), (1, 1)), ((2, 3, 8, 6), (4, 3)),
                                        ((2, 3, 7, 6), (3, 4)), ((2, 3, 7, 6), (None, 4)), ((3, 7, 6), (7, 6)),
                                        ((3, 7, 6), (10, 9)), ((1, 2, 5, 13), (2, 5))])
def test_adaptive_avg_pool2d_matches_torch(shape, size, dtype):
    _match("adaptive_avg_pool2d", _x(*shape), size, dtype=dtype)


# -- the modules -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls,args,options", [
    ("MaxPool2d", (2,), {}), ("MaxPool2d", (3, 2, 1), dict(dilation=2, ceil_mode=True)),
    ("MaxPool2d", ((3, 2),), dict(stride=(2, 1), padding=(1, 0))), ("AvgPool2d", (2,), {}),
    ("AvgPool2d", (3, 2, 1), dict(count_include_pad=False, ceil_mode=True)), ("AvgPool2d", (3,), dict(stride=1)),
    ("AvgPool2d", (2,), dict(divisor_override=3)),
    ("AdaptiveAvgPool2d", (1,), {}), ("AdaptiveAvgPool2d", ((2, None),), {}), ("AdaptiveAvgPool2d", ((3, 4),), {})])
def test_modules_match_torchs_defaults_repr_and_values(cls, args, options):
    ours, theirs = getattr(ta.nn, cls)(*args, **options), getattr(torch.nn, cls)(*args, **options)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == [] and list(ours.parameters()) == []
    for name in ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "count_include_pad", "output_size"):
        if hasattr(theirs, name):
            assert getattr(ours, name) == getattr(theirs, name), name  # stride None -> kernel_size, as torch
    shape = (2, 3, 9, 7)
    module_matches_torch(ours, theirs, _x(*shape), _x(*theirs(torch.zeros(shape)).shape), tol=1e-10)


# -- refusals ----------------------------------------------------------------------------------------------------

def test_clear_errors():
    x = ta.randn(1, 2, 5, 5)
    with pytest.raises(ValueError, match=r"max_pool2d: padding \(2, 2\) must be non-negative and at most half the "
                                         r"\(dilated\) kernel \(3, 3\)"):
        F.max_pool2d(x, 3, padding=2)
    with pytest.raises(ValueError, match=r"avg_pool2d: padding \(2, 2\) must be.*at most half"):
        ta.nn.AvgPool2d(3, padding=2)(x)
    with pytest.raises(ValueError, match=r"input of shape \[1, 2, 5, 5\] is too small for the kernel \(7, 7\).*"
                                         r"output would be \(0, 0\)"):
        ta.nn.MaxPool2d(7)(x)
    with pytest.raises(ValueError, match=r"expected a \(N, C, H, W\) or unbatched \(C, H, W\) input, got shape "
                                         r"\[5, 5\]"):
        F.avg_pool2d(ta.randn(5, 5), 2)
    with pytest.raises(ValueError, match=r"stride must be positive"):
        F.max_pool2d(x, 2, 0)
    with pytest.raises(TypeError, match=r"kernel_size must be an int or a tuple of 2 ints, got 2.5"):
        F.max_pool2d(x, 2.5)
    with pytest.raises(NotImplementedError, match=r"return_indices=True is not supported"):
        ta.nn.MaxPool2d(2, return_indices=True)
    with pytest.raises(TypeError, match=r"avg_pool2d: the input must be a float tensor"):
        F.avg_pool2d(ta.ones(1, 1, 4, 4, dtype=ta.int64), 2)
    with pytest.raises(ValueError, match=r"output_size must be non-negative"):
        F.adaptive_avg_pool2d(x, (-1, 2))
    with pytest.raises(ValueError, match=r"has no rows or columns"):
        F.adaptive_avg_pool2d(ta.randn(1, 2, 0, 4), 1)


# -- training on the fused route ---------------------------------------------------------------------------------

@pytest.mark.parametrize("replay", ["python", "captured"])
def test_pooling_layers_train_on_the_fused_route_as_torchs(replay):
    # every pooling form in one model: padded, dilated, ceil-mode max; average without the padding in its count;
    # an adaptive average whose windows overlap (7 rows into 3 cells)
    f64 = np.float64
    ta.manual_seed(0)
    nn = ta.nn
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, dtype=f64), nn.MaxPool2d(3, 1, 1, dilation=1, ceil_mode=True),
                          nn.Tanh(), nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                          nn.MaxPool2d(2, 1, 1, dilation=2), nn.AdaptiveAvgPool2d((3, 2)), nn.Flatten(),
                          nn.Linear(24, 3, dtype=f64))
    tnn = torch.nn
    twin = tnn.Sequential(tnn.Conv2d(2, 4, 3, padding=1), tnn.MaxPool2d(3, 1, 1, dilation=1, ceil_mode=True),
                          tnn.Tanh(), tnn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                          tnn.MaxPool2d(2, 1, 1, dilation=2), tnn.AdaptiveAvgPool2d((3, 2)), tnn.Flatten(),
                          tnn.Linear(24, 3)).double()
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), F.cross_entropy, route="fused",
                      fused_replay=replay)
    topt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((4, 2, 11, 9)), rng.integers(0, 3, 4)) for _ in range(4)]
    assert twin(torch.from_numpy(batches[0][0])).shape == (4, 3)
    fused_steps_match_torch(trainer, topt, lambda x, y: TF.cross_entropy(twin(x), y), batches, rel=1e-9)
    assert trainer.fused.replay == replay
    if replay == "captured":
        assert trainer.fused.plan.capture.tape is not None, trainer.fused.plan.capture.note
    named = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), named[name].detach().numpy(), rtol=1e-9, atol=1e-10, err_msg=name)


def _step_peak(trainer, batch):
    """tracemalloc's peak of one warm step (bytes above what was traced before it), as test_fused_promises does."""
    trainer.step(*batch)
    trainer.step(*batch)
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    trainer.step(*batch)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - base


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_a_fused_cnn_replay_allocates_no_array_memory(replay):
    # Proof by scale (tests/test_fused_promises.py): a batch-sized heap temporary in unfold, the pools or their
    # gradients would make a step at 128 rows peak higher than one at 64 while the slab doubles; the smallest, a
    # bool mask of the max pool's (N, 12, 13, 13) output, by 130 KB (a heap `arg == k` in its backward failed this).
    nn = ta.nn
    ta.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, padding=1),
                          nn.Conv2d(12, 8, 3, stride=2, groups=2), nn.AvgPool2d(2, 1, 1, count_include_pad=False),
                          nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Linear(48, 4))
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, route="fused",
                      fused_replay=replay)
    rng = np.random.default_rng(0)
    peaks, slabs = {}, {}
    for rows in (64, 128):
        batch = (rng.standard_normal((rows, 3, 24, 24)).astype(np.float32), rng.integers(0, 4, rows))
        peaks[rows] = _step_peak(trainer, batch)
        slabs[rows] = trainer.fused.plan.memory.slab_bytes
        assert trainer.fused.replay == replay
    if replay == "captured":
        assert trainer.fused.plan.capture.tape is not None, trainer.fused.plan.capture.note
    assert slabs[128] - slabs[64] > 1 << 20, slabs
    assert abs(peaks[128] - peaks[64]) < 32 * 1024, f"array memory outside the plan: {peaks}"
