"""Compile every fused kernel up front, so callers can report compile time apart from step time.

Numba compiles a kernel on its first call for each argument signature (dtype, rank, layout) and,
with cache=True, writes the machine code to __pycache__ next to the kernel's module; later
processes load it from there in milliseconds. `compile_all` makes those first calls on tiny
C-contiguous inputs with the signatures the ops pass in practice (layer_norm's mean/rstd and
cross_entropy's lse are float64 whatever the input dtype; optimizer state has the parameter's).
A fused kernel needs an entry in `_tiny_calls` to be covered; `not_covered()` lists the
registered ones that lack one.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

GELU_FORMS = ("none", "tanh")


def _tiny_calls(dt) -> dict[str, Callable[[], object]]:
    """One zero-argument call per fused kernel on tiny arrays of dtype `dt`."""
    # Importing a kernel module registers its twins.
    from . import (_registry, adam, attention, cross_entropy, dropout, elementwise_fused, embedding, erf,  # noqa: F401
                   gelu, gemm, gemm_bf16, layer_norm, sgd, softmax)

    fused = {name: impls["fused"] for name, impls in _registry.items() if "fused" in impls}
    rng = np.random.default_rng(0)

    def arr(*shape):
        return rng.standard_normal(shape).astype(dt)

    n, d = 3, 5
    x, w, b, g = arr(n, d), arr(d), arr(d), arr(n, d)
    big = arr(1 << 13, d)  # 40960 elements: the elementwise kernels take nothing smaller
    stats = np.zeros(n), np.ones(n)  # float64, as ops.layer_norm saves them
    q, k, v = arr(1, 2, 3, 4), arr(1, 2, 3, 4), arr(1, 2, 3, 4)
    probs, pad = np.empty((1, 2, 3, 3), dt), np.array([[False, False, True]])
    target = np.array([0, 4, -100], np.int64)
    calls = {
        "layer_norm_forward": lambda: fused["layer_norm_forward"](x, w, b, 1e-5, arr(n, d), *stats),
        "layer_norm_backward": lambda: fused["layer_norm_backward"](g, x, w, *stats, arr(n, d), arr(d), arr(d)),
        "softmax_forward": lambda: fused["softmax_forward"](x, None, arr(n, d)),
        "softmax_backward": lambda: fused["softmax_backward"](x, g, arr(n, d)),
        # Each GELU form ("none", the erf one, and "tanh") is a kernel of its own (kernels/gelu.py).
        "gelu_forward": lambda: [fused["gelu_forward"](x, arr(n, d), form) for form in GELU_FORMS],
        "gelu_backward": lambda: [fused["gelu_backward"](x, g, arr(n, d), form) for form in GELU_FORMS],
        "bias_gelu_forward": lambda: [fused["bias_gelu_forward"](x, b, arr(n, d), arr(n, d), form)
                                      for form in GELU_FORMS],
        "bias_gelu_backward": lambda: [fused["bias_gelu_backward"](x, g, arr(n, d), arr(d), form)
                                       for form in GELU_FORMS],
        "bias_gelu_backward_recompute": lambda: [fused["bias_gelu_backward_recompute"](x, g, arr(n, d), arr(d),
                                                                                       arr(n, d), form)
                                                 for form in GELU_FORMS],
        "bias_gelu_forward_with_grad": lambda: [fused["bias_gelu_forward_with_grad"](x, b, arr(n, d), arr(n, d), form)
                                                for form in GELU_FORMS],
        "bias_gelu_backward_stored": lambda: fused["bias_gelu_backward_stored"](x, g, arr(n, d), arr(d)),
        "attention_forward": lambda: fused["attention_forward"](q, k, v, pad, False, None, arr(1, 2, 3, 4), probs),
        "attention_backward": lambda: fused["attention_backward"](q, k, v, probs, arr(1, 2, 3, 4), None,
                                                                  arr(1, 2, 3, 4), arr(1, 2, 3, 4), arr(1, 2, 3, 4)),
        "embedding_backward": lambda: fused["embedding_backward"](np.array([1, 0, 1]), g, arr(2, d)),
        "dropout_apply": lambda: fused["dropout_apply"](x, arr(n, d), 12345, 2**31, 2.0),
        "add": lambda: [fused["add"](big, big, out) for out in (arr(*big.shape), big)],  # out apart, out is a
        "bias_add": lambda: fused["bias_add"](arr(*big.shape), b),
        "column_sum": lambda: fused["column_sum"](big, arr(d)),
        "cross_entropy_forward": lambda: fused["cross_entropy_forward"](x, target, -100, 0.0, arr(n), np.empty(n)),
        "cross_entropy_backward": lambda: fused["cross_entropy_backward"](x, target, np.ones(n), -100, 0.0, 1.0,
                                                                          arr(n, d)),
        "sgd": lambda: fused["sgd"](arr(d), arr(d), arr(d), lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0,
                                    nesterov=False, maximize=False, first_step=False),
    }
    if "erf" in fused:
        calls["erf"] = lambda: fused["erf"](x, arr(n, d))
    if "gemm" in fused:  # MKL: a small product compiles kernels.gemm_jobs' loop; MKL loads its CPU-specific code
        calls["gemm"] = lambda: fused["gemm"](x, x.T, arr(n, n))
        calls["batched_gemm"] = lambda: fused["batched_gemm"](q, k.swapaxes(-1, -2), probs)
    # float32 only (bfloat16 rounds float32), in the layouts ops pass: rows, a transposed view, and
    # attention's (B, H, T, hs) heads.
    x32 = x.astype(np.float32)
    q32 = q.astype(np.float32).swapaxes(1, 2)
    calls["to_bfloat16"] = lambda: [fused["to_bfloat16"](src, np.empty(src.shape, np.uint16)) for src in (x32, x32.T, q32)]
    if "gemm_bf16" in fused:  # MKL loads its bfloat16 code
        x16 = np.zeros((n, d), np.uint16)
        calls["gemm_bf16"] = lambda: fused["gemm_bf16"](x16, x16.T, np.empty((n, n), np.float32))
    calls.update(_optimizer_calls(dt, arr))
    return calls


def _optimizer_calls(dt, arr) -> dict[str, Callable[[], object]]:
    """Optimizer kernels warmed through their optimizers' update_flat (exact argument types, including
    the None-or-array variants Numba compiles separately: amsgrad, momentum, centered)."""
    from .. import optim
    from ..nn.parameter import Parameter

    def run(*makers):
        def call():
            for make in makers:
                p = Parameter(arr(5), dtype=dt)
                p.grad = arr(5)
                make([p]).step()
        return call

    return {
        "adam": run(lambda ps: optim.Adam(ps, fused=True), lambda ps: optim.Adam(ps, amsgrad=True, fused=True)),
        "nadam": run(lambda ps: optim.NAdam(ps, fused=True)),
        "rmsprop": run(lambda ps: optim.RMSprop(ps, fused=True),
                       lambda ps: optim.RMSprop(ps, momentum=0.9, centered=True, fused=True)),
        "adagrad": run(lambda ps: optim.Adagrad(ps, fused=True)),
        "lion": run(lambda ps: optim.Lion(ps, fused=True)),
        "lamb": run(lambda ps: optim.LAMB(ps, fused=True)),
        "adamax": run(lambda ps: optim.Adamax(ps, fused=True)),
        "radam": run(lambda ps: optim.RAdam(ps, fused=True)),
        "adadelta": run(lambda ps: optim.Adadelta(ps, fused=True)),
        "rprop": run(lambda ps: optim.Rprop(ps, fused=True)),
        "asgd": run(lambda ps: optim.ASGD(ps, fused=True)),
    }


def not_covered() -> list[str]:
    """Registered fused kernels that `compile_all` has no tiny call for (they compile on first use)."""
    from . import _load, _registry

    _load()  # the kernels the dispatcher knows about
    covered = set(_tiny_calls(np.float32))  # also imports (registers) the modules warmed here
    return sorted(name for name, impls in _registry.items() if "fused" in impls and name not in covered)


def compile_all(dtypes=(np.float32,)) -> dict[str, float]:
    """Call every fused kernel once per dtype on tiny inputs; returns seconds spent per kernel name.

    Seconds are summed over `dtypes`. A warm on-disk cache makes each a few milliseconds; a cold
    one (first run after install or after editing a kernel) takes seconds per kernel and dtype.
    """
    seconds: dict[str, float] = {}
    for dt in dtypes:
        for name, call in _tiny_calls(np.dtype(dt).type).items():
            t0 = time.perf_counter()
            call()
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
    return seconds
