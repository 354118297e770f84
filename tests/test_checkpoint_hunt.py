"""Checkpoint hunt: Trainer.save / Trainer.load and train/checkpoint.py against "nothing already trained is lost".

A save then a load continues the run bit for bit (same route) or within float tolerance (across routes); a save
that cannot be written (a directory, a file in the way, no permission, a write failing half-way) says so, names
the path, keeps the previous checkpoint and leaves no half file; a load of a truncated, corrupt or other model's
or other optimizer's or scheduler's checkpoint names the file and the mismatch and changes nothing; dropout
generators of every NumPy bit generator, numpy scalars in `extra`, another dtype, frozen and tied parameters, and
torch's own state dicts.

26 of its 38 tests fail on the base commit c5b9b31, before the fixes (each failing one is under a "Regression
(fixed)" comment saying what was wrong). With this file copied into a worktree of the base (git worktree add
/tmp/old-ckpt c5b9b31), run in /tmp/old-ckpt:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_checkpoint_hunt.py`.
"""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch

import tensorarena.random as ta_random
import tensorarena.train.checkpoint as ck
from tensorarena import nn, optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.checkpoint import load_checkpoint, read_metadata, save_checkpoint
from tensorarena.train.trainer import Trainer

ROUTES = ["eager", "fused", "streaming"]


def _batches(n=6, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        out.append((x, (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)))
    return out


BATCHES = _batches()


def _vit(seed=0, dim=32, dtype=np.float32, rng_for_dropout=None):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=dim, depth=2, num_heads=4, dropout=0.0,
                    dtype=dtype)
    model = ViT(cfg, rng=np.random.default_rng(seed))
    model.pos_drop.p = 0.2  # dropout: its RNG must travel with the checkpoint
    if rng_for_dropout is not None:
        model.pos_drop.rng = rng_for_dropout
    return model


def _trainer(route, tmp_path, tag, *, seed=0, opt="adamw", sched="warmup", **model_kw):
    model = _vit(seed=seed, **model_kw)
    if opt == "adamw":
        o = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    else:
        o = optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    if sched == "warmup":
        s = optim.lr_scheduler.warmup_cosine(o, warmup_steps=2, total_steps=10)
    elif sched == "step":
        s = optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)
    else:
        s = None
    return model, Trainer(model, o, cross_entropy, scheduler=s, route=route, store_dir=tmp_path / f"store-{tag}")


def _seed_default(seed):
    """The default generator (dropout with rng=None draws from it) at a known state."""
    ta_random.peek_default_generator().bit_generator.state = np.random.default_rng(seed).bit_generator.state


def _params(model, trainer):
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return {name: p.data.copy() for name, p in model.named_parameters()}


def _fingerprint(trainer, tmp_path):
    """Everything a failed load must leave as it was (weights, optimizer state and groups, schedule, RNGs, step),
    as the bytes of a checkpoint of it: on the streaming route too, where that state lives in the store."""
    path = tmp_path / "fingerprint.ckpt"
    trainer.save(path)
    raw = path.read_bytes()
    path.unlink()
    return raw


# -- resume: bit for bit on one route, within tolerance across routes ------------------------------------------

@pytest.mark.parametrize("route", ROUTES)
def test_resume_on_the_same_route_is_bit_identical_to_an_unbroken_run(route, tmp_path):
    _seed_default(123)
    m0, t0 = _trainer(route, tmp_path, "straight")
    expected = [t0.step(*b).loss for b in BATCHES]
    want = _params(m0, t0)

    _seed_default(123)
    _, t1 = _trainer(route, tmp_path, "first")
    losses = [t1.step(*b).loss for b in BATCHES[:3]]
    t1.save(tmp_path / "c.ckpt")
    _seed_default(999)  # the checkpoint's default-generator state must win
    m2, t2 = _trainer(route, tmp_path, "second", seed=7)
    t2.load(tmp_path / "c.ckpt")
    assert t2.step_count == 3
    reports = [t2.step(*b) for b in BATCHES[3:]]
    assert [r.step for r in reports] == [4, 5, 6] and {r.route for r in reports} == {route}
    assert losses + [r.loss for r in reports] == expected
    got = _params(m2, t2)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_chain_of_resumes_eager_fused_streaming_and_back_continues_the_run(tmp_path):
    _seed_default(5)
    m0, t0 = _trainer("eager", tmp_path, "straight")
    expected = [t0.step(*b).loss for b in BATCHES]
    want = _params(m0, t0)

    losses = []
    path = tmp_path / "leg.ckpt"
    _seed_default(5)
    for leg, route in enumerate(["eager", "fused", "streaming", "eager", "streaming", "fused"]):
        model, trainer = _trainer(route, tmp_path, f"leg{leg}", seed=10 + leg if leg else 0)
        if leg:
            trainer.load(path)
        assert trainer.step_count == leg
        report = trainer.step(*BATCHES[leg])
        assert report.route == route and report.step == leg + 1
        losses.append(report.loss)
        trainer.save(path)
        assert read_metadata(path)["step"] == leg + 1
    np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-6)
    got = _params(model, trainer)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_saving_twice_to_the_same_path_keeps_the_second_and_no_temporary_file(tmp_path):
    _, t = _trainer("eager", tmp_path, "a")
    path = tmp_path / "run" / "c.ckpt"
    t.step(*BATCHES[0])
    t.save(path, extra={"n": 1})
    t.step(*BATCHES[1])
    t.save(path, extra={"n": 2})
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.ckpt"]
    _, t2 = _trainer("eager", tmp_path, "b", seed=3)
    assert t2.load(path) == {"n": 2} and t2.step_count == 2


# -- saves that cannot be written ------------------------------------------------------------------------------

def _saved_once(route, tmp_path):
    model, t = _trainer(route, tmp_path, "s")
    for b in BATCHES[:2]:
        t.step(*b)
    good = tmp_path / "good.ckpt"
    t.save(good)
    return model, t, good, good.read_bytes()


def _still_trains(t, start):
    report = t.step(*BATCHES[start])
    assert report.step == start + 1 and np.isfinite(report.loss)


@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_saving_onto_a_directory_is_a_clear_error(route, tmp_path):
    _, t, good, before = _saved_once(route, tmp_path)
    target = tmp_path / "adir"
    target.mkdir()
    # Regression (fixed): IsADirectoryError naming only the temporary file ('.adir.tmp-<pid>' -> 'adir').
    with pytest.raises(IsADirectoryError, match=r"adir is a directory.*file path"):
        t.save(target)
    assert list(target.iterdir()) == [] and good.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("store")) == ["adir", "good.ckpt"]
    _still_trains(t, 2)


@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_saving_under_a_file_is_a_clear_error(route, tmp_path):
    _, t, good, before = _saved_once(route, tmp_path)
    (tmp_path / "afile").write_text("not a directory")
    # Regression (fixed): FileExistsError "File exists: '.../afile'" from mkdir, saying nothing of the checkpoint.
    with pytest.raises(NotADirectoryError, match=r"cannot save the checkpoint .*afile.*x\.ckpt: .*afile is a file"):
        t.save(tmp_path / "afile" / "sub" / "x.ckpt")
    assert (tmp_path / "afile").read_text() == "not a directory" and good.read_bytes() == before
    _still_trains(t, 2)


@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_saving_into_an_unwritable_directory_is_a_clear_error(route, tmp_path, monkeypatch):
    _, t, good, before = _saved_once(route, tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    t.save(locked / "c.ckpt")
    kept = (locked / "c.ckpt").read_bytes()
    real_open = open

    def refusing_open(file, mode="r", *args, **kwargs):
        # What a read-only directory does (chmod cannot show it: the tests may run as root).
        if "w" in mode and str(file).startswith(str(locked)):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, mode, *args, **kwargs)

    t.step(*BATCHES[2])
    monkeypatch.setattr(ck, "open", refusing_open, raising=False)
    # Regression (fixed): PermissionError naming only the hidden temporary file, not the checkpoint asked for.
    with pytest.raises(PermissionError, match=r"cannot save the checkpoint .*locked.*c\.ckpt: Permission denied"):
        t.save(locked / "c.ckpt")
    monkeypatch.undo()
    assert sorted(p.name for p in locked.iterdir()) == ["c.ckpt"] and (locked / "c.ckpt").read_bytes() == kept
    assert good.read_bytes() == before
    _still_trains(t, 3)
    t.save(locked / "c.ckpt")  # and saving works again once the directory does
    assert read_metadata(locked / "c.ckpt")["step"] == 4


class _BreaksAfter:
    """A file whose writes fail with EIO once `limit` bytes went through (the bytes before it are written)."""

    def __init__(self, f, limit):
        self.f, self.left = f, limit

    def write(self, data):
        data = memoryview(data).cast("B")
        if len(data) > self.left:
            self.f.write(data[:self.left])
            self.left = 0
            raise OSError(errno.EIO, "simulated write failure")
        self.left -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_a_save_failing_half_way_keeps_the_old_file_and_leaves_no_half_file(route, tmp_path, monkeypatch):
    model, t, good, before = _saved_once(route, tmp_path)
    t.step(*BATCHES[2])
    real_open = open
    monkeypatch.setattr(ck, "open", lambda file, mode="r", *a, **k: _BreaksAfter(real_open(file, mode, *a, **k),
                                                                                 len(before) // 2), raising=False)
    with pytest.raises(OSError, match="simulated write failure") as info:
        t.save(good)
    assert info.value.errno == errno.EIO
    monkeypatch.undo()
    assert good.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("store")) == ["good.ckpt"]
    _still_trains(t, 3)
    _, again = _trainer(route, tmp_path, "again", seed=4)
    again.load(good)
    assert again.step_count == 2


# -- loads that must change nothing -----------------------------------------------------------------------------

def _broken_files(good, tmp_path):
    data = good.read_bytes()
    corrupt_header = bytearray(data)
    corrupt_header[12:20] = b"\xff" * 8
    files = {"truncated": data[: len(data) // 2], "garbage": b"hello world, no checkpoint" * 9, "empty": b"",
             "corrupt header": bytes(corrupt_header), "cut in the header": data[:40]}
    out = {}
    for name, raw in files.items():
        path = tmp_path / f"{name.replace(' ', '_')}.ckpt"
        path.write_bytes(raw)
        out[name] = path
    return out


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
def test_a_truncated_or_corrupt_checkpoint_is_refused_naming_the_file_and_changes_nothing(route, tmp_path):
    _, first = _trainer("eager", tmp_path, "first")
    first.step(*BATCHES[0])
    first.save(tmp_path / "good.ckpt")
    model, t = _trainer(route, tmp_path, "t", seed=3)
    t.step(*BATCHES[0])
    before = _fingerprint(t, tmp_path)
    for what, path in _broken_files(tmp_path / "good.ckpt", tmp_path).items():
        # Regression (fixed): safetensors' own error ("Error while deserializing header: ...") naming no file.
        with pytest.raises(ValueError, match=rf"{path.name} is not a readable tensorarena checkpoint"):
            t.load(path)
        if before is not None:
            assert _fingerprint(t, tmp_path) == before
    with pytest.raises(IsADirectoryError, match=r"is a directory, not a checkpoint file"):
        t.load(tmp_path)
    assert t.step_count == 1
    _still_trains(t, 1)


def test_a_streaming_trainer_refuses_a_bad_checkpoint_before_it_moves_into_the_store(tmp_path):
    model, t = _trainer("streaming", tmp_path, "t")
    (tmp_path / "bad.ckpt").write_bytes(b"\0" * 64)
    before = {name: p.data.copy() for name, p in model.named_parameters()}
    with pytest.raises(ValueError, match="bad.ckpt is not a readable"):
        t.load(tmp_path / "bad.ckpt")
    # Regression (fixed): the load started the streaming route (the whole state moved into the store) before
    # reading the file.
    assert t.stream is None
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, before[name], err_msg=name)
    _still_trains(t, 0)


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
def test_another_models_checkpoint_names_the_file_the_key_and_both_shapes(route, tmp_path):
    _, wide = _trainer("eager", tmp_path, "wide", dim=64)
    wide.step(*BATCHES[0])
    wide.save(tmp_path / "wide.ckpt")
    model, t = _trainer(route, tmp_path, "t")
    t.step(*BATCHES[0])
    t.step(*BATCHES[1])
    before = _fingerprint(t, tmp_path)
    # Regression (fixed): the model's error ("Error(s) in loading state_dict for ViT") did not name the file.
    with pytest.raises(ValueError, match=r"wide\.ckpt does not fit this ViT.*cls_token: the checkpoint has "
                                         r"shape \(1, 1, 64\), the model \(1, 1, 32\)"):
        t.load(tmp_path / "wide.ckpt")
    assert _fingerprint(t, tmp_path) == before
    _still_trains(t, 2)


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
def test_another_optimizers_checkpoint_is_refused_and_changes_nothing(route, tmp_path):
    _, sgd = _trainer("eager", tmp_path, "sgd", opt="sgd")
    sgd.step(*BATCHES[0])
    sgd.save(tmp_path / "sgd.ckpt")
    model, t = _trainer(route, tmp_path, "t", seed=3)
    t.step(*BATCHES[0])
    before = _fingerprint(t, tmp_path)
    # Regression (fixed): the weights were loaded before the optimizer's class was compared: the error left the
    # model at the checkpoint's weights and the optimizer at the run's state.
    with pytest.raises(ValueError, match=r"sgd\.ckpt holds SGD state but the optimizer is AdamW.*"
                                         r"load_checkpoint\(path, model=model\)"):
        t.load(tmp_path / "sgd.ckpt")
    assert _fingerprint(t, tmp_path) == before
    _still_trains(t, 1)


@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_another_schedulers_checkpoint_is_refused_and_changes_nothing(route, tmp_path):
    _, other = _trainer("eager", tmp_path, "other", sched="step")
    other.step(*BATCHES[0])
    other.save(tmp_path / "steplr.ckpt")
    model, t = _trainer(route, tmp_path, "t", seed=3)
    t.step(*BATCHES[0])
    before = _fingerprint(t, tmp_path)
    # Regression (fixed): the scheduler's class was saved but never compared; its keys were refused only after
    # the weights and optimizer state were loaded (eager), or after the store was rewritten and before its
    # commit (streaming: a route that then refused to train).
    with pytest.raises(ValueError, match=r"steplr\.ckpt holds a StepLR schedule but the trainer's scheduler is "
                                         r"SequentialLR"):
        t.load(tmp_path / "steplr.ckpt")
    assert _fingerprint(t, tmp_path) == before
    _still_trains(t, 1)


def test_a_checkpoint_without_a_scheduler_is_refused_on_streaming_too(tmp_path):
    _, plain = _trainer("eager", tmp_path, "plain", sched=None)
    plain.step(*BATCHES[0])
    plain.save(tmp_path / "plain.ckpt")
    for route in ("eager", "streaming"):
        model, t = _trainer(route, tmp_path, f"t-{route}", seed=3)
        t.step(*BATCHES[0])
        # Regression (fixed): the streaming load skipped the missing schedule silently (eager refused it).
        with pytest.raises(ValueError, match=r"plain\.ckpt holds no scheduler state"):
            t.load(tmp_path / "plain.ckpt")
        assert t.step_count == 1


def test_load_checkpoint_refuses_a_wrong_model_without_touching_the_optimizer(tmp_path):
    model, t = _trainer("eager", tmp_path, "a")
    t.step(*BATCHES[0])
    t.save(tmp_path / "a.ckpt")
    other = _vit(seed=1, dim=64)
    opt = optim.AdamW(other.parameters(), lr=1.0)
    # Regression (fixed): a RuntimeError from the model's load_state_dict that did not name the file.
    with pytest.raises(ValueError, match=r"a\.ckpt does not fit this ViT"):
        load_checkpoint(tmp_path / "a.ckpt", model=other, optimizer=opt)
    assert opt.param_groups[0]["lr"] == 1.0 and not opt.state


# -- what the checkpoint carries ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bit_generator", [np.random.MT19937, np.random.Philox, np.random.SFC64])
def test_dropout_generators_of_every_bit_generator_are_saved_and_resume_bit_for_bit(bit_generator, tmp_path):
    def make(tag, seed):
        return _trainer("eager", tmp_path, tag, seed=seed, rng_for_dropout=np.random.Generator(bit_generator(seed)))

    m0, t0 = make("straight", 0)
    expected = [t0.step(*b).loss for b in BATCHES[:4]]
    _, t1 = make("first", 0)
    losses = [t1.step(*b).loss for b in BATCHES[:2]]
    # Regression (fixed): "Object of type ndarray is not JSON serializable": these generators' states hold arrays.
    t1.save(tmp_path / "c.ckpt")
    m2, t2 = make("second", 8)
    t2.load(tmp_path / "c.ckpt")
    assert losses + [t2.step(*b).loss for b in BATCHES[2:4]] == expected
    for (name, p), q in zip(m0.named_parameters(), m2.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_extra_takes_numpy_scalars_and_refuses_what_json_cannot_bring_back(tmp_path):
    _, t = _trainer("eager", tmp_path, "a", sched=None)
    t.step(*BATCHES[0])
    path = tmp_path / "c.ckpt"
    # Regression (fixed): "Object of type int64 is not JSON serializable" for a loader position kept as numpy.
    t.save(path, extra={"epoch": np.int64(3), "best": np.float32(0.5), "order": np.arange(3), "nested": {"a": [1]}})
    assert t.load(path) == {"epoch": 3, "best": 0.5, "order": [0, 1, 2], "nested": {"a": [1]}}
    before = path.read_bytes()
    # Regression (fixed): an int key came back as the string "1"; an object failed inside json.dumps naming nothing.
    with pytest.raises(TypeError, match=r"extra\[1\]: keys must be str"):
        t.save(path, extra={1: "a"})
    with pytest.raises(TypeError, match=r"extra\['model'\]\['w'\] is a object.*JSON"):
        t.save(path, extra={"model": {"w": object()}})
    with pytest.raises(TypeError, match=r"extra must be a dict"):
        t.save(path, extra=[1, 2])
    assert path.read_bytes() == before


def test_a_float64_checkpoint_loads_into_a_float32_model_cast_and_trains(tmp_path):
    m64, t64 = _trainer("eager", tmp_path, "f64", dtype=np.float64)
    for x, y in BATCHES[:2]:
        t64.step(x.astype(np.float64), y)
    t64.save(tmp_path / "f64.ckpt")
    # Regression (fixed): under np.seterr(all="raise") (the tests' setting) the cast of the tiny float64 moments
    # raised FloatingPointError (underflow) after the weights were already loaded: half a load.
    for route in ("eager", "fused"):
        m32, t32 = _trainer(route, tmp_path, f"f32-{route}", seed=5)
        t32.load(tmp_path / "f64.ckpt")
        for (name, p64), p32 in zip(m64.named_parameters(), m32.parameters()):
            assert p32.data.dtype == np.float32
            np.testing.assert_array_equal(p32.data, p64.data.astype(np.float32), err_msg=name)
            for key in ("exp_avg", "exp_avg_sq"):
                got = t32.optimizer.state[p32][key]
                assert got.dtype == np.float32
                with np.errstate(under="ignore"):  # tiny second moments round to 0 in float32
                    np.testing.assert_array_equal(got, t64.optimizer.state[p64][key].astype(np.float32))
        want = t64.step(BATCHES[2][0].astype(np.float64), BATCHES[2][1]).loss
        np.testing.assert_allclose(t32.step(*BATCHES[2]).loss, want, rtol=1e-4)
        t64.load(tmp_path / "f64.ckpt")  # back to step 2 for the next route


class _TiedFrozen(nn.Module):
    """An embedding tied to the output projection, and a frozen layer the optimizer does not hold."""

    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.emb = nn.Embedding(11, 8, rng=rng)
        self.frozen = nn.Linear(8, 8, rng=rng)
        self.mid = nn.Linear(8, 8, rng=rng)
        self.drop = nn.Dropout(0.25, rng=np.random.default_rng(seed + 100))
        self.out = nn.Linear(8, 11, bias=False, rng=rng)
        self.out.weight = self.emb.weight
        for p in self.frozen.parameters():
            p.requires_grad = False

    def forward(self, idx):
        h = self.emb(idx).mean(dim=1)
        return self.out(self.drop(self.mid(self.frozen(h).relu()).relu()))


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_tied_and_frozen_parameters_resume_bit_for_bit(route, tmp_path):
    rng = np.random.default_rng(0)
    data = [(rng.integers(0, 11, (6, 5)), rng.integers(0, 11, 6)) for _ in range(6)]

    def make(seed):
        model = _TiedFrozen(seed)
        opt = optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        return model, Trainer(model, opt, cross_entropy, route=route, fused_replay="python")

    m0, t0 = make(0)
    expected = [t0.step(*b).loss for b in data]
    _, t1 = make(0)
    losses = [t1.step(*b).loss for b in data[:3]]
    t1.save(tmp_path / "c.ckpt")
    with ck.TensorFile(tmp_path / "c.ckpt") as file:
        keys = set(file.keys())
    assert {"model.emb.weight", "model.out.weight", "model.frozen.weight"} <= keys
    m2, t2 = make(9)
    t2.load(tmp_path / "c.ckpt")
    assert m2.out.weight is m2.emb.weight  # the tie survives the load
    assert losses + [t2.step(*b).loss for b in data[3:]] == expected
    for (name, p), q in zip(m0.named_parameters(), m2.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


# -- torch interop --------------------------------------------------------------------------------------------

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16, rng=np.random.default_rng(0))
        self.fc2 = nn.Linear(16, 3, rng=np.random.default_rng(1))

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_a_torch_state_dict_and_optimizer_state_train_like_torch(route, tmp_path):
    torch.manual_seed(0)
    theirs = _TorchNet()
    topt = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)) for _ in range(5)]

    def torch_step(x, y):
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        topt.step()
        return loss.item()

    for x, y in data[:2]:
        torch_step(x, y)  # torch's optimizer has state (moments, step 2) to hand over
    ours = _Net()
    ours.load_state_dict(theirs.state_dict())
    opt = optim.AdamW(ours.parameters(), lr=1e-2, weight_decay=0.1)
    opt.load_state_dict(topt.state_dict())
    trainer = Trainer(ours, opt, cross_entropy, route=route)
    trainer.save(tmp_path / "from_torch.ckpt")  # and the torch-born state goes through a checkpoint
    model, again = _Net(), None
    again = Trainer(model, optim.AdamW(model.parameters(), lr=5.0), cross_entropy, route=route)
    again.load(tmp_path / "from_torch.ckpt")
    for x, y in data[2:]:
        want = torch_step(x, y)
        np.testing.assert_allclose(again.step(x, y).loss, want, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_save_checkpoint_and_load_checkpoint_without_a_trainer_round_trip(tmp_path):
    model = _Net()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = np.ones((2, 6), np.float32), np.array([0, 2])
    Trainer(model, opt, cross_entropy).step(x, y)
    save_checkpoint(tmp_path / "m.ckpt", model=model, optimizer=opt, step=1)
    other = _Net()
    for p in other.parameters():
        p.data[...] = 0
    meta = load_checkpoint(tmp_path / "m.ckpt", model=other)  # the model alone: the optimizer state is skipped
    assert meta["step"] == 1
    for p, q in zip(model.parameters(), other.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


def test_save_checkpoint_takes_a_numpy_step_count_and_refuses_a_negative_one(tmp_path):
    model = _Net()
    # Regression (fixed): np.int64(2) (a counter from np.arange) failed in json.dumps ("int64 is not JSON
    # serializable"); -1 and 2.5 were written, and refused only when loading.
    save_checkpoint(tmp_path / "m.ckpt", model=model, step=np.int64(2))
    assert read_metadata(tmp_path / "m.ckpt")["step"] == 2
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"step must be an integer >= 0"):
            save_checkpoint(tmp_path / "m.ckpt", model=model, step=bad)
    assert read_metadata(tmp_path / "m.ckpt")["step"] == 2
