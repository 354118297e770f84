"""The common end of every `tensorarena train` job: speed and memory lines, then --json."""

from __future__ import annotations

import json

from ..memory.meter import format_bytes


def finish(summary: dict, *, json_path: str | None, saved_line: str | None = None, rate_digits: int = 1) -> dict:
    """Print steps/s, peak RSS, arena high-water and the GEMM library (plus `saved_line`), write JSON if asked."""
    from ..kernels.gemm import backend

    summary.setdefault("gemm_backend", backend())
    if summary.get("steps_per_second"):
        print(f"  steps/s           {summary['steps_per_second']:.{rate_digits}f}")
    print(f"  peak RSS          {format_bytes(summary['peak_rss_bytes'])}")
    print(f"  arena high-water  {format_bytes(summary['arena_high_water_bytes'])} per step")
    print(f"  GEMMs             {summary['gemm_backend']}")
    if summary.get("matmul_precision") == "bfloat16":
        from ..kernels import calls

        ran, skipped = calls[("gemm_bf16", "fused")], calls[("gemm_bf16", "skipped: float32 instead")]
        summary["bf16_products"] = {"ran": ran, "stayed_float32": skipped}
        print(f"  products          bfloat16 operands, float32 sums ({ran} bf16 GEMMs"
              + (f"; {skipped} stayed float32, see the warning" if skipped else "") + ")")
    if saved_line:
        print(saved_line)
    if json_path:
        text = json.dumps(summary, indent=2)
        if json_path == "-":
            print(text)
        else:
            with open(json_path, "w") as f:
                f.write(text + "\n")
    return summary
