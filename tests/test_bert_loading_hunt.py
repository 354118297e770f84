"""BERT checkpoints and configs as transformers reads them, and evaluate() on Encodings (a hunt of 2026-12-07).

Run on the commit before the one that added this file (a worktree of it first on PYTHONPATH), all 6 tests
failed. Before the fixes: a checkpoint naming LayerNorm's tensors gamma/beta (google-bert/bert-base-uncased's own
model.safetensors does) was refused, and with strict=False loaded with every LayerNorm left at its init, the
report saying nothing; from_pretrained of a bfloat16 checkpoint died in NumPy ("data type 'bfloat16' not
understood"); Trainer.evaluate refused the Encodings Trainer.step trains on, and its advice (pass .input_ids)
attended the padding; a config.json with "pad_token_id": null froze word-embedding row 0, which transformers
trains, and BertConfig(pad_token_id=None) raised a raw TypeError.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file

from tensorarena import optim, tensor
from tensorarena.models.bert import BertConfig, BertModel, load_hf_state_dict, to_hf_state_dict
from tensorarena.nn.functional import cross_entropy
from tensorarena.text import Encoding
from tensorarena.train.trainer import Trainer

VOCAB, T = 40, 6


def _config(**kw):
    return BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=12, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, **kw)


def _ids(seed=1):
    return np.random.default_rng(seed).integers(1, VOCAB, (3, T))


def _legacy(tensors: dict) -> dict:
    """The checkpoint with LayerNorm's weight and bias under their TensorFlow-era names, under "bert."."""
    out = {}
    for key, value in tensors.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        out["bert." + key] = value
    return out


def test_a_checkpoint_naming_layernorm_gamma_and_beta_loads_as_transformers_loads_it(tmp_path):
    source = BertModel(_config(), rng=np.random.default_rng(0))
    for p in source.parameters():  # LayerNorms away from their ones/zeros init, so a skipped one shows
        p.data += np.random.default_rng(5).standard_normal(p.shape).astype(p.dtype) * 0.1
    legacy = _legacy(to_hf_state_dict(source))
    assert sum(k.endswith(".gamma") for k in legacy) == 2 * 2 + 1
    with open(tmp_path / "config.json", "w") as f:
        json.dump(source.config.to_json_dict(), f)
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in legacy.items()},
              str(tmp_path / "model.safetensors"))
    hf = transformers.BertModel.from_pretrained(str(tmp_path), add_pooling_layer=False).eval()
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(_ids())).last_hidden_state.numpy()
    models = [BertModel.from_pretrained(tmp_path)]
    for strict in (True, False):
        model = BertModel(_config(), rng=np.random.default_rng(9))
        report = load_hf_state_dict(model, legacy, strict=strict)
        assert report.missing == [] and report.unexpected == []
        models.append(model)
    for model in models:
        np.testing.assert_array_equal(model(_ids()).numpy(), source(_ids()).numpy())
        np.testing.assert_allclose(model(_ids()).numpy(), want, rtol=1e-4, atol=1e-5)


def test_strict_false_reports_what_it_left_out_under_the_checkpoint_s_names():
    source = BertModel(_config(), rng=np.random.default_rng(0))
    tensors = dict(to_hf_state_dict(source))
    del tensors["embeddings.LayerNorm.bias"]
    tensors["encoder.layer.0.extra.weight"] = np.zeros(3, np.float32)
    report = load_hf_state_dict(BertModel(_config(), rng=np.random.default_rng(1)), tensors, strict=False)
    assert report.missing == ["embeddings.LayerNorm.bias"]
    assert report.unexpected == ["encoder.layer.0.extra.weight"]
    both = dict(to_hf_state_dict(source))
    both["embeddings.LayerNorm.gamma"] = both["embeddings.LayerNorm.weight"]
    with pytest.raises(RuntimeError, match="holds both embeddings.LayerNorm.gamma and embeddings.LayerNorm.weight"):
        load_hf_state_dict(BertModel(_config()), both)


def test_from_pretrained_reads_a_bfloat16_checkpoint_as_transformers_does(tmp_path):
    source = BertModel(_config(), rng=np.random.default_rng(0))
    with open(tmp_path / "config.json", "w") as f:
        json.dump(source.config.to_json_dict(), f)
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)).to(torch.bfloat16)
               for k, v in to_hf_state_dict(source).items()}, str(tmp_path / "model.safetensors"))
    model = BertModel.from_pretrained(tmp_path)
    hf = transformers.BertModel.from_pretrained(str(tmp_path), torch_dtype=torch.float32, add_pooling_layer=False)
    theirs = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    ours = to_hf_state_dict(model)
    for key, value in ours.items():  # bfloat16 widened to float32 is exact: equal, not close
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, theirs[key], err_msg=key)
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(_ids())).last_hidden_state.numpy()
    np.testing.assert_allclose(model(_ids()).numpy(), want, rtol=1e-4, atol=1e-5)


def test_from_pretrained_names_the_file_of_a_truncated_checkpoint(tmp_path):
    source = BertModel(_config(), rng=np.random.default_rng(0))
    source.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor .* the file is truncated or corrupt"):
        BertModel.from_pretrained(tmp_path)


def test_evaluate_takes_the_encodings_step_trains_on_with_their_mask():
    model = BertModel(_config(), rng=np.random.default_rng(0))
    lengths = np.array([6, 3, 1, 4])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, np.random.default_rng(2).integers(1, VOCAB, (4, T)), 0)
    enc = Encoding(ids, mask, np.zeros_like(ids))
    targets = np.random.default_rng(3).integers(0, 16, (4, T))
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.0), cross_entropy_per_token, route="eager")
    trainer.step(enc, targets)
    got = trainer.evaluate(enc, targets, batch_size=2)["loss"]
    model.eval()
    halves = [cross_entropy_per_token(model(enc[i:i + 2]), targets[i:i + 2]).item() for i in (0, 2)]
    assert got == pytest.approx(np.mean(halves), rel=1e-6)
    unmasked = cross_entropy_per_token(model(ids), targets).item()
    assert abs(got - unmasked) > 1e-4  # the mask changes this loss: the test can tell it was used


def cross_entropy_per_token(out, y):
    return cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def test_a_null_pad_token_id_means_no_padding_row_as_transformers():
    raw = dict(model_type="bert", **{k: v for k, v in _config().to_json_dict().items() if k != "model_type"})
    raw["pad_token_id"] = None
    config = BertConfig.from_json(raw)
    assert config.pad_token_id is None and config.to_json_dict()["pad_token_id"] is None
    ours = BertModel(config, rng=np.random.default_rng(0))
    assert ours.embeddings.word_embeddings.padding_idx is None
    hf = transformers.BertModel(transformers.BertConfig(**config.to_json_dict()), add_pooling_layer=False)
    hf.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in to_hf_state_dict(ours).items()})
    ids = np.array([[0, 5, 0, 7]])
    w = np.random.default_rng(1).standard_normal((1, 4, 16)).astype(np.float32)
    (ours(ids) * tensor(w)).sum().backward()
    (hf(input_ids=torch.from_numpy(ids)).last_hidden_state * torch.from_numpy(w)).sum().backward()
    row0 = ours.embeddings.word_embeddings.weight.grad[0]
    np.testing.assert_allclose(row0, hf.embeddings.word_embeddings.weight.grad[0].numpy(), rtol=1e-4, atol=1e-5)
    assert np.abs(row0).sum() > 1.0  # row 0 trains
    with pytest.raises(ValueError, match="pad_token_id must be a token id in the vocabulary"):
        _config(pad_token_id=True)
