"""Writing safetensors files straight from arrays, without building the file in memory first.

safetensors' own `save`/`save_file` (numpy flavour) turn every tensor into a Python bytes object and the
whole file into one more: a checkpoint of a model with its optimizer state briefly held two or three copies
of that state, which the memory plan does not count (bench/budget_sweep.py: `train --model vit-tiny --save`
peaked 147 MiB above its plan). Here each tensor's bytes go from the array to the file through a memoryview.

The layout, from the format's description: 8 bytes little-endian header length, the JSON header (name ->
{"dtype", "shape", "data_offsets": [begin, end] within the data}, plus "__metadata__": str -> str) padded
with spaces to a multiple of 8, then the tensors' bytes back to back, C order, little-endian.
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

import numpy as np

DTYPES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
          np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16", np.dtype(np.int8): "I8",
          np.dtype(np.uint64): "U64", np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16",
          np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL", np.dtype(np.complex64): "C64"}


def dtype_code(dtype, name: str) -> str:
    """The safetensors code of `dtype` (F32, I64, ...); a clear error for one the format cannot hold."""
    dtype = np.dtype(dtype)
    code = DTYPES.get(dtype.newbyteorder("="))
    if code is None:
        raise ValueError(f"tensor {name!r} has dtype {dtype}, which a safetensors file cannot hold; use one of "
                         f"{', '.join(sorted(str(d) for d in DTYPES))}")
    return code


def header_bytes(entries: dict[str, dict[str, Any]], metadata: dict[str, str] | None) -> bytes:
    """The length prefix and the padded JSON header for `entries` (name -> dtype, shape, data_offsets)."""
    header = dict(entries)
    if metadata:
        bad = [key for key, value in metadata.items() if not isinstance(key, str) or not isinstance(value, str)]
        if bad:
            raise ValueError(f"safetensors metadata maps str to str; entries {bad[:4]} are not")
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def raw_bytes(array: np.ndarray):
    """The bytes of `array` as the file holds them (C order, little-endian), without a copy where memoryview can
    give them (it refuses a 0-d array and a zero-size one, "cannot cast view with zeros in shape": those are
    tiny, so copied)."""
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return array.tobytes() if array.ndim == 0 or array.size == 0 else memoryview(array).cast("B")


def tensor_entries(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Header entries for `arrays`, laid out in the dict's order."""
    entries, offset = {}, 0
    for name, array in arrays.items():
        if name == "__metadata__":  # the header's key for the metadata: a tensor of that name made an unreadable file
            raise ValueError("a tensor cannot be named '__metadata__' in a safetensors file (the header keeps the "
                             "file's metadata under that key); rename it")
        nbytes = array.size * array.itemsize
        entries[name] = {"dtype": dtype_code(array.dtype, name), "shape": list(array.shape),
                         "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    return entries


def write_safetensors(f: BinaryIO, arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write `arrays` (name -> array, any strides and byte order) and `metadata` to the open file `f` as one
    safetensors file, array by array: no copy of the data beyond what a non-contiguous array needs."""
    f.write(header_bytes(tensor_entries(arrays), metadata))
    for array in arrays.values():
        f.write(raw_bytes(array))



# -- reading -----------------------------------------------------------------------------------------------------
# safetensors' numpy reader stops at a BF16 tensor (NumPy has no bfloat16: "data type 'bfloat16' not understood",
# naming neither file nor tensor), and Hugging Face checkpoints are often bfloat16. This reader maps the file and
# widens BF16 to float32, exactly: a bfloat16 is the top half of the float32 with the same value.

CODES = {code: dtype for dtype, code in DTYPES.items()}


def read_header(f: BinaryIO, path) -> tuple[dict[str, Any], int, int]:
    """The header of the safetensors file open as `f` (name -> entry, "__metadata__" included), where its data
    begins and how many bytes of data the file holds; a clear error naming `path` for a file that is no
    safetensors file or is cut short before its data."""
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    prefix = f.read(8)
    length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
    if length is None or length > size - 8:
        raise ValueError(f"{path} is not a safetensors file: its {size} bytes cannot hold the header its first "
                         f"8 bytes announce; it may be truncated or of another format")
    try:
        header = json.loads(f.read(length))
    except ValueError as err:
        raise ValueError(f"{path} is not a safetensors file: its header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file: its header is a JSON {type(header).__name__}, not an "
                         f"object")
    return header, 8 + length, size - 8 - length


def tensor_layout(path, name: str, entry: dict, data_size: int) -> tuple[str, np.dtype, tuple[int, ...], int, int]:
    """(code, stored dtype (little-endian; uint16 for BF16), shape, begin, end) of tensor `name`, its header
    `entry` checked against the `data_size` bytes of data the file holds."""
    if not isinstance(entry, dict):  # a damaged header: entry.get would fail with an AttributeError naming nothing
        raise ValueError(f"{path}: tensor {name!r} has the header entry {entry!r}, not an object with its dtype, "
                         f"shape and data_offsets; the file is corrupt")
    code = entry.get("dtype")
    shape = tuple(entry.get("shape", ()))
    begin, end = entry.get("data_offsets", (0, -1))
    dtype = np.dtype(np.uint16) if code == "BF16" else CODES.get(code)
    if dtype is None:
        raise ValueError(f"{path}: tensor {name!r} has dtype {code}, which tensorarena cannot read; it reads "
                         f"BF16 and {', '.join(sorted(CODES))}")
    count = int(np.prod(shape, dtype=np.int64))
    if not 0 <= begin <= end <= data_size or end - begin != count * dtype.itemsize:
        raise ValueError(f"{path}: tensor {name!r} ({code}, shape {list(shape)}) needs {count * dtype.itemsize} "
                         f"bytes, but its header places bytes {begin} to {end} of a data section of "
                         f"{max(data_size, 0)}; the file is truncated or corrupt")
    return code, dtype.newbyteorder("<"), shape, begin, end


def widened(code: str, raw: np.ndarray) -> np.ndarray:
    """A tensor as tensorarena holds it: BF16 (read as uint16) widened to float32, exactly (a bfloat16 is the top
    half of the float32 of the same value); any other as read."""
    return (raw.astype(np.uint32) << 16).view(np.float32) if code == "BF16" else raw


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the safetensors file `path`: read-only arrays mapped from it (no copy), little-endian, BF16
    ones widened to float32 (a copy). Errors name the file and, where one is at fault, the tensor."""
    with open(path, "rb") as f:
        header, data_start, data_size = read_header(f, path)
    mapped = np.asarray(np.memmap(path, dtype=np.uint8, mode="r"))  # a plain read-only view of the mapping
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        code, dtype, shape, begin, end = tensor_layout(path, name, entry, data_size)
        out[name] = widened(code, mapped[data_start + begin:data_start + end].view(dtype).reshape(shape))
    return out
