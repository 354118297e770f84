"""Ctrl-C never loses or corrupts training (tensorarena/train/interrupt.py, Trainer.step, the train jobs, cli.main).

(a) SigintDeferred itself: a SIGINT inside it is held until the body ends, then raised as KeyboardInterrupt; a
    second one stops the body at once (StepAbandoned); the previous handler comes back; off the main thread, or
    under a handler the program installed, nothing changes.
(b) Trainer.step on the eager, fused and streaming routes: a SIGINT sent from another thread while the step runs
    (from inside the loss function, which runs inside the step) leaves the step applied whole: parameters,
    optimizer state, schedule and step_count equal, bit for bit, those of a trainer that was never interrupted,
    at that step and after more steps. The thread-safety rule (one step at a time) still holds.
(c) `tensorarena train` end to end: Ctrl-C in a real process (mlp with and without --save, simcse) exits 130 with
    one line and no traceback, and `--resume` then continues exactly as one uninterrupted run; Ctrl-C during the
    evaluation or the final save (in-process) still saves, whole; a second Ctrl-C during the save leaves the file
    as it was.

Every test sends a real SIGINT (os.kill). A fixture puts Python's own handler in place for each test: a test run
started as a background job inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler.

21 of these 22 tests fail on 4c8b667, the commit before this work (all but the one-step-at-a-time test, which
guards a rule that held before and must still hold with the deferral in place). To see it:
`git worktree add /tmp/wt-interrupt 4c8b667`, copy this file to /tmp/wt-interrupt/tests/, and from inside
/tmp/wt-interrupt run `PYTHONPATH=/tmp/wt-interrupt python -m pytest -q -p no:cacheprovider tests/test_interrupt.py`
(then `git worktree remove --force /tmp/wt-interrupt`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import cli, optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
# An MLP 256 -> 16 -> 10 on the digits (as tests/test_cli_hunt.py): steps of a millisecond or so.
MLP = ["--hidden", "16", "--train-size", "256", "--test-size", "64", "--batch-size", "32", "--dropout", "0.1"]
SIMCSE = ["--model", "simcse", "--batch-size", "2", "--seq-len", "8"]
STEPS = 5  # Trainer-level runs: interrupted at step 3, then two more
INTERRUPTED_AT = 3


pytestmark = pytest.mark.usefixtures("python_sigint_handler")  # conftest.py: Python's own, as in a shell's foreground


def _interrupt():
    """tensorarena.train.interrupt, imported per test so that each test fails on its own where it is missing."""
    from tensorarena.train import interrupt

    return interrupt


def _sigint() -> None:
    """SIGINT to this process from here (the main thread): its handler runs before os.kill returns."""
    os.kill(os.getpid(), signal.SIGINT)


def _sigint_from_thread() -> None:
    """SIGINT to this process from another thread, waited for: it lands while the caller is running."""
    sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT))
    sender.start()
    sender.join(30)
    assert not sender.is_alive()


def _busy(n: int = 200_000) -> int:
    """Python bytecode to run (a handler raises inside it at the latest)."""
    total = 0
    for i in range(n):
        total += i
    return total


# -- (a) the deferral ---------------------------------------------------------------------------------------

def test_a_sigint_inside_the_deferral_waits_for_the_body_then_raises():
    interrupt = _interrupt()
    done = []
    with pytest.raises(KeyboardInterrupt) as raised:
        with interrupt.SigintDeferred("the work", lambda: "abandoned"):
            _sigint()
            _busy()
            done.append("body ran to its end")
    assert done == ["body ran to its end"]
    assert not isinstance(raised.value, interrupt.StepAbandoned)
    assert str(raised.value) == "Ctrl-C was held until the work completed"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_first_sigint_says_at_once_what_it_waits_for(capfd):
    """Without a word, a Ctrl-C held through a long streamed step looks ignored and gets pressed again, which
    abandons the step. Without the notice in _Held.__call__ this fails: stderr stays empty."""
    interrupt = _interrupt()
    with pytest.raises(KeyboardInterrupt):
        with interrupt.SigintDeferred("the training step", lambda: "abandoned"):
            _sigint()
            _busy()
            said_during_the_step = capfd.readouterr().err
    assert said_during_the_step == ("\nCtrl-C: waiting for the training step to complete, then stopping "
                                    "(press Ctrl-C again to abandon it)\n")


def test_no_sigint_means_nothing_raised_and_the_handler_is_back():
    interrupt = _interrupt()
    with interrupt.SigintDeferred("the work", lambda: "abandoned"):
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # held while inside
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_sigint_stops_the_body_at_once():
    interrupt = _interrupt()
    reached = []
    with pytest.raises(interrupt.StepAbandoned, match="^the work was cut short$"):
        with interrupt.SigintDeferred("the work", lambda: "the work was cut short"):
            _sigint()
            reached.append("after the first")
            _sigint()
            _busy()
            reached.append("after the second")
    assert reached == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_error_in_the_body_restores_the_handler_and_a_held_sigint_still_stops():
    interrupt = _interrupt()
    with pytest.raises(ValueError, match="boom"):
        with interrupt.SigintDeferred("the work", lambda: ""):
            raise ValueError("boom")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt, match="failed with ValueError: boom") as raised:
        with interrupt.SigintDeferred("the work", lambda: ""):
            _sigint()
            raise ValueError("boom")
    assert isinstance(raised.value.__cause__, ValueError)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_raise_after_false_holds_and_raises_nothing():
    interrupt = _interrupt()
    done = []
    with interrupt.SigintDeferred("the write", lambda: "", raise_after=False):
        _sigint()
        done.append(1)
    assert done == [1] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_nothing_changes():
    interrupt = _interrupt()
    seen, errors = [], []

    def body():
        try:
            with interrupt.SigintDeferred("the work", lambda: ""):
                seen.append(signal.getsignal(signal.SIGINT))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=body)
    worker.start()
    worker.join(30)
    assert errors == [] and seen == [signal.default_int_handler]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_the_program_installed_is_left_alone():
    interrupt = _interrupt()
    calls = []
    signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    with interrupt.SigintDeferred("the work", lambda: ""):
        _sigint()
        assert calls == [signal.SIGINT]  # delivered at once, to the program's handler
    assert calls == [signal.SIGINT]  # and nothing raised after


# -- (b) Trainer.step on every route -------------------------------------------------------------------------

class LossSendingSigint:
    """cross_entropy that, when armed with n, sends n SIGINTs from another thread while it runs (the loss runs
    inside the step on every route: eager's forward, fused's Python replay, the streamed last stage)."""

    def __init__(self) -> None:
        self.armed = 0
        self.sent = 0

    def __call__(self, outputs, targets):
        count, self.armed = self.armed, 0  # disarmed first: a StepAbandoned may leave the loop
        for _ in range(count):
            self.sent += 1
            _sigint_from_thread()
        return cross_entropy(outputs, targets)


def _trainer(route: str, tmp_path: Path, name: str) -> Trainer:
    """A tiny ViT (dropout on: the RNG's state must stay in step too) with AdamW and a warm-up cosine schedule."""
    config = ViTConfig(image_size=16, patch_size=4, num_classes=5, dim=32, depth=2, num_heads=4, dropout=0.1)
    model = ViT(config, rng=np.random.default_rng(0))
    optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    schedule = optim.lr_scheduler.warmup_cosine(optimizer, warmup_steps=2, total_steps=10)
    store = tmp_path / f"store-{name}" if route == "streaming" else None
    return Trainer(model, optimizer, LossSendingSigint(), scheduler=schedule, route=route, store_dir=store)


def _batches():
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((3, 3, 16, 16)).astype(np.float32), rng.integers(0, 5, 3)) for _ in range(STEPS)]


def _state(trainer: Trainer) -> dict:
    """Everything a step changes, copied: parameters, optimizer state, schedule, RNG, step count."""
    from tensorarena.train.checkpoint import _generators

    if trainer.stream is not None:
        trainer.stream.to_memory()  # the next step moves the state back into the store
    return {"params": {k: np.array(v) for k, v in trainer.model.state_dict().items()},
            "optimizer": trainer.optimizer.state_dict(), "schedule": trainer.scheduler.state_dict(),
            "rng": {k: g.bit_generator.state for k, g in _generators(trainer.model).items()},
            "step_count": trainer.step_count}


def _assert_identical(a, b, where="") -> None:
    """Exact equality of nested dicts / lists of arrays and numbers."""
    if isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str), where
        for key in a:
            _assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert np.array_equal(np.asarray(a), np.asarray(b)), where
    else:
        assert a == b, where


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
def test_a_sigint_during_a_step_lets_the_step_finish_whole(route, tmp_path):
    ta.manual_seed(0)
    reference = _trainer(route, tmp_path, "reference")
    ta.manual_seed(0)
    trainer = _trainer(route, tmp_path, "interrupted")
    for index, (x, y) in enumerate(_batches(), start=1):
        reference.step(x, y)
        if index != INTERRUPTED_AT:
            trainer.step(x, y)
            continue
        trainer.loss_fn.armed = 1
        with pytest.raises(KeyboardInterrupt) as raised:
            trainer.step(x, y)
        assert trainer.loss_fn.sent == 1
        assert trainer.step_count == INTERRUPTED_AT  # the step was applied, then the Ctrl-C raised
        _assert_identical(_state(trainer), _state(reference), f"after step {index}")
        assert not isinstance(raised.value, _interrupt().StepAbandoned)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _assert_identical(_state(trainer), _state(reference), f"after step {STEPS}")
    assert trainer.route == route


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
def test_a_second_sigint_abandons_the_step_saying_so_and_the_trainer_is_not_left_locked(route, tmp_path):
    interrupt = _interrupt()
    ta.manual_seed(0)
    trainer = _trainer(route, tmp_path, "abandoned")
    batches = _batches()
    for x, y in batches[:INTERRUPTED_AT - 1]:
        trainer.step(x, y)
    trainer.loss_fn.armed = 2
    with pytest.raises(interrupt.StepAbandoned) as raised:
        trainer.step(*batches[INTERRUPTED_AT - 1])
    message = str(raised.value)
    assert message.startswith(f"step {INTERRUPTED_AT} was abandoned part-way by a second Ctrl-C"), message
    assert "load the last checkpoint" in message
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # Stopped in the loss, before any update: nothing was counted, and the next step is not refused as if another
    # thread still held the trainer (_one_at_a_time's lock was given back).
    assert trainer.step_count == INTERRUPTED_AT - 1
    assert trainer.step(*batches[INTERRUPTED_AT - 1]).step == INTERRUPTED_AT


def test_one_step_at_a_time_still_holds_and_a_step_off_the_main_thread_holds_no_sigint(tmp_path):
    trainer = _trainer("eager", tmp_path, "threads")
    x, y = _batches()[0]
    inside, go, errors, seen = threading.Event(), threading.Event(), [], []

    def waiting_loss(outputs, targets):
        inside.set()
        go.wait(30)
        return cross_entropy(outputs, targets)

    trainer.loss_fn = waiting_loss

    def other_thread():
        try:
            trainer.step(x, y)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=other_thread)
    worker.start()
    try:
        assert inside.wait(60)
        seen.append(signal.getsignal(signal.SIGINT))  # the other thread's step changed no handler
        with pytest.raises(RuntimeError, match="not thread-safe"):
            trainer.step(x, y)
        seen.append(signal.getsignal(signal.SIGINT))  # the refused step put Python's back
    finally:
        go.set()
        worker.join(60)
    assert errors == [] and trainer.step_count == 1
    assert seen == [signal.default_int_handler, signal.default_int_handler]


# -- (c) the command -----------------------------------------------------------------------------------------

LAUNCHER = textwrap.dedent('''
    """python launch.py MARKER ARGV...: `tensorarena ARGV...`, appending each completed step's number to MARKER."""
    import runpy, signal, sys, time

    # Ctrl-C as a shell's foreground process gets it: a test run started in the background inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from tensorarena.train import trainer

    marker = sys.argv.pop(1)
    real_step = trainer.Trainer.step

    def step(self, *args):
        report = real_step(self, *args)
        with open(marker, "a") as f:
            f.write(f"{report.step}\\n")
        time.sleep(0.02)  # the run lasts seconds, not a blink, however fast the machine
        return report

    trainer.Trainer.step = step
    sys.argv[0] = "tensorarena"
    runpy.run_module("tensorarena", run_name="__main__")
''')


def _env() -> dict:
    return {**os.environ, "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m tensorarena ARGV` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "tensorarena", *argv], capture_output=True, text=True, env=_env(),
                          cwd=REPO, timeout=timeout)


def _interrupted_run(tmp_path: Path, argv: list[str], *, after_steps: int = 3, timeout: float = 600,
                     signum: int = signal.SIGINT):
    """`tensorarena train ARGV` in a fresh process, sent `signum` (SIGINT) once it has completed `after_steps`
    steps (read from the launcher's marker file, so a slow machine only makes it wait). Returns (status, stderr)."""
    launcher, marker = tmp_path / "launch.py", tmp_path / "steps.txt"
    launcher.write_text(LAUNCHER)
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(launcher), str(marker), "train", *argv], stdout=stdout,
                                stderr=stderr, env=_env(), cwd=REPO)
        try:
            deadline = time.monotonic() + timeout
            while not marker.exists() or len(marker.read_text().split()) < after_steps:
                assert proc.poll() is None, f"ended before step {after_steps}: {err.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no step {after_steps} after {timeout} s"
                time.sleep(0.05)
            proc.send_signal(signum)
            status = proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return status, err.read_text()


def _stopped_at(stderr: str, tail: str, by: str = "") -> int:
    """The step of the command's last line `tensorarena train: interrupted[ by BY] at step N of M; TAIL`."""
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    match = re.fullmatch(rf"tensorarena train: interrupted{f' by {by}' if by else ''} at step (\d+) of (\d+); (.*)",
                         last)
    assert match, last
    assert match.group(3) == tail, last
    return int(match.group(1))


def _tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def test_ctrl_c_saves_the_last_step_and_resume_continues_as_one_run(tmp_path):
    from tensorarena.train.checkpoint import read_metadata

    ckpt = tmp_path / "run.st"
    status, stderr = _interrupted_run(tmp_path, ["--model", "mlp", *MLP, "--steps", "400", "--save", str(ckpt),
                                                 "--no-progress"])
    assert status == 130, stderr[-3000:]
    step = _stopped_at(stderr, f"saved to {ckpt} (resume with --resume {ckpt})")
    assert 3 <= step < 400
    assert read_metadata(ckpt)["step"] == step  # a whole checkpoint, of the step the line names
    assert not list(tmp_path.glob(".run.st.tmp-*"))

    until = step + 3
    resumed = _run(["train", "--model", "mlp", *MLP, "--steps", str(until), "--resume", str(ckpt), "--save",
                    str(tmp_path / "resumed.st"), "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = _run(["train", "--model", "mlp", *MLP, "--steps", str(until), "--total-steps", "400", "--save",
                  str(tmp_path / "whole.st"), "--no-progress"])
    assert whole.returncode == 0, whole.stderr[-3000:]
    a, b = _tensors(tmp_path / "resumed.st"), _tensors(tmp_path / "whole.st")
    _assert_identical(a, b)  # parameters and optimizer state, bit for bit
    assert read_metadata(tmp_path / "resumed.st")["step"] == read_metadata(tmp_path / "whole.st")["step"] == until


def test_ctrl_c_without_save_says_nothing_was_saved(tmp_path):
    status, stderr = _interrupted_run(tmp_path, ["--model", "mlp", *MLP, "--steps", "400", "--no-progress"])
    assert status == 130, stderr[-3000:]
    assert 3 <= _stopped_at(stderr, "nothing saved (pass --save PATH to keep a run)") < 400


def test_ctrl_c_in_simcse_saves_the_model_of_the_last_step(tmp_path):
    model_dir = tmp_path / "simcse"
    status, stderr = _interrupted_run(tmp_path, [*SIMCSE, "--steps", "200", "--save", str(model_dir),
                                                 "--no-progress"], after_steps=2)
    assert status == 130, stderr[-3000:]
    step = _stopped_at(stderr, f"saved to {model_dir} (a model directory: tensorarena embed --model-dir "
                               f"{model_dir}; simcse runs cannot be resumed)")
    assert 2 <= step < 200
    whole = _run(["train", *SIMCSE, "--steps", str(step), "--total-steps", "200", "--save", str(tmp_path / "whole"),
                  "--no-progress"])
    assert whole.returncode == 0, whole.stderr[-3000:]
    _assert_identical(_tensors(model_dir / "model.safetensors"), _tensors(tmp_path / "whole" / "model.safetensors"))
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(p.name for p in (tmp_path / "whole").iterdir())


def _main(argv: list[str]) -> int:
    """cli.main(argv); a KeyboardInterrupt escaping it (a traceback, for the user) fails the test."""
    try:
        return cli.main(argv)
    except KeyboardInterrupt as exc:
        pytest.fail(f"KeyboardInterrupt escaped cli.main: {exc!r}")


def _mlp_argv(path: Path, steps: int = 4) -> list[str]:
    return ["train", "--model", "mlp", *MLP, "--steps", str(steps), "--save", str(path), "--no-progress"]


def test_ctrl_c_during_the_evaluation_saves_the_finished_run(tmp_path, monkeypatch, capsys):
    assert _main(_mlp_argv(tmp_path / "whole.st")) == 0
    real_evaluate = Trainer.evaluate

    def evaluate(self, *args, **kwargs):
        _sigint()
        return real_evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    capsys.readouterr()
    path = tmp_path / "run.st"
    assert _main(_mlp_argv(path)) == 130
    assert _stopped_at(capsys.readouterr().err, f"saved to {path} (resume with --resume {path})") == 4
    _assert_identical(_tensors(path), _tensors(tmp_path / "whole.st"))


def test_ctrl_c_during_the_final_save_lets_it_finish_whole(tmp_path, monkeypatch, capsys):
    assert _main(_mlp_argv(tmp_path / "whole.st")) == 0
    real_save = Trainer.save

    def save(self, *args, **kwargs):
        _sigint()
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "save", save)
    capsys.readouterr()
    path = tmp_path / "run.st"
    assert _main(_mlp_argv(path)) == 130
    assert _stopped_at(capsys.readouterr().err, f"saved to {path} (resume with --resume {path})") == 4
    _assert_identical(_tensors(path), _tensors(tmp_path / "whole.st"))


def test_a_second_ctrl_c_during_a_step_saves_nothing_and_says_why(tmp_path, monkeypatch, capsys):
    from tensorarena.data.loader import BatchLoader
    from tensorarena.train import classifier_job

    path = tmp_path / "run.st"
    assert _main(_mlp_argv(path, steps=2)) == 0
    before = path.read_bytes()
    loss = LossSendingSigint()
    real_next = BatchLoader.next
    drawn = []

    def next_batch(self):  # the third batch's step gets two Ctrl-Cs from inside its loss
        drawn.append(1)
        loss.armed = 2 if len(drawn) == 3 else 0
        return real_next(self)

    monkeypatch.setattr(BatchLoader, "next", next_batch)
    monkeypatch.setattr(classifier_job, "cross_entropy", loss)
    capsys.readouterr()
    assert _main(_mlp_argv(path)) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"tensorarena train: interrupted twice at step 3 of 4: that step was abandoned part-way and the "
                    f"model may hold part of it, so nothing was saved; {path} is as it was before this run")
    assert loss.sent == 2 and path.read_bytes() == before


def test_a_second_ctrl_c_during_the_final_save_leaves_the_file_as_it_was(tmp_path, monkeypatch, capsys):
    from tensorarena.train import checkpoint

    path = tmp_path / "run.st"
    assert _main(_mlp_argv(path, steps=2)) == 0
    before = path.read_bytes()
    real_fsync = os.fsync
    sent = []

    def fsync(fd):  # the checkpoint's temporary file is written, not yet renamed over `path`
        if not sent and os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / ".run.st.tmp-")):
            sent.append(fd)
            _sigint()
            _sigint()
        return real_fsync(fd)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    capsys.readouterr()
    assert _main(_mlp_argv(path)) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"tensorarena train: interrupted twice at step 4 of 4, while writing {path}: the write was "
                    f"abandoned and {path} is as it was before (checkpoints are written whole or not at all)")
    assert sent and path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.st"]  # no temporary file left


def test_an_interrupted_simcse_save_leaves_no_new_file_in_the_model_directory(tmp_path, monkeypatch):
    from tensorarena.models.bert import BertModel
    from tensorarena.text import locate_minilm
    from tensorarena.train import simcse_job

    source = locate_minilm()
    encoder = BertModel.from_pretrained(source)
    target = tmp_path / "model"
    real_copy = simcse_job.shutil.copyfile
    copies = []

    def copyfile(src, dst, *args, **kwargs):  # Ctrl-C after the weights and a file or two were written
        copies.append(src)
        if len(copies) == 3:
            raise KeyboardInterrupt
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(simcse_job.shutil, "copyfile", copyfile)
    with pytest.raises(KeyboardInterrupt):
        simcse_job.save_model_dir(encoder, Path(source), target)
    assert len(copies) == 3
    assert list(target.iterdir()) == []  # nothing renamed into place, the files written aside removed
