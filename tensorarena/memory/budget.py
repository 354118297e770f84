"""How much memory a run may use: the user's number, else the cgroup limit, else RAM.

The budget is for the whole process (RSS), because that is what a cgroup or
the OOM killer measures. The default is the smaller of the cgroup limit (v2
`memory.max`, v1 `memory.limit_in_bytes`) and what this process has plus the
RAM still available, minus a safety margin; `MemoryBudget.source` says which
number it came from, so a report can tell the user why. A number the user gives
above the cgroup limit is replaced by the cgroup limit less the same margin: the
kernel enforces the cgroup whatever the user believes, and a budget above it ends
in the OOM killer.

Sizes are binary: 2G, 2Gi and 2GiB all mean 2 x 2**30 bytes.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from .meter import format_bytes, rss_bytes

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_PAGE = os.sysconf("SC_PAGE_SIZE")
_NO_LIMIT = 1 << 60  # v1 reports "unlimited" as a huge page-rounded number
log = logging.getLogger("tensorarena")


@dataclass(frozen=True)
class MemoryBudget:
    """A byte budget and where it came from."""

    nbytes: int
    source: str
    margin: int = 0

    def __str__(self) -> str:
        margin = f" after a {format_bytes(self.margin)} margin" if self.margin else ""
        return f"{format_bytes(self.nbytes)} ({self.source}{margin})"


def parse_size(text: str | int) -> int:
    """Bytes from 2G, 2Gi, 512M, 1.5GiB, 4096, 1e9 or an int; the units are binary (G = Gi = GiB = 2**30).
    A fraction of a byte is dropped (0.3K is 307)."""
    if isinstance(text, bool):  # an int to Python, but True is no byte count
        raise TypeError(f"a memory size must be a number of bytes or a string such as 2G, got the bool {text!r}")
    if isinstance(text, int):
        value = text
    else:
        # A sign is read so that "-1G" is told it must be positive, not that it is unreadable; the number is
        # read as a Decimal, exact where a float is not (byte counts above 2**53) and in exponent form (1e9).
        number_part = r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"
        match = re.fullmatch(r"\s*" + number_part + r"\s*(?:([kmgtKMGT])[iI]?)?[bB]?\s*", str(text))
        if not match:
            raise ValueError(f"cannot read a memory size from {text!r}; use e.g. 2G, 2Gi, 512M, 1.5GiB or a byte count")
        number = Decimal(match.group(1))
        # Before int(): 1e500000 took seconds to expand, and 1e400 overflowed later, printing it (format_bytes).
        if number and number.adjusted() > 24:
            raise ValueError(f"the memory size {text!r} is beyond any machine's (over 10**24 bytes); check the "
                             f"exponent or the unit")
        value = int(number * _UNITS[(match.group(2) or "").lower()])
    if value <= 0:
        raise ValueError(f"a memory size must be positive (at least 1 byte), got {text!r}")
    return value


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _NO_LIMIT else value


def _up_to_root(rel: str) -> list[str]:
    """The cgroup `rel` ("a/b/c") and each of its ancestors up to the root ("a/b", "a", ""): a limit on any of them
    holds this process (a child group with no limit of its own under a parent limited to 400M got a budget of the
    machine's free RAM, chose a route for it and was killed)."""
    parts = [p for p in rel.split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_limit(*, proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> tuple[int, str] | None:
    """This process's cgroup memory limit (the smallest of its group's and its ancestors') and the file it came
    from, or None if unlimited."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    found: list[tuple[int, str]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # cgroup v2 (unified); mounted at root, or at root/unified in hybrid mode
            mounts, name, kind = [Path(root), Path(root) / "unified"], "memory.max", "cgroup v2 memory.max"
        elif "memory" in controllers.split(","):
            mounts, name, kind = [Path(root) / "memory"], "memory.limit_in_bytes", "cgroup v1 memory.limit_in_bytes"
        else:
            continue
        for group in _up_to_root(rel):
            for mount in mounts:
                path = mount / group / name
                value = _read_int(path)
                if value is not None:
                    found.append((value, f"{kind} at {path}"))
                    break
    return min(found) if found else None


def available_ram() -> int:
    """RAM the kernel says new allocations can still get (MemAvailable), in bytes."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return psutil.virtual_memory().available


def _margin(limit: int, margin_fraction: float, min_margin: int) -> int:
    return max(min_margin, int(limit * margin_fraction))


def resolve_budget(user: str | int | None = None, *, margin_fraction: float = 0.05,
                   min_margin: int = 128 << 20) -> MemoryBudget:
    """The budget for this process: `user` if given (one above the cgroup limit is replaced by the cgroup
    limit minus its margin), else min(cgroup, RSS + free RAM) minus a margin."""
    if user is not None:
        return _user_budget(parse_size(user), margin_fraction, min_margin)
    ram = rss_bytes() + available_ram()
    limit, source = ram, "this process's RSS plus the RAM still available"
    cgroup = cgroup_limit()
    if cgroup is not None and cgroup[0] < limit:
        limit, source = cgroup
    margin = _margin(limit, margin_fraction, min_margin)
    if limit <= margin:
        raise MemoryError(f"only {format_bytes(limit)} is available ({source}); that is below the "
                          f"{format_bytes(margin)} safety margin, so no training can run here")
    return MemoryBudget(limit - margin, source, margin)


def _user_budget(asked: int, margin_fraction: float, min_margin: int) -> MemoryBudget:
    """The user's number, unless it is above the cgroup limit: the kernel kills the process there whatever
    the user set, so such a number cannot be true, and the budget is the default one (the cgroup limit less
    its margin), with a warning naming both. A number at or under the cgroup limit is the user's choice of
    margin and is kept."""
    cgroup = cgroup_limit()
    if cgroup is None:
        return MemoryBudget(asked, "set by the user")
    # The kernel keeps a cgroup limit rounded down to whole pages: a cgroup made with the user's own number
    # reads back up to a page below it, which is the same limit, not one the user asked to go over (taken as
    # "above", the budget fell by the whole 128 MiB margin; bench/budget_sweep.py found it).
    if asked - _PAGE < cgroup[0]:
        return MemoryBudget(min(asked, cgroup[0]), "set by the user")
    limit, source = cgroup
    margin = _margin(limit, margin_fraction, min_margin)
    if limit <= margin:
        raise MemoryError(f"only {format_bytes(limit)} is available ({source}); that is below the "
                          f"{format_bytes(margin)} safety margin, so no training can run here")
    log.warning("memory limit %s is above this process's %s, %s less a %s margin: the budget is %s",
                format_bytes(asked), source, format_bytes(limit), format_bytes(margin),
                format_bytes(limit - margin))
    return MemoryBudget(limit - margin, f"{source}, smaller than the {format_bytes(asked)} asked for", margin)


def describe_environment() -> str:
    """One line on where the default budget would come from (for reports)."""
    cgroup = cgroup_limit()
    parts = [f"available RAM {format_bytes(available_ram())}"]
    parts.append(f"cgroup limit {format_bytes(cgroup[0])} ({cgroup[1]})" if cgroup else "no cgroup memory limit")
    return ", ".join(parts) + f", pid {os.getpid()}"
