"""ta.save / ta.load: what torch.save and torch.load do for a training script (a state_dict, an optimizer's, or a
dict of them with numbers and strings), in one safetensors file.

The arrays are the file's tensors; the structure around them (dicts with their str or int keys, lists, tuples,
numbers, strings, None, which arrays are Tensors and whether they require grad) is JSON in the file's metadata
under "tensorarena.save". No pickle: loading runs no code from the file, as torch.load(weights_only=True), and
an object that is not such data (a module, a function) is refused by save, naming where it sits and what to save
instead. A safetensors file written elsewhere (Hugging Face weights, save_file) loads as a dict of Tensors.
The write is atomic (train/checkpoint.py's: the old file survives a failed save).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .device import check_cpu
from .tensor import Tensor
from .train.checkpoint import _atomic_write, _foreign_file
from .train.safetensors_io import read_header, tensor_entries, tensor_layout, widened, write_safetensors

METADATA_KEY = "tensorarena.save"
FORMAT_VERSION = 1
_HOLDS = ("ta.save holds Tensors, NumPy arrays and scalars, numbers, strings, None, and dicts (str or int keys), "
          "lists and tuples of them")


def save(obj: Any, f) -> None:
    """Write `obj` to `f` (a path, or a binary file open for writing), as torch.save(obj, f)."""
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(obj, arrays, "obj")
    tensor_entries(arrays)  # a dtype safetensors cannot hold is refused, named, before anything is written
    metadata = {METADATA_KEY: json.dumps({"version": FORMAT_VERSION, "tree": tree})}
    if hasattr(f, "write"):
        _binary(f, "save", "wb")
        write_safetensors(f, arrays, metadata)
    else:
        _atomic_write(Path(_path(f, "save")), lambda out: write_safetensors(out, arrays, metadata))


def load(f, map_location=None, *, weights_only: bool = True) -> Any:
    """What ta.save wrote to `f` (a path, or a binary file open for reading), as torch.load(f): arrays come back
    as writable copies, Tensors as Tensors. map_location may only name the CPU (a device, or torch's dict of
    locations whose values are the CPU); weights_only is accepted as torch's and changes nothing (nothing is ever
    unpickled)."""
    _check_map_location(map_location)
    if hasattr(f, "read"):
        _binary(f, "load", "rb")
        where, data = getattr(f, "name", "the file object"), f.read()
        raw = np.frombuffer(data, dtype=np.uint8)
        header, data_start, data_size = read_header(io.BytesIO(data), where)
    else:
        where = _path(f, "load")
        if os.path.isdir(where):
            raise IsADirectoryError(f"ta.load: {where} is a directory; pass the path of the file ta.save wrote")
        if not os.path.isfile(where):
            raise FileNotFoundError(f"ta.load: no file at {where}")
        try:
            with open(where, "rb") as opened:
                header, data_start, data_size = read_header(opened, where)
        except ValueError:
            raise (_foreign_file(Path(where), "a file ta.save wrote") or _not_ours(where)) from None
        raw = np.asarray(np.memmap(where, dtype=np.uint8, mode="r"))
    arrays = {}
    for name, entry in header.items():
        if name != "__metadata__":
            code, dtype, shape, begin, end = tensor_layout(where, name, entry, data_size)
            value = widened(code, raw[data_start + begin:data_start + end].view(dtype).reshape(shape))
            # a writable copy in the machine's byte order (a BF16 tensor is float32 now: its dtype, not the stored one)
            arrays[name] = value.astype(value.dtype.newbyteorder("="), copy=True)
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise _corrupt(where, f"its safetensors metadata is a JSON {type(metadata).__name__}, not an object")
    saved = metadata.get(METADATA_KEY)
    if saved is None:  # safetensors from elsewhere: its tensors by name
        return {name: Tensor(array) for name, array in arrays.items()}
    try:
        content = json.loads(saved)
    except (TypeError, ValueError):
        content = None
    if not isinstance(content, dict) or "tree" not in content:
        raise _corrupt(where, f"its {METADATA_KEY!r} metadata is not the JSON object ta.save writes")
    if content.get("version") != FORMAT_VERSION:
        raise ValueError(f"ta.load: {where} was written by a ta.save of format version {content.get('version')}; "
                         f"this tensorarena reads version {FORMAT_VERSION}")
    try:
        return _decode(content["tree"], arrays)
    except (KeyError, TypeError, ValueError, IndexError) as err:  # a tree ta.save never writes: the file was edited
        raise _corrupt(where, f"its structure does not match its tensors ({type(err).__name__}: {err})") from None


def _check_map_location(map_location) -> None:
    """torch.load's map_location, where every tensor is on the CPU: a device must be the CPU, a dict ({"cuda:0":
    "cpu"}, saved location -> new one) must map to it; a function (torch's per-storage hook) is refused by name, as
    it has no storages to act on (it was reported as a device named '<function ...>')."""
    if isinstance(map_location, dict):
        for target in map_location.values():
            check_cpu(target, "load", " (map_location's values name where tensors go)")
    elif callable(map_location) and not isinstance(map_location, str):
        raise TypeError("ta.load: map_location is a function (torch's hook for each storage); ta.load has no "
                        "storages to pass it, and every tensor it returns is on the CPU: leave map_location out")
    else:
        check_cpu(map_location, "load")


def _path(f, what: str) -> str:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    raise TypeError(f"ta.{what}: f must be a path (str or os.PathLike) or a binary file object, got "
                    f"{type(f).__name__}")


def _binary(f, what: str, mode: str) -> None:
    """Refuse a file object open in text mode: the file is binary (safetensors), and Python's own errors there
    ("a bytes-like object is required", a UnicodeDecodeError) do not say that the mode is what is wrong."""
    if isinstance(f, io.TextIOBase):
        raise TypeError(f"ta.{what}: {getattr(f, 'name', 'the file object')} is open in text mode; a ta.save file is "
                        f"binary: open it with open(path, {mode!r})")


def _corrupt(where, why: str) -> ValueError:
    return ValueError(f"ta.load: {where} is damaged: {why}; load an earlier copy or save it again")


def _not_ours(where) -> ValueError:
    return ValueError(f"ta.load: {where} is not a safetensors file (what ta.save writes); it may be truncated or of "
                      f"another format")


def _encode(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """The JSON of `value`, its arrays put in `arrays`. Containers and arrays are one-key
    objects ({"dict": ...}, {"array": name}); numbers, strings, bools and None are themselves."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    # Each array is named in the file by where it sits (obj['model']['fc.weight']): unique, and what an error
    # about it (a dtype safetensors cannot hold) names.
    if isinstance(value, Tensor):
        name = where
        arrays[name] = np.asarray(value.data, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
        return {"tensor": name, "requires_grad": bool(value.requires_grad)}
    if isinstance(value, (np.ndarray, np.generic)):
        name = where
        arrays[name] = np.asarray(value, order="C")
        return {"array" if isinstance(value, np.ndarray) else "scalar": name}
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if isinstance(key, np.integer):  # np.unique's or an index array's: as torch.save keeps them, an int
                key = int(key)
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(f"ta.save: {where} has the key {key!r} ({type(key).__name__}); dict keys must be str "
                                f"or int")
            items.append([key, _encode(item, arrays, f"{where}[{key!r}]")])
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_encode(item, arrays, f"{where}[{i}]") for i, item in enumerate(value)]}
    advice = " (save its state_dict() instead)" if hasattr(value, "state_dict") else ""
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "numpy"):
        # "is a Tensor; ta.save holds Tensors" said nothing: the Tensor is torch's
        advice = " from PyTorch (torch.Tensor, not tensorarena's Tensor: save t.detach().numpy() instead)"
    raise TypeError(f"ta.save: {where} is a {type(value).__name__}{advice}; {_HOLDS}")


def _decode(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    if not isinstance(tree, dict):
        return tree
    if "tensor" in tree:
        return Tensor(arrays[tree["tensor"]], requires_grad=tree["requires_grad"])
    if "array" in tree:
        return arrays[tree["array"]]
    if "scalar" in tree:
        return arrays[tree["scalar"]][()]
    if "dict" in tree:
        return {key: _decode(item, arrays) for key, item in tree["dict"]}
    items = [_decode(item, arrays) for item in tree["list" if "list" in tree else "tuple"]]
    return items if "list" in tree else tuple(items)
