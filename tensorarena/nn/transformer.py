"""Transformer building blocks: multi-head self-attention, the encoder block, patch and position
embeddings, and token pooling. Shared by models/vit.py (pre-norm) and models/bert.py (post-norm).

Parameter names follow timm's ViT (`attn.qkv`, `attn.proj`, `norm1`, `mlp.fc1`, ...): one fused
qkv projection whose weight rows are [query; key; value], as torch.nn.MultiheadAttention's
in_proj_weight, so checkpoints with separate q/k/v matrices load by concatenating rows.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..ops._base import new
from ..tape import host
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import Dropout, LayerNorm, Linear, _empty_param, _size
from .module import Module

Activation = Literal["gelu", "gelu_tanh"]
_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}


def _as_input(x, dtype) -> Tensor:
    """A Tensor for a model input given as a Tensor or an array-like."""
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x, dtype=dtype))


def _tokens(x, dtype, what: str, dim: int) -> Tensor:
    """x as a (B, T, dim) Tensor (an array-like is wrapped as in PatchEmbedding), or a ValueError naming the shape."""
    x = _as_input(x, dtype)
    if x.ndim != 3:
        raise ValueError(f"{what} expects (B, T, {dim}) tokens, got shape {tuple(x.shape)}; "
                         f"a single sequence (T, {dim}) needs a batch axis: x[None]")
    return x


def _bool_mask(mask, shape: tuple[int, int], what: str) -> np.ndarray:
    arr = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if arr.shape != shape:
        raise ValueError(f"{what} must have shape (B, T) = {shape}, got {arr.shape}")
    if arr.dtype != np.bool_:
        raise TypeError(f"{what} must be bool (True = padding, do not attend), got dtype {arr.dtype}; "
                        f"from a Hugging Face attention_mask (1 = token) pass attention_mask == 0")
    return arr


class MultiheadAttention(Module):
    """Multi-head self-attention with one fused qkv projection. Shape: (B, T, dim) -> (B, T, dim).

    `dropout` drops attention probabilities while training (torch.nn.MultiheadAttention's
    dropout; BERT's attention_probs_dropout_prob), inside the fused attention kernels: the mask is
    ops.dropout's, drawn from `attn_drop.rng`, and is recomputed in backward rather than kept.
    """

    def __init__(self, dim: int, num_heads: int, *, qkv_bias: bool = True, dropout: float = 0.0,
                 rng: np.random.Generator | None = None, dtype=np.float32) -> None:
        super().__init__()
        dim, num_heads = _size("MultiheadAttention", "dim", dim), _size("MultiheadAttention", "num_heads", num_heads)
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"dim {dim} must be a positive multiple of num_heads {num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = float(dropout)
        # rng=None means the default generator, reseeded in place by init.manual_seed: passing
        # None on keeps one stream for init and lets dropout follow later reseeds.
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias, rng=rng, dtype=dtype)
        self.proj = Linear(dim, dim, rng=rng, dtype=dtype)
        self.attn_drop = Dropout(dropout, rng=rng)

    def forward(self, x: Tensor, key_padding_mask: np.ndarray | None = None, causal: bool = False,
                query_tokens: int | None = None) -> Tensor:
        """Self-attention; key_padding_mask bool (B, T), True = padding key; causal: i sees j <= i.

        query_tokens=n returns only the first n tokens' outputs, (B, n, dim), attending over all T
        keys: the same values as forward(x)[:, :n], with attention and the output projection done
        for n rows instead of T. Not with attention dropout (ValueError): its mask is drawn over
        every query row.
        """
        x = _tokens(x, self.qkv.weight.dtype, "MultiheadAttention", self.dim)
        B, T, C = x.shape
        if C != self.dim:
            raise ValueError(f"MultiheadAttention expects (B, T, {self.dim}), got {x.shape}")
        nh = self.num_heads
        if key_padding_mask is not None:
            mask_shape = getattr(key_padding_mask, "shape", None)
            if mask_shape is not None and len(mask_shape) == 3:
                # torch's call, mha(query, key, value): the key taken for this mask named only a shape mismatch.
                raise TypeError(f"MultiheadAttention.forward(x, key_padding_mask=None, causal=False) is "
                                f"self-attention over one input and returns one tensor; got a 3-D {mask_shape} "
                                f"second argument. For torch's mha(query, key, value) with query is key is value, "
                                f"call mha(x); attention between different query and key/value inputs is "
                                f"F.scaled_dot_product_attention")
            key_padding_mask = _bool_mask(key_padding_mask, (B, T), "key_padding_mask")
        if query_tokens is not None:
            n = _query_count(query_tokens, T)
            if self.training and self.dropout:
                raise ValueError(f"query_tokens={n} cannot be combined with attention dropout ({self.dropout}) "
                                 f"while training: its mask is drawn over every query row. Call it without "
                                 f"query_tokens and slice the output")
            return self._first_queries(x, n, key_padding_mask, causal)
        qkv = self.qkv(x)  # (B, T, 3C): [query; key; value]
        # The heads are read as strided views of qkv and written straight into (B, T, C); attention
        # dropout (training only) is applied inside the kernels, its mask recomputed in backward.
        p = self.dropout if self.training else 0.0
        y = F.packed_self_attention(qkv, nh, key_padding_mask=key_padding_mask, causal=causal, dropout_p=p,
                                    rng=init.get_generator(self.attn_drop.rng) if p else None)
        return self.proj(y)

    def _first_queries(self, x: Tensor, n: int, key_padding_mask: np.ndarray | None, causal: bool) -> Tensor:
        """Attention output of the first n queries over every key. Shape: x (B, T, C) -> (B, n, C).

        The query rows of the qkv projection are computed for the first n tokens alone, the key and value
        rows for all T: ViT's last block (n = 1 of 197 tokens) skips a third of its qkv product, forward
        and backward. The two row slices of the weight and bias are views; their gradients add up in it.
        """
        B, T, _ = x.shape
        C, nh, hs = self.dim, self.num_heads, self.head_dim
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(x[:, :n], w[:C], None if b is None else b[:C])  # (B, n, C)
        kv = F.linear(x, w[C:], None if b is None else b[C:])  # (B, T, 2C): [key; value]
        q = q.reshape(B, n, nh, hs).permute(0, 2, 1, 3)  # (B, H, n, hs)
        k = kv[:, :, :C].reshape(B, T, nh, hs).permute(0, 2, 1, 3)  # (B, H, T, hs)
        v = kv[:, :, C:].reshape(B, T, nh, hs).permute(0, 2, 1, 3)
        # Causal masks stay top-left aligned: query i of the first n is token i.
        y = F.scaled_dot_product_attention(q, k, v, key_padding_mask=key_padding_mask, causal=causal)
        return self.proj(y.permute(0, 2, 1, 3).reshape(B, n, C))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, dropout={self.dropout}"


def _query_count(query_tokens, T: int) -> int:
    if isinstance(query_tokens, bool) or not isinstance(query_tokens, (int, np.integer)) or not 1 <= query_tokens <= T:
        raise ValueError(f"query_tokens must be an integer in [1, {T}] (the sequence length), got {query_tokens!r}")
    return int(query_tokens)


class FeedForward(Module):
    """fc1 -> GELU -> fc2 (the transformer MLP); fc1's bias add, the GELU and fc2 run as one op
    (ops.bias_gelu_linear). It keeps the activation and GELU's derivative for backward, so backward
    evaluates no erf; recompute_activation=True keeps only fc1's output plus bias and recomputes both
    in backward: one (tokens, hidden_dim) buffer less per block, for one erf pass more."""

    def __init__(self, dim: int, hidden_dim: int, *, activation: Activation = "gelu",
                 recompute_activation: bool = False, rng: np.random.Generator | None = None,
                 dtype=np.float32) -> None:
        super().__init__()
        if activation not in _APPROXIMATE:
            raise ValueError(f"activation must be one of {sorted(_APPROXIMATE)}, got {activation!r}")
        if not isinstance(recompute_activation, bool):
            raise TypeError(f"recompute_activation must be True or False, got {recompute_activation!r}")
        self.activation = activation
        self.recompute_activation = recompute_activation
        self.fc1 = Linear(dim, hidden_dim, rng=rng, dtype=dtype)
        self.fc2 = Linear(hidden_dim, dim, rng=rng, dtype=dtype)

    @property
    def approximate(self) -> str:
        """GELU's form, as F.gelu's `approximate` names it: "none" (erf) or "tanh"."""
        return _APPROXIMATE[self.activation]

    def forward(self, x: Tensor) -> Tensor:
        h = F.linear(x, self.fc1.weight)  # fc1's bias goes into the fused bias + GELU + fc2
        return F.bias_gelu_linear(h, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                                  approximate=self.approximate, recompute=self.recompute_activation)

    def extra_repr(self) -> str:
        extra = ", recompute_activation=True" if self.recompute_activation else ""
        return f"activation={self.activation!r}{extra}"


def keeping_mlp_activations(model: Module) -> list[FeedForward]:
    """The model's FeedForward modules that keep GELU's output and derivative for backward (the default):
    those `recompute_activation = True` would make one (tokens, hidden_dim) buffer smaller each. The route
    plan (train/route_plan.py) switches them when that lets the fused route fit the memory budget."""
    return [m for m in model.modules() if isinstance(m, FeedForward) and not m.recompute_activation]


class TransformerBlock(Module):
    """Self-attention + MLP with residuals. Shape: (B, T, dim) -> (B, T, dim).

    norm_first=True (pre-norm, ViT):   x = x + drop(attn(norm1(x)));  x = x + drop(mlp(norm2(x)))
    norm_first=False (post-norm, BERT): x = norm1(x + drop(attn(x))); x = norm2(x + drop(mlp(x)))
    `dropout` is the residual-branch dropout (BERT's hidden_dropout_prob), `attention_dropout`
    drops attention probabilities. mlp_dim overrides dim * mlp_ratio (BERT's intermediate_size).
    recompute_activation: FeedForward's (less memory, one erf pass more in backward).
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, *, norm_first: bool = True,
                 activation: Activation = "gelu", eps: float = 1e-5, dropout: float = 0.0,
                 attention_dropout: float = 0.0, qkv_bias: bool = True, mlp_dim: int | None = None,
                 recompute_activation: bool = False, rng: np.random.Generator | None = None,
                 dtype=np.float32) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        hidden = int(mlp_dim) if mlp_dim is not None else int(dim * mlp_ratio)
        if hidden <= 0:
            raise ValueError(f"MLP hidden size must be positive, got {hidden} (dim={dim}, mlp_ratio={mlp_ratio})")
        self.norm_first = norm_first
        self.norm1 = LayerNorm(dim, eps=eps, dtype=dtype)
        self.attn = MultiheadAttention(dim, num_heads, qkv_bias=qkv_bias, dropout=attention_dropout,
                                       rng=rng, dtype=dtype)
        self.norm2 = LayerNorm(dim, eps=eps, dtype=dtype)
        self.mlp = FeedForward(dim, hidden, activation=activation, recompute_activation=recompute_activation,
                               rng=rng, dtype=dtype)
        self.drop = Dropout(dropout, rng=rng)

    def forward(self, x: Tensor, key_padding_mask: np.ndarray | None = None, causal: bool = False,
                query_tokens: int | None = None) -> Tensor:
        """One block; masks as in MultiheadAttention.forward.

        query_tokens=n computes only the first n tokens' outputs, (B, n, dim), equal to
        forward(x)[:, :n]: keys and values still come from every token, but the attention rows,
        the output projection, the second norm and the MLP run on n rows instead of T. A model
        that reads only [CLS] after its last block (ViT) passes 1 there. Not with attention
        dropout while training (see MultiheadAttention.forward); residual dropout draws its mask
        for the n rows only.
        """
        x = _tokens(x, self.norm1.weight.dtype, "TransformerBlock", self.attn.dim)
        if query_tokens is None:
            if self.norm_first:
                x = x + self.drop(self.attn(self.norm1(x), key_padding_mask, causal))
                return x + self.drop(self.mlp(self.norm2(x)))
            x = self.norm1(x + self.drop(self.attn(x, key_padding_mask, causal)))
            return self.norm2(x + self.drop(self.mlp(x)))
        n = _query_count(query_tokens, x.shape[1])
        if self.norm_first:
            x = x[:, :n] + self.drop(self.attn(self.norm1(x), key_padding_mask, causal, query_tokens=n))
            return x + self.drop(self.mlp(self.norm2(x)))
        x = self.norm1(x[:, :n] + self.drop(self.attn(x, key_padding_mask, causal, query_tokens=n)))
        return self.norm2(x + self.drop(self.mlp(x)))

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"


class PatchEmbedding(Module):
    """Non-overlapping p x p patches, each projected to `dim`: a stride-p Conv2d done as reshape + matmul.

    weight is (dim, C, p, p) and bias (dim,), torch Conv2d's layout, so conv checkpoints load 1:1.
    Shape: (B, C, H, W) -> (B, N, dim), N = (H/p) * (W/p), patches in row-major order (as
    Conv2d(...).flatten(2).transpose(1, 2)).
    """

    def __init__(self, image_size: int, patch_size: int, in_channels: int, dim: int, *,
                 rng: np.random.Generator | None = None, dtype=np.float32) -> None:
        super().__init__()
        for name, value in (("image_size", image_size), ("patch_size", patch_size), ("in_channels", in_channels),
                            ("dim", dim)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"PatchEmbedding: {name} must be a positive integer, got {value!r}")
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} must be a multiple of patch_size {patch_size}")
        self.image_size = image_size
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.dim = dim
        self.grid = image_size // patch_size
        self.num_patches = self.grid * self.grid
        self.weight = _empty_param((dim, in_channels, patch_size, patch_size), dtype)
        self.bias = _empty_param((dim,), dtype)
        self.reset_parameters(rng=rng)

    def reset_parameters(self, *, rng: np.random.Generator | None = None) -> None:
        """torch Conv2d's default: U(+-1/sqrt(fan_in)) for weight and bias, fan_in = C * p * p."""
        gen = init.get_generator(rng)
        init.kaiming_uniform_(self.weight, a=np.sqrt(5), rng=gen)
        bound = 1 / np.sqrt(self.in_channels * self.patch_size ** 2)
        init.uniform_(self.bias, -bound, bound, rng=gen)

    def forward(self, images) -> Tensor:
        x = _as_input(images, self.weight.dtype)
        expected = (self.in_channels, self.image_size, self.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"PatchEmbedding expects images (B, {', '.join(map(str, expected))}), got {x.shape}")
        B, C, p, g = x.shape[0], self.in_channels, self.patch_size, self.grid
        x = x.reshape(B, C, g, p, g, p)  # (B, C, gh, p, gw, p)
        x = x.permute(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, p, p)
        x = x.reshape(B, g * g, C * p * p)  # (B, N, C*p*p), copies: the permute is not contiguous
        w = self.weight.reshape(self.dim, C * p * p)  # (dim, C*p*p)
        return F.linear(x, w, self.bias)  # (B, N, dim)

    def extra_repr(self) -> str:
        return (f"image_size={self.image_size}, patch_size={self.patch_size}, in_channels={self.in_channels}, "
                f"dim={self.dim}")


class PositionEmbedding(Module):
    """Learned absolute position embeddings added to the tokens. Shape: (B, T, dim) -> (B, T, dim), T <= num_positions."""

    def __init__(self, num_positions: int, dim: int, *, std: float = 0.02, rng: np.random.Generator | None = None,
                 dtype=np.float32) -> None:
        super().__init__()
        self.num_positions = num_positions
        self.dim = dim
        self.weight = _empty_param((num_positions, dim), dtype)
        init.trunc_normal_(self.weight, std=std, a=-2 * std, b=2 * std, rng=rng)

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        if T > self.num_positions:
            raise ValueError(f"sequence of {T} tokens is longer than the {self.num_positions} learned positions")
        pos = self.weight if T == self.num_positions else self.weight[:T]  # (T, dim)
        return x + pos  # broadcast over the batch

    def extra_repr(self) -> str:
        return f"{self.num_positions}, {self.dim}"


def cls_pool(x: Tensor) -> Tensor:
    """The first ([CLS]) token of each sequence. Shape: (B, T, D) -> (B, D)."""
    return x[:, 0]


def mean_pool(x: Tensor, mask=None) -> Tensor:
    """Mean over the real tokens (sentence-transformers' mean pooling). Shape: (B, T, D) -> (B, D).

    mask: (B, T), nonzero/True = real token, 0/False = padding (a Hugging Face attention_mask;
    the opposite of key_padding_mask). None averages all T tokens.
    """
    if mask is None:
        return x.mean(dim=1)
    m = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if m.shape != tuple(x.shape[:2]):
        raise ValueError(f"mean_pool: mask shape {m.shape} must be (B, T) = {tuple(x.shape[:2])}")
    # Arena buffers written through tape.host, so a captured fused step computes them again from each batch.
    weights, counts = new(m.shape + (1,), x.dtype), new((m.shape[0], 1), x.dtype)  # (B, T, 1), (B, 1)
    host(_pool_weights, m, weights, counts)
    return (x * weights).sum(dim=1) / counts


def _pool_weights(mask: np.ndarray, weights: np.ndarray, counts: np.ndarray) -> None:
    """weights = 1 where mask is nonzero else 0; counts = their row sums (at least 1e-9: an all-padding
    row pools to 0, not NaN)."""
    np.not_equal(mask, 0, out=weights[:, :, 0], casting="unsafe")
    np.sum(weights, axis=1, out=counts)
    np.maximum(counts, counts.dtype.type(1e-9), out=counts)


__all__ = ["MultiheadAttention", "FeedForward", "TransformerBlock", "PatchEmbedding", "PositionEmbedding",
           "cls_pool", "mean_pool"]
