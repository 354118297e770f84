"""What a review of the torch API batch found: sign(NaN), device= and size=/low=/high= keywords on the factories,
enable_gqa with equal heads, nn.CosineSimilarity, and integer mm/bmm's message.

On b007051 (`python -m pytest -q tests/test_torch_api_review_fixes.py` from a worktree of it, with
an absolute PYTHONPATH) 20 of 20 fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sign_of_nan_is_zero_as_torchs(dtype):
    values = np.array([np.nan, -2.0, 0.0, 3.0, -np.inf], dtype)
    np.testing.assert_array_equal(ta.sign(ta.tensor(values)).numpy(), torch.sign(torch.tensor(values)).numpy())


FACTORIES = {
    "zeros": lambda **kw: ta.zeros(2, **kw), "ones": lambda **kw: ta.ones(2, **kw),
    "full": lambda **kw: ta.full((2,), 1.0, **kw), "arange": lambda **kw: ta.arange(3, **kw),
    "linspace": lambda **kw: ta.linspace(0, 1, 3, **kw), "tensor": lambda **kw: ta.tensor([1.0], **kw),
    "zeros_like": lambda **kw: ta.zeros_like(ta.zeros(2), **kw), "randn": lambda **kw: ta.randn(2, **kw),
    "rand": lambda **kw: ta.rand(2, **kw), "randint": lambda **kw: ta.randint(5, (2,), **kw),
    "randperm": lambda **kw: ta.randperm(3, **kw), "new_zeros": lambda **kw: ta.zeros(1).new_zeros(2, **kw),
    "new_tensor": lambda **kw: ta.zeros(1).new_tensor([1.0], **kw),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_take_the_cpu_device_and_refuse_another(name):
    x = ta.zeros(1)
    for device in ("cpu", x.device, torch.device("cpu")):
        assert isinstance(FACTORIES[name](device=device), ta.Tensor)
    with pytest.raises(ValueError, match=f"{name}: tensorarena runs on the CPU only, got device 'cuda'"):
        FACTORIES[name](device="cuda")


def test_torchs_keyword_forms_of_the_sizes_and_bounds():
    assert ta.randn(size=(2, 3)).shape == torch.randn(size=(2, 3)).shape
    assert ta.rand(size=(4,)).shape == (4,)
    assert ta.zeros(size=(2,)).shape == ta.ones(size=[2, 1]).shape[:1]
    assert ta.zeros(1).new_ones(size=(2,)).shape == (2,)
    drawn = ta.randint(low=2, high=10, size=(50,)).numpy()
    assert drawn.min() >= 2 and drawn.max() < 10
    assert ta.randint(high=3, size=(50,)).numpy().max() < 3
    with pytest.raises(TypeError, match="got the size twice"):
        ta.zeros(2, size=(2,))


def test_enable_gqa_with_equal_heads_changes_nothing_as_torchs():
    q = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    ours = ta.nn.functional.scaled_dot_product_attention(ta.tensor(q), ta.tensor(q), ta.tensor(q), enable_gqa=True)
    theirs = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(q),) * 3, enable_gqa=True)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="grouped heads are not supported"):
        ta.nn.functional.scaled_dot_product_attention(ta.tensor(q), ta.tensor(q[:, :1]), ta.tensor(q[:, :1]),
                                                      enable_gqa=True)


def test_cosine_similarity_module_matches_torchs():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 5, 2)).astype(np.float32), rng.standard_normal((3, 5, 2)).astype(np.float32)
    for dim in (1, -1):
        ours = ta.nn.CosineSimilarity(dim=dim)(ta.tensor(x), ta.tensor(y))
        theirs = torch.nn.CosineSimilarity(dim=dim)(torch.tensor(x), torch.tensor(y))
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, shapes", [("mm", ((1, 2), (2, 1))), ("bmm", ((1, 1, 2), (1, 2, 1)))])
def test_integer_products_say_what_to_do(op, shapes):
    a, b = (ta.tensor(np.ones(s, np.int64)) for s in shapes)
    with pytest.raises(TypeError, match=f"{op}: both operands are int64: matrix products of integers"):
        getattr(ta, op)(a, b)
