"""Trainer.evaluate borrows the fused slab between steps (compile/lend.py, f8743f2): three follow-ups.

1. The slab is the step's: an evaluate in one thread while another thread steps would write the step's buffers
   under it. evaluate now takes the trainer's one-at-a-time lock, as step/save/load do (RuntimeError naming both).
2. evaluate's default batch was 1024 rows whatever the training batch: on the fused route that overflows the slab
   (memory the plan never counted). The default is now the last training batch's rows.
3. A batch_size larger than the slab warned once per evaluation batch (63 lines for 2000 rows at 32); now once
   per evaluate call.

On f8743f2..5ea5367 (before these), 3 of this file's 4 tests fail (the lock, the default, the one warning):
    git worktree add /tmp/wt 5ea5367 && cp tests/test_evaluate_slab_followups.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=. python -m pytest -q -p no:cacheprovider tests/test_evaluate_slab_followups.py)
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.memory.pool import BlockPool
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

from mlp_cases import labelled_rows, small_mlp


def _fused(pool: BlockPool, loss=cross_entropy) -> Trainer:
    model = small_mlp(seed=3, hidden=(64, 64))
    return Trainer(model, ta.optim.AdamW(model.parameters(), lr=1e-2), loss, route="fused", pool=pool)


def test_evaluate_refuses_while_another_thread_steps():
    entered, release = threading.Event(), threading.Event()

    def slow_loss(out, y):
        entered.set()
        release.wait(30)
        return cross_entropy(out, y)

    trainer = _fused(BlockPool(), slow_loss)
    x, y = labelled_rows(n=1, batch=16)[0]
    stepper = threading.Thread(target=trainer.step, args=(x, y), name="stepper")
    stepper.start()
    try:
        assert entered.wait(30)
        with pytest.raises(RuntimeError, match=r"Trainer\.evaluate\(\) called in thread 'MainThread' while "
                                               r"Trainer\.step\(\) in thread 'stepper' runs"):
            trainer.evaluate(x, y)
    finally:
        release.set()
        stepper.join(30)
    assert trainer.step_count == 1 and trainer.evaluate(x, y)["loss"] > 0  # and afterwards it runs


def test_evaluate_defaults_to_the_training_batch_and_stays_in_the_slab():
    pool = BlockPool()
    trainer = _fused(pool)
    for x, y in labelled_rows(n=2, batch=16):
        trainer.step(x, y)
    held_x, held_y = labelled_rows(n=1, batch=100, seed=7)[0]
    misses = pool.stats.misses
    default = trainer.evaluate(held_x, held_y)
    assert pool.stats.misses == misses  # no pool block: every batch of 16 fitted the slab
    assert default == trainer.evaluate(held_x, held_y, batch_size=16)


def test_a_batch_too_large_for_the_slab_warns_once_per_call(caplog):
    trainer = _fused(BlockPool())
    for x, y in labelled_rows(n=2, batch=16):
        trainer.step(x, y)
    held_x, held_y = labelled_rows(n=1, batch=400, seed=7)[0]
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        result = trainer.evaluate(held_x, held_y, batch_size=100)  # four batches, each beyond the slab
    beyond = [r for r in caplog.records if "beyond the fused slab" in r.getMessage()]
    assert len(beyond) == 1, [r.getMessage() for r in beyond]
    # and the figures are those of an evaluation that never touched the slab (an eager trainer, own pool)
    eager = Trainer(trainer.model, ta.optim.SGD(trainer.model.parameters(), lr=0.0), cross_entropy, route="eager",
                    pool=BlockPool())
    reference = eager.evaluate(held_x, held_y, batch_size=100)
    assert result["accuracy"] == reference["accuracy"]
    np.testing.assert_allclose(result["loss"], reference["loss"], rtol=1e-6)


def test_before_any_step_the_default_is_1024_rows():
    trainer = _fused(BlockPool())
    held_x, held_y = labelled_rows(n=1, batch=40, seed=7)[0]
    assert trainer.evaluate(held_x, held_y) == trainer.evaluate(held_x, held_y, batch_size=1024)
