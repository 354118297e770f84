"""bfloat16 products vs float32 ones on a transformer block's linear GEMMs, ours and torch's, in one process.

    python bench/gemm_bf16.py [--model tiny|base|minilm] [--rounds 7] [--json out.json]

For the twelve linear products of one block (qkv, proj, fc1, fc2: forward, dx, dW; bench/gemm.py's
shapes) it times, taking turns:
  mkl f32        cblas_sgemm (kernels.gemm, what float32 precision runs)
  ours bf16      what float32_matmul_precision("bfloat16") runs per product (ops._products): both
                 operands rounded to bfloat16, then cblas_gemm_bf16bf16f32
  bf16 gemm only the same GEMM on operands rounded beforehand: what the rounding costs is the gap
  torch f32      torch.mm at torch's default precision ("highest")
  torch bf16     torch.mm under torch.set_float32_matmul_precision("medium") (whether that made its products
                 bfloat16 here is checked and printed: common.torch_products_in_bf16)
Medians per product summed over the block, and each sum's ratio to mkl f32.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bf16_note, positive_int, torch_products_in_bf16, write_json  # noqa: E402
from gemm import SHAPES, _median_ms  # noqa: E402


def block_jobs(model: str) -> dict:
    import torch

    from tensorarena.kernels import gemm as G
    from tensorarena.kernels import gemm_bf16 as K
    from tensorarena.ops._products import rounded  # outside an arena: heap buffers

    def medium(fn):
        def run():
            with _medium():
                fn()
        return run

    rng = np.random.default_rng(0)
    tokens, d = SHAPES[model]["tokens"], SHAPES[model]["width"]
    jobs = {}
    for name, (k, n) in {"qkv": (d, 3 * d), "proj": (d, d), "fc1": (d, 4 * d), "fc2": (4 * d, d)}.items():
        x, w, g = (rng.standard_normal(s, dtype=np.float32) for s in ((tokens, k), (n, k), (tokens, n)))
        for label, (a, b), out in zip(("fwd", "dx", "dW"), ((x, w.T), (g, w), (g.T, x)),
                                      (np.empty(s, np.float32) for s in ((tokens, n), (tokens, k), (n, k)))):
            a16, b16 = rounded(a), rounded(b)
            ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
            jobs[f"{name}.{label}"] = {
                "mkl f32": lambda a=a, b=b, out=out: G.gemm_mkl(a, b, out),
                "ours bf16": lambda a=a, b=b, out=out: K.gemm_bf16_mkl(rounded(a), rounded(b), out),
                "bf16 gemm only": lambda a=a16, b=b16, out=out: K.gemm_bf16_mkl(a, b, out),
                "torch f32": lambda a=ta, b=tb, out=tout: torch.mm(a, b, out=out),
                "torch bf16": medium(lambda a=ta, b=tb, out=tout: torch.mm(a, b, out=out)),
            }
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    from tensorarena.kernels import gemm_bf16

    if not gemm_bf16.available():
        raise SystemExit(f"no fast bfloat16 GEMM here ({gemm_bf16.why_not()}): nothing to compare")
    torch.set_num_threads(2)
    jobs = block_jobs(args.model)
    for fns in jobs.values():
        for fn in fns.values():
            fn()  # warm-up
    samples = {name: {c: [] for c in fns} for name, fns in jobs.items()}
    for _ in range(args.rounds):
        for name, fns in jobs.items():
            for contender, fn in fns.items():
                samples[name][contender].append(_median_ms(fn))
    medians = {name: {c: statistics.median(v) for c, v in per.items()} for name, per in samples.items()}
    contenders = list(next(iter(medians.values())))
    print(f"{args.model}: one block's 12 linear products, median ms per product over {args.rounds} rounds")
    print(f"{'product':<10}" + "".join(f"{c:>16}" for c in contenders))
    for name, per in medians.items():
        print(f"{name:<10}" + "".join(f"{per[c]:>16.3f}" for c in contenders))
    totals = {c: sum(per[c] for per in medians.values()) for c in contenders}
    print(f"{'block':<10}" + "".join(f"{totals[c]:>16.2f}" for c in contenders))
    print(f"{'x mkl f32':<10}" + "".join(f"{totals[c] / totals['mkl f32']:>16.3f}" for c in contenders))
    torch_bf16 = torch_products_in_bf16(lambda: _medium())
    print(bf16_note("torch bf16", torch_bf16))
    write_json(args.json, {"model": args.model, "rounds": args.rounds, "torch_medium_products_bf16": torch_bf16,
                           "median_ms": medians, "block_ms": totals})


@contextlib.contextmanager
def _medium():
    import torch

    torch.set_float32_matmul_precision("medium")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision("highest")


if __name__ == "__main__":
    main()
