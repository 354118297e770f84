"""Does "train this model in X" hold? Every model, at budgets around each route's need, under a real hard limit.

    python bench/budget_sweep.py [--models mlp,vit-tiny,vit-small,simcse] [--steps 3] [--json out.json]

For each model, `tensorarena plan --model M --json` (run without a limit) gives what each route needs: fused
and, where the model can be cut into stages, streaming (`train` may need up to ~1% more than `plan` says:
tests/test_plan_matches_train.py, hence the 2% below). Then `tensorarena train --model M --steps 3
--memory-limit L` runs inside a fresh memory cgroup whose hard limit is the same L (tests/cgroup_harness.py;
the kernel kills the process the moment it goes over, page cache included, after reclaiming what it can), at:

  - fused + 2%                expect: trains on the fused route
  - fused lean + 2%           expect: trains fused with its MLPs recomputing GELU in backward (for a model with
                              transformer MLPs, whose default keeps GELU's output and derivative: the need
                              comes from `plan --memory-limit <fused need - 0.5%>`, which plans that variant)
  - midway fused..streaming   expect: trains streaming (only where streaming needs over 2% less than fused; from the
                              lean fused need where there is one)
  - streaming + 2%            expect: trains streaming
  - smallest need - 1%        expect: refused before step 1, one clean line naming the budget and the need
                              (or trained under the limit: under the cgroup's pressure the kernel drops clean
                              library pages, and the need `train` measures in RSS can come out below plan's)

each once without and once with --save (a checkpoint written at the end must fit too). A run passes when it
did what was expected, was not killed, and its own peak RSS (the summary's peak_rss_bytes) is at most L.
The cgroup's high-water (RSS plus the page cache it charged, e.g. the streaming store's written pages) is
shown beside it: it may reach L, since the kernel reclaims clean cache rather than kill.

The table prints one row per run; the JSON (--json) has every figure. The exit status is 1 if any run failed
its expectation, so this can be run as a check; it is a benchmark, not a test, because it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import REPO_ROOT, positive_int, write_json  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
from cgroup_harness import CgroupUnavailable, run_limited  # noqa: E402

MIB = 1 << 20


def _plan(model: str, steps: int, limit: int | None = None) -> dict:
    cmd = [sys.executable, "-m", "tensorarena", "plan", "--model", model, "--steps", str(steps), "--json"]
    if limit is not None:
        cmd += ["--memory-limit", str(limit)]
    # Exit status 1 is plan's answer "nothing fits" (the sweep asks for budgets where that is the point), with
    # its JSON printed as for 0; anything else is a failure of plan itself.
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # the JSON is the last line (a table may come first)


def route_needs(model: str, steps: int) -> dict[str, int]:
    """Bytes each possible route needs for `model`, as `tensorarena plan --json` states them; "fused lean": the
    fused route with the MLPs recomputing GELU, where the model has MLPs that keep it (planned at a budget 0.5%
    under the default fused need, where plan tries that variant: one byte under, the process's share, measured
    anew, can come out that much smaller and the default fit again)."""
    plan = _plan(model, steps)
    needs = {route: est["required"] for route, est in plan["estimates"].items() if route in ("fused", "streaming")}
    under = _plan(model, steps, int(needs["fused"] * 0.995))
    if under["recompute_mlp"]:
        needs["fused lean"] = under["estimates"]["fused"]["required"]
    return needs


def budgets(needs: dict[str, int]) -> list[tuple[str, int, str | None]]:
    """(label, limit in bytes, the route expected to train, None for a refusal; "fused lean" is fused with the
    MLPs recomputing GELU)."""
    fused = needs["fused"]
    cases = [("fused +2%", int(fused * 1.02), "fused")]
    lean = needs.get("fused lean")
    if lean is not None:
        cases.append(("fused lean +2%", min(int(lean * 1.02), fused - 1), "fused lean"))
    fused = lean or fused
    streaming = needs.get("streaming")
    # Only where streaming saves more than the 2% margin: the default mlp streams since Sequential.stream_stages, but
    # its parameters are 0.5 MiB of a ~195 MiB need, so both routes need the same and +2% fits fused (auto takes it).
    if streaming is not None and streaming * 1.02 < fused:
        cases.append(("midway", (fused + streaming) // 2, "streaming"))
        cases.append(("streaming +2%", int(streaming * 1.02), "streaming"))
    smallest = min(needs.values())
    cases.append(("smallest -1%", int(smallest * 0.99), None))
    return cases


def train_under(model: str, limit: int, steps: int, save: bool, workdir: str) -> dict:
    """One `tensorarena train` run inside a cgroup of `limit` bytes; what it did and how much it held."""
    summary_path = os.path.join(workdir, "summary.json")
    if os.path.exists(summary_path):
        os.remove(summary_path)
    cmd = [sys.executable, "-m", "tensorarena", "train", "--model", model, "--steps", str(steps),
           "--memory-limit", str(limit), "--no-progress", "--json", summary_path]
    if model != "mlp":  # the store on the disk beside the run, not in a default temporary directory
        cmd += ["--store-dir", os.path.join(workdir, f"store-{limit}-{int(save)}")]
    if save:
        cmd += ["--save", os.path.join(workdir, f"saved-{limit}" + ("" if model == "simcse" else ".safetensors"))]
    # The checkout's tensorarena, not an installed one (the plan runs below have cwd=REPO_ROOT for the same reason)
    run = run_limited(cmd, limit, timeout=1800, env={**os.environ, "PYTHONPATH": REPO_ROOT})
    summary = json.load(open(summary_path)) if run.returncode == 0 and os.path.exists(summary_path) else {}
    stderr_lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    route = summary.get("route")
    if route == "fused" and summary.get("route_plan_recompute_mlp"):
        route = "fused lean"
    return {"returncode": run.returncode, "oom_killed": run.oom_killed, "cgroup_peak_bytes": run.peak_bytes,
            "route": route, "peak_rss_bytes": summary.get("peak_rss_bytes"),
            "last_stderr_line": stderr_lines[-1] if stderr_lines else "",
            "traceback": "Traceback" in run.stderr}


def verdict(result: dict, limit: int, expected: str | None) -> str:
    """'ok', or what went wrong."""
    if result["oom_killed"]:
        return "killed by the kernel (went over the hard limit)"
    if expected is None:
        if result["returncode"] == 0:
            # Under the cgroup's pressure the kernel drops clean library pages, so the process part of the
            # need, measured in RSS, can come out smaller than `plan` measured unlimited: training is then
            # right too, if it stayed under the limit.
            if result["peak_rss_bytes"] is not None and result["peak_rss_bytes"] <= limit:
                return "ok (trained: measured under the limit's pressure, the need was smaller)"
            return f"trained on {result['route']} over the limit, where a refusal was expected"
        line = result["last_stderr_line"]
        if result["traceback"] or ("budget" not in line and "limit" not in line):
            return "refused without one clean line naming the budget"
        return "ok"
    if result["returncode"] != 0:
        return f"failed (exit {result['returncode']}): {result['last_stderr_line'][:120]}"
    if result["route"] != expected:
        return f"trained on {result['route']}, expected {expected}"
    if result["peak_rss_bytes"] is None or result["peak_rss_bytes"] > limit:
        return f"peak RSS {result['peak_rss_bytes']} over the limit {limit}"
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,vit-tiny,vit-small,simcse")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="budget-sweep-") as workdir:
        for model in args.models.split(","):
            needs = route_needs(model, args.steps)
            print(f"{model}: needs " + ", ".join(f"{r} {n / MIB:.1f} MiB" for r, n in needs.items()), flush=True)
            for label, limit, expected in budgets(needs):
                for save in (False, True):
                    try:
                        result = train_under(model, limit, args.steps, save, workdir)
                    except CgroupUnavailable as exc:
                        print(f"cannot run the sweep here: {exc}", file=sys.stderr)
                        return 2
                    row = {"model": model, "case": label, "save": save, "limit_bytes": limit,
                           "expected": expected or "refused", "needs": needs, **result,
                           "verdict": verdict(result, limit, expected)}
                    rows.append(row)
                    print_row(row)
    failed = [r for r in rows if not r["verdict"].startswith("ok")]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} runs did what the plan said, under their limit")
    write_json(args.json, {"steps": args.steps, "runs": rows})  # printed last; written to --json if given
    return 1 if failed else 0


def print_row(row: dict) -> None:
    peak = row["peak_rss_bytes"]
    print(f"  {row['case']:<14} {'save' if row['save'] else '    '}  limit {row['limit_bytes'] / MIB:8.1f} MiB  "
          f"route {row['route'] or '-':<10}  peak RSS {peak / MIB if peak else 0:8.1f} MiB  "
          f"cgroup peak {row['cgroup_peak_bytes'] / MIB:8.1f} MiB  {row['verdict']}", flush=True)
    if row["expected"] == "refused":
        print(f"      said: {row['last_stderr_line'][:160]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
