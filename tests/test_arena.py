"""Arena and BlockPool semantics: routing, reuse, staleness, threads, budgets."""

import threading

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.memory.arena import empty
from tensorarena.memory.pool import MIN_BLOCK_BYTES, size_class


def test_innermost_arena_receives_allocations():
    pool = ta.BlockPool()
    x = ta.tensor(np.ones((8, 8)))
    with ta.Arena(pool=pool, name="outer") as outer:
        with ta.Arena(pool=pool, name="inner") as inner:
            assert ta.current_arena() is inner
            y = x * 2
            assert y._arena is inner
            assert inner.stats.allocations == 1
            assert outer.stats.allocations == 0
        assert ta.current_arena() is outer
        z = x + 1
        assert z._arena is outer and outer.stats.allocations == 1
    assert ta.current_arena() is None


def test_no_arena_means_heap():
    x = ta.tensor(np.ones(4))
    y = x + 1
    assert y._arena is None
    np.testing.assert_array_equal(y.numpy(), 2 * np.ones(4))


def test_blocks_released_by_nested_arena_are_reused():
    pool = ta.BlockPool()
    with ta.Arena(pool=pool, name="outer"):
        for step in range(5):
            with ta.Arena(pool=pool, name=f"step {step}") as a:
                a.alloc((1000,), np.float32)
                a.alloc((300_000,), np.float32)  # a second, dedicated 2 MiB block
                assert a.stats.blocks == 2
    # First step misses twice, every later step hits both size classes.
    assert pool.stats.misses == 2
    assert pool.stats.hits == 8
    assert pool.stats.bytes_in_use == 0
    assert pool.stats.bytes_cached == MIN_BLOCK_BYTES + size_class(1_200_000)


# Regression (fixed in Arena.close): blocks went back to the pool first to last, and the pool hands out the last
# one back first, so the next arena of the size bumped through the previous one's blocks in the other order: a
# streamed stage taking two blocks (vit-small, 224 x 224, batch 16) filled the second one, touched part-way, from
# its start, and from step 2 on both were wholly resident, 23 MiB over the route plan. Releasing them in the other
# order (for block in self._blocks) fails this test: the second arena gets [second block, first block].
def test_the_next_arena_gets_the_blocks_in_the_order_this_one_had_them():
    pool = ta.BlockPool()
    order = []
    for step in range(3):
        with ta.Arena(pool=pool, block_bytes=MIN_BLOCK_BYTES, name=f"stage {step}") as a:
            first = a.alloc((MIN_BLOCK_BYTES // 4,), np.float32)  # fills the first block
            second = a.alloc((MIN_BLOCK_BYTES // 16,), np.float32)  # a quarter of a second one
            order.append((first.ctypes.data, second.ctypes.data))
    assert pool.stats.misses == 2 and order[1] == order[2] == order[0]


def test_reset_makes_old_tensors_stale_and_reuses_memory():
    pool = ta.BlockPool()
    with ta.Arena(pool=pool) as a:
        t = ta.tensor(np.arange(4.0)) * 1
        first_address = t._data.ctypes.data
        a.reset()
        with pytest.raises(ta.StaleTensorError, match="reset"):
            t.numpy()
        with pytest.raises(ta.StaleTensorError):
            t + 1
        u = ta.tensor(np.arange(4.0)) * 1
        assert u._data.ctypes.data == first_address  # rewound, same memory
        assert a.stats.blocks == 1 and pool.stats.misses == 1
    with pytest.raises(ta.StaleTensorError, match="closed"):
        u.item()


def test_views_go_stale_with_their_source():
    with ta.Arena():
        base = ta.tensor(np.ones((2, 3))) + 0
        view = base.reshape(3, 2)
    with pytest.raises(ta.StaleTensorError):
        view.numpy()


def test_arena_stats_track_bytes_and_high_water():
    with ta.Arena(pool=ta.BlockPool()) as a:
        x = a.alloc((10,), np.float64)  # 80 bytes padded to 128
        y = a.alloc((16,), np.float32)  # 64 bytes
        assert a.stats.bytes_in_use == 192
        del x, y  # dead memory is no longer in use
        assert a.stats.bytes_in_use == 0
        assert a.stats.allocations == 2
        a.reset()
        assert a.stats.bytes_in_use == 0 and a.stats.high_water == 192
        assert a.stats.blocks == 1


def test_dead_memory_is_reused_within_the_scope_and_live_memory_never_is():
    with ta.Arena(pool=ta.BlockPool()) as a:
        x = a.alloc((256,), np.float32)
        keep = a.alloc((256,), np.float32)
        keep[:] = 7
        address = x.ctypes.data
        del x
        y = a.alloc((128,), np.float32)  # best fit: the dead 1 KiB chunk, not fresh memory
        assert y.ctypes.data == address
        view = y.reshape(2, 64)[1]
        del y  # a view keeps the allocation alive
        z = a.alloc((128,), np.float32)
        assert not np.shares_memory(z, view) and z.ctypes.data != address
        z[:] = 1
        view[:] = 2
        assert (keep == 7).all() and (z == 1).all()
        assert a.stats.high_water == 2 * 1024  # y and z both came out of x's dead kilobyte


def test_the_high_water_of_a_chain_of_temporaries_is_what_is_alive_at_once():
    # y = (y + 1) * 0.5, twenty times, with no graph: each intermediate dies after the next op, so
    # at most three 4 MiB arena arrays are alive at once (old y, y + 1 and the new y).
    x = ta.tensor(np.ones((1024, 1024), np.float32))
    with ta.no_grad(), ta.Arena(pool=ta.BlockPool()) as a:
        y = x
        for _ in range(20):
            y = (y + 1.0) * 0.5
        assert np.allclose(y.numpy(), 1.0, atol=1e-5)
        assert a.stats.high_water == 3 * 4 * 2**20  # a bump allocator would hold 40 x 4 MiB


def test_allocations_are_aligned_and_disjoint():
    with ta.Arena(pool=ta.BlockPool()) as a:
        arrays = [a.alloc((n,), np.float32) for n in (1, 7, 33, 1000)]
        for arr in arrays:
            assert arr.ctypes.data % 64 == 0
        for i, arr in enumerate(arrays):
            arr[:] = i
        for i, arr in enumerate(arrays):
            assert (arr == i).all()


def test_arenas_are_per_thread():
    seen = {}
    with ta.Arena(name="main thread") as main_arena:
        def worker():
            seen["before"] = ta.current_arena()
            with ta.Arena(name="worker") as w:
                seen["inside"] = ta.current_arena() is w
                seen["tensor_arena"] = (ta.tensor(np.ones(3)) + 1)._arena is w
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert ta.current_arena() is main_arena
    assert seen == {"before": None, "inside": True, "tensor_arena": True}


def test_pool_is_thread_safe_under_concurrent_arenas():
    pool = ta.BlockPool()
    errors = []

    def worker(k):
        try:
            for _ in range(50):
                with ta.Arena(pool=pool) as a:
                    arr = a.alloc((1000 + k,), np.float32)
                    arr[:] = k
                    assert (arr == k).all()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.stats.bytes_in_use == 0
    assert pool.stats.hits + pool.stats.misses == 200


def test_budget_breach_raises_with_details_and_recovers():
    pool = ta.BlockPool(budget=4 * MIN_BLOCK_BYTES)
    with ta.Arena(pool=pool, name="step") as a:
        a.alloc((1000,), np.float32)  # one 1 MiB block
        with pytest.raises(ta.ArenaOutOfMemory) as info:
            a.alloc((MIN_BLOCK_BYTES,), np.float32)  # needs a 4 MiB block: 5 MiB > 4 MiB budget
        err = info.value
        assert isinstance(err, MemoryError)
        assert err.requested == 4 * MIN_BLOCK_BYTES and err.budget == 4 * MIN_BLOCK_BYTES
        assert err.in_use == MIN_BLOCK_BYTES
        message = str(err)
        assert "4194304 bytes" in message and "1048576 bytes" in message and "budget" in message
        # The arena is still usable after the failed request.
        small = a.alloc((100,), np.float32)
        small[:] = 1.0
        assert a.stats.blocks == 1
    # Once the step arena is closed, the same request fits (the cached block is evicted).
    with ta.Arena(pool=pool) as b:
        b.alloc((MIN_BLOCK_BYTES,), np.float32)
    assert pool.stats.evictions == 1


def test_heap_scope_bypasses_the_open_arena():
    with ta.Arena() as a:
        with ta.heap_scope():
            assert ta.current_arena() is None
            kept = empty((4,), np.float32)
        assert ta.current_arena() is a
    kept[:] = 3.0  # still valid after the arena closed
    assert a.stats.allocations == 0


def test_backward_refuses_saved_tensors_of_an_arena_that_ended():
    """An output made under heap_scope() outlives the arena its inputs came from; backward read their memory after
    another arena had taken it: w.grad was 600 here instead of 18, with no error, before the saved
    records held each tensor's arena and generation (autograd.saved_versions); this test failed then."""
    pool = ta.BlockPool()
    w = ta.tensor(np.ones((4, 4), np.float32), requires_grad=True)
    with ta.Arena(pool=pool):
        h = w * 3.0  # arena memory, saved by the product below
        with ta.heap_scope():
            out = (h * h).sum()
    assert out._arena is None  # the root itself is readable: only its graph's saved memory is stale
    with ta.Arena(pool=pool):
        junk = ta.tensor(np.ones((4, 4), np.float32)) * 100.0  # takes the block back
        assert np.shares_memory(junk._data, h._data)
        with pytest.raises(ta.StaleTensorError, match=r"backward of 'mul' reads a float32 tensor of shape \(4, 4\)"
                           r".*closed"):
            out.backward()
    assert w.grad is None  # nothing accumulated from the stale memory

    # The same graph with backward() before the arena ends is the gradient torch gives (2 * 3 * 3w = 18).
    with ta.Arena(pool=pool):
        h = w * 3.0
        with ta.heap_scope():
            out = (h * h).sum()
        out.backward()
    np.testing.assert_allclose(w.grad, np.full((4, 4), 18.0), rtol=0, atol=0)


def test_closed_arena_cannot_be_reentered():
    a = ta.Arena()
    with a:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        with a:
            pass


def test_budget_validation():
    with pytest.raises(ValueError, match="positive"):
        ta.BlockPool(budget=None).set_budget(0)


def test_best_fit_from_the_size_index_matches_a_scan_of_every_dead_chunk():
    # The arena finds its best fit by bisecting a (size, block, start) index kept beside the
    # per-block address lists; here a brute-force scan of those lists predicts every choice over
    # a random mix of sizes and lifetimes, and the index always equals the lists.
    rng = np.random.default_rng(0)
    with ta.Arena(pool=ta.BlockPool(), block_bytes=1 << 16) as a:
        live, reused = [], 0
        for _ in range(3000):
            if live and rng.random() < 0.45:
                live.pop(int(rng.integers(len(live))))
            else:
                nbytes = int(rng.choice([64, 128, 192, 1024, 4096, 12288])) * int(rng.integers(1, 4))
                fits = [(size, block, start) for block, chunks in a._free.items() for start, size in chunks
                        if size >= nbytes]
                arr = a.alloc((nbytes // 4,), np.float32)
                if fits:
                    _, block, start = min(fits)
                    base = np.frombuffer(a._bytes[block], np.uint8)
                    assert arr.ctypes.data == base.ctypes.data + start
                    reused += 1
                arr[:] = len(live)
                live.append(arr)
            assert a._by_size == sorted((size, block, start) for block, chunks in a._free.items()
                                        for start, size in chunks)
        assert reused > 500
        for i, arr in enumerate(live):  # nothing handed out twice
            arr[:] = i
        assert all((arr == i).all() for i, arr in enumerate(live))
