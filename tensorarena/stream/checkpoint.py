"""Checkpoints of a streaming run, in the same file format as train/checkpoint.py, in bounded memory.

`save_streaming_checkpoint` writes the safetensors file one stage at a time from the store
(header first, then each stage's parameters and optimizer state as they are read into a slot),
so saving never holds more than one stage: the eager writer builds the whole file in memory,
which a model that had to stream cannot afford. `load_into_streaming` does the reverse into a
route's store. Both use exactly the names and metadata `save_checkpoint` uses
(`model.<param>`, `optim.<index>.<key>`, JSON under "tensorarena"), so a checkpoint from any
route resumes on any other (tests/test_checkpoint_routes.py). Like model.state_dict(), the file also holds
the state in no stage (frozen parameters a model leaves out of its stages, persistent buffers: in memory
during the run, written and loaded directly) and one key per path of a parameter tied inside a stage.

safetensors layout (from its format description): 8 bytes little-endian header length, the
JSON header (name -> dtype, shape, data_offsets; "__metadata__" -> str -> str) padded with
spaces to a multiple of 8, then the tensors' bytes back to back.

The CRC32 of each tensor (the metadata JSON's "crc32", as train/checkpoint.py writes it) is known only once its
data is written, after the header: the header reserves the entry with zeros of the same width, and the writer
fills it in place at the end, in the temporary file before it is fsynced and renamed (still atomic). A load reads
the file once to verify them, in chunks, before the store is touched.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..optim.optimizer import GROUPS_HINT, PARAMS_HINT
from ..random import peek_default_generator
from ..tensor import Tensor
from . import optim_state
from .follow import group_map, grow_state_kinds
from .generator_states import generator_states_problem, restore_generators
from .heap import return_freed_pages
from ..train.checkpoint import (CHECKSUM_KEY, FORMAT, VERSION, _atomic_write, _generators, _jsonable,
                                checksums_entry, metadata_of, open_checkpoint, path_identity, rng_state,
                                saved_checksums, verify_file)
from ..train.safetensors_io import DTYPES, raw_bytes
from ..train.tensor_file import TensorFile


def _optimizer_index(optimizer) -> dict[int, int]:
    """id(param) -> its index in optimizer.state_dict() (order of first appearance over the groups)."""
    index: dict[int, int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            index.setdefault(id(p), len(index))
    return index


def _outside_stages(route) -> list[tuple[str, Any]]:
    """(state_dict key, Tensor or array) of the model's state that is in no stage: parameters stages.py lets a
    model leave out of every stage (frozen ones) and persistent buffers. They stay in memory while the run
    streams, and the eager checkpoint (model.state_dict()) holds them, so this one must too."""
    return [(key, value) for key, value in route.model.state_dict(keep_vars=True).items()
            if id(value) not in route._staged]


def _in_memory(value: Any) -> np.ndarray:
    """The array behind a state_dict value (a Tensor, or a buffer kept as a plain array)."""
    return value.data if isinstance(value, Tensor) else np.asarray(value)


def _entries(route) -> list[tuple[int | None, str, str, Any]]:
    """(stage, tensor name, what, key) for every tensor of the file, in file order: first the state outside
    every stage (stage None, key the Tensor or array), then stage by stage."""
    index = _optimizer_index(route.optimizer)
    rows: list[tuple[int | None, str, str, Any]] = [(None, f"model.{key}", "memory", value)
                                                    for key, value in _outside_stages(route)]
    # A parameter at two paths (tied inside a stage) has one key per path in model.state_dict(), as in torch.
    aliases: dict[int, list[str]] = {}
    for key, value in route.model.state_dict(keep_vars=True).items():
        aliases.setdefault(id(value), []).append(key)
    for k, (stage, names) in enumerate(zip(route.stages, route._names)):
        for i, (p, name) in enumerate(zip(stage.params, names)):
            rows.append((k, f"model.{name}", "param", i))
            rows.extend((k, f"model.{alias}", "param", i) for alias in aliases.get(id(p), []) if alias != name)
            if id(p) in index:
                j = index[id(p)]
                for kind in route.kinds.arrays:
                    rows.append((k, f"optim.{j}.{kind}", "state", (i, kind)))
                for s, kind in enumerate(route.kinds.scalars):
                    rows.append((k, f"optim.{j}.{kind}", "scalar", (i, s)))
    return rows


def _meta(route, step: int, extra: dict | None) -> dict:
    # The optimizer's state lives in the store (its in-memory state is empty): only the groups are used.
    _, groups = route.optimizer._packed_groups()
    meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "step": step, "extra": extra or {},
                            "optimizer": {"class": type(route.optimizer).__name__, "param_groups": _jsonable(groups),
                                          "scalar_state": {}}}
    if route.scheduler is not None:
        meta["scheduler"] = {"class": type(route.scheduler).__name__,
                             "state": _jsonable(route.scheduler.state_dict())}
    # As JSON (MT19937, Philox and SFC64 keep arrays in their states), and as save_checkpoint writes them.
    meta["rng"] = {name: rng_state(g) for name, g in _generators(route.model).items()}
    meta["rng_default"] = rng_state(peek_default_generator())
    return meta


def save_streaming_checkpoint(route, path: str | os.PathLike, *, step: int, extra: dict | None = None) -> None:
    """Write the run's checkpoint from the store, one stage in memory at a time, atomically.

    Refused (StoreError) while a failed step left the store half-written: the file would mix two steps.
    """
    pending = route._pending_commit
    route._check_usable()  # commits a step whose commit failed first (or says why it cannot)
    if pending is not None and step == pending[0] - 1:
        # The caller counted that step as not taken (it raised: Trainer's count stays behind), but every stage
        # holds it, and now the manifest too: the file must say the step its data is.
        step = pending[0]
    store = route.store
    store.drain()
    rows = _entries(route)
    # Shapes and dtypes come from the store's layout, so nothing needs loading to write the header.
    header: dict[str, Any] = {}
    offset = 0
    for k, name, what, key in rows:
        if what == "memory":
            shape, dtype = tuple(_in_memory(key).shape), _in_memory(key).dtype
        elif what == "scalar":
            shape, dtype = (), np.dtype(np.float64)
        else:
            spec = store.layouts[k].stage.params[key if what == "param" else key[0]]
            shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"{name} is {dtype}, which the streaming checkpoint writer does not handle "
                             f"({sorted(map(str, DTYPES))}); bring the run into memory (trainer.stream.to_memory()) "
                             f"and save there")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    # The checksums are known once the data is written: reserve their entry (all zeros, the same width) and
    # fill it in at the end. The metadata JSON's last key, it ends the header's last string, just before `}"}}`
    # (the metadata's closing brace, the string's quote, then __metadata__'s and the header's braces).
    meta = _meta(route, step, extra)
    meta[CHECKSUM_KEY] = checksums_entry(dict.fromkeys((name for _, name, _, _ in rows), 0))
    header["__metadata__"] = {"tensorarena": json.dumps(meta)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    escaped = _in_header(meta[CHECKSUM_KEY])
    at = len(raw) - len(b'}"}}') - len(escaped)
    assert raw[at:at + len(escaped)] == escaped
    raw += b" " * (-len(raw) % 8)

    def write(f) -> None:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        crcs: dict[str, int] = {}
        loaded = views = array = None
        for k, name, what, key in rows:
            if what == "memory":
                array = np.ascontiguousarray(_in_memory(key))
                crcs[name] = _write(f, array)
                continue
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
            crcs[name] = _write(f, array)
        filled = _in_header(checksums_entry(crcs))
        assert len(filled) == len(escaped)  # hex digits need no escaping: the same width as the zeros
        end = f.tell()
        f.seek(8 + at)
        f.write(filled)
        f.seek(end)

    _atomic_write(Path(path), write)


def _in_header(entry: dict) -> bytes:
    """`entry` as the header holds it: JSON inside the metadata's JSON, then escaped as a string in the header
    (escaping goes character by character, so a part escapes as it does within the whole)."""
    return json.dumps(json.dumps(entry))[1:-1].encode()


def _write(f, array: np.ndarray) -> int:
    """Write `array`'s bytes to `f`; returns their CRC32, computed over the same bytes (no extra copy)."""
    data = raw_bytes(array)
    f.write(data)
    return zlib.crc32(data)


def verify_checkpoint_file(file: TensorFile) -> None:
    """The open checkpoint's data against its checksums (CheckpointCorruptError naming the tensor), read in
    chunks: for a caller that must refuse a corrupt file before it does anything else (the Trainer, before
    starting the route whose store it would fill), and then loads it through the same open file."""
    verify_file(file, saved_checksums(file.path, metadata_of(file.path, file.metadata), file.keys()))


def load_into_streaming(route, source: str | os.PathLike | TensorFile, *, verified: bool = False) -> dict:
    """Fill the route's store from a checkpoint of any route, stage by stage; returns its metadata.

    As `load_checkpoint` on the eager route: parameters, optimizer state (a parameter without state in the
    file has none after: the fill values of its group, step 0), hyperparameters, schedule, RNG and step
    count. Everything that can be checked without writing is checked first (a failure then changes
    nothing); the stage writes are journaled (ParamStore.begin_rewrite), so a load interrupted half-way
    leaves a store that refuses to open and a route that refuses to train until a load completes. A
    completed load also recovers a route a failed step left half-written.

    `source`: the checkpoint's path, or the checkpoint open already (checkpoint.open_checkpoint, held by a
    caller that checked it first). Everything, the metadata to the last tensor, is read through that one open
    file: reopened by path, a save renaming a new checkpoint over it meanwhile was mixed in. `verified`: the
    caller ran verify_checkpoint_file on this open file already.
    """
    route._check_open()
    route._check_stages()  # a replaced module: the file would go into the old stages, not the model's
    if isinstance(source, TensorFile):
        return _load_file(route, source, verified)
    path = Path(source)
    with open_checkpoint(path, path_identity(path)) as file:
        return _load_file(route, file, verified=False)  # (opened here: no caller can have verified it)


def _load_file(route, file: TensorFile, verified: bool) -> dict:
    """load_into_streaming's work, from the open checkpoint `file`."""
    path = file.path
    meta = metadata_of(path, file.metadata)
    saved = meta.get("optimizer")
    if saved is None:
        raise ValueError(f"{path} holds no optimizer state, which the streaming store needs")
    optimizer = route.optimizer
    if saved["class"] != type(optimizer).__name__:
        raise ValueError(f"{path} holds {saved['class']} state but the optimizer is {type(optimizer).__name__}")
    problem = generator_states_problem(route.model, meta.get("rng", {}))
    if problem:  # found before the store is rewritten, not when the generators are set after it
        raise ValueError(f"{path} {problem}")
    groups = _loaded_groups(optimizer, saved["param_groups"], path)
    index = _saved_index(optimizer, saved["param_groups"])
    store = route.store
    store.drain()
    names = set(file.keys())
    outside = _outside_stages(route)
    _check_arrays(route, file, names, index, path, outside)
    # Verified before the store is laid out again or rewritten: a corrupt file changes nothing.
    if not verified:  # (verify_checkpoint_file did it already: one read of the file is enough)
        verify_file(file, saved_checksums(path, meta, names))
    # The checkpoint's settings may need state kinds the store lacks (momentum on): lay it out first.
    group_of = group_map(route)
    grow_state_kinds(route, optim_state.state_kinds(optimizer, groups), groups, group_of)
    token = store.begin_rewrite(f"loading the checkpoint {path}")
    try:
        for k, (stage, param_names) in enumerate(zip(route.stages, route._names)):
            store.read(k, 0).result()
            views = store.views(0, k)
            # TensorFile reads each tensor into an array of its own, freed after its copy: no map of the file
            # whose touched pages stay in the RSS (through safe_open's one map for the whole load, resuming
            # vit-small at --memory-limit 400M peaked 460 MiB against a 243 MiB plan, + the 247 MiB file).
            for i, (p, name) in enumerate(zip(stage.params, param_names)):
                np.copyto(views.params[i], file.read(f"model.{name}"), casting="same_kind")
                gi, j = group_of.get(id(p)), index.get(id(p))
                state = {} if j is None else _saved_state(file, names, saved, j, route.kinds)
                optim_state.put_state(route.kinds, optimizer, groups[gi] if gi is not None else None,
                                      state, views.state[i], views.scalars[i])
            views = None  # io="map": the write unmaps the slot (store._release)
            store.write(k, 0, None).result()
        for key, value in outside:  # in memory: copied in place, as model.load_state_dict does
            np.copyto(_in_memory(value), file.read(f"model.{key}"), casting="same_kind")
        # The arrays read from the file are freed, but glibc keeps heap pages they took (stream/heap.py):
        # vit-small resumed at 400M ran 5 MiB above its plan with them, within 0.3% after this.
        return_freed_pages()
    except BaseException as exc:
        route._broken = (f"loading the checkpoint {path} failed ({type(exc).__name__}: {exc}) while it "
                         f"was written into the store, which now holds a mix of it and the run")
        exc.add_note(route._refusal())
        raise
    # Hyperparameters, schedule and RNG, then one commit: the store now holds `step`.
    optimizer.param_groups[:] = groups
    for p in route._staged.values():  # the checkpoint's state replaces any in memory, as on eager
        optimizer.state.pop(p, None)
    if route.scheduler is not None and "scheduler" in meta:
        route.scheduler.load_state_dict(meta["scheduler"]["state"])
    restore_generators(route.model, meta.get("rng", {}), meta.get("rng_default"))
    step = int(meta["step"])
    route.step_count = step
    route._group_of = group_of
    store.commit(param_groups_of=route._groups_of_params(), rewrite=token, **route._progress(step, step))
    store.end_rewrite()
    route._broken = None  # every stage holds the checkpoint now: whatever failed before is overwritten
    route._pending_commit = None  # and a step whose commit failed is superseded by it
    return meta


def _loaded_groups(optimizer, saved_groups: list[dict], path) -> list[dict]:
    """The optimizer's groups with the checkpoint's hyperparameters (new dicts, same parameter lists),
    checked as Optimizer.load_state_dict checks them; a ValueError before anything changed."""
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"{path} holds {len(saved_groups)} parameter groups but the optimizer has "
                         f"{len(optimizer.param_groups)}{GROUPS_HINT}")
    groups = []
    for gi, (saved, group) in enumerate(zip(saved_groups, optimizer.param_groups)):
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(f"parameter group {gi} of {path} has {len(saved['params'])} parameters but the "
                             f"optimizer's group {gi} has {len(group['params'])}{PARAMS_HINT}")
        merged = dict(group)
        merged.update(optimizer._saved_hyperparams(saved))
        optimizer._check_hyperparams(merged)
        groups.append(merged)
    return groups


def _saved_index(optimizer, saved_groups: list[dict]) -> dict[int, int]:
    """id(param) -> its index in the checkpoint's optimizer state (the saved groups' "params", by position)."""
    return {id(p): int(j) for saved, group in zip(saved_groups, optimizer.param_groups)
            for j, p in zip(saved["params"], group["params"])}


def _check_arrays(route, f: TensorFile, names: set[str], index: dict[int, int], path,
                  outside: list[tuple[str, Any]]) -> None:
    """Every streamed parameter in the file, it and its optimizer state arrays with its shape, and the state
    outside every stage (`outside`) with its shape (read from the header, no data loaded)."""
    missing, wrong = [], []
    state_keys: dict[int, list[str]] = {}
    for name in names:
        if name.startswith("optim."):
            state_keys.setdefault(int(name.split(".")[1]), []).append(name)

    def check(key: str, shape: tuple) -> None:
        got = f.shape(key)
        if got != shape:
            wrong.append(f"{key} has shape {got} but the model needs {shape}")

    for stage, param_names in zip(route.stages, route._names):
        for p, name in zip(stage.params, param_names):
            key = f"model.{name}"
            if key not in names:
                missing.append(key)
                continue
            check(key, tuple(p.shape))
            for state_key in state_keys.get(index.get(id(p), -1), []):
                if f.shape(state_key):  # a 0-d entry is a scalar (step, ...)
                    check(state_key, tuple(p.shape))
    for key, value in outside:
        if f"model.{key}" not in names:
            missing.append(f"model.{key}")
        else:
            check(f"model.{key}", tuple(_in_memory(value).shape))
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} parameters this model needs, e.g. {missing[:4]}")
    if wrong:
        raise ValueError(f"{path}: " + "; ".join(wrong[:4]))


def _saved_state(f: TensorFile, names: set[str], saved: dict, j: int, kinds) -> dict[str, Any]:
    """Parameter j's optimizer state in the checkpoint (tensors and JSON scalars), the store's kinds only."""
    state: dict[str, Any] = dict(saved.get("scalar_state", {}).get(str(j), {}))
    for kind in (*kinds.arrays, *kinds.scalars):
        if f"optim.{j}.{kind}" in names:
            state[kind] = f.read(f"optim.{j}.{kind}")
    return {k: v for k, v in state.items() if k in kinds.arrays or k in kinds.scalars}
