"""Run a command under a real Linux memory cgroup hard limit (v1 or v2), for memory-bound tests.

Tests that need it call `run_limited`; where cgroups cannot be created (not root, no memory
controller, a read-only /sys/fs/cgroup) it raises `CgroupUnavailable` with the reason, and the
test skips saying so.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

_counter = itertools.count()


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be created here; the message says why."""


@dataclass
class LimitedRun:
    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int  # the cgroup's own high-water (RSS + page cache it charged)
    oom_killed: bool


def _create(limit: int) -> tuple[Path, str]:
    name = f"tensorarena-test-{os.getpid()}-{next(_counter)}"
    v2_root = Path("/sys/fs/cgroup")
    if (v2_root / "cgroup.controllers").exists() and "memory" in (v2_root / "cgroup.controllers").read_text():
        path = v2_root / name
        kind = "v2"
    elif Path("/sys/fs/cgroup/memory").is_dir():
        path = Path("/sys/fs/cgroup/memory") / name
        kind = "v1"
    else:
        raise CgroupUnavailable("no cgroup memory controller is mounted at /sys/fs/cgroup")
    try:
        path.mkdir()
        if kind == "v2":
            (path / "memory.max").write_text(str(limit))
            if (path / "memory.swap.max").exists():  # no escape into swap
                (path / "memory.swap.max").write_text("0")
        else:
            (path / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as exc:
        if path.exists():
            path.rmdir()
        raise CgroupUnavailable(f"cannot create a memory cgroup at {path}: {exc}") from None
    return path, kind


def run_limited(cmd: list[str], limit: int, *, timeout: float = 300, env: dict | None = None) -> LimitedRun:
    """Run `cmd` inside a fresh memory cgroup with a hard limit of `limit` bytes."""
    path, kind = _create(limit)
    procs = path / "cgroup.procs"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              preexec_fn=lambda: procs.write_text(str(os.getpid())))
        if kind == "v2":
            peak_file = path / "memory.peak"
            peak = int(peak_file.read_text()) if peak_file.exists() else -1
            events = dict(line.split() for line in (path / "memory.events").read_text().splitlines())
            oom = int(events.get("oom_kill", 0)) > 0
        else:
            peak = int((path / "memory.max_usage_in_bytes").read_text())
            oom = "oom_kill 1" in (path / "memory.oom_control").read_text() or proc.returncode in (-9, 137)
        return LimitedRun(proc.returncode, proc.stdout, proc.stderr, peak, oom)
    finally:
        path.rmdir()
