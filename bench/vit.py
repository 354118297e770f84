"""ViT training steps, 224x224 images, AdamW: tensorarena eager and fused vs PyTorch eager vs torch.compile.

    python bench/vit.py [--only tiny|base] [--steps N] [--json out.json]

Cases: ViT-Tiny batch 8 (20 timed steps by default) and ViT-Base batch 1 (40 timed steps),
patch 16, 10 classes, random images and labels, AdamW lr 1e-3 weight decay 0.01, no clipping.
Each contender runs in its own child process (bench/common.py), so its peak RSS is its own.
The PyTorch model is written here to mirror tensorarena.models.vit layer for layer (pre-norm
blocks, fused qkv, exact GELU, class-token head); both are randomly initialised.
torch.compile(model) uses the default inductor backend; its first step (which compiles) is
reported separately, and if it cannot compile here the error text goes into the JSON and the
contender is marked unavailable.

Reported per contender: median step time (timed steps, after warm-up), first step time,
peak RSS, RSS slope over the timed steps (bytes/step), achieved GFLOP/s and its share of
this machine's float32 GEMM peak (bench/sgemm_peak.py).

Training FLOPs per step, counted analytically (matmuls only; layer norms, GELU, softmax
and the optimizer are not counted):
    B images, N = (image/patch)^2 patches, T = N + 1 tokens, D width, L blocks, M MLP width,
    P patch, C classes, H heads (H * hs = D)
    blocks      6 * B*T * L * (3D*D + D*D + 2*D*M)          qkv, proj, fc1, fc2: fwd 2, bwd 4
    attention   L * 3 * (2 * 2 * B*H*T*T*hs)                 q k^T and p v; bwd = 2 x fwd
    patches     4 * B*N * (3*P*P*D)                          no gradient w.r.t. the pixels
    head        6 * B * D*C
This counts the model as PyTorch's mirror runs it. tensorarena's ViT computes its last block's
attention rows, projection, norm and MLP for [CLS] alone (ViTConfig.cls_only_last_block: the head
reads nothing else; same values), so its GFLOP/s are the model's FLOPs per second, not the ones
it executed. bench/vit_interleaved.py times it with that off too.
Bars (issue 3): our eager median step <= 0.9x PyTorch eager, our peak RSS <= PyTorch eager's,
and ViT-Base batch 1 over 40 steps: our RSS slope < 1 MB/step.
"tensorarena fused" is Trainer(route="fused") as a user gets it: no clipping here, so each
parameter is updated inside backward and no gradient buffer exists (compile/step.py). A second
fused contender, "tensorarena fused flat-grads", runs Trainer(update_in_backward=False): flat
gradients and one update kernel after backward, the fused route's layout when clipping.
Bars (issue 4): fused median step <= 0.7x PyTorch eager and <= 1.0x torch.compile, fused peak RSS
<= 0.8x PyTorch eager's. The fused contender also reports its plan's memory_report() (made before
step 1) against the RSS growth it measured over the baseline taken before compiling.
Before the measured children, one short child per tensorarena contender (1 timed step) fills Numba's
on-disk kernel cache, so the measured runs load compiled kernels as every run after the first does.
A child that compiles them itself counts LLVM's compile-time memory in its peak RSS: ViT-Tiny's fused
peak was 0.799x PyTorch eager's with every kernel compiling in the child and 0.637x with them cached
(two runs of this script, 2026-11-30). --cold-kernels skips the filling run to measure that first run.
"tensorarena fused bf16 mm" is the fused route with Trainer(matmul_precision="bfloat16"): float32
products round their operands to bfloat16 (tensorarena/precision.py). It is a different precision
from PyTorch eager's default, so its ratios here are not like for like; bench/vit_bf16.py times it
against PyTorch with bfloat16 matmuls and under autocast.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (after_kernel_warmup, child_main, cpu_name, positive_int, time_torch_steps,  # noqa: E402
                    time_trainer, write_json)

IMAGE, PATCH, CLASSES, LR, WEIGHT_DECAY = 224, 16, 10, 1e-3, 0.01
WARMUP = 3
CASES = {
    "tiny": {"title": "ViT-Tiny", "dim": 192, "depth": 12, "heads": 3, "mlp": 768, "batch": 8, "steps": 20},
    "base": {"title": "ViT-Base", "dim": 768, "depth": 12, "heads": 12, "mlp": 3072, "batch": 1, "steps": 40},
}
FUSED_FLAT = "tensorarena fused flat-grads"  # Trainer(route="fused", update_in_backward=False)
FUSED_BF16 = "tensorarena fused bf16 mm"  # Trainer(route="fused", matmul_precision="bfloat16")
CONTENDERS = ["tensorarena eager", "tensorarena fused", FUSED_FLAT, FUSED_BF16, "pytorch eager", "torch.compile"]
REFERENCE = "pytorch eager"
CHILD_TIMEOUT_S = 1800
MB = 1e6


def vit_train_flops(*, batch: int, dim: int, depth: int, heads: int, mlp: int, image: int = IMAGE,
                    patch: int = PATCH, classes: int = CLASSES, channels: int = 3) -> float:
    """One training step's matmul FLOPs (the formula in this file's docstring)."""
    n = (image // patch) ** 2
    t = n + 1
    blocks = 6 * batch * t * depth * (4 * dim * dim + 2 * dim * mlp)
    attention = depth * 3 * (2 * 2 * batch * t * t * dim)  # H * hs = D
    patches = 4 * batch * n * (channels * patch * patch * dim)
    head = 6 * batch * dim * classes
    return float(blocks + attention + patches + head)


# -- children ---------------------------------------------------------------------------------
def _case() -> dict:
    case = CASES[os.environ.get("BENCH_CASE", "tiny")]
    if os.environ.get("BENCH_BATCH"):  # bench/micro_batches.py's batch
        case = dict(case, batch=int(os.environ["BENCH_BATCH"]))
    return case


def _steps() -> int:
    return int(os.environ.get("BENCH_STEPS") or _case()["steps"])


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    batch = _case()["batch"]
    return (rng.standard_normal((batch, 3, IMAGE, IMAGE), dtype=np.float32),
            rng.integers(0, CLASSES, batch).astype(np.int64))


def run_ours(route: str = "eager", update_in_backward: bool | None = None, matmul_precision: str = "float32",
             micro_batch: int | None = None) -> dict:
    import numpy as np

    from tensorarena import optim
    from tensorarena.models.vit import ViT, ViTConfig
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    case = _case()
    name = os.environ.get("BENCH_CASE", "tiny")
    config = getattr(ViTConfig, name)(image_size=IMAGE, patch_size=PATCH, num_classes=CLASSES)
    model = ViT(config, rng=np.random.default_rng(0))
    got = {"dim": config.dim, "depth": config.depth, "heads": config.num_heads}
    want = {k: case[k] for k in got}
    if got != want:
        raise SystemExit(f"ViTConfig.{name}() is {got}, the benchmark's FLOP count assumes {want}")
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY), cross_entropy,
                      route=route, update_in_backward=update_in_backward, matmul_precision=matmul_precision,
                      micro_batch=micro_batch)
    x, y = _data()
    if route != "fused":
        return time_trainer(trainer, x, y, warmup=WARMUP, steps=_steps())
    from tensorarena.kernels.warmup import compile_all
    from tensorarena.memory.meter import rss_bytes

    compile_all()
    after_kernel_warmup()
    baseline = rss_bytes()
    started = time.perf_counter()
    report = trainer.compile(x, y).memory_report()
    trace_s = time.perf_counter() - started
    result = time_trainer(trainer, x, y, warmup=WARMUP, steps=_steps())
    result.update(trace_s=trace_s, memory_report=report, predicted_growth_bytes=report["predicted_growth"],
                  measured_growth_bytes=rss_bytes() - baseline)
    result["prediction_ratio"] = result["measured_growth_bytes"] / report["predicted_growth"]
    passes = -(-len(x) // micro_batch) if micro_batch else 1  # replays per step
    result["routes"] = sorted({"fused"} if trainer.fused.replays == passes * (WARMUP + _steps()) else {"NOT all fused"})
    result["update_in_backward"] = trainer.fused.update_in_backward
    return result


def run_fused() -> dict:
    return run_ours("fused")


def run_fused_flat_grads() -> dict:
    return run_ours("fused", update_in_backward=False)


def run_fused_bf16() -> dict:
    from tensorarena.kernels import calls

    result = run_ours("fused", matmul_precision="bfloat16")
    if not calls[("gemm_bf16", "fused")]:
        raise SystemExit("the bfloat16 contender ran no bfloat16 GEMM (kernels.gemm_bf16 is not available here)")
    return result


def _torch_vit(case: dict):
    """A PyTorch ViT mirroring tensorarena.models.vit (timm's VisionTransformer layout)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    dim, heads, eps = case["dim"], case["heads"], 1e-6

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            B, T, C = x.shape
            qkv = self.qkv(x).reshape(B, T, 3, heads, C // heads).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
            y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # (B, nh, T, hs)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim, eps=eps)
            self.attn = Attention()
            self.norm2 = nn.LayerNorm(dim, eps=eps)
            self.mlp = nn.Sequential(nn.Linear(dim, case["mlp"]), nn.GELU(), nn.Linear(case["mlp"], dim))

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            n = (IMAGE // PATCH) ** 2
            self.patch_embed = nn.Conv2d(3, dim, PATCH, stride=PATCH)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
            self.blocks = nn.Sequential(*[Block() for _ in range(case["depth"])])
            self.norm = nn.LayerNorm(dim, eps=eps)
            self.head = nn.Linear(dim, CLASSES)

        def forward(self, images):
            x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, D)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed  # (B, T, D)
            x = self.norm(self.blocks(x))
            return self.head(x[:, 0])  # class token -> logits (B, C)

    return ViT()


def _run_torch(compiled: bool) -> dict:
    import torch

    torch.manual_seed(0)
    model = _torch_vit(_case())
    x, y = (torch.from_numpy(a) for a in _data())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    forward = torch.compile(model) if compiled else model

    def step():
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    result = time_torch_steps(step, compiled=compiled, warmup=WARMUP, steps=_steps())
    if not result.get("unavailable"):
        result["parameters"] = sum(p.numel() for p in model.parameters())
    return result


def run_torch() -> dict:
    return _run_torch(False)


def run_compiled() -> dict:
    import shutil
    import tempfile

    # A fresh inductor cache, so the first step shows a cold compile, not a cache hit from an earlier run.
    cache = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        return _run_torch(True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# -- parent: shared with bench/simcse.py --------------------------------------------------------
def run_contenders(script: str, names: list[str], env: dict) -> dict[str, dict]:
    """Run `script --child NAME` per contender; a crashed or timed-out child is recorded, not raised."""
    results = {}
    for name in names:
        started = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, script, "--child", name], capture_output=True, text=True,
                                  env={**os.environ, **env}, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            results[name] = {"unavailable": True, "error": f"timed out after {CHILD_TIMEOUT_S} s"}
            continue
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            results[name] = {"unavailable": True, "error": f"exit {proc.returncode}: {proc.stderr[-4000:]}"}
        else:
            results[name] = json.loads(line[len("RESULT "):])
        results[name]["wall_s"] = time.perf_counter() - started
    return results


def add_rates(results: dict[str, dict], flops: float, peak_gflops: float) -> None:
    """Achieved GFLOP/s from the median step and its share of the sgemm peak."""
    for r in results.values():
        if not r.get("unavailable"):
            r["train_flops_per_step"] = flops
            r["achieved_gflops"] = flops / r["median_step_s"] / 1e9
            r["share_of_sgemm_peak"] = r["achieved_gflops"] / peak_gflops


def print_table(title: str, results: dict[str, dict], reference: str = REFERENCE) -> None:
    """Median/first step, ratio to `reference`, peak RSS (and ratio), RSS slope, GFLOP/s and % of peak."""
    ref = results.get(reference, {})
    print(f"\n{title}")
    header = (f"{'contender':<30}{'median ms':>11}{'first ms':>11}{'x ' + reference:>16}{'peak RSS MiB':>14}"
              f"{'RSS x':>8}{'slope KB/step':>15}{'GFLOP/s':>9}{'% peak':>8}")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        if r.get("unavailable"):
            print(f"{name:<30}unavailable: {r['error'].strip().splitlines()[-1][:90] if r['error'].strip() else '?'}")
            continue
        ok = ref and not ref.get("unavailable")
        time_x = f"{r['median_step_s'] / ref['median_step_s']:.3f}" if ok else "-"
        rss_x = f"{r['peak_rss_bytes'] / ref['peak_rss_bytes']:.3f}" if ok else "-"
        print(f"{name:<30}{r['median_step_s'] * 1e3:>11.1f}{r['first_step_s'] * 1e3:>11.1f}{time_x:>16}"
              f"{r['peak_rss_bytes'] / 2**20:>14.1f}{rss_x:>8}{r['rss_slope_bytes_per_step'] / 1e3:>15.1f}"
              f"{r['achieved_gflops']:>9.1f}{r['share_of_sgemm_peak']:>8.1%}"
              + ("  (over the measured peak: the peak measurement was disturbed)" if r['share_of_sgemm_peak'] > 1
                 else ""))
    compiled = results.get("torch.compile", {})
    if "compile_first_step_s" in compiled:
        print(f"torch.compile first step (compiles): {compiled['compile_first_step_s']:.1f} s")


def fused_verdict(results: dict[str, dict], name: str = "tensorarena fused") -> dict:
    """Issue 4's bars for the fused contender `name` against PyTorch eager and torch.compile."""
    fused, eager, compiled = (results.get(k, {}) for k in (name, REFERENCE, "torch.compile"))
    if not fused or fused.get("unavailable") or not eager or eager.get("unavailable"):
        return {"available": False}
    v = {"contender": name, "step_vs_torch_eager": fused["median_step_s"] / eager["median_step_s"],
         "rss_vs_torch_eager": fused["peak_rss_bytes"] / eager["peak_rss_bytes"],
         "prediction_ratio": fused["prediction_ratio"]}
    v["step_bar_0.7x_met"] = v["step_vs_torch_eager"] <= 0.7
    v["prediction_bar_met"] = 0.95 <= v["prediction_ratio"] <= 1.05
    v["rss_bar_0.8x_met"] = v["rss_vs_torch_eager"] <= 0.8
    if compiled and not compiled.get("unavailable"):
        v["step_vs_torch_compile"] = fused["median_step_s"] / compiled["median_step_s"]
        v["step_bar_1.0x_compile_met"] = v["step_vs_torch_compile"] <= 1.0
    return v


def print_fused_verdict(v: dict) -> None:
    if not v.get("available", True):
        print("fused bars: not evaluated (tensorarena fused or pytorch eager was not run or unavailable)")
        return
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    print(f"[{v['contender']}]" + (" bfloat16 products against PyTorch's float32 steps: not like for like "
                                    "(bench/vit_bf16.py compares like with like)" if v['contender'] == FUSED_BF16 else ""))
    print(f"fused bar: step {v['step_vs_torch_eager']:.3f}x PyTorch eager (<= 0.7x): {met(v['step_bar_0.7x_met'])}")
    if "step_vs_torch_compile" in v:
        print(f"fused bar: step {v['step_vs_torch_compile']:.3f}x torch.compile (<= 1.0x): "
              f"{met(v['step_bar_1.0x_compile_met'])}")
    print(f"fused bar: peak RSS {v['rss_vs_torch_eager']:.3f}x PyTorch eager (<= 0.8x): {met(v['rss_bar_0.8x_met'])}")
    print(f"fused memory: measured RSS growth / memory_report() predicted growth = {v['prediction_ratio']:.3f} "
          f"(bar 0.95-1.05): {met(v['prediction_bar_met'])}")


def verdict(results: dict[str, dict], *, slope_bar: bool) -> dict:
    """The issue's bars for our eager route against PyTorch eager."""
    ours, theirs = results.get("tensorarena eager", {}), results.get(REFERENCE, {})
    if ours.get("unavailable") or theirs.get("unavailable") or not ours or not theirs:
        return {"available": False}
    v = {"step_time_ratio": ours["median_step_s"] / theirs["median_step_s"],
         "peak_rss_ratio": ours["peak_rss_bytes"] / theirs["peak_rss_bytes"]}
    v["step_time_bar_0.9x_met"] = v["step_time_ratio"] <= 0.9
    v["peak_rss_bar_met"] = v["peak_rss_ratio"] <= 1.0
    if slope_bar:
        v["rss_slope_bytes_per_step"] = ours["rss_slope_bytes_per_step"]
        v["rss_slope_bar_1MB_met"] = ours["rss_slope_bytes_per_step"] < MB
    return v


def print_verdict(v: dict) -> None:
    if not v.get("available", True):
        print("bars: not evaluated (tensorarena eager or pytorch eager was not run or unavailable)")
        return
    print(f"bar: step time {v['step_time_ratio']:.3f}x PyTorch eager (<= 0.9x): "
          f"{'met' if v['step_time_bar_0.9x_met'] else 'NOT met'}")
    print(f"bar: peak RSS {v['peak_rss_ratio']:.3f}x PyTorch eager (<= 1x): {'met' if v['peak_rss_bar_met'] else 'NOT met'}")
    if "rss_slope_bar_1MB_met" in v:
        print(f"bar: RSS slope {v['rss_slope_bytes_per_step'] / MB:.3f} MB/step (< 1 MB/step): "
              f"{'met' if v['rss_slope_bar_1MB_met'] else 'NOT met'}")


def machine_note() -> dict:
    """Cores and load, to read the numbers against: other processes share this machine."""
    return {"cpu": cpu_name(), "cpus": os.cpu_count(), "loadavg": os.getloadavg()}


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main({"tensorarena eager": run_ours, "tensorarena fused": run_fused,
                    FUSED_FLAT: run_fused_flat_grads, FUSED_BF16: run_fused_bf16, "pytorch eager": run_torch,
                    "torch.compile": run_compiled})
        sys.exit(0)
    from sgemm_peak import measure_sgemm_peak

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(CASES), help="run one case (default: both)")
    parser.add_argument("--steps", type=positive_int, help="timed steps per contender (default: tiny 20, base 40)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset to run")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--cold-kernels", action="store_true",
                        help="skip the short run that fills Numba's kernel cache first (module docstring)")
    args = parser.parse_args()
    names = [n for n in args.contenders.split(",") if n]
    peak = measure_sgemm_peak()
    print(f"float32 GEMM peak on this machine: {peak:.1f} GFLOP/s; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores of {cpu_name()}")
    summary = {"benchmark": "vit", "sgemm_peak_gflops": peak, "machine_before": machine_note(), "cases": {}}
    for key in [args.only] if args.only else list(CASES):
        case = CASES[key]
        steps = args.steps or case["steps"]
        flops = vit_train_flops(batch=case["batch"], dim=case["dim"], depth=case["depth"], heads=case["heads"],
                                mlp=case["mlp"])
        ours = [n for n in names if n.startswith("tensorarena")]
        if ours and not args.cold_kernels:
            warm = run_contenders(__file__, ours, {"BENCH_CASE": key, "BENCH_STEPS": "1"})
            print(f"{case['title']}: Numba's kernel cache filled first by one short run per tensorarena contender "
                  f"({sum(r['wall_s'] for r in warm.values()):.0f} s; --cold-kernels to measure without)")
            for name, r in warm.items():
                if r.get("unavailable"):
                    print(f"  the filling run of {name} failed: {r['error'].strip().splitlines()[-1][:120]}")
        results = run_contenders(__file__, names, {"BENCH_CASE": key, "BENCH_STEPS": str(steps)})
        peak = max(peak, measure_sgemm_peak())  # again after the children: the larger is the less disturbed
        summary["sgemm_peak_gflops"] = peak
        add_rates(results, flops, peak)
        title = (f"{case['title']} batch {case['batch']}, {IMAGE}x{IMAGE}, AdamW, {steps} timed steps "
                 f"({flops / 1e9:.1f} GFLOP/step)")
        print_table(title, results)
        v = verdict(results, slope_bar=key == "base")
        print_verdict(v)
        v["fused"] = fused_verdict(results)
        print_fused_verdict(v["fused"])
        for key_name, contender in (("fused_flat_grads", FUSED_FLAT), ("fused_bf16", FUSED_BF16)):
            if contender in results:
                v[key_name] = fused_verdict(results, contender)
                print_fused_verdict(v[key_name])
        for r in results.values():
            r.pop("step_times_s", None)
        summary["cases"][key] = {"title": title, "steps": steps, "flops_per_step": flops, "results": results,
                                 "verdict": v}
    summary["machine_after"] = machine_note()
    write_json(args.json, summary)
