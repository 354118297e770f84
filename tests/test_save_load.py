"""ta.save / ta.load (tensorarena/serialization.py), the roles of torch.save / torch.load in a training script.

Fails on 34bf8e2 (ta.save did not exist: every test here errors with AttributeError)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
import torch

import tensorarena as ta


def _trained(seed: int):
    """A float64 model and AdamW after two steps, and the batches of two more."""
    rng = np.random.default_rng(seed)
    model = ta.nn.Sequential(ta.nn.Linear(4, 5, rng=rng, dtype=np.float64), ta.nn.ReLU(),
                             ta.nn.Linear(5, 2, rng=rng, dtype=np.float64))
    opt = ta.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.99))
    batches = [(rng.standard_normal((6, 4)), rng.standard_normal((6, 2))) for _ in range(4)]
    return model, opt, batches


def _step(model, opt, x, y):
    opt.zero_grad()
    ta.nn.functional.mse_loss(model(ta.tensor(x)), ta.tensor(y)).backward()
    opt.step()


def test_a_run_resumed_from_ta_save_continues_bit_for_bit(tmp_path):
    model, opt, batches = _trained(0)
    for x, y in batches[:2]:
        _step(model, opt, x, y)
    ta.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 2}, tmp_path / "run.ta")
    for x, y in batches[2:]:
        _step(model, opt, x, y)

    resumed, resumed_opt, _ = _trained(1)  # other initial weights: everything must come from the file
    saved = ta.load(tmp_path / "run.ta")
    resumed.load_state_dict(saved["model"])
    resumed_opt.load_state_dict(saved["optimizer"])
    assert saved["epoch"] == 2
    for x, y in batches[2:]:
        _step(resumed, resumed_opt, x, y)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)


def test_structure_and_types_come_back_as_saved(tmp_path):
    model, opt, batches = _trained(0)
    _step(model, opt, *batches[0])
    tensor = ta.tensor(np.arange(3.0), requires_grad=True)
    obj = {"optimizer": opt.state_dict(), "t": tensor, "frozen": ta.tensor([1, 2]), "scalar": np.float32(2.5),
           "zero_d": np.array(7, np.int64), "list": [1, 2.5, "x", None, True], "tuple": (1, (2, 3)), 5: "int key",
           "nan": float("nan"), "empty": {}}
    ta.save(obj, tmp_path / "obj.ta")
    back = ta.load(str(tmp_path / "obj.ta"))
    assert list(back) == list(obj)
    state = back["optimizer"]
    assert list(state["state"]) == [0, 1, 2, 3]  # int parameter ids stay ints
    assert state["param_groups"][0]["betas"] == (0.8, 0.99) and isinstance(state["param_groups"][0]["betas"], tuple)
    assert state["param_groups"] == opt.state_dict()["param_groups"]
    for index, entry in opt.state_dict()["state"].items():
        for key, value in entry.items():
            np.testing.assert_array_equal(state["state"][index][key], value)
            assert type(state["state"][index][key]) is type(value)
    assert isinstance(back["t"], ta.Tensor) and back["t"].requires_grad and back["t"].dtype == np.float64
    np.testing.assert_array_equal(back["t"].numpy(), tensor.numpy())
    assert not back["frozen"].requires_grad and back["frozen"].dtype == np.int64
    assert type(back["scalar"]) is np.float32 and back["scalar"] == 2.5
    assert back["zero_d"].shape == () and back["zero_d"].dtype == np.int64 and back["zero_d"] == 7
    assert back["list"] == [1, 2.5, "x", None, True] and back["tuple"] == (1, (2, 3)) and back[5] == "int key"
    assert np.isnan(back["nan"]) and back["empty"] == {}


def test_loaded_arrays_are_writable_copies(tmp_path):
    weights = {"w": np.ones((2, 3), np.float32)}
    ta.save(weights, tmp_path / "w.ta")
    back = ta.load(tmp_path / "w.ta")
    back["w"][0, 0] = 5.0  # writable, and not the file's bytes
    assert ta.load(tmp_path / "w.ta")["w"][0, 0] == 1.0


def test_file_objects_work_as_with_torch():
    buffer = io.BytesIO()
    ta.save({"a": np.arange(4, dtype=np.int32)}, buffer)
    buffer.seek(0)
    back = ta.load(buffer)
    np.testing.assert_array_equal(back["a"], np.arange(4, dtype=np.int32))


def test_the_file_is_safetensors_that_torch_reads(tmp_path):
    from safetensors.torch import load_file

    ta.save({"fc.weight": np.full((2, 2), 3.0, np.float32)}, tmp_path / "w.safetensors")
    loaded = load_file(str(tmp_path / "w.safetensors"))
    assert torch.equal(loaded["obj['fc.weight']"], torch.full((2, 2), 3.0))


def test_a_plain_safetensors_file_loads_as_a_dict_of_tensors(tmp_path):
    from safetensors.numpy import save_file

    save_file({"embed": np.eye(3, dtype=np.float32), "ids": np.arange(3)}, str(tmp_path / "hf.safetensors"))
    back = ta.load(tmp_path / "hf.safetensors")
    assert sorted(back) == ["embed", "ids"] and all(isinstance(v, ta.Tensor) for v in back.values())
    np.testing.assert_array_equal(back["embed"].numpy(), np.eye(3, dtype=np.float32))


def test_a_bfloat16_tensor_of_another_writer_loads_widened_to_float32(tmp_path):
    # ta.load cast the widened float32 values back to the stored uint16 (dtype uint16, 16256 for 1.0, on 733c68b)
    from safetensors.torch import save_file

    values = torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16)
    save_file({"w": values}, str(tmp_path / "bf16.safetensors"))
    back = ta.load(tmp_path / "bf16.safetensors")["w"]
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back.numpy(), values.float().numpy())


def test_what_save_cannot_hold_is_refused_naming_where_it_is(tmp_path):
    model = ta.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"obj\['model'\] is a Linear \(save its state_dict\(\) instead\)"):
        ta.save({"model": model}, tmp_path / "m.ta")
    with pytest.raises(TypeError, match=r"obj\['fn'\]\[1\] is a function; ta.save holds Tensors"):
        ta.save({"fn": [1, lambda: 0]}, tmp_path / "m.ta")
    with pytest.raises(TypeError, match=r"obj has the key \(1, 2\) \(tuple\); dict keys must be str or int"):
        ta.save({(1, 2): 3}, tmp_path / "m.ta")
    with pytest.raises(ValueError, match=r"tensor \"obj\['a'\]\" has dtype object"):
        ta.save({"a": np.array(["x"], dtype=object)}, tmp_path / "m.ta")
    assert not (tmp_path / "m.ta").exists()  # refused before anything was written
    with pytest.raises(TypeError, match="f must be a path .* got int"):
        ta.save({}, 3)


def test_a_failed_save_keeps_the_file_there_before(tmp_path, monkeypatch):
    path = tmp_path / "keep.ta"
    ta.save({"v": 1}, path)
    before = path.read_bytes()

    def disk_full(f, arrays, metadata):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tensorarena.serialization.write_safetensors", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        ta.save({"v": 2}, path)
    assert path.read_bytes() == before
    assert ta.load(path) == {"v": 1}


def test_load_refuses_other_files_saying_what_they_are(tmp_path):
    torch_file = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, torch_file)
    with pytest.raises(ValueError, match="is a PyTorch file \\(torch.save\\).*torch.load"):
        ta.load(torch_file)
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("x.txt", "hello")
    with pytest.raises(ValueError, match="is a zip archive.*Pass a file ta.save wrote"):
        ta.load(archive)
    text = tmp_path / "notes.txt"
    text.write_text("hello there, this is no safetensors file")
    with pytest.raises(ValueError, match="not a safetensors file"):
        ta.load(text)
    with pytest.raises(FileNotFoundError, match="no file at"):
        ta.load(tmp_path / "missing.ta")
    with pytest.raises(ValueError, match="cuda"):
        ta.load(text, map_location="cuda")
