"""A safetensors file read one tensor at a time, with plain reads into arrays of our own.

A resumed run loads its checkpoint beside the model and the optimizer state it already holds. safetensors'
load_file read the whole file (every weight and every moment) into memory first, and its safe_open maps the
file, where every page a read touches stays in the process's RSS until the map goes: either way a load peaked
one whole checkpoint above what the run needs, a peak no plan counted (route auto resumed at 300M planned
275.6 MiB and peaked 332). Here a tensor is read into a fresh array when it is asked for and freed when the
caller lets it go, so a load holds one tensor at a time beyond the model and its state.

One open file for the whole load: a save renaming a new checkpoint over the path meanwhile does not mix two
files' tensors (the reads stay on the file that was opened and checked).
"""

from __future__ import annotations

import mmap
import os
import zlib
from typing import Any

import numpy as np

from .safetensors_io import read_header, tensor_layout, widened

_CHUNK = 8 << 20  # checksums are computed through one buffer of this size: memory stays bounded
# A tensor of at least this many bytes is read into an anonymous mapping of its own, not malloc's memory: glibc
# raises its mmap threshold to the size of each mapped block freed, so after a load read and freed tensors of a
# few MiB, the arrays made next (the optimizer state the fused route lays out, the step's buffers) came from the
# heap, whose freed pages stay resident: a resumed vit-tiny peaked 8 MiB (2.6%) above its plan at its first step.
_OWN_MAPPING_BYTES = 128 << 10  # glibc's initial mmap threshold


def file_identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file from another renamed over its path (device, inode) or from itself rewritten in place
    (size, modification time): a load that reads a path more than once compares it at each read."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _fresh(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < _OWN_MAPPING_BYTES:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)  # unmapped when the array is freed


class TensorFile:
    """The tensors of the safetensors file at `path`, each read when asked for (`read`, or `lazy` for a value that
    reads itself when NumPy asks for its data). A context manager; the file stays open until `close`."""

    def __init__(self, path) -> None:
        self.path = path
        self._file = open(path, "rb")
        try:
            self.identity = file_identity(os.fstat(self._file.fileno()))  # of the file opened, whatever the path is now
            header, self._data_start, data_size = read_header(self._file, path)
            self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
            self._layout = {name: tensor_layout(path, name, entry, data_size) for name, entry in header.items()}
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def keys(self) -> list[str]:
        """The tensors' names in the order their bytes lie in the file (reads in this order go forward)."""
        return sorted(self._layout, key=lambda name: self._layout[name][3])

    def shape(self, name: str) -> tuple[int, ...]:
        return self._layout[name][2]

    def dtype(self, name: str) -> np.dtype:
        """The dtype `read` gives (float32 for a BF16 tensor)."""
        code, dtype = self._layout[name][:2]
        return np.dtype(np.float32) if code == "BF16" else dtype.newbyteorder("=")

    def read(self, name: str) -> np.ndarray:
        """Tensor `name` as a new writable array (native byte order), read from the file in one go."""
        code, dtype, shape, begin, end = self._layout[name]
        raw = _fresh(shape, dtype)
        self._file.seek(self._data_start + begin)
        # readinto fills the array's own memory: no bytes object in between (one copy of the tensor, not two)
        got = self._file.readinto(memoryview(raw.reshape(-1)).cast("B")) if raw.size else 0
        if got != end - begin:
            raise ValueError(f"{self.path}: tensor {name!r} is cut short ({got} of {end - begin} bytes); the file "
                             f"was truncated after it was opened")
        return widened(code, raw).astype(self.dtype(name), copy=False)

    def lazy(self, name: str) -> StoredTensor:
        return StoredTensor(self, name)

    def crc32(self, name: str) -> int:
        """CRC32 of tensor `name`'s bytes as stored (what checkpoint.tensor_crc32 computed when it was saved), read
        through a bounded buffer."""
        begin, end = self._layout[name][3:]
        # Its own mapping too (_fresh): a freed 8 MiB bytearray raised glibc's mmap threshold as the tensors did, and
        # a fused run loaded mid-way kept 8.9 MiB more resident for good (a helper's memory hunt).
        buffer = memoryview(_fresh((min(_CHUNK, max(end - begin, 1)),), np.dtype(np.uint8)))
        self._file.seek(self._data_start + begin)
        crc, left = 0, end - begin
        while left:
            got = self._file.readinto(buffer[:min(left, len(buffer))])
            if not got:
                raise ValueError(f"{self.path}: the data of tensor {name!r} is cut short")
            crc = zlib.crc32(buffer[:got], crc)
            left -= got
        return crc


class StoredTensor:
    """A tensor of a TensorFile that reads itself when NumPy asks for its values (np.asarray(t), np.copyto from
    it): a state dict of these costs no memory until each entry is used, and each read is freed after its use.
    `shape`, `dtype` and `ndim` are known without reading (a load checks them first)."""

    __slots__ = ("_file", "name", "shape", "dtype")
    reads_fresh = True  # each np.asarray(t) is a new array no one else holds: a loader may keep it (optimizer.py)

    def __init__(self, file: TensorFile, name: str) -> None:
        self._file, self.name = file, name
        self.shape, self.dtype = file.shape(name), file.dtype(name)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self._file.read(self.name)  # a new array each time: the caller owns it (a copy whatever `copy`)
        return array if dtype is None else array.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"StoredTensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, file={self._file.path})"
