"""Checkpoint integrity: every tensor of a checkpoint carries a CRC32, checked before anything is loaded.

The safetensors format has no checksum, so a flipped byte in a tensor's data loaded silently. Now each save (the
eager/fused writer in train/checkpoint.py and the stage-by-stage streaming writer in stream/checkpoint.py) stores a
CRC32 of every tensor's bytes in the file's metadata (key "crc32" of its JSON), and each load (eager, fused,
streaming) verifies them before the model, optimizer, schedule or store changes: a mismatch is a ValueError naming
the file and the tensor and saying the file is corrupt. A checkpoint written before checksums existed still loads,
with one logged info line saying it was not verified.

17 of its 21 tests fail on the base commit 3338a8d (each under a "Regression (fixed)" comment; the 21st, a fresh
streaming Trainer refusing before its route starts, was added with the fix in train/trainer.py). With this file
copied into a worktree of the base (git worktree add /tmp/base-crc 3338a8d), run in /tmp/base-crc:
`PYTHONPATH=/tmp/base-crc NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_checkpoint_integrity.py`.
"""

from __future__ import annotations

import json
import logging
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import tensorarena.train.checkpoint as ck
from tensorarena import optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.checkpoint import load_checkpoint
from tensorarena.train.trainer import Trainer

CRC_KEY = "crc32"  # in the JSON of the metadata entry "tensorarena"
ROUTES = ["eager", "fused", "streaming"]
SAVERS = ["eager", "streaming"]  # the two writers: fused saves through the eager one


def _batches(n=3, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        out.append((x, (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64)))
    return out


BATCHES = _batches()


def _trainer(route, tmp_path, tag, seed=0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=2, dim=32, depth=2, num_heads=4, dropout=0.0)
    model = ViT(cfg, rng=np.random.default_rng(seed))
    opt = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = optim.lr_scheduler.warmup_cosine(opt, warmup_steps=2, total_steps=10)
    return model, Trainer(model, opt, cross_entropy, scheduler=sched, route=route, store_dir=tmp_path / f"store-{tag}")


def _saved(route, tmp_path, steps=2):
    """A checkpoint written by `route`'s writer after `steps` steps."""
    _, t = _trainer(route, tmp_path, f"saver-{route}")
    for b in BATCHES[:steps]:
        t.step(*b)
    path = tmp_path / f"{route}.ckpt"
    t.save(path)
    return path


def _header(raw: bytes) -> tuple[dict, int]:
    """The safetensors header of a file's bytes and where its data starts."""
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), 8 + n


def _tensor_bytes(raw: bytes) -> dict[str, bytes]:
    header, start = _header(raw)
    return {name: raw[start + e["data_offsets"][0]:start + e["data_offsets"][1]]
            for name, e in header.items() if name != "__metadata__"}


def _flip_a_byte(path, key, out):
    """A copy of the checkpoint at `path` with one bit of tensor `key`'s data flipped (in its middle)."""
    raw = bytearray(path.read_bytes())
    header, start = _header(bytes(raw))
    lo, hi = header[key]["data_offsets"]
    raw[start + (lo + hi) // 2] ^= 0x01
    out.write_bytes(bytes(raw))
    return out


def _rewritten(path, out, change):
    """The checkpoint at `path` written again with `change(meta)` applied to its metadata JSON."""
    meta = ck.read_metadata(path)
    change(meta)
    save_file(load_file(str(path)), str(out), metadata={"tensorarena": json.dumps(meta)})
    return out


def _fingerprint(trainer, tmp_path):
    """Weights, optimizer state, schedule, RNGs and step as the tensors and JSON of a checkpoint of them."""
    path = tmp_path / "fingerprint.ckpt"
    trainer.save(path)
    arrays = load_file(str(path))
    meta = ck.read_metadata(path)
    path.unlink()
    return meta, arrays


def _same(a, b):
    (meta_a, arrays_a), (meta_b, arrays_b) = a, b
    assert meta_a == meta_b and arrays_a.keys() == arrays_b.keys()
    for key in arrays_a:
        np.testing.assert_array_equal(arrays_a[key], arrays_b[key], err_msg=key)


# -- saving: a CRC32 of every tensor ----------------------------------------------------------------------------

@pytest.mark.parametrize("saver", SAVERS)
def test_every_tensor_of_a_checkpoint_has_the_crc32_of_its_bytes_in_the_metadata(saver, tmp_path):
    raw = _saved(saver, tmp_path).read_bytes()
    header, _ = _header(raw)
    # Regression (fixed): no checksum at all (KeyError here): a damaged tensor could not be told from a good one.
    saved = json.loads(header["__metadata__"]["tensorarena"])[CRC_KEY]
    want = {name: f"{zlib.crc32(data):08x}" for name, data in _tensor_bytes(raw).items()}
    assert any(k.startswith("optim.") for k in want) and any(k.startswith("model.") for k in want)
    assert saved == want


@pytest.mark.parametrize("saver", SAVERS)
def test_two_saves_of_one_state_are_the_same_bytes(saver, tmp_path):
    # The checksums live inside the one "tensorarena" entry: safetensors writes two entries in random order.
    _, t = _trainer(saver, tmp_path, "t")
    t.step(*BATCHES[0])
    t.save(tmp_path / "a.ckpt")
    t.save(tmp_path / "b.ckpt")
    assert (tmp_path / "a.ckpt").read_bytes() == (tmp_path / "b.ckpt").read_bytes()


def test_the_checksum_of_an_array_is_its_bytes_crc32_computed_without_a_copy():
    big = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)  # 8 MB
    tracemalloc.start()
    try:
        # Regression (fixed): there was no checksum function (AttributeError).
        got = ck.tensor_crc32(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == zlib.crc32(big.tobytes())
    assert peak < 64 * 1024  # streamed over the array's own memory: a copy would be 8 MB
    for small in (np.float64(2.5).reshape(()), np.zeros((0, 3), np.float32), np.array([True, False])):
        assert ck.tensor_crc32(small) == zlib.crc32(small.tobytes())


# -- loading: verified before anything changes ------------------------------------------------------------------

@pytest.mark.parametrize("saver,loader", [(s, r) for s in SAVERS for r in ROUTES])
def test_a_flipped_byte_in_a_tensor_is_refused_naming_file_and_tensor_and_changes_nothing(saver, loader, tmp_path):
    good = _saved(saver, tmp_path)
    names = sorted(_tensor_bytes(good.read_bytes()))
    victims = [next(n for n in names if n.startswith("model.")), next(n for n in names if n.endswith("exp_avg_sq"))]
    model, t = _trainer(loader, tmp_path, "loader", seed=5)
    t.step(*BATCHES[0])
    before = _fingerprint(t, tmp_path)
    for i, key in enumerate(victims):
        bad = _flip_a_byte(good, key, tmp_path / f"bad{i}.ckpt")
        # Regression (fixed): the flipped byte loaded silently, into the weights or the optimizer's moments.
        with pytest.raises(ValueError, match=rf"bad{i}\.ckpt is corrupt.*{key}.*older checkpoint") as info:
            t.load(bad)
        assert type(info.value).__name__ == "CheckpointCorruptError"
        assert t.step_count == 1
        _same(_fingerprint(t, tmp_path), before)
    t.load(good)  # the intact file still loads into the same trainer, which trains on
    assert t.step_count == 2 and t.step(*BATCHES[2]).step == 3


# Regression (fixed): a streaming Trainer that had not stepped yet started its route (moving the whole state into a
# new store) before load_into_streaming found the corruption; the file is now verified first.
def test_a_corrupt_file_does_not_start_the_streaming_route_of_a_fresh_trainer(tmp_path):
    good = _saved("eager", tmp_path)
    key = next(n for n in sorted(_tensor_bytes(good.read_bytes())) if n.startswith("model."))
    bad = _flip_a_byte(good, key, tmp_path / "bad.ckpt")
    model, t = _trainer("streaming", tmp_path, "fresh", seed=5)
    before = {k: p.data.copy() for k, p in model.named_parameters()}
    with pytest.raises(ValueError, match=r"bad\.ckpt is corrupt"):
        t.load(bad)
    store = tmp_path / "store-fresh"  # (the Trainer checks the directory at construction: it may exist, empty)
    assert t.stream is None and not (store.exists() and any(store.iterdir()))  # no route, nothing in a store
    for k, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, before[k], err_msg=k)
    t.load(good)
    assert t.stream is not None and t.step_count == 2


def test_load_checkpoint_refuses_a_flipped_byte_before_the_model_changes(tmp_path):
    good = _saved("eager", tmp_path)
    bad = _flip_a_byte(good, "model.head.weight", tmp_path / "bad.ckpt")
    model, _ = _trainer("eager", tmp_path, "plain", seed=5)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    # Regression (fixed): loaded without a word.
    with pytest.raises(ValueError, match=r"bad\.ckpt is corrupt: .*'model\.head\.weight'"):
        load_checkpoint(bad, model=model)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


@pytest.mark.parametrize("damage", ["a tensor without a checksum", "not a dict", "not a checksum"])
def test_damaged_checksums_in_the_metadata_are_refused_as_a_corrupt_file(damage, tmp_path):
    good = _saved("eager", tmp_path)

    def change(meta):
        if damage == "a tensor without a checksum":
            del meta[CRC_KEY]["model.head.bias"]
        elif damage == "not a dict":
            meta[CRC_KEY] = list(meta[CRC_KEY].values())
        else:
            meta[CRC_KEY]["model.head.bias"] = "zz"

    bad = _rewritten(good, tmp_path / "bad.ckpt", change)
    for route in ("eager", "streaming"):
        _, t = _trainer(route, tmp_path, f"t-{route}", seed=5)
        # Regression (fixed): the damaged checksums were not read at all (KeyError building the file here).
        with pytest.raises(ValueError, match=r"bad\.ckpt is corrupt") as info:
            t.load(bad)
        assert type(info.value).__name__ == "CheckpointCorruptError"
        if damage == "a tensor without a checksum":
            assert "model.head.bias" in str(info.value)
        assert t.step_count == 0


# -- checkpoints written before checksums ---------------------------------------------------------------------

@pytest.mark.parametrize("loader", ROUTES)
def test_a_checkpoint_from_before_checksums_loads_with_one_info_line(loader, tmp_path, caplog):
    good = _saved("eager", tmp_path)
    old = _rewritten(good, tmp_path / "old.ckpt", lambda meta: meta.pop(CRC_KEY, None))
    _, want = _trainer(loader, tmp_path, "want", seed=5)
    want.load(good)
    _, t = _trainer(loader, tmp_path, "old", seed=5)
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        t.load(old)
    lines = [r for r in caplog.records if "not verified" in r.getMessage()]
    # Regression (fixed): nothing said that this file's data went unchecked.
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "old.ckpt" in lines[0].getMessage()
    assert t.step_count == 2
    _same(_fingerprint(t, tmp_path), _fingerprint(want, tmp_path))


@pytest.mark.parametrize("loader", ["eager", "streaming"])
def test_a_checkpoint_with_checksums_loads_without_the_unverified_line(loader, tmp_path, caplog):
    good = _saved("streaming", tmp_path)
    _, t = _trainer(loader, tmp_path, "t", seed=5)
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        t.load(good)
    assert t.step_count == 2
    assert [r.getMessage() for r in caplog.records if "not verified" in r.getMessage()] == []
