"""Checkpoints: one safetensors file holding arrays plus JSON metadata, written atomically.

Layout of the file's tensors: `model.<dotted param name>` and
`optim.<param index>.<state key>`; everything else (step count, optimizer
hyperparameters and scalar state, schedule position, RNG states, user extras)
is JSON in the safetensors header metadata under "tensorarena". Writing goes
to a temporary file in the same directory, is fsynced, then renamed over the
target, so a crash leaves either the old checkpoint or the new one, never half.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
from safetensors.numpy import load_file, save

from ..nn.module import Module

FORMAT = "tensorarena-checkpoint"
VERSION = 1


def _generators(model: Module) -> dict[str, np.random.Generator]:
    """Every np.random.Generator a module holds (dropout masks), by dotted path."""
    found = {}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, np.random.Generator):
                found[f"{name}.{attr}" if name else attr] = value
    return found


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def save_checkpoint(path: str | os.PathLike, *, model: Module, optimizer=None, scheduler=None, step: int = 0,
                    extra: dict | None = None) -> None:
    """Write a checkpoint of model (+ optimizer, scheduler, RNGs, step) to `path` atomically."""
    from ..random import peek_default_generator

    tensors: dict[str, np.ndarray] = {}
    for name, array in model.state_dict().items():
        tensors[f"model.{name}"] = np.ascontiguousarray(array)
    meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "step": step, "extra": extra or {}}
    if optimizer is not None:
        state = optimizer.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for index, entry in state["state"].items():
            for key, value in entry.items():
                if isinstance(value, np.ndarray):
                    # ascontiguousarray alone would turn a 0-d step count into shape (1,)
                    tensors[f"optim.{index}.{key}"] = np.ascontiguousarray(value).reshape(value.shape)
                else:
                    scalars.setdefault(str(index), {})[key] = _jsonable(value)
        meta["optimizer"] = {"class": type(optimizer).__name__, "param_groups": _jsonable(state["param_groups"]),
                             "scalar_state": scalars}
    if scheduler is not None:
        meta["scheduler"] = {"class": type(scheduler).__name__, "state": _jsonable(scheduler.state_dict())}
    meta["rng"] = {name: g.bit_generator.state for name, g in _generators(model).items()}
    meta["rng_default"] = peek_default_generator().bit_generator.state
    payload = save(tensors, metadata={"tensorarena": json.dumps(meta)})
    _atomic_write(Path(path), payload)


def _atomic_write(path: Path, payload: bytes | Callable[[BinaryIO], None]) -> None:
    """Write `payload` (bytes, or a function writing into the open file) to `path` atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if callable(payload):
                payload(f)
            else:
                f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def read_metadata(path: str | os.PathLike) -> dict:
    """The JSON metadata of a checkpoint, without loading its arrays."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        raw = (f.metadata() or {}).get("tensorarena")
    if raw is None:
        raise ValueError(f"{path} is a safetensors file but not a tensorarena checkpoint (no 'tensorarena' metadata)")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path}: unsupported checkpoint format {meta.get('format')} v{meta.get('version')}")
    return meta


def load_checkpoint(path: str | os.PathLike, *, model: Module, optimizer=None, scheduler=None) -> dict:
    """Restore what `save_checkpoint` wrote into existing objects; returns the metadata."""
    from ..random import peek_default_generator

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    meta = read_metadata(path)
    arrays = load_file(str(path))
    model.load_state_dict({k[len("model."):]: v for k, v in arrays.items() if k.startswith("model.")})
    if optimizer is not None:
        if "optimizer" not in meta:
            raise ValueError(f"{path} holds no optimizer state; pass optimizer=None to load the model only")
        saved = meta["optimizer"]
        if saved["class"] != type(optimizer).__name__:
            raise ValueError(f"{path} holds {saved['class']} state but the optimizer is {type(optimizer).__name__}")
        state: dict[int, dict[str, Any]] = {}
        for key, value in arrays.items():
            if key.startswith("optim."):
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = value
        for index, entries in saved["scalar_state"].items():
            state.setdefault(int(index), {}).update(entries)
        optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
    if scheduler is not None:
        if "scheduler" not in meta:
            raise ValueError(f"{path} holds no scheduler state; pass scheduler=None")
        scheduler.load_state_dict(meta["scheduler"]["state"])
    generators = _generators(model)
    for name, state in meta.get("rng", {}).items():
        if name in generators:
            generators[name].bit_generator.state = state
    if "rng_default" in meta:
        peek_default_generator().bit_generator.state = meta["rng_default"]
    return meta
