"""Which kernel implementation actually served each op: fused by default, reference when forced.

Every op that runs on kernels is run forward and backward (optimizers: one step) and the dispatch
counters in `kernels.calls` must show the expected twin, and only that twin, serving every kernel
the op uses. A silent fallback to the reference (or to some NumPy path that bypasses the
dispatcher) fails here rather than as a slow benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import kernels, optim
from tensorarena.nn import Parameter
from tensorarena.ops import (bias_gelu, cross_entropy, dropout, embedding, gelu, layer_norm,
                             packed_self_attention, scaled_dot_product_attention, softmax)

IMPLS = ("fused", "reference")


def _leaf(seed: int, shape, dtype=np.float32) -> ta.Tensor:
    return ta.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=dtype, requires_grad=True)


def _backward(out: ta.Tensor) -> None:
    (out * ta.tensor(np.random.default_rng(9).standard_normal(out.shape), dtype=out.dtype)).sum().backward()


def _layer_norm():
    _backward(layer_norm(_leaf(0, (4, 3, 8)), 8, _leaf(1, (8,)), _leaf(2, (8,))))


def _gelu():
    for form in ("none", "tanh"):
        _backward(gelu(_leaf(0, (5, 6)), approximate=form))


def _softmax():
    _backward(softmax(_leaf(0, (3, 4, 5)), -1))
    _backward(softmax(_leaf(0, (3, 4, 5)), 1))  # a non-last dim runs on the same kernels


def _cross_entropy():
    _backward(cross_entropy(_leaf(0, (6, 5)), np.array([0, 1, -100, 4, 2, 2])))
    _backward(cross_entropy(_leaf(1, (2, 5, 3)), np.zeros((2, 3), np.int64), reduction="none"))


def _attention():
    pad = np.array([[False, False, True, False], [False, False, False, False]])
    _backward(scaled_dot_product_attention(_leaf(0, (2, 3, 4, 8)), _leaf(1, (2, 3, 4, 8)), _leaf(2, (2, 3, 4, 8)),
                                           key_padding_mask=pad, causal=True))


def _packed_attention_with_dropout():
    _backward(packed_self_attention(_leaf(0, (2, 4, 24)), 2, dropout_p=0.2, rng=np.random.default_rng(0)))


def _dropout():
    _backward(dropout(_leaf(0, (3, 7)), 0.4, rng=np.random.default_rng(0)))


def _embedding():
    _backward(embedding(np.array([[1, 0, 1], [2, 2, 2]]), _leaf(0, (4, 5))))


def _bias_gelu():
    _backward(bias_gelu(_leaf(0, (2, 3, 8)), _leaf(1, (8,))))


def _step(make):
    params = [Parameter(np.random.default_rng(i).standard_normal(s), dtype=np.float32)
              for i, s in enumerate([(4, 3), (3,)])]
    opt = make(params)
    for p in params:
        p.grad = np.ones(p.shape, np.float32)
    opt.step()


# op -> (runner, the kernels it must use)
OPS = {
    "layer_norm": (_layer_norm, ["layer_norm_forward", "layer_norm_backward"]),
    "gelu": (_gelu, ["gelu_forward", "gelu_backward"]),
    "softmax": (_softmax, ["softmax_forward", "softmax_backward"]),
    "cross_entropy": (_cross_entropy, ["cross_entropy_forward", "cross_entropy_backward"]),
    "attention": (_attention, ["attention_forward", "attention_backward"]),
    "bias_gelu": (_bias_gelu, ["bias_gelu_forward", "bias_gelu_backward"]),
    "attention_dropout": (_packed_attention_with_dropout, ["attention_forward", "attention_backward"]),
    "dropout": (_dropout, ["dropout_apply"]),
    "embedding": (_embedding, ["embedding_backward"]),
    "sgd": (lambda: _step(lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9)), ["sgd"]),
    "adam": (lambda: _step(lambda ps: optim.AdamW(ps, lr=0.1)), ["adam"]),
}


@pytest.fixture
def restore_kernel_choice():
    saved = kernels._force_reference
    yield
    kernels.use_reference(saved)


@pytest.mark.parametrize("op", list(OPS))
def test_default_runs_fused_and_forcing_runs_reference(op, restore_kernel_choice):
    run, names = OPS[op]
    # "Default" means nothing forced: independent of TENSORARENA_KERNELS in the test environment.
    for impl, other in (("fused", "reference"), ("reference", "fused")):
        kernels.use_reference(impl == "reference")
        before = {(n, i): kernels.calls[(n, i)] for n in names for i in IMPLS}
        run()
        for name in names:
            assert kernels.calls[(name, impl)] > before[(name, impl)], f"{op}: {name} {impl} did not run"
            assert kernels.calls[(name, other)] == before[(name, other)], f"{op}: {name} {other} ran instead"


_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from tensorarena import kernels
from tests import test_ops_routes as routes
for run, _ in routes.OPS.values():
    run()
print(json.dumps({{f"{{n}}|{{i}}": c for (n, i), c in kernels.calls.items()}}))
"""


def test_environment_variable_forces_reference_in_a_fresh_process():
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, TENSORARENA_KERNELS="reference")
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=root)], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    used = {name for _, names in OPS.values() for name in names}
    assert {key.split("|")[0] for key in calls} >= used
    assert all(key.endswith("|reference") for key in calls), f"fused kernels ran despite the variable: {calls}"
