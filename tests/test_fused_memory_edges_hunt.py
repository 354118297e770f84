"""Fused-route and arena edges found by a hunt on 2026-12-06. Run against the commit before the one that added this
file (a worktree of it first on PYTHONPATH), every test failed but the controls said in them:
- the trace kept the forward's writes to plain attributes (a step counter ran one ahead of eager's), and the
  Python replay's own writes made every step count as a changed model: it traced every step, running the
  forward twice;
- a branch on the data that asks for the same buffers but holds one longer than the trace did overwrote it while
  it was read: a wrong loss and no error (now PlanMismatchError before anything is updated);
- an array's last reference dying in another thread (or in a garbage collection inside an allocation) changed
  the arena's free lists under the allocating thread: live arrays handed out twice;
- ArenaOutOfMemory named the arena's block size as the request.
"""

from __future__ import annotations

import queue
import sys
import threading

import numpy as np
import pytest

import tensorarena as ta
from tensorarena import nn, optim
from tensorarena.compile.trace import PlanMismatchError


class _Counting(nn.Module):
    """A warm-up the forward counts itself: its output depends on how often it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 3, dtype=np.float64)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.l(x) * min(1.0, self.calls / 10)


def _data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((5, 4)), rng.integers(0, 3, 5)


def test_the_trace_keeps_no_write_of_the_forward_and_one_trace_serves_every_step():
    x, y = _data()
    eager_model, fused_model = _Counting(), _Counting()
    fused_model.load_state_dict(eager_model.state_dict())
    eager_opt = optim.SGD(eager_model.parameters(), lr=0.1)
    fused = ta.compile_step(fused_model, nn.functional.cross_entropy, optim.SGD(fused_model.parameters(), lr=0.1),
                            (x, y))
    assert fused_model.calls == 0  # the trace's forward left nothing behind
    for i in range(4):
        with ta.Arena():
            loss = nn.functional.cross_entropy(eager_model(ta.Tensor(x)), y)
            eager_opt.zero_grad()
            loss.backward()
            eager_opt.step()
            want = loss.item()
        got = fused.step(x, y, index=i + 1)[0]
        assert abs(got - want) <= 1e-12
    assert fused_model.calls == eager_model.calls == 4 and fused.traces == 1
    np.testing.assert_allclose(fused_model.l.weight.data, eager_model.l.weight.data, rtol=0, atol=1e-12)


class _Branching(nn.Module):
    """Both branches ask for the same buffers; the positive one holds s1 past the point the other lets s2 go."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(4, 8, dtype=np.float64), nn.Linear(8, 3, dtype=np.float64)

    def forward(self, x):
        h = self.l1(x)
        hd = h.detach()
        if x[0, 0].item() > 0:
            s1 = hd * 2
            s3 = (s1 + 1) * 3
            s = s3 + s1
        else:
            s2 = hd * 2 + 1
            s3 = s2 * 3
            s = s3 + s2
        return self.l2(h * s)


def test_a_branch_that_holds_a_buffer_longer_than_its_trace_is_refused_not_miscomputed():
    x, y = _data()
    x[0, 0] = -1.0
    model = _Branching()
    fused = ta.compile_step(model, nn.functional.cross_entropy, optim.SGD(model.parameters(), lr=0.1), (x, y))
    with ta.Arena():
        want = nn.functional.cross_entropy(model(ta.Tensor(x)), y).item()
    assert abs(fused.step(x, y)[0] - want) <= 1e-12  # control: the traced branch replays
    before = [p.numpy() for p in model.parameters()]
    x[0, 0] = 1.0
    with pytest.raises(PlanMismatchError, match=r"still holds buffer #\d+ .* the trace had let #\d+ go"):
        fused.step(x, y)
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))  # nothing updated


def test_deaths_in_another_thread_do_not_corrupt_the_arena():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads as often as possible
    dropped: queue.Queue = queue.Queue(maxsize=64)
    stop = object()

    def drop():
        while dropped.get() is not stop:  # the array's last reference dies here, in this thread
            pass

    worker = threading.Thread(target=drop, daemon=True)
    worker.start()
    overwritten = 0
    try:
        with ta.Arena() as arena:
            held = []
            for it in range(30_000):
                keep = arena.alloc((it % 60 + 1,), np.float64)
                keep[...] = it
                held.append((it, keep))
                dropped.put(arena.alloc((it % 50 + 1,), np.float64))
                if len(held) == 20:
                    overwritten += sum(not (a == k).all() for k, a in held)
                    held.clear()
    finally:
        dropped.put(stop)
        worker.join()
        sys.setswitchinterval(previous)
    assert overwritten == 0


def test_arena_out_of_memory_names_the_request_and_the_block():
    pool = ta.BlockPool(budget=4 << 20)
    with ta.Arena(pool=pool) as arena:
        held = arena.alloc((4 << 20,), np.uint8)  # noqa: F841 - held: its block stays taken
        with pytest.raises(ta.ArenaOutOfMemory) as exc:
            arena.alloc((600 << 10,), np.uint8)
    assert exc.value.asked == 600 << 10 and exc.value.requested == 1 << 20
    assert "a 1.00 MiB (1048576 bytes) block for a request of 600.00 KiB (614400 bytes)" in str(exc.value)
