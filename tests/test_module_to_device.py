"""Module.to takes torch's forms: a ported `model.to(device)` with device "cpu" changes nothing, to(device, dtype)
converts, another device is refused naming it, and nothing is converted then.

On c0ae7ec (`python -m pytest -q tests/test_module_to_device.py` from a worktree of it, with an absolute
PYTHONPATH) 5 of 5 fail: every device name was refused as a dtype (a TypeError), to("cpu", dtype) took one argument.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta


def test_to_cpu_is_the_module_unchanged():
    model = ta.nn.Linear(3, 2)
    weight = model.weight.numpy().copy()
    assert model.to("cpu") is model and model.to(torch.device("cpu")) is model and model.to(device="cpu:0") is model
    assert model.weight.dtype == np.float32
    np.testing.assert_array_equal(model.weight.numpy(), weight)


def test_to_device_and_dtype_converts_as_torch():
    model, tmodel = ta.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    model.to("cpu", np.float64)
    tmodel.to("cpu", torch.float64)
    assert model.weight.dtype == np.float64 and tmodel.weight.dtype == torch.float64
    model.to(device="cpu", dtype=np.float32)
    assert model.weight.dtype == np.float32 and model.bias.dtype == np.float32


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "mps"])
def test_another_device_is_refused_and_nothing_converts(device):
    model = ta.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=f"runs on the CPU only, got device '{device}'.*nothing was converted"):
        model.to(device, np.float64)
    assert model.weight.dtype == np.float32
