"""Which arithmetic float32 matrix products use: float32 (the default) or bfloat16 inputs.

PyTorch's `torch.set_float32_matmul_precision("medium")` lets float32 matrix products round
their inputs to bfloat16 and accumulate in float32; on CPUs with AVX512-BF16 / AMX those products
run faster (one ViT-Tiny block's linear products: 0.53x the float32 time here, the rounding
included; bench/gemm_bf16.py). tensorarena offers the same trade, under the same names, and
nothing else changes: parameters, gradients, optimizer state, activations,
normalisations, softmax and the loss stay float32, and so do matmuls of two batched operands
(NumPy's matmul runs those). Attention's products follow the setting too (ops.attention rounds q, k,
v and the incoming gradient once; its kernels round P and dS). float64 products are never rounded.

    tensorarena.set_float32_matmul_precision("bfloat16")     # process default ("medium" also works)
    with tensorarena.float32_matmul_precision("bfloat16"):   # this thread, this block
        ...
    Trainer(..., matmul_precision="bfloat16")                 # one model's training steps

A fused plan records the precision it was traced under and replays every step under it
(compile_step's `matmul_precision`), so a later change of the process default cannot mix the two
inside one plan.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

# Accepted names -> the precision they mean. "highest"/"medium" are torch's names for the same two.
_NAMES = {"float32": "float32", "highest": "float32", "bfloat16": "bfloat16", "medium": "bfloat16"}

_default = "float32"
_local = threading.local()


def normalize(name: str) -> str:
    """"float32" or "bfloat16" for any accepted name; ValueError naming the accepted ones otherwise."""
    if not isinstance(name, str) or name.lower() not in _NAMES:
        raise ValueError(f"float32 matmul precision must be one of {sorted(_NAMES)} "
                         f"('highest' = 'float32', 'medium' = 'bfloat16', as in torch), got {name!r}")
    return _NAMES[name.lower()]


def get_float32_matmul_precision() -> str:
    """The precision float32 products use on this thread now: "float32" or "bfloat16"."""
    return getattr(_local, "precision", None) or _default


def set_float32_matmul_precision(name: str) -> None:
    """Set the process default (threads inside a `float32_matmul_precision` block keep theirs)."""
    global _default
    _default = normalize(name)


@contextlib.contextmanager
def float32_matmul_precision(name: str) -> Iterator[None]:
    """Use `name`'s precision for float32 products on this thread inside the block, then restore."""
    wanted = normalize(name)
    saved = getattr(_local, "precision", None)
    _local.precision = wanted
    try:
        yield
    finally:
        _local.precision = saved
