"""Checkpoint and store formats: damaged, foreign, raced or round-tripped files (a helper's hunt, /tmp/hunt/ckptfmt).

1. A streaming store's manifest that is valid JSON but damaged (a key name one bit off, a list) crashed the resume
   with a bare KeyError/AttributeError, and a damaged "step" failed only after the trainer's lr had been replaced.
   Now a StoreError naming the store and what to do, before anything changes.
2. A streaming load verified the file at the path, then reopened it by path for every stage: a save renaming a new
   checkpoint over the path meanwhile was mixed in. Loads now read one open file, tied to the file checked by its
   identity; a file replaced between the check and the reads is refused (CheckpointReplacedError), on the eager
   route too (where it was called corrupt), and at step 1 for a checkpoint waiting for route auto's choice.
3. save_checkpoint computed CRCs before checking dtypes: a longdouble buffer gave NumPy's bare buffer error.
4. A torch.save file was refused as "truncated ... load an earlier checkpoint"; a newer format version and plain
   safetensors weights were refused without saying what to do.
5. A round trip turned Rprop's etas/step_sizes tuples into lists (only betas was turned back).

On e4167e7 (before the fixes) 25 of this file's 27 tests fail; the two that pass are controls, that what the new
refusals of a torch.save file and of plain safetensors weights advise does load the weights:
    git worktree add /tmp/w/ckpt-base e4167e7 && cp tests/test_checkpoint_formats_hunt.py /tmp/w/ckpt-base/tests/ &&
    (cd /tmp/w/ckpt-base && PYTHONPATH=/tmp/w/ckpt-base python -m pytest -q -p no:cacheprovider \\
        tests/test_checkpoint_formats_hunt.py); git worktree remove --force /tmp/w/ckpt-base
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import tensorarena.train.checkpoint as ck
from tensorarena import nn, optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.random import peek_default_generator
from tensorarena.stream.store_files import StoreError
from tensorarena.stream.store_io import StageIO
from tensorarena.tensor import Tensor
from tensorarena.train.checkpoint import load_checkpoint, save_checkpoint
from tensorarena.train.safetensors_io import read_safetensors
from tensorarena.train.trainer import Trainer

CFG = dict(image_size=8, patch_size=4, num_classes=3, dim=8, depth=1, num_heads=2, dropout=0.0)
X = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
Y = np.arange(2) % 3


def _vit(seed: int = 0, deferred: bool = False) -> ViT:
    if deferred:
        with nn.deferred_init():
            return ViT(ViTConfig(**CFG), rng=np.random.default_rng(seed))
    return ViT(ViTConfig(**CFG), rng=np.random.default_rng(seed))


def _trainer(route: str, store, lr: float = 1e-2, seed: int = 0, make=optim.AdamW, deferred: bool = False):
    model = _vit(seed, deferred)
    return model, Trainer(model, make(model.parameters(), lr=lr), cross_entropy, route=route, store_dir=store)


def _params(model) -> dict[str, np.ndarray]:
    return {name: p.data.copy() for name, p in model.named_parameters()}


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# -- 1. a damaged store manifest or journal ---------------------------------------------------------------------------
def _edit_manifest(change):
    def damage(store):
        manifest = json.loads((store / "manifest.json").read_text())
        change(manifest)
        (store / "manifest.json").write_text(json.dumps(manifest))
    return damage


def _rename_key(key, to):
    return lambda text: text.replace(f'"{key}":', f'"{to}":', 1)


DAMAGES = {
    "step key one bit off": lambda s: (s / "manifest.json").write_text(
        _rename_key("step", "stdp")((s / "manifest.json").read_text())),
    "param_groups key one bit off": lambda s: (s / "manifest.json").write_text(
        _rename_key("param_groups", "param_grou`s")((s / "manifest.json").read_text())),
    "manifest a JSON list": lambda s: (s / "manifest.json").write_text("[]"),
    "stages null": _edit_manifest(lambda m: m.__setitem__("stages", None)),
    "stages empty": _edit_manifest(lambda m: m.__setitem__("stages", [])),
    "default generator state without its state": _edit_manifest(lambda m: m["rng_default"].pop("state")),
    "lr not a number": _edit_manifest(lambda m: m["param_groups"][0].__setitem__("lr", "0.01")),
    "journal a JSON list": lambda s: (s / "journal.json").write_text("[]"),
    "journal names stage 99": lambda s: (s / "journal.json").write_text(
        json.dumps({"step": 3, "written": [], "writing": [99]})),
}


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("store") / "base"
    _, t = _trainer("streaming", store)
    t.step(X, Y)
    t.step(X, Y)
    t.stream.close()
    return store


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_store_is_a_store_error_naming_it_and_the_resume_changes_nothing(damage, trained_store, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(trained_store, store)
    DAMAGES[damage](store)
    model, t = _trainer("streaming", store, lr=5e-3, seed=1)
    before, rng_before = _params(model), peek_default_generator().bit_generator.state
    with pytest.raises(StoreError) as info:
        t.step(X, Y)
    assert str(store) in str(info.value) and "resume from a checkpoint" in str(info.value), str(info.value)
    assert t.optimizer.param_groups[0]["lr"] == 5e-3  # not the store's 1e-2
    assert peek_default_generator().bit_generator.state == rng_before
    assert t.step_count == 0
    _same(_params(model), before)


def test_a_store_of_a_newer_format_says_to_upgrade(trained_store, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(trained_store, store)
    _edit_manifest(lambda m: m.__setitem__("version", 2))(store)
    _, t = _trainer("streaming", store, lr=5e-3)
    with pytest.raises(StoreError, match=r"written by a newer tensorarena \(store format v2; this one reads v1\): "
                                         r"upgrade tensorarena"):
        t.step(X, Y)


# -- 2. a save landing while a checkpoint loads -----------------------------------------------------------------------
@pytest.fixture
def two_checkpoints(tmp_path):
    """checkpoint A (step 1) at tmp_path/ckpt, B (step 4, the same run 3 steps on) at tmp_path/newer, and A's
    parameters as the eager route loads them."""
    _, t = _trainer("eager", tmp_path / "s0")
    t.step(X, Y)
    t.save(tmp_path / "ckpt")
    for _ in range(3):
        t.step(X, Y)
    t.save(tmp_path / "newer")
    reference, r = _trainer("eager", tmp_path / "s1", seed=7)
    r.load(tmp_path / "ckpt")
    return tmp_path / "ckpt", tmp_path / "newer", _params(reference)


def test_a_save_landing_between_the_stages_of_a_streaming_load_is_not_mixed_in(two_checkpoints, tmp_path,
                                                                                 monkeypatch):
    path, newer, want = two_checkpoints
    model, t = _trainer("streaming", tmp_path / "store", seed=3)
    t.step(X, Y)  # the route holds a store: the load writes into it stage by stage
    real_write = StageIO.write

    def write_then_a_save_lands(self, index, slot, step):
        if newer.exists():  # another process's save renames its file over the path after stage 0 is written
            os.replace(newer, path)
        return real_write(self, index, slot, step)

    monkeypatch.setattr(StageIO, "write", write_then_a_save_lands)
    t.load(path)
    monkeypatch.undo()
    assert not newer.exists()  # (the save did land mid-load)
    assert t.step_count == 1
    t.stream.to_memory()
    _same(_params(model), want)  # every stage A's, read through the one file the load opened


def _land_after_the_check(monkeypatch, path, newer):
    real = ck.check_checkpoint

    def check_then_a_save_lands(*args, **kwargs):
        meta = real(*args, **kwargs)
        os.replace(newer, path)
        return meta

    monkeypatch.setattr(ck, "check_checkpoint", check_then_a_save_lands)


@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_a_save_landing_between_the_check_and_the_reads_is_refused_and_nothing_changes(route, two_checkpoints,
                                                                                       tmp_path, monkeypatch):
    path, newer, _ = two_checkpoints
    model, t = _trainer(route, tmp_path / "store", seed=3)
    before = _params(model)
    _land_after_the_check(monkeypatch, path, newer)
    # Before: eager said "is corrupt ... damaged after it was written ... Restore from an older checkpoint";
    # streaming loaded the newer file, unverified, as the file it had checked.
    with pytest.raises(ValueError, match=r"ckpt was replaced while it was being loaded .* nothing was loaded\. "
                                         r"Load it again") as info:
        t.load(path)
    assert type(info.value).__name__ == "CheckpointReplacedError"
    monkeypatch.undo()
    assert t.step_count == 0 and t.stream is None
    _same(_params(model), before)
    t.load(path)  # the file there now (B) loads whole
    assert t.step_count == 4


def test_load_checkpoint_refuses_a_file_replaced_after_its_check(two_checkpoints, monkeypatch):
    path, newer, _ = two_checkpoints
    model = _vit(5)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    before = _params(model)
    _land_after_the_check(monkeypatch, path, newer)
    with pytest.raises(ValueError, match="was replaced while it was being loaded") as info:
        load_checkpoint(path, model=model, optimizer=opt)
    assert not isinstance(info.value, ck.CheckpointCorruptError)  # the file is whole: no "restore an older one"
    _same(_params(model), before)


def test_a_waiting_checkpoint_replaced_before_step_1_is_refused_until_loaded_again(two_checkpoints, tmp_path):
    path, newer, _ = two_checkpoints
    model, t = _trainer("auto", tmp_path / "store", deferred=True)
    t.load(path)  # checked and verified now, loaded at step 1 once route auto has chosen
    assert all(p.is_deferred for p in model.parameters())
    os.replace(newer, path)
    for _ in range(2):  # (before: step 1 loaded the newer file under the checked file's step count)
        with pytest.raises(ValueError, match=r"ckpt was replaced after trainer.load\(\) checked it .* Load it again"):
            t.step(X, Y)
    t.load(path)
    assert t.step_count == 4 and t.step(X, Y).step == 5


# -- 3. a dtype a safetensors file cannot hold ------------------------------------------------------------------------
@pytest.mark.parametrize("value", [np.zeros(2, np.longdouble), np.array([1], "datetime64[s]"),
                                   np.array([1], "timedelta64[s]")], ids=["longdouble", "datetime64", "timedelta64"])
def test_a_buffer_of_a_dtype_the_format_cannot_hold_is_named(value, tmp_path):
    model = nn.Linear(1, 1)
    model.register_buffer("acc", value)
    with pytest.raises(ValueError, match=rf"tensor 'model.acc' has dtype {re.escape(str(value.dtype))}, which a "
                                         rf"safetensors file "
                                         rf"cannot hold; use one of .*float32"):
        save_checkpoint(tmp_path / "c.st", model=model)
    assert list(tmp_path.iterdir()) == []


# -- 4. files of another kind or version ------------------------------------------------------------------------------
@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy-pickle"])
def test_a_pytorch_file_is_named_as_one_with_how_to_load_it(zipped, tmp_path):
    torch.manual_seed(0)
    theirs = torch.nn.Linear(3, 2)
    path = tmp_path / "model.pt"
    torch.save(theirs.state_dict(), path, _use_new_zipfile_serialization=zipped)
    model = nn.Linear(3, 2)
    before = _params(model)
    with pytest.raises(ValueError) as info:
        load_checkpoint(path, model=model)
    message = str(info.value)
    assert "is a PyTorch file (torch.save), not a tensorarena checkpoint" in message, message
    assert "truncated" not in message and "earlier checkpoint" not in message
    _same(_params(model), before)


def test_the_pytorch_advice_loads_the_weights(tmp_path):
    torch.manual_seed(0)
    theirs = torch.nn.Linear(3, 2)
    path = tmp_path / "model.pt"
    torch.save(theirs.state_dict(), path)
    model = nn.Linear(3, 2)
    model.load_state_dict({k: v.numpy() for k, v in torch.load(path).items()})  # what the refusal says to do
    np.testing.assert_array_equal(model.weight.data, theirs.weight.detach().numpy())
    np.testing.assert_array_equal(model.bias.data, theirs.bias.detach().numpy())


def test_another_zip_is_not_called_truncated(tmp_path):
    np.savez(tmp_path / "a.npz", w=np.zeros(2))
    with pytest.raises(ValueError, match=r"a\.npz is a zip archive, not a tensorarena checkpoint"):
        load_checkpoint(tmp_path / "a.npz", model=nn.Linear(3, 2))


def test_a_checkpoint_of_a_newer_format_says_to_upgrade(tmp_path):
    model = nn.Linear(3, 2)
    save_checkpoint(tmp_path / "v1.st", model=model, step=1)
    raw = (tmp_path / "v1.st").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = json.loads(header["__metadata__"]["tensorarena"])
    meta["version"] = 2
    header["__metadata__"]["tensorarena"] = json.dumps(meta)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "v2.st").write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    with pytest.raises(ValueError, match=r"v2\.st was written by a newer tensorarena \(checkpoint format v2; this one "
                                         r"reads v1\); nothing was loaded\. Upgrade tensorarena"):
        load_checkpoint(tmp_path / "v2.st", model=model)


def _plain_weights(path) -> dict[str, np.ndarray]:
    weights = {"weight": np.arange(6, dtype=np.float32).reshape(2, 3), "bias": np.array([1.5, -2], np.float32)}
    save_file(weights, str(path))
    return weights


def test_plain_safetensors_weights_are_refused_with_how_to_load_them(tmp_path):
    _plain_weights(tmp_path / "hf.safetensors")
    with pytest.raises(ValueError, match=r"is a safetensors file but not a tensorarena checkpoint .*"
                                         r"model\.load_state_dict\(tensorarena\.train\.safetensors_io\."
                                         r"read_safetensors\(path\)\)"):
        load_checkpoint(tmp_path / "hf.safetensors", model=nn.Linear(3, 2))


def test_the_plain_safetensors_advice_loads_the_weights(tmp_path):
    weights = _plain_weights(tmp_path / "hf.safetensors")
    model = nn.Linear(3, 2)
    model.load_state_dict(read_safetensors(str(tmp_path / "hf.safetensors")))
    _same(_params(model), weights)


# -- 5. tuple hyperparameters through a round trip --------------------------------------------------------------------
TORCH_RPROP = torch.optim.Rprop(torch.nn.Linear(3, 2).parameters(), lr=1e-2).state_dict()["param_groups"][0]


def _assert_torch_layout(group) -> None:
    for key in ("etas", "step_sizes"):
        assert type(group[key]) is tuple and group[key] == TORCH_RPROP[key], (key, group[key])


def test_rprop_tuples_survive_an_eager_checkpoint(tmp_path):
    model = nn.Linear(3, 2)
    opt = optim.Rprop(model.parameters(), lr=1e-2)
    opt.zero_grad()
    (model(Tensor(np.ones((4, 3), np.float32))) ** 2).sum().backward()
    opt.step()
    save_checkpoint(tmp_path / "c.st", model=model, optimizer=opt, step=1)
    other = nn.Linear(3, 2)
    loaded = optim.Rprop(other.parameters(), lr=1e-2)
    load_checkpoint(tmp_path / "c.st", model=other, optimizer=loaded)
    assert loaded.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    _assert_torch_layout(loaded.state_dict()["param_groups"][0])


def test_rprop_tuples_survive_a_streaming_checkpoint_and_a_store_resume(tmp_path):
    _, t = _trainer("streaming", tmp_path / "a", make=optim.Rprop)
    t.step(X, Y)
    t.save(tmp_path / "c.st")
    t.stream.close()
    _, loaded = _trainer("streaming", tmp_path / "b", make=optim.Rprop, seed=1)
    loaded.load(tmp_path / "c.st")
    _assert_torch_layout(loaded.optimizer.param_groups[0])
    _, resumed = _trainer("streaming", tmp_path / "a", make=optim.Rprop, seed=1)
    resumed.step(X, Y)  # resumes the store's run (step 1), then takes step 2
    assert resumed.step_count == 2
    _assert_torch_layout(resumed.optimizer.param_groups[0])
