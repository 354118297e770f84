"""Check a fused plan's memory prediction against the process's real RSS growth.

`python -m tensorarena.train.fused_memory_check --model vit-tiny --batch 8` builds the model
and optimizer, compiles the kernels, takes the RSS baseline, traces the fused step, reads
`memory_report()` (before any step), trains a few steps and prints one JSON line: the
prediction, the measured RSS growth over the baseline and their ratio. Run it in a fresh
process (tests and bench/fused.py do) so the baseline is this model's alone.

The parameters exist before the baseline; flattening moves them into the plan's flat buffer
and returns the old arrays to the operating system (compile/flat.py), so the comparison is
with `predicted_growth` = predicted_peak - params.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

VIT_SIZES = {"vit-tiny": "tiny", "vit-small": "small", "vit-base": "base"}


def measure(model_name: str, batch: int, image_size: int, steps: int, seed: int = 0,
            update_in_backward: bool | None = None, micro_batch: int | None = None,
            matmul_precision: str | None = None) -> dict:
    from ..compile.step import compile_step
    from ..kernels.warmup import compile_all
    from ..memory.meter import peak_rss_bytes, rss_bytes
    from ..memory.pool import resident_after_returning_freed
    from ..models.vit import ViT, ViTConfig
    from ..nn.functional import cross_entropy
    from ..optim import AdamW

    config = getattr(ViTConfig, VIT_SIZES[model_name])(image_size=image_size, num_classes=10)
    model = ViT(config, rng=np.random.default_rng(seed))
    optimizer = AdamW(model.parameters(), lr=1e-4)
    compile_all()  # JIT code and its LLVM memory are not the step's; keep them out of the growth
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch, 3, image_size, image_size)).astype(config.dtype)
    y = rng.integers(0, 10, batch)
    # Freed memory glibc still keeps (the model's construction, the kernels' compilation) is given back first:
    # left in the baseline, the step reused it and the growth read low (an MLP's 2.5 MiB OpenBLAS buffers hid).
    baseline = resident_after_returning_freed()
    start = time.perf_counter()
    fused = compile_step(model, cross_entropy, optimizer, (x, y), update_in_backward=update_in_backward,
                         micro_batch=micro_batch, matmul_precision=matmul_precision)
    trace_s = time.perf_counter() - start
    report = fused.memory_report()
    step_s = []
    for _ in range(steps):
        start = time.perf_counter()
        fused.step(x, y)
        step_s.append(time.perf_counter() - start)
    growth = rss_bytes() - baseline
    return {"model": model_name, "batch": batch, "image_size": image_size, "micro_batch": micro_batch,
            "matmul_precision": fused.matmul_precision,
            "update_in_backward": fused.update_in_backward,
            "report": report,
            "predicted_peak": report["predicted_peak"], "predicted_growth": report["predicted_growth"],
            "measured_growth": growth, "peak_growth": peak_rss_bytes() - baseline,
            "ratio": growth / report["predicted_growth"],
            "trace_s": trace_s, "step_s": step_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(VIT_SIZES), default="vit-tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=3)
    update = parser.add_mutually_exclusive_group()
    update.add_argument("--update-in-backward", dest="update_in_backward", action="store_true", default=None,
                        help="update each parameter inside backward, no gradient buffer (the default)")
    update.add_argument("--flat-grads", dest="update_in_backward", action="store_false",
                        help="flat gradient buffer, one update kernel after backward")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="rows per forward/backward pass; their gradients are summed before one update")
    parser.add_argument("--matmul-precision", choices=("float32", "bfloat16"), default=None,
                        help="of the float32 products (tensorarena.precision); default: the process's setting")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.model, args.batch, args.image_size, args.steps,
                             update_in_backward=args.update_in_backward, micro_batch=args.micro_batch,
                             matmul_precision=args.matmul_precision)))


if __name__ == "__main__":
    main()
