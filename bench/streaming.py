"""Streaming vs fused (and eager) training steps: ViT-Base, batch 1, 224 x 224, AdamW.

    python bench/streaming.py [--case base|tiny] [--steps N] [--only NAME ...] [--eager]
                              [--store-dir DIR] [--no-drop-caches] [--json out.json]

Every contender runs in its own child process (bench/common.py), so each peak RSS is its own.

  "tensorarena fused"            Trainer(route="fused"): the step traced once (trainer.compile,
                                 timed apart) and replayed from a static slab, everything in RAM.
  "tensorarena streaming"        StreamingRoute: parameters and AdamW state in files under
                                 --store-dir, two stage-sized slots in RAM. Warm page cache: the
                                 store was just written by from_memory and every step writes it
                                 back, so its reads come from memory. This is the route's own cost
                                 (recompute, copies, I/O syscalls), not the disk's.
  "tensorarena streaming copy"   The same (warm) with StreamingRoute(io="copy"): stages read into
                                 and written from two slot buffers instead of memory-mapped (the
                                 default, io="map"; stream/store.py), to show what mapping saves.
  "tensorarena streaming cold"   The same as "tensorarena streaming", but before each step (untimed) the store's files are
                                 pushed out of the page cache: route.store.drain(), fsync and
                                 posix_fadvise(DONTNEED) on every file in the store directory
                                 (DONTNEED only drops clean pages, hence the fsync), then
                                 "1" > /proc/sys/vm/drop_caches where this process may write it
                                 (root; it drops the whole machine's clean page cache, so
                                 --no-drop-caches leaves it out). Whether it worked is measured
                                 with mincore(2): the fraction of the store's pages still cached.
  "tensorarena eager"            Trainer's eager step (define-by-run tape), in RAM. Optional
                                 (--eager or --only eager): it adds another slow contender.

For the disk, a plain large-file write (buffered, then fsync) and reads (warm; after DONTNEED;
after drop_caches where permitted) give bandwidths, and the report converts the bytes the
streaming route moves per step into seconds at those rates.

Reported per contender: median and first (warm-up) step time, peak RSS during the steps (the
high-water mark is reset after setup via /proc/self/clear_refs where the kernel allows; the
setup peak, which includes the model built in RAM before streaming moves it out, is kept
apart), arena high-water, bytes read and written per step (streaming), and streaming / fused
step-time ratios with the bar: warm streaming <= 2.0 x fused.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (child_main, peak_rss_bytes, positive_int, rss_bytes, run_children, time_steps,  # noqa: E402
                    write_json)

IMAGE, PATCH, CLASSES, LR, WEIGHT_DECAY = 224, 16, 10, 1e-3, 0.01
WARMUP = 1
BAR = 2.0  # warm streaming step <= BAR x fused step
CASES = {"base": {"batch": 1, "steps": 5}, "tiny": {"batch": 8, "steps": 5}}
FUSED, WARM, COPY, COLD, EAGER = ("tensorarena fused", "tensorarena streaming", "tensorarena streaming copy",
                                  "tensorarena streaming cold", "tensorarena eager")
SHORT = {"fused": FUSED, "streaming": WARM, "copy": COPY, "cold": COLD, "eager": EAGER}
DEFAULT = [FUSED, WARM, COPY, COLD]
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


def _reset_peak() -> dict:
    """Note the setup's peak RSS, then reset VmHWM to the current RSS ("5" > clear_refs, Linux >= 4.0)."""
    setup_peak = peak_rss_bytes()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = peak_rss_bytes() < setup_peak or peak_rss_bytes() <= rss_bytes() + 4 * MiB
    except OSError:
        reset = False
    return {"peak_rss_setup_bytes": setup_peak, "peak_rss_reset_after_setup": reset,
            "rss_before_steps_bytes": rss_bytes()}


# -- page cache -----------------------------------------------------------------------
def cached_fraction(paths) -> float | None:
    """Fraction of the files' pages in the page cache now (mincore(2) on a read-only mapping); None if unknown."""
    import ctypes
    import mmap

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    page = mmap.PAGESIZE
    resident = total = 0
    for path in paths:
        size = os.path.getsize(path)
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = (size + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
                resident += sum(b & 1 for b in bytes(vec))
                total += pages
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else None


def _drop_caches() -> str | None:
    """Write "1" to /proc/sys/vm/drop_caches; None if it worked, else why not."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


def evict(paths, *, drop_caches: bool) -> dict:
    """Push `paths` out of the page cache: fsync + POSIX_FADV_DONTNEED each, then drop_caches if asked and allowed."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # DONTNEED (and drop_caches) leave dirty pages where they are
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    methods, error = ["fsync+fadvise(DONTNEED)"], None
    if drop_caches:
        error = _drop_caches()
        if error is None:
            methods.append("drop_caches=1")
    return {"methods": methods, "drop_caches_error": error}


def _store_files(route) -> list[str]:
    directory = str(route.store.directory)
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, n))]


def _stage_files(route) -> list[str]:
    return [os.path.join(str(route.store.directory), n) for n in route.store.files]


# -- contenders -----------------------------------------------------------------------
def run_eager() -> dict:
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    model, optimizer, x, y = _setup()
    trainer = Trainer(model, optimizer, cross_entropy, route="eager")
    return _time_trainer(trainer, x, y, {})


def run_fused() -> dict:
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.train.trainer import Trainer

    model, optimizer, x, y = _setup()
    trainer = Trainer(model, optimizer, cross_entropy, route="fused")
    start = time.perf_counter()
    fused = trainer.compile(x, y)
    extra = {"compile_s": time.perf_counter() - start}
    try:
        extra["predicted_peak_bytes"] = int(fused.memory_report()["predicted_peak"])
    except Exception:  # noqa: BLE001 - a report field is a nicety, not the benchmark
        pass
    return _time_trainer(trainer, x, y, extra)


def _time_trainer(trainer, x, y, extra: dict) -> dict:
    high_water, routes = [], []
    extra.update(_reset_peak())

    def step():
        report = trainer.step(x, y)
        high_water.append(report.arena_high_water)
        routes.append(report.route)
        return report.loss

    result = time_steps(step, warmup=WARMUP, steps=_steps())
    result.update(extra, arena_high_water_bytes=high_water[-1], parameters=trainer.model.num_parameters(),
                  routes_taken=sorted(set(routes)))
    return result


def _run_streaming(cold: bool, io: str = "map") -> dict:
    from tensorarena.nn.functional import cross_entropy
    from tensorarena.stream import StreamingRoute

    drop_caches = os.environ.get("BENCH_DROP_CACHES", "1") == "1"
    model, optimizer, x, y = _setup()
    parameters = model.num_parameters()
    estimate = StreamingRoute.estimate(model, optimizer)
    with tempfile.TemporaryDirectory(prefix="bench-stream-", dir=os.environ.get("BENCH_STORE_DIR")) as store:
        start = time.perf_counter()
        route = StreamingRoute.from_memory(model, optimizer, cross_entropy, store, io=io)
        move_in = time.perf_counter() - start
        extra = {"move_in_s": move_in}
        with route:
            extra["cached_fraction_before_steps"] = cached_fraction(_stage_files(route))
            extra.update(_reset_peak())
            evictions, reads, writes = [], [], []

            def before():
                if not cold:
                    return
                begin = time.perf_counter()
                route.store.drain()
                outcome = evict(_store_files(route), drop_caches=drop_caches)
                outcome["cached_fraction_after"] = cached_fraction(_stage_files(route))
                outcome["seconds"] = time.perf_counter() - begin
                evictions.append(outcome)

            def step():
                loss = route.step(x, y)
                stats = route.last_stats
                reads.append(stats.bytes_read)
                writes.append(stats.bytes_written)
                return loss

            result = _time_steps_prepared(step, before, warmup=WARMUP, steps=_steps())
            stats = route.last_stats
            if not cold:
                extra["cached_fraction_after_steps"] = cached_fraction(_stage_files(route))
    result.update(extra, parameters=parameters, estimate=estimate, cold=cold, io=route.store.io,
                  late_unmaps=route.store.late_unmaps,
                  arena_high_water_bytes=stats.arena_high_water, resident_bytes=stats.resident_bytes,
                  bytes_read_per_step=stats.bytes_read, bytes_written_per_step=stats.bytes_written,
                  bytes_read_steps=reads[WARMUP:], bytes_written_steps=writes[WARMUP:])
    if cold:
        fractions = [e["cached_fraction_after"] for e in evictions if e["cached_fraction_after"] is not None]
        result["eviction"] = {
            "methods": evictions[-1]["methods"] if evictions else [],
            "drop_caches_requested": drop_caches,
            "drop_caches_error": evictions[-1]["drop_caches_error"] if evictions else None,
            "max_cached_fraction_after": max(fractions) if fractions else None,
            "median_seconds": statistics.median(e["seconds"] for e in evictions) if evictions else None,
            "worked": bool(fractions) and max(fractions) < 0.05,
        }
    return result


def _time_steps_prepared(step, before, *, warmup: int, steps: int) -> dict:
    """common.time_steps with an untimed `before()` ahead of every step (the cold contender's eviction)."""
    times, losses, rss = [], [], []
    for _ in range(warmup + steps):
        before()
        start = time.perf_counter()
        losses.append(float(step()))
        times.append(time.perf_counter() - start)
        rss.append(rss_bytes())
    measured = times[warmup:]
    return {"first_step_s": times[0], "median_step_s": statistics.median(measured), "step_times_s": measured,
            "first_loss": losses[0], "last_loss": losses[-1], "peak_rss_bytes": peak_rss_bytes(),
            "rss_slope_bytes_per_step": (rss[-1] - rss[warmup]) / max(steps - 1, 1)}


def run_streaming() -> dict:
    return _run_streaming(cold=False)


def run_streaming_cold() -> dict:
    return _run_streaming(cold=True)


def run_streaming_copy() -> dict:
    return _run_streaming(cold=False, io="copy")


# -- the disk ---------------------------------------------------------------------------
def disk_bandwidth(directory: str, nbytes: int, *, drop_caches: bool) -> dict:
    """Plain large-file write (buffered, and with fsync) and reads (warm, after DONTNEED, after drop_caches), bytes/s."""
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
        cached_after_dontneed = cached_fraction([path])
        cold = read()
        out = {"bytes": total, "write_buffered_Bps": total / buffered, "write_fsync_Bps": total / synced,
               "read_warm_Bps": total / warm, "read_after_dontneed_Bps": total / cold,
               "cached_fraction_after_dontneed": cached_after_dontneed}
        if drop_caches:
            error = _drop_caches()
            out["drop_caches_error"] = error
            if error is None:
                out["cached_fraction_after_drop_caches"] = cached_fraction([path])
                out["read_after_drop_caches_Bps"] = total / read()
    finally:
        os.close(fd)
        os.unlink(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), default="base")
    parser.add_argument("--steps", type=positive_int, default=None, help="timed steps per contender (after 1 warm-up)")
    parser.add_argument("--store-dir", default=None, help="where the store and the bandwidth file go (default: tmp)")
    parser.add_argument("--only", nargs="+", choices=sorted(SHORT), default=None,
                        help="run just these contenders (default: fused streaming copy cold)")
    parser.add_argument("--eager", action="store_true", help="add the eager contender to the default set")
    parser.add_argument("--no-drop-caches", action="store_true",
                        help="cold runs: fadvise only, never write /proc/sys/vm/drop_caches (machine-wide)")
    parser.add_argument("--no-disk", action="store_true", help="skip the plain-file bandwidth measurement")
    parser.add_argument("--json", default=None, help="write all results here")
    args = parser.parse_args()
    drop = not args.no_drop_caches
    env = {"BENCH_CASE": args.case, "BENCH_STEPS": str(args.steps or ""), "BENCH_DROP_CACHES": "1" if drop else "0"}
    if args.store_dir:
        env["BENCH_STORE_DIR"] = args.store_dir
    names = [SHORT[n] for n in args.only] if args.only else DEFAULT + ([EAGER] if args.eager else [])
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = run_children(os.path.abspath(__file__), names, env)
    stream = results.get(WARM) or results.get(COLD)
    disk = None
    if not args.no_disk:
        moved = (stream["bytes_read_per_step"] + stream["bytes_written_per_step"]) if stream else 2 * 2**30
        disk = disk_bandwidth(args.store_dir or tempfile.gettempdir(), moved, drop_caches=drop)
    meta = {"case": args.case, "batch": CASES[args.case]["batch"], "image": IMAGE, "warmup_steps": WARMUP,
            "timed_steps": args.steps or CASES[args.case]["steps"], "cpus": os.cpu_count(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "wall_s": time.perf_counter() - started}
    verdict = ratios(results)
    report(meta, results, disk, verdict)
    write_json(args.json, {**meta, "results": results, "disk": disk, "ratios": verdict})


def ratios(results: dict) -> dict:
    out = {"bar": BAR}
    if FUSED in results:
        fused = results[FUSED]["median_step_s"]
        for name, key in ((WARM, "streaming_over_fused"), (COPY, "streaming_copy_over_fused"),
                          (COLD, "streaming_cold_over_fused"),
                          (EAGER, "eager_over_fused")):
            if name in results:
                out[key] = results[name]["median_step_s"] / fused
        if "streaming_over_fused" in out:
            out["bar_met"] = out["streaming_over_fused"] <= BAR
    return out


def report(meta: dict, results: dict, disk: dict | None, verdict: dict) -> None:
    case = meta["case"]
    print(f"\nViT-{case.capitalize()} training step, batch {meta['batch']}, {IMAGE}px, AdamW: fused vs streaming "
          f"(warm and cold page cache); {WARMUP} warm-up + {meta['timed_steps']} timed steps each")
    print(f"load average before {meta['loadavg_before'][0]:.2f}, after {meta['loadavg_after'][0]:.2f} "
          f"on {meta['cpus']} CPUs")
    header = (f"{'contender':<28}{'median s':>9}{'first s':>9}{'x fused':>9}{'peak RSS MiB':>14}{'setup MiB':>11}"
              f"{'arena MiB':>11}{'read MiB/step':>15}{'wrote MiB/step':>16}")
    print(header + "\n" + "-" * len(header))
    fused = results.get(FUSED)
    for name, r in results.items():
        ratio = f"{r['median_step_s'] / fused['median_step_s']:>9.2f}" if fused else f"{'-':>9}"
        read = f"{r['bytes_read_per_step'] / MiB:>15.0f}" if "bytes_read_per_step" in r else f"{'-':>15}"
        wrote = f"{r['bytes_written_per_step'] / MiB:>16.0f}" if "bytes_written_per_step" in r else f"{'-':>16}"
        print(f"{name:<28}{r['median_step_s']:>9.2f}{r['first_step_s']:>9.2f}{ratio}{r['peak_rss_bytes'] / MiB:>14.1f}"
              f"{r['peak_rss_setup_bytes'] / MiB:>11.1f}{r['arena_high_water_bytes'] / MiB:>11.1f}{read}{wrote}")
    if fused:
        print(f"\nfused: compile (trace) {fused['compile_s']:.2f} s, outside the step times")
    s = results.get(WARM) or results.get(COLD)
    if s:
        print(f"streaming: {s['parameters']:,} parameters, resident buffers {s['resident_bytes'] / MiB:.1f} MiB, "
              f"store {s['estimate']['disk_bytes'] / MiB:.1f} MiB, move-in {s['move_in_s']:.2f} s")
    for name in (WARM, COPY, COLD):
        if name in results:
            print(f"{name}: io={results[name]['io']!r}, mappings unmapped late {results[name]['late_unmaps']}")
    if WARM in results:
        w = results[WARM]
        print(f"warm: store pages cached before the steps {_pct(w['cached_fraction_before_steps'])}, "
              f"after {_pct(w.get('cached_fraction_after_steps'))}")
    if COLD in results:
        e = results[COLD]["eviction"]
        print(f"cold: before each step {' + '.join(e['methods'])} ({e['median_seconds']:.2f} s, untimed); "
              f"store pages still cached afterwards at most {_pct(e['max_cached_fraction_after'])} -> "
              f"{'evicted' if e['worked'] else 'NOT evicted: the cold figures are not cold'}"
              + (f"; drop_caches not used: {e['drop_caches_error']}" if e["drop_caches_error"] else ""))
    if disk:
        line = (f"\ndisk ({disk['bytes'] / MiB:.0f} MiB file): write {disk['write_buffered_Bps'] / MiB:.0f} MiB/s "
                f"buffered, {disk['write_fsync_Bps'] / MiB:.0f} MiB/s with fsync; read {disk['read_warm_Bps'] / MiB:.0f} "
                f"MiB/s warm, {disk['read_after_dontneed_Bps'] / MiB:.0f} MiB/s after DONTNEED "
                f"({_pct(disk['cached_fraction_after_dontneed'])} still cached)")
        if "read_after_drop_caches_Bps" in disk:
            line += (f", {disk['read_after_drop_caches_Bps'] / MiB:.0f} MiB/s after drop_caches "
                     f"({_pct(disk['cached_fraction_after_drop_caches'])} still cached)")
        print(line)
        if s:
            read, written = s["bytes_read_per_step"], s["bytes_written_per_step"]
            print(f"per step: read {read / MiB:.0f} MiB, wrote {written / MiB:.0f} MiB; copied at the measured rates "
                  f"(io='copy'; io='map' copies none of it from page cache) that is "
                  f"{read / disk['read_warm_Bps'] + written / disk['write_buffered_Bps']:.2f} s from page cache, "
                  f"{read / disk['read_after_dontneed_Bps'] + written / disk['write_fsync_Bps']:.2f} s from the device")
    if "streaming_over_fused" in verdict:
        print(f"\nbar: warm streaming step <= {BAR:.1f} x fused: x{verdict['streaming_over_fused']:.2f} -> "
              f"{'MET' if verdict['bar_met'] else 'NOT MET'}")
    if "streaming_copy_over_fused" in verdict:
        print(f"warm streaming with io='copy' (no memory mapping): x{verdict['streaming_copy_over_fused']:.2f} fused")
    if "streaming_cold_over_fused" in verdict:
        print(f"cold streaming step: x{verdict['streaming_cold_over_fused']:.2f} fused")
    if "eager_over_fused" in verdict:
        print(f"eager step: x{verdict['eager_over_fused']:.2f} fused")


def _pct(value) -> str:
    return "unknown" if value is None else f"{value:.0%}"


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main({FUSED: run_fused, WARM: run_streaming, COPY: run_streaming_copy, COLD: run_streaming_cold,
                    EAGER: run_eager})
    else:
        main()
