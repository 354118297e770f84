"""Compile the fused kernels into Numba's on-disk cache once, before pytest-xdist's workers start (conftest.py).

Why: on a fresh checkout every kernel compiles on first use (a few seconds each, ~250 s of one core for the ~130
specializations the suite uses, on a 2-core Zen 3), and under `-n 2` both workers, and the subprocesses their tests
start (`python -m tensorarena train ...`), met the same kernels uncompiled at about the same time and compiled them
each. Compiled here once, by two processes that split the kernels between them (never the same kernel in both:
Numba's index file of a kernel is rewritten whole by each process that adds to it, so two writing it at once can
lose one's entry), everything after loads them from the cache.

Run as `python tests/warm_kernels.py PART PARTS`: compiles, for float32 and float64, the kernels whose index in
kernels/warmup.py's list is PART modulo PARTS. The cache is the one the tests use: PYTHONPATH names the checkout
(conftest.py sets it before it starts this).
"""

from __future__ import annotations

import sys
import time

import numpy as np


def main(part: int, parts: int) -> None:
    from tensorarena.kernels.warmup import _tiny_calls

    start = time.perf_counter()
    count = 0
    for dt in (np.float32, np.float64):
        for i, (name, call) in enumerate(sorted(_tiny_calls(dt).items())):
            if i % parts == part:
                call()
                count += 1
    print(f"warm_kernels {part}/{parts}: {count} kernel calls in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
