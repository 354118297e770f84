"""Memory meters: peak RSS must be this program's own, not inherited from whoever started it."""

import subprocess
import sys

import numpy as np

from tensorarena.memory.meter import format_bytes, peak_rss_bytes, rss_bytes


def test_peak_rss_of_a_child_is_its_own():
    # ru_maxrss survives exec, so a command started from a big process (pytest after many tests,
    # a benchmark harness) reported its parent's peak; VmHWM does not. Fails with ru_maxrss.
    ballast = np.ones(400 << 20, np.uint8)  # make this process's peak clearly larger than the child's
    code = "from tensorarena.memory.meter import peak_rss_bytes; print(peak_rss_bytes())"
    child_peak = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout)
    assert ballast.sum() > 0 and peak_rss_bytes() >= 400 << 20
    assert child_peak < 300 << 20, f"child reported {format_bytes(child_peak)}"


def test_rss_is_positive_and_at_most_the_peak():
    assert 0 < rss_bytes() <= peak_rss_bytes()
