"""The rest of torch.utils.data a training script reaches for, against torch 2.13.0: Subset, random_split,
ConcatDataset, ChainDataset, the samplers, DataLoader's sampler= / batch_sampler= with them, IterableDataset, and
ta.get_rng_state / set_rng_state; then a random_split + DataLoader training loop on the fused route.

Deterministic results (lengths, indices, batches, errors) are torch's exactly. Where torch's result is its
torch.Generator's draw (RandomSampler, SubsetRandomSampler, WeightedRandomSampler, random_split's shuffle) ours is a
NumPy Generator's, so the tests check what holds for any draw: a permutation, each index once, the split lengths,
reproducible from a seed, following ta.manual_seed, the sampling frequencies within a stated tolerance.

On ddf3770, before these were added, the file does not collect (no IterableDataset for _Stream to subclass); with
_Stream based on `object` there, all 79 of 79 fail:
  git archive ddf3770 | tar -x -C /tmp/base && cp tests/test_data_more_torch.py /tmp/base/tests/ &&
  sed -i 's/^class _Stream(tad.IterableDataset):/class _Stream(object):/' /tmp/base/tests/test_data_more_torch.py &&
  cd /tmp/base && PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/test_data_more_torch.py
Among them, on DataLoader's old API: a TensorDataset subclass's own __getitem__ was skipped by the indexed route, a
sampler's keys were int()-ed ("a" refused), drop_last=1 was taken."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import tensorarena as ta
import tensorarena.utils.data as tad
from tensorarena.train.trainer import Trainer
from tests.fused_vs_torch import sequential_and_twin
from tests.test_data_loader_torch import assert_same


def _arrays(n=11, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3)).astype(np.float32), rng.integers(0, 4, n)


def _pair(n=11):
    x, y = _arrays(n)
    return tad.TensorDataset(x, y), tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def raises_as_torch(exc, match, ours, theirs):
    """Both calls raise `exc` with a message matching `match` (ours may go on to say more)."""
    with pytest.raises(exc, match=match):
        theirs()
    with pytest.raises(exc, match=match):
        ours()


# -- Subset, ConcatDataset, ChainDataset ----------------------------------------------------------------------------


def test_subset_indexes_its_dataset_as_torchs():
    ours, theirs = _pair()
    indices = [7, 2, 2, 10, 0]
    a, b = tad.Subset(ours, indices), tud.Subset(theirs, indices)
    assert len(a) == len(b) == 5
    for i in range(-5, 5):
        assert_same(a[i], b[i], f"subset[{i}]")
    assert_same(a[[3, 0, 1]], b[[3, 0, 1]])  # a list of positions is one fetch of the dataset, as torch's
    assert a.dataset is ours and a.indices is indices


def test_concat_dataset_matches_torch_at_every_index_negative_ones_included():
    parts = [list(range(3)), [], list(range(10, 15)), [99]]
    a, b = tad.ConcatDataset(parts), tud.ConcatDataset(parts)
    assert a.cumulative_sizes == b.cumulative_sizes == [3, 3, 8, 9] and len(a) == len(b) == 9
    assert [a[i] for i in range(-9, 9)] == [b[i] for i in range(-9, 9)]
    assert a[np.int64(-1)] == 99
    raises_as_torch(ValueError, "absolute value of index should not exceed dataset length", lambda: a[-10],
                    lambda: b[-10])
    raises_as_torch(IndexError, "out of range", lambda: a[9], lambda: b[9])
    with pytest.raises(IndexError, match="index 9 is out of range for a ConcatDataset of 9 samples"):
        a[9]
    xs, _ = _pair()
    both = xs + tad.TensorDataset(np.ones((2, 3), np.float32), np.zeros(2, np.int64))  # Dataset.__add__, as torch's
    assert isinstance(both, tad.ConcatDataset) and len(both) == 13
    np.testing.assert_array_equal(both[-1][0].numpy(), np.ones(3, np.float32))


def test_concat_dataset_refusals_name_what_was_wrong():
    # torch asserts (AssertionError, gone under python -O); ours are errors with the same words and the way out
    with pytest.raises(ValueError, match="datasets should not be an empty iterable"):
        tad.ConcatDataset([])
    with pytest.raises(TypeError, match=r"ConcatDataset does not support IterableDataset \(datasets\[1\] is a "
                                        r"_Stream\); chain iterable ones with ChainDataset"):
        tad.ConcatDataset([[1], _Stream(3)])


class _Stream(tad.IterableDataset):
    """An iterable-style dataset of `n` samples (dicts when `dicts`), with a length only when `sized`."""

    def __init__(self, n, *, dicts=False, sized=False):
        self.n, self.dicts, self.sized = n, dicts, sized

    def __iter__(self):
        for i in range(self.n):
            yield {"x": np.full(2, i, np.float32), "label": i % 3} if self.dicts else float(i)

    def __len__(self):
        if not self.sized:
            return super().__len__()
        return self.n


class _TorchStream(tud.IterableDataset):
    def __init__(self, n, *, dicts=False, sized=False):
        self.ours = _Stream(n, dicts=dicts, sized=sized)

    def __iter__(self):
        return iter(self.ours)

    def __len__(self):
        if not self.ours.sized:
            raise TypeError(f"object of type '{type(self).__name__}' has no len()")
        return self.ours.n


def test_chain_dataset_reads_one_stream_after_another_as_torchs():
    a = tad.ChainDataset([_Stream(3), _Stream(2, sized=True)])
    b = tud.ChainDataset([_TorchStream(3), _TorchStream(2, sized=True)])
    assert list(a) == list(b) == [0.0, 1.0, 2.0, 0.0, 1.0]
    assert list(_Stream(2) + _Stream(1)) == list(_TorchStream(2) + _TorchStream(1))
    assert len(tad.ChainDataset([_Stream(3, sized=True), _Stream(2, sized=True)])) == 5
    with pytest.raises(TypeError, match="ChainDataset only supports IterableDataset, got list"):
        list(tad.ChainDataset([_Stream(1), [1, 2]]))


# -- random_split ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, lengths", [(10, [3, 7]), (30, [0.3, 0.3, 0.4]), (10, [0.33, 0.33, 0.34]),
                                        (5, [0.5, 0.5]), (7, [0.1, 0.2, 0.7]), (10, [10, 0]), (0, [0, 0])])
def test_random_split_lengths_are_torchs_and_the_splits_partition_the_dataset(n, lengths):
    data = list(range(100, 100 + n))
    ours = tad.random_split(data, lengths, generator=np.random.default_rng(0))
    theirs = tud.random_split(data, lengths, generator=torch.Generator().manual_seed(0))
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert all(isinstance(s, tad.Subset) and s.dataset is data for s in ours)
    taken = [s[i] for s in ours for i in range(len(s))]
    assert sorted(taken) == data  # each sample in exactly one split
    again = tad.random_split(data, lengths, generator=np.random.default_rng(0))
    assert [s.indices for s in again] == [s.indices for s in ours]


def test_random_split_of_fractions_summing_to_one_warns_of_an_empty_split_as_torch():
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        theirs = tud.random_split(range(10), [1, 0])  # torch takes [1, 0] as fractions: 10 and 0
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        ours = tad.random_split(range(10), [1, 0])
    assert [len(s) for s in ours] == [len(s) for s in theirs] == [10, 0]


def test_random_split_without_a_generator_follows_ta_manual_seed():
    ta.manual_seed(4)
    first = [s.indices for s in tad.random_split(range(20), [0.5, 0.5])]
    ta.manual_seed(4)
    assert [s.indices for s in tad.random_split(range(20), [0.5, 0.5])] == first
    assert first[0] != list(range(10))  # shuffled


def test_random_split_refusals():
    raises_as_torch(ValueError, "Sum of input lengths does not equal the length of the input dataset!",
                    lambda: tad.random_split(range(10), [3, 6]), lambda: tud.random_split(range(10), [3, 6]))
    with pytest.raises(ValueError, match=r"lengths \[3, 6\] sum to 9; the dataset has 10 samples"):
        tad.random_split(range(10), [3, 6])
    raises_as_torch(ValueError, "Fraction at index 0 is not between 0 and 1",
                    lambda: tad.random_split(range(10), [1.5, -0.5]), lambda: tud.random_split(range(10), [1.5, -0.5]))
    # torch returns splits of 10 and 0 for [12, -2], and fails inside randperm for [3, 7.0]
    for bad, where in (([12, -2], "lengths[1] is -2"), ([3, 7.0], "lengths[1] is 7.0")):
        with pytest.raises(ValueError, match=re.escape(f"non-negative ints summing to len(dataset) (10) or fractions "
                                                       f"summing to 1; {where}")):
            tad.random_split(range(10), bad)
    with pytest.raises(TypeError, match="random_split: generator must be a numpy.random.Generator"):
        tad.random_split(range(10), [5, 5], generator=torch.Generator())


# -- samplers -------------------------------------------------------------------------------------------------------


def test_sequential_and_batch_samplers_give_torchs_indices():
    assert list(tad.SequentialSampler(range(6))) == list(tud.SequentialSampler(range(6))) == list(range(6))
    assert len(tad.SequentialSampler([0] * 4)) == 4
    for batch_size in (1, 2, 3, 4, 7):
        for drop_last in (False, True):
            for source, twin in ((range(7), range(7)), ([5, 3, 1], [5, 3, 1]),
                                 (tad.SequentialSampler(range(7)), tud.SequentialSampler(range(7)))):
                ours, theirs = tad.BatchSampler(source, batch_size, drop_last), tud.BatchSampler(twin, batch_size,
                                                                                                 drop_last)
                assert list(ours) == list(theirs) and len(ours) == len(theirs), (batch_size, drop_last, source)


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(batch_size=0, drop_last=False), ValueError, "batch_size should be a positive integer value, but got "
                                                      "batch_size=0"),
    (dict(batch_size=True, drop_last=False), ValueError, "batch_size should be a positive integer value"),
    (dict(batch_size=2.0, drop_last=False), ValueError, "batch_size should be a positive integer value"),
    (dict(batch_size=2, drop_last=1), ValueError, "drop_last should be a boolean value, but got drop_last=1"),
])
def test_batch_sampler_refuses_what_torchs_refuses(kwargs, exc, message):
    raises_as_torch(exc, message, lambda: tad.BatchSampler(range(3), **kwargs),
                    lambda: tud.BatchSampler(range(3), **kwargs))
    assert list(tad.BatchSampler(range(3), np.int64(2), False)) == [[0, 1], [2]]  # a NumPy count, as DataLoader's


def test_the_base_sampler_asks_for_iter_as_torchs():
    with pytest.raises(NotImplementedError, match="must define __iter__"):
        iter(tad.Sampler())
    raises_as_torch(TypeError, "has no len", lambda: len(tad.Sampler()), lambda: len(tud.Sampler()))


def test_random_sampler_without_replacement_is_a_new_permutation_each_epoch():
    sampler = tad.RandomSampler(range(50), generator=np.random.default_rng(3))
    epochs = [list(sampler) for _ in range(3)]
    assert all(sorted(e) == list(range(50)) for e in epochs) and epochs[0] != epochs[1] != epochs[2]
    assert len(sampler) == len(tud.RandomSampler(range(50))) == 50
    again = tad.RandomSampler(range(50), generator=np.random.default_rng(3))
    assert list(again) == epochs[0]
    # the DataLoader's shuffle is this sampler; with a generator, its order is generator.permutation's, as before
    assert epochs[0] == np.random.default_rng(3).permutation(50).tolist()


def test_random_sampler_num_samples_beyond_the_dataset_gives_whole_permutations_then_a_part_as_torchs():
    ours = list(tad.RandomSampler(range(5), num_samples=12, generator=np.random.default_rng(0)))
    theirs = list(tud.RandomSampler(range(5), num_samples=12, generator=torch.Generator().manual_seed(0)))
    for draw in (ours, theirs):
        assert len(draw) == 12 and sorted(draw[:5]) == sorted(draw[5:10]) == list(range(5))
        assert len(set(draw[10:])) == 2
    short = list(tad.RandomSampler(range(5), num_samples=3, generator=np.random.default_rng(0)))
    assert len(short) == len(set(short)) == 3


def test_random_sampler_with_replacement_draws_uniformly():
    draws = np.array(list(tad.RandomSampler(range(4), replacement=True, num_samples=40_000,
                                            generator=np.random.default_rng(0))))
    assert draws.shape == (40_000,) and set(draws.tolist()) == {0, 1, 2, 3}
    # 4 sigma of a binomial(40000, 1/4) share is 0.0087
    np.testing.assert_allclose(np.bincount(draws) / 40_000, 0.25, atol=0.0087)


def test_random_sampler_without_a_generator_follows_ta_manual_seed():
    ta.manual_seed(9)
    first = list(tad.RandomSampler(range(30)))
    ta.manual_seed(9)
    assert list(tad.RandomSampler(range(30))) == first and first != list(range(30))


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(replacement=1), TypeError, "replacement should be a boolean value, but got replacement=1"),
    (dict(num_samples=0), ValueError, "num_samples should be a positive integer value, but got num_samples=0"),
    (dict(num_samples=2.5), ValueError, "num_samples should be a positive integer value"),
])
def test_random_sampler_refuses_what_torchs_refuses(kwargs, exc, message):
    raises_as_torch(exc, message, lambda: tad.RandomSampler(range(3), **kwargs),
                    lambda: tud.RandomSampler(range(3), **kwargs))


def test_an_empty_dataset_cannot_be_shuffled_as_in_torch():
    raises_as_torch(ValueError, "num_samples should be a positive integer value, but got num_samples=0",
                    lambda: tad.DataLoader([], shuffle=True), lambda: tud.DataLoader([], shuffle=True))


def test_subset_random_sampler_permutes_its_indices():
    indices = [15, 3, 8, 42]
    sampler = tad.SubsetRandomSampler(indices, generator=np.random.default_rng(1))
    assert len(sampler) == len(tud.SubsetRandomSampler(indices)) == 4
    epochs = [list(sampler) for _ in range(6)]
    assert all(sorted(e) == sorted(indices) for e in epochs) and len({tuple(e) for e in epochs}) > 1
    assert list(tad.SubsetRandomSampler(indices, generator=np.random.default_rng(1))) == epochs[0]
    with pytest.raises(TypeError, match="SubsetRandomSampler: generator must be a numpy.random.Generator"):
        tad.SubsetRandomSampler(indices, generator=torch.Generator())


def test_weighted_random_sampler_with_replacement_draws_in_proportion_to_the_weights():
    weights = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    ours = tad.WeightedRandomSampler(weights, 60_000, generator=np.random.default_rng(0))
    theirs = tud.WeightedRandomSampler(weights, 60_000, generator=torch.Generator().manual_seed(0))
    assert len(ours) == len(theirs) == 60_000
    share = np.bincount(list(ours), minlength=6) / 60_000
    torch_share = np.bincount(list(theirs), minlength=6) / 60_000
    expected = np.array(weights) / sum(weights)
    # 4 sigma of the largest share's binomial spread (p = 0.526) is 0.0082
    np.testing.assert_allclose(share, expected, atol=0.0082)
    np.testing.assert_allclose(share, torch_share, atol=2 * 0.0082)


def test_weighted_random_sampler_without_replacement_draws_in_turn_from_what_is_left():
    weights = np.array([1.0, 2.0, 0.0, 5.0])
    sampler = tad.WeightedRandomSampler(weights, 2, replacement=False, generator=np.random.default_rng(0))
    pairs = np.array([list(sampler) for _ in range(20_000)])
    assert (pairs[:, 0] != pairs[:, 1]).all() and not (pairs == 2).any()  # weight 0 is never drawn while others last
    total = weights.sum()
    for i in (0, 1, 3):
        for j in (0, 1, 3):
            if i != j:  # P(first i, then j) = w_i / W * w_j / (W - w_i); 4 sigma of a share <= 0.5 is 0.0142
                want = weights[i] / total * weights[j] / (total - weights[i])
                got = np.mean((pairs[:, 0] == i) & (pairs[:, 1] == j))
                assert got == pytest.approx(want, abs=0.0142), (i, j)
    # asked for every index, torch's gives the zero-weight ones last
    for sampler in (tad.WeightedRandomSampler([1.0, 0.0, 2.0], 3, replacement=False),
                    tud.WeightedRandomSampler([1.0, 0.0, 2.0], 3, replacement=False)):
        draw = list(sampler)
        assert sorted(draw) == [0, 1, 2] and draw[2] == 1


@pytest.mark.parametrize("weights, num_samples, replacement, exc, message", [
    ([1.0, -1.0], 2, True, RuntimeError, r"invalid multinomial distribution \(encountering probability entry < 0\)"),
    ([0.0, 0.0], 2, True, RuntimeError, r"invalid multinomial distribution \(sum of probabilities <= 0\)"),
    ([], 2, True, RuntimeError, r"invalid multinomial distribution \(sum of probabilities <= 0\)"),
    ([1.0, np.inf], 2, True, RuntimeError, r"invalid multinomial distribution \(encountering probability entry = "
                                           r"infinity or NaN\)"),
    ([1.0, 2.0], 3, False, RuntimeError, "cannot sample n_sample > prob_dist.size"),
    ([[1.0, 2.0]], 2, True, ValueError, r"weights should be a 1d sequence but given weights have shape \(1, 2\)"),
    ([1.0, 2.0], 0, True, ValueError, "num_samples should be a positive integer value, but got num_samples=0"),
    ([1.0, 2.0], 2.0, True, ValueError, "num_samples should be a positive integer value, but got num_samples=2.0"),
    ([1.0, 2.0], 2, 1, ValueError, "replacement should be a boolean value, but got replacement=1"),
])
def test_weighted_random_sampler_refuses_what_torchs_refuses(weights, num_samples, replacement, exc, message):
    # torch's multinomial errors come at the first epoch; ours when the sampler is made (same words)
    raises_as_torch(exc, message, lambda: tad.WeightedRandomSampler(weights, num_samples, replacement),
                    lambda: list(tud.WeightedRandomSampler(weights, num_samples, replacement)))


# -- DataLoader with samplers ---------------------------------------------------------------------------------------


def test_data_loader_builds_torchs_samplers_and_takes_them():
    ours, theirs = _pair()
    a, b = tad.DataLoader(ours, batch_size=4), tud.DataLoader(theirs, batch_size=4)
    assert type(a.sampler).__name__ == type(b.sampler).__name__ == "SequentialSampler"
    assert isinstance(a.batch_sampler, tad.BatchSampler) and a.batch_sampler.batch_size == 4
    assert isinstance(tad.DataLoader(ours, shuffle=True).sampler, tad.RandomSampler)
    assert tad.DataLoader(ours, batch_size=None).batch_sampler is None
    for kwargs in (dict(sampler=tad.SequentialSampler(ours), batch_size=3),
                   dict(sampler=tad.SubsetRandomSampler([9, 1, 4]), batch_size=2),
                   dict(batch_sampler=tad.BatchSampler(tad.SequentialSampler(ours), 5, drop_last=False)),
                   dict(batch_sampler=tad.BatchSampler(range(10, -1, -2), 2, drop_last=True)),
                   dict(sampler=tad.SequentialSampler(ours), batch_size=None)):
        torch_kwargs = {k: _as_torch(v) for k, v in kwargs.items()}
        loader = tad.DataLoader(ours, **kwargs)
        twin = tud.DataLoader(theirs, **torch_kwargs)
        assert len(loader) == len(twin), kwargs
        if isinstance(kwargs.get("sampler"), tad.SubsetRandomSampler):  # the order is the generator's
            assert sorted(np.concatenate([yb.numpy() for _, yb in loader]).tolist()) == sorted(
                np.concatenate([yb.numpy() for _, yb in twin]).tolist())
            continue
        for x, y in zip(loader, twin, strict=True):
            assert_same(x, y)
        assert loader.fetch_route == ("per_sample" if kwargs.get("batch_size", 1) is None else "indexed"), kwargs


def _as_torch(sampler):
    """Our sampler's torch twin (same arguments; our sources stand in for torch's as they are)."""
    if isinstance(sampler, tad.SequentialSampler):
        return tud.SequentialSampler(sampler.data_source)
    if isinstance(sampler, tad.SubsetRandomSampler):
        return tud.SubsetRandomSampler(sampler.indices)
    if isinstance(sampler, tad.BatchSampler):
        return tud.BatchSampler(_as_torch(sampler.sampler), sampler.batch_size, sampler.drop_last)
    return sampler


def test_a_subset_of_a_tensor_dataset_is_cut_by_index_with_what_each_sample_gives():
    ours, theirs = _pair(13)
    inner = [12, 0, 5, 3, 9, 1, 7, 11, 2]
    outer = [8, 0, 3, -1, 4, 6]
    a = tad.DataLoader(tad.Subset(tad.Subset(ours, inner), outer), batch_size=4)
    b = tud.DataLoader(tud.Subset(tud.Subset(theirs, inner), outer), batch_size=4)
    for x, y in zip(a, b, strict=True):
        assert_same(x, y)
    assert a.fetch_route == "indexed"
    by_sample = tad.DataLoader(tad.Subset(tad.Subset(ours, inner), outer), batch_size=4, collate_fn=tad.default_collate)
    for x, y in zip(by_sample, b, strict=True):
        assert_same(x, y)
    assert by_sample.fetch_route == "per_sample"


def test_a_tensor_dataset_subclass_that_overrides_getitem_has_its_own_getitem_run():
    # The indexed route cut a TensorDataset subclass's arrays directly: its own __getitem__ (here, scaling) never ran
    class Scaled(tad.TensorDataset):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return ta.tensor(x.numpy() * 2), y

    x, y = _arrays()
    loader = tad.DataLoader(Scaled(x, y), batch_size=4)
    np.testing.assert_array_equal(np.concatenate([xb.numpy() for xb, _ in loader]), x * 2)
    assert loader.fetch_route == "per_sample"


def test_a_subset_subclass_that_overrides_getitem_has_its_own_getitem_run():
    class Picked(tad.Subset):
        def __getitem__(self, i):
            return self.dataset[self.indices[i]][1]

    x, y = _arrays()
    picked = tad.DataLoader(Picked(tad.TensorDataset(x, y), [3, 4]), batch_size=2)
    assert [b.numpy().tolist() for b in picked] == [y[[3, 4]].tolist()] and picked.fetch_route == "per_sample"


def test_a_sampler_of_keys_reaches_the_dataset_as_they_are():
    # torch passes what the sampler yields to dataset[...] (its docs: non-integral keys need a custom sampler);
    # int(key) turned them into a ValueError
    table = {"a": 1.0, "b": 2.0, "c": 3.0}
    ours = list(tad.DataLoader(table, sampler=["c", "a", "b"], batch_size=2))
    theirs = list(tud.DataLoader(table, sampler=["c", "a", "b"], batch_size=2))
    for x, y in zip(ours, theirs, strict=True):
        assert_same(x, y)


def test_data_loader_drop_last_must_be_a_bool_as_torchs():
    raises_as_torch(ValueError, "drop_last should be a boolean value, but got drop_last=1",
                    lambda: tad.DataLoader(range(4), drop_last=1), lambda: tud.DataLoader(range(4), drop_last=1))


# -- IterableDataset ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size, drop_last", [(size, drop) for size in (1, 2, 3, 7, 10) for drop in (False, True)]
                         + [(None, False)])  # None with drop_last is refused by both (test_data_loader_torch)
@pytest.mark.parametrize("dicts", [False, True])
def test_an_iterable_dataset_is_batched_as_torch_batches_it(batch_size, drop_last, dicts):
    ours = tad.DataLoader(_Stream(7, dicts=dicts, sized=True), batch_size=batch_size, drop_last=drop_last)
    theirs = tud.DataLoader(_TorchStream(7, dicts=dicts, sized=True), batch_size=batch_size, drop_last=drop_last)
    assert len(ours) == len(theirs)
    for epoch in range(2):  # each epoch iterates the dataset anew
        got, want = list(ours), list(theirs)
        assert len(got) == len(want) == len(ours)
        for x, y in zip(got, want):
            assert_same(x, y, f"epoch {epoch}")
    assert ours.fetch_route == ("per_sample" if want else None)  # None: drop_last left no batch
    assert ours.sampler is None and ours.batch_sampler is None


def test_an_iterable_dataset_has_a_length_only_when_it_defines_one_as_in_torch():
    raises_as_torch(TypeError, "object of type '_(Torch)?Stream' has no len()",
                    lambda: len(tad.DataLoader(_Stream(5), batch_size=2)),
                    lambda: len(tud.DataLoader(_TorchStream(5), batch_size=2)))
    assert [b.numpy().tolist() for b in tad.DataLoader(_Stream(5), batch_size=2)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(TypeError, match="has a length only where it defines __len__"):
        len(_Stream(5))


@pytest.mark.parametrize("kwargs, message", [
    (dict(shuffle=True), "DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle=True"),
    (dict(sampler=[0, 1]), r"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                           r"sampler=\[0, 1\]"),
    (dict(batch_sampler=[[0]]), r"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                r"got batch_sampler=\[\[0\]\]"),
    (dict(batch_size=2, drop_last=1), "drop_last should be a boolean value, but got drop_last=1"),
])
def test_an_iterable_dataset_refuses_what_torch_refuses(kwargs, message):
    raises_as_torch(ValueError, message, lambda: tad.DataLoader(_Stream(3), **kwargs),
                    lambda: tud.DataLoader(_TorchStream(3), **kwargs))
    assert len(list(tad.DataLoader(_Stream(3), shuffle=False))) == 3


def test_a_bare_iterable_is_refused_saying_to_subclass_iterable_dataset():
    class Stream:
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match=r"has no __getitem__.*should subclass IterableDataset"):
        tad.DataLoader(Stream(), batch_size=2)


# -- get_rng_state / set_rng_state ----------------------------------------------------------------------------------


def test_set_rng_state_replays_the_default_generators_draws():
    ta.manual_seed(5)
    state = ta.get_rng_state()
    assert isinstance(state, ta.Tensor) and state.dtype == np.uint8 and state.shape == (37,)
    x, y = _arrays(20)
    first = (ta.randn(4).numpy(), ta.nn.Linear(3, 2).weight.numpy().copy(),
             [yb.numpy().tolist() for _, yb in tad.DataLoader(tad.TensorDataset(x, y), batch_size=6, shuffle=True)])
    generator = ta.manual_seed(6)  # the generator manual_seed hands out follows the restore: it is the one
    ta.set_rng_state(state)
    again = (ta.randn(4).numpy(), ta.nn.Linear(3, 2).weight.numpy().copy(),
             [yb.numpy().tolist() for _, yb in tad.DataLoader(tad.TensorDataset(x, y), batch_size=6, shuffle=True)])
    np.testing.assert_array_equal(again[0], first[0])
    np.testing.assert_array_equal(again[1], first[1])
    assert again[2] == first[2]
    ta.set_rng_state(state)
    assert generator.random() == pytest.approx(ta.manual_seed(5).random(), abs=0)
    # as torch's: the state is a copy, not a view of the generator
    t_state = torch.get_rng_state()
    torch.rand(1)
    assert not torch.equal(t_state, torch.get_rng_state())
    before = ta.get_rng_state().numpy().copy()
    ta.randn(3)
    assert not np.array_equal(before, ta.get_rng_state().numpy())


def test_rng_state_round_trips_through_a_checkpoint_after_a_half_drawn_uint32(tmp_path):
    ta.manual_seed(2)
    ta.random.default_generator().integers(0, 2**32, dtype=np.uint32)  # PCG64 keeps the other half for the next
    ta.save({"rng": ta.get_rng_state()}, tmp_path / "ckpt.safetensors")
    want = ta.random.default_generator().integers(0, 2**32, size=5, dtype=np.uint32)
    ta.manual_seed(99)
    ta.set_rng_state(ta.load(tmp_path / "ckpt.safetensors")["rng"])
    np.testing.assert_array_equal(ta.random.default_generator().integers(0, 2**32, size=5, dtype=np.uint32), want)


def test_set_rng_state_refuses_what_is_not_its_state():
    with pytest.raises(TypeError, match=r"this is torch's RNG state \(torch.get_rng_state\(\)\); tensorarena's "
                                        r"generator is another one"):
        ta.set_rng_state(torch.get_rng_state())
    with pytest.raises(TypeError, match="expects the uint8 Tensor ta.get_rng_state.. returned, got list"):
        ta.set_rng_state([1, 2, 3])
    with pytest.raises(TypeError, match="got Tensor of dtype float32"):
        ta.set_rng_state(ta.zeros(37))
    with pytest.raises(ValueError, match=r"expects the 37 bytes ta.get_rng_state\(\) returned; got an array of shape "
                                         r"\(5056,\)"):
        ta.set_rng_state(torch.get_rng_state().numpy())
    even = ta.get_rng_state().numpy().copy()
    even[16] &= 0xFE  # no PCG64 increment is even
    with pytest.raises(ValueError, match="is not one of them"):
        ta.set_rng_state(even)


# -- end to end -----------------------------------------------------------------------------------------------------


def test_a_random_split_trains_through_a_data_loader_on_the_fused_route_as_torch_on_the_same_batches():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 6)).astype(np.float32)
    y = rng.integers(0, 3, 50)
    train, val = tad.random_split(tad.TensorDataset(x, y), [0.8, 0.2], generator=np.random.default_rng(2))
    assert (len(train), len(val)) == (40, 10) and sorted(train.indices + val.indices) == list(range(50))
    model, twin = sequential_and_twin(6, 8, 3)
    trainer = Trainer(model, ta.optim.SGD(model.parameters(), lr=0.1), ta.nn.functional.cross_entropy,
                      route="fused")
    topt = torch.optim.SGD(twin.parameters(), lr=0.1)
    loader = tad.DataLoader(train, batch_size=16, shuffle=True, generator=np.random.default_rng(3))
    assert len(loader) == 3  # 16, 16 and a short batch of 8
    orders = []
    for epoch in range(2):
        seen = []
        for xb, yb in loader:
            assert loader.fetch_route == "indexed"  # rows cut from the TensorDataset's arrays through the Subset
            seen += [int(np.flatnonzero((x == row).all(axis=1))[0]) for row in xb.numpy()]
            report = trainer.step(xb, yb)
            assert report.route == "fused"
            topt.zero_grad()
            loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(xb.numpy())), torch.from_numpy(yb.numpy()))
            loss.backward()
            topt.step()
            assert report.loss == pytest.approx(loss.item(), rel=1e-5)
        assert sorted(seen) == sorted(train.indices)  # each training row once an epoch, no validation row
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled
    for p, q in zip(twin.parameters(), model.parameters()):
        np.testing.assert_allclose(q.numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6)
    xv, yv = next(iter(tad.DataLoader(val, batch_size=len(val))))
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(twin(torch.from_numpy(xv.numpy())), torch.from_numpy(yv.numpy()))
    assert trainer.evaluate(xv.numpy(), yv.numpy())["loss"] == pytest.approx(want.item(), rel=1e-5)



def test_readme_lists_what_tensorarena_utils_data_holds_both_ways():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("- `tensorarena.utils.data` has torch's")
    bullet = readme[start:readme.index("\n- ", start + 1)]
    named = set(re.findall(r"`([A-Za-z_]+)`", bullet))
    assert named - {"num_workers", "generator"} <= set(tad.__all__), named - set(tad.__all__)
    assert set(tad.__all__) <= named, set(tad.__all__) - named
    assert "`ta.get_rng_state()` / `ta.set_rng_state()`" in bullet and ta.get_rng_state and ta.set_rng_state
