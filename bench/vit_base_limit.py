"""ViT-Base, batch 1, 224 x 224, trained by the CLI inside a real 1 GiB memory cgroup.

    python bench/vit_base_limit.py [--case base|tiny] [--steps N] [--limit 1G] [--json out.json]

The run is `python -m tensorarena train --model vit-base --image-size 224 --batch-size 1
--steps N --memory-limit 1G --route auto --store-dir <tmp> --no-progress --json <file>
--test-size T` inside a fresh memory cgroup with a hard limit of --limit (and no swap), made by
tests/cgroup_harness.run_limited. ViT-Base's parameters, gradients and AdamW moments alone are
~1.3 GiB, so the fused route cannot fit and route=auto should choose streaming; the point is
that training then runs to the end inside the limit instead of being OOM-killed.

--test-size (default 8) only caps the held-out evaluation after training, which otherwise
runs ~100 224px images through the streamed model at batch 1 and dominates the run time.
--case tiny is the quick smoke version (ViT-Small, 32px, batch 8, 400 MiB: also streams).

Reported: whether the kernel killed it, exit code, the route chosen (and the route plan), the
cgroup's peak (cgroup v1 max_usage_in_bytes / v2 memory.peak: RSS plus the page cache charged
to the cgroup, which includes the store's file pages, so it may sit at the limit without harm),
the process's own peak RSS (VmHWM), loss first/last, step rate, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.cgroup_harness import CgroupUnavailable, run_limited  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import positive_int  # noqa: E402
from tensorarena.memory.budget import parse_size  # noqa: E402

MiB = 2**20
CASES = {
    "base": {"model": "vit-base", "image_size": 224, "batch_size": 1, "limit": "1G", "steps": 4},
    "tiny": {"model": "vit-small", "image_size": 32, "batch_size": 8, "limit": "400M", "steps": 4},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), default="base")
    parser.add_argument("--model", default=None, help="override the case's model (vit-tiny|vit-small|vit-base)")
    parser.add_argument("--image-size", type=positive_int, default=None)
    parser.add_argument("--batch-size", type=positive_int, default=None)
    parser.add_argument("--steps", type=positive_int, default=None, help="training steps (default 4)")
    parser.add_argument("--limit", default=None, help="cgroup hard limit and --memory-limit (default: 1G for base)")
    parser.add_argument("--route", default="auto", choices=["auto", "fused", "eager", "streaming"])
    parser.add_argument("--test-size", type=positive_int, default=8, help="held-out images evaluated after training")
    parser.add_argument("--store-dir", default=None, help="streaming store directory (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before the run is killed")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    case = CASES[args.case]
    model = args.model or case["model"]
    image = args.image_size or case["image_size"]
    batch = args.batch_size or case["batch_size"]
    steps = args.steps or case["steps"]
    limit_text = args.limit or case["limit"]
    limit = parse_size(limit_text)  # the CLI's own reading of --memory-limit, which gets the same text

    with tempfile.TemporaryDirectory(prefix="bench-vit-limit-") as tmp:
        store = args.store_dir or os.path.join(tmp, "store")
        summary_path = os.path.join(tmp, "summary.json")
        cmd = [sys.executable, "-m", "tensorarena", "train", "--model", model, "--image-size", str(image),
               "--batch-size", str(batch), "--steps", str(steps), "--memory-limit", limit_text,
               "--route", args.route, "--store-dir", store, "--no-progress", "--json", summary_path,
               "--test-size", str(args.test_size)]
        load_before = os.getloadavg()
        started = time.perf_counter()
        try:
            run = run_limited(cmd, limit, timeout=args.timeout, env={**os.environ, "PYTHONPATH": ROOT})
        except CgroupUnavailable as exc:
            sys.exit(f"cannot hold the run to a real memory limit here: {exc}")
        wall = time.perf_counter() - started
        summary = None
        if os.path.exists(summary_path):
            with open(summary_path) as f:
                summary = json.load(f)

    result = {"case": args.case, "model": model, "image_size": image, "batch_size": batch, "steps": steps,
              "limit_bytes": limit, "route_requested": args.route, "test_size": args.test_size,
              "command": cmd, "returncode": run.returncode, "oom_killed": run.oom_killed,
              "cgroup_peak_bytes": run.peak_bytes, "wall_s": wall, "cpus": os.cpu_count(),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    if summary:
        losses = summary.get("step_losses") or []
        result.update(route=summary["route"], route_plan=summary.get("route_plan"),
                      route_switches=summary.get("route_switches"), steps_done=summary["steps"],
                      memory_budget_bytes=summary.get("memory_budget_bytes"),
                      memory_budget_source=summary.get("memory_budget_source"),
                      peak_rss_bytes=summary["peak_rss_bytes"], first_loss=summary["first_loss"],
                      last_loss=summary["final_loss"], step_losses=losses,
                      steps_per_second=summary["steps_per_second"], parameters=summary.get("parameters"),
                      arena_high_water_bytes=summary.get("arena_high_water_bytes"),
                      test_loss=summary.get("test_loss"))
    if run.returncode != 0 or not summary:
        result["stderr_tail"] = run.stderr[-4000:]
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))  # every benchmark prints its JSON too
    sys.exit(0 if run.returncode == 0 and not run.oom_killed else 1)


def report(r: dict) -> None:
    print(f"\n{r['model']}, batch {r['batch_size']}, {r['image_size']}px, {r['steps']} steps, route={r['route_requested']}, "
          f"inside a {r['limit_bytes'] / MiB:.0f} MiB cgroup (load average {r['loadavg_before'][0]:.2f} before, "
          f"{r['loadavg_after'][0]:.2f} after, {r['cpus']} CPUs)")
    rows = [("killed by the OOM killer", "yes" if r["oom_killed"] else "no"),
            ("exit code", str(r["returncode"])),
            ("route chosen", r.get("route", "-")),
            ("cgroup peak (RSS + page cache)", f"{r['cgroup_peak_bytes'] / MiB:.1f} MiB"),
            ("process peak RSS (VmHWM)", f"{r['peak_rss_bytes'] / MiB:.1f} MiB" if "peak_rss_bytes" in r else "-"),
            ("loss first -> last", f"{r['first_loss']:.4f} -> {r['last_loss']:.4f}" if r.get("first_loss") is not None else "-"),
            ("steps/s (incl. step 1)", f"{r['steps_per_second']:.3f} ({1 / r['steps_per_second']:.2f} s/step)"
             if r.get("steps_per_second") else "-"),
            ("wall (incl. start, eval)", f"{r['wall_s']:.1f} s")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    if r.get("route_switches"):
        print(f"  route switches: {r['route_switches']}")
    if r.get("route_plan"):
        print("\nroute plan:\n" + "\n".join("  " + line for line in r["route_plan"].splitlines()))
    if "stderr_tail" in r:
        print("\nstderr (tail):\n" + r["stderr_tail"])


if __name__ == "__main__":
    main()
