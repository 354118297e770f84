"""Bad input gets an error that names what was wrong and what to do."""

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import optim
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn import Linear
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer


def test_linear_refuses_a_dtype_mismatch_naming_both():
    layer = Linear(3, 2)
    with pytest.raises(TypeError, match=r"float64.*float32.*model\.double"):
        layer(ta.Tensor(np.ones((2, 3))))
    with pytest.raises(TypeError, match="int64"):
        layer(ta.Tensor(np.ones((2, 3), np.int64)))


def test_matmul_refuses_mixed_or_integer_dtypes():
    with pytest.raises(TypeError, match=r"float32.*float64"):
        ta.matmul(ta.Tensor(np.ones((2, 3), np.float32)), ta.Tensor(np.ones((3, 2))))
    with pytest.raises(TypeError, match="int64"):
        ta.matmul(ta.Tensor(np.ones((2, 3), np.int64)), ta.Tensor(np.ones((3, 2), np.int64)))


def test_linear_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(2, 3\)"):
        Linear(3, 2)(ta.Tensor(np.ones((4, 5), np.float32)))


def test_complex_tensors_are_refused():
    with pytest.raises(TypeError, match="complex"):
        ta.Tensor(np.ones(3, np.complex64))


def test_trainer_surfaces_a_label_shape_mismatch_and_keeps_weights():
    model = MLP(MLPConfig(in_features=4, hidden=(8,), out_features=3), rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy)
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    x = np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match=r"\(5, 3\).*\(4,\)|\(4,\).*\(5, 3\)"):
        trainer.step(x, np.zeros(4, np.int64))
    assert ta.current_arena() is None and trainer.step_count == 0
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.numpy(), before[name])
    trainer.step(x, np.zeros(5, np.int64))  # the trainer is still usable
    assert trainer.step_count == 1
