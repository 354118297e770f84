"""SIGTERM (a job scheduler's or a container's stop, `timeout`, `kill`) does what Ctrl-C does to `tensorarena
train`: the step in progress completes, --save gets the last completed step, exit status 143.

On b6b68e0 SIGTERM killed the process at once (status -15, nothing saved, no line): all four tests fail there,
the last two for want of TerminateAsCtrlC (`git worktree add /tmp/w/base b6b68e0 && cp tests/test_interrupt.py
/tmp/w/base/tests/ && cd /tmp/w/base && PYTHONPATH=/tmp/w/base python -m pytest -q /work/main/tests/test_sigterm.py`)."""

from __future__ import annotations

import os
import signal

import pytest

from tensorarena.train.checkpoint import read_metadata
from tensorarena.train.interrupt import SigintDeferred
from tests.test_interrupt import MLP, _busy, _interrupted_run, _stopped_at


def test_sigterm_saves_the_last_completed_step_and_exits_143(tmp_path):
    ckpt = tmp_path / "run.st"
    status, stderr = _interrupted_run(tmp_path, ["--model", "mlp", *MLP, "--steps", "400", "--save", str(ckpt),
                                                 "--no-progress"], signum=signal.SIGTERM)
    assert status == 143, stderr[-3000:]
    step = _stopped_at(stderr, f"saved to {ckpt} (resume with --resume {ckpt})", by="SIGTERM")
    assert 3 <= step < 400
    assert read_metadata(ckpt)["step"] == step  # a whole checkpoint of the step the line names


def test_sigterm_without_save_says_nothing_was_saved(tmp_path):
    status, stderr = _interrupted_run(tmp_path, ["--model", "mlp", *MLP, "--steps", "400", "--no-progress"],
                                      signum=signal.SIGTERM)
    assert status == 143, stderr[-3000:]
    assert 3 <= _stopped_at(stderr, "nothing saved (pass --save PATH to keep a run)", by="SIGTERM") < 400


def test_a_sigterm_during_deferred_work_waits_for_it_then_stops(python_sigint_handler, capfd):
    from tensorarena.train.interrupt import TerminateAsCtrlC

    done = []
    with TerminateAsCtrlC() as term:
        with pytest.raises(KeyboardInterrupt, match="held until the step completed"):
            with SigintDeferred("the step", lambda: "abandoned"):
                # checked first: without the handler this SIGTERM would kill the test process itself
                assert signal.getsignal(signal.SIGTERM) == term._as_ctrl_c
                os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before os.kill returns
                _busy()
                done.append(1)
    assert done == [1] and term.received
    assert "SIGTERM: waiting for the step to complete, then stopping (a second SIGTERM abandons it)" in \
        capfd.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back


def test_sigterm_is_left_alone_where_ctrl_c_is_not_pythons_or_sigterm_has_a_handler(python_sigint_handler):
    from tensorarena.train.interrupt import TerminateAsCtrlC

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job: Ctrl-C does not stop it, SIGTERM still kills
    with TerminateAsCtrlC() as term:
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mine = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a program's own policy
    try:
        with TerminateAsCtrlC() as term:
            assert signal.getsignal(signal.SIGTERM) is not term._as_ctrl_c
    finally:
        signal.signal(signal.SIGTERM, mine)
    assert not term.received
