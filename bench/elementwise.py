"""Elementwise-kernel micro-benchmark: our fused GELU / softmax kernels against torch eager.

Shapes are ViT-Tiny's at batch 8, 224 px: the MLP activation (1576, 768) and the attention
probabilities (8, 3, 197, 197), float32. Each contender runs in its own child process (torch's
OpenMP settings and ours must not meet), with torch.set_num_threads equal to Numba's thread
count. Times are the median of `--repeats` calls after a warm-up, in milliseconds.

    python -m bench.elementwise [--repeats 200] [--threads N] [--only ours|torch]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import positive_int  # noqa: E402

# Measure this checkout's tensorarena, not another install (see bench/common.py's REPO_ROOT).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GELU_SHAPE = (1576, 768)
SOFTMAX_SHAPE = (8, 3, 197, 197)


def _median_ms(fn, repeats: int) -> float:
    for _ in range(max(3, repeats // 10)):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _inputs():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal(GELU_SHAPE).astype(np.float32) * 2
    b = rng.standard_normal(GELU_SHAPE[1]).astype(np.float32)
    g = rng.standard_normal(GELU_SHAPE).astype(np.float32)
    s = rng.standard_normal(SOFTMAX_SHAPE).astype(np.float32) * 3
    mask = np.where(rng.random((SOFTMAX_SHAPE[0], 1, 1, SOFTMAX_SHAPE[3])) < 0.1, -np.inf, 0).astype(np.float32)
    sg = rng.standard_normal(SOFTMAX_SHAPE).astype(np.float32)
    return x, b, g, s, mask, sg


def run_ours(repeats: int, threads: int | None) -> dict:
    import numba
    import numpy as np

    from tensorarena import kernels

    if threads:
        numba.set_num_threads(threads)
    x, b, g, s, mask, sg = _inputs()
    k = {name: kernels.kernel(name, "fused") for name in (
        "gelu_forward", "gelu_backward", "bias_gelu_forward", "bias_gelu_backward",
        "softmax_forward", "softmax_backward")}
    out, pre, dx, db = np.empty_like(x), np.empty_like(x), np.empty_like(x), np.empty(x.shape[1], x.dtype)
    y, dy = np.empty_like(s), np.empty_like(s)
    res = {"threads": numba.get_num_threads()}
    for approx in ("none", "tanh"):
        res[f"gelu_fwd[{approx}]"] = _median_ms(lambda: k["gelu_forward"](x, out, approx), repeats)
        res[f"gelu_bwd[{approx}]"] = _median_ms(lambda: k["gelu_backward"](x, g, out, approx), repeats)
        res[f"bias_gelu_fwd[{approx}]"] = _median_ms(lambda: k["bias_gelu_forward"](x, b, pre, out, approx), repeats)
        res[f"bias_gelu_bwd[{approx}]"] = _median_ms(lambda: k["bias_gelu_backward"](pre, g, dx, db, approx),
                                                    repeats)
    res["softmax_fwd[mask]"] = _median_ms(lambda: k["softmax_forward"](s, mask, y), repeats)
    res["softmax_bwd"] = _median_ms(lambda: k["softmax_backward"](y, sg, dy), repeats)
    return res


def run_torch(repeats: int, threads: int | None) -> dict:
    import torch
    import torch.nn.functional as F

    if threads:
        torch.set_num_threads(threads)
    x, b, g, s, mask, sg = (torch.from_numpy(a) for a in _inputs())
    y = torch.softmax(s + mask, dim=-1)
    res = {"threads": torch.get_num_threads()}
    with torch.no_grad():
        for approx in ("none", "tanh"):
            res[f"gelu_fwd[{approx}]"] = _median_ms(lambda: F.gelu(x, approximate=approx), repeats)
            res[f"gelu_bwd[{approx}]"] = _median_ms(
                lambda: torch.ops.aten.gelu_backward(g, x, approximate=approx), repeats)
            res[f"bias_gelu_fwd[{approx}]"] = _median_ms(lambda: F.gelu(x + b, approximate=approx), repeats)
            res[f"bias_gelu_bwd[{approx}]"] = _median_ms(
                lambda: torch.ops.aten.gelu_backward(g, x, approximate=approx).sum(0), repeats)
        res["softmax_fwd[mask]"] = _median_ms(lambda: torch.softmax(s + mask, dim=-1), repeats)
        res["softmax_bwd"] = _median_ms(
            lambda: torch.ops.aten._softmax_backward_data(sg, y, -1, torch.float32), repeats)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=positive_int, default=200)
    ap.add_argument("--threads", type=positive_int, default=None, help="threads for both (default: Numba's default)")
    ap.add_argument("--only", choices=("ours", "torch"), default=None)
    ap.add_argument("--json", default=None, help="also write the results here (they are printed after the table)")
    ap.add_argument("--child", choices=("ours", "torch"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = run_ours if args.child == "ours" else run_torch
        print(json.dumps(fn(args.repeats, args.threads)))
        return

    results = {}
    for who in ("ours", "torch"):
        if args.only and who != args.only:
            continue
        threads = args.threads
        if who == "torch" and threads is None and "ours" in results:
            threads = results["ours"]["threads"]
        # By path, not "-m bench.elementwise", which only resolved from the repo root
        cmd = [sys.executable, os.path.abspath(__file__), "--child", who, "--repeats", str(args.repeats)]
        if threads:
            cmd += ["--threads", str(threads)]
        child = subprocess.run(cmd, capture_output=True, text=True)
        if child.returncode:
            sys.exit(f"the {who} child failed (exit {child.returncode}):\n{child.stderr.strip()}")
        results[who] = json.loads(child.stdout)
    names = [n for n in next(iter(results.values())) if n != "threads"]
    print("threads: " + ", ".join(f"{w}={r['threads']}" for w, r in results.items()))
    print(f"{'kernel':24s}" + "".join(f"{w + ' ms':>12s}" for w in results) +
          ("   ours/torch" if len(results) == 2 else ""))
    for n in names:
        row = f"{n:24s}" + "".join(f"{r[n]:12.3f}" for r in results.values())
        if len(results) == 2:
            row += f"{results['ours'][n] / results['torch'][n]:12.2f}x"
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(json.dumps(results))  # every benchmark prints its JSON too


if __name__ == "__main__":
    main()
