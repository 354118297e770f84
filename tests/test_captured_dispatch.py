"""A fused step follows changes of kernel dispatch made between steps, on both replays.

A recording calls the kernels handed out when it was made (tape.recorded), and a plan traced under one
dispatch may ask for other scratch buffers under another (attention's reference twin does). So plans
are keyed by kernels.dispatch_key(): a switch traces and records a plan of its own, and a switch back
finds the first plan with its recording (compile/step.py plan_for). Shown to fail without it:
- with the captured recordings unaware of the switch (compile/captured.changed ignoring the dispatch,
  plans keyed by batch signature alone), the four MLP cases failed: the captured steps under each
  switch went on calling the fused kernels (gemm, gelu, dropout, adam) or the 'one_core' GEMM route, and
  on three of the switches their losses parted from the Python replay's (by 1.2e-7);
- with plans keyed by batch signature alone (`key = (sig, ())` in plan_for), all five cases failed, the
  ViT one on the Python replay too, with a PlanMismatchError at the first step under the switch
  ("the trace had ops.linalg.linear -> (8, 17, 32) float32, this step asked for (8, 4, 17, 8)"); so did
  `python bench/gemm.py --steps tiny`, which switches GEMM backends between steps.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter

import numpy as np
import pytest

from tensorarena import kernels, optim
from tensorarena.kernels import gemm as G
from tensorarena.kernels import gemm_jobs as J
from tensorarena.kernels import gemm_library as L
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.train.trainer import Trainer
from test_captured_replay import _assert_same, _images, _mlp, _rows, _vit


def _gelu_mlp():
    # More kernels than _mlp's: gelu and dropout.
    config = MLPConfig(in_features=12, hidden=(16, 16), out_features=4, activation="gelu", dropout=0.1)
    return MLP(config, rng=np.random.default_rng(0))


@contextlib.contextmanager
def _reference_forced():
    saved = kernels._force_reference
    kernels.use_reference(True)
    try:
        yield
    finally:
        kernels.use_reference(saved)


@contextlib.contextmanager
def _numpy_gemms():
    if kernels.choose("gemm") != "fused":
        pytest.skip(f"GEMMs are not on MKL here: {G.backend()}")
    G.use_backend("numpy")
    try:
        yield
    finally:
        G.use_backend("mkl")


@contextlib.contextmanager
def _no_gemm_jobs():
    if not G.mkl_symbols_loaded():
        pytest.skip("MKL's symbols are not loaded, so no product runs as GEMM jobs")
    J.use_jobs(False)
    try:
        yield
    finally:
        J.use_jobs(True)


def _other_library() -> str:
    return "mkl" if L.current() == L.OPENBLAS else "openblas"


@contextlib.contextmanager
def _other_gemm_library():
    if not (G.mkl_symbols_loaded() and L.available()):
        pytest.skip(f"the per-core products have one library here: {G.backend()}")
    saved = L.NAMES[L.current()]
    L.use_library(_other_library())
    try:
        yield
    finally:
        L.use_library(saved)


def _on_other_library(counts):
    other = _other_library()  # asked after the switch ended: the process's own library is back
    assert counts[("gemm_library", other)] > 0 and counts[("gemm_library", L.NAMES[L.current()])] == 0


def _on_own_library(counts):
    assert counts[("gemm_library", L.NAMES[L.current()])] > 0 and counts[("gemm_library", _other_library())] == 0


def _fused_kernels(counts):
    return {k: v for k, v in counts.items() if v and k[1] == "fused"}


def _reference_only(counts):
    assert counts[("gemm", "reference")] > 0 and not _fused_kernels(counts), _fused_kernels(counts)


def _fused_again(counts):
    assert counts[("gemm", "fused")] > 0 and counts[("gemm", "reference")] == 0


def _numpy_gemm_only(counts):
    assert counts[("gemm", "reference")] > 0 and counts[("gemm", "fused")] == 0
    assert counts[("cross_entropy_forward", "fused")] > 0  # only the GEMMs moved


def _threads_only(counts):
    assert counts[("gemm_route", "mkl_threads")] > 0 and counts[("gemm_route", "one_core")] == 0


def _jobs_again(counts):
    assert counts[("gemm_route", "one_core")] > 0


# (model, its batches, the switch, what the steps under it call, what the steps after it call)
CASES = {
    "using_reference": (_gelu_mlp, lambda: _rows(3), lambda: kernels.using("reference"), _reference_only,
                        _fused_again),
    "use_reference": (_mlp, lambda: _rows(3), _reference_forced, _reference_only, _fused_again),
    "gemm_use_backend_numpy": (_mlp, lambda: _rows(3), _numpy_gemms, _numpy_gemm_only, _fused_again),
    "gemm_jobs_off": (_mlp, lambda: _rows(3), _no_gemm_jobs, _threads_only, _jobs_again),
    "gemm_library_switched": (_mlp, lambda: _rows(3), _other_gemm_library, _on_other_library, _on_own_library),
    # attention's reference twin asks for other scratch buffers than its fused kernel: a plan of its own
    "vit_using_reference": (_vit, lambda: _images(3), lambda: kernels.using("reference"), _reference_only,
                            _fused_again),
}


def _train(replay, make_model, batches, switch, steps=3):
    """`steps` steps, `steps` more under `switch`, `steps` after it: (model, trainer, reports, the kernel
    calls of the steps under the switch and of those after it, the captures each phase ended with)."""
    model = make_model()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), cross_entropy, route="fused",
                      fused_replay=replay)
    reports, counts, captures = [], [], []

    def phase():
        before = Counter(kernels.calls)
        reports.extend(trainer.step(*batches[len(reports) % len(batches)]) for _ in range(steps))
        after = Counter(kernels.calls)
        after.subtract(before)
        counts.append(after)
        captures.append(trainer.fused.plan.capture)

    phase()
    with switch():
        phase()
    phase()
    return model, trainer, reports, counts, captures


@pytest.mark.parametrize("case", list(CASES))
def test_a_captured_step_follows_a_switch_of_kernel_dispatch(case, caplog):
    make_model, make_batches, switch, under, after = CASES[case]
    batches = make_batches()
    python = _train("python", make_model, batches, switch)
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        captured = _train("captured", make_model, batches, switch)
    *_, counts, captures = captured
    under(counts[1])
    after(counts[2])
    assert [c[("fused_replay", "captured")] for c in counts] == [3, 3, 3]  # never fell back to the Python replay
    # under the switch: a plan of its own, recorded; after it: the first plan, and its recording, again
    assert all(c.tape is not None for c in captures) and captures[0] is captures[2] is not captures[1]
    trainer = captured[1]
    assert trainer.fused.traces == 2 and len(trainer.fused.plans) == 2
    assert caplog.text.count("the kernel dispatch or thread count changed since") == 1
    assert "recording it again" not in caplog.text
    # the same switches on the Python replay: the same calls on the same buffers, so bit for bit
    _assert_same(python[:3], captured[:3])


def test_the_generation_counts_only_real_changes_of_dispatch():
    # A captured step records again when the generation moves, so a no-op switch must not move it.
    kernels.choose("gemm")  # the kernel files are loaded, as they are once any step ran
    start = kernels.generation()
    saved = kernels._force_reference
    kernels.use_reference(saved)
    assert kernels.generation() == start  # the value it had: no change
    with kernels.using("default"):
        pass
    assert kernels.generation() == start
    # A using() block overrides the choice in its own thread only: the process-wide dispatch does not move,
    # but the thread's dispatch_key does (so a plan traced inside the block is a plan of its own).
    outside = kernels.dispatch_key()
    with kernels.using("reference" if not saved else "fused"):
        assert kernels.generation() == start and kernels.dispatch_key() != outside
    assert kernels.dispatch_key() is outside
    kernels.use_reference(not saved)
    assert kernels.generation() == start + 1
    kernels.use_reference(saved)
    assert kernels.generation() == start + 2  # and back
    J.use_jobs(J._enabled)
    L.use_library(L.NAMES[L.current()])
    assert kernels.generation() == start + 2

    def one(x):
        return x

    def other(x):
        return x

    name = "_test_dispatch_generation"
    try:
        kernels.register(name, "reference", one)  # a new name: nothing recorded could have it
        kernels.register(name, "reference", one)  # the same function again
        assert kernels.generation() == start + 2
        kernels.register(name, "reference", other)  # replaced
        assert kernels.generation() == start + 3
        kernels.register(name, "fused", one)  # a twin added after the kernel files loaded: choose() changes
        assert kernels.generation() == start + 4 and kernels.choose(name) in ("fused", "reference")
        kernels.unregister(name, "fused")
        assert kernels.generation() == start + 5
        kernels.unregister(name, "fused")  # not there any more
        assert kernels.generation() == start + 5
    finally:
        kernels._registry.pop(name, None)
