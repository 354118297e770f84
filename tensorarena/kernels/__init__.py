"""The one place that decides which implementation of a kernel runs.

Every kernel has a plain-NumPy reference twin and may have a fused (Numba) one.
Ops ask `kernel(name)` and never test for a backend themselves. Setting
TENSORARENA_KERNELS=reference (or calling `use_reference(True)`) forces the
reference twins; `calls` counts which implementation served each name so tests
can assert the route that actually ran.

`generation()` counts the changes of dispatch (use_reference to the other value, register replacing
or adding an implementation once the kernel files are loaded, unregister, gemm.use_backend,
gemm_jobs.use_jobs), and `dispatch_key()` says what the dispatch is now. A fused step keys its plans by
the key, so a switch traces a plan of its own (the old one may ask for other scratch buffers) and a
captured recording, which keeps calling the functions it recorded, is made for the new plan
(compile/step.py plan_for, compile/captured.changed).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from typing import Callable, Iterator

from .. import tape as _tape
from .mkl_lib import mkl_expected

# How idle OpenMP threads wait. It must be chosen before the OpenMP runtime (libgomp) loads: when
# kernels.gemm loads MKL, or when the first fused kernel runs. Values the user set win.
# - GEMMs on numpy's OpenBLAS: its threads are a second pool beside libgomp's, and Numba's workers
#   spinning after each kernel stole the cores from the next matmul's (~40% of the MLP benchmark's
#   step), so libgomp's threads sleep at once (PASSIVE).
# - GEMMs on MKL: MKL runs on the same libgomp pool as the kernels, so nothing competes with a
#   spinning worker, and waking a sleeping one for each of a step's ~600 parallel regions (GEMMs,
#   kernels, MKL's own barriers) cost ~10%: fused ViT-Tiny steps, median of 5 alternated runs each,
#   507 ms passive vs 454-464 ms spinning 30k-300k rounds. 100k rounds is ~2-3.5 ms of spinning
#   after a region before the thread sleeps (libgomp's own default is 300k).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    if mkl_expected():
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
        os.environ["GOMP_SPINCOUNT"] = "100000"
    else:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")

_registry: dict[str, dict[str, Callable]] = {}
calls: Counter = Counter()  # (name, impl) -> times handed out


def _kernels_from_environment() -> bool:
    """TENSORARENA_KERNELS, checked as TENSORARENA_GEMM is: "reference" forces the twins, "fused" (or unset) does
    not; anything else (a typo such as "refrence") is an error, not silently the fused kernels."""
    wanted = os.environ.get("TENSORARENA_KERNELS", "fused").lower() or "fused"
    if wanted not in ("fused", "reference"):
        raise ValueError(f"TENSORARENA_KERNELS must be 'reference' (the plain NumPy twins) or 'fused' (the "
                         f"default), got {wanted!r}")
    return wanted == "reference"


_force_reference = _kernels_from_environment()
_generation = 0  # bumped by dispatch_changed(); a captured step compares it before each replay
_ready = False  # True once _load has imported the kernel files: registrations before that are set-up


def generation() -> int:
    """How many times kernel dispatch has changed in this process (a captured step records again after one)."""
    return _generation


def dispatch_changed() -> None:
    """Note that the kernel a name hands out (or how it runs, e.g. gemm_jobs.use_jobs) changed."""
    global _generation
    _generation += 1


# forced -> (generation, dispatch_key() at that generation): one per value of _forced(), since a using()
# block in one thread must not hand its key to another.
_key_cache: dict[bool, tuple[int, tuple]] = {}


def dispatch_key() -> tuple:
    """The kernels a step is handed now, as one hashable value: whether the reference twins are forced,
    whether products may run as gemm_jobs, the library of the per-core products (gemm_library), and the
    function each kernel name hands out (the objects themselves, so an id is never reused while a key
    holds it). A fused step keys its plans by it: a
    plan traced under one dispatch may ask for other scratch buffers under another (attention's
    reference twin does), so a switch traces a plan of its own, and a switch back finds the first one
    with its recording. Rebuilt only after dispatch_changed(); otherwise two compares."""
    forced = _forced()
    cached = _key_cache.get(forced)
    if cached is None or cached[0] != _generation:
        _load()
        from . import gemm_jobs, gemm_library

        generation_now = _generation
        chosen = []
        for name in sorted(_registry):
            if _registry[name]:  # every implementation unregistered: nothing to hand out
                impl = choose(name)
                chosen.append((name, impl, _registry[name][impl]))
        cached = (generation_now, (forced, gemm_jobs.enabled(), gemm_library.current(), tuple(chosen)))
        _key_cache[forced] = cached
    return cached[1]


def register(name: str, impl: str, fn: Callable) -> Callable:
    """Record `fn` as implementation `impl` ("reference" or "fused") of kernel `name`."""
    if impl not in ("reference", "fused"):
        raise ValueError(f"impl must be 'reference' or 'fused', got {impl!r}")
    impls = _registry.setdefault(name, {})
    old = impls.get(impl)
    impls[impl] = fn
    # A new name was never handed out, and a kernel file's import (e.g. its fused twin after the reference
    # one) happens before any step was recorded; replacing a function, or adding a twin later, changes
    # what a recorded step would have been handed.
    if (old is not None and old is not fn) or (old is None and len(impls) > 1 and _ready):
        dispatch_changed()
    return fn


def unregister(name: str, impl: str) -> None:
    """Remove implementation `impl` of `name`, if registered (kernels.gemm.use_backend("numpy") drops MKL's)."""
    if _registry.get(name, {}).pop(impl, None) is not None:
        dispatch_changed()


def use_reference(flag: bool = True) -> None:
    """Force (or stop forcing) the plain-NumPy reference kernels process-wide."""
    global _force_reference
    if bool(flag) != _force_reference:
        dispatch_changed()
    _force_reference = bool(flag)


# `using` blocks override the process-wide choice in their own thread only. Saving and restoring the global
# flag instead raced: thread A in using("reference"), B in using("fused") saving A's value, A leaving, B
# leaving and restoring A's "reference" for every later step of every model (tests/test_threads_hunt.py).
_local = threading.local()  # .force: True/False inside a using() block of this thread, absent outside


def _forced() -> bool:
    """Whether reference twins are forced in this thread: its innermost using() block, else use_reference."""
    override = getattr(_local, "force", None)
    return _force_reference if override is None else override


@contextlib.contextmanager
def using(impl: str) -> Iterator[None]:
    """Run a block of this thread on "fused" or forced "reference" kernels ("default" leaves the choice), then
    restore what the thread had. Other threads keep their own choice."""
    if impl not in ("fused", "reference", "default"):
        raise ValueError(f"impl must be 'fused', 'reference' or 'default', got {impl!r}")
    saved = getattr(_local, "force", None)
    if impl != "default":
        _local.force = impl == "reference"
    try:
        yield
    finally:
        _local.force = saved


def choose(name: str, impl: str | None = None) -> str:
    """Which implementation `kernel(name, impl)` hands out, without counting a call.

    Callers that must prepare for the reference twin (e.g. scratch memory the fused one
    does not need) ask here first, then pass the answer to `kernel`.
    """
    _load()
    impls = _registry.get(name)
    if not impls:
        raise KeyError(f"no kernel named {name!r}; known: {sorted(_registry)}")
    if impl is None:
        impl = "reference" if _forced() or "fused" not in impls else "fused"
    return impl


def kernel(name: str, impl: str | None = None) -> Callable:
    """The implementation of `name` to run: fused when available and allowed, else reference."""
    impl = choose(name, impl)
    fn = _registry[name][impl]
    if _tape.active() is not None:  # a fused step is being recorded (tensorarena/tape.py); its replays count too
        def count(key=(name, impl)):
            calls[key] += 1
        return _tape.recorded(fn, count)
    calls[(name, impl)] += 1
    return fn


def lookup(name: str, impl: str | None = None) -> tuple[Callable, str]:
    """(the function `kernel(name, impl)` would hand out, its implementation), without counting a call or
    recording it: for code that binds a kernel once and counts each later call itself (Optimizer.prepare_flat)."""
    impl = choose(name, impl)
    return _registry[name][impl], impl


def implementations(name: str) -> list[str]:
    """Which implementations exist for `name`."""
    _load()
    return sorted(_registry.get(name, {}))


@contextlib.contextmanager
def calls_unchanged() -> Iterator[None]:
    """Run kernels without counting them: for warm-ups that compile or load a kernel before a process is measured
    (stream/optim_state.load_update_kernels, train/route_plan). Tests read `calls` to see which route ran, and a
    warm-up is no step of any route."""
    counted = calls.copy()
    try:
        yield
    finally:
        calls.clear()
        calls.update(counted)


_loaded = False  # set when _load starts, so a kernel file asking for a kernel while it loads does not recurse
# Held while the kernel files load. Without it, a second thread's first kernel lookup saw _loaded set by the
# first thread, skipped the imports and read a half-filled registry: KeyError("no kernel named
# 'cross_entropy_forward'") (tests/test_threads_hunt.py). Re-entrant: the loading thread itself may recurse.
_load_lock = threading.RLock()


def _load() -> None:
    # Kernel files register themselves on import; import lazily so `import tensorarena`
    # does not pay Numba's start-up cost until a kernel is first needed.
    global _loaded, _ready
    if _ready:
        return
    with _load_lock:
        if _loaded:  # finished by another thread while this one waited, or this thread recursing
            return
        _loaded = True
        try:
            from . import cpu  # noqa: F401 - first: it sets the vector width before Numba builds its compiler
            from . import (adadelta, adagrad, adam, adamax, asgd, attention, cross_entropy, dropout,  # noqa: F401
                           elementwise_fused, embedding, erf, gelu, gemm, gemm_bf16, lamb, layer_norm, lion, nadam,
                           radam, rmsprop, rprop, sgd, softmax)
        except BaseException:
            _loaded = False  # a failed import (or an interrupt) leaves the next call to try again, not a half registry
            raise
        _ready = True

