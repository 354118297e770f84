"""Bug hunt 2: the `tensorarena` command line after today's features (simcse on the streaming route, plan's
simcse side inputs, CRC32 checkpoints, chainable LR schedules), plus --resume with other run options.
tests/test_cli_hunt.py was the first hunt; nothing here repeats it.

Each test states an exact expectation: one uninterrupted run, the eager route, or an exact message / status.
Runs are tiny (MLP 256->16->10; simcse at batch 2 x 8 tokens, 2-3 steps).

Before the fixes, 10 of these 20 tests failed on base commit b49fbac. To see it:
    git worktree add /tmp/base b49fbac && cp tests/test_cli_hunt2.py /tmp/base/tests/
    cd /tmp/base && NUMBA_NUM_THREADS=1 PYTHONPATH=/tmp/base python -m pytest -q -p no:cacheprovider \
        tests/test_cli_hunt2.py
    git worktree remove --force /tmp/base
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensorarena import cli

REPO = Path(__file__).resolve().parents[1]
MLP = ["--hidden", "16", "--train-size", "256", "--test-size", "64", "--batch-size", "32", "--route", "eager"]
SIMCSE = ["--model", "simcse", "--batch-size", "2", "--seq-len", "8"]
_counter = iter(range(10 ** 6))


def run_sub(argv: list[str], module: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    head = [sys.executable, "-m", "tensorarena"] if module else ["tensorarena"]
    return subprocess.run([*head, *argv], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def train(tmp_path: Path, *argv: str) -> dict:
    """`tensorarena train ARGV --no-progress --json FILE` in this process; returns the JSON summary."""
    out = tmp_path / f"summary-{next(_counter)}.json"
    assert cli.main(["train", *argv, "--no-progress", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def refused(argv: list[str], capsys) -> str:
    """cli.main(argv) must stop with a non-zero SystemExit carrying one line (no traceback); returns it."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    msg = exc.value.code if isinstance(exc.value.code, str) else capsys.readouterr().err
    assert exc.value.code not in (0, None)
    assert "Traceback" not in msg and msg.strip().count("\n") == 0, msg
    return msg


def need_minilm():
    from tensorarena.text import locate_minilm

    try:
        locate_minilm()
    except FileNotFoundError as e:
        pytest.skip(str(e))


# ------------------------------------------------------------------------------------------------------
# --resume takes the checkpoint's run options: left out, they are the checkpoint's; given otherwise, refused
# ------------------------------------------------------------------------------------------------------

# Regression (fixed): a run with --seed 5 (or --activation gelu) resumed without it silently drew the seed-0
# data set and test set (or built a relu model and loaded the gelu model's weights into it): same shapes, so
# nothing noticed, and the "resumed" run was another run. The checkpoint now records these options; left out
# on --resume they are the checkpoint's.
@pytest.mark.parametrize("option", [["--seed", "5"], ["--activation", "gelu"]])
def test_resume_without_a_run_option_continues_the_checkpoints_run(option, tmp_path):
    common = [*MLP, "--schedule", "constant"]
    full = train(tmp_path, *common, *option, "--steps", "6")
    half = train(tmp_path, *common, *option, "--steps", "3", "--save", str(tmp_path / "half.st"))
    rest = train(tmp_path, *common, "--steps", "6", "--resume", str(tmp_path / "half.st"))
    assert half["step_losses"] + rest["step_losses"] == full["step_losses"]
    assert rest["test_loss"] == full["test_loss"]


# Regression (fixed): --lr, --weight-decay, --momentum and --warmup given on --resume were ignored without a word
# (the optimizer's and the schedule's state from the checkpoint overwrite them: the losses equal the
# uninterrupted run's), and another --seed / --activation trained on other data / another model. Now each
# conflicting option is refused before training, naming it and the checkpoint's value.
@pytest.mark.parametrize("option, saved", [(["--lr", "0.5"], "0.002"), (["--weight-decay", "0.5"], "0.01"),
                                           (["--warmup", "1"], "2"), (["--seed", "3"], "0"),
                                           (["--activation", "tanh"], "relu")])
def test_resume_with_another_run_option_is_refused_naming_it(option, saved, tmp_path, capsys):
    ckpt = tmp_path / "half.st"
    train(tmp_path, *MLP, "--warmup", "2", "--total-steps", "6", "--steps", "3", "--save", str(ckpt))
    capsys.readouterr()
    msg = refused(["train", *MLP, "--steps", "6", "--no-progress", "--resume", str(ckpt), *option], capsys)
    assert f"{option[0]} {option[1]}" in msg and saved in msg and str(ckpt) in msg


def test_resume_with_the_same_run_options_given_again_is_accepted(tmp_path):
    common = [*MLP, "--warmup", "2", "--lr", "0.01", "--seed", "4", "--activation", "tanh"]
    full = train(tmp_path, *common, "--steps", "6")
    half = train(tmp_path, *common, "--total-steps", "6", "--steps", "3", "--save", str(tmp_path / "h.st"))
    rest = train(tmp_path, *common, "--steps", "6", "--resume", str(tmp_path / "h.st"))
    assert half["step_losses"] + rest["step_losses"] == full["step_losses"]


# Regression (fixed): --dropout 0.3 on a run saved without dropout was refused as "another model's parameters than
# --model mlp's ... resume with the --model it was trained with", though the --model was the same: dropout adds
# layers, which renumbers the parameters. The option is named now.
def test_resume_with_another_dropout_names_dropout_not_model(tmp_path, capsys):
    ckpt = tmp_path / "half.st"
    train(tmp_path, *MLP, "--steps", "2", "--save", str(ckpt))
    capsys.readouterr()
    msg = refused(["train", *MLP, "--steps", "4", "--no-progress", "--dropout", "0.3", "--resume", str(ckpt)], capsys)
    assert "--dropout 0.3" in msg and "--model" not in msg


# ------------------------------------------------------------------------------------------------------
# Chainable schedules: --steps K --total-steps N --save, then --resume, is one N-step run (every schedule)
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, optimizer", [("step", "sgd"), ("exponential", "adam"), ("cosine", "adamw"),
                                                 ("linear-warmup", "sgd")])
def test_every_schedule_resumes_as_one_run(schedule, optimizer, tmp_path):
    common = [*MLP, "--schedule", schedule, "--optimizer", optimizer]
    full = train(tmp_path, *common, "--steps", "7")
    half = train(tmp_path, *common, "--steps", "3", "--total-steps", "7", "--save", str(tmp_path / "h.st"))
    rest = train(tmp_path, *common, "--steps", "7", "--resume", str(tmp_path / "h.st"))
    assert half["step_losses"] + rest["step_losses"] == full["step_losses"]
    assert rest["steps"] == 7 and rest["total_steps"] == 7


# ------------------------------------------------------------------------------------------------------
# A corrupt checkpoint: one line naming the file, non-zero exit, no traceback (subprocess: the real exit)
# ------------------------------------------------------------------------------------------------------

def test_checksum_mismatch_on_resume_is_one_clean_line(tmp_path):
    ckpt, bad = tmp_path / "m.st", tmp_path / "bad.st"
    train(tmp_path, *MLP, "--steps", "2", "--schedule", "constant", "--save", str(ckpt))
    data = bytearray(ckpt.read_bytes())
    data[-9] ^= 0xFF  # inside the last tensor's data: the header still parses, only the CRC32 can tell
    bad.write_bytes(bytes(data))
    run = run_sub(["train", *MLP, "--steps", "4", "--schedule", "constant", "--no-progress", "--resume", str(bad)])
    assert run.returncode == 1 and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tensorarena train: --resume {bad} ") and "CRC32" in lines[0]


# ------------------------------------------------------------------------------------------------------
# simcse on the streaming route
# ------------------------------------------------------------------------------------------------------

def test_simcse_streaming_equals_eager_and_uses_the_store_dir(tmp_path):
    need_minilm()
    eager = train(tmp_path, *SIMCSE, "--steps", "2", "--route", "eager")
    store = tmp_path / "store"
    streamed = train(tmp_path, *SIMCSE, "--steps", "2", "--route", "streaming", "--store-dir", str(store),
                     "--save", str(tmp_path / "model"))
    assert streamed["route"] == "streaming" and eager["route"] == "eager"
    assert streamed["step_losses"] == eager["step_losses"]
    assert streamed["probe_loss_after"] == eager["probe_loss_after"]
    assert (store / "manifest.json").is_file() and (tmp_path / "model" / "model.safetensors").is_file()


def test_simcse_json_to_stdout_parses_alone_and_agrees_with_the_file(tmp_path):
    need_minilm()
    run = run_sub(["train", *SIMCSE, "--steps", "2", "--route", "streaming", "--no-progress", "--json", "-"])
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert summary["route"] == "streaming" and summary["steps"] == 2 and len(summary["step_losses"]) == 2
    assert "for 2 steps on the streaming route" in run.stderr


# Regression (fixed): a non-finite loss that stopped a simcse run lost every step before it, though --save was given
# (the mlp and vit jobs save them). The model directory now holds the steps before the failed one, and the
# message says so.
@pytest.mark.parametrize("route", ["eager", "streaming"])
def test_simcse_nonfinite_loss_saves_the_steps_before_it(route, tmp_path, capsys):
    need_minilm()
    target = tmp_path / "model"
    msg = refused(["train", *SIMCSE, "--steps", "6", "--lr", "1e6", "--route", route, "--no-progress",
                   "--save", str(target)], capsys)
    # Which step's loss turns NaN depends on the seed's dropout masks (step 4 since the init stream of its own).
    failed = re.search(r"loss is nan at step (\d+)", msg)
    assert failed and int(failed.group(1)) >= 2, msg
    assert f"after the {int(failed.group(1)) - 1} steps before it" in msg and f"--save {target}" in msg
    from safetensors.numpy import load_file

    weights = load_file(str(target / "model.safetensors"))
    assert all(map(lambda a: a.dtype.kind != "f" or bool((a == a).all()), weights.values()))  # finite, saved
    assert (target / "tokenizer.json").is_file()


# ------------------------------------------------------------------------------------------------------
# plan --model simcse and the two ways to start the command
# ------------------------------------------------------------------------------------------------------

def test_plan_simcse_json_agrees_with_its_table(capsys):
    need_minilm()
    with pytest.raises(SystemExit) as exc:  # nothing fits: the status says so too (1), as train's
        cli.main(["plan", "--model", "simcse", "--batch", "2", "--seq-len", "8", "--memory-limit", "300M", "--json"])
    assert exc.value.code == 1
    out = capsys.readouterr().out.strip().splitlines()
    plan = json.loads(out[-1])
    fits = next(line for line in out if line.startswith("fits")).split()[1:]
    assert fits == ["NO", "NO", "NO"] and plan["chosen"] is None
    assert [plan["estimates"][r]["fits"] for r in ("fused", "eager", "streaming")] == [False, False, False]
    assert out[-2] == f"chosen: none ({plan['reason']})"
    # The mask of 2 sentences, each run twice, x 8 tokens is the same on every route.
    sides = {r: e["parts"]["side inputs (attention mask)"] for r, e in plan["estimates"].items()}
    assert len(set(sides.values())) == 1 and sides["streaming"] > 0


def test_python_m_equals_the_installed_command():
    for argv in (["train", "--help"], ["plan", "--help"], []):
        a, b = run_sub(argv), run_sub(argv, module=False)
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert run_sub([]).returncode == 2
