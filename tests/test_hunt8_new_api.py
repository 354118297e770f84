"""hunt8: the newest APIs (TransformerEncoder/Layer, BatchNorm, GroupNorm, utils.data, ta.load) used as a PyTorch
user would, against torch 2.13.0: each test is a defect found and fixed.

On 96541a0 all 22 tests here fail: `git archive 96541a0 | tar -x -C /tmp/base && cp tests/test_hunt8_new_api.py
/tmp/base/tests/ && cd /tmp/base && PYTHONPATH=/tmp/base python -m pytest -q -p no:cacheprovider
tests/test_hunt8_new_api.py` (run from the base's own tree: pytest run here imports this worktree's engine).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta


def _encoder_pair(**kw):
    """A torch TransformerEncoderLayer (float64, no dropout, batch_first) and ours with its weights."""
    torch.manual_seed(0)
    args = dict(d_model=12, nhead=3, dim_feedforward=20, dropout=0.0, batch_first=True)
    theirs = torch.nn.TransformerEncoderLayer(**args, dtype=torch.float64, **kw)
    ours = ta.nn.TransformerEncoderLayer(**args, dtype=np.float64, **kw)
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    return ours, theirs


# -- TransformerEncoderLayer / TransformerEncoder ------------------------------------------------------------------

def test_a_float_padding_mask_of_finite_values_is_refused_not_read_as_keep():
    # torch adds a float src_key_padding_mask to the scores: -1e9 (a common way to write it) drops the key. It was
    # read as "keep" (only -inf counted as padding): outputs 0.3 off torch's for the padded rows, with no word.
    ours, theirs = _encoder_pair()
    x = np.random.default_rng(0).standard_normal((2, 5, 12))
    mask = np.zeros((2, 5))
    mask[1, 3:] = -np.inf
    want = theirs(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(mask)).detach().numpy()
    np.testing.assert_allclose(ours(ta.tensor(x), src_key_padding_mask=mask).numpy(), want, rtol=1e-10, atol=1e-10)
    mask[1, 3:] = -1e9
    with pytest.raises(ValueError, match=r"src_key_padding_mask as floats must hold only 0 \(keep\) and -inf "
                                         r"\(padding\).*got -1000000000\.0.*bool mask \(True = padding\)"):
        ours(ta.tensor(x), src_key_padding_mask=mask)
    np.testing.assert_allclose(ours(ta.tensor(x), src_key_padding_mask=mask < 0).numpy(), want, rtol=1e-10,
                               atol=1e-10)  # the advice gives torch's result


def test_encoder_layers_made_from_a_layer_with_an_rng_draw_different_dropout_masks():
    # TransformerEncoder deep-copied the layer's generator with it: every layer drew the same numbers, so the same
    # dropout mask (torch's layers draw from one generator, one mask after the other).
    layer = ta.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True, rng=np.random.default_rng(0))
    encoder = ta.nn.TransformerEncoder(layer, 3)
    assert all(m.rng is layer.dropout.rng for m in encoder.modules() if isinstance(m, ta.nn.Dropout))
    x = ta.ones(2, 4, 16)
    masks = [encoder.layers[i].dropout(x).numpy() != 0 for i in range(3)]
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    # the weights are still each layer's own copy, as torch's
    assert encoder.layers[0].linear1.weight is not encoder.layers[1].linear1.weight
    np.testing.assert_array_equal(encoder.layers[0].linear1.weight.numpy(), encoder.layers[1].linear1.weight.numpy())


# -- GroupNorm / BatchNorm -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 6), (0, 6, 3), (0, 6, 2, 2)])
def test_group_norm_of_an_empty_batch_is_empty_as_torchs(shape):
    # reshape(N, G, -1) cannot infer -1 from no elements: "cannot view shape (0, 6, 3) as (0, 2, -1)"
    ours, theirs = ta.nn.GroupNorm(3, 6, dtype=np.float64), torch.nn.GroupNorm(3, 6, dtype=torch.float64)
    x, tx = ta.tensor(np.zeros(shape), requires_grad=True), torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    out, want = ours(x), theirs(tx)
    out.sum().backward()
    want.sum().backward()
    assert out.shape == tuple(want.shape) and x.grad.shape == shape
    np.testing.assert_array_equal(ours.weight.grad, theirs.weight.grad.numpy())


@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (0, 3)), ("BatchNorm1d", (0, 3, 4)),
                                       ("BatchNorm2d", (0, 3, 2, 2))])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_training_on_an_empty_batch_is_empty_and_counted_as_torchs(cls, shape, momentum):
    # It was refused: "Expected more than 1 value per channel when training, got input size (0, 3)". torch gives an
    # empty output, counts the batch in num_batches_tracked and leaves the running statistics as they were.
    ours = getattr(ta.nn, cls)(3, momentum=momentum, dtype=np.float64)
    theirs = getattr(torch.nn, cls)(3, momentum=momentum, dtype=torch.float64)
    x, tx = ta.tensor(np.zeros(shape), requires_grad=True), torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    out, want = ours(x), theirs(tx)
    out.sum().backward()
    want.sum().backward()
    assert out.shape == tuple(want.shape) and x.grad.shape == shape
    for key, value in theirs.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[key], value.numpy(), err_msg=key)
    np.testing.assert_array_equal(ours.weight.grad, theirs.weight.grad.numpy())


def test_f_batch_norm_names_a_statistic_or_parameter_of_the_wrong_size():
    # Each was a reshape error naming neither the argument nor the channels: "cannot reshape array of size 4 into
    # shape (1,3)" (torch: "running_mean should contain 3 elements not 4")
    F = ta.nn.functional
    x = ta.ones(2, 3)
    with pytest.raises(ValueError, match=r"batch_norm: running_mean has 4 values \(shape \(4,\)\) for an input of 3 "
                                         r"channels \(axis 1 of shape \(2, 3\)\)"):
        F.batch_norm(x, np.zeros(4), np.ones(4))
    with pytest.raises(ValueError, match=r"batch_norm: weight has 4 values"):
        F.batch_norm(x, ta.zeros(3), ta.ones(3), weight=ta.ones(4, requires_grad=True), training=True)
    # momentum=None without the batch count failed inside the running update: float() of None
    with pytest.raises(ValueError, match=r"momentum=None .* needs num_batches_tracked="):
        F.batch_norm(x, np.zeros(3), np.ones(3), training=True, momentum=None)
    mean, var, seen = np.zeros(3), np.ones(3), np.zeros((), np.int64)
    F.batch_norm(ta.tensor(np.arange(6.0).reshape(2, 3)), mean, var, training=True, momentum=None,
                 num_batches_tracked=seen)
    np.testing.assert_allclose(mean, [1.5, 2.5, 3.5], rtol=1e-12)  # the first batch's mean: 1 / (1 batch seen)
    assert int(seen) == 1


# -- tensorarena.utils.data ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,message", [
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(prefetch_factor=2), "prefetch_factor option could only be specified"),
    (dict(prefetch_factor=-1, num_workers=1), "prefetch_factor option should be non-negative"),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(multiprocessing_context="spawn"), "multiprocessing_context can only be used with multi-process loading"),
])
def test_data_loader_refuses_the_worker_options_torch_refuses(kw, message):
    # All five were taken without a word; torch refuses each (same words), so a script that passed them believed
    # it had workers prefetching, kept alive, or started in that context.
    import torch.utils.data as tud

    from tensorarena.utils.data import DataLoader, TensorDataset

    with pytest.raises(ValueError, match=message):
        tud.DataLoader(tud.TensorDataset(torch.ones(3)), **kw)
    with pytest.raises(ValueError, match=message):
        DataLoader(TensorDataset(np.ones(3)), **kw)


def test_data_loader_refuses_a_bare_iterable_at_construction_saying_to_subclass_iterable_dataset():
    # An object with only __iter__ was taken, and the first epoch failed with "TypeError: object of type 'Stream'
    # has no len()". An IterableDataset is batched now (tests/test_data_more_torch.py); a bare iterable is not one
    # (torch's DataLoader takes it as map-style, and fails at len()), and a generator would be empty after one epoch.
    from tensorarena.utils.data import DataLoader, IterableDataset

    class Stream:
        def __iter__(self):
            return iter(np.arange(5.0))

    with pytest.raises(TypeError, match=r"dataset \(Stream\) has no __getitem__; a map-style dataset gives "
                                        r"__getitem__\(index\) and __len__\(\).*should subclass IterableDataset"):
        DataLoader(Stream(), batch_size=2)
    assert [b.numpy().tolist() for b in DataLoader([1.0, 2.0, 3.0], batch_size=2)] == [[1.0, 2.0], [3.0]]
    streamed = DataLoader(type("Streamed", (Stream, IterableDataset), {})(), batch_size=2)
    assert [b.numpy().tolist() for b in streamed] == [[0.0, 1.0], [2.0, 3.0], [4.0]]


def test_default_collate_of_samples_of_different_shapes_names_them():
    # NumPy's "all input arrays must have the same shape" named neither the shapes nor what to do; torch names both
    # (sequences of different lengths are what a user hits first)
    from tensorarena.utils.data import DataLoader, default_collate

    with pytest.raises(RuntimeError, match=r"stack expects each sample to be of equal size, but got \(2,\) at entry "
                                           r"0 and \(3,\) at entry 1; pad them.*collate_fn"):
        default_collate([np.ones(2), np.ones(3)])
    with pytest.raises(RuntimeError, match=r"got \(2, 4\) at entry 0 and \(1, 4\) at entry 2"):
        next(iter(DataLoader([ta.ones(2, 4), ta.ones(2, 4), ta.ones(1, 4)], batch_size=3)))
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([{"ids": np.arange(3)}, {"ids": np.arange(4)}])


# -- ta.load -------------------------------------------------------------------------------------------------------

def test_load_takes_torchs_dict_map_location_to_the_cpu_and_names_a_function_for_what_it_is(tmp_path):
    # torch's idioms for a GPU checkpoint on a CPU machine: a dict of locations was refused as "got device
    # \"{'cuda:0': 'cpu'}\"", and a function as a device named '<function <lambda> ...>'
    path = tmp_path / "ck.safetensors"
    ta.save({"w": np.arange(3.0)}, path)
    np.testing.assert_array_equal(ta.load(path, map_location={"cuda:0": "cpu"})["w"], np.arange(3.0))
    np.testing.assert_array_equal(ta.load(path, map_location={"cuda:1": torch.device("cpu")})["w"], np.arange(3.0))
    with pytest.raises(ValueError, match=r"CPU only, got device 'cuda:0'.*map_location's values"):
        ta.load(path, map_location={"cpu": "cuda:0"})
    with pytest.raises(TypeError, match=r"map_location is a function \(torch's hook for each storage\).*leave "
                                        r"map_location out"):
        ta.load(path, map_location=lambda storage, location: storage)
    with pytest.raises(ValueError, match=r"CPU only, got device 'cuda'"):
        ta.load(path, map_location="cuda")


# -- Trainer.predict, TensorDataset --------------------------------------------------------------------------------

def test_predict_and_evaluate_take_a_numpy_integer_batch_size():
    # np.int64(4) (a size computed with NumPy; DataLoader takes one) was refused: "batch_size must be a positive int,
    # got np.int64(4)"
    from tensorarena.train import Trainer

    ta.manual_seed(0)
    model = ta.nn.Linear(4, 3)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), ta.nn.functional.cross_entropy, route="eager")
    x = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    with ta.no_grad():
        want = model(ta.tensor(x)).numpy()
    np.testing.assert_allclose(trainer.predict(x, batch_size=np.int64(4)), want, rtol=1e-6, atol=1e-6)
    assert trainer.evaluate(x, np.arange(10) % 3, batch_size=np.int32(3))["loss"] > 0
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        trainer.predict(x, batch_size=np.int64(0))


def test_tensor_dataset_names_a_torch_tensor_for_what_it_is():
    # "argument 0 must be a Tensor or NumPy array of one or more dimensions, got Tensor": it was a Tensor, torch's
    from tensorarena.utils.data import TensorDataset

    with pytest.raises(TypeError, match=r"argument 1 is a torch\.Tensor; .*t\.numpy\(\)"):
        TensorDataset(np.ones(3), torch.ones(3))
