"""The float32 floor of a ViT training step on this machine: its matrix products alone, against PyTorch eager.

    python bench/vit_floor.py [--model tiny|base] [--rounds 8] [--per-round 3] [--bf16] [--json out.json]

Issue 4's bar is a fused step <= 0.7x PyTorch eager's. No step is faster than its matrix products,
so this times three things taking turns in one process (bench/common.interleave), plus the
linear-layer GEMMs on their own:
  - pytorch eager and tensorarena fused: whole training steps, as bench/vit_interleaved.py runs them;
  - products only: every matrix product of one of our fused steps, back to back, on the kernels
    and routes the step uses. The linear layers' GEMMs are recorded from a real step (shape,
    transposes, strides, accumulate) and replayed through kernels.gemm. Attention's products run
    as kernels.attention_heads runs them: per (batch, head) slice, q k^T and P v forward, then
    D^T g, g v^T, dS k and dS^T q backward, one MKL thread per slice, the cores sharing the slices,
    with the softmax left out. One set of operands serves every product of a shape (the 12 layers
    share them), so the products run from warmer caches than inside a step: a lower bound.
  - kernels only: every kernel call of one fused step (products, GELU, LayerNorm, softmax inside
    attention, AdamW, the adds), recorded once and replayed back to back on the same buffers, with
    none of the Python around them (the model's forward, autograd, the arena, the optimizer's
    bookkeeping): what a replay of a flat list of kernel calls would cost, at best, with these kernels.
The table also gives the step's matmul FLOPs (the recorded products; bench/vit.py's count of the
full model beside them, larger since our last block computes [CLS] alone) at this machine's best
large square sgemm rate, measured here (bench/sgemm_peak.py).

"paired x" is the median over rounds of each round's ratio (bench/common.paired_ratios), which a
load change between rounds does not skew.

After the timed rounds, the "kernels only" replay is split by kernel: each call timed on its own, the
seconds per step of each kernel (gemm, attention_forward/backward, bias_gelu_*, adam, layer_norm_*,
column_sum, add, ...) and its calls, biggest first. Then torch.profiler runs a few PyTorch steps and the last line gives the share of
its own step spent in its GEMMs (aten::mm, addmm, bmm and the patch embedding's convolution) and in
its fused attention kernels: what the same work costs PyTorch, beside what it costs us.

Reading it: products only / pytorch eager is the smallest ratio any float32 step built on these
GEMMs can reach. Where it is within a few points of the bar, the bar leaves almost nothing for the
rest of the step (GELU, LayerNorm, softmax, AdamW's pass over every parameter, Python).

--bf16 adds the bfloat16-matmul floor: the same linear GEMMs as tensorarena's
float32_matmul_precision("bfloat16") runs them (both operands rounded to bfloat16 on every call, a
parallel pass that is counted; MKL's cblas_gemm_bf16bf16f32 with float32 output and accumulation),
attention's products left in float32 (the bf16 mode now rounds those too: this floor rounds only the
linear layers' products); and, as the fair rival, PyTorch eager
with torch.backends.mkldnn.matmul.fp32_precision = "bf16" (its own knob for the same trade).
bench/vit_bf16.py times whole bf16 steps of ours against PyTorch's.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (bf16_note, cpu_name, interleave, interleaved_vit_parser, paired_ratios,  # noqa: E402
                    torch_products_in_bf16, write_json)

BAR = 0.7  # issue 4: fused step time <= 0.7x PyTorch eager


def _operand_like(array, rng):
    """A fresh array with `array`'s shape and strides (a transposed or strided view stays one)."""
    import numpy as np

    extent = sum((n - 1) * s for n, s in zip(array.shape, array.strides)) + array.itemsize
    base = rng.standard_normal(extent // array.itemsize + 1).astype(array.dtype)
    return np.lib.stride_tricks.as_strided(base, array.shape, array.strides)


class _SameBytes:
    """An array of a recorded call, kept as its root array and where it lies in it, not as the view itself.

    The Python replay refuses a step that still holds one of the plan's views when the plan hands its
    bytes to another buffer (compile/step_plan.previous_occupants); a recording that kept the views would
    trip it. Holding the root (the slab) does not, and `again()` makes a view of the very same bytes."""

    def __init__(self, array):
        import numpy as np

        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        self.root, self.shape, self.strides, self.dtype = root, array.shape, array.strides, array.dtype
        self.offset = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]

    def again(self):
        import numpy as np

        return np.ndarray(self.shape, self.dtype, buffer=self.root, offset=self.offset, strides=self.strides)


def _unheld(value):
    """`value` with each view in it (inside tuples and lists too) kept as _SameBytes; an array that is its
    own root (a persistent buffer) is held as itself: the liveness check watches only the slab's views."""
    import numpy as np

    if isinstance(value, (tuple, list)):
        return type(value)(map(_unheld, value))
    if isinstance(value, np.ndarray) and isinstance(value.base, np.ndarray):
        return _SameBytes(value)
    return value


def _held(value):
    """`value` with its _SameBytes made arrays again (views of the same bytes)."""
    if isinstance(value, (tuple, list)):
        return type(value)(map(_held, value))
    return value.again() if isinstance(value, _SameBytes) else value


def record_calls(trainer, xs, ys, names=None) -> list:
    """Run one step of `trainer` with kernels watched (`names`, or every registered kernel); returns
    what they were asked, in call order: (name, the function handed out, args, kwargs), each view among
    the arguments kept as _SameBytes (`_held` makes them arrays again)."""
    from tensorarena import kernels

    kernels._load()
    names = sorted(kernels._registry) if names is None else names
    seen = []
    originals = {name: dict(kernels._registry[name]) for name in names}

    def watch(name, fn):
        def watched(*args, **kwargs):
            seen.append((name, fn, tuple(map(_unheld, args)), {k: _unheld(v) for k, v in kwargs.items()}))
            return fn(*args, **kwargs)
        return watched

    for name, impls in originals.items():
        for impl, fn in impls.items():
            kernels.register(name, impl, watch(name, fn))
    try:
        # The watchers are a change of kernel dispatch, under which a fused trainer traces a plan of its
        # own (kernels.dispatch_key): that first step is the trace, the one recorded is a replay of it.
        trainer.step(xs, ys)
        seen.clear()
        trainer.step(xs, ys)
    finally:
        for name, impls in originals.items():
            for impl, fn in impls.items():
                kernels.register(name, impl, fn)
    return seen


def record_products(trainer, xs, ys) -> dict:
    """Run one step of `trainer` with the gemm and attention kernels watched; returns what they were asked."""
    seen = {"gemm": [], "attention_forward": [], "attention_backward": []}
    for name, _, args, kwargs in record_calls(trainer, xs, ys, list(seen)):
        seen[name].append((tuple(map(_held, args)), {k: _held(v) for k, v in kwargs.items()}))
    return seen


def kernels_replay(calls):
    """Every kernel call of a recorded step again, back to back, on the same buffers and arguments: the
    step without the Python that decides them (the model's forward, autograd, the arena, the optimizer's
    bookkeeping). Not a training step: the Adam step count and learning rate stay those recorded, and
    the plain-NumPy work between kernels (gradient zero-fills, copies into concatenations and
    contiguous buffers) is left out, so the trainer it came from must not be used
    afterwards (its values stay finite: checked over 40 replays). A lower bound for any replay of
    these kernels."""
    named = [(name, fn, tuple(map(_held, args)), {k: _held(v) for k, v in kwargs.items()})
             for name, fn, args, kwargs in calls]
    calls = [call[1:] for call in named]

    def replay():
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
    replay.named_calls = named  # for kernel_breakdown
    return replay


def kernel_breakdown(named_calls, replays: int = 7) -> dict[str, tuple[int, float]]:
    """kernel name -> (its calls in one step, the median over `replays` replays of the seconds they take in one
    step), each call timed on its own: where the step's kernel time goes (the table's "kernels only" row, split)."""
    import time

    seconds: dict[str, list[float]] = {}
    for _ in range(replays):
        step: dict[str, float] = {}
        for name, fn, args, kwargs in named_calls:
            start = time.perf_counter()
            fn(*args, **kwargs)
            step[name] = step.get(name, 0.0) + time.perf_counter() - start
        for name, spent in step.items():
            seconds.setdefault(name, []).append(spent)
    counts: dict[str, int] = {}
    for name, *_ in named_calls:
        counts[name] = counts.get(name, 0) + 1
    return {name: (counts[name], statistics.median(spent))
            for name, spent in sorted(seconds.items(), key=lambda item: -statistics.median(item[1]))}


def linear_replay(calls, rng):
    """(replay function, FLOPs): the recorded GEMMs again, on fresh operands of the same layouts."""
    from tensorarena.kernels import kernel

    gemm = kernel("gemm")
    operands, plan, flops = {}, [], 0
    for args, kwargs in calls:
        a, b, out = args[:3]
        accumulate = bool(args[3]) if len(args) > 3 else bool(kwargs.get("accumulate", False))
        key = tuple((x.shape, x.strides, x.dtype.str) for x in (a, b, out))
        if key not in operands:
            operands[key] = tuple(_operand_like(x, rng) for x in (a, b, out))
        plan.append((*operands[key], accumulate))
        flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]

    def replay():
        for a, b, out, accumulate in plan:
            gemm(a, b, out, accumulate)
    return replay, flops


def attention_replay(forward_calls, backward_calls, rng):
    """(replay function, FLOPs): attention's per-slice products, as kernels.attention_heads runs them."""
    import numpy as np

    from tensorarena.kernels import gemm_jobs, gemm_library
    from tensorarena.kernels.gemm import _product_job

    def slice_jobs(q, k, v, backward):
        nb, nh, t, hs = q.shape
        s, hv = k.shape[2], v.shape[3]
        jobs, keep, flops = [], [], 0
        for _ in range(nb * nh):  # one set of operands per slice, as in a step (each slice its own data)
            qs, ks, vs = (rng.standard_normal(shape).astype(q.dtype) for shape in ((t, hs), (s, hs), (s, hv)))
            p, g = rng.random((t, s)).astype(q.dtype), rng.standard_normal((t, hv)).astype(q.dtype)
            if not backward:  # scores = q k^T, out = P v
                products = [(qs, ks.T, p), (p, vs, np.empty((t, hv), q.dtype))]
            else:  # dv = P^T g, dP = g v^T, dq = dS k, dk = dS^T q
                ds = np.empty((t, s), q.dtype)
                products = [(p.T, g, np.empty((s, hv), q.dtype)), (g, vs.T, ds), (ds, ks, np.empty((t, hs), q.dtype)),
                            (ds.T, qs, np.empty((s, hs), q.dtype))]
            for a, b, out in products:
                job, held = _product_job(a, b, out, False)
                jobs.append(job)
                keep += [a, b, out, *held]
                flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return np.array(jobs, np.int64), keep, flops

    runs, keep, flops = [], [], 0
    for calls, backward in ((forward_calls, False), (backward_calls, True)):
        cache = {}
        for args, _ in calls:
            q, k, v = args[:3]
            key = (q.shape, k.shape, v.shape, q.dtype.str)
            if key not in cache:
                cache[key] = slice_jobs(q, k, v, backward)
            jobs, held, f = cache[key]
            keep += held
            runs.append((jobs, q.dtype == np.float32))
            flops += f

    lib = gemm_library.current()  # the library attention's slices call in the steps (kernels.gemm_library)

    def replay(_keep=keep):  # _keep: the operands the job rows point at stay alive
        for jobs, f32 in runs:
            gemm_jobs.run_table(jobs, f32, lib)
    return replay, flops


def bf16_linear_replay(calls, rng):
    """The recorded linear GEMMs as the bfloat16 precision runs them (ops._products): both operands
    rounded on every call (kernels.gemm_bf16's rounding kernel), then MKL's bf16 GEMM on its own threads."""
    import numpy as np

    from tensorarena.kernels.gemm_bf16 import BF16, gemm_bf16_mkl, to_bfloat16_fused

    def stored(x):
        """(the array to round, whether the rounded copy is read transposed): a transposed view of a
        row-major array is rounded in its own memory order, as ops._products.rounded does."""
        return (x.T, True) if x.ndim == 2 and x.shape[0] > 1 and x.strides[0] == x.itemsize else (x, False)

    operands, plan = {}, []
    for args, kwargs in calls:
        a, b, out = args[:3]
        accumulate = bool(args[3]) if len(args) > 3 else bool(kwargs.get("accumulate", False))
        key = tuple((x.shape, x.strides) for x in (a, b, out))
        if key not in operands:
            pairs = []
            for x in (_operand_like(a, rng), _operand_like(b, rng)):
                src, transposed = stored(x)
                bits = np.empty(src.shape, BF16)
                pairs.append((src, bits, bits.T if transposed else bits))
            operands[key] = (pairs, np.empty(out.shape, np.float32))
        plan.append((accumulate, *operands[key]))

    def replay():
        for accumulate, pairs, c in plan:
            for src, bits, _ in pairs:
                to_bfloat16_fused(src, bits)
            gemm_bf16_mkl(pairs[0][2], pairs[1][2], c, accumulate)
    return replay


# PyTorch's own ops for the same work, by torch.profiler's names: its linear layers' and patch
# embedding's GEMMs, and its fused attention kernels (products and softmax together, forward and backward).
TORCH_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
                  "aten::convolution_backward")
TORCH_ATTENTION_MARK = "scaled_dot_product"


def torch_profile_shares(step, steps: int = 5) -> dict:
    """Shares of PyTorch's step (self CPU time under torch.profiler, `steps` steps) spent in its GEMMs and in
    its attention kernels. Shares, not times: the profiler slows every op a little."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(self_us.values())
    gemm = sum(t for name, t in self_us.items() if name in TORCH_GEMM_OPS)
    attention = sum(t for name, t in self_us.items() if TORCH_ATTENTION_MARK in name)
    return {"gemm_share": gemm / total, "attention_share": attention / total, "profiled_steps": steps}


def build(case_name: str, seed: int = 0, bf16: bool = False) -> tuple[dict, dict]:
    """(name -> zero-argument step function, facts about the recorded products)."""
    os.environ["BENCH_CASE"] = case_name
    import torch  # first, as in bench/vit_interleaved.py

    import vit  # bench/vit.py: the shared models and data
    import numpy as np
    from vit_interleaved import our_trainer, torch_step as torch_step_for

    torch.set_num_threads(2)
    torch.manual_seed(0)
    xs, ys = vit._data()
    torch_step = torch_step_for(vit, xs, ys, compiled=False)
    # The Python replay: it asks kernels.kernel for every call, which record_calls watches (a captured
    # replay calls the functions it recorded instead).
    watched = our_trainer(vit, case_name, "fused", seed=seed, fused_replay="python")
    watched.step(xs, ys)  # traced here; the recorded step below is a replay
    seen = record_products(watched, xs, ys)
    trainer = our_trainer(vit, case_name, "fused", seed=seed)  # the default: the captured replay
    rng = np.random.default_rng(seed)
    linear, linear_flops = linear_replay(seen["gemm"], rng)
    attention, attention_flops = attention_replay(seen["attention_forward"], seen["attention_backward"], rng)

    def products():
        linear()
        attention()

    case = vit._case()
    facts = {"linear_gemms": len(seen["gemm"]), "attention_calls": len(seen["attention_forward"]) + len(
        seen["attention_backward"]), "product_flops": linear_flops + attention_flops,
        "bench_vit_flops": vit.vit_train_flops(batch=case["batch"], dim=case["dim"], depth=case["depth"],
                                               heads=case["heads"], mlp=case["mlp"])}
    # A second trainer, whose buffers the kernels-only replay may scribble on (see kernels_replay).
    taped = our_trainer(vit, case_name, "fused", seed=seed, fused_replay="python")
    taped.step(xs, ys)
    tape = record_calls(taped, xs, ys)
    facts["kernel_calls"] = len(tape)
    steps = {"pytorch eager": torch_step, "tensorarena fused": lambda: trainer.step(xs, ys).loss,
             "kernels only": kernels_replay(tape), "products only": products, "linear GEMMs only": linear}
    if bf16:
        linear_bf16 = bf16_linear_replay(seen["gemm"], rng)
        matmul = torch.backends.mkldnn.matmul

        def torch_step_bf16():
            matmul.fp32_precision = "bf16"
            try:
                return torch_step()
            finally:
                matmul.fp32_precision = "ieee"

        def products_bf16():
            linear_bf16()
            attention()

        trainer_bf16 = our_trainer(vit, case_name, "fused", seed=seed, matmul_precision="bfloat16")
        steps.update({"pytorch eager, bf16 matmul": torch_step_bf16, "products, bf16 linear": products_bf16,
                      "fused, bf16 matmuls": lambda: trainer_bf16.step(xs, ys).loss})
    return steps, facts


@contextlib.contextmanager
def _mkldnn_bf16(torch):
    """PyTorch's oneDNN bf16 knob for float32 matmuls, as torch_step_bf16 sets it."""
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = "ieee"


def main() -> None:
    parser = interleaved_vit_parser(__doc__)
    parser.add_argument("--bf16", action="store_true", help="add the bfloat16-matmul floor and step (module docstring)")
    args = parser.parse_args()

    from sgemm_peak import measure_sgemm_peak

    steps, facts = build(args.model, bf16=args.bf16)
    times = interleave(steps, args.rounds, args.per_round)
    shares = torch_profile_shares(steps["pytorch eager"])
    peak = measure_sgemm_peak()  # GFLOP/s, after the steps: same process, same threads
    medians = {name: statistics.median(t) for name, t in times.items()}
    ref = medians["pytorch eager"]
    at_peak_s = facts["product_flops"] / (peak * 1e9)
    precision = "float32 and bfloat16 products" if args.bf16 else "float32"
    print(f"ViT-{args.model} ({'batch 8' if args.model == 'tiny' else 'batch 1'}), {precision}, {args.rounds} rounds x "
          f"{args.per_round} per contender, interleaved in one process; CPU: {cpu_name()}")
    print(f"products per step: {facts['linear_gemms']} linear GEMMs + {facts['attention_calls']} attention calls' "
          f"slices, {facts['product_flops'] / 1e9:.1f} GFLOP (bench/vit.py's count: "
          f"{facts['bench_vit_flops'] / 1e9:.1f})")
    paired = paired_ratios(times, "pytorch eager", args.per_round)
    print(f"{'contender':<28}{'median ms':>11}{'min ms':>10}{'x pytorch eager':>17}{'paired x':>10}{'GFLOP/s':>10}")
    for name, t in times.items():
        flops = facts["product_flops"] if not name.startswith("linear") else None
        rate = f"{flops / medians[name] / 1e9:>10.0f}" if flops else f"{'':>10}"
        print(f"{name:<28}{medians[name] * 1e3:>11.1f}{min(t) * 1e3:>10.1f}{medians[name] / ref:>17.3f}"
              f"{paired[name]:>10.3f}{rate}")
    print(f"{'all FLOPs at sgemm peak':<28}{at_peak_s * 1e3:>11.1f}{'':>10}{at_peak_s / ref:>17.3f}{peak:>10.0f}")
    floor = medians["products only"] / ref
    left = BAR - floor
    print(f"bar {BAR}x PyTorch eager = {BAR * ref * 1e3:.1f} ms. Products alone: {floor:.3f}x, leaving "
          f"{left * ref * 1e3:.1f} ms ({left:+.3f}x) for everything else in the step; ours takes "
          f"{(medians['tensorarena fused'] - medians['products only']) * 1e3:.1f} ms of it now.")
    print(f"PyTorch's own step (torch.profiler, self CPU time): {shares['gemm_share']:.3f} in its GEMMs and "
          f"{shares['attention_share']:.3f} in its attention kernels, {shares['gemm_share'] + shares['attention_share']:.3f}"
          f" together (ours, from the table: linear GEMMs {medians['linear GEMMs only'] / ref:.3f}x, all products "
          f"{floor:.3f}x its step).")
    kernels_only = medians["kernels only"] / ref
    print(f"Our kernels alone, with no Python between them: {kernels_only:.3f}x PyTorch eager "
          f"({facts['kernel_calls']} calls; the fused step spends "
          f"{(medians['tensorarena fused'] - medians['kernels only']) * 1e3:.1f} ms more); of that, the "
          f"kernels other than products take {(medians['kernels only'] - medians['products only']) * 1e3:.1f} ms.")
    breakdown = kernel_breakdown(steps["kernels only"].named_calls)
    print("Our kernels one by one, per step (each call timed on its own, median of 7 replays): " + "; ".join(
        f"{name} {calls}x {spent * 1e3:.1f} ms" for name, (calls, spent) in breakdown.items()))
    torch_bf16 = None
    if args.bf16:
        import torch

        torch_bf16 = torch_products_in_bf16(lambda: _mkldnn_bf16(torch))
        print(bf16_note("pytorch eager, bf16 matmul", torch_bf16))
        ref16 = medians["pytorch eager, bf16 matmul"]
        print(f"bf16 floor (matmul_precision='bfloat16'): products with bf16 linear GEMMs "
              f"{medians['products, bf16 linear'] / ref:.3f}x PyTorch eager, "
              f"{medians['products, bf16 linear'] / ref16:.3f}x PyTorch eager with its bf16 matmul knob")
    write_json(args.json, {"model": args.model, "cpu": cpu_name(), "rounds": args.rounds, "per_round": args.per_round,
                           "median_step_s": medians, "step_times_s": times, "sgemm_peak_gflops": peak,
                           "torch_mkldnn_products_bf16": torch_bf16,
                           "x_pytorch_eager": {n: m / ref for n, m in medians.items()},
                           "paired_x_pytorch_eager": paired, "at_peak_x_pytorch_eager": at_peak_s / ref, "bar": BAR, "floor_x_pytorch_eager": floor,
                           "kernels_only_x_pytorch_eager": kernels_only,
                           "kernel_breakdown_s": {name: spent for name, (_, spent) in breakdown.items()},
                           "pytorch_profile": shares, **facts})


if __name__ == "__main__":
    main()
