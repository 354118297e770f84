"""Checkpoints of a streaming run, in the same file format as train/checkpoint.py, in bounded memory.

`save_streaming_checkpoint` writes the safetensors file one stage at a time from the store
(header first, then each stage's parameters and optimizer state as they are read into a slot),
so saving never holds more than one stage: the eager writer builds the whole file in memory,
which a model that had to stream cannot afford. `load_into_streaming` does the reverse into a
route's store. Both use exactly the names and metadata `save_checkpoint` uses
(`model.<param>`, `optim.<index>.<key>`, JSON under "tensorarena"), so a checkpoint from any
route resumes on any other (tests/test_checkpoint_routes.py).

safetensors layout (from its format description): 8 bytes little-endian header length, the
JSON header (name -> dtype, shape, data_offsets; "__metadata__" -> str -> str) padded with
spaces to a multiple of 8, then the tensors' bytes back to back.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..random import default_generator
from ..train.checkpoint import FORMAT, VERSION, _atomic_write, _generators, _jsonable, read_metadata

_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64"}


def _optimizer_index(optimizer) -> dict[int, int]:
    """id(param) -> its index in optimizer.state_dict() (order of first appearance over the groups)."""
    index: dict[int, int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            index.setdefault(id(p), len(index))
    return index


def _entries(route) -> list[tuple[int, str, str, Any]]:
    """(stage, tensor name, what, key) for every tensor of the file, in file order."""
    index = _optimizer_index(route.optimizer)
    rows = []
    for k, (stage, names) in enumerate(zip(route.stages, route._names)):
        for i, (p, name) in enumerate(zip(stage.params, names)):
            rows.append((k, f"model.{name}", "param", i))
            if id(p) in index:
                j = index[id(p)]
                for kind in route.kinds.arrays:
                    rows.append((k, f"optim.{j}.{kind}", "state", (i, kind)))
                for s, kind in enumerate(route.kinds.scalars):
                    rows.append((k, f"optim.{j}.{kind}", "scalar", (i, s)))
    return rows


def _meta(route, step: int, extra: dict | None) -> dict:
    # The optimizer's state lives in the store (its in-memory state is empty): only the groups are used.
    groups = route.optimizer.state_dict()["param_groups"]
    meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "step": step, "extra": extra or {},
                            "optimizer": {"class": type(route.optimizer).__name__, "param_groups": _jsonable(groups),
                                          "scalar_state": {}}}
    if route.scheduler is not None:
        meta["scheduler"] = {"class": type(route.scheduler).__name__,
                             "state": _jsonable(route.scheduler.state_dict())}
    meta["rng"] = {name: g.bit_generator.state for name, g in _generators(route.model).items()}
    meta["rng_default"] = default_generator().bit_generator.state
    return meta


def save_streaming_checkpoint(route, path: str | os.PathLike, *, step: int, extra: dict | None = None) -> None:
    """Write the run's checkpoint from the store, one stage in memory at a time, atomically."""
    store = route.store
    store.drain()
    rows = _entries(route)
    # Shapes and dtypes come from the store's layout, so nothing needs loading to write the header.
    header: dict[str, Any] = {}
    offset = 0
    for k, name, what, key in rows:
        spec = store.layouts[k].stage.params[key if what == "param" else key[0]]
        shape, dtype = (tuple(spec.shape), np.dtype(spec.dtype)) if what != "scalar" else ((), np.dtype(np.float64))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"tensorarena": json.dumps(_meta(route, step, extra))}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)

    def write(f) -> None:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        loaded = views = array = None
        for k, name, what, key in rows:
            if loaded != k:
                views = array = None  # io="map": no view of the slot may outlive this read (store._release)
                store.read(k, 0).result()
                views, loaded = store.views(0, k), k
            if what == "param":
                array = views.params[key]
            elif what == "state":
                array = views.state[key[0]][key[1]]
            else:
                array = views.scalars[key[0], key[1]:key[1] + 1].reshape(())
            f.write(np.ascontiguousarray(array).tobytes() if array.ndim == 0 else memoryview(array).cast("B"))

    _atomic_write(Path(path), write)


def load_into_streaming(route, path: str | os.PathLike) -> dict:
    """Fill the route's store from a checkpoint of any route, stage by stage; returns its metadata."""
    from safetensors import safe_open

    meta = read_metadata(path)
    saved = meta.get("optimizer")
    if saved is None:
        raise ValueError(f"{path} holds no optimizer state, which the streaming store needs")
    if saved["class"] != type(route.optimizer).__name__:
        raise ValueError(f"{path} holds {saved['class']} state but the optimizer is {type(route.optimizer).__name__}")
    rows = _entries(route)
    store = route.store
    store.drain()
    with safe_open(str(path), framework="numpy") as f:
        names = set(f.keys())
        # Parameters must all be there; optimizer state may be absent (never updated): fill values stay.
        missing = sorted(name for _, name, what, _ in rows if what == "param" and name not in names)
        if missing:
            raise ValueError(f"{path} lacks {len(missing)} parameters this model needs, e.g. {missing[:4]}")
        by_stage: dict[int, list] = {}
        for row in rows:
            by_stage.setdefault(row[0], []).append(row)
        for k, stage_rows in by_stage.items():
            store.read(k, 0).result()  # start from what the store holds (fill values for absent state)
            views = store.views(0, k)
            target = None
            for _, name, what, key in stage_rows:
                if name not in names:
                    continue  # e.g. optimizer state of a parameter never updated: keep the fill value
                value = f.get_tensor(name)
                if what == "param":
                    target = views.params[key]
                elif what == "state":
                    target = views.state[key[0]][key[1]]
                else:
                    views.scalars[key[0], key[1]] = float(value)
                    continue
                if value.shape != target.shape:
                    raise ValueError(f"{path}: {name} has shape {value.shape} but the model needs {target.shape}")
                np.copyto(target, value)
            views = target = None  # io="map": the write unmaps the slot (store._release)
            store.write(k, 0, None).result()
    # Hyperparameters, schedule and RNG, then one commit: the store now holds `step`.
    for group, entries in zip(route.optimizer.param_groups, saved["param_groups"]):
        group.update({k: tuple(v) if k == "betas" else v for k, v in entries.items() if k != "params"})
    if route.scheduler is not None and "scheduler" in meta:
        route.scheduler.load_state_dict(meta["scheduler"]["state"])
    generators = _generators(route.model)
    for name, state in meta.get("rng", {}).items():
        if name in generators:
            generators[name].bit_generator.state = state
    if "rng_default" in meta:
        default_generator().bit_generator.state = meta["rng_default"]
    step = int(meta["step"])
    route.step_count = step
    store.commit(**route._progress(step, step))
    return meta
