"""The streaming route's store through changes made between steps and failures around them: a state kind laid
out again (relayout) and what a failure or a restart does to it, stage rewrites (a checkpoint loaded, optimizer
state moved in) interrupted half-way, fill values of a group added mid-run, and to_memory() then training on.

Each against the eager route on the same tiny float64 ViT (tests/test_streaming_user_changes.py's), both store
I/O modes where the store's code differs.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.memory.arena import StaleTensorError
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import StoreError, StreamingRoute
from tensorarena.stream import store as store_module
from tensorarena.train.trainer import Trainer

TOL = 1e-10


def _vit(seed=0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=32, depth=2, num_heads=4, dropout=0.0,
                    attention_dropout=0.0, dtype=np.float64)
    return ViT(cfg, rng=np.random.default_rng(seed))


_rng = np.random.default_rng(1)
BATCHES = [(_rng.standard_normal((3, 3, 16, 16)), _rng.integers(0, 5, 3)) for _ in range(6)]


def _sgd(model):
    return optim.SGD(model.parameters(), lr=0.05)


def _pair(tmp_path, make_opt=_sgd, io="map"):
    out = []
    for route in ("eager", "streaming"):
        model = _vit()
        extra = {"store_dir": tmp_path / "store", "stream_io": io} if route == "streaming" else {}
        out.append(Trainer(model, make_opt(model), cross_entropy, route=route, **extra))
    return out


def _steps(eager, stream, start, stop):
    for i in range(start, stop):
        x, y = BATCHES[i % len(BATCHES)]
        e, s = eager.step(x, y), stream.step(x, y)
        assert abs(e.loss - s.loss) <= TOL, f"step {i + 1}: {s.loss} vs eager {e.loss}"


def _same_weights(eager, stream):
    stream.stream.to_memory()
    for (name, a), b in zip(eager.model.named_parameters(), stream.model.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=0, atol=TOL, err_msg=name)


@pytest.mark.parametrize("io", ["map", "copy"])
def test_momentum_switched_on_lays_the_store_out_again_and_a_restart_resumes_it(tmp_path, io):
    eager, stream = _pair(tmp_path, io=io)
    _steps(eager, stream, 0, 2)
    for t in (eager, stream):
        t.optimizer.param_groups[0]["momentum"] = 0.9
    _steps(eager, stream, 2, 4)
    store = stream.stream.store
    assert store.spec.state_arrays == ("momentum_buffer",)
    assert sorted(p.name for p in store.directory.glob("stage-*.bin")) == [f"stage-{i:04d}.g1.bin" for i in range(4)]
    stream.stream.close()
    # A new process builds the optimizer as at the start (no momentum): the store's kinds and settings win.
    model = _vit(seed=9)
    opt = _sgd(model)
    restarted = Trainer(model, opt, cross_entropy, route="streaming", store_dir=tmp_path / "store", stream_io=io)
    assert restarted.step(*BATCHES[4]).step == 5 and opt.param_groups[0]["momentum"] == 0.9
    eager.step(*BATCHES[4])
    _same_weights(eager, restarted)


def _fail_manifest_writes(monkeypatch):
    real = store_module.ParamStore._replace

    def replace(self, name, content):
        if name == store_module.MANIFEST:
            raise OSError(28, "No space left on device (injected)")
        return real(self, name, content)

    monkeypatch.setattr(store_module.ParamStore, "_replace", replace)


def test_a_relayout_that_fails_before_its_commit_leaves_the_old_store_and_the_route_usable(tmp_path, monkeypatch):
    eager, stream = _pair(tmp_path)
    _steps(eager, stream, 0, 2)
    stream.optimizer.param_groups[0]["momentum"] = 0.9
    with monkeypatch.context() as patch:
        _fail_manifest_writes(patch)
        with pytest.raises(OSError, match="injected"):
            stream.step(*BATCHES[2])
    files = sorted(p.name for p in (tmp_path / "store").glob("stage-*.bin"))
    assert files == [f"stage-{i:04d}.bin" for i in range(4)]  # the new layout's files are gone
    assert stream.stream._broken is None and stream.stream.store.spec.state_arrays == ()
    stream.optimizer.param_groups[0]["momentum"] = 0.0
    _steps(eager, stream, 2, 4)
    stream.stream.close()
    with StreamingRoute.resume(*(lambda m: (m, _sgd(m)))(_vit(seed=9)), cross_entropy, tmp_path / "store") as route:
        assert route.step_count == 4


def test_no_room_for_a_new_state_kind_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    eager, stream = _pair(tmp_path, lambda m: optim.Adam(m.parameters(), lr=1e-2))
    _steps(eager, stream, 0, 2)
    stream.optimizer.param_groups[0]["amsgrad"] = True
    with monkeypatch.context() as patch:
        patch.setattr(store_module.shutil, "disk_usage", lambda _: type("U", (), {"free": 1024})())
        with pytest.raises(StoreError, match=r"needs .* on disk .*nothing was changed"):
            stream.step(*BATCHES[2])
    stream.optimizer.param_groups[0]["amsgrad"] = False
    _steps(eager, stream, 2, 3)
    _same_weights(eager, stream)


def _interrupt_the_second_stage_write(monkeypatch, store):
    real, calls = store.write, []

    def write(index, slot, step):
        calls.append(index)
        if len(calls) == 2:
            raise KeyboardInterrupt()
        return real(index, slot, step)

    monkeypatch.setattr(store, "write", write)


@pytest.mark.parametrize("io", ["map", "copy"])
def test_a_checkpoint_load_interrupted_half_way_is_refused_until_a_load_completes(tmp_path, monkeypatch, io):
    eager, stream = _pair(tmp_path, io=io)
    _steps(eager, stream, 0, 2)
    stream.save(tmp_path / "step2.ckpt")
    eager.save(tmp_path / "eager2.ckpt")
    _steps(eager, stream, 2, 3)
    for last in (False, True):
        with monkeypatch.context() as patch:
            _interrupt_the_second_stage_write(patch, stream.stream.store)
            with pytest.raises(KeyboardInterrupt) as info:
                stream.load(tmp_path / "step2.ckpt")
        assert "load the last checkpoint" in " ".join(getattr(info.value, "__notes__", []))
        with pytest.raises(StoreError, match="loading the checkpoint"):
            stream.step(*BATCHES[2])
        if last:
            break
        stream.load(tmp_path / "step2.ckpt")  # a load that completes recovers the route
        eager.load(tmp_path / "eager2.ckpt")
        _steps(eager, stream, 2, 4)
    stream.stream.close()
    with pytest.raises(StoreError, match=r"interrupted while loading the checkpoint .*step2.ckpt"):
        StreamingRoute.resume(*(lambda m: (m, _sgd(m)))(_vit(seed=9)), cross_entropy, tmp_path / "store")


@pytest.mark.parametrize("make_opt", [
    lambda ps: optim.NAdam(ps, lr=1e-2),
    lambda ps: optim.Adagrad(ps, lr=1e-2, initial_accumulator_value=0.5),
], ids=["nadam", "adagrad"])
def test_a_group_added_mid_run_starts_from_its_own_fill_values(tmp_path, make_opt):
    # NAdam's mu_product starts at 1 and Adagrad's sum at initial_accumulator_value, not at 0.
    def head_left_out(model):
        head = {id(p) for p in model.head.parameters()}
        return make_opt([p for p in model.parameters() if id(p) not in head])

    eager, stream = _pair(tmp_path, head_left_out)
    _steps(eager, stream, 0, 2)
    for t in (eager, stream):
        t.optimizer.add_param_group({"params": list(t.model.head.parameters()), "lr": 0.02})
    _steps(eager, stream, 2, 4)
    _same_weights(eager, stream)


def test_a_raw_route_trains_on_after_to_memory_from_the_changed_weights(tmp_path):
    eager_model, stream_model = _vit(), _vit()
    eager_opt, stream_opt = _sgd(eager_model), _sgd(stream_model)
    route = StreamingRoute.from_memory(stream_model, stream_opt, cross_entropy, tmp_path / "store", io="copy")
    eager = Trainer(eager_model, eager_opt, cross_entropy)
    for x, y in BATCHES[:2]:
        assert abs(route.step(x, y) - eager.step(x, y).loss) <= TOL
    with pytest.raises(StaleTensorError, match="to_memory") as info:
        stream_model.head.weight.data
    assert "belongs to other tensors" not in str(info.value)
    route.to_memory()
    want = _vit(seed=5).state_dict()
    for model in (eager_model, stream_model):
        model.load_state_dict(want)
    for x, y in BATCHES[2:4]:
        assert abs(route.step(x, y) - eager.step(x, y).loss) <= TOL
    assert route.step_count == 4
    route.to_memory()
    for a, b in zip(eager_model.parameters(), stream_model.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=0, atol=TOL)
