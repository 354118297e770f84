"""Deferred construction (tensorarena.nn.deferred_init): a model whose parameters hold no values until they are
made, exactly as an eager build makes them, in memory or stage by stage straight into the streaming store.

PRE-FIX COUNT (filled in below).
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import nn, optim
from tensorarena.models import MLP, MLPConfig, ViT, ViTConfig
from tensorarena.random import manual_seed, peek_default_generator


def _vit_config(**overrides) -> ViTConfig:
    return ViTConfig(**{**dict(image_size=16, patch_size=4, num_classes=5, dim=32, depth=2, num_heads=4,
                               dropout=0.1, attention_dropout=0.1), **overrides})


BUILDS = {
    "mlp default generator": lambda: MLP(MLPConfig(64, (32, 16), 10)),
    "mlp float64, MT19937": lambda: MLP(MLPConfig(64, (32, 16), 10, dtype=np.float64, dropout=0.2),
                                        rng=np.random.Generator(np.random.MT19937(7))),
    "vit-tiny preset": lambda: ViT(ViTConfig.tiny(image_size=32, num_classes=10), rng=np.random.default_rng(3)),
    "vit small config, default generator": lambda: ViT(_vit_config()),
    "vit float64, Philox": lambda: ViT(_vit_config(dtype=np.float64), rng=np.random.Generator(np.random.Philox(2))),
}


def _eager_and_deferred(build):
    """The same build eagerly and under deferred_init from the same seed, and the default generator after each."""
    manual_seed(11)
    eager = build()
    after_eager = peek_default_generator().bit_generator.state
    manual_seed(11)
    with nn.deferred_init():
        lazy = build()
    after_lazy = peek_default_generator().bit_generator.state
    return eager, lazy, after_eager, after_lazy


@pytest.mark.parametrize("name", list(BUILDS))
def test_materialize_gives_the_eager_build_bit_for_bit(name):
    eager, lazy, after_eager, after_lazy = _eager_and_deferred(BUILDS[name])
    assert all(p.is_deferred for p in lazy.parameters())
    assert not any(p.is_deferred for p in eager.parameters())
    # Recording moved the default generator exactly as the eager draws did: what is drawn next is the same.
    assert after_lazy == after_eager
    assert lazy.materialize() is lazy
    assert not any(p.is_deferred for p in lazy.parameters())
    eager_params, lazy_params = dict(eager.named_parameters()), dict(lazy.named_parameters())
    assert list(eager_params) == list(lazy_params)
    for key, p in eager_params.items():
        q = lazy_params[key]
        assert q.dtype == p.dtype and q.shape == p.shape, key
        assert np.array_equal(q.data, p.data), key
        assert q.data.flags.writeable and q.data.flags.c_contiguous, key
    eager_buffers, lazy_buffers = dict(eager.named_buffers()), dict(lazy.named_buffers())
    assert list(eager_buffers) == list(lazy_buffers)
    for key, b in eager_buffers.items():
        assert np.array_equal(np.asarray(lazy_buffers[key]), np.asarray(b)), key


def test_a_generator_passed_in_ends_where_the_eager_build_leaves_it():
    # The model's later users of its generator (dropout masks) must see the same stream as after an eager build.
    eager_rng, lazy_rng = np.random.default_rng(5), np.random.default_rng(5)
    ViT(_vit_config(), rng=eager_rng)
    with nn.deferred_init():
        ViT(_vit_config(), rng=lazy_rng)
    assert lazy_rng.bit_generator.state == eager_rng.bit_generator.state
    assert lazy_rng.random() == eager_rng.random()


def test_a_deferred_parameter_holds_no_memory_and_one_can_be_made_alone():
    with nn.deferred_init():
        model = ViT(_vit_config(), rng=np.random.default_rng(0))
    eager = ViT(_vit_config(), rng=np.random.default_rng(0))
    p = model.blocks[0].mlp.fc1.weight
    assert p.is_deferred and p.shape == (128, 32) and p.dtype == np.float32
    assert p._data.strides == (0, 0)  # a zero-stride placeholder: no bytes behind it
    assert "deferred" in repr(p)
    assert p.materialize() is p and not p.is_deferred
    assert np.array_equal(p.data, eager.blocks[0].mlp.fc1.weight.data)
    assert model.blocks[0].mlp.fc1.bias.is_deferred  # the others are untouched


def test_reading_a_deferred_parameter_names_it_and_says_what_to_do():
    with nn.deferred_init():
        model = ViT(_vit_config(), rng=np.random.default_rng(0))
    with pytest.raises(nn.DeferredParameterError, match=r"parameter 'weight' of a PatchEmbedding .*materialize\(\)"):
        model(np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(nn.DeferredParameterError, match="hand the model to a Trainer"):
        model.state_dict()
    from tensorarena.nn.deferred import name_deferred

    name_deferred(model)  # what a Trainer and materialize do first: the dotted names
    with pytest.raises(nn.DeferredParameterError, match=r"parameter 'blocks\.1\.attn\.qkv\.weight' \(shape \(96, 32\)"):
        model.blocks[1].attn.qkv.weight.data


def test_a_constructor_writing_into_a_parameter_outside_init_fails_at_that_line():
    # Embedding zeroes its padding row with weight.data[...] = 0, which cannot be recorded.
    with nn.deferred_init(), pytest.raises(nn.DeferredParameterError, match="cannot be deferred"):
        nn.Embedding(10, 4, padding_idx=0)
    with nn.deferred_init():
        table = nn.Embedding(10, 4, rng=np.random.default_rng(1))  # no padding row: all through nn.init
    assert np.array_equal(table.materialize().weight.data, nn.Embedding(10, 4, rng=np.random.default_rng(1)).weight.data)


def test_an_empty_parameter_never_filled_cannot_be_made():
    with nn.deferred_init():
        p = nn.Parameter.empty((3, 2))
    with pytest.raises(nn.DeferredParameterError, match="never filled"):
        p.materialize()
    assert p.is_deferred


def test_parameters_given_values_are_not_deferred_and_outside_the_context_nothing_is():
    with nn.deferred_init():
        given = nn.Parameter(np.arange(3.0))
    assert not given.is_deferred and np.array_equal(given.data, np.arange(3.0, dtype=np.float32))
    assert not nn.Linear(3, 2).weight.is_deferred


def test_an_optimizer_over_deferred_parameters_is_built_without_touching_them():
    with nn.deferred_init():
        model = MLP(MLPConfig(8, (4,), 2))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    assert opt.param_groups[0]["params"][0].is_deferred
