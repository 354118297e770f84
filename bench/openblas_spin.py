"""OpenBLAS's idle-thread spin vs our fused kernels: one process, the two timeouts alternated.

    python bench/openblas_spin.py [--model tiny|base] [--route fused|eager] [--rounds 5] [--json out.json]

kernels/cpu.py restarts OpenBLAS's thread pool with OPENBLAS_THREAD_TIMEOUT=4 (workers sleep at
once after a matmul) instead of OpenBLAS's 28 (~0.1 s of spinning, which halves our next fused
kernel on 2 cores). This bench trains ViT (224x224, AdamW) and switches the pool between the two
timeouts every few steps, so both settings see the same machine load; it prints median and min
step time per setting and the ratio, and JSON. No PyTorch here: the rival is our own default.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import positive_int, write_json  # noqa: E402

# Measure this checkout's tensorarena, not another install (see bench/common.py's REPO_ROOT).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def restart_pool(lib: ctypes.CDLL, exponent: int) -> None:
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(exponent)
    lib.openblas_read_env()
    lib.blas_thread_shutdown_()  # the pool restarts, reading the timeout, at the next matmul


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "base"], default="tiny")
    parser.add_argument("--route", choices=["fused", "eager"], default="fused")
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--steps-per-round", type=positive_int, default=3)
    parser.add_argument("--json", help="also write the results here (they are printed after the table)")
    args = parser.parse_args()

    import numpy as np

    from tensorarena import optim
    from tensorarena.kernels.cpu import _loaded_openblas
    from tensorarena.models.vit import ViT, ViTConfig
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    path = _loaded_openblas()
    if path is None:
        raise SystemExit("numpy's BLAS is not an OpenBLAS here: nothing to compare")
    lib = ctypes.CDLL(path)
    batch = 8 if args.model == "tiny" else 1
    config = getattr(ViTConfig, args.model)(image_size=224, patch_size=16, num_classes=10)
    model = ViT(config, rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01), cross_entropy,
                      route=args.route)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    for _ in range(3):
        trainer.step(x, y)
    times: dict[int, list[float]] = {4: [], 28: []}
    for _ in range(args.rounds):
        for exponent in times:
            restart_pool(lib, exponent)
            trainer.step(x, y)  # the pool's restart lands here, untimed
            for _ in range(args.steps_per_round):
                start = time.perf_counter()
                trainer.step(x, y)
                times[exponent].append(time.perf_counter() - start)
    result = {f"timeout_2^{e}": {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "steps": len(t)}
              for e, t in times.items()}
    result["ratio_median_4_over_28"] = statistics.median(times[4]) / statistics.median(times[28])
    print(f"ViT-{args.model} batch {batch}, {args.route} route, {args.rounds} rounds x {args.steps_per_round} steps")
    for e in times:
        r = result[f"timeout_2^{e}"]
        print(f"  OPENBLAS_THREAD_TIMEOUT={e:<3} median {r['median_ms']:7.1f} ms   min {r['min_ms']:7.1f} ms")
    print(f"  ratio (4 / 28): {result['ratio_median_4_over_28']:.3f}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
