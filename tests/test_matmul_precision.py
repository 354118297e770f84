"""float32 products at bfloat16 precision: the rounding kernel, MKL's bf16 GEMM, the ops and the routes.

References are torch: its float32 -> bfloat16 rounding (Tensor.bfloat16()), and products of the
bfloat16-rounded operands computed in float64. Each op test also checks that the float32 product
is measurably different, so a path that skipped the rounding would fail it.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import kernels, optim, precision
from tensorarena.compile import compile_step
from tensorarena.kernels import gemm_bf16 as K
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn.functional import cross_entropy
from tensorarena.ops._products import product
from tensorarena.train.trainer import Trainer

from reference import torch_bf16 as _bf16, torch_bf16_bits as _torch_bits

# Where there is no fast bf16 GEMM (no MKL), bfloat16 precision leaves products float32 (a hint, as in
# torch): the tests of rounded products need one. TENSORARENA_KERNELS=reference runs them on the twins.
needs_bf16_gemm = pytest.mark.skipif(not K.available(), reason=f"no fast bfloat16 GEMM: {K.why_not()}")


def _bf16_products_run() -> int:
    return kernels.calls[("gemm_bf16", "fused")] + kernels.calls[("gemm_bf16", "reference")]


def _f32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


# -- the rounding kernel --------------------------------------------------------------------------

def _awkward_values() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((257, 131)) * np.exp(rng.uniform(-30, 30, (257, 131)))).astype(np.float32)
    special = [np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-40, -1e-45, 65504.0,
               _f32(0x3F808000),  # a tie between two bfloat16s, lower one even: stays
               _f32(0x3F818000),  # a tie, lower one odd: rounds up
               _f32(0x3F808001),  # just above a tie: rounds up
               _f32(0x7F7FFFFF)]  # float32's largest: rounds past bfloat16's largest, to infinity
    x[0, :len(special)] = special
    return x


@pytest.mark.parametrize("transposed", [False, True])
def test_rounding_twins_agree_with_torch_ties_to_even(transposed):
    x = _awkward_values()
    src = x.T if transposed else x  # a transposed view: the layout ops pass for weights
    fused = K.to_bfloat16_fused(src, np.empty(src.shape, np.uint16))
    reference = K.to_bfloat16_reference(src, np.empty(src.shape, np.uint16))
    np.testing.assert_array_equal(fused, reference)
    np.testing.assert_array_equal(fused, _torch_bits(src))
    ties = fused[9:13, 0] if transposed else fused[0, 9:13]  # the tie cases, truncated: 3f80 3f81 3f80 7f7f
    assert [hex(v) for v in ties] == ["0x3f80", "0x3f82", "0x3f81", "0x7f80"]


def test_rounding_keeps_every_nan_a_nan():
    # 0x7F800001 is a NaN whose payload sits only in the dropped bits: the plain add would carry it
    # into 0x7F80, infinity. (Checked once: with the NaN select taken out of both twins, this fails.)
    x = np.array([[_f32(0x7F800001), _f32(0xFF800001), np.nan, _f32(0x7FBFFFFF)]], np.float32)
    for twin in (K.to_bfloat16_fused, K.to_bfloat16_reference):
        out = twin(x, np.empty(x.shape, np.uint16))
        assert np.isnan(K.widen(out)).all(), [hex(v) for v in out.ravel()]
        assert (out >> 15).tolist() == [[0, 1, 0, 0]]  # the sign is kept


def test_rounding_kernel_rejects_wrong_dtypes_with_both_named():
    with pytest.raises(TypeError, match="float64 .*uint16"):
        K.to_bfloat16_fused(np.zeros((2, 3)), np.zeros((2, 3), np.uint16))


# -- the bf16 GEMM ---------------------------------------------------------------------------------

@needs_bf16_gemm
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (64, 192, 96), (197, 64, 300)])
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_mkl_bf16_gemm_matches_its_twin_and_float64(m, k, n, layout, accumulate):
    rng = np.random.default_rng(m * 1000 + k)
    bits = [K.to_bfloat16_reference(rng.standard_normal(s).astype(np.float32), np.empty(s, np.uint16))
            for s in ((m, k), (k, n))]
    # "t": the operand is a transposed view of a row-major array, read with the transpose flag.
    a, b = (np.ascontiguousarray(x.T).T if t == "t" else x for x, t in zip(bits, layout))
    start = rng.standard_normal((m, n)).astype(np.float32)
    out, twin = start.copy(), start.copy()
    K.gemm_bf16_mkl(a, b, out, accumulate)
    K.gemm_bf16_reference(a, b, twin, accumulate)
    exact = K.widen(a).astype(np.float64) @ K.widen(b).astype(np.float64) + (start if accumulate else 0)
    scale = np.sqrt(k) + 1
    np.testing.assert_allclose(out, exact, rtol=0, atol=2e-6 * scale)
    np.testing.assert_allclose(out, twin, rtol=0, atol=4e-6 * scale)


@needs_bf16_gemm
def test_mkl_bf16_gemm_errors_name_what_was_wrong():
    a = np.zeros((3, 4), np.uint16)
    with pytest.raises(ValueError, match=r"\(3, 4\) @ \(5, 2\)"):
        K.gemm_bf16_mkl(a, np.zeros((5, 2), np.uint16), np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="float32 .*float64"):
        K.gemm_bf16_mkl(a, np.zeros((4, 2), np.float32), np.zeros((3, 2)))
    out = np.full((3, 0), 1.0, np.float32)
    K.gemm_bf16_mkl(a, np.zeros((4, 0), np.uint16), out)  # empty: nothing to do, no error
    z = np.full((3, 2), 7.0, np.float32)
    K.gemm_bf16_mkl(np.zeros((3, 0), np.uint16), np.zeros((0, 2), np.uint16), z)
    assert (z == 0).all()  # k = 0: the empty sum


# -- the setting -----------------------------------------------------------------------------------

def test_precision_names_context_default_and_threads():
    assert ta.get_float32_matmul_precision() == "float32"
    with pytest.raises(ValueError, match=r"one of \['bfloat16', 'float32', 'highest', 'medium'\].*'half'"):
        precision.normalize("half")
    seen = {}
    with ta.float32_matmul_precision("medium"):  # torch's name
        assert ta.get_float32_matmul_precision() == "bfloat16"
        other = threading.Thread(target=lambda: seen.setdefault("thread", ta.get_float32_matmul_precision()))
        other.start()
        other.join()
        with ta.float32_matmul_precision("highest"):
            assert ta.get_float32_matmul_precision() == "float32"
        assert ta.get_float32_matmul_precision() == "bfloat16"
    assert seen["thread"] == "float32"  # a block on one thread does not change another's products
    assert ta.get_float32_matmul_precision() == "float32"
    try:
        ta.set_float32_matmul_precision("bfloat16")
        assert ta.get_float32_matmul_precision() == "bfloat16"
    finally:
        ta.set_float32_matmul_precision("float32")


# -- the ops ---------------------------------------------------------------------------------------

def _linear_case(seed=0, n=37, d_in=48, d_out=29):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d_in)).astype(np.float32), rng.standard_normal((d_out, d_in)).astype(np.float32),
            rng.standard_normal(d_out).astype(np.float32), rng.standard_normal((n, d_out)).astype(np.float32))


def _run_linear(x, w, b, g):
    xt, wt, bt = ta.tensor(x, requires_grad=True), ta.tensor(w, requires_grad=True), ta.tensor(b, requires_grad=True)
    y = ta.nn.functional.linear(xt, wt, bt)
    (y * ta.tensor(g)).sum().backward()
    return y.data, xt.grad, wt.grad, bt.grad


def _assert_close_to(got, want, what, k):
    # Products of bfloat16 inputs, summed in float32 over k terms of size ~1: a few float32 ulps of sqrt(k).
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6 * (np.sqrt(k) + 1), err_msg=what)


@needs_bf16_gemm
def test_linear_rounds_every_product_input_to_bfloat16():
    x, w, b, g = _linear_case()
    before, rounds = _bf16_products_run(), sum(n for (name, _), n in kernels.calls.items() if name == "to_bfloat16")
    with ta.float32_matmul_precision("bfloat16"):
        y, gx, gw, gb = _run_linear(x, w, b, g)
    assert _bf16_products_run() - before == 3  # forward, d input, d weight
    # x and g rounded once each (backward keeps forward's rounded x), the weight once per direction.
    assert sum(n for (name, _), n in kernels.calls.items() if name == "to_bfloat16") - rounds == 4
    _assert_close_to(y, _bf16(x) @ _bf16(w).T + b, "forward", x.shape[1])
    _assert_close_to(gx, _bf16(g) @ _bf16(w), "d input", g.shape[1])
    _assert_close_to(gw, _bf16(g).T @ _bf16(x), "d weight", x.shape[0])
    np.testing.assert_allclose(gb, g.sum(0), rtol=1e-5)  # a sum, not a product: float32
    # The check can fail: the float32 products are far from the bfloat16 ones.
    y32 = _run_linear(x, w, b, g)[0]
    assert np.abs(y32 - y).max() > 100 * 3e-6 * np.sqrt(x.shape[1])


@needs_bf16_gemm
def test_matmul_and_gelu_linear_ops_use_the_precision_and_float64_never_does():
    rng = np.random.default_rng(1)
    a, c = rng.standard_normal((20, 33)).astype(np.float32), rng.standard_normal((33, 17)).astype(np.float32)
    with ta.float32_matmul_precision("bfloat16"):
        _assert_close_to(ta.matmul(ta.tensor(a), ta.tensor(c)).data, _bf16(a) @ _bf16(c), "matmul", 33)
        x, bias, w = rng.standard_normal((6, 33)).astype(np.float32), np.zeros(33, np.float32), c.T.copy()
        out = ta.ops.bias_gelu_linear(ta.tensor(x), ta.tensor(bias), ta.tensor(w)).data
        act = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
        _assert_close_to(out, _bf16(act) @ _bf16(w).T, "bias_gelu_linear", 33)
        # (..., k) @ (k, n) is one 2-D product: rounded too. Both operands batched: float32 (NumPy's matmul).
        a3 = a.reshape(4, 5, 33)
        _assert_close_to(ta.matmul(ta.tensor(a3), ta.tensor(c)).data, _bf16(a3) @ _bf16(c), "(4, 5, 33) @ (33, 17)", 33)
        c3 = np.stack([c] * 4)
        np.testing.assert_allclose(ta.matmul(ta.tensor(a3), ta.tensor(c3)).data, a3.astype(np.float64) @ c3,
                                   rtol=0, atol=1e-5)
        before = _bf16_products_run()
        a64 = a.astype(np.float64)
        np.testing.assert_allclose(ta.matmul(ta.tensor(a64), ta.tensor(c.astype(np.float64))).data, a64 @ c,
                                   rtol=1e-12)
        assert _bf16_products_run() == before  # float64 products are never rounded


def test_without_a_fast_bf16_gemm_products_stay_float32_and_say_so(monkeypatch, caplog):
    from tensorarena.ops import _products

    monkeypatch.setattr(K, "available", lambda: False)
    monkeypatch.setattr(_products, "_warned", False)
    x, w, b, g = _linear_case()
    skipped = ("gemm_bf16", "skipped: float32 instead")
    before = kernels.calls[skipped]
    with caplog.at_level(logging.WARNING, logger="tensorarena"), ta.float32_matmul_precision("bfloat16"):
        y = _run_linear(x, w, b, g)[0]
    assert kernels.calls[skipped] - before == 3
    assert "products stay float32" in caplog.text
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T + b, rtol=0, atol=1e-4)


@pytest.mark.parametrize("vendor,flags,slow", [
    ("GenuineIntel", {"avx512f", "amx_bf16"}, False), ("GenuineIntel", {"avx512f", "avx512_bf16"}, False),
    ("GenuineIntel", {"avx512f"}, True), ("AuthenticAMD", {"avx512f", "avx512_bf16"}, True), ("", set(), True)])
def test_bf16_products_say_where_mkl_has_no_fast_kernel_for_the_cpu(monkeypatch, caplog, vendor, flags, slow):
    # On an AMD EPYC, MKL's bf16 GEMM took 1.16x its float32 time (bench/gemm_bf16.py): asked-for bfloat16
    # products still run in bfloat16 (the user's choice of arithmetic), and the log says they cost time.
    from tensorarena.ops import _products

    monkeypatch.setattr(K, "_cpu_info", lambda: (vendor, flags))
    monkeypatch.setattr(K, "available", lambda: True)
    monkeypatch.setattr(_products, "_warned", False)
    assert bool(K.slow_here()) == slow
    with caplog.at_level(logging.WARNING, logger="tensorarena"), ta.float32_matmul_precision("bfloat16"):
        assert _products.bf16_products(np.float32)
        assert _products.bf16_products(np.float32)  # said once
    said = [r.getMessage() for r in caplog.records if "products run in bfloat16, but MKL has fast" in r.getMessage()]
    assert len(said) == (1 if slow else 0), said
    if slow:
        assert (vendor or "an unknown vendor") in said[0] and "bench/gemm_bf16.py" in said[0]


@needs_bf16_gemm
def test_switching_gemms_to_numpy_takes_the_bf16_ones_too():
    from tensorarena.kernels import gemm

    gemm.use_backend("numpy")
    try:
        assert not K.available() and "use_backend('numpy')" in K.why_not()
    finally:
        gemm.use_backend("mkl")
    assert K.available()


@needs_bf16_gemm
def test_product_rounds_into_arena_buffers_not_the_heap():
    a = np.random.default_rng(2).standard_normal((64, 32)).astype(np.float32)
    out = np.empty((64, 64), np.float32)
    arena = ta.Arena(name="products")
    with arena, ta.float32_matmul_precision("bfloat16"):
        product(a, a.T, out)
        allocated = arena.stats.allocations
    assert allocated == 2  # the two rounded operands
    _assert_close_to(out, _bf16(a) @ _bf16(a).T, "a @ a.T", 32)


# -- the routes ------------------------------------------------------------------------------------

def _vit(seed=0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=4, dim=32, depth=2, num_heads=4)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _batches(n, batch=8, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        out.append((x, (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)))
    return out


def _train(route, steps, precision_name, batches):
    model = _vit()
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=3e-3), cross_entropy, route=route,
                      matmul_precision=precision_name)
    return model, trainer, [trainer.step(*batches[i % len(batches)]) for i in range(steps)]


@needs_bf16_gemm
def test_fused_and_eager_bf16_training_agree_step_for_step_and_learn():
    batches = _batches(4)
    eager, _, er = _train("eager", 30, "bfloat16", batches)
    before = _bf16_products_run()
    fused, trainer, fr = _train("fused", 30, "bfloat16", batches)
    assert _bf16_products_run() > before and trainer.fused.plan.matmul_precision == "bfloat16"
    assert [r.route for r in fr] == ["fused"] * 30 and trainer.fused.traces == 1
    diff = max(float(np.abs(p.data - q.data).max()) for p, q in zip(eager.parameters(), fused.parameters()))
    assert diff <= 1e-5
    np.testing.assert_allclose([r.loss for r in fr], [r.loss for r in er], rtol=1e-5, atol=1e-5)
    losses = np.array([r.loss for r in fr])
    # Over 5 steps, not the last one: with attention's products in bfloat16 too, step 30 alone was 0.62x
    # step 1 (float32: 0.54x), while the last five steps' mean is 0.60x the first five's in both.
    assert losses[-5:].mean() < 0.7 * losses[:5].mean()
    # The rounded operands are step-arena buffers: both routes' high-water stays flat after warm-up.
    assert len({r.arena_high_water for r in er[2:]}) == 1 and len({r.arena_high_water for r in fr[2:]}) == 1
    # bfloat16 products learn as float32 ones do here (the paths part within a few steps, as
    # float32 runs with different summation orders would), but not identically: the rounding happened.
    bf, f32 = np.array([r.loss for r in fr]), np.array([r.loss for r in _train("fused", 30, "float32", batches)[2]])
    assert abs(bf[-5:].mean() - f32[-5:].mean()) < 0.15 * f32[-5:].mean()
    assert np.abs(bf[:5] - f32[:5]).max() < 1e-3 < np.abs(bf - f32).max()


@needs_bf16_gemm
def test_a_fused_plan_keeps_its_precision_and_plans_the_rounded_operands():
    x, y = _batches(1)[0]
    model = _vit()
    with ta.float32_matmul_precision("bfloat16"):  # the precision at construction is the plan's
        # The Python replay: it asks the arena for every plan buffer, which the last assert below counts
        fused = compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=1e-2), (x, y), replay="python")
    rounded = [b for b in fused.plan.buffers if b.dtype == np.uint16]
    # Operands the ops round, and (slice kernels) the per-core tiles attention rounds P and dS into (float32
    # values of bfloat16 ones, as uint32 bits) and its operands widened to float32 for its products: all in the slab.
    slices = kernels.choose("attention_forward") == "fused" and K.in_kernels()
    assert {b.op for b in rounded} == {"ops._products.rounded"}
    ops = {(b.op, np.dtype(b.dtype)) for b in fused.plan.buffers}
    assert (("kernels.attention_heads._bf16_args", np.dtype(np.uint32)) in ops) == slices
    assert (("kernels.attention_heads._widened", np.dtype(np.float32)) in ops) == slices
    assert "float32 products in bfloat16" in fused.plan.format_report()
    before = _bf16_products_run()
    arena = fused.step(x, y)[3]  # this thread's setting is float32 now; the plan's wins
    assert _bf16_products_run() > before
    assert arena.stats.allocations == len(fused.plan.buffers)  # the rounded operands are slab views
    other = _vit()
    plain = compile_step(other, cross_entropy, optim.SGD(other.parameters(), lr=1e-2), (x, y))
    assert not [b for b in plain.plan.buffers if b.dtype == np.uint16]
    with pytest.raises(ValueError, match="matmul precision .*'fp8'"):
        compile_step(other, cross_entropy, optim.SGD(other.parameters(), lr=1e-2), (x, y), matmul_precision="fp8")


@needs_bf16_gemm
def test_trainer_precision_covers_eval_and_streaming_and_bad_names_fail_at_construction(tmp_path):
    x, y = _batches(1)[0]
    model = _vit()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=1e-2), cross_entropy, route="streaming",
                      store_dir=tmp_path, matmul_precision="bfloat16")
    before = _bf16_products_run()
    trainer.step(x, y)
    after_step = _bf16_products_run()
    trainer.evaluate(x, y)
    assert after_step > before and _bf16_products_run() > after_step
    with pytest.raises(ValueError, match="'tf32'"):
        Trainer(model, optim.SGD(model.parameters(), lr=1e-2), cross_entropy, matmul_precision="tf32")
