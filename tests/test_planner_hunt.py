"""Bug hunt on memory placement: the liveness planner, the trace's lifetimes, the step arena, the block pool.

A wrong placement silently corrupts training, so every check here is exact: no two buffers alive at once share
a byte, offsets are ALIGN multiples, the slab is what the plan says and at least the live peak, the arena's
high-water is the most bytes it held, pool counters return to zero, a budget breach raises ArenaOutOfMemory
naming its numbers. End to end, a real traced step (MLP, tiny ViT, small BERT) is checked against its recorded
lifetimes, then replayed on a slab poisoned with NaN before each step (a buffer read before it is written would
show), and on a Python replay that poisons each buffer the moment its recorded life ends (a buffer read after
its recorded death would show).

2 of these 25 tests failed on 0f5d7c3 (each under a "Regression (fixed)" comment). With this file copied into a
worktree of 0f5d7c3 (git worktree add /tmp/old 0f5d7c3), run in /tmp/old:
`NUMBA_NUM_THREADS=1 timeout 900 python -m pytest -q -p no:cacheprovider tests/test_planner_hunt.py`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorarena as ta
from tensorarena import optim
from tensorarena.compile import BufferSpec, compile_step, plan_memory
from tensorarena.compile import step as step_module
from tensorarena.compile.trace import TracingArena
from tensorarena.memory.arena import Arena, empty
from tensorarena.memory.pool import ALIGN, ArenaOutOfMemory, BlockPool, size_class
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn import Linear, Module
from tensorarena.nn.functional import cross_entropy

MiB = 1 << 20
HYP = dict(deadline=None, database=None, derandomize=True,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# -- the planner ------------------------------------------------------------------------------------------

def _check_plan(plan, buffers):
    """Every promise of plan_memory, checked from first principles (not with the planner's own helpers)."""
    by_name = {b.name: b for b in buffers}
    assert set(plan.offsets) == set(by_name)
    end = 0
    for b in buffers:
        off = plan.offsets[b.name]
        assert isinstance(off, int) and off >= 0
        assert off % ALIGN == 0, (b, off)
        assert off + b.nbytes <= plan.slab_bytes, (b, off, plan.slab_bytes)
        end = max(end, off + _aligned(b.nbytes))
    # Live buffers never share a byte, nor their alignment padding (the next one may start right after it).
    items = sorted(buffers, key=lambda b: plan.offsets[b.name])
    for i, a in enumerate(items):
        a0 = plan.offsets[a.name]
        for b in items[i + 1:]:
            b0 = plan.offsets[b.name]
            if b0 >= a0 + _aligned(a.nbytes):
                break
            if a.nbytes == 0 or b.nbytes == 0:
                continue
            assert a.last < b.first or b.last < a.first, f"{a} @ {a0} and {b} @ {b0} share bytes while both live"
    # The slab is exactly what the placement needs, and at least the live peak (brute force over every step).
    assert plan.slab_bytes == end
    times = sorted({t for b in buffers for t in (b.first, b.last)})
    peak = max((sum(_aligned(b.nbytes) for b in buffers if b.first <= t <= b.last) for t in times), default=0)
    assert plan.peak_live_bytes == peak
    assert peak <= plan.slab_bytes <= plan.naive_bytes == sum(_aligned(b.nbytes) for b in buffers)
    assert plan.saved_bytes == plan.naive_bytes - plan.slab_bytes >= 0
    assert plan.specs == by_name


_sizes = st.one_of(st.integers(0, 300), st.sampled_from([1, 63, 64, 65, 127, 128, 4096, 4097]),
                   st.integers(1, 200_000))
_lifetimes = st.lists(st.tuples(_sizes, st.integers(-5, 40), st.integers(0, 25)), min_size=0, max_size=60).map(
    lambda xs: [BufferSpec(f"b{i}", n, f, f + d) for i, (n, f, d) in enumerate(xs)])


@settings(max_examples=250, **HYP)
@given(_lifetimes)
def test_random_lifetimes_place_without_overlap_aligned_and_slab_is_exact(buffers):
    _check_plan(plan_memory(buffers), buffers)


@settings(max_examples=80, **HYP)
@given(_lifetimes, st.randoms(use_true_random=False))
def test_placement_does_not_depend_on_the_order_buffers_are_given(buffers, rnd):
    shuffled = list(buffers)
    rnd.shuffle(shuffled)
    a, b = plan_memory(buffers), plan_memory(shuffled)
    _check_plan(b, shuffled)
    assert a.offsets == b.offsets and a.slab_bytes == b.slab_bytes


def test_training_shaped_lifetimes_overlap_nowhere():
    # A "V": activation i lives from forward step i to backward step 2L-i; its gradient is born there.
    rng = np.random.default_rng(5)
    L = 30
    buffers = []
    for i in range(L):
        n = int(rng.integers(1, 5000))
        buffers += [BufferSpec(f"a{i}", n, i, 2 * L - i), BufferSpec(f"g{i}", n, 2 * L - i, 2 * L - i + 1),
                    BufferSpec(f"t{i}", int(rng.integers(0, 300)), i, i)]
    _check_plan(plan_memory(buffers), buffers)


def test_a_chain_fits_in_two_slots_and_one_step_buffers_reuse_at_the_next_step():
    buffers = [BufferSpec(f"x{i}", 1000, i, i + 1) for i in range(8)] + [BufferSpec("end", 1000, 9, 9)]
    plan = plan_memory(buffers)
    _check_plan(plan, buffers)
    assert plan.slab_bytes == 2 * _aligned(1000)


def test_a_buffer_is_live_on_its_last_step_inclusive():
    # [0, 3] and [3, 5] meet at step 3: they must not share; [4, 5] may reuse [0, 3].
    buffers = [BufferSpec("a", 640, 0, 3), BufferSpec("b", 640, 3, 5), BufferSpec("c", 640, 4, 5)]
    plan = plan_memory(buffers)
    _check_plan(plan, buffers)
    assert plan.offsets["a"] != plan.offsets["b"]
    assert plan.slab_bytes == 2 * 640


# -- the trace's lifetimes -----------------------------------------------------------------------------------

def test_tracer_records_death_at_the_allocation_after_the_last_view_goes():
    with TracingArena() as tracer:
        a = empty((100,), np.float32)  # 0
        view = a[10:20]
        b = empty((50,), np.float64)  # 1
        del a  # the view keeps it
        c = empty((7,), np.int64)  # 2
        del view  # a dies here: allocations 0..2 were made
        d = empty((100,), np.float32)  # 3: may take a's bytes
        big = empty((40_000,), np.float32)  # 4: an mmap'd buffer
        big2 = big.reshape(200, 200)[::2]
        del big
        e = empty((3,), np.float32)  # 5
        del big2, b
        f = empty((1,), np.uint8)  # 6
        del c, d, e, f
    tracer.finish()
    specs = {int(s.name): s for s in tracer.lifetimes()}
    assert [(s.first, s.last) for _, s in sorted(specs.items())] == [
        (0, 2), (1, 5), (2, 6), (3, 6), (4, 5), (5, 6), (6, 6)]
    assert [s.nbytes for _, s in sorted(specs.items())] == [400, 400, 56, 400, 160_000, 12, 1]


# -- the step arena ----------------------------------------------------------------------------------------

_arena_ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.one_of(st.integers(0, 5000), st.integers(5000, 700_000)),
              st.sampled_from(["u1", "f4", "f8", "i8", "f2"])),
    st.tuples(st.just("free"), st.integers(0, 1 << 30), st.just("")),
    st.tuples(st.just("free_all_but"), st.integers(0, 3), st.just("")),
    st.tuples(st.just("reset"), st.just(0), st.just("")),
), min_size=1, max_size=80)


def _padded(nbytes: int) -> int:
    return _aligned(nbytes) or ALIGN


def _check_live(live):
    """No two live arrays share a byte (their padding included), each starts on ALIGN and keeps its stamp."""
    spans = sorted((arr.ctypes.data, _padded(arr.nbytes), stamp, arr) for arr, stamp in live.values())
    for (s0, n0, _, _), (s1, _, _, _) in zip(spans, spans[1:]):
        assert s0 + n0 <= s1, "two live arena allocations overlap"
    for start, _, stamp, arr in spans:
        assert start % ALIGN == 0
        assert np.all(arr.view(np.uint8) == stamp), "a live allocation was overwritten"


@settings(max_examples=120, **HYP)
@given(_arena_ops)
def test_random_alloc_free_reset_sequences_keep_the_arena_exact(ops):
    pool = BlockPool()
    live: dict[int, tuple[np.ndarray, int]] = {}
    key = 0
    in_use = high = 0
    with Arena(pool=pool, name="hunt") as arena:
        for kind, n, dtype in ops:
            if kind == "alloc":
                dt = np.dtype(dtype)
                arr = arena.alloc((n // dt.itemsize,), dt)
                assert arr.dtype == dt and arr.shape == (n // dt.itemsize,)
                stamp = key % 251 + 1
                arr.view(np.uint8)[...] = stamp
                live[key] = (arr, stamp)
                key += 1
                in_use += _padded(arr.nbytes)
            elif kind == "free" and live:
                k = sorted(live)[n % len(live)]
                arr, _ = live.pop(k)
                in_use -= _padded(arr.nbytes)
                del arr
            elif kind == "free_all_but":
                for k in sorted(live)[n:]:
                    arr, _ = live.pop(k)
                    in_use -= _padded(arr.nbytes)
                    del arr
            elif kind == "reset":
                arena.reset()
                live.clear()
                in_use = 0
            high = max(high, in_use)
            assert arena.stats.bytes_in_use == in_use
            assert arena.stats.high_water == high
            _check_live(live)
            assert pool.stats.bytes_in_use == sum(b.nbytes for b in arena._blocks)
    live.clear()
    assert pool.stats.bytes_in_use == 0
    assert pool.stats.bytes_cached == pool.stats.peak_bytes
    assert arena.stats.bytes_in_use == 0 and arena.stats.blocks == 0


def test_steady_steps_reuse_freed_bytes_and_keep_the_same_high_water():
    pool = BlockPool()
    highs = []
    for _ in range(4):
        with Arena(pool=pool) as a:
            keep = [a.alloc((1000,), np.float32) for _ in range(3)]
            for _ in range(50):  # temporaries that die at once: reused, not stacked
                t = a.alloc((2000,), np.float32)
                del t
            del keep
            highs.append(a.stats.high_water)
    assert highs == [3 * 4032 + 8000] * 4
    assert pool.stats.misses == 1 and pool.stats.bytes_in_use == 0


def test_nested_arenas_return_every_block_to_the_pool():
    pool = BlockPool()
    with Arena(pool=pool) as outer:
        x = outer.alloc((10,), np.float32)
        for _ in range(3):
            with Arena(pool=pool) as inner:
                inner.alloc((3 * MiB // 4,), np.float32)  # a 4 MiB class block
                inner.alloc((10,), np.float32)  # fits in the same block's last MiB
                assert pool.stats.bytes_in_use == MiB + 4 * MiB and inner.stats.blocks == 1
            assert pool.stats.bytes_in_use == MiB
        del x
    assert pool.stats.bytes_in_use == 0 and pool.stats.misses == 2 and pool.stats.hits == 2


# -- the pool and its budget -------------------------------------------------------------------------------

_pool_ops = st.lists(st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from([1, MiB, MiB + 1, 2 * MiB, 3 * MiB, 5 * MiB])),
    st.tuples(st.just("release"), st.integers(0, 100)),
    st.tuples(st.just("trim"), st.just(0)),
), min_size=1, max_size=50)


@settings(max_examples=150, **HYP)
@given(st.integers(2, 12), _pool_ops)
def test_random_pool_sequences_keep_counts_and_enforce_the_budget(budget_mib, ops):
    budget = budget_mib * MiB
    pool = BlockPool(budget=budget)
    held = []
    cached: dict[int, int] = {}
    for kind, arg in ops:
        if kind == "acquire":
            size = size_class(arg)
            in_use = sum(b.nbytes for b in held)
            if cached.get(size):
                block = pool.acquire(arg)
                cached[size] -= 1
            elif in_use + size > budget:
                with pytest.raises(ArenaOutOfMemory) as info:
                    pool.acquire(arg)
                err = info.value
                assert isinstance(err, MemoryError)
                assert (err.requested, err.budget, err.in_use, err.cached) == (size, budget, in_use,
                                                                              sum(s * c for s, c in cached.items()))
                assert str(size) in str(err) and str(budget) in str(err)
                continue
            else:
                block = pool.acquire(arg)
                # evicted until what is cached fits beside the new block
                while sum(s * c for s, c in cached.items()) + in_use + size > budget:
                    biggest = max(s for s, c in cached.items() if c)
                    cached[biggest] -= 1
            assert block.nbytes == size and block.buffer.nbytes == size and block.buffer.ctypes.data % ALIGN == 0
            held.append(block)
        elif kind == "release" and held:
            block = held.pop(arg % len(held))
            pool.release(block)
            cached[block.nbytes] = cached.get(block.nbytes, 0) + 1
        elif kind == "trim":
            pool.trim()
            cached.clear()
        in_use = sum(b.nbytes for b in held)
        cached_bytes = sum(s * c for s, c in cached.items())
        assert pool.stats.bytes_in_use == in_use
        assert pool.stats.bytes_cached == cached_bytes
        assert in_use + cached_bytes <= budget
        assert pool.stats.peak_bytes <= budget
    for block in held:
        pool.release(block)
    assert pool.stats.bytes_in_use == 0


def test_an_arena_over_budget_raises_with_the_numbers_and_smaller_requests_still_fit():
    pool = BlockPool(budget=3 * MiB)
    with Arena(pool=pool) as a:
        x = a.alloc((100,), np.float32)
        y = a.alloc((MiB // 8,), np.float32)  # 512 KiB: same block
        with pytest.raises(ArenaOutOfMemory, match="budget") as info:
            a.alloc((2 * MiB,), np.float32)  # 8 MiB class
        assert (info.value.requested, info.value.budget, info.value.in_use) == (8 * MiB, 3 * MiB, MiB)
        assert "3.00 MiB" in str(info.value) and "8.00 MiB" in str(info.value)
        z = a.alloc((100,), np.float32)  # still fits where it did
        assert a.stats.blocks == 1 and pool.stats.bytes_in_use == MiB
        x[:] = 1
        z[:] = 2
        assert np.all(x == 1) and not np.shares_memory(x, z) and not np.shares_memory(y, z)
    assert pool.stats.bytes_in_use == 0


# Regression (fixed): the arena abandons the tail of a block as soon as one request does not fit in it: _reserve
# (arena.py:186, the `self._block_index += 1; self._offset = 0` loop) moves the bump pointer to a new block and never
# returns, and the tail is in no free list. Here 448 bytes are used of the first 1 MiB block, a 1 MiB request takes a
# second block, and a 400-byte request then needs a THIRD block although ~1 MiB of the first is free: under a 2 MiB
# budget it raises ArenaOutOfMemory with 1 MiB + 448 bytes live. Expected: the small request fits in the first block's
# tail (put the abandoned tail on the free list, `_free[old_block]`, when the pointer moves on).
def test_a_small_request_after_a_block_change_uses_the_first_blocks_free_tail():
    pool = BlockPool(budget=2 * MiB)
    with Arena(pool=pool) as a:
        x = a.alloc((100,), np.float32)
        y = a.alloc((MiB // 4,), np.float32)  # exactly 1 MiB: a second block
        z = a.alloc((100,), np.float32)  # raises ArenaOutOfMemory today
        assert a.stats.blocks == 2 and pool.stats.bytes_in_use == 2 * MiB
        assert not np.shares_memory(x, z) and not np.shares_memory(y, z)


# Regression (fixed): a budget lowered with set_budget is not enforced on a cache hit. BlockPool.acquire serves a
# cached block before looking at the budget (pool.py:116 acquire: `if free: ... return block` precedes the budget
# check), so with 4 MiB cached and the budget set to 2 MiB, acquiring 4 MiB succeeds and 4 MiB are in use under a 2
# MiB budget; set_budget itself evicts nothing either. Expected: ArenaOutOfMemory (the cached block is dropped, not
# handed out).
def test_a_lowered_budget_is_enforced_on_a_cache_hit_too():
    pool = BlockPool()
    pool.release(pool.acquire(4 * MiB))
    pool.set_budget(2 * MiB)
    with pytest.raises(ArenaOutOfMemory):
        block = pool.acquire(4 * MiB)
        pool.release(block)
    assert pool.stats.bytes_in_use <= 2 * MiB


# -- end to end: real traced steps -------------------------------------------------------------------------

def _mlp():
    return MLP(MLPConfig(in_features=12, hidden=(32, 16), out_features=4), rng=np.random.default_rng(0))


def _mlp_batches(n=4, batch=16):
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((batch, 12)).astype(np.float32), rng.integers(0, 4, batch)) for _ in range(n)]


def _vit():
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, num_heads=4)
    return ViT(cfg, rng=np.random.default_rng(0))


def _vit_batches(n=3, batch=4):
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        out.append((x, (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64)))
    return out


class _Bert(Module):
    """A small BERT with a classifier head over (B, 2, T) int64 input: ids and attention mask packed together."""

    def __init__(self) -> None:
        from tensorarena.models.bert import BertConfig, BertModel

        super().__init__()
        config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1)
        self.bert = BertModel(config, rng=np.random.default_rng(0))
        self.head = Linear(32, 3, rng=np.random.default_rng(1))

    def forward(self, x):
        hidden = self.bert(x.data[:, 0], attention_mask=x.data[:, 1])  # (B, T, hidden)
        return self.head(hidden[:, 0])


def _bert_batches(n=3, batch=4, tokens=8):
    rng = np.random.default_rng(3)
    out = []
    for _ in range(n):
        ids = rng.integers(1, 50, (batch, tokens))
        mask = np.ones((batch, tokens), np.int64)
        for row in range(batch):
            mask[row, tokens - 1 - row:] = 0
        ids[mask == 0] = 0
        out.append((np.stack([ids, mask], axis=1), rng.integers(0, 3, batch)))
    return out


MODELS = {
    "mlp": (_mlp, _mlp_batches, lambda m: optim.AdamW(m.parameters(), lr=1e-2)),
    "vit": (_vit, _vit_batches, lambda m: optim.AdamW(m.parameters(), lr=2e-3)),
    "bert": (_Bert, _bert_batches, lambda m: optim.AdamW(m.parameters(), lr=1e-3)),
}


def _lifetime(b, n):
    return b.index, (n - 1 if b.death is None else max(b.index, b.death - 1))


def _check_step_plan(plan):
    """The plan's views against the recorded lifetimes (TracedBuffer.death), not against the planner's specs."""
    n = len(plan.buffers)
    assert n > 0 and len(plan.views) == n
    slab0 = plan.slab.ctypes.data
    assert slab0 % ALIGN == 0 and plan.slab.nbytes >= plan.memory.slab_bytes
    spans = []
    for b, v in zip(plan.buffers, plan.views):
        assert v.shape == b.shape and v.dtype == b.dtype and v.nbytes == b.nbytes
        assert v.flags.c_contiguous and v.flags.writeable
        start = v.ctypes.data - slab0
        assert start % ALIGN == 0 and 0 <= start and start + b.nbytes <= plan.memory.slab_bytes
        assert start == plan.memory.offsets[str(b.index)]
        assert np.shares_memory(v, plan.slab) or b.nbytes == 0
        spans.append((start, start + b.nbytes, b))
    spans.sort(key=lambda s: s[0])
    clashes = []
    for i, (s0, e0, a) in enumerate(spans):
        for s1, e1, b in spans[i + 1:]:
            if s1 >= e0:
                break
            if s1 == e1 or s0 == e0:
                continue
            fa, la = _lifetime(a, n)
            fb, lb = _lifetime(b, n)
            if not (la < fb or lb < fa):
                clashes.append((a.index, a.op, (fa, la), b.index, b.op, (fb, lb)))
    assert not clashes, f"{len(clashes)} live buffer pairs share bytes, e.g. {clashes[:3]}"
    # The slab is at least the most bytes alive at one allocation, by the recorded lifetimes.
    live = [0] * (n + 1)
    for b in plan.buffers:
        f, last = _lifetime(b, n)
        live[f] += _aligned(b.nbytes)
        live[last + 1] -= _aligned(b.nbytes)
    assert plan.memory.slab_bytes >= max(np.cumsum(live)) == plan.memory.peak_live_bytes


def _poison(a: np.ndarray) -> None:
    if a.dtype.kind in "fc":
        a.fill(np.nan)
    else:
        a.reshape(-1).view(np.uint8).fill(0xA5)


def _run(name, replay, steps, *, poison_slab=False, poison_at_death=False, monkeypatch=None):
    make_model, make_batches, make_opt = MODELS[name]
    ta.manual_seed(7)  # dropout seeds: both runs draw the same ones
    model = make_model()
    opt = make_opt(model)
    batches = make_batches()
    fused = compile_step(model, cross_entropy, opt, batches[0], replay=replay)
    if poison_at_death:
        monkeypatch.setattr(step_module, "PlannedArena", _PoisonAtDeath)
    losses = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        plan = fused.plan_for(x, y)
        if poison_slab:
            whole = plan.slab.nbytes // 4 * 4
            plan.slab[:whole].view(np.float32).fill(np.nan)
        loss, _, skipped, _ = fused.step(x, y, index=i)
        assert not skipped
        losses.append(loss)
    params = [p.data.copy() for p in model.parameters()]
    ran = "captured" if fused.plan.capture is not None and fused.plan.capture.tape is not None else "python"
    return fused, losses, params, ran


class _PoisonAtDeath(step_module.PlannedArena):
    """A Python replay's arena that poisons each buffer as its recorded life ends (before the allocation at which
    the trace saw it die): a buffer read after its recorded death, i.e. a lifetime recorded too short, shows."""

    def __init__(self, plan, name):
        super().__init__(plan, name)
        self._dying: dict[int, list[int]] = {}
        for b in plan.buffers:
            if b.death is not None:
                self._dying.setdefault(b.death, []).append(b.index)

    def alloc(self, shape, dtype):
        for j in self._dying.get(self.cursor, ()):
            _poison(self.plan.views[j])
        return super().alloc(shape, dtype)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_traced_step_plans_never_place_two_live_buffers_on_the_same_bytes(name):
    fused, _, _, _ = _run(name, "python", 0)
    plan = fused.plan
    _check_step_plan(plan)
    report = plan.memory_report()
    assert report["slab"] == plan.memory.slab_bytes >= report["slab_lower_bound"]


@pytest.mark.parametrize("replay", ["python", "captured"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_slab_poisoned_with_nan_before_every_replay_changes_nothing(name, replay):
    steps = 4
    _, ref_losses, ref_params, ran_ref = _run(name, replay, steps)
    _, losses, params, ran = _run(name, replay, steps, poison_slab=True)
    assert ran == ran_ref == replay
    assert np.all(np.isfinite(ref_losses))
    assert losses == ref_losses
    for p, q in zip(params, ref_params):
        np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_buffers_poisoned_as_their_recorded_life_ends_change_nothing(name, monkeypatch):
    steps = 3
    _, ref_losses, ref_params, _ = _run(name, "python", steps)
    _, losses, params, _ = _run(name, "python", steps, poison_slab=True, poison_at_death=True,
                                monkeypatch=monkeypatch)
    assert losses == ref_losses
    for p, q in zip(params, ref_params):
        np.testing.assert_array_equal(p, q)
