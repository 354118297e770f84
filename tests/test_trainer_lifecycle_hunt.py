"""Trainers that come and go around one model and optimizer (a helper agent's hunt of the Trainer life cycle).

A fused Trainer still alive after another Trainer streamed the model trained from all-zero weights, silently
(loss exactly ln 5 on a 5-class model): rebinding its flat layout copied each on-disk parameter's one-element
placeholder over the whole parameter. It refuses now, as the eager route does, and goes on once the other
trainer's state is back in memory.

And a streaming Trainer on its default temporary store, dropped (one Trainer per epoch; or a fused run an
out-of-memory moved there), removed the store with every parameter still pointing into it: the model could not
step, save, load a checkpoint or give a state_dict again. The parameters come back into the model first now
(and, since 2026-12-07's fourth session, their optimizer state into the optimizer: it went with the store, the
next Adam step moved each weight by about lr; test_a_dropped_trainer_on_a_temporary_store_keeps_the_optimizer_state
fails on e4167e7).

On 745266e (before the fix) the first and the last tests fail (the second is the control: after to_memory(), the fused
trainer goes on from the streamed state, as an eager-only run does):
    git worktree add /tmp/wt 745266e && cp tests/test_trainer_lifecycle_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_trainer_lifecycle_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import optim
from tensorarena.memory.arena import StaleTensorError
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

CFG = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=32, depth=2, num_heads=4, dtype=np.float64)
_RNG = np.random.default_rng(1)
BATCHES = [(_RNG.standard_normal((3, 3, 16, 16)), _RNG.integers(0, 5, 3)) for _ in range(5)]


def _two_trainers(tmp_path):
    model = ViT(CFG, rng=np.random.default_rng(0))
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    fused = Trainer(model, opt, cross_entropy, route="fused")
    fused.step(*BATCHES[0])
    fused.step(*BATCHES[1])
    streaming = Trainer(model, opt, cross_entropy, route="streaming", store_dir=tmp_path / "store")
    streaming.step(*BATCHES[2])
    streaming.step(*BATCHES[3])
    return model, fused, streaming


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_a_fused_trainer_refuses_parameters_another_trainer_streams(tmp_path, replay):
    model, fused, _ = _two_trainers(tmp_path)
    fused.fused_replay = replay
    with pytest.raises(StaleTensorError, match="lives on disk, in the store of a StreamingRoute"):
        fused.step(*BATCHES[4])


def test_after_to_memory_the_fused_trainer_goes_on_as_eager(tmp_path):
    model, fused, streaming = _two_trainers(tmp_path)
    streaming.stream.to_memory()
    got = fused.step(*BATCHES[4]).loss
    reference = ViT(CFG, rng=np.random.default_rng(0))
    eager = Trainer(reference, optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.05), cross_entropy)
    want = [eager.step(*batch).loss for batch in BATCHES][-1]
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_a_dropped_trainer_on_a_temporary_store_gives_the_model_back(caplog):
    import gc

    def streamed(to_memory: bool):
        model = ViT(CFG, rng=np.random.default_rng(0))
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route="streaming")
        for batch in BATCHES[:2]:
            trainer.step(*batch)
        store = trainer.stream.store.directory
        if to_memory:
            trainer.stream.to_memory()
        del trainer
        gc.collect()
        assert not store.exists()
        return model

    want = {k: np.array(v) for k, v in streamed(True).state_dict().items()}
    with caplog.at_level("WARNING", logger="tensorarena"):
        model = streamed(False)
    assert any("parameters and their optimizer state came back" in r.getMessage() for r in caplog.records)
    got = model.state_dict()
    assert all(np.array_equal(np.array(got[k]), v) for k, v in want.items())
    eager = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route="eager")
    assert np.isfinite(eager.step(*BATCHES[2]).loss)


def test_a_dropped_trainer_on_a_temporary_store_keeps_the_optimizer_state():
    import gc

    def streamed(to_memory: bool):
        model = ViT(CFG, rng=np.random.default_rng(0))
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        trainer = Trainer(model, opt, cross_entropy, route="streaming")
        for batch in BATCHES[:2]:
            trainer.step(*batch)
        if to_memory:
            trainer.stream.to_memory()
        del trainer
        gc.collect()
        return model, opt

    (want_model, want_opt), (model, opt) = streamed(True), streamed(False)
    names = dict((id(p), n) for n, p in model.named_parameters())
    want_names = dict((id(p), n) for n, p in want_model.named_parameters())
    want_state = {want_names[id(p)]: s for p, s in want_opt.state.items()}
    assert {names[id(p)] for p in opt.state} == set(want_state)
    for p, state in opt.state.items():
        expected = want_state[names[id(p)]]
        assert set(state) == set(expected)
        for key, value in state.items():
            np.testing.assert_array_equal(value, expected[key], err_msg=f"{names[id(p)]} {key}")
    # The next steps go on as after to_memory(): Adam's moments and step counts are the store's.
    got = Trainer(model, opt, cross_entropy, route="eager").step(*BATCHES[2]).loss
    want = Trainer(want_model, want_opt, cross_entropy, route="eager").step(*BATCHES[2]).loss
    assert got == want
    np.testing.assert_array_equal(model.state_dict()["head.weight"], want_model.state_dict()["head.weight"])
