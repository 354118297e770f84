"""Test-wide settings: NumPy raises on float errors, as DESIGN.md's house rules ask; how the suite shares a
machine's cores when README's command runs it in two pytest-xdist workers (`-n 2`); and which tensorarena the
tests' subprocesses import."""

import importlib.util
import os

# Under xdist two workers share the cores. An idle OpenMP thread that spins (tensorarena.kernels lets MKL's spin
# ~2-3 ms after every parallel region) then burns the core the other worker's test needs: five test files
# (test_layers_hunt, test_torch_ops4, test_cli_hunt, test_optim_hunt, test_fused_memory) took 170 and 143 s
# spinning against 119 and 108 s sleeping (PASSIVE), alternated, on a 2-core Zen 3. libgomp reads the policy once,
# when it loads, so it is set here, before any test module imports tensorarena or MKL; tests of the policy itself
# run their own subprocesses without it (tests/test_kernel_gemm.py, tests/test_docs_truth.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A test's subprocess (`python -m tensorarena ...`, often from a temporary directory) must run the tensorarena these
# tests import, not whichever one its interpreter finds. Under .ci/run the tests import the checkout (`python -m
# pytest` puts the working directory first on sys.path) while a child with no PYTHONPATH imported the copy that
# `pip install .` put in site-packages (with its own, empty, Numba cache): the children tested other files than the
# tests did. (Fresh-clone CI on a Zen 4 took 462 s of tests before this and 476 s after: no time to gain here.)
# find_spec locates the package without importing it (MKL's threads must not start before the policy above is set).
# A PYTHONPATH the user set is kept: tests/*.py's regression recipes run a file against an older worktree that way.
if "PYTHONPATH" not in os.environ:
    os.environ["PYTHONPATH"] = os.path.dirname(os.path.dirname(importlib.util.find_spec("tensorarena").origin))

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Files with tests marked `heavy(seconds=...)` (~20 s or more on a 2-core machine) run first, the longest
    first. pyproject's `--dist loadfile --no-loadscope-reorder` hands xdist's workers whole files in this order, so
    the long ones start early and many short files are left to even out the end, instead of one worker running a
    long file alone while the other has finished (xdist's own order, by the number of tests, put them last)."""
    seconds: dict = {}
    for item in items:
        mark = item.get_closest_marker("heavy")
        if mark is not None:
            if not isinstance(mark.kwargs.get("seconds"), (int, float)):
                raise pytest.UsageError(f"{item.nodeid}: write @pytest.mark.heavy(seconds=N), N the seconds it took")
            seconds[item.path] = seconds.get(item.path, 0) + mark.kwargs["seconds"]
    items.sort(key=lambda item: -seconds.get(item.path, 0))  # stable: each file's tests stay together, in order


@pytest.fixture
def python_sigint_handler():
    """Python's own SIGINT handler (KeyboardInterrupt) during the test, as a shell's foreground process has it, the
    one found before put back after. A test run started in the background (`pytest ... &` from a script, nohup)
    inherits SIGINT ignored, and Python then installs no handler: a test that sends itself a Ctrl-C needs this."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def _numpy_raises():
    old = np.seterr(all="raise")
    yield
    np.seterr(**old)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Under `-n` (README's command), compile the kernels into Numba's cache before the workers start, in two
    processes (tests/warm_kernels.py says why). On a warm cache this takes ~3 s; alone (no `-n`, a file or a test
    run by hand) it is skipped: the kernels a run needs compile as they are met. A warm-up that fails is said and
    left: the tests then compile what they need themselves, and say what is wrong if a kernel cannot compile."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not session.config.getoption("numprocesses", None):
        return
    import subprocess
    import sys
    import time

    script = os.path.join(os.path.dirname(__file__), "warm_kernels.py")
    start = time.perf_counter()
    runs = [subprocess.Popen([sys.executable, script, str(part), "2"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for part in range(2)]
    said = [run.communicate()[0].strip() for run in runs]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for run, out in zip(runs, said):
        if run.returncode != 0:
            reporter.write_line(f"warming the kernels failed (exit {run.returncode}); the tests compile them as they "
                                f"go:\n{out}")
    reporter.write_line(f"kernels warmed in {time.perf_counter() - start:.1f} s ({'; '.join(said)})")
