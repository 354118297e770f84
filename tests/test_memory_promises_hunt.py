"""Memory the plans promise, after a load mid-run (a helper agent's hunt of the memory promises).

Trainer.load() in a fused run left RSS 8.9 MiB higher for good: TensorFile.crc32 checked each tensor through an
8 MiB bytearray, whose free raised glibc's mmap threshold, so later buffers of that size came from the heap and
stayed resident (what tensor_file._fresh already avoided for the tensors). The buffer is a mapping of its own now.

On 745266e (before the fix) the test fails (8.9 MiB kept; 0.9 now):
    git worktree add /tmp/wt 745266e && cp tests/test_memory_promises_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider tests/test_memory_promises_hunt.py)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LOAD_MID_RUN = textwrap.dedent("""
    import gc, os, sys
    import numpy as np
    from tensorarena import nn, optim
    from tensorarena.memory.meter import rss_bytes
    from tensorarena.models import MLP, MLPConfig
    from tensorarena.train import Trainer

    rng = np.random.default_rng(0)
    model = MLP(MLPConfig(in_features=512, hidden=(2048, 2048), out_features=10), rng=rng)  # a 16 MiB weight
    x, y = rng.standard_normal((256, 512)).astype(np.float32), rng.integers(0, 10, 256)
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-4), nn.functional.cross_entropy, route="fused")
    for _ in range(3):
        trainer.step(x, y)
    path = os.path.join(sys.argv[1], "c.safetensors")
    trainer.save(path)
    gc.collect()
    before = rss_bytes()
    for _ in range(2):
        trainer.load(path)
        for _ in range(10):
            trainer.step(x, y)
    print((rss_bytes() - before) / 2**20)
""")


def test_a_load_mid_run_keeps_no_memory_after_it(tmp_path):
    done = subprocess.run([sys.executable, "-c", _LOAD_MID_RUN, str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    kept = float(done.stdout.split()[-1])
    assert kept < 3.0, f"two loads and 20 steps left RSS {kept:.2f} MiB above where it was before the first load"
