"""The streaming route against in-memory eager training: ViT-Base, batch 1, 224 x 224, AdamW.

    python bench/streaming.py [--case base|tiny] [--steps N] [--store-dir DIR] [--json out.json]

Both contenders run in their own child process (bench/common.py), so each peak RSS is its own.
"tensorarena eager" is the Trainer's eager step, everything in RAM. "tensorarena streaming"
is StreamingRoute: parameters and AdamW state in files under --store-dir, two stage-sized
slots in RAM. The store is written by from_memory just before the steps, so its files are in
the page cache: this measures the route's own cost (recompute, copies, I/O syscalls), not the
disk. For the disk, a plain large-file write (buffered, then fsync) and read (after the write,
so warm; then after posix_fadvise DONTNEED, cold where the kernel honours it) give the
bandwidths, and the report converts bytes moved per step into seconds at those rates.

Reported: median and first step time, peak RSS, the streaming route's resident buffers, arena
high-water, bytes read and written per step, and the measured bandwidths.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import child_main, run_children, time_steps  # noqa: E402

IMAGE, PATCH, CLASSES, LR, WEIGHT_DECAY = 224, 16, 10, 1e-3, 0.01
WARMUP = 1
CASES = {"base": {"batch": 1, "steps": 5}, "tiny": {"batch": 8, "steps": 5}}
CONTENDERS = ["tensorarena eager", "tensorarena streaming"]
MiB = 2**20


def _case() -> str:
    return os.environ.get("BENCH_CASE", "base")


def _steps() -> int:
    return int(os.environ.get("BENCH_STEPS") or CASES[_case()]["steps"])


def _setup():
    import numpy as np

    from tensorarena import optim
    from tensorarena.models.vit import ViT, ViTConfig

    config = getattr(ViTConfig, _case())(image_size=IMAGE, patch_size=PATCH, num_classes=CLASSES)
    model = ViT(config, rng=np.random.default_rng(0))
    optimizer = optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    rng = np.random.default_rng(0)
    batch = CASES[_case()]["batch"]
    x = rng.standard_normal((batch, 3, IMAGE, IMAGE), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch).astype(np.int64)
    return model, optimizer, x, y


def run_eager() -> dict:
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    model, optimizer, x, y = _setup()
    trainer = Trainer(model, optimizer, cross_entropy)
    high_water = []

    def step():
        report = trainer.step(x, y)
        high_water.append(report.arena_high_water)
        return report.loss

    result = time_steps(step, warmup=WARMUP, steps=_steps())
    result["arena_high_water_bytes"] = high_water[-1]
    result["parameters"] = model.num_parameters()
    return result


def run_streaming() -> dict:
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.stream import StreamingRoute

    model, optimizer, x, y = _setup()
    parameters = model.num_parameters()
    estimate = StreamingRoute.estimate(model, optimizer)
    with tempfile.TemporaryDirectory(prefix="bench-stream-", dir=os.environ.get("BENCH_STORE_DIR")) as store:
        start = time.perf_counter()
        route = StreamingRoute.from_memory(model, optimizer, cross_entropy, store)
        move_in = time.perf_counter() - start
        with route:
            result = time_steps(lambda: route.step(x, y), warmup=WARMUP, steps=_steps())
            stats = route.last_stats
    result.update(parameters=parameters, move_in_s=move_in, estimate=estimate,
                  arena_high_water_bytes=stats.arena_high_water, resident_bytes=stats.resident_bytes,
                  bytes_read_per_step=stats.bytes_read, bytes_written_per_step=stats.bytes_written)
    return result


def disk_bandwidth(directory: str, nbytes: int) -> dict:
    """Plain large-file write (buffered, and with fsync) and read (warm, then cold if fadvise works), bytes/s."""
    import numpy as np

    chunk = np.ones(64 * MiB, np.uint8)
    count = max(1, nbytes // chunk.nbytes)
    fd, path = tempfile.mkstemp(prefix="bench-disk-", dir=directory)
    try:
        start = time.perf_counter()
        for _ in range(count):
            os.write(fd, chunk)
        buffered = time.perf_counter() - start
        os.fsync(fd)
        synced = time.perf_counter() - start
        total = count * chunk.nbytes

        def read() -> float:
            begin = time.perf_counter()
            done = 0
            while done < total:
                done += os.preadv(fd, [chunk], done)
            return time.perf_counter() - begin

        warm = read()
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        cold = read()
    finally:
        os.close(fd)
        os.unlink(path)
    return {"bytes": total, "write_buffered_Bps": total / buffered, "write_fsync_Bps": total / synced,
            "read_warm_Bps": total / warm, "read_after_dontneed_Bps": total / cold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), default="base")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per contender")
    parser.add_argument("--store-dir", default=None, help="where the store and the bandwidth file go (default: tmp)")
    parser.add_argument("--only", choices=["eager", "streaming"], default=None)
    parser.add_argument("--json", default=None, help="write all results here")
    args = parser.parse_args()
    env = {"BENCH_CASE": args.case, "BENCH_STEPS": str(args.steps or ""), "BENCH_STORE_DIR": args.store_dir or ""}
    if not args.store_dir:
        env.pop("BENCH_STORE_DIR")
    names = [n for n in CONTENDERS if args.only is None or n.endswith(args.only)]
    results = run_children(os.path.abspath(__file__), names, env)
    stream = results.get("tensorarena streaming")
    moved = (stream["bytes_read_per_step"] + stream["bytes_written_per_step"]) if stream else 2 * 2**30
    disk = disk_bandwidth(args.store_dir or tempfile.gettempdir(), moved)
    report(args.case, results, disk)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": args.case, "results": results, "disk": disk}, f, indent=2)


def report(case: str, results: dict, disk: dict) -> None:
    print(f"\nViT-{case.capitalize()} training step, AdamW, {IMAGE}px: in-memory eager vs streaming from disk")
    header = f"{'contender':<24}{'median s':>10}{'first s':>9}{'peak RSS MiB':>14}{'arena MiB':>11}"
    print(header + "\n" + "-" * len(header))
    for name, r in results.items():
        print(f"{name:<24}{r['median_step_s']:>10.2f}{r['first_step_s']:>9.2f}{r['peak_rss_bytes'] / MiB:>14.1f}"
              f"{r['arena_high_water_bytes'] / MiB:>11.1f}")
    s = results.get("tensorarena streaming")
    print(f"\ndisk ({disk['bytes'] / MiB:.0f} MiB file): write {disk['write_buffered_Bps'] / MiB:.0f} MiB/s buffered, "
          f"{disk['write_fsync_Bps'] / MiB:.0f} MiB/s with fsync; read {disk['read_warm_Bps'] / MiB:.0f} MiB/s warm, "
          f"{disk['read_after_dontneed_Bps'] / MiB:.0f} MiB/s after DONTNEED")
    if s:
        read, written = s["bytes_read_per_step"], s["bytes_written_per_step"]
        print(f"streaming: {s['parameters']:,} parameters, resident buffers {s['resident_bytes'] / MiB:.1f} MiB, "
              f"store {s['estimate']['disk_bytes'] / MiB:.1f} MiB, move-in {s['move_in_s']:.2f} s")
        print(f"per step: read {read / MiB:.0f} MiB, wrote {written / MiB:.0f} MiB; at the measured rates that is "
              f"{read / disk['read_warm_Bps'] + written / disk['write_buffered_Bps']:.2f} s from page cache, "
              f"{read / disk['read_after_dontneed_Bps'] + written / disk['write_fsync_Bps']:.2f} s from the device")
        if "tensorarena eager" in results:
            e = results["tensorarena eager"]
            print(f"streaming / eager: time x{s['median_step_s'] / e['median_step_s']:.2f}, "
                  f"peak RSS x{s['peak_rss_bytes'] / e['peak_rss_bytes']:.2f}")


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main({"tensorarena eager": run_eager, "tensorarena streaming": run_streaming})
    else:
        main()
