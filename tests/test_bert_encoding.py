"""A plain BertModel takes a tokenizer's Encoding as its one argument (what a Trainer hands the model), using its
attention mask and token types, as transformers' model(**encoding) does; on the eager and streaming routes alike.

4 of these 5 tests fail on 04e60b5, before the change in models/bert.py (BertModel(encoding) died in NumPy: an
Encoding's items are batches of one, so np.asarray nested to its 64-dimension limit); the fused route's refusal
passes there too (kept: it pins that the refusal stands). With this file copied into a
worktree of 04e60b5 (git worktree add /tmp/old-be 04e60b5), run in /tmp/old-be:
`PYTHONPATH=/tmp/old-be NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_bert_encoding.py`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tensorarena import optim
from tensorarena.models.bert import BertConfig, BertModel, to_hf_state_dict
from tensorarena.text import Encoding
from tensorarena.train.trainer import Trainer

VOCAB, T = 40, 7


def _config(dropout=0.0):
    return BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=12, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout, dtype=np.float64)


def _padded(seed, lengths=(7, 4, 1, 2)):
    """Right-padded rows of these lengths ([PAD] = 0), a second segment in the long rows."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(1, VOCAB, (len(lengths), T)), 0)
    types = np.where((np.arange(T) >= 3) & (mask == 1), 1, 0)
    return Encoding(ids, mask, types)


# Regression (fixed): BertModel(encoding) raised NumPy's "setting an array element with a sequence ... 64
# dimensions"; it now reads the Encoding's arrays, and gives what transformers' BertModel(**encoding) gives.
def test_an_encoding_alone_equals_its_arrays_and_transformers():
    model = BertModel(_config(), rng=np.random.default_rng(0))
    enc = _padded(1)
    got = model(enc).numpy()
    np.testing.assert_array_equal(got, model(enc.input_ids, enc.attention_mask, enc.token_type_ids).numpy())
    unmasked = model(enc.input_ids, None, enc.token_type_ids).numpy()
    assert np.abs(got - unmasked).max() > 1e-3  # the mask matters in this batch: the test can tell
    hf_config = transformers.BertConfig(**model.config.to_json_dict(), attn_implementation="eager")
    hf = transformers.BertModel(hf_config, add_pooling_layer=False).double().eval()
    hf.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in to_hf_state_dict(model).items()})
    with torch.no_grad():
        want = hf(**{k: torch.from_numpy(getattr(enc, k)) for k in ("input_ids", "attention_mask",
                                                                        "token_type_ids")}).last_hidden_state
    real = enc.attention_mask.astype(bool)  # padded positions' states are not compared (nothing reads them)
    np.testing.assert_allclose(got[real], want.numpy()[real], rtol=1e-9, atol=1e-10)


def test_an_encoding_with_a_mask_passed_again_is_refused_naming_both():
    model = BertModel(_config(), rng=np.random.default_rng(0))
    enc = _padded(1)
    with pytest.raises(TypeError, match=r"input_ids is an Encoding.*pass the Encoding alone"):
        model(enc, attention_mask=enc.attention_mask)


def _mse_to(target):
    return lambda out, _y: ((out - target) * (out - target)).mean()


def _train(route, tmp_path):
    model = BertModel(_config(dropout=0.1), rng=np.random.default_rng(2))
    target = np.random.default_rng(3).standard_normal((4, T, 16))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), _mse_to(target), route=route,
                      store_dir=tmp_path / route)
    reports = [trainer.step(_padded(seed), None) for seed in range(3)]
    assert {r.route for r in reports} == {route}
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return [r.loss for r in reports], {k: p.data.copy() for k, p in model.named_parameters()}


# Regression (fixed): a Trainer hands the Encoding to the model as its one argument; a plain BertModel could not
# take it on any route. Now the eager and streaming routes train it alike, with its mask (float64, dropout on).
@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_a_trainer_trains_a_plain_bert_model_on_encodings(route, tmp_path):
    losses, params = _train(route, tmp_path)
    assert np.all(np.isfinite(losses))
    if route == "streaming":
        want_losses, want_params = _train("eager", tmp_path / "eager-ref")
        np.testing.assert_allclose(losses, want_losses, rtol=0, atol=1e-10)
        for k, v in want_params.items():
            np.testing.assert_allclose(params[k], v, rtol=0, atol=1e-10, err_msg=k)


def test_the_fused_route_refuses_an_encoding_saying_what_to_pass(tmp_path):
    # The fused route holds its inputs in one array buffer: an Encoding is refused before any update, naming it.
    model = BertModel(_config(), rng=np.random.default_rng(2))
    before = {k: p.data.copy() for k, p in model.named_parameters()}
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), _mse_to(np.zeros((4, T, 16))),
                      route="fused")
    with pytest.raises(TypeError, match=r"Encoding"):
        trainer.step(_padded(0), None)
    for k, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, before[k])
