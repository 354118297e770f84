"""Checkpoints: one safetensors file holding arrays plus JSON metadata, written atomically.

Layout of the file's tensors: `model.<dotted param name>` and
`optim.<param index>.<state key>`; everything else (step count, optimizer
hyperparameters and scalar state, schedule position, RNG states, user extras)
is JSON in the safetensors header metadata under "tensorarena". Writing goes
to a temporary file in the same directory, is fsynced, then renamed over the
target, so a crash leaves either the old checkpoint or the new one, never half.

safetensors has no checksum, so the metadata JSON also holds, under "crc32" (its last key), every tensor's
name -> the CRC32 of its bytes in the file (8 hex digits). A load verifies them before anything changes; a
file without them (written before they existed) loads unverified, saying so in one info line. (Inside the one
"tensorarena" entry, not an entry of its own: safetensors writes its metadata entries in random order, and a
checkpoint of the same state must be the same bytes.)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from ..nn.module import Module
from ..optim.optimizer import GROUPS_HINT, PARAMS_HINT
from ..random import rng_state
from ..tensor import Tensor
from .safetensors_io import raw_bytes, tensor_entries, write_safetensors
from .tensor_file import TensorFile, file_identity

FORMAT = "tensorarena-checkpoint"
VERSION = 1
CHECKSUM_KEY = "crc32"  # in the metadata JSON: files without it still read as VERSION 1, unverified

log = logging.getLogger(__name__)


class CheckpointCorruptError(ValueError):
    """A checkpoint whose data does not match the checksums saved with it: damaged after it was written."""


class CheckpointReplacedError(ValueError):
    """The file at a checkpoint's path is not the one a load checked: a save renamed a new checkpoint over it (or
    it was rewritten) between the check and the reads. Nothing was loaded; loading again reads the new file."""


def _replaced(path, since: str = "while it was being loaded") -> CheckpointReplacedError:
    return CheckpointReplacedError(f"{path} was replaced {since} (a save renamed a new checkpoint over it, or it "
                                   f"was rewritten): the file checked is not the file there now, and nothing was "
                                   f"loaded. Load it again")


def path_identity(path) -> tuple[int, int, int, int] | None:
    """file_identity of the file at `path` now (a symbolic link followed, as open does); None if there is none."""
    try:
        return file_identity(os.stat(path))
    except OSError:
        return None


def open_checkpoint(path: Path, identity: tuple[int, int, int, int] | None) -> TensorFile:
    """The checkpoint at `path` open for reading, refused (CheckpointReplacedError) unless it is the file of
    `identity` (path_identity's, taken before the file was checked by path). A load then reads everything it
    loads through this one open file: a save renaming a new checkpoint over the path meanwhile is not mixed in,
    and one that landed since the check is not read as the file checked (nor called corrupt)."""
    try:
        file = TensorFile(path)
    except (OSError, ValueError) as err:
        if path_identity(path) != identity:
            raise _replaced(path) from err
        _check_is_file(path)  # missing, or a directory: said as read_metadata says it
        if isinstance(err, OSError):
            raise
        raise (_foreign_file(path) or _unreadable(path, err)) from err
    if file.identity != identity:
        file.close()
        raise _replaced(path)
    return file


def tensor_crc32(array: np.ndarray) -> int:
    """CRC32 of `array`'s bytes as safetensors stores them (C order, little-endian), read in place: no copy of
    the array unless it is not C-contiguous little-endian already (tiny 0-d and empty arrays are copied)."""
    return zlib.crc32(raw_bytes(array))


def checksums_entry(crcs: dict[str, int]) -> dict[str, str]:
    """The metadata's CHECKSUM_KEY entry: name -> CRC32 as 8 hex digits (fixed width, so a writer that must
    write the header before the data can reserve it and fill it in after)."""
    return {name: f"{crc:08x}" for name, crc in crcs.items()}


def _corrupt(path, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"{path} is corrupt: {what}. The file was damaged after it was written (disk, "
                                  f"copy or transfer); nothing was loaded. Restore from an older checkpoint")


def saved_checksums(path, meta: dict, names) -> dict[str, int] | None:
    """The checksums in a file's metadata (`meta`, as read_metadata gives it), one for each tensor in `names`;
    None for a file written before checksums (logged once, as unverified). Unreadable checksums, or a tensor
    without one, are corruption."""
    sums = meta.get(CHECKSUM_KEY)
    if sums is None:
        log.info("%s has no checksums (written before tensorarena stored them): its data is not verified", path)
        return None
    try:
        crcs = {name: int(value, 16) for name, value in sums.items() if len(value) == 8}
    except (ValueError, TypeError, AttributeError) as err:
        raise _corrupt(path, f"its checksums cannot be read ({type(err).__name__}: {err})") from err
    if len(crcs) != len(sums):
        raise _corrupt(path, "its checksums cannot be read (not all are 8 hex digits)")
    names = set(names)
    missing, extra = sorted(names - set(crcs)), sorted(set(crcs) - names)
    if missing:
        raise _corrupt(path, f"its checksums do not cover the tensors it holds (none for {missing[:4]})")
    if extra:
        raise _corrupt(path, f"its checksums name tensors it does not hold ({extra[:4]})")
    return crcs


def verify_file(file: TensorFile, crcs: dict[str, int] | None) -> None:
    """Every tensor of the open checkpoint `file` against `crcs` (None: a file from before checksums, logged as
    unverified already), read through a bounded buffer; CheckpointCorruptError naming the first that differs."""
    if crcs is None:
        return
    for name in file.keys():
        try:
            crc = file.crc32(name)
        except ValueError:
            raise _corrupt(file.path, f"the data of tensor {name!r} is cut short") from None
        if crc != crcs[name]:
            raise _corrupt(file.path, f"the data of tensor {name!r} does not match the CRC32 saved with it")


def _generators(model: Module) -> dict[str, np.random.Generator]:
    """Every np.random.Generator a module holds (dropout masks), by dotted path."""
    found = {}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, np.random.Generator):
                found[f"{name}.{attr}" if name else attr] = value
    return found


def json_extra(value: Any, where: str = "extra") -> Any:
    """`extra` as JSON that loads back equal: NumPy scalars and arrays become numbers and lists (lossless); a
    key that is not a str (JSON would hand it back as one) or a value JSON has no form for is a TypeError
    naming where it is, before anything is written."""
    if where == "extra" and not isinstance(value, dict):
        raise TypeError(f"extra must be a dict (JSON: str keys; numbers, strings, bools, None, lists, dicts), "
                        f"got a {type(value).__name__}")
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{where}[{key!r}]: keys must be str (a JSON object's keys come back as strings); "
                                f"convert it, e.g. str({key!r})")
        return {key: json_extra(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):  # a tuple comes back as a list: JSON has one sequence
        return [json_extra(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, (np.generic, np.ndarray)):
        return json_extra(value.tolist(), where)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise TypeError(f"{where} is a {type(value).__name__}, which a checkpoint's JSON metadata cannot hold; keep "
                    f"numbers, strings, bools, None, lists and dicts in extra (arrays: save them in the model "
                    f"as buffers, or in a file of their own)")


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

    path = Path(path)
    check_target(path)  # before the file is built: a path that cannot take it says so at once
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be an integer >= 0 (the steps taken so far), got {step!r}")
    step = int(step)  # a NumPy integer (a loop counter from np.arange) is no JSON number
    meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "step": step, "extra": json_extra(extra or {})}
    tensors: dict[str, np.ndarray] = {}
    # The arrays themselves, not state_dict()'s copies: the file is written from them before anything can
    # change them (a save runs between steps), and a copy of every weight was a peak no plan counted.
    for name, value in model.state_dict(keep_vars=True).items():
        tensors[f"model.{name}"] = np.asarray(value.data if isinstance(value, Tensor) else value)
    if optimizer is not None:
        state = optimizer.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for index, entry in state["state"].items():
            for key, value in entry.items():
                if isinstance(value, np.ndarray):
                    tensors[f"optim.{index}.{key}"] = value  # written as it is (raw_bytes: C order, no copy)
                else:
                    scalars.setdefault(str(index), {})[key] = _jsonable(value)
        meta["optimizer"] = {"class": type(optimizer).__name__, "param_groups": _jsonable(state["param_groups"]),
                             "scalar_state": scalars}
    if scheduler is not None:
        meta["scheduler"] = {"class": type(scheduler).__name__, "state": _jsonable(scheduler.state_dict())}
    meta["rng"] = {name: rng_state(g) for name, g in _generators(model).items()}
    meta["rng_default"] = rng_state(peek_default_generator())
    # An array the format cannot hold is refused, naming it, before the file is opened, and before its CRC: the
    # CRC reads it through a memoryview, which NumPy refuses for longdouble or datetime64 without naming it.
    tensor_entries(tensors)
    meta[CHECKSUM_KEY] = checksums_entry({name: tensor_crc32(array) for name, array in tensors.items()})
    metadata = {"tensorarena": json.dumps(meta)}
    # Array by array from memory to the file: safetensors' save() built the whole file as one bytes object (with
    # a bytes copy of every tensor on the way), a peak of two or three copies of the state that no plan counts.
    _atomic_write(path, lambda f: write_safetensors(f, tensors, metadata))


def check_target(path: Path) -> None:
    """Refuse, before anything is built or written, a checkpoint path that cannot be a file: a directory, or a
    path under a file, or one that exists but is no regular file (a device, a pipe, a socket): a save writes a
    new file and renames it over the path, which would replace /dev/null itself. A symbolic link is followed,
    as open() would: the file it points to is written and the link kept (_atomic_write).
    (A missing directory is created by the write, as the docstring of save says.)"""
    real = Path(os.path.realpath(path))
    if real.exists() and not real.is_file() and not real.is_dir():
        raise OSError(errno.EINVAL, f"cannot save the checkpoint: {path} is not a regular file (a device, pipe or "
                                    f"socket), and a save replaces the file whole; pass a path to a file")
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"cannot save the checkpoint: {path} is a directory; pass a file "
                                              f"path such as {path / 'checkpoint.safetensors'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"cannot save the checkpoint {path}: {parent} is a file, "
                                                        f"not a directory; pass a path in a directory")
            break


def _write_error(exc: OSError, path: Path) -> OSError:
    """`exc` again (same class and errno, so callers can still tell a full disk), saying which checkpoint could
    not be written and that the one there before is untouched: the OS names only the hidden temporary file."""
    what = exc.strerror or str(exc)
    message = (f"cannot save the checkpoint {path}: {what}. The file there before (if any) is unchanged; pass a "
               f"path in a writable directory with room for the checkpoint")
    return type(exc)(exc.errno, message) if exc.errno is not None else type(exc)(message)


def _atomic_write(path: Path, payload: bytes | Callable[[BinaryIO], None]) -> None:
    """Write `payload` (bytes, or a function writing into the open file) to `path` atomically and durably.

    Missing directories are created. An OSError (no permission, a full disk, a write failing half-way) leaves
    the file at `path` as it was and no temporary file behind, and names `path`."""
    check_target(path)
    # Through a symbolic link: renaming over the link itself would replace it and leave its target unwritten.
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    # pid and thread: two trainers of one process saving to one path must not share a temporary file.
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(tmp, "wb") as f:
                if callable(payload):
                    payload(f)
                else:
                    f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise _write_error(exc, path) from exc
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _unreadable(path, err: Exception) -> ValueError:
    return ValueError(f"{path} is not a readable tensorarena checkpoint ({type(err).__name__}: {err}); it may be "
                      f"truncated, corrupt or still being written. Load an earlier checkpoint")


# torch.save's format before PyTorch 1.6: a pickle (protocol 2) whose first object is this magic number.
_TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_PLAIN_SAFETENSORS_HINT = ("plain weights such as Hugging Face's load into a model with "
                           "model.load_state_dict(tensorarena.train.safetensors_io.read_safetensors(path)); "
                           "Trainer.load takes the checkpoints Trainer.save writes")


def _foreign_file(path: Path, expected: str = "the file Trainer.save wrote") -> ValueError | None:
    """The refusal of a whole file of another kind that safetensors could not read (a PyTorch file, a zip), or
    None: _unreadable's "truncated ... load an earlier checkpoint" is false advice for a file that is whole.
    `expected` names the file the caller reads (ta.load reads what ta.save wrote)."""
    import zipfile

    try:
        with open(path, "rb") as f:
            head = f.read(len(_TORCH_LEGACY_MAGIC))
    except OSError:
        return None
    torch_file = head == _TORCH_LEGACY_MAGIC
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:  # torch.save (PyTorch >= 1.6): <name>/data.pkl and the storages
                torch_file = any(name.rsplit("/", 1)[-1] == "data.pkl" for name in archive.namelist())
        except (OSError, zipfile.BadZipFile):
            return None  # a zip cut short is a damaged file: _unreadable's advice fits it
        if not torch_file:
            return ValueError(f"{path} is a zip archive, not a tensorarena checkpoint (a safetensors file); nothing "
                              f"was loaded. Pass {expected}")
    if not torch_file:
        return None
    return ValueError(f"{path} is a PyTorch file (torch.save), not a tensorarena checkpoint (a safetensors file); "
                      f"nothing was loaded. Load its weights with model.load_state_dict({{k: v.numpy() for k, v in "
                      f"torch.load(path).items()}}), or convert it to safetensors (safetensors.torch.save_file)")


def _check_is_file(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, f"no checkpoint at {path}", str(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"{path} is a directory, not a checkpoint file; pass the file "
                                              f"Trainer.save wrote", str(path))


def _open(path: Path):
    """safe_open of `path`, its errors naming the file: missing, a directory, or not a whole safetensors file."""
    from safetensors import safe_open

    _check_is_file(path)
    try:
        return safe_open(str(path), framework="numpy")
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors' SafetensorError for a file cut short or overwritten
        raise (_foreign_file(path) or _unreadable(path, err)) from err


def read_metadata(path: str | os.PathLike) -> dict:
    """The JSON metadata of a checkpoint, without loading its arrays."""
    path = Path(path)
    with _open(path) as f:
        return metadata_of(path, f.metadata())


def metadata_of(path, metadata: dict[str, str] | None) -> dict:
    """The checkpoint metadata in a safetensors header's `metadata` (of the file at `path`), checked as
    read_metadata checks it: for a reader that holds the file open already (TensorFile.metadata)."""
    raw = (metadata or {}).get("tensorarena")
    if raw is None:
        raise ValueError(f"{path} is a safetensors file but not a tensorarena checkpoint (no 'tensorarena' "
                         f"metadata); {_PLAIN_SAFETENSORS_HINT}")
    try:
        meta = json.loads(raw)
    except ValueError as err:
        raise _unreadable(path, err) from err
    version = meta.get("version") if isinstance(meta, dict) else None
    newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
    if newer and meta.get("format") == FORMAT:
        raise ValueError(f"{path} was written by a newer tensorarena (checkpoint format v{version}; this one reads "
                         f"v{VERSION}); nothing was loaded. Upgrade tensorarena to load it")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or version != VERSION:
        found = (meta.get("format"), meta.get("version")) if isinstance(meta, dict) else (type(meta).__name__, "?")
        raise ValueError(f"{path}: unsupported checkpoint format {found[0]} v{found[1]}")
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise _unreadable(path, ValueError(f"its step count is {step!r}, not an integer >= 0"))
    return meta


def _shape_problems(path: Path, f, names: set[str], model: Module) -> list[str]:
    """What of the model's state the file lacks, has too much of, or has in another shape or an uncastable
    dtype (read from the header: no array loaded)."""
    problems, expected = [], set()
    for key, value in model.state_dict(keep_vars=True).items():
        name = f"model.{key}"
        expected.add(name)
        if name not in names:
            problems.append(f"{key}: missing from the checkpoint")
            continue
        # shape and dtype, not .data: a streamed parameter's data lives in the store and must not be read.
        array = value if isinstance(value, Tensor) else np.asarray(value)
        saved = f.get_slice(name)
        shape, want = tuple(saved.get_shape()), tuple(array.shape)
        if shape != want:
            problems.append(f"{key}: the checkpoint has shape {shape}, the model {want}")
            continue
        dtype = _SAFETENSORS_DTYPES.get(saved.get_dtype())
        if dtype is not None and not np.can_cast(dtype, array.dtype, casting="same_kind"):
            problems.append(f"{key}: the checkpoint's {dtype} cannot be cast to the model's {array.dtype}")
    problems.extend(f"{name[len('model.'):]}: in the checkpoint, not in the model"
                    for name in sorted(names - expected) if name.startswith("model."))
    return problems


_SAFETENSORS_DTYPES = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
                       "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
                       "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_)}


def _optimizer_problems(path: Path, f, names: set[str], meta: dict, optimizer) -> None:
    """Refuse (ValueError naming the file) optimizer state this optimizer cannot take, before anything loads:
    another class, other groups, a state array of another shape than its parameter, bad hyperparameters."""
    saved = meta.get("optimizer")
    if saved is None:
        raise ValueError(f"{path} holds no optimizer state; load the model alone with "
                         f"tensorarena.train.checkpoint.load_checkpoint(path, model=model)")
    if saved.get("class") != type(optimizer).__name__:
        raise ValueError(f"{path} holds {saved.get('class')} state but the optimizer is {type(optimizer).__name__}. "
                         f"Build the optimizer as a {saved.get('class')} to resume, or load the weights alone "
                         f"(the new optimizer then starts fresh) with "
                         f"tensorarena.train.checkpoint.load_checkpoint(path, model=model)")
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        count = len(groups) if isinstance(groups, list) else groups
        raise ValueError(f"{path} holds {count} parameter groups but the optimizer has {len(optimizer.param_groups)}"
                         f"{GROUPS_HINT}")
    params: dict[int, Any] = {}
    for gi, (group_saved, group) in enumerate(zip(groups, optimizer.param_groups)):
        if len(group_saved.get("params", ())) != len(group["params"]):
            raise ValueError(f"parameter group {gi} of {path} has {len(group_saved.get('params', ()))} parameters "
                             f"but the optimizer's group {gi} has {len(group['params'])}{PARAMS_HINT}")
        merged = dict(group)
        merged.update(optimizer._saved_hyperparams(group_saved))
        try:
            optimizer._check_hyperparams(merged)
        except ValueError as err:
            raise ValueError(f"{path}: parameter group {gi}: {err}") from err
        params.update({int(j): p for j, p in zip(group_saved["params"], group["params"])})
    wrong = []
    for name in sorted(names):
        if not name.startswith("optim."):
            continue
        _, index, key = name.split(".", 2)
        p = params.get(int(index))
        shape = tuple(f.get_slice(name).get_shape())
        if p is None:
            wrong.append(f"optimizer state {key!r} of parameter {index}, which is in no parameter group")
        elif shape and shape != tuple(p.shape):  # 0-d entries are scalars (step, ...)
            wrong.append(f"optimizer state {key!r} of parameter {index}: the checkpoint has shape {shape}, the "
                         f"parameter {tuple(p.shape)}")
    if wrong:
        raise ValueError(f"{path} does not fit this optimizer: " + "; ".join(wrong[:6]))


def _scheduler_problem(saved: Any, scheduler, where: str = "") -> str | None:
    """Why `saved` (a scheduler's state_dict) cannot load into `scheduler`, or None: another class's keys, or
    a SequentialLR with other inner schedulers. Checked before anything loads; load_state_dict checks after."""
    if not isinstance(saved, dict):
        return f"its {where or 'scheduler'} state is a {type(saved).__name__}, not a dict"
    own = scheduler.state_dict()
    unknown = sorted(k for k in saved if k not in own and not k.startswith("_"))
    if unknown:
        return f"its {where or 'scheduler'} state has keys {unknown} that {type(scheduler).__name__} does not have"
    inner, mine = saved.get("_schedulers"), getattr(scheduler, "_schedulers", None)
    if mine is not None:
        if not isinstance(inner, list) or len(inner) != len(mine):
            return (f"it holds {len(inner) if isinstance(inner, list) else 'no'} inner schedulers, "
                    f"{type(scheduler).__name__} has {len(mine)}")
        for i, (state, s) in enumerate(zip(inner, mine)):
            problem = _scheduler_problem(state, s, f"inner scheduler {i} ({type(s).__name__})")
            if problem:
                return problem
    return None


def check_checkpoint(path: str | os.PathLike, *, model: Module, optimizer=None, scheduler=None) -> dict:
    """Everything about the file at `path` that can be checked against these objects without loading an array:
    it is a whole checkpoint, its parameters match the model's names, shapes and dtypes, its optimizer and
    schedule are of these classes and fit them, its generators are of the model's kinds. A ValueError naming the
    file and what does not match, before anything changed; else the metadata."""
    path = Path(path)
    meta = read_metadata(path)
    with _open(path) as f:
        names = set(f.keys())
        problems = _shape_problems(path, f, names, model)
        if problems:
            raise ValueError(f"{path} does not fit this {type(model).__name__} (another model or configuration?): "
                             + "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8
                                                          else ""))
        if optimizer is not None:
            _optimizer_problems(path, f, names, meta, optimizer)
    if scheduler is not None:
        if "scheduler" not in meta:
            raise ValueError(f"{path} holds no scheduler state; build the trainer without a scheduler (scheduler="
                             f"None) or load a checkpoint of a run that had one")
        saved = meta["scheduler"]
        if saved.get("class") != type(scheduler).__name__:
            raise ValueError(f"{path} holds a {saved.get('class')} schedule but the trainer's scheduler is "
                             f"{type(scheduler).__name__}; build the same scheduler as the saved run to resume it")
        problem = _scheduler_problem(saved.get("state"), scheduler)
        if problem:
            raise ValueError(f"{path} holds a schedule this {type(scheduler).__name__} cannot take: {problem}")
    generators = _generators(model)
    for name, state in meta.get("rng", {}).items():
        kind = state.get("bit_generator") if isinstance(state, dict) else None
        if name in generators and kind != generators[name].bit_generator.state["bit_generator"]:
            raise ValueError(f"{path} holds a {kind} state for the generator {name}, which is a "
                             f"{generators[name].bit_generator.state['bit_generator']}; build the model with the "
                             f"generator the saved run had")
    return meta


def load_checkpoint(path: str | os.PathLike, *, model: Module, optimizer=None, scheduler=None) -> dict:
    """Restore what `save_checkpoint` wrote into existing objects; returns the metadata.

    All or nothing: the file is checked against model, optimizer and scheduler (check_checkpoint) before any of
    them changes, so a load that fails leaves them as they were."""
    path = Path(path)
    identity = path_identity(path)  # before the check: the file read below must be the one checked
    meta = check_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler)
    # Tensor by tensor (tensor_file.py): the whole file in memory beside the model and its optimizer state was a
    # peak of one more checkpoint that no plan counts. Its checksums are verified first, before anything changes,
    # then each tensor is read again as it is applied (0-d ones, the step counts, at once: they are tiny).
    with open_checkpoint(path, identity) as file:
        verify_file(file, saved_checksums(path, meta, file.keys()))
        arrays = {name: file.lazy(name) if file.shape(name) else file.read(name) for name in file.keys()}
        # Casting a checkpoint to a narrower dtype (float64 -> float32) rounds tiny moments to zero, as torch's
        # .to() does: under np.seterr(under="raise") that must not fail the load half way (weights loaded, the
        # optimizer not). Overflow and invalid values still raise (the model refuses them before copying).
        with np.errstate(under="ignore"):
            _apply(path, meta, arrays, model, optimizer, scheduler)
    return meta


def _apply(path: Path, meta: dict, arrays: dict[str, Any], model: Module, optimizer, scheduler) -> None:
    """Copy a checked checkpoint's arrays (arrays, or StoredTensors read as each is used) and state into the
    objects."""
    from ..random import peek_default_generator

    # The model first: its load_state_dict is all or nothing and checks what needs the data (values beyond the
    # range of the model's dtype); what comes after was checked above and does not fail on this file.
    try:
        model.load_state_dict({k[len("model."):]: v for k, v in arrays.items() if k.startswith("model.")})
    except RuntimeError as err:
        raise ValueError(f"{path} does not fit this {type(model).__name__}: {err}") from err
    if optimizer is not None:
        saved = meta["optimizer"]
        state: dict[int, dict[str, Any]] = {}
        for key, value in arrays.items():
            if key.startswith("optim."):
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = value
        for index, entries in saved["scalar_state"].items():
            state.setdefault(int(index), {}).update(entries)
        # A parameter whose saved step is 0 took no step (a frozen one): an optimizer has no state for it yet (the
        # eager route makes it at the first update, as torch does). Only the streaming writer saves such rows: its
        # store holds state for every parameter, and the file's layout is fixed before any stage is read.
        state = {index: entries for index, entries in state.items()
                 if "step" not in entries or float(np.asarray(entries["step"])) != 0.0}
        optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
    if scheduler is not None:
        scheduler.load_state_dict(meta["scheduler"]["state"])
    generators = _generators(model)
    for name, state in meta.get("rng", {}).items():
        if name in generators:
            generators[name].bit_generator.state = state
    if "rng_default" in meta:
        peek_default_generator().bit_generator.state = meta["rng_default"]
