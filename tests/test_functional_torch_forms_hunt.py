"""nn layers and functions as a PyTorch user calls them: dtype=None, max_norm=0.0, mha(q, k, v), elu at NaN.

Found by a helper's hunt of nn.functional and the layers against torch 2.13:
- dtype=None (what ported code passes through factory_kwargs) made float64 parameters (np.dtype(None)), and
  Module.to(None) converted to float64; torch makes float32 and changes nothing. dtype=np.float16 became float32
  without a word (Parameter) where Module.half() refuses;
- F.embedding(max_norm=0.0) was ignored (0.0 is falsy), though max_norm is refused as not implemented;
- mha(q, k, v) took k for key_padding_mask and blamed its shape;
- F.elu's gradient at NaN was NaN; torch passes the incoming gradient (its x <= 0 test is false).

On e4167e7 (before the fixes) 10 of the 11 fail (test_layers_with_explicit_float64_keep_it is a control):
    git worktree add /tmp/wt e4167e7 && cp tests/test_functional_torch_forms_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_functional_torch_forms_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn
from tensorarena.nn import functional as F

LAYERS = {
    "linear": lambda dtype: nn.Linear(4, 3, dtype=dtype),
    "embedding": lambda dtype: nn.Embedding(5, 3, dtype=dtype),
    "layer_norm": lambda dtype: nn.LayerNorm(3, dtype=dtype),
    "attention": lambda dtype: nn.MultiheadAttention(4, 2, dtype=dtype),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_dtype_none_makes_float32_parameters_as_torch(layer):
    module = LAYERS[layer](None)
    assert {p.dtype for p in module.parameters()} == {np.dtype(np.float32)}
    assert torch.nn.Linear(4, 3, dtype=None).weight.dtype == torch.float32  # what a ported layer expects


def test_layers_with_explicit_float64_keep_it():
    assert {p.dtype for p in LAYERS["linear"](np.float64).parameters()} == {np.dtype(np.float64)}


def test_module_to_none_changes_nothing():
    module = nn.Linear(4, 3)
    assert module.to(None) is module
    assert module.weight.dtype == np.float32


@pytest.mark.parametrize("make", [lambda: nn.Parameter(np.ones(2), dtype=np.float16),
                                  lambda: nn.Linear(2, 3, dtype=np.float16)], ids=["parameter", "linear"])
def test_half_precision_parameters_are_refused(make):
    with pytest.raises(TypeError, match="float32 or float64, got dtype float16"):
        make()


def test_embedding_max_norm_zero_is_refused_not_ignored():
    weight = ta.tensor(np.arange(9.0, dtype=np.float32).reshape(3, 3))
    with pytest.raises(ValueError, match="max_norm is not supported"):
        F.embedding(np.array([0, 2]), weight, max_norm=0.0)


def test_multihead_attention_called_torchs_way_says_so():
    mha = nn.MultiheadAttention(8, 2)
    x = ta.tensor(np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32))
    with pytest.raises(TypeError, match=r"self-attention over one input.*call mha\(x\)"):
        mha(x, x, x)


def test_elu_gradient_at_nan_passes_the_incoming_gradient_as_torch():
    values = np.array([np.nan, 1.0, -1.0])
    x = ta.tensor(values, requires_grad=True)
    F.elu(x, alpha=0.5).sum().backward()
    tx = torch.tensor(values, requires_grad=True)
    torch.nn.functional.elu(tx, alpha=0.5).sum().backward()
    np.testing.assert_allclose(np.asarray(x.grad), tx.grad.numpy(), rtol=1e-12)
