"""`tensorarena train --save` keeps the completed steps when a later step fails with any error (a helper's hunt).

A non-finite loss and Ctrl-C saved the steps before them; a MemoryError (as under `ulimit -v`) or any other error
in step 5 wrote nothing, and 4 completed steps were lost, though the failed step changed nothing on any route.
Now the steps are saved and the error says so, with the loader at the failed step's batch (a --resume trains it
next, as after a non-finite loss: the save matches a clean 2-step run's); a step that stopped part-way ("partly
applied") is not saved.

On 745266e (before the fix) 2 of this file's 3 tests fail (the control passes: a partly applied step saves nothing):
    git worktree add /tmp/wt 745266e && cp tests/test_cli_failures_save_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_cli_failures_save_hunt.py)
"""

from __future__ import annotations

import pytest

import tensorarena.models.mlp as mlp_module
from tensorarena import cli
from tensorarena.optim.optimizer import PartlyAppliedError
from tensorarena.train.checkpoint import read_metadata


def _failing_at_call(monkeypatch, n: int, error: Exception) -> None:
    real, calls = mlp_module.MLP.forward, {"n": 0}

    def forward(self, x):
        calls["n"] += 1
        if calls["n"] == n:
            raise error
        return real(self, x)

    monkeypatch.setattr(mlp_module.MLP, "forward", forward)
    # An error no route escapes: since the MLP streams (Sequential.stream_stages), a MemoryError moves it to the
    # streaming route (Trainer's oom_fallback), whose stages never call this forward.
    monkeypatch.delattr(mlp_module.MLP, "stream_stages")


def _train(save) -> None:
    cli.main(["train", "--steps", "8", "--route", "eager", "--save", str(save), "--no-progress",
              "--train-size", "256", "--test-size", "64"])


def test_a_memory_error_at_step_5_keeps_the_4_steps_before_it(monkeypatch, tmp_path):
    save = tmp_path / "run.safetensors"
    _failing_at_call(monkeypatch, 5, MemoryError("Unable to allocate 64.0 MiB for an array (injected)"))
    with pytest.raises(SystemExit, match=r"ran out of memory .*\. The 4 steps before it are saved in --save"):
        _train(save)
    assert read_metadata(save)["step"] == 4


def test_any_other_error_keeps_them_too_and_says_so(monkeypatch, tmp_path):
    clean = tmp_path / "clean.safetensors"
    cli.main(["train", "--steps", "2", "--total-steps", "8", "--route", "eager", "--save", str(clean), "--no-progress",
              "--train-size", "256", "--test-size", "64"])
    save = tmp_path / "run.safetensors"
    _failing_at_call(monkeypatch, 3, RuntimeError("a bug in the user's model"))
    with pytest.raises(RuntimeError, match="a bug in the user's model") as raised:
        _train(save)
    assert any("The 2 steps before it are saved in --save" in note for note in raised.value.__notes__)
    saved, reference = read_metadata(save), read_metadata(clean)
    assert saved["step"] == 2 and saved["extra"]["loader"] == reference["extra"]["loader"]


def test_a_partly_applied_step_is_not_saved(monkeypatch, tmp_path):
    save = tmp_path / "run.safetensors"
    _failing_at_call(monkeypatch, 3, PartlyAppliedError("step 3 failed: the step is partly applied"))
    with pytest.raises(RuntimeError, match="partly applied"):
        _train(save)
    assert not save.exists()
