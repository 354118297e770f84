"""The streaming store on a nearly full or read-only disk, and after to_memory(): a helper agent's hunt.

1. On a disk a few pages short, io="map" (the default) killed the process with SIGBUS, no error, the state in
   memory lost: the stage files were made sparse (ftruncate), the free-space check counted bytes rather than the
   whole blocks they take, and the first write through the mapping found no block. The files are allocated now
   (posix_fallocate): no room is a StoreError before anything moves in.
2. After to_memory(), save() and evaluate() moved the state back into the store first: on a disk that went
   read-only (the case to_memory() is the way out of), nothing could be saved anywhere. They now read the model
   and the optimizer, which hold the state.
3. After to_memory() let go of the store's lock, another trainer could go on with the run in that directory; the
   first trainer's next step then moved its older state in over it, silently (steps 3 and 4 gone). Refused now.

On 8de4784 (before the fix) 4 of this file's 4 tests fail (io="map" by the child's SIGBUS, exit -7; io="copy" with
a bare OSError ENOSPC, from the write of a stage, where a StoreError now says what to do before anything moves):
    git worktree add /tmp/wt 8de4784 && cp tests/test_stream_store_robustness_hunt.py /tmp/wt/tests/ &&
    (cd /tmp/wt && PYTHONPATH=/tmp/wt python -m pytest -q -p no:cacheprovider \
        tests/test_stream_store_robustness_hunt.py)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensorarena import nn, optim
from tensorarena.models import ViT, ViTConfig
from tensorarena.stream.store import StoreError
from tensorarena.train import Trainer

CFG = ViTConfig(image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, num_heads=2)


def _trainer(store_dir, **kw) -> Trainer:
    model = ViT(CFG, rng=np.random.default_rng(0)).double()
    return Trainer(model, optim.AdamW(model.parameters(), lr=1e-2), nn.functional.cross_entropy,
                   route="streaming", store_dir=store_dir, **kw)


def _batches(n: int):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((4, 3, 8, 8)), rng.integers(0, 5, 4)) for _ in range(n)]


_NEARLY_FULL = textwrap.dedent("""
    import os, sys
    import numpy as np
    sys.path.insert(0, os.environ["TA_ROOT"])
    from tests.test_stream_store_robustness_hunt import _batches, _trainer
    mount, io = sys.argv[1], sys.argv[2]
    trainer = _trainer(os.path.join(mount, "store"), stream_io=io)
    free = os.statvfs(mount)
    with open(os.path.join(mount, "filler"), "wb") as f:  # 45 pages left: the bytes fit, the blocks do not
        f.write(b"x" * ((free.f_bavail - 45) * free.f_bsize))
    try:
        trainer.step(*_batches(1)[0])
        print("trained")
    except Exception as exc:
        print("refused:", type(exc).__name__, exc)
""")


@pytest.mark.parametrize("io", ["map", "copy"])
def test_a_store_on_a_nearly_full_disk_is_refused_not_killed(io, tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        done = subprocess.run([sys.executable, "-c", _NEARLY_FULL, str(mount), io], capture_output=True, text=True,
                              env={**os.environ, "TA_ROOT": root}, cwd=root, timeout=300)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7: killed by SIGBUS
    assert "refused: StoreError" in done.stdout and "Free space or pass another store_dir" in done.stdout


def test_save_and_evaluate_after_to_memory_read_memory_not_the_store(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path / "store")
    reference = _trainer(tmp_path / "reference")
    x_eval, y_eval = _batches(3)[2]
    for x, y in _batches(2):
        trainer.step(x, y)
        reference.step(x, y)
    trainer.stream.to_memory()
    from tensorarena.stream import route_moves

    def no_store(*args, **kwargs):  # the disk the store is on went read-only
        raise StoreError("cannot use the store: Read-only file system")

    monkeypatch.setattr(route_moves, "ParamStore", no_store)
    trainer.save(tmp_path / "elsewhere.st")
    assert trainer.evaluate(x_eval, y_eval) == pytest.approx(reference.evaluate(x_eval, y_eval), rel=1e-12)
    monkeypatch.undo()
    resumed = _trainer(tmp_path / "resumed")
    resumed.load(tmp_path / "elsewhere.st")
    x, y = _batches(4)[3]
    assert resumed.step(x, y).loss == pytest.approx(reference.step(x, y).loss, rel=1e-12)


def test_a_store_another_trainer_went_on_with_is_not_overwritten(tmp_path):
    store = tmp_path / "shared"
    batches = _batches(4)
    first = _trainer(store)
    first.step(*batches[0])
    first.step(*batches[1])
    first.stream.to_memory()  # the store stays at step 2, unlocked
    second = _trainer(store)  # goes on with the run there
    second.step(*batches[2])
    second.step(*batches[3])
    second.stream.close()
    with pytest.raises(StoreError, match="changed after to_memory"):
        first.step(*batches[2])
    assert json.loads((store / "manifest.json").read_text())["step"] == 4  # the other run's steps kept
    first.save(tmp_path / "first.st")  # and the first trainer's state is still there to keep
