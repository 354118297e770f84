"""This machine's float32 GEMM peak through NumPy's BLAS: the ceiling the training benchmarks are measured against.

    python bench/sgemm_peak.py [--sizes 1024,2048,3072] [--repeats 5] [--json out.json]

For each size n, times C = A @ B on (n, n) float32 matrices `repeats` times (after one
warm-up) and takes the fastest (see measure_sgemm_peak); the peak is the best over the sizes, in GFLOP/s
(2 n^3 FLOPs per product). Other benchmarks import `measure_sgemm_peak()`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import positive_int  # noqa: E402


def measure_sgemm_peak(sizes: tuple[int, ...] = (1024, 2048, 3072), repeats: int = 5, *,
                       detail: bool = False) -> float | dict:
    """Best over `sizes` of the fastest float32 n x n matmul's rate, in GFLOP/s (dict of all rates if detail). The
    fastest repeat, not the median: a peak is what the machine can do, and one busy moment halved a median (shares
    of "peak" over 150% in bench/vit.py under load)."""
    import numpy as np

    rng = np.random.default_rng(0)
    rates = {}
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        out = np.empty((n, n), dtype=np.float32)
        np.matmul(a, b, out=out)  # warm-up: BLAS threads start, pages are touched
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.matmul(a, b, out=out)
            times.append(time.perf_counter() - start)
        rates[n] = 2 * n**3 / min(times) / 1e9
    peak = max(rates.values())
    if detail:
        return {"peak_gflops": peak, "gflops_by_size": rates, "repeats": repeats, "blas": _blas_name()}
    return peak


def _blas_name() -> str:
    import numpy as np

    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version', '')}".strip()
    except Exception:  # the config layout differs between NumPy versions; the name is only a label
        return "unknown"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024,2048,3072", help="comma-separated matrix sides")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    result = measure_sgemm_peak(tuple(int(s) for s in args.sizes.split(",")), args.repeats, detail=True)
    for n, rate in result["gflops_by_size"].items():
        print(f"sgemm {n:>5} x {n:<5} {rate:8.1f} GFLOP/s (fastest of {args.repeats})")
    print(f"peak {result['peak_gflops']:.1f} GFLOP/s ({result['blas']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))  # every benchmark prints its JSON too
