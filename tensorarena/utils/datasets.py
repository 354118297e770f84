"""torch.utils.data's datasets that hold or combine others: Dataset, IterableDataset, Subset, ConcatDataset,
ChainDataset and random_split, with torch's arguments, lengths and indices.

Where torch asserts (an empty ConcatDataset, an IterableDataset in one), this raises ValueError or TypeError with
the same words: an assert is gone under `python -O`.
"""

from __future__ import annotations

import bisect
import math
import operator
import warnings
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..random import get_generator
from .samplers import _numpy_generator


class Dataset:
    """A map-style dataset: subclasses give __getitem__(index) -> one sample and __len__() -> how many."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__(index), returning one sample")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__(), the number of samples")

    def __add__(self, other) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """An iterable-style dataset: subclasses give __iter__(), yielding the samples of one epoch (a stream, a file
    read line by line), and __len__() only if they know the count. A DataLoader batches what __iter__ yields."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__(), yielding its samples")

    def __len__(self) -> int:  # torch's has none: len() is a TypeError unless the subclass defines it
        raise TypeError(f"object of type '{type(self).__name__}' has no len(): an IterableDataset has a length only "
                        f"where it defines __len__")

    def __add__(self, other) -> ChainDataset:
        return ChainDataset([self, other])


class Subset(Dataset):
    """The samples of `dataset` at `indices`: subset[i] is dataset[indices[i]] (a list of positions, a list)."""

    def __init__(self, dataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Datasets one after another: index i of the whole is index i - cumulative_sizes[k - 1] of the k-th dataset
    holding it; negative indices count from the end."""

    @staticmethod
    def cumsum(sequence) -> list[int]:
        """The running totals of the lengths of `sequence`'s datasets."""
        totals, running = [], 0
        for dataset in sequence:
            running += len(dataset)
            totals.append(running)
        return totals

    def __init__(self, datasets: Iterable) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for position, dataset in enumerate(self.datasets):
            if isinstance(dataset, IterableDataset):
                raise TypeError(f"ConcatDataset does not support IterableDataset (datasets[{position}] is a "
                                f"{type(dataset).__name__}); chain iterable ones with ChainDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        idx = operator.index(idx)
        if idx < 0:
            if -idx > len(self):
                raise ValueError(f"absolute value of index should not exceed dataset length: index {idx} of "
                                 f"{len(self)} samples")
            idx += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        if which == len(self.datasets):  # torch's: "list index out of range", naming neither
            raise IndexError(f"index {idx} is out of range for a ConcatDataset of {len(self)} samples")
        return self.datasets[which][idx - (self.cumulative_sizes[which - 1] if which else 0)]


class ChainDataset(IterableDataset):
    """IterableDatasets one after another, read as they are iterated."""

    def __init__(self, datasets: Iterable) -> None:
        self.datasets = datasets

    def _checked(self) -> Iterator:
        for dataset in self.datasets:
            if not isinstance(dataset, IterableDataset):
                raise TypeError(f"ChainDataset only supports IterableDataset, got {type(dataset).__name__}; join "
                                f"map-style datasets with ConcatDataset")
            yield dataset

    def __iter__(self) -> Iterator:
        for dataset in self._checked():
            yield from dataset

    def __len__(self) -> int:
        return sum(len(dataset) for dataset in self._checked())


def random_split(dataset, lengths: Sequence[int | float], generator: np.random.Generator | None = None
                 ) -> list[Subset]:
    """`dataset` cut into Subsets of the given lengths, its indices shuffled first, as torch's random_split.

    lengths are ints summing to len(dataset), or fractions summing to 1: each split gets floor(fraction * len), and
    what is left goes one each to the splits in turn from the first (a split of 0 warns). The lengths are torch's;
    the shuffle draws from `generator` (a NumPy Generator; None: tensorarena's default, which ta.manual_seed seeds)
    where torch's draws from a torch.Generator, so which indices land in which split differs from torch's."""
    generator = _numpy_generator(generator, "random_split")
    lengths, total = list(lengths), len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:  # torch's test: so [1, 0] are fractions too
        for i, fraction in enumerate(lengths):
            if fraction < 0 or fraction > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
        lengths = [math.floor(total * fraction) for fraction in lengths]
        for i in range(total - sum(lengths)):
            lengths[i % len(lengths)] += 1
        for i, length in enumerate(lengths):
            if length == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.",
                              stacklevel=2)
    for i, length in enumerate(lengths):
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
            raise ValueError(f"random_split: lengths must be non-negative ints summing to len(dataset) ({total}) or "
                             f"fractions summing to 1; lengths[{i}] is {length!r}")
    if sum(lengths) != total:
        raise ValueError(f"Sum of input lengths does not equal the length of the input dataset! The lengths "
                         f"{lengths} sum to {sum(lengths)}; the dataset has {total} samples")
    indices = get_generator(generator).permutation(total).tolist()
    offsets = np.cumsum([0, *lengths]).tolist()
    return [Subset(dataset, indices[start:stop]) for start, stop in zip(offsets[:-1], offsets[1:])]
