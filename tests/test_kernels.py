"""Transformer kernels: each fused (Numba) twin against its NumPy reference, each reference against torch.

Tolerances: fused vs reference 1e-12 (float64) / 1e-5 (float32), since both compute the same
float64 formulas and differ only in summation order; reference vs torch as tests/reference.py.
Numba compiles each fused kernel once per dtype (seconds, cold) and then loads it from the
on-disk cache, so the cases here share one signature per kernel and dtype wherever they can.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tensorarena import kernels
from tensorarena.kernels import attention, cross_entropy, gelu, layer_norm, sgd, softmax  # noqa: F401 - register
from tensorarena.kernels.warmup import compile_all, not_covered

DTYPES = [np.float32, np.float64]
FUSED_TOL = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-5)}
TORCH_TOL = {np.float64: dict(rtol=1e-9, atol=1e-10), np.float32: dict(rtol=1e-4, atol=1e-5)}


def twins(name):
    return kernels.kernel(name, "reference"), kernels.kernel(name, "fused")


def run_both(name, make_outs, *args, **kw):
    """Run both twins of `name` as fn(*args, *outs, **kw) on fresh outs from make_outs().

    Returns (reference outs, fused outs, [both return values]).
    """
    results, returned = [], []
    for fn in twins(name):
        outs = make_outs()
        returned.append(fn(*args, *outs, **kw))
        results.append(outs)
    return results[0], results[1], returned


@np.errstate(under="ignore")  # rtol * |tiny| underflowing inside assert_allclose is not a failure
def close(a, b, tol, msg=""):
    for i, (x, y) in enumerate(zip(a, b)):
        if x is not None:
            np.testing.assert_allclose(x, y, **tol, err_msg=f"{msg} output {i}")


def t(a, grad=False):
    return torch.tensor(a, requires_grad=grad)


def randn(rng, shape, dt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dt)


# ---------------------------------------------------------------- layer_norm

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n,d", [(4, 1), (7, 13), (33, 64)])
@pytest.mark.parametrize("affine", [(True, True), (False, False), (True, False)])
def test_layer_norm(dt, n, d, affine):
    rng = np.random.default_rng(n * d)
    x, g = randn(rng, (n, d), dt, 2.0) + dt(0.5), randn(rng, (n, d), dt)
    w = randn(rng, d, dt) if affine[0] else None
    b = randn(rng, d, dt) if affine[1] else None
    eps = 1e-5
    ref, fus, _ = run_both("layer_norm_forward", lambda: [np.empty((n, d), dt), np.empty(n, dt), np.empty(n, dt)],
                           x, w, b, eps)
    close(ref, fus, FUSED_TOL[dt], "forward fused vs reference")
    out, mean, rstd = ref

    def grads():
        return [np.empty((n, d), dt), None if w is None else np.empty(d, dt), None if b is None else np.empty(d, dt)]

    gref, gfus, _ = run_both("layer_norm_backward", grads, g, x, w, mean, rstd)
    close(gref, gfus, FUSED_TOL[dt], "backward fused vs reference")

    tx, tw, tb = t(x, True), (t(w, True) if w is not None else None), (t(b, True) if b is not None else None)
    ty = F.layer_norm(tx, (d,), tw, tb, eps)
    ty.backward(t(g))
    _, tmean, trstd = torch.ops.aten.native_layer_norm(t(x), [d], None, None, eps)
    close([out, mean, rstd], [ty.detach(), tmean.reshape(-1), trstd.reshape(-1)], TORCH_TOL[dt], "forward vs torch")
    tol = TORCH_TOL[dt]
    if d == 1 and dt == np.float32:  # x - mean is exactly 0 here; torch's float32 rounding noise times rstd = 316
        tol = dict(tol, atol=1e-3)
    close(gref, [tx.grad, tw.grad if tw is not None else None, tb.grad if tb is not None else None], tol,
          "grads vs torch")


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_layer_norm_backward_float32_stays_within_a_few_ulps(offset):
    # The fused backward computes in float32 (layer_norm._backward). Against the float64 reference it
    # must stay within a few float32 ulps, also when |mean| >> std: there x - mean is taken against
    # mean split into float32 high and low parts. Without the low part, dweight was off by 2.5e-4
    # (of its largest entry) at offset 1e4; with it, 1.3e-7.
    rng = np.random.default_rng(11)
    n, d = 300, 96
    x = (rng.standard_normal((n, d)) + offset).astype(np.float32)
    w, g = rng.standard_normal(d).astype(np.float32), rng.standard_normal((n, d)).astype(np.float32)
    mean, rstd = np.empty(n), np.empty(n)
    layer_norm.layer_norm_forward_reference(x, w, None, 1e-5, np.empty((n, d), np.float32), mean, rstd)
    ref = [np.empty((n, d)), np.empty(d), np.empty(d)]
    layer_norm.layer_norm_backward_reference(g.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                             mean, rstd, *ref)
    ours = [np.empty((n, d), np.float32), np.empty(d, np.float32), np.empty(d, np.float32)]
    layer_norm.layer_norm_backward_fused(g, x, w, mean, rstd, *ours)
    for name, a, r in zip(("dx", "dweight", "dbias"), ours, ref):
        assert np.abs(a - r).max() <= 4e-7 * np.abs(r).max(), name


# ---------------------------------------------------------------- softmax

def _softmax_cases(rng, dt):
    x = randn(rng, (2, 3, 5, 7), dt, 3.0)
    pad = np.zeros((2, 1, 1, 7), dt)
    pad[0, ..., 4:] = -np.inf
    pad[1] = -np.inf  # batch 1 fully padded: every row masked
    query_pad = np.zeros((2, 1, 5, 1), dt)
    query_pad[1, :, 2:] = -np.inf
    yield "no mask", x, None
    yield "padding (B,1,1,T)", x, pad
    yield "additive (T,T)", x, randn(rng, (5, 7), dt)
    yield "per-key (T,)", x, randn(rng, (7,), dt)
    yield "rows (B,1,T,1)", x, query_pad
    # Not fully masked: float32 torch rounds x - 1e9 to -1e9 (uniform row), we add in float64.
    yield "large negative", x, np.where(np.isinf(pad[:1]), dt(-1e9), dt(0))
    yield "D=1", randn(rng, (3, 1), dt), None
    yield "1-d", randn(rng, (9,), dt), None
    yield "-inf inside x", np.where(x > 2, -np.inf, x).astype(dt), None


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax(dt):
    rng = np.random.default_rng(1)
    for label, x, mask in _softmax_cases(rng, dt):
        g = randn(rng, x.shape, dt)
        ref, fus, _ = run_both("softmax_forward", lambda: [np.empty_like(x)], x, mask)
        close(ref, fus, FUSED_TOL[dt], f"{label}: forward fused vs reference")
        y = ref[0]
        gref, gfus, _ = run_both("softmax_backward", lambda: [np.empty_like(x)], y, g)
        close(gref, gfus, FUSED_TOL[dt], f"{label}: backward fused vs reference")

        z = np.broadcast_to(x if mask is None else x + mask, x.shape)
        dead = np.isneginf(z).all(axis=-1)  # fully masked rows: zeros here, NaN in torch
        assert not np.isnan(y).any() and (y[dead] == 0).all() and (gref[0][dead] == 0).all(), label
        tx = t(x, True)
        ty = torch.softmax(tx if mask is None else tx + t(mask), dim=-1)
        ty.backward(t(g))
        live = ~dead
        np.testing.assert_allclose(y[live], ty.detach().numpy()[live], **TORCH_TOL[dt], err_msg=label)
        np.testing.assert_allclose(gref[0][live], tx.grad.numpy()[live], **TORCH_TOL[dt], err_msg=label)


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_non_contiguous_and_in_place(dt):
    rng = np.random.default_rng(2)
    x = randn(rng, (4, 6, 5), dt).transpose(0, 2, 1)  # (4, 5, 6), not C-contiguous
    mask = np.where(rng.random((4, 1, 6)) < 0.3, -np.inf, 0).astype(dt)
    ref, fus = np.empty_like(x), np.empty((4, 6, 5), dt).transpose(0, 2, 1)
    kernels.kernel("softmax_forward", "reference")(x, mask, ref)
    kernels.kernel("softmax_forward", "fused")(x, mask, fus)
    np.testing.assert_allclose(fus, ref, **FUSED_TOL[dt])
    inplace = np.ascontiguousarray(x)
    kernels.kernel("softmax_forward", "fused")(inplace, mask, inplace)
    np.testing.assert_allclose(inplace, ref, **FUSED_TOL[dt])


def test_softmax_rejects_bad_masks():
    x = np.zeros((2, 3))
    for impl in ("reference", "fused"):
        with pytest.raises(ValueError, match="does not broadcast"):
            kernels.kernel("softmax_forward", impl)(x, np.zeros((3, 3)), np.empty_like(x))
        with pytest.raises(TypeError, match="additive float"):
            kernels.kernel("softmax_forward", impl)(x, np.zeros(3, bool), np.empty_like(x))


# ---------------------------------------------------------------- gelu

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(dt, approximate):
    rng = np.random.default_rng(3)
    tails = np.array([-40.0, -10.0, -6.0, 0.0, 1e-20, 6.0, 10.0, 40.0], dt)
    for x in (randn(rng, (1,), dt), randn(rng, (3, 1), dt), randn(rng, (5, 17), dt, 3.0),
              randn(rng, (2, 3, 9), dt, 3.0), tails):
        g = randn(rng, x.shape, dt)
        ref, fus, _ = run_both("gelu_forward", lambda: [np.empty_like(x)], x, approximate=approximate)
        close(ref, fus, FUSED_TOL[dt], "forward fused vs reference")
        gref, gfus, _ = run_both("gelu_backward", lambda: [np.empty_like(x)], x, g, approximate=approximate)
        close(gref, gfus, FUSED_TOL[dt], "backward fused vs reference")
        tx = t(x, True)
        ty = F.gelu(tx, approximate=approximate)
        ty.backward(t(g))
        close(ref + gref, [ty.detach(), tx.grad], TORCH_TOL[dt], f"vs torch, shape {x.shape}")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("n,d", [(1, 1), (7, 13), (64, 40)])
def test_bias_gelu(dt, approximate, n, d):
    rng = np.random.default_rng(n + d)
    x, b, g = randn(rng, (n, d), dt, 2.0), randn(rng, d, dt), randn(rng, (n, d), dt)
    ref, fus, _ = run_both("bias_gelu_forward", lambda: [np.empty((n, d), dt), np.empty((n, d), dt)], x, b,
                           approximate=approximate)
    close(ref, fus, FUSED_TOL[dt], "forward fused vs reference")
    pre = ref[0]
    gref, gfus, _ = run_both("bias_gelu_backward", lambda: [np.empty((n, d), dt), np.empty(d, dt)], pre, g,
                             approximate=approximate)
    close(gref, gfus, FUSED_TOL[dt], "backward fused vs reference")
    tx, tb = t(x, True), t(b, True)
    tpre = tx + tb
    ty = F.gelu(tpre, approximate=approximate)
    ty.backward(t(g))
    close(ref + gref, [tpre.detach(), ty.detach(), tx.grad, tb.grad], TORCH_TOL[dt], "vs torch")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("n,d", [(1, 1), (7, 13), (64, 40)])
def test_bias_gelu_backward_recompute(dt, approximate, n, d):
    rng = np.random.default_rng(n * d)
    pre, g = randn(rng, (n, d), dt, 3.0), randn(rng, (n, d), dt)
    pre.flat[:3] = [-60.0, 45.0, -7.5][: pre.size]  # beyond the gradient clip and in the far left tail
    outs = lambda: [np.empty((n, d), dt), np.empty(d, dt), np.empty((n, d), dt)]  # noqa: E731
    ref, fus, _ = run_both("bias_gelu_backward_recompute", outs, pre, g, approximate=approximate)
    close(ref, fus, FUSED_TOL[dt], "fused vs reference")
    # The fused twin equals the two kernels it replaces: gelu_forward for act, bias_gelu_backward for
    # dx and dbias (bit for bit in the exact form, which shares one erf).
    act, dx, db = np.empty((n, d), dt), np.empty((n, d), dt), np.empty(d, dt)
    kernels.kernel("gelu_forward", "fused")(pre, act, approximate)
    kernels.kernel("bias_gelu_backward", "fused")(pre, g, dx, db, approximate)
    for got, want in zip([fus[2], fus[0], fus[1]], [act, dx, db]):
        np.testing.assert_array_equal(got, want)
    # dx may overwrite g (bias_gelu_linear's backward does that).
    for impl in ("reference", "fused"):
        g_in_place, db2, act2 = g.copy(), np.empty(d, dt), np.empty((n, d), dt)
        kernels.kernel("bias_gelu_backward_recompute", impl)(pre, g_in_place, g_in_place, db2, act2, approximate)
        close([g_in_place, db2, act2], ref if impl == "reference" else fus, FUSED_TOL[dt], f"in place, {impl}")
    tpre = t(pre, True)
    ty = F.gelu(tpre, approximate=approximate)
    ty.backward(t(g))
    close([tpre.grad, tpre.grad.sum(0), ty.detach()], ref, TORCH_TOL[dt], "vs torch")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("n,d", [(1, 1), (7, 13), (64, 40)])
def test_bias_gelu_forward_with_grad_and_the_backward_from_it(dt, approximate, n, d):
    rng = np.random.default_rng(n * d + 1)
    x, b, g = randn(rng, (n, d), dt, 3.0), randn(rng, d, dt), randn(rng, (n, d), dt)
    x.flat[:3] = [-60.0, 45.0, -7.5][: x.size]  # beyond the gradient clip and in the far left tail
    two = lambda: [np.empty((n, d), dt), np.empty((n, d), dt)]  # noqa: E731
    ref, fus, _ = run_both("bias_gelu_forward_with_grad", two, x, b, approximate=approximate)
    close(ref, fus, FUSED_TOL[dt], "forward fused vs reference")
    # The fused twin's activation and derivative are the ones the recomputing kernels give, to the bit (the
    # same inlined function of the same x + bias).
    pre, act, dx, db = np.empty((n, d), dt), np.empty((n, d), dt), g.copy(), np.empty(d, dt)
    kernels.kernel("bias_gelu_forward", "fused")(x, b, pre, act, approximate)
    np.testing.assert_array_equal(fus[0], act)
    act2 = np.empty((n, d), dt)
    kernels.kernel("bias_gelu_backward_recompute", "fused")(pre, dx, dx, db, act2, approximate)
    dact = fus[1]
    outs = lambda: [np.empty((n, d), dt), np.empty(d, dt)]  # noqa: E731
    gref, gfus, _ = run_both("bias_gelu_backward_stored", outs, dact, g)
    close(gref, gfus, FUSED_TOL[dt], "backward fused vs reference")
    np.testing.assert_array_equal(gfus[0], dx)  # g * gelu'(pre), rounded once either way
    close([gfus[1]], [db], FUSED_TOL[dt], "dbias against the recomputing kernel's")
    # dx may overwrite g (bias_gelu_linear's backward does that).
    for impl in ("reference", "fused"):
        g_in_place, db2 = g.copy(), np.empty(d, dt)
        kernels.kernel("bias_gelu_backward_stored", impl)(dact, g_in_place, g_in_place, db2)
        close([g_in_place, db2], gref if impl == "reference" else gfus, FUSED_TOL[dt], f"in place, {impl}")
    tx, tb = t(x, True), t(b, True)
    ty = F.gelu(tx + tb, approximate=approximate)
    ty.backward(t(g))
    close([ref[0], gref[0], gref[1]], [ty.detach(), tx.grad, tb.grad], TORCH_TOL[dt], "vs torch")


def test_gelu_rejects_unknown_approximation():
    for impl in ("reference", "fused"):
        with pytest.raises(ValueError, match="approximate"):
            kernels.kernel("gelu_forward", impl)(np.zeros(2), np.zeros(2), "erf")


# ---------------------------------------------------------------- attention

ATTN_CASES = [  # B, H, T, S, hs, causal, padding, scale
    (2, 3, 5, 7, 4, False, True, None),  # T != S; batch 1 fully padded below
    (2, 2, 6, 6, 8, True, True, 0.3),
    (2, 1, 9, 9, 3, True, False, None),
    (1, 1, 1, 1, 1, False, False, None),  # T = S = hs = 1
    (3, 2, 4, 11, 5, False, False, 1.0),
]


def _attn_inputs(rng, dt, b, h, tq, s, hs, padding):
    q, k, v, g = (randn(rng, (b, h, n, hs), dt) for n in (tq, s, s, tq))
    pad = None
    if padding:
        pad = rng.random((b, s)) < 0.3
        pad[0, 0] = False
        pad[-1, :] = True  # a fully padded sequence: every query row is fully masked
    return q, k, v, g, pad


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention(dt, case):
    b, h, tq, s, hs, causal, padding, scale = case
    rng = np.random.default_rng(tq * s)
    q, k, v, g, pad = _attn_inputs(rng, dt, b, h, tq, s, hs, padding)
    ref, fus, _ = run_both("attention_forward", lambda: [np.empty((b, h, tq, hs), dt), np.empty((b, h, tq, s), dt)],
                           q, k, v, pad, causal, scale)
    close(ref, fus, FUSED_TOL[dt], "forward fused vs reference")
    out, probs = ref
    gref, gfus, _ = run_both("attention_backward", lambda: [np.empty_like(q), np.empty_like(k), np.empty_like(v)],
                             q, k, v, probs, g, scale)
    close(gref, gfus, FUSED_TOL[dt], "backward fused vs reference")

    allowed = np.ones((b, 1, tq, s), bool)
    if causal:
        allowed &= np.tril(np.ones((tq, s), bool))
    if pad is not None:
        allowed &= ~pad[:, None, None, :]
    dead = ~allowed.any(-1)  # (B, 1, T) fully masked query rows
    assert (out[np.broadcast_to(dead, out.shape[:3])] == 0).all() and not np.isnan(out).any()

    tq_, tk, tv = t(q, True), t(k, True), t(v, True)
    if pad is None:  # torch refuses an explicit mask together with is_causal
        ty = F.scaled_dot_product_attention(tq_, tk, tv, is_causal=causal, scale=scale)
    else:
        ty = F.scaled_dot_product_attention(tq_, tk, tv, attn_mask=torch.from_numpy(allowed), scale=scale)
    live = np.broadcast_to(~dead, out.shape[:3])
    ty.backward(t(np.where(live[..., None], g, 0).astype(dt)))  # torch 2.13 zeros dead rows; do not rely on it
    np.testing.assert_allclose(out[live], ty.detach().numpy()[live], **TORCH_TOL[dt])
    close(gref, [tq_.grad, tk.grad, tv.grad], TORCH_TOL[dt], "grads vs torch")


@pytest.mark.parametrize("dt", DTYPES)
def test_attention_non_contiguous(dt):
    # The usual caller layout: (B, T, H, hs) projections viewed as (B, H, T, hs).
    rng = np.random.default_rng(5)
    q, k, v, g = (randn(rng, (2, 6, 3, 4), dt).transpose(0, 2, 1, 3) for _ in range(4))
    outs = {}
    for impl in ("reference", "fused"):
        out = np.empty((2, 6, 3, 4), dt).transpose(0, 2, 1, 3)
        probs = np.empty((2, 3, 6, 6), dt)
        kernels.kernel("attention_forward", impl)(q, k, v, None, True, None, out, probs)
        grads = [np.empty((2, 6, 3, 4), dt).transpose(0, 2, 1, 3) for _ in range(3)]
        kernels.kernel("attention_backward", impl)(q, k, v, probs, g, None, *grads)
        outs[impl] = [out, probs, *grads]
    close(outs["reference"], outs["fused"], FUSED_TOL[dt])


@pytest.mark.parametrize("dt", DTYPES)
def test_attention_on_heads_of_a_packed_projection(dt):
    # ops.packed_self_attention's layout: q, k, v are strided views of one (B, T, 3, H, hs) array, the
    # output and the gradients are (B, T, H, hs) views, which the fused twin reads and writes in place.
    rng = np.random.default_rng(6)
    b, t, nh, hs = 2, 7, 3, 4
    qkv = randn(rng, (b, t, 3, nh, hs), dt).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, hs)
    g = randn(rng, (b, t, nh, hs), dt).transpose(0, 2, 1, 3)
    pad = np.zeros((b, t), bool)
    pad[1, 5:] = True
    outs = {}
    for impl in ("reference", "fused"):
        out = np.empty((b, t, nh, hs), dt).transpose(0, 2, 1, 3)
        probs = np.empty((b, nh, t, t), dt)
        kernels.kernel("attention_forward", impl)(qkv[0], qkv[1], qkv[2], pad, False, None, out, probs)
        dqkv = np.empty((b, t, 3, nh, hs), dt).transpose(2, 0, 3, 1, 4)
        kernels.kernel("attention_backward", impl)(qkv[0], qkv[1], qkv[2], probs, g, None, *dqkv)
        outs[impl] = [out, probs, dqkv]
    close(outs["reference"], outs["fused"], FUSED_TOL[dt])


# ---------------------------------------------------------------- cross_entropy

CE_CASES = [  # N, C, ignore_index, label_smoothing, ignored rows
    (11, 7, -100, 0.0, [2, 5]),
    (11, 7, -100, 0.1, [2, 5]),
    (9, 5, 2, 0.2, None),  # ignore_index is a real class: rows targeting it drop out
    (1, 1, -100, 0.0, []),
    (4, 3, -1, 0.3, [0, 1, 2, 3]),  # every row ignored: count 0
    (6, 130, -100, 0.05, [1]),
]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", CE_CASES)
def test_cross_entropy(dt, case):
    n, c, ignore, eps, ignored = case
    rng = np.random.default_rng(n * c)
    x = randn(rng, (n, c), dt, 4.0)
    target = rng.integers(0, c, n).astype(np.int64)
    if ignored is not None:
        target[ignored] = ignore
    ref, fus, counts = run_both("cross_entropy_forward", lambda: [np.empty(n, dt), np.empty(n, dt)], x, target,
                                ignore, eps)
    close(ref, fus, FUSED_TOL[dt], "forward fused vs reference")
    count = int((target != ignore).sum())
    assert counts == [count, count]
    losses, lse = ref
    scale = 1.0 / count if count else 0.0
    gref, gfus, _ = run_both("cross_entropy_backward", lambda: [np.empty((n, c), dt)], x, target, lse, ignore, eps,
                             scale)
    close(gref, gfus, FUSED_TOL[dt], "backward fused vs reference")

    kw = dict(ignore_index=ignore, label_smoothing=eps)
    tl = F.cross_entropy(t(x), torch.from_numpy(target), reduction="none", **kw)
    # The forward keeps log_total = logsumexp(x) - max(x) (kernels/cross_entropy.py), not logsumexp itself.
    close([losses, lse], [tl, torch.logsumexp(t(x), 1) - t(x).max(1).values], TORCH_TOL[dt], "losses vs torch")
    if count:
        tx = t(x, True)
        tm = F.cross_entropy(tx, torch.from_numpy(target), reduction="mean", **kw)
        tm.backward()
        np.testing.assert_allclose(losses.sum(dtype=np.float64) / count, tm.item(), **TORCH_TOL[dt])
        close(gref, [tx.grad], TORCH_TOL[dt], "mean grads vs torch")
    else:
        assert (gref[0] == 0).all() and (losses == 0).all()


def test_cross_entropy_rejects_bad_targets():
    x = np.zeros((2, 3))
    for impl in ("reference", "fused"):
        fn = kernels.kernel("cross_entropy_forward", impl)
        with pytest.raises(IndexError, match="out of range"):
            fn(x, np.array([0, 3]), -100, 0.0, np.empty(2), np.empty(2))
        with pytest.raises(TypeError, match="integer"):
            fn(x, np.array([0.0, 1.0]), -100, 0.0, np.empty(2), np.empty(2))


# ---------------------------------------------------------------- sgd

SGD_OPTIONS = [dict(momentum=m, dampening=d, weight_decay=w, nesterov=nv, maximize=mx)
               for m, d, w, nv, mx in itertools.product((0.0, 0.9), (0.0, 0.3), (0.0, 1e-2), (False, True),
                                                        (False, True))
               if not (nv and (m == 0.0 or d != 0.0))]  # torch rejects nesterov without momentum / with damping


@pytest.mark.parametrize("dt", DTYPES)
def test_sgd_matches_torch_over_steps(dt):
    rng = np.random.default_rng(6)
    for opts in SGD_OPTIONS:
        p0 = randn(rng, (5, 3), dt)
        tp = t(p0.copy(), True)
        opt = torch.optim.SGD([tp], lr=0.1, **opts)
        ours = {impl: (p0.copy(), np.zeros_like(p0) if opts["momentum"] else None) for impl in ("reference", "fused")}
        for step in range(4):
            g = randn(rng, p0.shape, dt)
            tp.grad = t(g)
            opt.step()
            for impl, (p, buf) in ours.items():
                kernels.kernel("sgd", impl)(p, g, buf, lr=0.1, first_step=step == 0, **opts)
        (pr, br), (pf, bf) = ours["reference"], ours["fused"]
        close([pr, br], [pf, bf], FUSED_TOL[dt], f"fused vs reference {opts}")
        tbuf = opt.state[tp].get("momentum_buffer")
        close([pr, br], [tp.detach(), tbuf], TORCH_TOL[dt], f"vs torch {opts}")


def test_sgd_non_contiguous_and_missing_buffer():
    rng = np.random.default_rng(7)
    base = rng.standard_normal((4, 6))
    g = rng.standard_normal((4, 3))
    results = []
    for impl in ("reference", "fused"):
        p, buf = base.copy()[:, ::2], np.ones((4, 6))[:, 1::2]
        kernels.kernel("sgd", impl)(p, g, buf, lr=0.5, momentum=0.9, dampening=0.1, weight_decay=0.1,
                                    nesterov=False, maximize=False, first_step=False)
        results.append([p, buf])
        with pytest.raises(ValueError, match="momentum_buffer"):
            kernels.kernel("sgd", impl)(p, g, None, lr=0.5, momentum=0.9, dampening=0.0, weight_decay=0.0,
                                        nesterov=False, maximize=False, first_step=True)
    close(*results, FUSED_TOL[np.float64])


# ---------------------------------------------------------------- dispatch and warm-up

KERNELS = ["layer_norm_forward", "layer_norm_backward", "softmax_forward", "softmax_backward", "gelu_forward",
           "gelu_backward", "bias_gelu_forward", "bias_gelu_backward", "bias_gelu_backward_recompute",
           "bias_gelu_forward_with_grad", "bias_gelu_backward_stored",
           "attention_forward", "attention_backward", "dropout_apply", "embedding_backward",
           "cross_entropy_forward", "cross_entropy_backward", "sgd"]


def test_dispatch_returns_fused_by_default_and_reference_when_forced(monkeypatch):
    monkeypatch.setattr(kernels, "_force_reference", False)  # independent of TENSORARENA_KERNELS in the env
    for name in KERNELS:
        assert kernels.implementations(name) == ["fused", "reference"]
        ref, fused = twins(name)
        before = kernels.calls[(name, "fused")]
        assert kernels.kernel(name) is fused
        assert kernels.calls[(name, "fused")] == before + 1
        kernels.use_reference(True)
        before = kernels.calls[(name, "reference")]
        assert kernels.kernel(name) is ref
        assert kernels.calls[(name, "reference")] == before + 1
        kernels.use_reference(False)
        assert kernels.kernel(name) is fused


def test_calls_unchanged_leaves_the_counts_as_they_were_even_on_error():
    # The plan's kernel warm-ups run inside it: a test reading `calls` to see the route must not see them.
    before = kernels.calls.copy()
    with kernels.calls_unchanged():
        kernels.kernel("sgd")
        kernels.calls[("a warm-up", "fused")] += 1
    assert kernels.calls == before
    with pytest.raises(RuntimeError, match="mid-warm-up"):
        with kernels.calls_unchanged():
            kernels.kernel("sgd")
            raise RuntimeError("mid-warm-up")
    assert kernels.calls == before
    kernels.kernel("sgd")  # and counting goes on after it
    assert kernels.calls[("sgd", kernels.choose("sgd"))] == before[("sgd", kernels.choose("sgd"))] + 1


def test_compile_all_times_every_fused_kernel():
    seconds = compile_all((np.float32, np.float64))
    assert set(KERNELS) <= set(seconds)
    assert all(isinstance(s, float) and s >= 0.0 for s in seconds.values())
    assert not set(KERNELS) & set(not_covered())
    assert not_covered() == []  # every registered fused kernel, the optimizers' included
    assert {"adam", "nadam", "rmsprop", "adagrad", "lion", "lamb"} <= set(seconds)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("tile", [None, 2 * 3 * 5 * 5], ids=["one_tile", "tile_per_batch_element"])
def test_attention_with_dropout(dt, tile, monkeypatch):
    # Dropout inside the attention kernels: the twins agree, the mask is ops.dropout's over (B, H, T, S)
    # (so a tile per batch element must use the right offsets), and finite differences hold.
    from tensorarena.kernels import attention as attn_kernels
    from tensorarena.kernels.dropout import keep_mask_reference, keep_threshold

    if tile is not None:
        monkeypatch.setattr(attn_kernels, "_TILE_ELEMENTS", tile)
    rng = np.random.default_rng(11)
    b, h, tq, hs, p = 3, 2, 5, 4, 0.3
    q, k, v, g, pad = _attn_inputs(rng, dt, b, h, tq, tq, hs, True)
    seed, threshold, dscale = 0x1234ABCD, keep_threshold(p), dt(1.0) / dt(1.0 - p)
    drop = (seed, threshold, dscale)
    outs = {}
    for impl in ("reference", "fused"):
        out, probs = np.empty((b, h, tq, hs), dt), np.empty((b, h, tq, tq), dt)
        kernels.kernel("attention_forward", impl)(q, k, v, pad, True, None, out, probs, drop)
        grads = [np.empty_like(q), np.empty_like(k), np.empty_like(v)]
        kernels.kernel("attention_backward", impl)(q, k, v, probs, g, None, *grads, drop)
        outs[impl] = [out, probs, *grads]
    close(outs["reference"], outs["fused"], FUSED_TOL[dt], "fused vs reference")
    # The same as the undropped kernel's probabilities times the documented mask.
    keep = keep_mask_reference(seed, b * h * tq * tq, threshold).reshape(b, h, tq, tq)
    out, probs = outs["fused"][:2]
    np.testing.assert_allclose(out, (probs * keep * dscale) @ v, **FUSED_TOL[dt])
    if dt == np.float64:  # d(sum(out * g)) / dq by central differences, mask fixed by the seed
        def f(qq):
            o, pr = np.empty_like(out), np.empty_like(probs)
            kernels.kernel("attention_forward", "reference")(qq, k, v, pad, True, None, o, pr, drop)
            return (o * g).sum()
        eps, num = 1e-6, np.zeros_like(q)
        for idx in np.ndindex(q.shape):
            d = np.zeros_like(q)
            d[idx] = eps
            num[idx] = (f(q + d) - f(q - d)) / (2 * eps)
        np.testing.assert_allclose(outs["fused"][2], num, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- dropout

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_apply_twins_agree_exactly(dt, p):
    from tensorarena.kernels.dropout import keep_threshold

    x = randn(np.random.default_rng(3), (3, 7, 11), dt)
    x.flat[:2] = [np.nan, np.inf]
    seed, threshold, scale = 0xDEADBEEF12345678, keep_threshold(p), dt(1.0) / dt(1.0 - p)
    ref, fus, _ = run_both("dropout_apply", lambda: [np.empty_like(x)], x, seed=seed, threshold=threshold,
                           scale=scale)
    np.testing.assert_array_equal(ref[0], fus[0])  # an integer hash: the masks are identical
    kept = ref[0] != 0
    np.testing.assert_array_equal(ref[0][kept][2:], (x * scale)[kept][2:])


def test_dropout_hash_is_uniform_and_seeds_differ():
    from tensorarena.kernels.dropout import GAMMA, keep_mask_reference, keep_threshold

    n = 1 << 20
    # The kept fraction for several p, within 6 binomial standard deviations (false alarm ~1e-9).
    for p in (0.05, 0.3, 0.7):
        kept = keep_mask_reference(12345, n, keep_threshold(p)).mean()
        assert abs(kept - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n), (p, kept)
    # The top 32 bits spread evenly over 64 buckets (chi-square, 63 dof: 140 is p ~ 1e-7).
    buckets = np.zeros(64)
    for b in range(64):
        lo = keep_mask_reference(99, n, keep_threshold(b / 64)) if b else np.ones(n, bool)
        hi = keep_mask_reference(99, n, keep_threshold((b + 1) / 64)) if b < 63 else np.zeros(n, bool)
        buckets[b] = (lo & ~hi).sum()
    chi2 = ((buckets - n / 64) ** 2 / (n / 64)).sum()
    assert chi2 < 140, chi2
    # Neighbouring elements and neighbouring seeds are not correlated: masks of seeds s and s + GAMMA
    # (which shifts the counter by one) agree where they should and nowhere else by much.
    a = keep_mask_reference(7, n, keep_threshold(0.5))
    b = keep_mask_reference(8, n, keep_threshold(0.5))
    assert abs((a == b).mean() - 0.5) < 6 * 0.5 / np.sqrt(n)
    shifted = keep_mask_reference(int((np.uint64(7) + GAMMA)), n - 1, keep_threshold(0.5))
    np.testing.assert_array_equal(shifted, a[1:])
    assert abs((a[1:] == a[:-1]).mean() - 0.5) < 6 * 0.5 / np.sqrt(n)


# ---------------------------------------------------------------- embedding backward

@pytest.mark.parametrize("dt", DTYPES)
def test_embedding_backward_twins_agree_exactly(dt):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 9, 200)  # many repeats: each row sums ~22 token rows
    ids[:3] = [8, 8, 8]
    g = randn(rng, (200, 6), dt)
    ref, fus, _ = run_both("embedding_backward", lambda: [np.full((11, 6), np.nan, dt)], ids, g)
    np.testing.assert_array_equal(ref[0], fus[0])  # same additions in the same order
    want = np.zeros((11, 6))
    for i, row in enumerate(ids):
        want[row] += g[i]
    np.testing.assert_allclose(fus[0], want, **FUSED_TOL[dt])
    assert (fus[0][9:] == 0).all()  # rows no id picked are zero, whatever the buffer held
