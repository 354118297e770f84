"""torch's `attn_mask` of scaled_dot_product_attention as the kernels' key padding mask.

The kernels take two masks: causal, and a bool (B, S) key padding mask where True marks a key to leave out.
torch's bool attn_mask has the other polarity (True: take part) and any shape broadcastable to (B, H, T, S).
The ones that vary only by batch and key, (B, 1, 1, S), (1, S), (S,), the padding masks a PyTorch model builds
from its ids, become a key padding mask here; a mask that varies by query or head, or an additive float mask,
is refused with what to pass instead (is_causal=True covers the causal mask).

The conversion is a recorded host call into a step buffer, so a fused replay inverts each batch's own mask.
"""

from __future__ import annotations

import numpy as np

from ..tape import host
from ..tensor import Tensor
from ._base import new

_WHAT = "scaled_dot_product_attention"


def key_padding_from_attn_mask(attn_mask, key_padding_mask: np.ndarray | None, batch: int, keys: int
                               ) -> np.ndarray:
    """The (batch, keys) bool mask of keys to leave out: not `attn_mask`, or'ed with `key_padding_mask`."""
    m = attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
    if m.dtype != np.bool_:
        raise ValueError(f"{_WHAT}: attn_mask of dtype {m.dtype} is not supported, only a bool mask (True = attend) "
                         f"that varies by batch and key, shape ({batch}, 1, 1, {keys}); pass a padding mask as "
                         f"bool, and use is_causal=True for a causal mask")
    # The dims of H and T (broadcast from the right against (B, H, T, S)) must be absent or 1.
    if m.ndim > 4 or any(d != 1 for d in m.shape[-3:-1]):
        raise ValueError(f"{_WHAT}: attn_mask of shape {m.shape} varies by query or head; only masks that vary by "
                         f"batch and key are supported, shape ({batch}, 1, 1, {keys}) (True = attend), and "
                         f"is_causal=True for a causal mask")
    lead = m.shape[0] if m.ndim == 4 else 1
    if m.ndim and (m.shape[-1] not in (1, keys) or lead not in (1, batch)):
        raise ValueError(f"{_WHAT}: attn_mask of shape {m.shape} does not broadcast to (batch, heads, queries, "
                         f"keys) = ({batch}, *, *, {keys})")
    out = new((batch, keys), np.bool_)
    host(_leave_out, m, key_padding_mask, out)
    return out


def _leave_out(mask: np.ndarray, key_padding_mask: np.ndarray | None, out: np.ndarray) -> None:
    lead = mask.shape[0] if mask.ndim == 4 else 1
    np.logical_not(np.broadcast_to(mask.reshape(lead, mask.shape[-1] if mask.ndim else 1), out.shape), out=out)
    if key_padding_mask is not None:
        np.logical_or(out, key_padding_mask, out=out)
