"""bfloat16 products against PyTorch's, ViT steps interleaved in one process.

    python bench/vit_bf16.py [--model tiny|base] [--rounds 8] [--per-round 3] [--json out.json]

tensorarena's float32_matmul_precision("bfloat16") (tensorarena/precision.py) rounds the operands of
float32 products to bfloat16 and accumulates in float32. PyTorch's like-for-like setting is
torch.set_float32_matmul_precision("medium"), meant to send float32 matmuls through oneDNN in
bfloat16 the same way (whether it did on this machine is checked on one product and printed: on the Zen 4 these
benches were written on, torch 2.13's CPU build left them float32, common.torch_products_in_bf16); its usual
mixed-precision recipe is torch.autocast("cpu", torch.bfloat16),
which also casts activations and keeps bf16 outputs. All three are timed next to both libraries'
float32 steps, the contenders taking turns as in bench/vit_interleaved.py (same models, data and
AdamW; torch's precision is set around its own step only and restored after it). One more of ours,
"bf16, f32 attention", rounds the linear layers' products but leaves attention's in float32: the gap
between it and "bf16 matmuls" is what attention's bfloat16 products buy.

The table gives every contender against PyTorch eager in float32 and against PyTorch eager with
bf16 matmuls, each as the ratio of whole-run medians / the median over rounds of each round's ratio.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (bf16_note, interleave, interleaved_vit_parser, paired_ratios, torch_products_in_bf16,  # noqa: E402
                    write_json)
from vit_interleaved import our_trainer, torch_step  # noqa: E402

TORCH_BF16 = "pytorch eager, bf16 matmuls"
F32_ATTENTION = "tensorarena fused, bf16, f32 attention"


@contextlib.contextmanager
def torch_precision(name: str):
    """torch.set_float32_matmul_precision(name) inside, the process's setting restored after."""
    import torch

    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(name)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def with_torch_precision(step, name: str):
    """`step` run under torch.set_float32_matmul_precision(name), the process's setting restored after."""
    def run():
        with torch_precision(name):
            return step()

    return run


def with_float32_attention(step):
    """`step` with attention's products left in float32 (ops.attention asks ops._products.bf16_attention
    whether to round; here it is told no), to measure what rounding them buys. Every step of that
    trainer runs under it, its trace included, so its plan is consistent."""
    import tensorarena.ops.attention as attention_ops
    from tensorarena.kernels import calls

    decide = attention_ops.bf16_attention

    def run():
        attention_ops.bf16_attention = lambda dtype: False
        before = calls[("attention_bf16", "fused")]
        try:
            return step()
        finally:
            attention_ops.bf16_attention = decide
            assert calls[("attention_bf16", "fused")] == before, "float32 attention ran bfloat16 products"

    return run


def build(case_name: str) -> dict:
    os.environ["BENCH_CASE"] = case_name
    import torch  # first: see bench/vit_interleaved.py's docstring

    import vit

    torch.set_num_threads(2)
    torch.manual_seed(0)
    xs, ys = vit._data()
    steps = {"pytorch eager": torch_step(vit, xs, ys, compiled=False),
             TORCH_BF16: with_torch_precision(torch_step(vit, xs, ys, compiled=False), "medium"),
             "pytorch autocast bf16": torch_step(vit, xs, ys, compiled=False, autocast_bf16=True)}
    for name, precision in (("tensorarena fused", "float32"), ("tensorarena fused, bf16 matmuls", "bfloat16"),
                            (F32_ATTENTION, "bfloat16")):
        trainer = our_trainer(vit, case_name, "fused", matmul_precision=precision)
        steps[name] = lambda trainer=trainer: trainer.step(xs, ys).loss
    steps[F32_ATTENTION] = with_float32_attention(steps[F32_ATTENTION])
    return steps


def main() -> None:
    args = interleaved_vit_parser(__doc__).parse_args()
    # build() imports torch before tensorarena. The other order hands torch's OpenMP runtime the wait
    # policy tensorarena sets for its own pool, and PyTorch's float32 step took 5 s instead of 0.5 s.
    steps = build(args.model)
    from tensorarena.kernels import calls, gemm_bf16

    if not gemm_bf16.available():
        raise SystemExit(f"no fast bfloat16 GEMM here ({gemm_bf16.why_not()}): nothing to compare")
    before = calls[("gemm_bf16", "fused")], calls[("attention_bf16", "fused")]
    times = interleave(steps, args.rounds, args.per_round)
    assert calls[("gemm_bf16", "fused")] > before[0], "the bfloat16 contenders ran no bfloat16 GEMM"
    assert calls[("attention_bf16", "fused")] > before[1], "no contender ran attention's products in bfloat16"
    medians = {name: statistics.median(t) for name, t in times.items()}
    refs = ("pytorch eager", TORCH_BF16)
    paired = {ref: paired_ratios(times, ref, args.per_round) for ref in refs}
    print(f"ViT-{args.model} ({'batch 8' if args.model == 'tiny' else 'batch 1'}), {args.rounds} rounds x "
          f"{args.per_round} steps per contender, interleaved in one process")
    print("x columns: ratio of whole-run medians / median over rounds of each round's ratio (common.paired_ratios)")
    print(f"{'contender':<40}{'median ms':>11}{'min ms':>10}{'x pytorch eager':>19}{'x pytorch bf16 mm':>19}")
    for name, t in times.items():
        cells = "".join(f"{f'{medians[name] / medians[ref]:.3f} / {paired[ref][name]:.3f}':>19}" for ref in refs)
        print(f"{name:<40}{medians[name] * 1e3:>11.1f}{min(t) * 1e3:>10.1f}{cells}")
    torch_bf16 = torch_products_in_bf16(lambda: torch_precision("medium"))
    print(bf16_note(TORCH_BF16, torch_bf16))
    gain = paired_ratios(times, F32_ATTENTION, args.per_round)["tensorarena fused, bf16 matmuls"]
    print(f"attention's products in bfloat16: the bf16 step at {medians['tensorarena fused, bf16 matmuls'] / medians[F32_ATTENTION]:.3f}"
          f" / {gain:.3f} of the one with float32 attention")
    write_json(args.json, {"model": args.model, "rounds": args.rounds, "per_round": args.per_round,
                           "torch_medium_products_bf16": torch_bf16, "median_step_s": medians, "step_times_s": times,
                           "x_pytorch_eager": {n: m / medians[refs[0]] for n, m in medians.items()},
                           "x_pytorch_bf16_matmuls": {n: m / medians[refs[1]] for n, m in medians.items()},
                           "paired_x_pytorch_eager": paired[refs[0]], "paired_x_pytorch_bf16_matmuls": paired[refs[1]]})


if __name__ == "__main__":
    main()
