"""Vision Transformer, following Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words:
Transformers for Image Recognition at Scale" (arXiv:2010.11929).

The image is cut into p x p patches, each linearly embedded (a stride-p conv); a learned [CLS]
token is prepended, learned position embeddings added, and pre-norm transformer blocks
(erf GELU MLP) applied; the final LayerNorm'd [CLS] token goes through a linear head.
Sizes and the LayerNorm eps (1e-6) are torchvision's, so ViT-B/16 with 1000 classes has exactly
torchvision vit_b_16's 86,567,656 parameters. Parameter names follow timm
(patch_embed, cls_token, pos_embed, blocks.{i}.norm1 / attn.qkv / attn.proj / norm2 / mlp.fc1 / mlp.fc2, norm, head).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..nn import Dropout, LayerNorm, Linear, Module, Parameter, PatchEmbedding, PositionEmbedding, TransformerBlock, init
from ..nn.transformer import Activation, cls_pool
from ..ops import cat
from ..tensor import Tensor

log = logging.getLogger("tensorarena")


@dataclass(frozen=True)
class ViTConfig:
    """ViT sizes and options; the defaults are ViT-B/16 on 224 x 224 ImageNet (1000 classes)."""

    image_size: int = 224
    patch_size: int = 16
    in_channels: int = 3
    num_classes: int = 1000
    dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    attention_dropout: float = 0.0
    eps: float = 1e-6
    activation: Activation = "gelu"
    dtype: type = field(default=np.float32)
    # The head reads only [CLS]: the last block computes attention rows, projection, norm and MLP
    # for that one token (keys and values from all). Same values; False computes every token.
    cls_only_last_block: bool = True
    # The MLPs keep GELU's output and derivative for backward (no erf there); True keeps only fc1's output
    # plus bias and recomputes both: one (batch * tokens, mlp dim) buffer less per block (FeedForward).
    recompute_mlp_activation: bool = False

    def __post_init__(self) -> None:
        sizes = dict(image_size=self.image_size, patch_size=self.patch_size, in_channels=self.in_channels,
                     num_classes=self.num_classes, dim=self.dim, depth=self.depth, num_heads=self.num_heads)
        # bool is an int, but depth=True is a mistake, not one block
        bad = {k: v for k, v in sizes.items()
               if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0}
        if bad:
            raise ValueError(f"ViTConfig sizes must be positive integers, got {bad}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} must be a multiple of patch_size {self.patch_size}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} must be a multiple of num_heads {self.num_heads}")
        # Checked here, not when the first block is built: a str ratio made a 19 TiB allocation there.
        real = (int, float, np.integer, np.floating)
        if isinstance(self.mlp_ratio, bool) or not isinstance(self.mlp_ratio, real) \
                or not 0 < self.mlp_ratio < math.inf or int(self.dim * self.mlp_ratio) < 1:
            raise ValueError(f"mlp_ratio must be a positive finite number with int(dim * mlp_ratio) >= 1 "
                             f"(dim={self.dim}), got {self.mlp_ratio!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, real) or not 0 <= self.eps < math.inf:
            raise ValueError(f"eps (the LayerNorm epsilon) must be a finite number >= 0, got {self.eps!r}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"activation must be 'gelu' or 'gelu_tanh', got {self.activation!r}")
        for name in ("cls_only_last_block", "recompute_mlp_activation"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if np.dtype(self.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {np.dtype(self.dtype)}")

    @property
    def num_patches(self) -> int:
        """Patches per image, (image_size / patch_size)^2."""
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def tiny(cls, **overrides: Any) -> "ViTConfig":
        """ViT-Ti/16: dim 192, depth 12, 3 heads (5.7M parameters at 224 / 1000 classes)."""
        return replace(cls(dim=192, depth=12, num_heads=3), **overrides)

    @classmethod
    def small(cls, **overrides: Any) -> "ViTConfig":
        """ViT-S/16: dim 384, depth 12, 6 heads (22M parameters at 224 / 1000 classes)."""
        return replace(cls(dim=384, depth=12, num_heads=6), **overrides)

    @classmethod
    def base(cls, **overrides: Any) -> "ViTConfig":
        """ViT-B/16: dim 768, depth 12, 12 heads (86.6M parameters at 224 / 1000 classes)."""
        return replace(cls(dim=768, depth=12, num_heads=12), **overrides)


class ViT(Module):
    """Vision Transformer classifier. Shape: images (B, C, H, W) -> logits (B, num_classes)."""

    def __init__(self, config: ViTConfig, *, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        c, dt = config, config.dtype
        self.patch_embed = PatchEmbedding(c.image_size, c.patch_size, c.in_channels, c.dim, rng=rng, dtype=dt)
        self.cls_token = init.zeros_(Parameter.empty((1, 1, c.dim), dt))  # deferred under nn.deferred_init()
        self.pos_embed = PositionEmbedding(c.num_patches + 1, c.dim, rng=rng, dtype=dt)
        self.pos_drop = Dropout(c.dropout, rng=rng)
        self.blocks = [TransformerBlock(c.dim, c.num_heads, c.mlp_ratio, norm_first=True, activation=c.activation,
                                        eps=c.eps, dropout=c.dropout, attention_dropout=c.attention_dropout,
                                        recompute_activation=c.recompute_mlp_activation, rng=rng, dtype=dt)
                       for _ in range(c.depth)]
        self.norm = LayerNorm(c.dim, eps=c.eps, dtype=dt)
        self.head = Linear(c.dim, c.num_classes, rng=rng, dtype=dt)
        self.last_block_route: str | None = None  # set by each forward: "cls only" or "every token"
        self.reset_parameters(rng=rng)

    def reset_parameters(self, *, rng: np.random.Generator | None = None) -> None:
        """timm's ViT init: trunc_normal(std=0.02) Linear weights and zero biases; the patch
        embedding keeps Conv2d's default, the [CLS] token starts at zero, positions N(0, 0.02^2)."""
        gen = init.get_generator(rng)
        for m in self.modules():
            if isinstance(m, Linear):
                init.trunc_normal_(m.weight, std=0.02, rng=gen)
                if m.bias is not None:
                    init.zeros_(m.bias)

    def _embed(self, images) -> Tensor:
        """Patch tokens after [CLS], positions and dropout. Shape: (B, C, H, W) -> (B, 1 + N, dim)."""
        x = self.patch_embed(images)  # (B, N, dim)
        B, _, D = x.shape
        cls = self.cls_token.expand(B, 1, D)  # (B, 1, dim): a zero-stride view; grads sum back over the batch
        x = cat([cls, x], dim=1)  # (B, 1 + N, dim)
        return self.pos_drop(self.pos_embed(x))

    def _classify(self, tokens: Tensor) -> Tensor:
        """Final LayerNorm, [CLS] token, head. Shape: (B, 1 + N, dim) -> (B, num_classes)."""
        return self.head(cls_pool(self.norm(tokens)))

    def _last_block(self, tokens: Tensor) -> Tensor:
        """The last block, for [CLS] alone when it can be. Shape: (B, 1 + N, dim) -> (B, 1 or 1 + N, dim).

        Sets `last_block_route` ("cls only" or "every token") so callers and tests see which ran.
        """
        block = self.blocks[-1]
        if not self.config.cls_only_last_block:
            self.last_block_route = "every token"
            return block(tokens)
        if self.training and block.attn.dropout:
            if self.last_block_route != "every token":
                log.info("ViT: the last block computes every token while training with attention dropout "
                         "(%s), whose mask covers every query row; [CLS] alone is computed in eval",
                         block.attn.dropout)
            self.last_block_route = "every token"
            return block(tokens)
        self.last_block_route = "cls only"
        return block(tokens, query_tokens=1)

    def features(self, images) -> Tensor:
        """All tokens after the final LayerNorm. Shape: (B, C, H, W) -> (B, 1 + N, dim)."""
        x = self._embed(images)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, images) -> Tensor:
        x = self._embed(images)
        for block in self.blocks[:-1]:
            x = block(x)
        return self._classify(self._last_block(x))  # (B, num_classes)

    def stream_stages(self) -> list:
        """The cut for the streaming route (tensorarena.stream): embedding, each block, norm + head.

        Composed in order the stages compute exactly forward(images), so a streamed step
        recomputing one stage at a time reproduces the eager step.
        """
        from ..stream.stages import Stage  # lazy: models load without the streaming machinery

        embed = (self.patch_embed.weight, self.patch_embed.bias, self.cls_token, self.pos_embed.weight)
        stages = [Stage("embed", embed, self._embed)]
        *inner, last = self.blocks
        stages += [Stage(f"blocks.{i}", tuple(block.parameters()), block) for i, block in enumerate(inner)]
        stages.append(Stage(f"blocks.{len(inner)}", tuple(last.parameters()), self._last_block))
        stages.append(Stage("head", tuple(self.norm.parameters()) + tuple(self.head.parameters()), self._classify))
        return stages


__all__ = ["ViT", "ViTConfig"]
