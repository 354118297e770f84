"""ViT and BERT against the same architectures in torch (a hand-written torch ViT, Hugging Face's
transformers.BertModel): outputs, every parameter gradient and a few AdamW steps, float32, 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
import tensorarena.nn.functional as F
from tensorarena.models import BertConfig, BertModel, ViT, ViTConfig, to_hf_state_dict
from tensorarena.models.bert import _name_map
from tensorarena.nn import mean_pool

RTOL = 1e-4
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
STEPS = 3


def assert_close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """rtol 1e-4, and an atol of 1e-5 x the tensor's largest entry for the entries near zero."""
    ref = np.asarray(ref)
    atol = 1e-5 * float(np.abs(ref).max()) if ref.size else 0.0
    with np.errstate(under="ignore"):
        np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=atol, err_msg=what)


def check_key_bias_and_zero_it(ours_key: np.ndarray, ref_key: np.ndarray, ref_query: np.ndarray, what: str) -> None:
    """The key bias's gradient is exactly zero in exact arithmetic: it adds q . b_k to every score
    of a query's row, and softmax ignores a per-row shift. Both sides hold float32 noise there,
    which Adam's g / sqrt(v) would turn into lr-sized steps of random sign, so: check it is noise
    (tiny next to the query bias's gradient), then set it to its exact value, 0, on both sides."""
    scale = float(np.abs(ref_query).max())
    assert np.abs(ours_key).max() <= 1e-5 * scale, f"{what}: ours is not ~0"
    assert np.abs(ref_key).max() <= 1e-5 * scale, f"{what}: torch's is not ~0"
    ours_key[...] = 0
    ref_key[...] = 0


# -- ViT ---------------------------------------------------------------------------------

class TorchAttention(torch.nn.Module):
    def __init__(self, dim: int, nh: int) -> None:
        super().__init__()
        self.nh = nh
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.nh, C // self.nh).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        y = torch.nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class TorchMlp(torch.nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TorchBlock(torch.nn.Module):
    """Pre-norm block (timm's ViT Block)."""

    def __init__(self, dim: int, nh: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim, eps=eps)
        self.attn = TorchAttention(dim, nh)
        self.norm2 = torch.nn.LayerNorm(dim, eps=eps)
        self.mlp = TorchMlp(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TorchPatchEmbed(torch.nn.Module):
    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        self.p = c.patch_size
        self.weight = torch.nn.Parameter(torch.empty(c.dim, c.in_channels, c.patch_size, c.patch_size))
        self.bias = torch.nn.Parameter(torch.empty(c.dim))

    def forward(self, x):
        return torch.nn.functional.conv2d(x, self.weight, self.bias, stride=self.p).flatten(2).transpose(1, 2)


class TorchPosEmbed(torch.nn.Module):
    def __init__(self, n: int, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n, dim))


class TorchViT(torch.nn.Module):
    """Dosovitskiy et al.'s ViT in torch.nn with the same parameter names as ours."""

    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        self.cls_token = torch.nn.Parameter(torch.empty(1, 1, c.dim))
        self.patch_embed = TorchPatchEmbed(c)
        self.pos_embed = TorchPosEmbed(c.num_patches + 1, c.dim)
        self.blocks = torch.nn.ModuleList(
            [TorchBlock(c.dim, c.num_heads, int(c.dim * c.mlp_ratio), c.eps) for _ in range(c.depth)])
        self.norm = torch.nn.LayerNorm(c.dim, eps=c.eps)
        self.head = torch.nn.Linear(c.dim, c.num_classes)

    def forward(self, images):
        x = self.patch_embed(images)  # (B, N, dim)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed.weight
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def test_vit_matches_torch_forward_grads_and_adamw():
    config = ViTConfig(image_size=32, patch_size=8, in_channels=3, num_classes=10, dim=32, depth=2, num_heads=4)
    ours = ViT(config, rng=np.random.default_rng(0))
    ours.cls_token.data[...] = np.random.default_rng(1).normal(0, 0.02, ours.cls_token.shape)  # not all zero
    theirs = TorchViT(config)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})

    rng = np.random.default_rng(2)
    opt = ta.optim.AdamW(ours.parameters(), **ADAMW)
    topt = torch.optim.AdamW(theirs.parameters(), **ADAMW)
    for step in range(STEPS):
        images = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
        labels = rng.integers(0, 10, 4)
        logits = ours(images)
        loss = F.cross_entropy(logits, labels)
        ref_logits = theirs(torch.from_numpy(images))
        ref_loss = torch.nn.functional.cross_entropy(ref_logits, torch.from_numpy(labels))
        assert_close(logits.numpy(), ref_logits.detach().numpy(), f"step {step}: logits")
        assert_close(loss.numpy(), ref_loss.detach().numpy(), f"step {step}: loss")
        opt.zero_grad()
        topt.zero_grad()
        loss.backward()
        ref_loss.backward()
        grads = dict(theirs.named_parameters())
        for name, p in ours.named_parameters():
            ref = grads[name].grad.numpy()
            if name.endswith("attn.qkv.bias"):  # [query; key; value]
                D = config.dim
                check_key_bias_and_zero_it(p.grad[D:2 * D], ref[D:2 * D], ref[:D], f"step {step}: grad of {name}")
            assert_close(p.grad, ref, f"step {step}: grad of {name}")
        opt.step()
        topt.step()
        for name, p in theirs.state_dict().items():
            assert_close(ours.state_dict()[name], p.numpy(), f"after step {step}: {name}")


# -- BERT against transformers.BertModel ---------------------------------------------------

def _hf_grads(model: BertModel) -> dict[str, np.ndarray]:
    """Our parameter gradients under Hugging Face names (the fused qkv split back into q, k, v)."""
    params = dict(model.named_parameters())
    out = {}
    for ours, hf_keys in _name_map(model.config.num_hidden_layers):
        for key, piece in zip(hf_keys, np.split(params[ours].grad, len(hf_keys), axis=0)):
            out[key] = piece
    return out


def test_bert_matches_transformers_forward_grads_and_adamw():
    transformers = pytest.importorskip("transformers")
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=16, type_vocab_size=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = BertModel(config, rng=np.random.default_rng(0))
    hf_config = transformers.BertConfig(**config.to_json_dict())
    theirs = transformers.BertModel(hf_config, add_pooling_layer=False)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in to_hf_state_dict(ours).items()}, strict=True)
    theirs.train()  # dropout probabilities are 0; train() only to mirror ours

    rng = np.random.default_rng(1)
    lengths = [9, 5, 2]  # mixed padding
    T = max(lengths)
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.int64)  # HF: 1 = token
    opt = ta.optim.AdamW(ours.parameters(), **ADAMW)
    topt = torch.optim.AdamW(theirs.parameters(), **ADAMW)
    for step in range(STEPS):
        ids = np.where(mask == 1, rng.integers(1, 40, (3, T)), 0)
        types = np.where((np.arange(T) >= 3) & (mask == 1), 1, 0)
        w_tok = rng.standard_normal((3, T, 32)).astype(np.float32)
        w_pool = rng.standard_normal((3, 32)).astype(np.float32)

        hidden = ours(ids, attention_mask=mask, token_type_ids=types)
        loss = (hidden * w_tok).sum() + (mean_pool(hidden, mask) * w_pool).sum()
        ref_hidden = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                            token_type_ids=torch.from_numpy(types)).last_hidden_state
        m = torch.from_numpy(mask).float()[:, :, None]
        ref_pool = (ref_hidden * m).sum(1) / m.sum(1)
        ref_loss = (ref_hidden * torch.from_numpy(w_tok)).sum() + (ref_pool * torch.from_numpy(w_pool)).sum()
        assert_close(hidden.numpy(), ref_hidden.detach().numpy(), f"step {step}: last hidden state")
        opt.zero_grad()
        topt.zero_grad()
        loss.backward()
        ref_loss.backward()
        grads = _hf_grads(ours)
        for name, p in theirs.named_parameters():
            if name.endswith("attention.self.key.bias"):
                query = name.replace("key.bias", "query.bias")
                check_key_bias_and_zero_it(grads[name], p.grad.numpy(), dict(theirs.named_parameters())[query]
                                           .grad.numpy(), f"step {step}: grad of {name}")
            assert_close(grads[name], p.grad.numpy(), f"step {step}: grad of {name}")
        assert not grads["embeddings.word_embeddings.weight"][0].any()  # the padding row gets no gradient
        opt.step()
        topt.step()
        now = to_hf_state_dict(ours)
        for name, p in theirs.named_parameters():
            assert_close(now[name], p.detach().numpy(), f"after step {step}: {name}")
