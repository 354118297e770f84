"""bench/common.py's interleaving helpers: who runs when, and ratios that a load change does not skew."""

from __future__ import annotations

import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from common import interleave, paired_ratios  # noqa: E402


def test_interleave_rotates_who_goes_first_each_round():
    order = []
    steps = {name: (lambda name=name: order.append(name)) for name in "abc"}
    times = interleave(steps, rounds=3, per_round=2, warmup=1)
    assert order[:3] == ["a", "b", "c"]  # warm-up, one each
    # each round: one untimed and two timed steps per contender, the order rotated by one
    rounds = [order[3 + 9 * r:3 + 9 * (r + 1)] for r in range(3)]
    assert [r[::3] for r in rounds] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(r == [n for n in r[::3] for _ in range(3)] for r in rounds)
    assert {n: len(t) for n, t in times.items()} == {"a": 6, "b": 6, "c": 6}


def test_paired_ratios_see_through_a_load_change_that_whole_run_medians_do_not():
    # Two steps per round. "ours" takes 0.7x the reference's time in each round, except round 3,
    # which a 3x slow-down hit while ours ran but before the reference's turn; from round 4 on it
    # slows both.
    ref = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]
    ours = [0.7, 0.7, 0.7, 0.7, 2.1, 2.1, 2.1, 2.1, 2.1, 2.1]
    paired = paired_ratios({"ref": ref, "ours": ours}, "ref", per_round=2)
    assert paired == {"ref": 1.0, "ours": pytest.approx(0.7)}  # round ratios 0.7, 0.7, 2.1, 0.7, 0.7
    # The ratio of whole-run medians: 2.1 / 1.0, three times the truth.
    assert statistics.median(ours) / statistics.median(ref) == pytest.approx(2.1)


def test_write_json_prints_the_json_last_and_writes_the_file_when_asked(tmp_path, capsys):
    import json

    from common import write_json

    data = {"model": "tiny", "median_ms": {"pytorch eager": 1.5}}
    write_json(None, data)
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == data
    write_json(str(tmp_path / "out.json"), data)
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == data
    assert json.loads((tmp_path / "out.json").read_text()) == data


def test_every_benchmark_prints_its_json():
    # The project's rule: a benchmark prints a table and JSON. Most wrote JSON only to a --json file (found by a
    # hunt on 2026-12-06); each now prints it through common.write_json or json.dumps to stdout. Running them all
    # is too slow for the suite, so their sources are read.
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    silent = []
    for name in sorted(os.listdir(bench)):
        if not name.endswith(".py") or name == "common.py":
            continue
        with open(os.path.join(bench, name)) as f:
            source = f.read()
        if "write_json(args.json" not in source and "print(json.dumps(" not in source:
            silent.append(name)
    assert not silent, f"benchmarks that print no JSON: {silent}"
