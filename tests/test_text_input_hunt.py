"""Bad text input to the tokenizer and `embed`, and the tokenizer shared across threads (a hunt of 2026-12-07).

The hunt found the ids and the vectors equal to Hugging Face's on 145 adversarial strings; these are what it found
wrong around them. Before: a lone surrogate (Python's stand-in for a non-UTF-8 byte in sys.argv, a Latin-1 "café")
raised the tokenizers library's "TextEncodeInput must be Union[...]", and `tensorarena embed` a traceback; bytes
were split into ints and an int blamed; two threads asking for different max_length cut each other's rows (the
truncation is state of the one tokenizer embed caches); embed(max_length=None) failed comparing None with an int.
Run on the commit before the one that added this file (a worktree of it first on PYTHONPATH), all 7 cases failed
(the thread test with 158 rows cut at the other thread's length).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tensorarena.embed import embed
from tensorarena.text import WordPieceTokenizer, locate_minilm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(locate_minilm())


def test_a_lone_surrogate_is_named_with_its_text_and_position(tokenizer):
    with pytest.raises(ValueError, match=r"texts\[1\] is not valid Unicode: a lone surrogate '\\udce9' at position 3"):
        tokenizer(["ok", "caf\udce9"])
    with pytest.raises(ValueError, match=r"texts\[0\] is not valid Unicode"):
        embed(["caf\udce9"])


def test_the_cli_says_a_non_utf8_argument_in_one_line():
    # A Latin-1 byte in argv reaches Python as a lone surrogate (os.fsdecode's surrogateescape).
    run = subprocess.run([sys.executable, "-m", "tensorarena", "embed", "ok", os.fsdecode(b"caf\xe9")],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("tensorarena embed: texts[1] is not valid Unicode")


@pytest.mark.parametrize("value", [b"hello", bytearray(b"hello"), memoryview(b"hello")],
                         ids=["bytes", "bytearray", "memoryview"])
def test_bytes_are_refused_as_bytes(tokenizer, value):
    with pytest.raises(TypeError, match=f"texts must be str, got {type(value).__name__}; decode it first"):
        tokenizer(value)


class _SlowEncoding:
    """The tokenizers library's Tokenizer with a pause inside encode_batch, where the race's window was (another
    thread's enable_truncation landing between this call's and its encode): seen every run, not once in a while."""

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def encode_batch(self, texts):
        time.sleep(0.001)
        return self._tok.encode_batch(texts)


def test_threads_asking_for_different_lengths_get_their_own():
    tokenizer = WordPieceTokenizer(locate_minilm())
    tokenizer._tok = _SlowEncoding(tokenizer._tok)
    text = "word " * 100
    wrong = []

    def ask(limit):
        for _ in range(100):
            width = tokenizer([text], max_length=limit).input_ids.shape[1]
            if width != limit:
                wrong.append((limit, width))

    threads = [threading.Thread(target=ask, args=(limit,)) for limit in (4, 64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_embed_takes_max_length_none_as_the_tokenizer_s_default_and_refuses_a_string():
    default = embed(["hello world"], max_length=None)
    np.testing.assert_allclose(default, embed(["hello world"]), rtol=0, atol=1e-6)
    with pytest.raises(TypeError, match="max_length must be an integer, got str '128'"):
        embed(["hello"], max_length="128")
