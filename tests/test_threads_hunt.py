"""Concurrency: two models trained at once in two Python threads, each with its own Trainer.

Each thread's losses and final weights must equal, bit for bit, the same model trained alone in the main
thread with the same seed: every model here draws its init and dropout from its own np.random.Generator,
the GEMMs are MKL's (or NumPy's) on the same shapes, and the Numba kernels run on NUMBA_NUM_THREADS threads
in every Python thread (numba.get_num_threads is per thread and starts at that value), so no reduction is
split differently when a second model runs beside it. Where a test allows 1e-6 instead, it says why.

Racy tests shorten sys.setswitchinterval so the two threads really interleave inside steps (the default
5 ms lets a tiny model's step finish before the other thread runs), and repeat a few times. Every join has a
timeout: a deadlock fails the test instead of hanging it.

8 of these 28 tests failed on 4139106, before the fixes (each under a "Regression" comment saying what was
wrong). With this file copied into a worktree of 4139106 (git worktree add /tmp/old 4139106), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_threads_hunt.py`.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import kernels, optim
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.precision import get_float32_matmul_precision
from tensorarena.random import default_generator
from tensorarena.train.trainer import Trainer

STEPS = 12
JOIN_S = 60


# -- helpers ------------------------------------------------------------------------------------------------

def _mlp(seed=0, dropout=0.0, own_rng=True):
    """MLP 12 -> 16 -> 4; with own_rng its init and dropout draw from its own generator, else dropout draws
    from tensorarena's default generator (rng=None, like torch's global one)."""
    cfg = MLPConfig(in_features=12, hidden=(16,), out_features=4, dropout=dropout)
    if own_rng:
        return MLP(cfg, rng=np.random.default_rng(seed))
    model = MLP(cfg, rng=None)
    # Same weights as the seeded model, but dropout (rng=None) follows the default generator at call time.
    for p, q in zip(model.parameters(), MLP(cfg, rng=np.random.default_rng(seed)).parameters()):
        p.data[...] = q.data
    return model


def _vit(seed=0, dropout=0.0, attention_dropout=0.0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, num_heads=4, dropout=dropout,
                    attention_dropout=attention_dropout)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _rows(n=4, batch=16, seed=2):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 12)).astype(np.float32)
        out.append((x, x[:, :4].argmax(axis=1).astype(np.int64)))
    return out


def _images(n=3, batch=4, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        y = (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)
        out.append((x, y))
    return out


class Run:
    """One model's training: built lazily (in whichever thread calls `build`), stepped by `train`."""

    def __init__(self, make_model, route, *, batches, steps=STEPS, replay="auto", opt="adamw", **trainer_kw):
        self.make_model, self.route, self.batches, self.steps = make_model, route, batches, steps
        self.replay, self.opt, self.trainer_kw = replay, opt, trainer_kw
        self.losses: list[float] = []
        self.high_waters: list[int] = []
        self.trainer = None

    def build(self) -> "Run":
        model = self.make_model()
        if self.opt == "adamw":
            opt = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        else:
            opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.trainer = Trainer(model, opt, cross_entropy, route=self.route, fused_replay=self.replay,
                               **self.trainer_kw)
        return self

    def train(self, steps=None) -> "Run":
        for i in range(len(self.losses), len(self.losses) + (steps or self.steps)):
            report = self.trainer.step(*self.batches[i % len(self.batches)])
            self.losses.append(report.loss)
            self.high_waters.append(report.arena_high_water)
        return self

    @property
    def params(self) -> list[np.ndarray]:
        return [p.data.copy() for p in self.trainer.model.parameters()]


def _in_threads(*fns, timeout=JOIN_S):
    """Run each fn in its own thread, all released at once; re-raise the first error; fail on a hang."""
    barrier = threading.Barrier(len(fns))
    errors: list[BaseException | None] = [None] * len(fns)

    def body(i, fn):
        with np.errstate(all="raise"):  # the main thread's test-wide setting (conftest) is per thread in NumPy 2
            try:
                barrier.wait(timeout)
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                errors[i] = exc

    threads = [threading.Thread(target=body, args=(i, fn), name=f"hunt-{i}") for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a training thread hung (deadlock?)"
    return errors


def _raise_first(errors):
    for e in errors:
        if e is not None:
            raise e


@contextlib.contextmanager
def _fine_switching(interval=1e-5):
    """Let the threads swap every ~10 us, so two steps really interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _solo(run: Run) -> Run:
    return run.build().train()


def _assert_same(got: Run, want: Run, *, atol=0.0):
    # The memory promise too: each step's arena high-water is the solo run's (per-thread arenas, no sharing).
    assert got.high_waters == want.high_waters
    if atol == 0.0:
        assert got.losses == want.losses
        for p, q in zip(got.params, want.params):
            np.testing.assert_array_equal(p, q)
    else:
        np.testing.assert_allclose(got.losses, want.losses, rtol=0, atol=atol)
        for p, q in zip(got.params, want.params):
            np.testing.assert_allclose(p, q, rtol=0, atol=atol)


def _pair(make_a, make_b, *, repeats=2, switching=True):
    """Train two fresh Runs at once in two threads, `repeats` times, each against its solo run."""
    want_a, want_b = _solo(make_a()), _solo(make_b())
    for _ in range(repeats):
        a, b = make_a().build(), make_b().build()
        with _fine_switching() if switching else contextlib.nullcontext():
            _raise_first(_in_threads(a.train, b.train))
        _assert_same(a, want_a)
        _assert_same(b, want_b)
    return a, b


def _replays(run: Run) -> set[str]:
    """Which replay each plan of a fused run ended on: 'captured' or 'python: <why>'."""
    return {("captured" if p.capture is not None and p.capture.tape is not None else
             (p.capture.note if p.capture is not None else "python")) for p in run.trainer.fused.plans.values()}


# -- two models, two threads, each equal to its solo run -----------------------------------------------------

def test_two_eager_mlps_in_two_threads_match_their_solo_runs():
    _pair(lambda: Run(lambda: _mlp(0), "eager", batches=_rows(seed=2)),
          lambda: Run(lambda: _mlp(1), "eager", batches=_rows(seed=3), opt="sgd"))


def test_two_eager_mlps_with_their_own_dropout_generators_match_their_solo_runs():
    _pair(lambda: Run(lambda: _mlp(0, dropout=0.3), "eager", batches=_rows(seed=2)),
          lambda: Run(lambda: _mlp(1, dropout=0.2), "eager", batches=_rows(seed=3)))


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_two_fused_mlps_in_two_threads_match_their_solo_runs(replay):
    a, b = _pair(lambda: Run(lambda: _mlp(0, dropout=0.25), "fused", batches=_rows(seed=2), replay=replay),
                 lambda: Run(lambda: _mlp(1), "fused", batches=_rows(seed=3), replay=replay, opt="sgd"))
    for run in (a, b):
        assert run.trainer.fused.traces == 1 and run.trainer.fused.replays == STEPS
        if replay == "captured":
            assert _replays(run) == {"captured"}, _replays(run)


@pytest.mark.parametrize("replay", ["python", "captured"])
def test_eager_and_fused_side_by_side_match_their_solo_runs(replay):
    _pair(lambda: Run(lambda: _mlp(0, dropout=0.25), "eager", batches=_rows(seed=2)),
          lambda: Run(lambda: _mlp(1, dropout=0.25), "fused", batches=_rows(seed=3), replay=replay))


def test_two_fused_vits_with_dropout_in_two_threads_match_their_solo_runs():
    # Attention (MKL's batched GEMM, the Numba softmax/dropout kernels), GELU, LayerNorm, AdamW with clipping.
    mk = lambda seed, replay: lambda: Run(lambda: _vit(seed, dropout=0.1, attention_dropout=0.1), "fused",  # noqa: E731
                                          batches=_images(seed=seed + 5), steps=6, replay=replay,
                                          clip_grad_norm=1.0)
    a, b = _pair(mk(0, "captured"), mk(1, "python"), repeats=1)
    assert _replays(a) == {"captured"}


def test_eager_vit_beside_a_fused_vit_matches_their_solo_runs():
    _pair(lambda: Run(lambda: _vit(0, dropout=0.1), "eager", batches=_images(seed=5), steps=6),
          lambda: Run(lambda: _vit(1, attention_dropout=0.1), "fused", batches=_images(seed=6), steps=6,
                      replay="captured"), repeats=1)


def test_models_built_inside_their_threads_match_models_built_in_main():
    # Build AND train inside the thread (lazy kernel state, the first trace, the flat layout made in the thread).
    want = [_solo(Run(lambda: _mlp(s, dropout=0.2), r, batches=_rows(seed=s + 2))) for s, r in
            ((0, "eager"), (1, "fused"))]
    runs = [Run(lambda s=s: _mlp(s, dropout=0.2), r, batches=_rows(seed=s + 2)) for s, r in ((0, "eager"), (1, "fused"))]
    with _fine_switching():
        _raise_first(_in_threads(*(lambda r=r: r.build().train() for r in runs)))
    for got, w in zip(runs, want):
        _assert_same(got, w)


# -- matmul precision: per trainer, per thread -------------------------------------------------------------

def test_bfloat16_trainer_beside_a_float32_trainer_each_keep_their_precision():
    mk_bf = lambda: Run(lambda: _mlp(0), "fused", batches=_rows(seed=2), matmul_precision="bfloat16")  # noqa: E731
    mk_f32 = lambda: Run(lambda: _mlp(1), "eager", batches=_rows(seed=3), matmul_precision="float32")  # noqa: E731
    a, b = _pair(mk_bf, mk_f32)
    assert a.trainer.fused.plan.matmul_precision == "bfloat16"
    # bfloat16 products really ran: the bfloat16 losses differ from a float32 run of the same model.
    f32 = _solo(Run(lambda: _mlp(0), "fused", batches=_rows(seed=2)))
    assert a.losses != f32.losses


def test_a_thread_local_precision_block_does_not_leak_into_another_thread():
    seen = {}
    inside = threading.Event()
    done = threading.Event()

    def holder():
        with ta.float32_matmul_precision("bfloat16"):
            inside.set()
            done.wait(JOIN_S)

    def reader():
        inside.wait(JOIN_S)
        seen["other"] = get_float32_matmul_precision()
        seen["trainer"] = _trainer_of(_mlp(0)).matmul_precision
        done.set()

    _raise_first(_in_threads(holder, reader))
    assert seen == {"other": "float32", "trainer": "float32"}


# -- the default generator (rng=None), which fused traces snapshot and restore -------------------------------

# Regression: a fused trace and a captured recording snapshot the process-wide default generator (rng_generators always
# includes it) and restore it afterwards (compile/step.py _trace_step's `finally: restore_rng(saved_rng)`,
# compile/captured.py _capture's `restore_rng(saved)`). A model that never draws from it still rewinds it, so
# another thread whose dropout uses rng=None (the default generator, torch's global-generator idiom) draws the
# same masks again: its losses differ from its solo run, silently.
def test_a_fused_trace_in_one_thread_does_not_rewind_another_threads_default_generator():
    def make_eager():
        return Run(lambda: _mlp(1, dropout=0.5, own_rng=False), "eager", batches=_rows(seed=3), steps=20)

    def make_fused():
        # Four batch shapes, max_plans=1: every step traces (and records) again.
        batches = [(x[: 4 + 3 * (i % 4)], y[: 4 + 3 * (i % 4)]) for i, (x, y) in enumerate(_rows(n=8, seed=2))]
        return Run(lambda: _mlp(0), "fused", batches=batches, steps=20, replay="captured", max_plans=1)

    want = make_eager().build()
    ta.manual_seed(123)
    want.train()
    for _ in range(10):  # racy: the rewind needs a trace to overlap a dropout draw
        eager, fused = make_eager().build(), make_fused().build()
        ta.manual_seed(123)
        with _fine_switching(1e-6):
            _raise_first(_in_threads(eager.train, fused.train))
        assert eager.losses == want.losses, "the eager thread's dropout masks were rewound by the fused thread"


# Regression (same cause, the other side): a draw another thread makes from the default generator while a captured step
# is being checked makes the check see "random numbers drawn outside the recorded calls" (captured.py
# _tape_passes compares the default generator's state), so a model that draws nothing from it is refused the
# captured replay and silently runs the slower Python replay for good.
def test_another_threads_default_generator_draws_do_not_refuse_a_capture():
    def make_fused(seed):
        batches = [(x[: 4 + 3 * (i % 4)], y[: 4 + 3 * (i % 4)]) for i, (x, y) in enumerate(_rows(n=8, seed=seed))]
        return Run(lambda: _mlp(seed), "fused", batches=batches, steps=8, replay="captured", max_plans=8)

    stop = threading.Event()

    def draw_forever():  # a thread using the default generator (torch.rand's equivalent), e.g. data augmentation
        gen = default_generator()
        while not stop.is_set():
            gen.random(8)

    for repeat in range(10):  # racy: each repeat records four plans while the other thread draws
        fused = make_fused(repeat).build()
        stop.clear()

        def train():
            try:
                fused.train()
            finally:
                stop.set()

        with _fine_switching(1e-6):
            _raise_first(_in_threads(train, draw_forever))
        assert _replays(fused) == {"captured"}, _replays(fused)


# -- one trainer, two threads ----------------------------------------------------------------------------

@pytest.mark.parametrize("route,replay", [("eager", "auto"), ("fused", "python"), ("fused", "captured")])
def test_one_trainer_stepped_from_two_threads_in_turn_matches_one_thread(route, replay):
    mk = lambda: Run(lambda: _mlp(0, dropout=0.2), route, batches=_rows(seed=2), replay=replay)  # noqa: E731
    want = _solo(mk())
    run = mk().build()
    for half in range(2):  # first half in one thread, second half in another
        t = threading.Thread(target=run.train, args=(STEPS // 2,))
        t.start()
        t.join(JOIN_S)
        assert not t.is_alive()
    _assert_same(run, want)


# Regression: nothing stops two threads from stepping the SAME Trainer at once. On the fused route both replays write
# the same slab and flat buffers; on eager, one thread's zero_grad/backward/step interleaves with the other's. No
# error is raised: the weights end up as no sequential order of those steps would leave them, or a confusing
# error from deep inside (a PlanMismatchError, a StaleTensorError) surfaces. Expected: a clear error naming the
# concurrent use (e.g. a non-blocking lock in Trainer.step: "this Trainer is already stepping in thread X").
@pytest.mark.parametrize("route,replay", [("eager", "auto"), ("fused", "python"), ("fused", "captured")])
def test_one_trainer_stepped_from_two_threads_at_once_is_a_clear_error(route, replay):
    run = Run(lambda: _mlp(0, dropout=0.2), route, batches=_rows(seed=2), replay=replay).build()
    run.train(1)  # traced (and recorded) already: the threads only replay
    with _fine_switching(1e-6):
        errors = _in_threads(lambda: run.train(30), lambda: run.train(30))
    raised = [e for e in errors if e is not None]
    # Seen without the fix: no error, and step_count ends at ~35-48 instead of 61 (both threads read the same
    # step_count before either wrote it; reports repeat step numbers), the eager optimizer's step at 59.
    assert raised, (f"two threads stepped one Trainer at once and nothing was raised; step_count is "
                    f"{run.trainer.step_count} after 1 + 2 x 30 steps")
    assert any("thread" in str(e).lower() or "concurren" in str(e).lower() for e in raised), \
        [f"{type(e).__name__}: {e}" for e in raised]


# -- process-wide kernel state -----------------------------------------------------------------------------

_FRESH = textwrap.dedent("""
    import threading, numpy as np
    from tensorarena.tensor import Tensor
    from tensorarena.nn.functional import cross_entropy
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    y = np.arange(8) % 4
    errors, losses, barrier = [], [], threading.Barrier(2)
    def run():
        barrier.wait()
        try:
            losses.append(cross_entropy(Tensor(x), y).item())
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads: t.start()
    for t in threads: t.join(120)
    print(errors or "ok", losses)
""")


# Regression: the first kernel lookups of a process, made from two threads at once, race: kernels/__init__.py _load sets
# `_loaded = True` BEFORE importing the kernel files, so the second thread skips the import, finds the registry
# half filled and raises KeyError("no kernel named 'cross_entropy_forward'; known: ['add', 'batched_gemm', ...]").
# Two models whose first steps start together in two threads hit it. Fix: a lock around _load, and set _loaded
# only after the imports (double-checked).
def test_first_kernel_use_from_two_threads_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ok"), line
    losses = eval(line[len("ok"):])  # noqa: S307 - our own printed list
    assert len(losses) == 2 and losses[0] == losses[1]


def test_kernel_call_counts_add_up_across_threads():
    # kernels.calls is one process-wide Counter; two threads adding to it must lose no count.
    runs = [Run(lambda: _mlp(s), "fused", batches=_rows(seed=s + 2), replay="python").build() for s in (0, 1)]
    for r in runs:
        r.train(1)
    mid = kernels.calls.copy()
    with _fine_switching(1e-6):
        _raise_first(_in_threads(*(lambda r=r: r.train(20) for r in runs)))
    ran = kernels.calls - mid
    assert ran[("fused_replay", "python")] == 40


def test_two_eager_vits_on_numpy_blas_split_attention_in_both_threads():
    # NumPy's OpenBLAS: attention's per-head products go through kernels.blas_threads.run_split, which sets the
    # global OpenBLAS thread count to 1 while it runs (a lock keeps two splits apart). OpenBLAS splits a GEMM over
    # rows/columns, never over the summed axis, so the other thread's products give the same bits on 1 thread.
    from tensorarena.kernels import blas_threads, gemm

    if kernels.choose("gemm") != "fused":
        pytest.skip(f"GEMMs are not on MKL here, nothing to switch: {gemm.backend()}")
    gemm.use_backend("numpy")
    try:
        before = blas_threads.calls.copy()
        count = blas_threads._control[0]() if blas_threads._control is not None else None
        _pair(lambda: Run(lambda: _vit(0, attention_dropout=0.1), "eager", batches=_images(seed=5), steps=4),
              lambda: Run(lambda: _vit(1), "fused", batches=_images(seed=6), steps=4, replay="captured"),
              repeats=1)
        if blas_threads.parallel_available():
            assert blas_threads.calls["parallel"] > before["parallel"]
            assert blas_threads._control[0]() == count  # restored, not left at a split's 1 by a race
    finally:
        gemm.use_backend("mkl")


def test_default_generator_dropout_beside_a_model_with_its_own_generator_matches_solo():
    # The control for the rewind bug below: an eager model (no trace) beside it leaves the default generator alone.
    def make_default():
        return Run(lambda: _mlp(1, dropout=0.5, own_rng=False), "eager", batches=_rows(seed=3), steps=20)

    want = make_default().build()
    ta.manual_seed(123)
    want.train()
    for _ in range(2):
        got, other = make_default().build(), Run(lambda: _mlp(0, dropout=0.5), "eager", batches=_rows(seed=2),
                                                 steps=20).build()
        ta.manual_seed(123)
        with _fine_switching(1e-6):
            _raise_first(_in_threads(got.train, other.train))
        assert got.losses == want.losses


def test_process_default_precision_set_in_main_reaches_trainers_built_in_threads():
    # As torch.set_float32_matmul_precision: process-wide. A thread's trainer built after it takes it.
    seen = {}
    ta.set_float32_matmul_precision("bfloat16")
    try:
        def build():
            seen["trainer"] = _trainer_of(_mlp(0)).matmul_precision
        _raise_first(_in_threads(build))
    finally:
        ta.set_float32_matmul_precision("float32")
    assert seen == {"trainer": "bfloat16"}


# Regression: kernels.using (kernels/__init__.py `using`) saves the process-wide _force_reference and restores it on exit,
# so two threads whose blocks overlap restore each other's values: here thread A enters using("reference"), B enters
# using("fused") (saving A's True), A exits (False), B exits and restores True. The process is left forcing the slow
# reference kernels for every later step of every model, though every block has exited. (The same save/restore race
# blas_threads.py's docstring describes for OpenBLAS's thread count.) Expected: the setting outside all blocks is
# what it was (a thread-local override, as precision.float32_matmul_precision does, or a counted/locked stack).
def test_overlapping_kernels_using_blocks_in_two_threads_leave_the_dispatch_as_it_was():
    initial = kernels._force_reference
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def thread_a():
        with kernels.using("reference"):
            a_in.set()
            assert b_in.wait(JOIN_S)
        a_out.set()

    def thread_b():
        assert a_in.wait(JOIN_S)
        with kernels.using("fused"):
            b_in.set()
            assert a_out.wait(JOIN_S)

    try:
        _raise_first(_in_threads(thread_a, thread_b))
        assert kernels._force_reference == initial, "every using() block exited, yet the dispatch changed"
    finally:
        kernels.use_reference(initial)


# Regression: compile/flat.py _live_bounds iterates the module-level WeakSet _LIVE (`list(_LIVE)`) while another thread's
# FlatState.__init__ adds its groups to it (`_LIVE.update(self.groups)`): "RuntimeError: Set changed size during
# iteration" from the first fused step (FusedStep -> FlatState) of a model whose trainer starts while another
# thread's does. Fix: a module lock around _LIVE's update and its snapshot (or snapshot with a retry).
def test_flat_layouts_built_in_two_threads_at_once(monkeypatch):
    from tensorarena import nn
    from tensorarena.compile import flat

    # glibc's malloc_trim after each layout is slow and irrelevant here; the race is between _live_bounds and
    # _LIVE.update, whose window grows with the number of layouts alive (a sweep keeping many models).
    monkeypatch.setattr(flat, "return_freed_memory", lambda: None)

    def layout(seed):
        m = nn.Linear(2, 2, rng=np.random.default_rng(seed))
        return flat.FlatState(m, optim.SGD(m.parameters(), lr=0.1), keep_grads=False)

    keep = [layout(s) for s in range(800)]

    def build():
        for s in range(60):
            keep.append(layout(s))

    for _ in range(2):
        with _fine_switching(1e-6):
            _raise_first(_in_threads(build, build))


def test_no_grad_in_one_thread_leaves_another_threads_graph_alone():
    from tensorarena.autograd import is_grad_enabled, no_grad

    inside, done, seen = threading.Event(), threading.Event(), {}

    def holder():
        with no_grad():
            inside.set()
            assert done.wait(JOIN_S)

    def other():
        assert inside.wait(JOIN_S)
        seen["enabled"] = is_grad_enabled()
        w = ta.Tensor(np.ones(3, np.float32), requires_grad=True)
        seen["requires_grad"] = (w * 2.0).sum().requires_grad
        done.set()

    _raise_first(_in_threads(holder, other))
    assert seen == {"enabled": True, "requires_grad": True}


def test_threads_training_beside_an_open_outer_arena_and_a_shared_pool():
    # The main thread's open arena must not receive a thread's step allocations, and a pool shared by two
    # trainers ends with nothing in use (every step arena gave its blocks back).
    pool = ta.BlockPool()
    mk = lambda s, r: lambda: Run(lambda: _mlp(s, dropout=0.2), r, batches=_rows(seed=s + 2), pool=pool)  # noqa: E731
    with ta.Arena(name="main thread's outer arena") as outer:
        _pair(mk(0, "eager"), mk(1, "fused"), repeats=1)
        assert outer.stats.allocations == 0
    assert pool.stats.bytes_in_use == 0


def _trainer_of(model) -> Trainer:
    """A trainer whose optimizer holds the model's own parameters (one of another model is refused)."""
    return Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy)
