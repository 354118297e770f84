"""The static memory planner: no two live buffers overlap, and reuse gets near the lower bound."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorarena.compile import BufferSpec, plan_memory


def _assert_valid(plan, buffers):
    for a in buffers:
        for b in buffers:
            if a.name >= b.name or a.last < b.first or b.last < a.first:
                continue
            a0, b0 = plan.offsets[a.name], plan.offsets[b.name]
            assert a0 + a.nbytes <= b0 or b0 + b.nbytes <= a0, f"{a} and {b} overlap while both live"
    for b in buffers:
        assert plan.offsets[b.name] % 64 == 0
        assert plan.offsets[b.name] + b.nbytes <= plan.slab_bytes


buffer_lists = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=1, max_size=40
).map(lambda xs: [BufferSpec(f"b{i}", n, f, f + d) for i, (n, f, d) in enumerate(xs)])


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(buffer_lists)
def test_live_buffers_never_overlap_and_slab_is_at_least_the_lower_bound(buffers):
    plan = plan_memory(buffers)
    _assert_valid(plan, buffers)
    assert plan.peak_live_bytes <= plan.slab_bytes <= plan.naive_bytes


def test_a_chain_of_temporaries_reuses_memory_down_to_the_lower_bound():
    # Forward-pass shape: each activation is read by the next op only.
    buffers = [BufferSpec(f"act{i}", 1 << 20, i, i + 1) for i in range(10)]
    plan = plan_memory(buffers)
    _assert_valid(plan, buffers)
    assert plan.slab_bytes == plan.peak_live_bytes == 2 << 20
    assert plan.saved_bytes == 8 << 20
    assert "saved 8.00 MiB" in plan.summary()


def test_training_like_lifetimes_stay_close_to_the_lower_bound():
    # Activations live from forward to the matching backward step (a "V" of lifetimes),
    # plus short-lived backward temporaries: the planner should get within 10% of optimal.
    rng = np.random.default_rng(0)
    layers = 24
    buffers = []
    for i in range(layers):
        size = int(rng.integers(1, 64)) * 4096
        buffers.append(BufferSpec(f"act{i}", size, i, 2 * layers - i))
        buffers.append(BufferSpec(f"grad{i}", size, 2 * layers - i, 2 * layers - i + 1))
    plan = plan_memory(buffers)
    _assert_valid(plan, buffers)
    assert plan.slab_bytes <= 1.1 * plan.peak_live_bytes


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="before first use"):
        BufferSpec("x", 8, 5, 4)
    with pytest.raises(ValueError, match="unique"):
        plan_memory([BufferSpec("x", 8, 0, 1), BufferSpec("x", 8, 2, 3)])
