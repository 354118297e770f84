"""Unsupervised SimCSE: contrastive sentence embeddings from dropout noise.

Gao, Yao & Chen, "SimCSE: Simple Contrastive Learning of Sentence Embeddings" (EMNLP 2021).
Each sentence goes through the encoder twice in train mode; the two dropout masks make
two views z1, z2 of it. The loss is InfoNCE over the batch: cross-entropy of the
cosine-similarity matrix sim(z1_i, z2_j) / temperature with the diagonal as targets,
so each sentence must pick out its own other view among the batch's sentences.
Pooling is the attention-masked mean of the last hidden states (as all-MiniLM-L6-v2
was trained with), not the paper's [CLS] + MLP head, so the fine-tuned encoder stays a
drop-in for `tensorarena embed`.

On the streaming route the encoder's stages (BertModel.encoder_stages) carry the pooling and the
loss in their last stage; the stacked batch, its attention mask and token types are the step's side
inputs (`stream_inputs`), computed once per step and read by every layer and by the pooling.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..nn import functional as F
from ..nn.module import Module
from ..nn.transformer import mean_pool
from ..ops._base import count_up, new
from ..tape import host
from ..tensor import Tensor

NORM_EPS = 1e-12  # torch.nn.functional.normalize's default


def l2_normalize(x: Tensor, *, eps: float = NORM_EPS) -> Tensor:
    """x / max(||x||_2, eps) along the last axis (torch.nn.functional.normalize). Shape: (..., D)."""
    with np.errstate(under="ignore"):  # a tiny component squares to 0, which is harmless
        sq = ops.sum(x * x, dim=-1, keepdim=True)  # (..., 1)
    # Clamp the square before the root: max(||x||, eps) = sqrt(max(||x||^2, eps^2)), and sqrt's
    # gradient is then never taken at 0 — a zero row divides by eps and gets torch's finite gradient.
    floor = eps * eps
    # The condition is an arena buffer written through tape.host: a captured fused step (compile/captured.py)
    # compares each batch's norms again, where a NumPy comparison here would be frozen at the recorded batch.
    keep = new(sq.shape, np.bool_)
    host(np.greater_equal, sq.data, floor, out=keep)
    return x / ops.sqrt(ops.where(keep, sq, floor))


def info_nce(z1: Tensor, z2: Tensor, *, temperature: float = 0.05) -> Tensor:
    """SimCSE's InfoNCE loss of two views. Shape: z1, z2 (B, D) -> scalar.

    loss = mean_i cross_entropy(cos(z1_i, z2_j) / temperature over j, target i).
    """
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(f"info_nce: need two (B, D) views of the same shape, got {z1.shape} and {z2.shape}")
    # inf would make every logit 0: a constant loss log(B) with no gradient, training that learns nothing
    if not 0 < temperature < math.inf:
        raise ValueError(f"info_nce: temperature must be positive and finite, got {temperature}")
    sim = ops.matmul(l2_normalize(z1), ops.transpose(l2_normalize(z2), 0, 1))  # (B, B) cosines
    logits = sim * (1.0 / temperature)
    labels = new((z1.shape[0],), np.int64)  # 0..B-1, in the arena like every array a recorded call reads
    host(count_up, labels)
    return F.cross_entropy(logits, labels)


def _stack_twice(a: np.ndarray, out: np.ndarray) -> None:
    """out (2B, ...) = a (B, ...) stacked on itself."""
    b = a.shape[0]
    out[:b] = a
    out[b:] = a


def _twice(a: np.ndarray) -> np.ndarray:
    """a (B, ...) stacked on itself, (2B, ...), in an arena buffer written through tape.host."""
    out = new((2 * a.shape[0],) + a.shape[1:], a.dtype)
    host(_stack_twice, a, out)
    return out


class SimCSE(Module):
    """Wraps a BERT-style encoder; forward(batch) returns the unsupervised SimCSE loss.

    Args:
        encoder: called as encoder(input_ids, attention_mask=..., token_type_ids=...) -> (B, T, H).
        temperature: InfoNCE temperature (the paper's 0.05).
        pad_id: the padding token id, used to rebuild the attention mask when the batch is
            given as input_ids alone.
    """

    # compile/micro_batches.check_model_splits: every route refuses micro_batch for it (as the CLI does)
    micro_batches_refused = ("its InfoNCE loss takes every other sentence of the batch as a negative, so "
                             "micro-batches would train another loss, not the whole batch's step")

    def __init__(self, encoder: Module, *, temperature: float = 0.05, pad_id: int = 0) -> None:
        super().__init__()
        if not 0 < temperature < math.inf:
            raise ValueError(f"temperature must be positive and finite, got {temperature}")
        self.encoder = encoder
        self.temperature = float(temperature)
        self.pad_id = int(pad_id)

    def _arrays(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input_ids, attention_mask, token_type_ids), each (B, T)."""
        if hasattr(batch, "input_ids"):  # a text.Encoding
            return (np.asarray(batch.input_ids), np.asarray(batch.attention_mask),
                    np.asarray(batch.token_type_ids))
        ids = np.asarray(batch.data if isinstance(batch, Tensor) else batch)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise TypeError(f"SimCSE expects an Encoding or (B, T) integer input_ids, got {ids.dtype} {ids.shape}")
        # Given ids alone, every [PAD] id is padding. (A text with a literal "[PAD]" in it tokenizes to that id, with
        # mask 1 in the tokenizer's Encoding, as in Hugging Face's: pass the Encoding to keep that mask.) Both are
        # arena buffers written through tape.host, so a captured fused step computes the mask again from each batch.
        mask, types = new(ids.shape, np.bool_), new(ids.shape, np.int64)
        host(np.not_equal, ids, self.pad_id, out=mask)
        host(types.fill, 0)
        return ids, mask, types

    def encode(self, batch) -> Tensor:
        """Mean-pooled sentence vectors (not normalized). Shape: (B, T) -> (B, H)."""
        ids, mask, types = self._arrays(batch)
        hidden = self.encoder(ids, attention_mask=mask, token_type_ids=types)  # (B, T, H)
        return mean_pool(hidden, mask)

    def _stacked(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch stacked twice: (ids, mask, types), each (2B, T). Dropout masks are drawn per element,
        so row i and row B+i become two independent views of sentence i, as in the paper's code."""
        ids, mask, types = self._arrays(batch)
        if ids.shape[0] < 2:
            raise ValueError("SimCSE needs at least 2 sentences per batch (the others are the negatives)")
        return _twice(ids), _twice(mask), _twice(types)

    def _loss(self, hidden: Tensor, mask2: np.ndarray) -> Tensor:
        """InfoNCE of the two views in hidden (2B, T, H), mean-pooled over mask2's real tokens (scalar)."""
        pooled = mean_pool(hidden, mask2)  # (2B, H)
        b = pooled.shape[0] // 2
        z1, z2 = pooled[:b], pooled[b:]  # (B, H) each
        return info_nce(z1, z2, temperature=self.temperature)

    def forward(self, batch) -> Tensor:
        """The InfoNCE loss of the batch against a second dropout view of itself (scalar)."""
        ids2, mask2, types2 = self._stacked(batch)  # one pass over the batch stacked twice: (2B, T)
        hidden = self.encoder(ids2, attention_mask=mask2, token_type_ids=types2)  # (2B, T, H)
        return self._loss(hidden, mask2)

    # -- the streaming route ----------------------------------------------------------------------
    def _encoder_stages(self):
        """The encoder's encoder_stages, or StreamingUnsupportedError saying why there are none."""
        from ..stream.stages import StreamingUnsupportedError, unstaged_forward

        build, inputs = getattr(self.encoder, "encoder_stages", None), getattr(self.encoder, "encoder_inputs", None)
        if not (callable(build) and callable(inputs)):
            raise StreamingUnsupportedError(
                f"SimCSE can stream only an encoder that cuts itself into stages reading the attention mask, and "
                f"its {type(self.encoder).__name__} has no encoder_stages() and encoder_inputs() (BertModel has "
                f"both), so the streaming route cannot split it. Train it with route='eager' or 'fused'")
        overridden = unstaged_forward(self.encoder, "encoder_stages")
        if overridden is not None:  # its stages would run in place of that forward, which then silently would not
            raise StreamingUnsupportedError(
                f"SimCSE cannot stream its encoder: {overridden}, and the streaming route runs the stages, never "
                f"the encoder's forward, so that code would silently not run; train it with route='eager' or "
                f"'fused', or override encoder_stages() next to that forward")
        return build

    def stream_inputs(self, batch) -> tuple[np.ndarray, dict]:
        """Stage 0's input (the stacked ids) and the side inputs: the encoder's (padding, token types) and
        the stacked mask the pooling reads, computed once per step as forward computes them."""
        ids2, mask2, types2 = self._stacked(batch)
        first, side = self.encoder.encoder_inputs(ids2, attention_mask=mask2, token_type_ids=types2)
        if side.get("padding") is None:  # a mask was passed: an encoder that drops it would not mask padding
            raise ValueError(f"{type(self.encoder).__name__}.encoder_inputs() returned no padding mask for the "
                             f"attention mask SimCSE passed it")
        return first, dict(side, pool_mask=mask2)

    def stream_stages(self) -> list:
        """The encoder's stages with the pooling and InfoNCE in the last one (it outputs the loss)."""
        head = lambda hidden, side: self._loss(hidden, side["pool_mask"])  # noqa: E731 - the stage's tail
        return self._encoder_stages()(head=head, prefix="encoder.")

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
