"""torch.utils.data's datasets, samplers and DataLoader, so `for x, y in loader: ...` ports as it is.

Here: Dataset, IterableDataset, TensorDataset, Subset, ConcatDataset, ChainDataset, random_split (datasets.py),
Sampler, SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler, BatchSampler (samplers.py),
default_collate, default_convert and DataLoader.

A DataLoader yields what torch's yields: batches made by `collate_fn` (default_collate: Tensors, NumPy arrays and
numbers stacked into one Tensor, dicts and sequences collated field by field, strings left a list), the last one
short unless drop_last, in the dataset's order or shuffled anew each epoch (shuffle=True: a RandomSampler drawing
from `generator`, a NumPy Generator; None draws from tensorarena's default generator, which ta.manual_seed seeds,
as torch draws from its global one). `sampler` (a Sampler or any iterable of indices, or of keys the dataset takes)
or `batch_sampler` (of index lists) choose the order instead; `loader.sampler` and `loader.batch_sampler` are
the ones in use, as torch's. An IterableDataset is read in its own order and its samples batched as they come;
shuffle, sampler and batch_sampler are refused for it, as torch refuses them, and len(loader) needs its __len__.

Batches are made in the calling thread: num_workers > 0 and pin_memory are accepted, so a torch script runs, and a
warning says what they do not do here; the worker options torch refuses without workers are refused here too. A
TensorDataset (or a Subset of one, as random_split makes) with the default collate_fn is cut by fancy indexing each
of its arrays once per batch, with the same result as collating its samples one by one (`fetch_route` says which
ran: "indexed" or "per_sample").
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable

import numpy as np

from ..tensor import Tensor
from .datasets import ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset, random_split
from .samplers import (BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler,
                       WeightedRandomSampler)

log = logging.getLogger(__name__)

__all__ = ["BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset", "IterableDataset",
           "RandomSampler", "Sampler", "SequentialSampler", "Subset", "SubsetRandomSampler", "TensorDataset",
           "WeightedRandomSampler", "default_collate", "default_convert", "random_split"]


class TensorDataset(Dataset):
    """Samples are the rows of each tensor at one index: dataset[i] == (t[i] for t in tensors). Tensors or NumPy
    arrays, all with the same first dimension."""

    def __init__(self, *tensors) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        arrays = []
        for position, t in enumerate(tensors):
            array = t.data if isinstance(t, Tensor) else t
            if type(t).__module__.split(".")[0] == "torch":  # "must be a Tensor ..., got Tensor" said nothing
                raise TypeError(f"TensorDataset: argument {position} is a torch.Tensor; pass tensorarena Tensors or "
                                f"NumPy arrays (t.numpy() for a torch one)")
            if not isinstance(array, np.ndarray) or array.ndim == 0:
                raise TypeError(f"TensorDataset: argument {position} must be a Tensor or NumPy array of one or more "
                                f"dimensions, got {type(t).__name__}{' of 0 dimensions' if np.ndim(t) == 0 else ''}")
            arrays.append(array)
        rows = [len(a) for a in arrays]
        if len(set(rows)) > 1:
            raise ValueError(f"TensorDataset: every tensor must have as many rows as the first; their first "
                             f"dimensions are {rows}")
        self.tensors = tuple(tensors)
        self._arrays = arrays

    def __getitem__(self, index):
        return tuple(Tensor(np.array(a[index])) for a in self._arrays)

    def __len__(self) -> int:
        return len(self._arrays[0])


def default_collate(batch: list) -> Any:
    """A list of samples as one batch, as torch's default_collate: Tensors, NumPy arrays and NumPy scalars stacked
    along a new first dimension (one Tensor; with their graph where one requires grad), Python ints int64 (float32
    where the batch mixes in floats, as torch.tensor) and floats float64 (bools bool), dicts by key, namedtuples as
    namedtuples and other sequences as lists, field by field, strings and bytes left as they are."""
    first = batch[0]
    if isinstance(first, (Tensor, np.ndarray, np.generic)):
        _check_same_shape(batch)
    if isinstance(first, Tensor):
        if any(x.requires_grad for x in batch if isinstance(x, Tensor)):  # torch.stack's graph: grads reach them
            from ..ops.shape import stack

            return stack(batch)
        return Tensor(np.stack([x.data for x in batch]))
    if isinstance(first, (np.ndarray, np.generic)) and first.dtype.kind in "biuf":
        return Tensor(np.stack([np.asarray(x) for x in batch]))
    if isinstance(first, float):
        return Tensor(np.array(batch, dtype=np.float64))
    if isinstance(first, int):  # bool is an int: torch.tensor(batch) of the whole batch, so [1, 2.5] is no [1, 2]
        values = np.array(batch)
        if values.dtype.kind == "f":
            return Tensor(values.astype(np.float32))  # torch.tensor's default dtype for floats
        return Tensor(values.astype(np.int64) if values.dtype.kind in "iu" else values)
    if isinstance(first, (str, bytes)):
        return batch
    if isinstance(first, Mapping):
        return {key: default_collate([sample[key] for sample in batch]) for key in first}
    if isinstance(first, Sequence):
        lengths = {len(sample) for sample in batch}
        if len(lengths) > 1:
            raise RuntimeError(f"default_collate: each sample of a batch must have the same number of fields; "
                               f"got {sorted(lengths)}")
        fields = [default_collate(list(field)) for field in zip(*batch)]
        if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple stays one, its fields batched
            return type(first)(*fields)
        return fields
    raise TypeError(f"default_collate: a batch must hold Tensors, NumPy arrays, numbers, strings, dicts or "
                    f"sequences of them; found {type(first).__name__}. Pass collate_fn= to batch it yourself")


def _check_same_shape(batch: list) -> None:
    """Samples to stack must have one shape: NumPy's own error ("all input arrays must have the same shape") named
    neither the shapes nor the way out, the usual one being sequences of different lengths."""
    shapes = [tuple(np.shape(x)) for x in batch]
    for position, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise RuntimeError(f"default_collate: stack expects each sample to be of equal size, but got {shapes[0]} "
                               f"at entry 0 and {shape} at entry {position}; pad them to one length in a collate_fn "
                               f"of your own (DataLoader(collate_fn=...)), or use batch_size=1")


def default_convert(sample: Any) -> Any:
    """One sample as a DataLoader with batch_size=None yields it: NumPy arrays and scalars as Tensors, containers
    converted within, anything else as it is (torch's default_convert)."""
    if isinstance(sample, (np.ndarray, np.generic)) and sample.dtype.kind in "biuf":
        return Tensor(np.asarray(sample))
    if isinstance(sample, Mapping):
        return {key: default_convert(value) for key, value in sample.items()}
    if isinstance(sample, (list, tuple)):
        return [default_convert(value) for value in sample]
    return sample


class DataLoader:
    """Batches of a dataset, as torch.utils.data.DataLoader (module docstring). Iterate it once per epoch."""

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Iterable[int] | None = None, batch_sampler: Iterable[list[int]] | None = None,
                 num_workers: int = 0, collate_fn: Callable[[list], Any] | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, multiprocessing_context=None,
                 generator: np.random.Generator | None = None, *, prefetch_factor: int | None = None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True) -> None:
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                                       or batch_size <= 0):
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
        iterable = isinstance(dataset, IterableDataset)
        if iterable:  # checked first, as torch does: no sampler picks from a stream, whatever else is wrong
            read = "an iterable-style dataset is read in the order its __iter__ yields"
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle!r}; {read}: shuffle inside it")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                                 f"sampler={sampler!r}; {read}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                 f"got batch_sampler={batch_sampler!r}; {read}: pass batch_size")
        elif not hasattr(dataset, "__getitem__"):  # else a TypeError at the first epoch: "object has no len()"
            raise TypeError(f"DataLoader: the dataset ({type(dataset).__name__}) has no __getitem__; a map-style "
                            f"dataset gives __getitem__(index) and __len__() (a Dataset, TensorDataset, list or "
                            f"array), and one that can only be iterated should subclass IterableDataset "
                            f"(tensorarena.utils.data's, as torch's)")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle: the sampler chooses the order")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler and "
                             "drop_last: it chooses the batches")
        if batch_size is None and drop_last:  # torch refuses it too: with no batches there is no last one to drop
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if iterable and batch_size is not None and not isinstance(drop_last, bool):  # BatchSampler checks the rest
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError(f"num_workers option should be a non-negative integer, got {num_workers!r}")
        # torch's refusals of worker options without workers: taken silently, a script that passed them believed it
        # had workers to prefetch, keep alive or start in that context
        if timeout < 0:
            raise ValueError(f"timeout option should be non-negative, got {timeout!r}")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified with num_workers > 0 (and here does "
                             "nothing: batches are made in the calling thread); set prefetch_factor to None")
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError(f"prefetch_factor option should be non-negative, got {prefetch_factor!r}")
        if num_workers == 0 and persistent_workers:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if num_workers == 0 and multiprocessing_context is not None:
            raise ValueError("multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
                             "but got num_workers=0")
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(f"DataLoader: generator must be a numpy.random.Generator (np.random.default_rng(seed)), "
                            f"got {type(generator).__name__}")
        if batch_sampler is not None:
            batch_size, drop_last = None, False
        if sampler is None and not iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not iterable:
            batch_sampler = BatchSampler(sampler, int(batch_size), drop_last)
        self.dataset = dataset
        self.batch_size = None if batch_size is None else int(batch_size)
        self.shuffle = bool(shuffle)
        # None for an IterableDataset (torch's are placeholders there: an endless sampler and one batching it)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.generator = generator
        self._iterable = iterable
        self.num_workers = int(num_workers)
        self.fetch_route: str | None = None  # "indexed" or "per_sample": how the last batch was made
        if num_workers:
            log.warning("DataLoader(num_workers=%d): tensorarena makes batches in the calling thread; there are no "
                        "worker processes (worker_init_fn, prefetch_factor and timeout do nothing)", num_workers)
        if pin_memory:
            log.warning("DataLoader(pin_memory=True): there is no accelerator, so no memory is pinned")

    def __len__(self) -> int:
        if self._iterable:  # the dataset's own count, which a stream may not know: TypeError then, as torch's
            samples = len(self.dataset)
        elif self.batch_sampler is not None:
            return len(self.batch_sampler)
        else:
            return len(self.sampler)
        if self.batch_size is None:
            return samples
        return samples // self.batch_size if self.drop_last else math.ceil(samples / self.batch_size)

    def __iter__(self):
        if self._iterable:
            yield from self._stream()
            return
        if self.batch_sampler is None:  # batch_size=None: one sample at a time, converted (not stacked)
            for index in self.sampler:
                self.fetch_route = "per_sample"
                yield (self.collate_fn or default_convert)(self.dataset[index])
            return
        cut = _rows_of(self.dataset) if self.collate_fn is None else None
        for indices in self.batch_sampler:
            if cut is not None:  # one fancy index per array: what default_collate of the rows would stack
                self.fetch_route = "indexed"
                yield cut(indices)
            else:
                self.fetch_route = "per_sample"
                yield (self.collate_fn or default_collate)([self.dataset[i] for i in indices])

    def _stream(self):
        """An IterableDataset's samples in batches of batch_size as they come (the last one short unless
        drop_last), or one by one converted with batch_size=None."""
        samples = iter(self.dataset)
        if self.batch_size is None:
            for sample in samples:
                self.fetch_route = "per_sample"
                yield (self.collate_fn or default_convert)(sample)
            return
        while batch := list(itertools.islice(samples, self.batch_size)):
            if self.drop_last and len(batch) < self.batch_size:
                return
            self.fetch_route = "per_sample"
            yield (self.collate_fn or default_collate)(batch)


def _rows_of(dataset) -> Callable[[list], list[Tensor]] | None:
    """How to cut a batch straight from a TensorDataset's arrays when `dataset` is one, or a Subset of one (of a
    Subset of one ...), else None. Only their own __getitem__: a subclass's override must run for each sample."""
    subsets = []
    while isinstance(dataset, Subset) and type(dataset).__getitem__ is Subset.__getitem__:
        subsets.append(dataset)
        dataset = dataset.dataset
    if not isinstance(dataset, TensorDataset) or type(dataset).__getitem__ is not TensorDataset.__getitem__:
        return None
    positions = [np.asarray(subset.indices, dtype=np.intp) for subset in subsets]  # once an epoch, outermost first
    arrays = dataset._arrays

    def cut(indices: list) -> list[Tensor]:
        rows = np.asarray(indices, dtype=np.intp)
        for chosen in positions:
            rows = chosen[rows]
        return [Tensor(a[rows]) for a in arrays]

    return cut
