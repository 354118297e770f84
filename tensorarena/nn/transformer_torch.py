"""torch.nn.TransformerEncoderLayer and TransformerEncoder, in torch's layout: the same arguments, defaults,
state_dict keys (self_attn.in_proj_weight, self_attn.out_proj.weight, linear1, linear2, norm1, norm2) and maths,
so a torch transformer script and its saved weights port as they are. nn.TransformerBlock is tensorarena's own
pre-norm block (fused qkv, no torch key names); this is for code written against torch's.

Attention runs on F.scaled_dot_product_attention. Masks: src_key_padding_mask (N, S) bool, True = padding, as
torch's; a causal mask by is_causal=True or by src_mask equal to nn.Transformer.generate_square_subsequent_mask's
(or its bool form, True = masked). Any other src_mask (one that varies by query otherwise) is refused, naming it, and
so is a float src_key_padding_mask of other values than 0 and -inf (torch adds those to the scores).
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np

from .. import ops
from ..tensor import Tensor
from . import functional as F
from . import init
from .containers import ModuleList
from .layers import Dropout, LayerNorm, Linear, _size
from .module import Module
from .parameter import Parameter

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class SelfAttention(Module):
    """torch.nn.MultiheadAttention's parameters (in_proj_weight (3E, E), in_proj_bias, out_proj), used as self-
    attention by TransformerEncoderLayer: forward(x (N, S, E), key_padding_mask, causal) -> (N, S, E)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, *,
                 rng: np.random.Generator | None = None, dtype=np.float32) -> None:
        super().__init__()
        embed_dim, num_heads = _size("MultiheadAttention", "embed_dim", embed_dim), \
            _size("MultiheadAttention", "num_heads", num_heads)
        if num_heads == 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, float(dropout)
        self.in_proj_weight = Parameter.empty((3 * embed_dim, embed_dim), dtype)
        self.register_parameter("in_proj_bias", Parameter.empty((3 * embed_dim,), dtype) if bias else None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, rng=rng, dtype=dtype)
        # torch's _reset_parameters: xavier_uniform_ in_proj_weight, zero biases (out_proj's weight keeps Linear's)
        init.xavier_uniform_(self.in_proj_weight, rng=init.get_generator(rng))
        for b in (self.in_proj_bias, self.out_proj.bias):
            if b is not None:
                init.zeros_(b)
        self.rng = rng

    def forward(self, x: Tensor, key_padding_mask: np.ndarray | None = None, causal: bool = False) -> Tensor:
        n, s, e = x.shape
        h = self.num_heads
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)  # (N, S, 3E)
        q, k, v = (t.reshape(n, s, h, e // h).transpose(1, 2) for t in ops.chunk(qkv, 3, dim=-1))
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, key_padding_mask=key_padding_mask,
                                             causal=causal, rng=init.get_generator(self.rng) if p else None)
        return self.out_proj(out.transpose(1, 2).reshape(n, s, e))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and a feed-forward network, each with a residual and a
    LayerNorm, after (norm_first=False, torch's default) or before (norm_first=True). Input (S, N, E), or (N, S, E)
    with batch_first=True."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None, *,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        from ..device import check_cpu

        check_cpu(device, "TransformerEncoderLayer")
        dtype = dtype or np.float32
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise RuntimeError(f"activation should be relu/gelu, not {activation}")
            self._activation_name, activation = activation, _ACTIVATIONS[activation]
        else:
            self._activation_name = getattr(activation, "__name__", type(activation).__name__)
        self.activation = activation
        self.self_attn = SelfAttention(d_model, nhead, dropout, bias, rng=rng, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, rng=rng, dtype=dtype)
        self.dropout = Dropout(dropout, rng=rng)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, rng=rng, dtype=dtype)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1, self.dropout2 = Dropout(dropout, rng=rng), Dropout(dropout, rng=rng)
        self.batch_first, self.norm_first = batch_first, norm_first

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False) -> Tensor:
        x = src if isinstance(src, Tensor) else Tensor(np.asarray(src))
        if x.ndim != 3:
            layout = "(N, S, E)" if self.batch_first else "(S, N, E)"
            raise ValueError(f"TransformerEncoderLayer expects a 3-D input, {layout}, got shape {tuple(x.shape)}")
        if not self.batch_first:
            x = x.transpose(0, 1)
        padding = _padding_mask(src_key_padding_mask, x.shape[:2])
        causal = is_causal or _is_causal_mask(src_mask, x.shape[1])
        if self.norm_first:
            x = x + self._attention(self.norm1(x), padding, causal)
            x = x + self._feed_forward(self.norm2(x))
        else:
            x = self.norm1(x + self._attention(x, padding, causal))
            x = self.norm2(x + self._feed_forward(x))
        return x if self.batch_first else x.transpose(0, 1)

    def _attention(self, x: Tensor, padding, causal: bool) -> Tensor:
        return self.dropout1(self.self_attn(x, padding, causal))

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: `num_layers` copies of `encoder_layer` (layers.0, layers.1, ...), each with
    weights of its own copied from it, then `norm` if given."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        num_layers = _size("TransformerEncoder", "num_layers", num_layers)
        # Weights copied as torch's _get_clones copies them; a generator the layer was given (rng=) is shared, not
        # copied: each copy of it would draw the same numbers, the same dropout masks in every layer.
        generators = {id(value): value for module in encoder_layer.modules() for value in vars(module).values()
                      if isinstance(value, np.random.Generator)}
        self.layers = ModuleList([copy.deepcopy(encoder_layer, dict(generators)) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


def _padding_mask(mask, shape: tuple[int, int]) -> np.ndarray | None:
    """src_key_padding_mask as a bool (N, S) array, True = padding (torch's polarity); a float mask (-inf = pad,
    0 = keep, torch's other form) too."""
    if mask is None:
        return None
    arr = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if arr.shape != shape:
        raise ValueError(f"src_key_padding_mask must have shape (N, S) = {shape}, got {arr.shape}")
    if arr.dtype.kind == "f":
        # torch adds a float mask to the scores: -inf drops a key, 0 keeps it, and any other value (-1e9, a bias)
        # weighs it. Read as keep, such a value gave other outputs than torch's without a word.
        if not np.all((arr == 0) | np.isneginf(arr)):
            other = arr[(arr != 0) & ~np.isneginf(arr)]
            raise ValueError(f"src_key_padding_mask as floats must hold only 0 (keep) and -inf (padding), as it "
                             f"is added to the attention scores; got {float(other[0])!r} among its values. Pass a "
                             f"bool mask (True = padding), e.g. mask < 0 for one of large negative values")
        return np.isneginf(arr)
    if arr.dtype != np.bool_:
        raise TypeError(f"src_key_padding_mask must be bool (True = padding) or float (-inf = padding), got "
                        f"{arr.dtype}")
    return arr


def _is_causal_mask(mask, size: int) -> bool:
    """Whether src_mask is the causal mask of `size` positions (float -inf above the diagonal, or bool True
    there); None is no mask. Any other mask is refused: attention here takes masks by key, not by query."""
    if mask is None:
        return False
    arr = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    above = np.triu(np.ones((size, size), dtype=bool), k=1)
    if arr.shape == (size, size):
        if arr.dtype == np.bool_ and np.array_equal(arr, above):
            return True
        if arr.dtype.kind == "f" and np.array_equal(np.isneginf(arr), above) and not arr[~above].any():
            return True
    raise ValueError(f"src_mask of shape {arr.shape} ({arr.dtype}) is not the causal mask of {size} positions: "
                     f"only a causal src_mask (nn.Transformer.generate_square_subsequent_mask, or is_causal=True) is "
                     f"supported; mask padding with src_key_padding_mask")

