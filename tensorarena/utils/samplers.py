"""torch.utils.data's samplers: which indices a DataLoader fetches, in which order, and how they are batched.

The same arguments, defaults, refusals and lengths as torch's. The deterministic ones (SequentialSampler,
BatchSampler) give torch's indices exactly; the random ones draw from a NumPy Generator (`generator=`; None means
tensorarena's default generator, which ta.manual_seed seeds) where torch's draw from a torch.Generator, so for a
seed they give another order than torch's, with the same distribution.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence, Sized

import numpy as np

from ..random import get_generator


def _positive_int(value, name: str) -> int:
    """torch's check of a count (bool refused); a NumPy integer is taken, as DataLoader's batch_size is."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value!r}")
    return int(value)


def _numpy_generator(generator, owner: str) -> np.random.Generator | None:
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"{owner}: generator must be a numpy.random.Generator (np.random.default_rng(seed)) or None, "
                        f"got {type(generator).__name__}")
    return generator


class Sampler:
    """Base class of samplers: subclasses give __iter__ (indices, or lists of them for a batch sampler) and, where
    the count is known, __len__."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__(), yielding indices")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1, in order (the length read at each epoch)."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """The indices of data_source shuffled anew each epoch; with replacement=True, num_samples independent draws.

    num_samples (default len(data_source)) may exceed the dataset without replacement too: whole permutations, then
    the start of one more, as torch's. Each epoch's indices are drawn when its first one is asked for; torch seeds a
    generator of its own from its global one there when generator is None, where this draws from tensorarena's
    default generator itself (so a DataLoader(shuffle=True) follows ta.manual_seed)."""

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: np.random.Generator | None = None) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = _numpy_generator(generator, "RandomSampler")
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement!r}")
        _positive_int(self.num_samples, "num_samples")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n, count = len(self.data_source), int(self.num_samples)
        rng = get_generator(self.generator)
        if self.replacement:
            yield from rng.integers(0, n, size=count).tolist()
            return
        for _ in range(count // n):
            yield from rng.permutation(n).tolist()
        if count % n:
            yield from rng.permutation(n)[:count % n].tolist()

    def __len__(self) -> int:
        return int(self.num_samples)


class SubsetRandomSampler(Sampler):
    """The given indices, each once per epoch, in a new random order each epoch."""

    def __init__(self, indices: Sequence[int], generator: np.random.Generator | None = None) -> None:
        self.indices = indices
        self.generator = _numpy_generator(generator, "SubsetRandomSampler")

    def __iter__(self) -> Iterator[int]:
        for i in get_generator(self.generator).permutation(len(self.indices)).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """num_samples indices of range(len(weights)), index i drawn with probability weights[i] / sum(weights); without
    replacement an index comes at most once per epoch (and, as torch's, indices of weight 0 come last, in random
    order, when the others run out). The weights need not sum to 1.

    torch checks the weights only when the first epoch starts (torch.multinomial's errors); they are checked here
    when the sampler is made, with the same words."""

    def __init__(self, weights: Sequence[float], num_samples: int, replacement: bool = True,
                 generator: np.random.Generator | None = None) -> None:
        self.num_samples = _positive_int(num_samples, "num_samples")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement!r}")
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {w.shape}")
        bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
        if bad.size:
            at = int(bad[0])
            kind = "< 0" if w[at] < 0 else "= infinity or NaN"
            raise RuntimeError(f"invalid multinomial distribution (encountering probability entry {kind}): "
                               f"weights[{at}] = {w[at]}; weights must be finite and non-negative")
        if w.sum() <= 0:
            raise RuntimeError(f"invalid multinomial distribution (sum of probabilities <= 0): the {len(w)} weights "
                               f"sum to {w.sum()}; give some index a positive weight")
        if not replacement and self.num_samples > len(w):
            raise RuntimeError(f"cannot sample n_sample > prob_dist.size(-1) samples without replacement: "
                               f"num_samples={self.num_samples} but only {len(w)} weights; draw fewer, or pass "
                               f"replacement=True")
        self.weights, self.replacement = w, replacement
        self.generator = _numpy_generator(generator, "WeightedRandomSampler")

    def __iter__(self) -> Iterator[int]:
        rng, n = get_generator(self.generator), len(self.weights)
        if self.replacement:
            yield from rng.choice(n, size=self.num_samples, p=self.weights / self.weights.sum()).tolist()
            return
        # Sequential draws without replacement, each in proportion to the weights left, are the indices sorted by
        # exponential "arrival times" E_i / w_i (Efraimidis-Spirakis): one draw per index. A weight 0 arrives never
        # (infinity), so those indices come last, among themselves in random order (the tie broken by a uniform).
        with np.errstate(divide="ignore"):
            arrival = rng.exponential(size=n) / self.weights
        order = np.lexsort((rng.random(n), arrival))
        yield from order[:self.num_samples].tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of batch_size indices from `sampler` (any iterable of indices), the last one short unless drop_last."""

    def __init__(self, sampler: Sampler | Iterable[int], batch_size: int, drop_last: bool) -> None:
        self.batch_size = _positive_int(batch_size, "batch_size")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
        self.sampler, self.drop_last = sampler, drop_last

    def __iter__(self) -> Iterator[list]:
        batch: list = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        samples = len(self.sampler)
        return samples // self.batch_size if self.drop_last else math.ceil(samples / self.batch_size)
