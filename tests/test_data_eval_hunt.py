"""Trainer.evaluate on odd batches and outputs against torch, and BatchLoader resuming (a helper agent's hunt).

1. A model that returns a tuple its loss unpacks ((logits, aux)), which step() trains: evaluate raised
   AttributeError ('tuple' object has no attribute 'shape'). Its loss is given now, and no accuracy.
2. A one-logit binary classifier with integer labels: argmax over one column is always 0, so "accuracy" was the
   share of label-0 rows (0.5 for a perfect classifier). None now: there is no class axis to argmax over.
3. A loss of many values (reduction="none"): "item() needs a tensor with one element", naming neither the loss nor
   what to do. A ValueError from evaluate that says to reduce it now.
4. A dict batch whose arrays have other rows than its first: paired wrong rows with no word (or failed inside the
   model at the last batch). Refused now, as short targets are.
5. Targets evaluate cannot cut by rows (a torch tensor, an object of the user's) on the eager route, which trains on
   them: the fused route's message, advising route='eager'. evaluate's own message now.
6. BatchLoader.load_state of a generator state that does not fit the loader's generator (another bit generator,
   a corrupt dict): NumPy's "state must be for a MT19937 PRNG" or a bare KeyError 'state'. A saved order of
   fractional indices was cut to int64 and resumed elsewhere (the cursor refused the same). Both ValueErrors now.
The rest (partial last batch, batch 1, evaluate between fused steps, resuming and rewinding) held; tests guard it.

On 6dda1f3 (before the fixes) 13 of this file's 18 tests fail:
    mkdir /tmp/base && git archive 6dda1f3 | tar -x -C /tmp/base && cp tests/test_data_eval_hunt.py /tmp/base/tests/ &&
    (cd /tmp/base && PYTHONPATH=/tmp/base python -m pytest -q -p no:cacheprovider tests/test_data_eval_hunt.py)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn, optim
from tensorarena.data.loader import BatchLoader
from tensorarena.models import MLP, MLPConfig
from tensorarena.train.trainer import Trainer

LOSS_TOL = 1e-5  # float32 forward, the batch losses summed in float64: ~1e-7 seen
RNG = np.random.default_rng(1)
X = RNG.standard_normal((37, 8)).astype(np.float32)
Y = RNG.integers(0, 4, 37).astype(np.int64)


def _mlp(route: str, dropout: float = 0.0) -> tuple[MLP, Trainer]:
    model = MLP(MLPConfig(in_features=8, hidden=(16,), out_features=4, dropout=dropout),
                rng=np.random.default_rng(0))
    return model, Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy, route=route)


def _torch_outputs(model: MLP, x: np.ndarray) -> torch.Tensor:
    """The same weights in a torch Sequential, evaluated on x."""
    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    tm.load_state_dict({k.removeprefix("net."): torch.tensor(np.array(v)) for k, v in model.state_dict().items()})
    with torch.no_grad():
        return tm(torch.tensor(x))


# -- what held: the mean over samples, whatever the batches, on the eager and fused routes --------------------------

@pytest.mark.parametrize("route", ["eager", "fused"])
def test_loss_and_accuracy_are_the_mean_over_samples_for_any_batch_size(route):
    model, trainer = _mlp(route)
    trainer.step(X[:16], Y[:16])
    out = _torch_outputs(model, X)
    loss = torch.nn.functional.cross_entropy(out, torch.tensor(Y)).item()
    accuracy = (out.argmax(-1).numpy() == Y).mean()
    for batch_size in (1, 5, 16, 37, 100):  # partial last batches, one row, one batch, more than the rows
        result = trainer.evaluate(X, Y, batch_size=batch_size)
        assert abs(result["loss"] - loss) <= LOSS_TOL, batch_size
        assert result["accuracy"] == pytest.approx(accuracy, abs=1e-12), batch_size


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_evaluate_between_steps_changes_no_parameter_draw_mode_or_plan(route):
    """Training with evaluations in between ends bit for bit where training without them does (dropout on: an
    evaluation drew no mask), the model back in train mode, the fused step not traced again."""
    x, y = np.tile(X[:32], (2, 1)), np.tile(Y[:32], 2)
    finals = []
    for evaluate in (False, True):
        ta.manual_seed(0)
        model, trainer = _mlp(route, dropout=0.5)
        for i in range(4):
            trainer.step(x[16 * i:16 * i + 16], y[16 * i:16 * i + 16])
            if evaluate and i == 1:
                traces = trainer.fused.traces if trainer.fused is not None else None
                first = trainer.evaluate(X, Y, batch_size=7)
                assert trainer.evaluate(X, Y, batch_size=7) == first  # dropout off
                assert all(m.training for m in model.modules())
        if evaluate and trainer.fused is not None:
            assert trainer.fused.traces == traces
        finals.append({k: np.array(v, copy=True) for k, v in model.state_dict().items()})
    for key in finals[0]:
        np.testing.assert_array_equal(finals[0][key], finals[1][key])


# -- 1. a model returning a tuple ---------------------------------------------------------------------------------

class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4, rng=np.random.default_rng(0))

    def forward(self, x):
        h = self.lin(x)
        return h, h.sum()


def _unpacking_loss(out, targets):
    logits, aux = out
    return nn.functional.cross_entropy(logits, targets) + 0.0 * aux


@pytest.mark.parametrize("route", ["eager", "fused"])
def test_a_model_returning_a_tuple_gets_its_loss_and_no_accuracy(route):
    model = TwoOutputs()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), _unpacking_loss, route=route)
    trainer.step(X[:8], Y[:8])
    result = trainer.evaluate(X, Y, batch_size=8)
    tm = torch.nn.Linear(8, 4)
    tm.load_state_dict({k: torch.tensor(np.array(v)) for k, v in model.lin.state_dict().items()})
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(tm(torch.tensor(X)), torch.tensor(Y)).item()
    assert abs(result["loss"] - want) <= LOSS_TOL
    assert result["accuracy"] is None


# -- 2. one logit -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["eager", "fused"])
def test_a_one_logit_classifier_has_no_argmax_accuracy(route):
    labels = (X[:, 0] > 0).astype(np.int64)
    model = nn.Linear(8, 1, rng=np.random.default_rng(0))
    model.weight.data[...] = 0.0
    model.weight.data[0, 0] = 5.0  # a perfect classifier at threshold 0: argmax said it was right half the time
    model.bias.data[...] = 0.0

    def loss(out, targets):
        return nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), ta.tensor(targets).float())

    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.0), loss, route=route)
    trainer.step(X[:8], labels[:8])
    result = trainer.evaluate(X, labels, batch_size=16)
    want = torch.nn.functional.binary_cross_entropy_with_logits(5.0 * torch.tensor(X[:, 0]),
                                                                torch.tensor(labels).float()).item()
    assert abs(result["loss"] - want) <= LOSS_TOL
    assert result["accuracy"] is None


# -- 3. a loss of many values -------------------------------------------------------------------------------------

def test_a_loss_of_many_values_is_a_clear_error():
    _, trainer = _mlp("eager")
    trainer.loss_fn = nn.CrossEntropyLoss(reduction="none")
    with pytest.raises(ValueError, match=r"evaluate: loss_fn 'CrossEntropyLoss' returned a Tensor of shape \(8,\).*"
                                         r"reduce it"):
        trainer.evaluate(X, Y, batch_size=8)


# -- 4. a dict batch of uneven rows -------------------------------------------------------------------------------

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4, rng=np.random.default_rng(0))

    def forward(self, batch):
        return self.lin(ta.tensor(batch["x"]) * ta.tensor(batch["scale"]))


@pytest.mark.parametrize("scale_rows", [25, 30])
def test_a_dict_batch_of_uneven_rows_is_refused(scale_rows):
    model = Scaled()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy, route="eager")
    with pytest.raises(ValueError, match=rf"same rows .*37.*'scale': {scale_rows}"):
        trainer.evaluate({"x": X, "scale": np.ones((scale_rows, 1), np.float32)}, Y, batch_size=8)
    even = trainer.evaluate({"x": X, "scale": np.ones((37, 1), np.float32)}, Y, batch_size=8)
    assert even["loss"] == pytest.approx(trainer.evaluate({"x": X, "scale": np.ones((37, 1), np.float32)}, Y,
                                                          batch_size=37)["loss"], abs=LOSS_TOL)


class Bag(nn.Module):
    """Pads nothing: each row is a list of token ids of its own length."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, rng=np.random.default_rng(0))

    def forward(self, batch):
        return ta.stack([self.emb(ta.tensor(np.array(ids))).mean(dim=0) for ids in batch["ids"]])


def test_a_dict_batch_of_ragged_lists_is_still_cut_by_rows():
    """The rows check counts a list's length: a list of ragged token lists has no NumPy shape."""
    model = Bag()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy, route="eager")
    ids, labels = [[1, 2], [3], [4, 5, 6], [7], [8, 9]], np.array([0, 1, 2, 3, 0])
    whole = trainer.evaluate({"ids": ids}, labels, batch_size=5)
    assert trainer.evaluate({"ids": ids}, labels, batch_size=2)["loss"] == pytest.approx(whole["loss"], abs=LOSS_TOL)
    with pytest.raises(ValueError, match=r"first one has 4.*'other': 5"):
        trainer.evaluate({"ids": ids[:4], "other": [0] * 5}, labels, batch_size=2)


# -- 5. targets evaluate cannot cut ------------------------------------------------------------------------------

class Box:
    def __init__(self, labels):
        self.labels = labels


@pytest.mark.parametrize("targets", [torch.tensor(Y), Box(Y)], ids=["torch", "object"])
def test_targets_that_cannot_be_cut_get_evaluates_own_message(targets):
    _, trainer = _mlp("eager")
    trainer.loss_fn = lambda out, t: nn.functional.cross_entropy(out, t.labels if isinstance(t, Box) else t)
    trainer.step(X[:8], Box(Y[:8]) if isinstance(targets, Box) else targets[:8])  # the eager step takes them
    with pytest.raises(TypeError, match=r"^evaluate cuts the targets into batches by rows.*np\.asarray") as info:
        trainer.evaluate(X, targets, batch_size=8)
    assert "route='eager'" not in str(info.value)  # the advice was the route it was on


# -- the loader: resuming ---------------------------------------------------------------------------------------

def _loader(seed: int = 0, bit_generator=np.random.PCG64) -> BatchLoader:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    return BatchLoader(x, np.arange(10), 3, rng=np.random.Generator(bit_generator(seed)))


def test_a_resumed_or_rewound_loader_yields_what_the_uninterrupted_one_does():
    """What held: 200 random walks of next / rewind / state through JSON into a fresh loader, against one that
    never stopped; every epoch a new shuffle of distinct rows, the partial batch dropped."""
    for trial in range(200):
        walk = np.random.default_rng(trial)
        rows = int(walk.integers(1, 12))
        batch = int(walk.integers(1, rows + 1))
        x, y = np.arange(rows, dtype=np.float64)[:, None], np.arange(rows)
        whole = BatchLoader(x, y, batch, rng=np.random.default_rng(trial))
        want = [whole.next()[1].copy() for _ in range(20)]
        loader, got = BatchLoader(x, y, batch, rng=np.random.default_rng(trial)), []
        while len(got) < 20:
            move = walk.integers(0, 3)
            if move == 0 and got:
                loader.rewind()
                got.pop()
            elif move == 1:
                state = json.loads(json.dumps(loader.state()))
                loader = BatchLoader(x, y, batch, rng=np.random.default_rng(10_000 + trial))
                loader.load_state(state)
            got.append(loader.next()[1].copy())
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)
        per_epoch = rows // batch
        for epoch in range(len(want) // per_epoch):
            seen = np.concatenate(want[epoch * per_epoch:(epoch + 1) * per_epoch])
            assert len(set(seen.tolist())) == per_epoch * batch


@pytest.mark.parametrize("rng", [{"bit_generator": "PCG64"}, "saved"], ids=["corrupt", "other-kind"])
def test_a_generator_state_that_does_not_fit_is_a_clear_error_and_changes_nothing(rng):
    source = _loader()
    source.next()
    state = source.state()
    bit_generator = np.random.MT19937 if rng == "saved" else np.random.PCG64
    if rng != "saved":
        state["rng"] = rng
    loader, twin = _loader(5, bit_generator), _loader(5, bit_generator)
    loader.next(), twin.next()
    with pytest.raises(ValueError, match=r"saved generator state \(PCG64\) does not fit this loader's "
                                         rf"{bit_generator.__name__} generator.*BatchLoader\.state\(\)"):
        loader.load_state(state)
    for _ in range(5):
        np.testing.assert_array_equal(loader.next()[1], twin.next()[1])


def test_a_fractional_saved_order_is_refused():
    loader = _loader()
    loader.next()
    state = loader.state()
    state["order"] = [index + 0.5 for index in state["order"]]  # int64 cast it to a shuffle of the rows
    with pytest.raises(ValueError, match="integer example indices, got float64"):
        _loader().load_state(state)
