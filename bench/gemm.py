"""Our GEMM backends (NumPy's OpenBLAS, Intel MKL) vs torch.mm, on a transformer block's shapes, in one process.

    python bench/gemm.py [--model tiny|base|minilm] [--rounds 7] [--json out.json]
    python bench/gemm.py --steps tiny|base [--rounds 5]     # whole fused ViT steps, backends alternated
    python bench/gemm.py --steps tiny|base --routes         # ... MKL with and without kernels.gemm_jobs
    python bench/gemm.py --steps tiny|base --libraries      # ... per-core products on MKL or on OpenBLAS

Products timed, for one block of the model (ViT-Tiny batch 8: 1576 tokens x 192, MLP 768; ViT-Base
batch 1: 197 x 768, MLP 3072; MiniLM SimCSE batch 64 x 64 tokens x 384, MLP 1536):
  linear   qkv, proj, fc1, fc2: forward x W^T, dx = g W, dW = g^T x   (12 GEMMs, kernels.gemm)
  attention per (batch, head): q k^T, P v, P^T g on views of one packed qkv projection
           (kernels.attention's _slicewise: OpenBLAS split over the cores, or one MKL gemm_batch)
Rounds alternate the contenders so they see the same machine load; the figure is the median per
product summed over the block, and its ratio to torch. --steps trains a ViT on the fused route and
switches kernels.gemm between MKL and NumPy every few steps (medians per backend, one process);
with --routes it switches kernels.gemm_jobs' routes (column cuts, small products on one core) on and
off instead, MKL both ways; with --libraries it switches the library of the per-core products
(kernels.gemm_library: MKL's or numpy's OpenBLAS one-thread GEMMs, one per core).
In the block table, "mkl" and "openblas" are kernels.gemm's products with the per-core calls on that
library (attention's rows: MKL's gemm_batch in both columns, as the block bench has always timed it).
The process keeps the OpenMP wait policy chosen for MKL (idle threads spin ~2-3 ms, kernels/__init__),
which slows OpenBLAS's own threads a little in the NumPy rounds; for NumPy's BLAS on its own
settings, time a process started with TENSORARENA_GEMM=numpy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import positive_int, write_json  # noqa: E402

SHAPES = {  # tokens, width, heads, batch x heads layout for attention (B, H, T, hs)
    "tiny": dict(tokens=8 * 197, width=192, heads=(8, 3, 197, 64)),
    "base": dict(tokens=197, width=768, heads=(1, 12, 197, 64)),
    "minilm": dict(tokens=64 * 64, width=384, heads=(64, 12, 64, 32)),
}


COLUMNS = ("numpy", "mkl", "openblas", "torch")


def _median_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def block_products(model: str, rounds: int) -> dict:
    import torch

    from tensorarena.kernels import gemm as G
    from tensorarena.kernels import gemm_library
    from tensorarena.kernels.attention import _slicewise

    library = gemm_library.NAMES[gemm_library.current()]

    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    tokens, d = SHAPES[model]["tokens"], SHAPES[model]["width"]
    jobs = {}  # name -> {contender: fn}
    for name, (k, n) in {"qkv": (d, 3 * d), "proj": (d, d), "fc1": (d, 4 * d), "fc2": (4 * d, d)}.items():
        x, w, g = (rng.standard_normal(s, dtype=np.float32) for s in ((tokens, k), (n, k), (tokens, n)))
        outs = [np.empty(s, np.float32) for s in ((tokens, n), (tokens, k), (n, k))]
        tx, tw, tg = map(torch.from_numpy, (x, w, g))
        touts = list(map(torch.from_numpy, outs))
        for label, (a, b), (ta, tb), out, tout in zip(
                ("fwd", "dx", "dW"), ((x, w.T), (g, w), (g.T, x)), ((tx, tw.t()), (tg, tw), (tg.t(), tx)), outs, touts):
            jobs[f"{name}.{label}"] = {
                "numpy": lambda a=a, b=b, out=out: G.gemm_reference(a, b, out),
                "mkl": lambda a=a, b=b, out=out: _on_library("mkl", G.gemm_mkl, a, b, out),
                "openblas": lambda a=a, b=b, out=out: _on_library("openblas", G.gemm_mkl, a, b, out),
                "torch": lambda a=ta, b=tb, out=tout: torch.mm(a, b, out=out),
            }
    bsz, h, t, hs = SHAPES[model]["heads"]
    qkv = rng.standard_normal((bsz, t, 3, h, hs), dtype=np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    p = np.empty((bsz, h, t, t), np.float32)
    grad = rng.standard_normal((bsz, h, t, hs), dtype=np.float32)
    for name, (a, b, out) in {"q k^T": (q, k.swapaxes(-1, -2), p), "P v": (p, v, np.empty_like(grad)),
                              "P^T g": (p.swapaxes(-1, -2), grad, np.empty_like(grad))}.items():
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        jobs[f"attn {name}"] = {
            "numpy": lambda a=a, b=b, out=out: _numpy_slicewise(_slicewise, G, a, b, out),
            "mkl": lambda a=a, b=b, out=out: G.batched_gemm_mkl(a, b, out),
            "openblas": lambda a=a, b=b, out=out: G.batched_gemm_mkl(a, b, out),
            "torch": lambda a=ta, b=tb, out=tout: torch.matmul(a, b, out=out),
        }
    for fns in jobs.values():  # warm-up, and the three agree
        for fn in fns.values():
            fn()
    samples = {name: {c: [] for c in fns} for name, fns in jobs.items()}
    for _ in range(rounds):
        for name, fns in jobs.items():
            for contender, fn in fns.items():
                samples[name][contender].append(_median_ms(fn))
    gemm_library.use_library(library)
    return {name: {c: statistics.median(v) for c, v in per.items()} for name, per in samples.items()}


def _on_library(name: str, fn, *args) -> None:
    from tensorarena.kernels import gemm_library

    gemm_library.use_library(name)
    fn(*args)


def _numpy_slicewise(slicewise, gemm_module, a, b, out) -> None:
    """kernels.attention's split of the slices over the cores on OpenBLAS (its route without MKL)."""
    gemm_module.use_backend("numpy")
    try:
        slicewise(a, b, out)
    finally:
        gemm_module.use_backend("mkl")


def fused_steps(model: str, rounds: int, per_round: int = 3, routes: bool = False, libraries: bool = False) -> dict:
    """Median fused ViT step per contender, contenders taking turns in one process: GEMM backends
    ("mkl", "numpy"), or with `routes` MKL with kernels.gemm_jobs' routes on and off, or with `libraries`
    the per-core products on OpenBLAS and on MKL."""
    from tensorarena import optim
    from tensorarena.kernels import gemm as G
    from tensorarena.kernels import gemm_jobs, gemm_library
    from tensorarena.models.vit import ViT, ViTConfig
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    library = gemm_library.NAMES[gemm_library.current()]
    if libraries:
        contenders = {"openblas": lambda: gemm_library.use_library("openblas"),
                      "mkl": lambda: gemm_library.use_library("mkl")}
    elif routes:
        contenders = {"jobs": lambda: gemm_jobs.use_jobs(True), "mkl threads": lambda: gemm_jobs.use_jobs(False)}
    else:
        contenders = {"mkl": lambda: G.use_backend("mkl"), "numpy": lambda: G.use_backend("numpy")}
    batch = 8 if model == "tiny" else 1
    config = getattr(ViTConfig, model)(image_size=224, patch_size=16, num_classes=10)
    net = ViT(config, rng=np.random.default_rng(0))
    trainer = Trainer(net, optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01), cross_entropy, route="fused")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    times = {name: [] for name in contenders}
    try:
        for name in times:
            contenders[name]()
            trainer.step(x, y)  # warm-up on each
        for _ in range(rounds):
            for name, seen in times.items():
                contenders[name]()
                trainer.step(x, y)  # first step after a switch: caches warm up, not timed
                for _ in range(per_round):
                    start = time.perf_counter()
                    trainer.step(x, y)
                    seen.append(time.perf_counter() - start)
    finally:
        G.use_backend("mkl")
        gemm_jobs.use_jobs(True)
        gemm_library.use_library(library)
    return {n: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "steps": len(t)}
            for n, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--steps", choices=["tiny", "base"], help="time whole fused ViT steps instead")
    parser.add_argument("--routes", action="store_true",
                        help="with --steps: alternate kernels.gemm_jobs' routes on and off (MKL both ways)")
    parser.add_argument("--libraries", action="store_true",
                        help="with --steps: alternate the per-core products' library, OpenBLAS and MKL")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()

    from tensorarena.kernels import gemm as G

    if G._mkl is None:
        raise SystemExit(f"MKL is not available ({G._why_not}): nothing to compare")
    print(f"GEMM backend: {G.backend()}")
    if args.steps:
        result = fused_steps(args.steps, args.rounds, routes=args.routes, libraries=args.libraries)
        what = "GEMM routes" if args.routes else "GEMM libraries" if args.libraries else "backends"
        print(f"fused ViT-{args.steps} steps, {what} alternated in one process")
        for name, r in result.items():
            print(f"  {name:12s} median {r['median_ms']:7.1f} ms  min {r['min_ms']:7.1f} ms  ({r['steps']} steps)")
        first, second = result
        print(f"  {first} / {second} median: {result[first]['median_ms'] / result[second]['median_ms']:.3f}")
    else:
        per = block_products(args.model, args.rounds)
        print(f"one {args.model} block, median ms per product ({args.rounds} rounds)")
        print(f"{'product':14s}" + "".join(f"{c:>10s}" for c in COLUMNS))
        for name, row in per.items():
            print(f"{name:14s}" + "".join(f"{row[c]:10.2f}" for c in COLUMNS))
        totals = {c: sum(row[c] for row in per.values()) for c in COLUMNS}
        print(f"{'block total':14s}" + "".join(f"{totals[c]:10.2f}" for c in totals))
        print(f"{'x torch':14s}" + "".join(f"{totals[c] / totals['torch']:10.3f}" for c in totals))
        result = {"products_ms": per, "block_total_ms": totals}
    result["backend"] = G.backend()
    write_json(args.json, result)


if __name__ == "__main__":
    main()
