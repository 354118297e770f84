"""The common parts of every `tensorarena train` job: the route table before step 1, the route and fused-step
entries of the summary, speed and memory lines, then --json."""

from __future__ import annotations

import json
import math
import sys
import time

from ..memory.meter import format_bytes


def step_rate(step_seconds: list[float], elapsed: float) -> dict:
    """Training throughput without step 1's one-time work, and step 1's own time.

    Step 1 may trace the fused plan and compile the kernels (or load them from Numba's cache), as may a
    route planning before it (timed apart by the caller): seconds on a first run after an install.
    Averaged in, they made the demo MLP report 75 steps/s for 442 of training. `elapsed` is the
    loop's wall time (loader and progress bar included); steps/s is over steps 2..n of it, or over
    all of them when there is one.
    """
    n = len(step_seconds)
    if n == 0 or elapsed <= 0:
        return {"steps_per_second": None, "first_step_seconds": None, "steps_per_second_after_first": False}
    first = step_seconds[0]
    rest = elapsed - first
    after_first = n > 1 and rest > 0
    return {"steps_per_second": (n - 1) / rest if after_first else n / elapsed, "first_step_seconds": first,
            "steps_per_second_after_first": after_first}


def fused_update(trainer) -> str | None:
    """Where the fused step applied the optimizer update (None if no fused step ran), in words."""
    if trainer.fused is None or not trainer.fused.replays:
        return None
    if trainer.fused.update_in_backward:
        return "inside backward, each parameter as its gradient completes (no gradient buffer)"
    why = "clip_grad_norm reads every gradient first" if trainer.clip_grad_norm is not None else "asked for"
    return f"after backward, one kernel per group over flat gradients ({why})"


def fused_replay(trainer) -> str | None:
    """Which replay the fused step's latest plan runs, and why, in words (None if no fused step ran)."""
    fused = trainer.fused
    if fused is None or not fused.replays:
        return None
    capture = fused.plan.capture
    if fused.replay == "python":
        return f"python: the model's ops re-run each step ({fused.replay_reason})"
    if capture is None or capture.tape is None:
        return f"python: {capture.note.removeprefix('python: ') if capture else 'not captured yet'}"
    return (f"captured: each step replays {len(capture.tape.entries)} recorded calls, checked against the Python "
            f"replay on two batches ({fused.replay_reason})")


def plan_before_step_1(trainer, inputs, targets) -> float | None:
    """With route="auto": print the route table (each route's estimate, the choice and why) before step 1,
    as every train job does; returns the seconds it took (it traces the step), None on a chosen route."""
    if trainer.route != "auto":
        return None
    from .micro_batch_choice import fit_for_route_auto

    started = time.perf_counter()  # traces the step: the kernels compile (or load from cache) here
    plan = trainer.plan(inputs, targets)
    if plan.chosen is None:  # --micro-batch auto cuts the batch here, so the table shown is the one step 1 takes
        whole = plan.format()
        cut, _ = fit_for_route_auto(trainer, inputs, targets)
        if cut is not None:
            print(f"{whole}\nmicro-batch auto: the whole batch does not fit; in micro-batches of "
                  f"{trainer.micro_batch} rows:", file=sys.stderr)
            plan = cut
    print(plan.format(), file=sys.stderr)
    return time.perf_counter() - started


def route_summary(trainer, planning: float | None) -> dict:
    """The summary entries every train job reports about its route: budget, plan, switches, fused step."""
    return {"memory_budget_bytes": trainer.budget.nbytes, "memory_budget_source": trainer.budget.source,
            "route_plan": trainer.route_plan.format() if trainer.route_plan else None,
            # The plan's figures as `tensorarena plan --json` gives them, so the two can be compared by number.
            "route_plan_estimates": ({r: vars(e) for r, e in trainer.route_plan.estimates.items()}
                                     if trainer.route_plan else None),
            "route_plan_process_other_bytes": trainer.route_plan.process_other_bytes if trainer.route_plan else None,
            # The plan had the MLPs recompute GELU in backward to fit fused (route_plan.RoutePlan.recompute_mlp).
            "route_plan_recompute_mlp": bool(trainer.route_plan and trainer.route_plan.recompute_mlp),
            "route_switches": trainer.route_switches, "route_planning_seconds": planning,
            "fused_update": fused_update(trainer), "fused_replay": fused_replay(trainer)}


def print_fused_lines(summary: dict) -> None:
    """The fused update and replay lines of a job's report, where a fused step ran."""
    for key, label in (("fused_update", "fused update"), ("fused_replay", "fused replay")):
        if summary.get(key):
            print(f"  {label:<17} {summary[key]}")


def finish(summary: dict, *, json_path: str | None, saved_line: str | None = None, rate_digits: int = 1) -> dict:
    """Print steps/s, peak RSS, arena high-water and the GEMM library (plus `saved_line`), write JSON if asked."""
    from ..kernels.gemm import backend

    summary.setdefault("gemm_backend", backend())
    if summary.get("steps_per_second"):
        after = (f" (after step 1, which took {summary['first_step_seconds']:.2f} s with its one-time work)"
                 if summary.get("steps_per_second_after_first") else "")
        print(f"  steps/s           {summary['steps_per_second']:.{rate_digits}f}{after}")
    if summary.get("route_planning_seconds") is not None:
        print(f"  route planning    {summary['route_planning_seconds']:.2f} s before step 1 (it traces the step, "
              f"compiling the kernels or loading them from Numba's cache)")
    print(f"  peak RSS          {format_bytes(summary['peak_rss_bytes'])}")
    print(f"  arena high-water  {format_bytes(summary['arena_high_water_bytes'])} per step")
    print(f"  GEMMs             {summary['gemm_backend']}")
    if summary.get("matmul_precision") == "bfloat16":
        counts = summary["bf16_products"]
        ran, skipped = counts["ran"], counts["stayed_float32"] + counts.get("attention_stayed_float32", 0)
        print(f"  products          bfloat16 operands, float32 sums ({ran} bf16 GEMMs, "
              f"{counts.get('attention', 0)} attention kernel calls"
              + (f"; {skipped} stayed float32, see the warning" if skipped else "") + ")")
    if saved_line:
        print(saved_line)
    if json_path and json_path != "-":  # "-": cli.cmd_train prints it, after the report went to stderr
        with open(json_path, "w") as f:
            f.write(summary_json(summary) + "\n")
    return summary


def summary_json(summary: dict) -> str:
    """The summary as strict JSON: a non-finite number (a loss skipped with --on-nonfinite skip) is null.
    json.dumps writes NaN / Infinity by default, which no JSON parser but Python's reads (jq, JavaScript)."""
    return json.dumps(_finite_or_null(summary), indent=2, allow_nan=False)


def _finite_or_null(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def bf16_products_since(before: dict | None = None) -> dict:
    """How many float32 products ran as bf16 GEMMs and how many stayed float32 (no fast bf16 GEMM here),
    and the same for attention's kernel calls (each a layer's products, forward or backward), counted
    since `before` (an earlier result of this function; None: since the process started)."""
    from ..kernels import calls

    now = {"ran": calls[("gemm_bf16", "fused")] + calls[("gemm_bf16", "reference")],
           "stayed_float32": calls[("gemm_bf16", "skipped: float32 instead")],
           "attention": calls[("attention_bf16", "fused")] + calls[("attention_bf16", "reference")],
           "attention_stayed_float32": calls[("attention_bf16", "skipped: float32 instead")]}
    return {key: value - (before or {}).get(key, 0) for key, value in now.items()}


def print_skipped(summary: dict) -> None:
    """The steps --on-nonfinite skip skipped, said where the losses are (the run said "trained ... for 4 steps" and
    a loss of nan, with three of the four steps updating nothing and no word of it)."""
    if summary.get("skipped_steps"):
        print(f"  skipped steps     {summary['skipped_steps']} of {summary['steps_this_run']} had a non-finite loss "
              f"and updated nothing (--on-nonfinite skip)")
