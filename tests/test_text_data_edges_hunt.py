"""Text, data and resume edges found by a hunt on 2026-12-06. Run against the commit before the one that added this
file (a worktree of it first on PYTHONPATH), all 5 tests failed (the asserts marked "control" held already):
- --resume left out --batch-size and --clip went back to the defaults without a word (a resumed run was another
  run: losses 2.29726, 2.27354, 2.24815 where the uninterrupted run had 2.29702, 2.27525, 2.28269);
- a tensor named "__metadata__" made write_safetensors write a file no reader can load;
- route="auto" with a tokenizer's Encoding failed naming "64 dimensions" and not the routes that take it;
- `tensorarena embed --model-dir` of a non-BERT config printed a traceback;
- Encoding[True] gave (1, B, T) arrays.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import cli
from tensorarena.compile.trace import UnsupportedInputError
from tensorarena.text.tokenizer import Encoding
from tensorarena.train.safetensors_io import write_safetensors
from tensorarena.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_simcse import _padded_id_batches, _small_simcse  # noqa: E402

MLP = ["--hidden", "16", "--train-size", "300", "--test-size", "100", "--no-progress"]


def _losses(tmp_path: Path, name: str, *argv: str) -> list[float]:
    out = tmp_path / f"{name}.json"
    assert cli.main(["train", *MLP, *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())["step_losses"]


def test_a_resume_keeps_the_runs_batch_size_and_clip(tmp_path):
    whole = _losses(tmp_path, "whole", "--steps", "6", "--batch-size", "32", "--clip", "0.01")
    first = _losses(tmp_path, "first", "--steps", "3", "--total-steps", "6", "--batch-size", "32", "--clip", "0.01",
                    "--save", str(tmp_path / "half.st"))
    rest = _losses(tmp_path, "rest", "--steps", "6", "--resume", str(tmp_path / "half.st"))
    assert first + rest == whole  # the same steps, bit for bit
    with pytest.raises(SystemExit, match="was trained with --batch-size 32, not --batch-size 64"):
        cli.main(["train", *MLP, "--steps", "6", "--resume", str(tmp_path / "half.st"), "--batch-size", "64"])


def test_a_tensor_named_like_the_metadata_key_is_refused_when_writing():
    with pytest.raises(ValueError, match="cannot be named '__metadata__'"):
        write_safetensors(io.BytesIO(), {"__metadata__": np.ones(3, np.float32)}, {"k": "v"})
    from safetensors.numpy import load

    f = io.BytesIO()  # control: any other name round-trips
    write_safetensors(f, {"metadata": np.arange(3, dtype=np.float32)}, {"k": "v"})
    np.testing.assert_array_equal(load(f.getvalue())["metadata"], np.arange(3, dtype=np.float32))


def _encoding() -> Encoding:
    ids = _padded_id_batches(1)[0]
    return Encoding(ids, (ids != 0).astype(np.int64), np.zeros_like(ids))


def _simcse_loss(route: str) -> float:
    from tensorarena.train.simcse_job import _model_loss

    model = _small_simcse(0.0, dtype=np.float64)
    trainer = Trainer(model, ta.optim.AdamW(model.parameters(), lr=1e-2), _model_loss, route=route)
    return trainer.step(_encoding(), None).loss


def test_route_auto_with_an_encoding_names_the_routes_that_take_it():
    with pytest.raises(UnsupportedInputError) as exc:
        _simcse_loss("auto")
    text = str(exc.value)
    assert "type Encoding" in text and "route='eager' or 'streaming'" in text and "64" not in text
    # and those two routes do take it, with the same step (control: this held before)
    assert abs(_simcse_loss("streaming") - _simcse_loss("eager")) <= 1e-12


def test_embed_of_a_model_dir_of_another_model_type_is_one_line(tmp_path):
    from tensorarena.text.tokenizer import MODEL_FILES, locate_minilm

    source = locate_minilm()
    for name in MODEL_FILES:
        shutil.copy(source / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(SystemExit) as exc:
        cli.main(["embed", "--model-dir", str(tmp_path), "hello"])
    assert str(exc.value.code).startswith(f"tensorarena embed: --model-dir {tmp_path} cannot be used: config has "
                                          f"model_type 'roberta'")


def test_an_encoding_refuses_a_bool_index_and_keeps_rows_for_an_int():
    enc = _encoding()
    with pytest.raises(TypeError, match="indexed by row"):
        enc[True]
    assert enc[1].input_ids.shape == (1, enc.input_ids.shape[1])  # control
