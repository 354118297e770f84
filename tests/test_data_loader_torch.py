"""tensorarena.utils.data (Dataset, TensorDataset, DataLoader, default_collate) against torch.utils.data 2.13.0:
the same batches, lengths, dtypes and refusals, and a training loop written as for torch.

A hunt of Trainer.evaluate found no DataLoader (BatchLoader, the CLI's, takes no `for x, y in loader`): on ce8b71c
this file does not collect (there was no tensorarena.utils)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import tensorarena as ta
from tensorarena.train.trainer import Trainer
from tensorarena.utils.data import DataLoader, Dataset, TensorDataset, default_collate
from tests.fused_vs_torch import sequential_and_twin

TORCH_DTYPE = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64, torch.bool: np.bool_,
               torch.int32: np.int32, torch.uint8: np.uint8}


def assert_same(ours, theirs, where="batch"):
    """A structure of our Tensors equal to one of torch's: same kind of container, values and dtype."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, ta.Tensor), (where, type(ours))
        assert ours.dtype == TORCH_DTYPE[theirs.dtype], (where, ours.dtype, theirs.dtype)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=where)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), where
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert isinstance(ours, (list, tuple)) and len(ours) == len(theirs), (where, ours)
        if all(isinstance(x, str) for x in theirs):
            assert list(ours) == list(theirs), where
        else:
            for i, (a, b) in enumerate(zip(ours, theirs)):
                assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


def _arrays(n=11):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 3)).astype(np.float32), rng.integers(0, 4, n)


@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 11, 20])
@pytest.mark.parametrize("drop_last", [False, True])
def test_tensor_dataset_batches_match_torch_in_order(batch_size, drop_last):
    x, y = _arrays()
    ours = DataLoader(TensorDataset(x, y), batch_size=batch_size, drop_last=drop_last)
    theirs = tud.DataLoader(tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=batch_size,
                            drop_last=drop_last)
    assert len(ours) == len(theirs)
    got, want = list(ours), list(theirs)
    assert len(got) == len(want) == len(ours)
    for a, b in zip(got, want):
        assert_same(a, b)
    assert ours.fetch_route in ("indexed", None)  # None: drop_last left no batch (batch_size 20 > 11 rows)


def test_tensor_dataset_indexes_as_torch_and_takes_tensors():
    x, y = _arrays()
    ours, theirs = TensorDataset(ta.tensor(x), y), tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    assert len(ours) == len(theirs) == 11
    assert_same(ours[3], theirs[3])
    assert_same(ours[-1], theirs[-1])


class _Samples(Dataset):
    """A map-style dataset of mixed samples, as user code writes them."""

    def __init__(self, n=7):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(2, i, np.float32), "label": i % 3, "weight": 0.5 * i, "flag": bool(i % 2),
                "name": f"s{i}", "pair": (np.int32(i), np.arange(i, i + 3, dtype=np.float64))}


class _TorchSamples(tud.Dataset):
    def __init__(self, n=7):
        self.ours = _Samples(n)

    def __len__(self):
        return len(self.ours)

    def __getitem__(self, i):
        return self.ours[i]


@pytest.mark.parametrize("batch_size", [1, 3, 7])
def test_a_dataset_of_mixed_samples_collates_as_torch(batch_size):
    ours = DataLoader(_Samples(), batch_size=batch_size)
    theirs = tud.DataLoader(_TorchSamples(), batch_size=batch_size)
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)
    assert ours.fetch_route == "per_sample"


def test_default_collate_matches_torch_on_each_kind():
    cases = [[1, 2, 3], [1.5, 2.5], [True, False], [np.float32(1), np.float32(2)], [np.arange(3), np.arange(3)],
             [(1, "a"), (2, "b")], [{"a": [1, 2.0]}, {"a": [3, 4.0]}], ["x", "y"],
             [np.ones((2, 2), np.uint8), np.zeros((2, 2), np.uint8)]]
    for case in cases:
        assert_same(default_collate(case), tud.default_collate(case), str(case))
    with pytest.raises(TypeError, match="found object.*Pass collate_fn="):
        default_collate([object(), object()])
    with pytest.raises(RuntimeError, match=r"same number of fields; got \[1, 2\]"):
        default_collate([(1,), (1, 2)])


def test_shuffle_takes_each_sample_once_per_epoch_in_a_new_order_reproducibly():
    x, y = _arrays(50)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, generator=np.random.default_rng(5))
    epochs = [np.concatenate([yb.numpy() for _, yb in loader]) for _ in range(3)]
    rows = [np.concatenate([xb.numpy() for xb, _ in loader]) for _ in range(1)]
    for labels in epochs:
        assert sorted(labels.tolist()) == sorted(y.tolist())
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    again = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, generator=np.random.default_rng(5))
    np.testing.assert_array_equal(np.concatenate([yb.numpy() for _, yb in again]), epochs[0])
    # pairs stay pairs: each row comes with its own label
    order = [np.flatnonzero((x == row).all(axis=1))[0] for row in rows[0]]
    assert len(set(order)) == 50


def test_shuffle_without_a_generator_follows_ta_manual_seed():
    x, y = _arrays(20)

    def first_epoch():
        return np.concatenate([yb.numpy() for _, yb in DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)])

    ta.manual_seed(3)
    a = first_epoch()
    ta.manual_seed(3)
    np.testing.assert_array_equal(first_epoch(), a)
    assert not np.array_equal(a, y)  # shuffled


def test_samplers_and_unbatched_loading_match_torch():
    x, y = _arrays()
    order, batches = [4, 0, 7, 7, 2, 10, 1], [[3, 1], [0], [9, 8, 7]]
    pairs = [
        (DataLoader(TensorDataset(x, y), batch_size=3, sampler=order),
         tud.DataLoader(tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=3, sampler=order)),
        (DataLoader(TensorDataset(x, y), batch_sampler=batches),
         tud.DataLoader(tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_sampler=batches)),
        (DataLoader(_Samples(), batch_size=None), tud.DataLoader(_TorchSamples(), batch_size=None)),
    ]
    for ours, theirs in pairs:
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b)


def test_a_custom_collate_fn_gets_the_samples():
    x, y = _arrays()
    seen = []
    loader = DataLoader(TensorDataset(x, y), batch_size=4, collate_fn=lambda samples: seen.append(len(samples)) or 0)
    assert list(loader) == [0, 0, 0] and seen == [4, 4, 3] and loader.fetch_route == "per_sample"


def test_the_indexed_route_gives_what_collating_sample_by_sample_gives():
    x, y = _arrays(13)
    ds = TensorDataset(x, y)
    indexed = list(DataLoader(ds, batch_size=5, sampler=list(range(12, -1, -1))))
    by_sample = list(DataLoader(ds, batch_size=5, sampler=list(range(12, -1, -1)), collate_fn=default_collate))
    for a, b in zip(indexed, by_sample, strict=True):
        for u, v in zip(a, b, strict=True):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_bad_arguments_are_refused_as_torch_refuses_them(caplog):
    x, y = _arrays()
    ds = TensorDataset(x, y)
    for bad in (0, -2, True, 1.5):
        with pytest.raises(ValueError, match=f"batch_size should be a positive integer value, but got batch_size="
                                             f"{bad!r}"):
            DataLoader(ds, batch_size=bad)
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(ds, shuffle=True, sampler=[0, 1])
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive"):
        DataLoader(ds, batch_size=2, batch_sampler=[[0]])
    with pytest.raises(ValueError, match="num_workers option should be a non-negative integer"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(TypeError, match="generator must be a numpy.random.Generator"):
        DataLoader(ds, shuffle=True, generator=torch.Generator())
    with pytest.raises(ValueError, match=r"first dimensions are \[11, 4\]"):
        TensorDataset(x, y[:4])
    with pytest.raises(TypeError, match="argument 1 must be a Tensor or NumPy array"):
        TensorDataset(x, [1, 2])
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        loader = DataLoader(ds, batch_size=4, num_workers=4, pin_memory=True)
    assert "makes batches in the calling thread" in caplog.text and "no memory is pinned" in caplog.text
    assert len(list(loader)) == 3


def test_a_torch_style_training_loop_matches_torch_on_the_fused_route():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    model, twin = sequential_and_twin(6, 8, 3)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), ta.nn.functional.cross_entropy,
                      route="fused")
    topt = torch.optim.SGD(twin.parameters(), lr=0.1)
    order = rng.permutation(40).tolist()
    ours = DataLoader(TensorDataset(x, y), batch_size=16, sampler=order)  # 16, 16 and a short batch of 8
    theirs = tud.DataLoader(tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=16,
                            sampler=order)
    for epoch in range(2):
        for (xb, yb), (txb, tyb) in zip(ours, theirs, strict=True):
            report = trainer.step(xb, yb)
            assert report.route == "fused"
            topt.zero_grad()
            loss = torch.nn.functional.cross_entropy(twin(txb), tyb)
            loss.backward()
            topt.step()
            assert report.loss == pytest.approx(loss.item(), rel=1e-5)
    for p, q in zip(twin.parameters(), model.parameters()):
        np.testing.assert_allclose(q.numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6)
