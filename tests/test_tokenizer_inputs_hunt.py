"""WordPieceTokenizer and Encoding refuse inputs they would have turned into wrong rows or bare errors.

Found by a helper's hunt of tensorarena/text against Hugging Face's tokenizer (ids, masks, type ids, truncation
and decode all matched it on 33 odd strings; these are the inputs around them):
- Encoding[None] gave (1, B, T) arrays and Encoding[(i, j)] one 0-d id, where an Encoding is (B, T) everywhere;
- a set of texts was tokenized in hash order, another in every process (Hugging Face refuses a set);
- a cut-short tokenizer.json raised a bare Exception naming no file, and `tensorarena embed` printed a traceback;
- decode() of one row as a Tensor (ours or torch's) said "decode a batch row by row", which then failed too;
- max_length=2**64 and decode([-1]) came back as an OverflowError naming no argument.

On 59aa01a 18 of the 19 fail (test_encoding_rows_keep_their_shape, the indexes that still work, passes):
    git worktree add /tmp/wt 59aa01a && cp tests/test_tokenizer_inputs_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_tokenizer_inputs_hunt.py)
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.text import WordPieceTokenizer, locate_minilm


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(locate_minilm())


@pytest.mark.parametrize("index", [None, (0, 1), Ellipsis, np.zeros((1, 2), np.int64), [[0, 1]], 1.0, "0"],
                         ids=["none", "tuple", "ellipsis", "2d_array", "nested_list", "float", "str"])
def test_encoding_refuses_indexes_that_are_not_rows(tokenizer, index):
    enc = tokenizer(["a b c", "x"])
    with pytest.raises(TypeError, match="indexed by row"):
        enc[index]


def test_encoding_rows_keep_their_shape(tokenizer):
    enc = tokenizer(["a b c", "x", "y z"])
    for index, rows in ((1, [1]), (-1, [2]), (slice(0, 2), [0, 1]), ([2, 0], [2, 0]),
                        (np.array([True, False, True]), [0, 2]), (np.array([], np.int64), []), ([], [])):
        part = enc[index]
        assert part.input_ids.shape == (len(rows), enc.input_ids.shape[1]), index
        np.testing.assert_array_equal(part.input_ids, enc.input_ids[rows])
        np.testing.assert_array_equal(part.attention_mask, enc.attention_mask[rows])


@pytest.mark.parametrize("texts", [{"apple", "zebra", "mango"}, frozenset({"a", "b"}), {"a": 1, "b": 2}],
                         ids=["set", "frozenset", "dict"])
def test_unordered_texts_are_refused(tokenizer, texts):
    with pytest.raises(TypeError, match="order is not kept"):
        tokenizer(texts)


def test_a_broken_tokenizer_json_is_named(tmp_path):
    source = locate_minilm()
    for name in ("model.safetensors", "config.json"):
        os.symlink(source / name, tmp_path / name)
    (tmp_path / "tokenizer.json").write_text((source / "tokenizer.json").read_text()[:1000])  # cut short
    with pytest.raises(ValueError, match="tokenizer.json is not a tokenizer.json") as err:
        WordPieceTokenizer(tmp_path)
    assert str(tmp_path) in str(err.value)
    run = subprocess.run([sys.executable, "-m", "tensorarena", "embed", "--model-dir", str(tmp_path), "hello"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "is not a tokenizer.json" in run.stderr.strip().splitlines()[-1]


def test_decode_takes_one_row_as_any_array(tokenizer):
    import torch

    ids = tokenizer("hello world").input_ids[0]
    assert tokenizer.decode(list(ids)) == "hello world"
    assert tokenizer.decode(ids) == "hello world"
    assert tokenizer.decode(ta.Tensor(ids)) == "hello world"
    assert tokenizer.decode(torch.from_numpy(ids)) == "hello world"
    with pytest.raises(TypeError, match="row by row"):
        tokenizer.decode(tokenizer(["a", "b"]).input_ids)
    with pytest.raises(TypeError, match="integer token ids"):
        tokenizer.decode(ids.astype(np.float32))


@pytest.mark.parametrize("call, name", [
    (lambda tok: tok("hi", max_length=2**64), "max_length"),
    (lambda tok: WordPieceTokenizer(locate_minilm(), max_length=2**64), "max_length"),
    (lambda tok: tok("hi", pad_to=2**64), "pad_to"),
    (lambda tok: tok.decode([-1]), "item 0 is -1"),
    (lambda tok: tok.decode([5, 2**64]), "item 1 is 18446744073709551616"),
    (lambda tok: tok.decode([tok.vocab_size]), "not a token id"),
], ids=["call_max_length", "init_max_length", "pad_to", "negative_id", "huge_id", "past_vocab"])
def test_out_of_range_integers_are_named(tokenizer, call, name):
    with pytest.raises(ValueError, match=name):
        call(tokenizer)
