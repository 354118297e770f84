"""Memory the plans promise, after a load mid-run (a helper agent's hunt of the memory promises).

Trainer.load() in a fused run left RSS 8.9 MiB higher for good: TensorFile.crc32 checked each tensor through an
8 MiB bytearray, whose free raised glibc's mmap threshold, so later buffers of that size came from the heap and
stayed resident (what tensor_file._fresh already avoided for the tensors). The buffer is a mapping of its own now.
And FusedStep.plan_for evicted the oldest plan (max_plans) only after tracing the new one.

On 745266e (before the fixes) both tests fail (8.9 MiB kept, 0.9 now; plans alive while tracing [1, 2, 2, 2]):
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


def test_a_new_signature_at_max_plans_is_traced_after_the_oldest_plan_goes():
    # Evicted after the trace, the oldest plan's slab was held while the new one was traced: max_plans=2 over five
    # shapes peaked at 113 MiB against a 77 MiB report. The plans alive while a trace runs are now max_plans - 1.
    import numpy as np

    from tensorarena import nn, optim
    from tensorarena.models import MLP, MLPConfig
    from tensorarena.train import Trainer

    model = MLP(MLPConfig(in_features=8, hidden=(16,), out_features=3), rng=np.random.default_rng(0))
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy, route="fused",
                      max_plans=2)
    rng = np.random.default_rng(1)
    trainer.step(rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 3, 4))
    fused, held_while_tracing = trainer.fused, []
    real_trace = fused._trace

    def trace(inputs, targets, sig):
        held_while_tracing.append(len(fused.plans))
        return real_trace(inputs, targets, sig)

    fused._trace = trace
    for rows in (5, 6, 7, 8):
        trainer.step(rng.standard_normal((rows, 8)).astype(np.float32), rng.integers(0, 3, rows))
    assert held_while_tracing == [1, 1, 1, 1] and len(fused.plans) == 2
