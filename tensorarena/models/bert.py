"""BERT encoder, following Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional
Transformers for Language Understanding" (arXiv:1810.04805), as Hugging Face's BertModel computes it:
word + position + token-type embeddings -> LayerNorm -> dropout, then post-norm transformer
blocks (erf GELU). Returns the last hidden state; the pooler is left out (sentence embeddings
use mean pooling, nn.mean_pool).

Checkpoints are exchanged by name with the Hugging Face layout (`load_hf_state_dict`,
`to_hf_state_dict`, `BertModel.from_pretrained` / `save_pretrained`, config.json field names),
so e.g. sentence-transformers' all-MiniLM-L6-v2 model.safetensors loads directly. Our own
parameter names differ in one way that matters: query/key/value are one fused `attn.qkv`
Linear, whose weight rows are [query; key; value].

The streaming route (tensorarena.stream) cuts the encoder into the embeddings and each layer
(`encoder_stages`); every stage reads the attention mask and token types as side inputs, computed
once per step by `encoder_inputs` exactly as forward computes them, so a padded batch streams as it
trains eagerly. Models built on the encoder (SimCSE, a classifier) append their head to the last stage.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from ..nn import Dropout, Embedding, LayerNorm, Linear, Module, TransformerBlock, init
from ..nn.module import _as_array
from ..ops._base import count_up, new
from ..tape import host
from ..tensor import Tensor

_HIDDEN_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class BertConfig:
    """BERT sizes and options; field names are those of a Hugging Face config.json. Defaults: BERT-base."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    hidden_act: str = "gelu"
    initializer_range: float = 0.02
    pad_token_id: int | None = 0  # None: no padding row in the word embeddings (config.json's null, as transformers)
    dtype: type = field(default=np.float32)  # ours, not read from config.json

    def __post_init__(self) -> None:
        sizes = dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                     num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                     intermediate_size=self.intermediate_size, max_position_embeddings=self.max_position_embeddings,
                     type_vocab_size=self.type_vocab_size)
        bad = {k: v for k, v in sizes.items() if not isinstance(v, (int, np.integer)) or v <= 0}
        if bad:
            raise ValueError(f"BertConfig sizes must be positive integers, got {bad}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.hidden_act not in _HIDDEN_ACT:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; use one of {sorted(_HIDDEN_ACT)}")
        pad = self.pad_token_id
        if pad is not None and not (isinstance(pad, (int, np.integer)) and not isinstance(pad, (bool, np.bool_))
                                    and 0 <= pad < self.vocab_size):
            raise ValueError(f"pad_token_id must be a token id in the vocabulary [0, {self.vocab_size}) or None (no "
                             f"padding row), got {pad!r}")
        if np.dtype(self.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {np.dtype(self.dtype)}")

    @classmethod
    def from_json(cls, path_or_dict: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> "BertConfig":
        """A config from a Hugging Face config.json (a file, its directory, or the parsed dict); unknown keys are ignored."""
        if isinstance(path_or_dict, Mapping):
            raw = dict(path_or_dict)
        else:
            path = os.fspath(path_or_dict)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        model_type = raw.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"config has model_type {model_type!r}; BertModel loads 'bert' checkpoints only")
        pos_type = raw.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ValueError(f"position_embedding_type {pos_type!r} is not supported (only 'absolute')")
        names = {f.name for f in fields(cls)} - {"dtype"}
        # A null means "the default" for a size, but for pad_token_id it means "none" (transformers builds the
        # embedding without a padding row; the default 0 froze row 0's gradient where transformers trains it).
        kwargs = {k: v for k, v in raw.items() if k in names and (v is not None or k == "pad_token_id")}
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_json_dict(self) -> dict[str, Any]:
        """The Hugging Face config.json contents for this config."""
        out = {k: v for k, v in asdict(self).items() if k != "dtype"}
        out.update(model_type="bert", architectures=["BertModel"], position_embedding_type="absolute")
        return out


class BertEmbeddings(Module):
    """word + position + token-type embeddings, LayerNorm, dropout. Shape: int (B, T) -> (B, T, hidden)."""

    def __init__(self, config: BertConfig, *, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        c, dt = config, config.dtype
        self.word_embeddings = Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id, rng=rng, dtype=dt)
        self.position_embeddings = Embedding(c.max_position_embeddings, c.hidden_size, rng=rng, dtype=dt)
        self.token_type_embeddings = Embedding(c.type_vocab_size, c.hidden_size, rng=rng, dtype=dt)
        self.norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, dtype=dt)
        self.drop = Dropout(c.hidden_dropout_prob, rng=rng)

    def forward(self, input_ids: np.ndarray, token_type_ids: np.ndarray) -> Tensor:
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids)  # (B, T, hidden)
        positions = new((T,), np.int64)  # an arena buffer, not a heap array: a captured fused step reads it too
        host(count_up, positions)
        x = x + self.position_embeddings(positions)  # (T, hidden), broadcast over the batch
        x = x + self.token_type_embeddings(token_type_ids)
        return self.drop(self.norm(x))


class BertModel(Module):
    """BERT encoder. forward(input_ids (B, T), attention_mask (B, T) 1 = token / 0 = padding, token_type_ids) -> (B, T, hidden)."""

    def __init__(self, config: BertConfig, *, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embeddings = BertEmbeddings(c, rng=rng)
        self.layers = [TransformerBlock(c.hidden_size, c.num_attention_heads, norm_first=False,
                                        activation=_HIDDEN_ACT[c.hidden_act], eps=c.layer_norm_eps,
                                        dropout=c.hidden_dropout_prob,
                                        attention_dropout=c.attention_probs_dropout_prob,
                                        mlp_dim=c.intermediate_size, rng=rng, dtype=c.dtype)
                       for _ in range(c.num_hidden_layers)]
        self.reset_parameters(rng=rng)

    def reset_parameters(self, *, rng: np.random.Generator | None = None) -> None:
        """BERT's init: N(0, initializer_range) weights and embeddings, zero biases, padding row zero."""
        gen = init.get_generator(rng)
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, Linear):
                init.normal_(m.weight, 0.0, std, rng=gen)
                if m.bias is not None:
                    init.zeros_(m.bias)
            elif isinstance(m, Embedding):
                init.normal_(m.weight, 0.0, std, rng=gen)
                if m.padding_idx is not None:
                    m.weight.data[m.padding_idx] = 0
            elif isinstance(m, LayerNorm):
                init.ones_(m.weight)
                init.zeros_(m.bias)

    def encoder_inputs(self, input_ids, attention_mask=None, token_type_ids=None) -> tuple[np.ndarray, dict]:
        """The checked token ids and what every layer reads besides the hidden states, as forward computes them.

        Returns (ids (B, T), side) with side {"padding": (B, T) bool, True = padding (not attended), or None
        without a mask; "token_type_ids": (B, T) int}. forward and the streaming route both start here, so
        a streamed step masks exactly what an eager one masks.
        """
        if hasattr(input_ids, "input_ids") and hasattr(input_ids, "attention_mask"):
            # A tokenizer's Encoding as the whole batch (what a Trainer hands the model): its mask and token
            # types are used, as transformers' model(**encoding); passing them again as well is ambiguous.
            if attention_mask is not None or token_type_ids is not None:
                raise TypeError("input_ids is an Encoding, which carries its own attention_mask and "
                                "token_type_ids: pass the Encoding alone, or its arrays one by one")
            enc = input_ids
            input_ids, attention_mask = enc.input_ids, enc.attention_mask
            token_type_ids = getattr(enc, "token_type_ids", None)
        ids = _int_array(input_ids, "input_ids")
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, T), got shape {ids.shape}")
        B, T = ids.shape
        c = self.config
        if T > c.max_position_embeddings:
            raise ValueError(f"sequence of {T} tokens is longer than max_position_embeddings "
                             f"{c.max_position_embeddings}; truncate the input")
        if token_type_ids is None:
            token_type_ids = new((B, T), np.int64)  # in the arena, as `positions` in BertEmbeddings
            host(token_type_ids.fill, 0)
        else:
            token_type_ids = _int_array(token_type_ids, "token_type_ids")
            if token_type_ids.shape != (B, T):
                raise ValueError(f"token_type_ids shape {token_type_ids.shape} must equal input_ids' {(B, T)}")
        padding = None
        if attention_mask is not None:
            mask = attention_mask.data if isinstance(attention_mask, Tensor) else np.asarray(attention_mask)
            if mask.shape != (B, T):
                raise ValueError(f"attention_mask shape {mask.shape} must equal input_ids' {(B, T)}")
            # (B, T), True = do not attend. Passed on even when nothing is padding: skipping the mask for such
            # a batch was a branch on the data's values, which a captured fused step would have kept for
            # every later batch (compile/captured.py). The comparison is an arena buffer written through
            # tape.host, so a recording computes it again from each batch's mask.
            padding = new((B, T), np.bool_)
            host(np.equal, mask, 0, out=padding)
        return ids, {"padding": padding, "token_type_ids": token_type_ids}

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        """input_ids (B, T) with the optional mask and token types, or a tokenizer's Encoding alone (its mask
        and token types used: a Trainer passes the batch as the one argument)."""
        ids, side = self.encoder_inputs(input_ids, attention_mask, token_type_ids)
        x = self.embeddings(ids, side["token_type_ids"])  # (B, T, hidden)
        for layer in self.layers:
            x = layer(x, side["padding"])
        return x

    # -- the streaming route ----------------------------------------------------------------------
    def stream_inputs(self, batch) -> tuple[np.ndarray, dict]:
        """Stage 0's input and the side inputs of model(batch), batch being input_ids as forward takes them."""
        return self.encoder_inputs(batch)

    def stream_stages(self) -> list:
        """The cut for the streaming route: the embeddings, then each layer (see encoder_stages)."""
        return self.encoder_stages()

    def encoder_stages(self, *, head: Callable[[Tensor, dict], Tensor] | None = None, head_params: tuple = (),
                       prefix: str = "") -> list:
        """Stages computing forward (then `head`) from encoder_inputs' (ids, side): embeddings, layers.0, ....

        Each stage reads the side inputs (stream.stages.SideForward), so every layer gets the attention mask.
        head(hidden (B, T, hidden), side) -> outputs runs in the last layer's stage, whose parameters
        `head_params` join: a model built on the encoder passes its pooling/loss/classifier there, with its own
        entries added to side by its stream_inputs. `prefix` goes before the stage names (the encoder's
        attribute name in that model).
        """
        from ..stream.stages import SideForward, Stage  # lazy: models load without the streaming machinery

        reads = "the attention mask and token types (BertModel.encoder_inputs)"
        stages = [Stage(f"{prefix}embeddings", tuple(self.embeddings.parameters()),
                        SideForward(self._embed_stage, reads=reads))]
        *inner, last = self.layers
        for i, layer in enumerate(inner):
            stages.append(Stage(f"{prefix}layers.{i}", tuple(layer.parameters()),
                                SideForward(_LayerStage(layer), reads=reads)))
        stages.append(Stage(f"{prefix}layers.{len(inner)}", tuple(last.parameters()) + tuple(head_params),
                            SideForward(_LayerStage(last, head), reads=reads)))
        return stages

    def _embed_stage(self, ids, side: dict) -> Tensor:
        return self.embeddings(_int_array(ids, "input_ids"), side["token_type_ids"])  # (B, T, hidden)

    # -- Hugging Face checkpoints -------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike, *, rng: np.random.Generator | None = None,
                        **config_overrides: Any) -> "BertModel":
        """Build from a Hugging Face model directory: config.json + model.safetensors (BERT layout)."""
        from ..train.safetensors_io import read_safetensors

        model_dir = os.fspath(model_dir)
        config = BertConfig.from_json(os.path.join(model_dir, "config.json"), **config_overrides)
        weights = os.path.join(model_dir, "model.safetensors")
        if not os.path.exists(weights):
            raise FileNotFoundError(f"{weights} not found; from_pretrained reads safetensors only "
                                    f"(convert a pytorch_model.bin with safetensors.torch.save_file)")
        model = cls(config, rng=rng)
        load_hf_state_dict(model, read_safetensors(weights))  # mapped, bfloat16 widened to float32
        return model

    def save_pretrained(self, directory: str | os.PathLike, *, extra: dict[str, np.ndarray] | None = None) -> None:
        """Write config.json and model.safetensors in the Hugging Face layout (from_pretrained reads them back).

        extra: tensors this model does not hold to write beside its own (a pooler carried over from the source
        checkpoint), in the same single write: adding them afterwards meant reading the whole file back."""
        from ..train.safetensors_io import write_safetensors

        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
            json.dump(self.config.to_json_dict(), f, indent=2)
        # Views of the weights, written one by one: safetensors' save_file (and to_hf_state_dict's copies) held the
        # model two more times over while saving, more than a streamed run's budget leaves.
        tensors = dict(_hf_views(self))
        clash = sorted(set(tensors) & set(extra or {}))
        if clash:
            raise ValueError(f"save_pretrained: extra tensors {clash[:4]} are the model's own; pass only others")
        tensors.update(extra or {})
        with open(os.path.join(directory, "model.safetensors"), "wb") as f:
            write_safetensors(f, tensors)


class _LayerStage:
    """One encoder layer as a streaming stage: layer(x, padding), then the model's head if it is the last."""

    def __init__(self, layer: TransformerBlock, head: Callable[[Tensor, dict], Tensor] | None = None) -> None:
        self.layer, self.head = layer, head

    def __call__(self, x: Tensor, side: dict) -> Tensor:
        x = self.layer(x, side["padding"])  # (B, T, hidden)
        return x if self.head is None else self.head(x, side)


def _int_array(x, what: str) -> np.ndarray:
    arr = x.data if isinstance(x, Tensor) else np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integer token ids, got dtype {arr.dtype}")
    return arr


# -- name mapping ------------------------------------------------------------------------------

_QKV = ("query", "key", "value")


def _name_map(num_layers: int) -> list[tuple[str, tuple[str, ...]]]:
    """(our state_dict key, the Hugging Face keys it is made of), in our order."""
    pairs: list[tuple[str, tuple[str, ...]]] = [
        ("embeddings.word_embeddings.weight", ("embeddings.word_embeddings.weight",)),
        ("embeddings.position_embeddings.weight", ("embeddings.position_embeddings.weight",)),
        ("embeddings.token_type_embeddings.weight", ("embeddings.token_type_embeddings.weight",)),
        ("embeddings.norm.weight", ("embeddings.LayerNorm.weight",)),
        ("embeddings.norm.bias", ("embeddings.LayerNorm.bias",)),
    ]
    for i in range(num_layers):
        ours, hf = f"layers.{i}.", f"encoder.layer.{i}."
        for kind in ("weight", "bias"):
            pairs.append((ours + f"attn.qkv.{kind}", tuple(hf + f"attention.self.{n}.{kind}" for n in _QKV)))
        for our_name, hf_name in (("norm1", "attention.output.LayerNorm"), ("attn.proj", "attention.output.dense"),
                                  ("norm2", "output.LayerNorm"), ("mlp.fc1", "intermediate.dense"),
                                  ("mlp.fc2", "output.dense")):
            for kind in ("weight", "bias"):
                pairs.append((ours + f"{our_name}.{kind}", (hf + f"{hf_name}.{kind}",)))
    return pairs


def _ignored(key: str) -> bool:
    """Hugging Face tensors BertModel has no use for: the pooler and the position_ids buffer."""
    return key.startswith("pooler.") or key == "embeddings.position_ids"


class HFLoadReport(NamedTuple):
    """What load_hf_state_dict skipped on purpose (pooler, position_ids, heads outside 'bert.'), and, with
    strict=False, the model's tensors the checkpoint lacked (left as they were) and the checkpoint's it could not
    place: torch's missing_keys and unexpected_keys, under the checkpoint's names."""

    ignored: list[str]
    missing: list[str] = []
    unexpected: list[str] = []


# Old BERT checkpoints (google-bert/bert-base-uncased's own model.safetensors among them) name LayerNorm's weight and
# bias "gamma" and "beta", as TensorFlow did; transformers renames them on load, and so does load_hf_state_dict.
_LEGACY_NORM_NAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def _modern_names(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with legacy LayerNorm gamma/beta keys under today's names; an error if a key has both."""
    out = {}
    for key, value in body.items():
        for legacy, today in _LEGACY_NORM_NAMES.items():
            if key.endswith("." + legacy):
                modern = key[:-len(legacy)] + today
                if modern in body:
                    raise CheckpointMismatchError(f"the checkpoint holds both {key} and {modern}, the old and the new "
                                                  f"name of one LayerNorm tensor; keep one", [], [key], [])
                key = modern
                break
        out[key] = value
    return out


class CheckpointMismatchError(RuntimeError):
    """A Hugging Face BERT checkpoint does not fit the model; lists every problem found."""

    def __init__(self, message: str, missing: list[str], unexpected: list[str],
                 mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> None:
        super().__init__(message)
        self.missing = missing
        self.unexpected = unexpected
        self.mismatched = mismatched


def load_hf_state_dict(model: BertModel, tensors: Mapping[str, Any], *, strict: bool = True) -> HFLoadReport:
    """Copy Hugging Face BERT tensors into `model` by name, fusing query/key/value into attn.qkv.

    Accepts the bare BertModel layout or one under a "bert." prefix (e.g. BertForMaskedLM; its
    heads outside the prefix are ignored, as are pooler.* and embeddings.position_ids). Every
    missing, unexpected and shape-mismatched tensor is collected and raised together in a
    CheckpointMismatchError, and nothing is copied unless all fits. strict=False tolerates
    missing and unexpected tensors (the model keeps its values there) but never a shape mismatch.
    """
    ignored: list[str] = []
    if any(k.startswith("bert.") for k in tensors):
        body = {}
        for k, v in tensors.items():
            if k.startswith("bert."):
                body[k[len("bert."):]] = v
            else:
                ignored.append(k)
    else:
        body = dict(tensors)
    body = _modern_names(body)
    ignored += [k for k in body if _ignored(k)]

    params = dict(model.named_parameters(remove_duplicate=False))  # a shared layer: one key per path
    consumed: set[str] = set()
    missing: list[str] = []
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    ours: dict[str, np.ndarray] = {}
    for our_key, hf_keys in _name_map(model.config.num_hidden_layers):
        target = params[our_key].shape
        # a fused qkv entry is three HF tensors stacked along the rows
        part = (target[0] // len(hf_keys),) + tuple(target[1:])
        parts = []
        for hf_key in hf_keys:
            if hf_key not in body:
                missing.append(hf_key)
                continue
            consumed.add(hf_key)
            arr = _as_array(body[hf_key])
            if tuple(arr.shape) != part:
                mismatched.append((hf_key, tuple(arr.shape), part))
            else:
                parts.append(arr)
        if len(parts) == len(hf_keys):
            ours[our_key] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    unexpected = sorted(k for k in body if k not in consumed and not _ignored(k))

    if mismatched or (strict and (missing or unexpected)):
        c = model.config
        lines = [f"the checkpoint does not fit BertModel(hidden_size={c.hidden_size}, "
                 f"num_hidden_layers={c.num_hidden_layers}, intermediate_size={c.intermediate_size}, "
                 f"vocab_size={c.vocab_size}, max_position_embeddings={c.max_position_embeddings}, "
                 f"type_vocab_size={c.type_vocab_size}):"]
        if missing:
            lines.append(f"  {len(missing)} missing: " + ", ".join(missing))
        if unexpected:
            lines.append(f"  {len(unexpected)} unexpected: " + ", ".join(unexpected))
        if mismatched:
            lines.append(f"  {len(mismatched)} shape mismatches: " + ", ".join(
                f"{k} is {s} in the checkpoint but {t} in the model" for k, s, t in mismatched))
        lines.append("Check that the config (config.json) belongs to this checkpoint.")
        raise CheckpointMismatchError("\n".join(lines), missing, unexpected, mismatched)
    model.load_state_dict(ours, strict=strict)
    return HFLoadReport(ignored=sorted(ignored), missing=missing, unexpected=unexpected)


def to_hf_state_dict(model: BertModel, *, prefix: str = "") -> "OrderedDict[str, np.ndarray]":
    """The model's weights under Hugging Face BertModel names (qkv split back into query/key/value); copies.

    prefix: e.g. "bert." for the layout of BertFor* checkpoints. The pooler is not included.
    """
    return OrderedDict((key, np.array(piece, order="C", copy=True)) for key, piece in _hf_views(model, prefix))


def _hf_views(model: BertModel, prefix: str = ""):
    """(Hugging Face name, a view of our array) for every weight: qkv's rows split into three views, no copy."""
    params = dict(model.named_parameters(remove_duplicate=False))  # a shared layer: one key per path
    for our_key, hf_keys in _name_map(model.config.num_hidden_layers):
        arr = params[our_key].data
        for hf_key, piece in zip(hf_keys, np.split(arr, len(hf_keys), axis=0)):
            yield prefix + hf_key, piece


__all__ = ["BertConfig", "BertModel", "BertEmbeddings", "load_hf_state_dict", "to_hf_state_dict",
           "HFLoadReport", "CheckpointMismatchError"]
