"""Saving a checkpoint holds no copy of the state: the file is written array by array from the arrays themselves.

bench/budget_sweep.py found `tensorarena train --model vit-tiny --save` peaking at 465 MiB, 150 MiB above its plan
(315; 318 MiB without --save): save_checkpoint took state_dict()'s copy of every weight, then safetensors' save()
built a bytes copy of every tensor and one of the whole file. BertModel.save_pretrained did the same through
to_hf_state_dict's copies and save_file. Now tensorarena/train/safetensors_io.py writes the format directly.

On 4c8b667 (before the fix) 6 of this file's 9 tests fail: the two save bounds (4.16 MiB allocated for 1.04 MiB
of weights), save_pretrained's (1.82 MiB for 1.80), the writer's two (its module did not exist), and a complex128
buffer, refused by safetensors' Rust error that names no tensor rather than a ValueError naming it:
    git worktree add /tmp/wt 4c8b667 && cp tests/test_checkpoint_memory.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=. python -m pytest -q -p no:cacheprovider tests/test_checkpoint_memory.py)
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from tensorarena.nn import functional as F
from tensorarena.optim import AdamW
from tensorarena.train.trainer import Trainer

from mlp_cases import labelled_rows, small_mlp

MiB = 1 << 20


def _traced_peak(fn) -> int:
    """Bytes allocated at the peak while `fn` runs (NumPy reports its buffers to tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _trained(route: str, hidden=(512, 512)) -> tuple[Trainer, int]:
    model = small_mlp(hidden=hidden)
    trainer = Trainer(model, AdamW(model.parameters(), lr=1e-3), F.cross_entropy, route=route)
    for x, y in labelled_rows(n=2, features=12, classes=4):
        trainer.step(x, y)
    param_bytes = sum(p.data.nbytes for p in model.parameters())
    return trainer, param_bytes


@pytest.mark.parametrize("route", ["fused", "eager"])
def test_saving_holds_no_copy_of_the_state(tmp_path, route):
    trainer, param_bytes = _trained(route)
    assert param_bytes > 1 * MiB  # so that one copy would show above the bound
    peak = _traced_peak(lambda: trainer.save(tmp_path / "c.safetensors"))
    # Params + two AdamW moments are 3x param_bytes; before the fix the save peaked above 3x param_bytes.
    assert peak < 0.1 * param_bytes, f"save allocated {peak / MiB:.2f} MiB for {param_bytes / MiB:.2f} MiB of weights"


@pytest.mark.parametrize("route", ["fused", "eager"])
def test_the_saved_file_resumes_exactly(tmp_path, route):
    trainer, _ = _trained(route)
    path = tmp_path / "c.safetensors"
    trainer.save(path)
    again, _ = _trained(route)
    again.load(path)
    for (name, a), (_, b) in zip(trainer.model.state_dict().items(), again.model.state_dict().items()):
        assert np.array_equal(a, b), name
    assert again.step_count == trainer.step_count == 2
    # and safetensors itself reads the file: every model tensor equals the trained weights
    arrays = load_file(str(path))
    for name, value in trainer.model.state_dict().items():
        assert np.array_equal(arrays[f"model.{name}"], value), name


def test_the_same_state_is_the_same_bytes(tmp_path):
    trainer, _ = _trained("fused", hidden=(8,))
    trainer.save(tmp_path / "a.safetensors")
    trainer.save(tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


ALL_DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32,
              np.uint16, np.uint8, np.bool_, np.complex64]


def _samples() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {f"d.{np.dtype(t).name}": (rng.standard_normal((3, 5)) * 50).astype(t) for t in ALL_DTYPES}
    arrays["scalar"] = np.array(2.5, dtype=np.float32)
    arrays["empty"] = np.zeros((0, 4), dtype=np.float32)
    arrays["strided"] = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    arrays["transposed"] = np.arange(12, dtype=np.float64).reshape(3, 4).T
    arrays["big_endian"] = np.arange(6, dtype=">f4").reshape(2, 3)
    return arrays


def test_the_writer_matches_safetensors_own_save(tmp_path):
    from tensorarena.train.safetensors_io import write_safetensors

    arrays = _samples()
    ours = tmp_path / "ours.safetensors"
    with open(ours, "wb") as f:
        write_safetensors(f, arrays, {"note": "x"})
    theirs = tmp_path / "theirs.safetensors"
    # (ascontiguousarray makes a 0-d array 1-d: reshape keeps its shape)
    save_file({k: np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<")).reshape(v.shape) for k, v in arrays.items()},
              str(theirs), metadata={"note": "x"})
    got, want = load_file(str(ours)), load_file(str(theirs))
    assert got.keys() == want.keys() == arrays.keys()
    for name in arrays:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert np.array_equal(got[name], want[name]) and np.array_equal(got[name], arrays[name]), name
    with safe_open(str(ours), framework="numpy") as f:
        assert f.metadata() == {"note": "x"}


def test_the_writer_refuses_what_the_format_cannot_hold(tmp_path):
    from tensorarena.train.safetensors_io import write_safetensors

    with open(tmp_path / "bad.safetensors", "wb") as f, \
            pytest.raises(ValueError, match=r"tensor 'z' has dtype complex128, which a safetensors file cannot hold"):
        write_safetensors(f, {"a": np.zeros(2, np.float32), "z": np.zeros(2, np.complex128)})
    with open(tmp_path / "bad2.safetensors", "wb") as f, pytest.raises(ValueError, match="maps str to str"):
        write_safetensors(f, {"a": np.zeros(2, np.float32)}, {"n": 3})


def test_a_refused_checkpoint_leaves_the_old_file(tmp_path):
    """An array the format cannot hold is refused before the file is opened: the checkpoint there stays."""
    from tensorarena.nn.module import Module

    trainer, _ = _trained("eager", hidden=(8,))
    path = tmp_path / "c.safetensors"
    trainer.save(path)
    before = path.read_bytes()
    Module.register_buffer(trainer.model, "phase", np.zeros(3, np.complex128))
    with pytest.raises(ValueError, match="complex128"):
        trainer.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]  # no temporary file left


def test_save_pretrained_holds_no_copy_of_the_weights(tmp_path):
    from tensorarena.models.bert import BertConfig, BertModel, to_hf_state_dict

    config = BertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512, max_position_embeddings=64)
    model = BertModel(config, rng=np.random.default_rng(0))
    weight_bytes = sum(p.data.nbytes for p in model.parameters())
    assert weight_bytes > 1 * MiB
    peak = _traced_peak(lambda: model.save_pretrained(tmp_path / "m"))
    assert peak < 0.1 * weight_bytes, f"save_pretrained allocated {peak / MiB:.2f} of {weight_bytes / MiB:.2f} MiB"
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    want = to_hf_state_dict(model)
    assert saved.keys() == want.keys()
    for name, value in want.items():
        assert np.array_equal(saved[name], value), name
    back = BertModel.from_pretrained(tmp_path / "m")
    for (name, a), (_, b) in zip(model.named_parameters(), back.named_parameters()):
        assert np.array_equal(a.data, b.data), name
