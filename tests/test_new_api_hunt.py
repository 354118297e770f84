"""A hunt of the APIs added on 2026-12-07 (ta.save/ta.load, tensorarena.utils.data, RMSNorm, eye/empty,
Embedding.from_pretrained, SIGTERM) against torch 2.13.0 and their docstrings.

On 46fdccd all 18 tests here fail: `git archive 46fdccd | tar -x -C /tmp/base && cp tests/test_new_api_hunt.py
/tmp/base/tests/ && cd /tmp/base && PYTHONPATH=/tmp/base python -m pytest -q -p no:cacheprovider
tests/test_new_api_hunt.py` (run from the base's own tree: pytest run here imports this worktree's engine).
"""

from __future__ import annotations

import io
import json
import re
import struct
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import tensorarena as ta
from tensorarena.utils.data import DataLoader, TensorDataset, default_collate

README = Path(__file__).resolve().parent.parent / "README.md"


# -- ta.save / ta.load ---------------------------------------------------------------------------------------------


def test_text_mode_file_objects_are_refused_saying_to_open_them_binary(tmp_path):
    path = tmp_path / "a.ta"
    ta.save({"x": np.arange(3.0)}, path)
    # before: a UnicodeDecodeError (utf-8) or "a bytes-like object is required, not 'str'" (latin-1)
    for encoding in ("utf-8", "latin-1"):
        with open(path, encoding=encoding) as f, pytest.raises(TypeError, match=r"text mode.*open\(path, 'rb'\)"):
            ta.load(f)
    # before: "write() argument must be str, not bytes"
    with open(tmp_path / "b.ta", "w") as f, pytest.raises(TypeError, match=r"text mode.*open\(path, 'wb'\)"):
        ta.save({"x": np.arange(3.0)}, f)


def _file(path: Path, header: dict) -> Path:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
    return path


def _saved(tree) -> dict:
    return {"tensorarena.save": json.dumps(tree) if not isinstance(tree, str) else tree}


@pytest.mark.parametrize("header", [
    {"x": [1, 2]},  # an entry that is no object: AttributeError 'list' object has no attribute 'get'
    {"__metadata__": "x"},  # metadata that is no object: AttributeError
    {"__metadata__": _saved("{not json")},  # JSONDecodeError
    {"__metadata__": _saved({"version": 1})},  # KeyError 'tree'
    {"__metadata__": _saved({"version": 1, "tree": {"tensor": "gone", "requires_grad": False}})},  # KeyError
    {"__metadata__": _saved({"version": 1, "tree": {"set": [1]}})},  # KeyError 'tuple'
], ids=["entry", "metadata", "json", "no-tree", "missing-tensor", "unknown-node"])
def test_a_damaged_file_is_a_value_error_naming_it(tmp_path, header):
    path = _file(tmp_path / "damaged.ta", header)
    with pytest.raises(ValueError, match=re.escape(str(path))) as caught:
        ta.load(path)
    assert re.search("damaged|corrupt", str(caught.value)), caught.value
    with open(path, "rb") as f, pytest.raises(ValueError, match=re.escape(str(path))):  # a file object too
        ta.load(f)
    with pytest.raises(ValueError, match="the file object"):
        ta.load(io.BytesIO(path.read_bytes()))


def test_loading_a_directory_says_it_is_one(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):  # before: FileNotFoundError "no file at"
        ta.load(tmp_path)


def test_a_torch_tensor_is_refused_as_pytorchs_saying_what_to_save(tmp_path):
    # before: "obj['w'] is a Tensor; ta.save holds Tensors, ..." (which Tensor, and why not, unsaid)
    with pytest.raises(TypeError, match=r"obj\['w'\] is a Tensor from PyTorch.*numpy\(\)"):
        ta.save({"w": torch.ones(2)}, tmp_path / "t.ta")


def test_numpy_integer_keys_come_back_as_ints_as_torch_load_gives_them(tmp_path):
    keys = np.unique(np.array([3, 1, 3]))  # np.int64 keys: torch.save keeps them
    obj = {key: float(key) for key in keys}
    torch.save(obj, tmp_path / "t.pt")
    theirs = torch.load(tmp_path / "t.pt", weights_only=False)
    ta.save(obj, tmp_path / "a.ta")  # before: TypeError "dict keys must be str or int"
    ours = ta.load(tmp_path / "a.ta")
    assert ours == {int(k): v for k, v in theirs.items()} == {1: 1.0, 3: 3.0}
    assert all(type(k) is int for k in ours)


# -- tensorarena.utils.data ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [[1, 2.5], [2, 0.25, 7], [True, 2]])
def test_default_collate_of_mixed_numbers_is_torchs(batch):
    ours, theirs = default_collate(batch), tud.default_collate(batch)
    # before: [1, 2.5] collated to int64 [1, 2], the 0.5 lost
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert ours.numpy().dtype == theirs.numpy().dtype


def test_default_collate_keeps_a_namedtuple():
    Sample = namedtuple("Sample", "x label")
    rows = [Sample(np.full(2, i, np.float32), i) for i in range(3)]
    ours, theirs = default_collate(rows), tud.default_collate(rows)
    assert type(ours) is Sample and type(theirs) is Sample  # before: a list
    np.testing.assert_array_equal(ours.x.numpy(), theirs.x.numpy())
    np.testing.assert_array_equal(ours.label.numpy(), theirs.label.numpy())
    batch = next(iter(DataLoader(rows, batch_size=2)))
    assert type(batch) is Sample and batch.label.numpy().tolist() == [0, 1]


def test_default_collate_keeps_the_graph_of_tensors_that_require_grad():
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(3) for _ in range(4)]
    ours = [ta.tensor(v, requires_grad=True) for v in values]
    theirs = [torch.tensor(v, requires_grad=True) for v in values]
    weights = rng.standard_normal((4, 3))
    batch = default_collate([(t, i) for i, t in enumerate(ours)])[0]
    assert batch.requires_grad  # before: False, and the grads below None
    (batch * ta.tensor(weights)).sum().backward()
    (tud.default_collate([(t, i) for i, t in enumerate(theirs)])[0] * torch.tensor(weights)).sum().backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=0, atol=1e-15)


def test_drop_last_without_batching_is_refused_as_torch_refuses_it():
    data = TensorDataset(np.arange(5.0))
    with pytest.raises(ValueError) as theirs:
        tud.DataLoader(tud.TensorDataset(torch.arange(5.0)), batch_size=None, drop_last=True)
    with pytest.raises(ValueError, match="mutually exclusive with drop_last") as ours:  # before: accepted, ignored
        DataLoader(data, batch_size=None, drop_last=True)
    assert str(ours.value) == str(theirs.value)


# -- nn.Embedding.from_pretrained, README ---------------------------------------------------------------------------


def test_from_pretrained_of_a_python_list_is_float32_as_torchs():
    table = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]
    ours = ta.nn.Embedding.from_pretrained(table)
    theirs = torch.nn.Embedding.from_pretrained(torch.tensor(table))
    assert ours.weight.dtype == np.float32 and theirs.weight.dtype == torch.float32  # before: float64 here
    np.testing.assert_array_equal(ours.weight.data, theirs.weight.detach().numpy())
    assert not ours.weight.requires_grad
    # a float64 array stays float64, as torch.from_numpy's
    assert ta.nn.Embedding.from_pretrained(np.array(table)).weight.dtype == np.float64


def test_readme_does_not_list_what_is_here_as_missing():
    text = README.read_text()
    missing = text[text.index("- Not here (yet)"):]
    missing = missing[:missing.index("\n- ") if "\n- " in missing else missing.index("\n\n")]
    for name, present in [("RMSNorm", ta.nn.RMSNorm), ("`ta.empty`", ta.empty), ("`ta.eye`", ta.eye),
                          ("torch.save", ta.save), ("TransformerEncoderLayer", ta.nn.TransformerEncoderLayer),
                          ("BatchNorm", ta.nn.BatchNorm1d), ("GroupNorm", ta.nn.GroupNorm)]:
        assert present is not None and name not in missing, f"README lists {name} as not here: {missing}"
