"""The streaming store's io="map" (stage files memory-mapped into the slots, the default) against
io="copy" (read into slot buffers): the same training to the bit, no mapping left behind, and a
kill while a mapped stage is being updated is caught by the journal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.nn.functional import cross_entropy
from tensorarena.stream import StoreError, StreamingRoute
from tests.test_streaming import _batches, _setup, killed_mid_step_then_resumed


def _train(tmp_path: Path, io: str, steps: int, **route_kw):
    ta.manual_seed(0)
    model, optimizer, sched = _setup(depth=3, dropout=0.1)
    losses, stats, mapped = [], [], []
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / io, scheduler=sched, io=io,
                                    **route_kw) as route:
        assert route.store.io == io
        for x, y in _batches(steps):
            losses.append(route.step(x, y))
            stats.append((route.last_stats.bytes_read, route.last_stats.bytes_written))
            mapped.append(route.store.mapped_stages())
        late = route.store.late_unmaps
        route.to_memory()
    return model, optimizer, losses, stats, mapped, late


def test_mapped_and_copied_stores_train_bit_for_bit_alike_and_leave_nothing_mapped(tmp_path):
    m_map, o_map, l_map, s_map, mapped, late = _train(tmp_path, "map", 6)
    m_copy, o_copy, l_copy, s_copy, _, _ = _train(tmp_path, "copy", 6)
    assert l_map == l_copy and l_map[-1] < l_map[0]
    for (name, a), (_, b) in zip(m_map.named_parameters(), m_copy.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    for (pa, sa), (pb, sb) in zip(o_map.state.items(), o_copy.state.items()):
        for kind in sa:
            np.testing.assert_array_equal(np.asarray(sa[kind]), np.asarray(sb[kind]), err_msg=kind)
    assert s_map == s_copy  # the same bytes brought in and written back per step
    # Between steps no stage stays mapped, and every mapping was closed when its slot was released
    # (an array over it left alive would have kept it: late_unmaps counts those).
    assert mapped == [[]] * 6 and late == 0


def test_durable_mapped_stores_flush_and_resume(tmp_path):
    model, optimizer, losses, _, _, late = _train(tmp_path, "map", 3, durable=True)
    assert late == 0
    ta.manual_seed(0)
    fresh, opt, sched = _setup(depth=3, dropout=0.1)
    with StreamingRoute.resume(fresh, opt, cross_entropy, tmp_path / "map", scheduler=sched) as route:
        assert route.step_count == 3
        route.to_memory()
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


def test_io_mode_and_slot_misuse_get_clear_errors(tmp_path):
    model, optimizer, sched = _setup()
    with pytest.raises(ValueError, match=r"io must be one of \('map', 'copy'\), got 'mmap'"):
        StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / "a", io="mmap")
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / "b") as route:
        store = route.store
        with pytest.raises(StoreError, match="slot 0 holds nothing, not stage 1: read"):
            store.views(0, 1)
        store.read(1, 0, params_only=True).result()
        views = store.views(0, 1)
        assert views.state is None and len(views.params) == len(route.stages[1].params)
        del views
        with pytest.raises(StoreError, match="does not hold all of it"):
            store.write(1, 0, None)


def test_a_kill_while_a_mapped_stage_is_updated_is_refused(tmp_path):
    # The update changes the stage file itself, so "writing" must be journaled before it starts.
    # Without store.begin_write (checked by deleting its call in stream/sweep.py) the journal of
    # this kill says nothing is being written, and resume silently continued from step 1 with
    # the head's weights already at step 2.
    killed_mid_step_then_resumed(tmp_path, """
        assert route.store.io == "map"
        real = optim_state.update
        def update_then_die(*args):
            real(*args)  # the head's file now holds step 2's update
            os.kill(os.getpid(), signal.SIGKILL)
        optim_state.update = update_then_die
    """, "interrupted while writing stage 'head' of step 2")


def test_a_stage_to_update_is_prefaulted_writable_and_a_kernel_without_it_is_reported(tmp_path, monkeypatch, caplog):
    from tensorarena.stream import store_io  # StageIO._map reads MADV_POPULATE_WRITE there

    _, _, losses, _, _, _ = _train(tmp_path / "write", "map", 2)
    model, optimizer, sched = _setup()
    with StreamingRoute.from_memory(model, optimizer, cross_entropy, tmp_path / "w") as route:
        route.step(*_batches(1)[0])
        assert route.store.populate == "write"  # this machine's kernel (>= 5.14) has MADV_POPULATE_WRITE
    # A kernel that refuses the advice (an unknown one stands in for it) trains the same, slower, and says so.
    monkeypatch.setattr(store_io, "MADV_POPULATE_WRITE", 9999)
    with caplog.at_level("WARNING", logger="tensorarena"):
        _, _, refused, _, _, _ = _train(tmp_path / "faults", "map", 2)
    assert refused == losses
    assert "MADV_POPULATE_WRITE) failed" in caplog.text and "page fault at the first write" in caplog.text
