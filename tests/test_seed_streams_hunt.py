"""A job's --seed gives its data, its model's initial weights and its images' noise streams of their own.

Found by a helper's hunt of tensorarena/data: `tensorarena train` drew the digits from default_rng(seed) and built
the MLP from default_rng(seed) too, one stream twice: every odd-indexed training label was the decile of a
first-layer initial weight (100% of 4000, against ~10% for independent draws). The ViT job did the same with its
images, and make_images' chunk 0 noise came from default_rng([seed, 0]), which is default_rng(seed) (a
SeedSequence drops trailing zeros): the labels' own draws.

On 59aa01a the three tests fail:
    git worktree add /tmp/wt 59aa01a && cp tests/test_seed_streams_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_seed_streams_hunt.py)
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena import cli
from tensorarena.data import images
from tensorarena.data.digits import SIZE, train_test_split


class _Built(Exception):
    """Stops a job once its model is built."""


def _stop_when_built(monkeypatch, module, name: str) -> dict:
    seen: dict = {}
    original = getattr(module, name)

    def build(config, *args, rng=None, **kwargs):
        seen["model"] = original(config, *args, rng=rng, **kwargs)
        raise _Built

    monkeypatch.setattr(module, name, build)
    return seen


def test_the_mlp_job_initialises_from_a_stream_not_its_datas(monkeypatch):
    from tensorarena.models import mlp

    seen = _stop_when_built(monkeypatch, mlp, "MLP")
    with pytest.raises(_Built):
        cli.main(["train", "--model", "mlp", "--steps", "1", "--train-size", "4000", "--test-size", "10",
                  "--no-progress", "--seed", "0"])
    (_, y), _ = train_test_split(4000, 10, seed=0)
    seen["model"].materialize()  # the job builds it deferred (its values made where the route keeps them)
    w = seen["model"].net[0].weight.data.astype(np.float64).ravel()
    bound = 1 / np.sqrt(SIZE * SIZE)  # the first layer's uniform init bound (fan_in 256)
    decile = np.floor(10 * (w[:2000] + bound) / (2 * bound)).astype(int)
    matching = float((decile == y[1::2]).mean())
    assert matching < 0.2, f"{matching:.0%} of the odd labels are their weight's decile (independent: ~10%)"


def test_the_vit_job_initialises_from_a_stream_not_its_images(monkeypatch):
    from tensorarena.models import vit

    seen: dict = {}

    def build(config, *args, rng=None, **kwargs):
        seen["rng_state"] = rng.bit_generator.state
        raise _Built

    monkeypatch.setattr(vit, "ViT", build)
    with pytest.raises(_Built):
        cli.main(["train", "--model", "vit-tiny", "--steps", "1", "--image-size", "16", "--patch-size", "8",
                  "--train-size", "8", "--test-size", "4", "--batch-size", "4", "--no-progress", "--seed", "3"])
    assert seen["rng_state"] != np.random.default_rng(3).bit_generator.state


def test_make_images_chunk_noise_is_not_the_labels_stream(monkeypatch):
    made: list = []
    real = np.random.default_rng

    def recording(*args, **kwargs):
        generator = real(*args, **kwargs)
        made.append((args, generator.bit_generator.state["state"]["state"]))
        return generator

    monkeypatch.setattr(np.random, "default_rng", recording)
    images.make_images(300, size=8, seed=5)  # three chunks of 128
    states = [state for _, state in made]
    assert len(made) >= 4, made
    assert len(set(states)) == len(states), f"generators sharing a stream: {made}"
