"""Transformer ops: scaled dot-product attention and bias+GELU, on the fused kernels."""

from __future__ import annotations

import math

import numpy as np

from ..kernels import elementwise, kernel
from ..tape import host
from ..tensor import Tensor
from ._base import as_dtype, as_tensor, contiguous, grad_out, leaf_or_none, new
from .attention_masks import key_padding_from_attn_mask
from ._products import bf16_attention, bf16_products, product, rounded
from .cast import refuse_integers


def _as_float(a: np.ndarray, dtype) -> np.ndarray:
    """`a` in `dtype`, any strides (the attention kernels take strided views); a copy only to convert."""
    return a if a.dtype == dtype else contiguous(a, dtype)


def _mask_array(mask) -> np.ndarray | None:
    """A key padding mask as the kernels take it: an array (a bool Tensor, what `ids == pad_id` gives, reached the
    packed kernel as a Tensor and failed inside Numba; a list failed on .dtype); the kernel checks shape and dtype."""
    if mask is None:
        return None
    return mask.data if isinstance(mask, Tensor) else np.asarray(mask)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *,
                                 key_padding_mask: np.ndarray | None = None, causal: bool = False,
                                 rng: np.random.Generator | None = None) -> Tensor:
    """softmax(scale * q k^T + masks) v. Shape: q (B, H, T, hs), k (B, H, S, hs), v (B, H, S, hv) -> (B, H, T, hv).

    key_padding_mask: bool (B, S), True marks padding keys that must not be attended to.
    causal: query i attends to keys j <= i. scale defaults to 1/sqrt(hs).
    A query with no key left to attend to gets zeros (and zero gradients), not NaN.

    torch's arguments too: `attn_mask` a bool mask with torch's polarity (True = attend) that varies by batch and
    key, (B, 1, 1, S) (attention_masks.py); `is_causal` as causal; `dropout_p` drops probabilities as torch's
    does whenever it is > 0 (pass 0 to evaluate), drawn from `rng` (the default generator if None).
    """
    if enable_gqa and (k.ndim != 4 or q.ndim != 4 or k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]):
        # Equal head counts need no grouping (torch too ignores the flag then); fewer k, v heads are refused.
        raise ValueError(f"scaled_dot_product_attention: enable_gqa=True with q of shape {q.shape} and k, v of "
                         f"{k.shape}, {v.shape}: grouped heads are not supported; repeat k's and v's heads to q's "
                         f"count (k.repeat_interleave(Hq // Hkv, dim=1)) first")
    # torch's "expected scalar type Float": integer or bool q, k, v named here, not inside a GEMM's typing error
    q, k, v = (refuse_integers(t, f"scaled_dot_product_attention ({name})")
               for name, t in (("q", q), ("k", k), ("v", v)))
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    qd, kd, vd = (_as_float(t.data, dtype) for t in (q, k, v))
    kpm = _mask_array(key_padding_mask)
    if qd.ndim != 4 or kd.ndim != 4 or vd.ndim != 4:
        raise ValueError(f"scaled_dot_product_attention: q, k, v must be 4-D (B, H, T, hs); got shapes "
                         f"{qd.shape}, {kd.shape}, {vd.shape} (unbatched or 3-D inputs: unsqueeze first)")
    if attn_mask is not None:
        batch, keys = kd.shape[0], kd.shape[2]
        if kpm is not None and kpm.shape != (batch, keys):
            raise ValueError(f"scaled_dot_product_attention: key_padding_mask shape {kpm.shape} must be "
                             f"(B, S) = {(batch, keys)} for k of shape {kd.shape}")
        kpm = key_padding_from_attn_mask(attn_mask, kpm, batch, keys)
    causal = bool(causal or is_causal)
    drop = _attention_dropout(dropout_p, rng, dtype)
    if scale is None and qd.shape[-1] == 0:  # the default scale 1/sqrt(hs) has no value (a ZeroDivisionError)
        raise ValueError(f"scaled_dot_product_attention: q and k have a head size of 0 (shape {qd.shape}), so the "
                         f"default scale 1/sqrt(head size) has no value; pass scale= or give the heads a size")
    out = new(qd.shape[:3] + vd.shape[3:], dtype)  # (B, H, T, hv)
    probs = new(qd.shape[:3] + kd.shape[2:3], dtype)  # (B, H, T, S), kept for backward
    bf16 = bf16_attention(dtype)
    if bf16:  # the products' operands, rounded once: backward keeps these, half the bytes of q, k, v
        qd, kd, vd = rounded(qd), rounded(kd), rounded(vd)
    if drop is None:  # the kernel recorded as it is (a captured replay may prepare it once)
        kernel("attention_forward")(qd, kd, vd, kpm, causal, scale, out, probs)
    else:
        host(_with_seed, kernel("attention_forward"), qd, kd, vd, kpm, causal, scale, out, probs, drop=drop)
    # The closure keeps metadata and leaves, not the input tensors (see leaf_or_none).
    inputs = tuple((leaf_or_none(t), t.requires_grad, t.shape, t.dtype) for t in (q, k, v))

    def backward(g):
        # The kernel computes all three; a grad nobody asked for lands in arena scratch.
        dq, dk, dv = (grad_out(leaf, shape, dtype) if needed else new(shape, dtype)
                      for leaf, needed, shape, _ in inputs)
        g = rounded(g) if bf16 else g
        if drop is None:
            kernel("attention_backward")(qd, kd, vd, probs, g, scale, dq, dk, dv)
        else:
            host(_with_seed, kernel("attention_backward"), qd, kd, vd, probs, g, scale, dq, dk, dv, drop=drop)
        return tuple(as_dtype(d, t_dtype) if needed else None
                     for d, (_, needed, _, t_dtype) in zip((dq, dk, dv), inputs))

    # Backward reads q, k, v (or their rounded copies); the output counts too, as torch's CPU kernel saves it.
    return Tensor._make(out, (q, k, v), backward, saved=(q, k, v), saved_output=True)


def packed_self_attention(qkv: Tensor, num_heads: int, *, key_padding_mask: np.ndarray | None = None,
                          causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                          rng: np.random.Generator | None = None) -> Tensor:
    """Self-attention straight from a fused projection. Shape: qkv (B, T, 3*D) -> (B, T, D).

    qkv's last axis is [query; key; value], each D = num_heads * hs wide (MultiheadAttention's
    qkv Linear). The same as splitting q, k, v into (B, H, T, hs), scaled_dot_product_attention
    and merging the heads back to (B, T, D), but the kernels read the heads as strided views of
    qkv and write the output and the gradient (B, T, 3*D) in place: no per-head copies forward or
    backward, and backward keeps only qkv (already the projection's output) and the probabilities.

    dropout_p > 0 drops attention probabilities (torch's MultiheadAttention dropout, BERT's
    attention_probs_dropout_prob) with ops.dropout's mask over (B, H, T, T): one seed drawn from
    `rng` (default generator if None), the mask recomputed from it in backward.
    """
    qkv = refuse_integers(qkv, "packed_self_attention")
    key_padding_mask = _mask_array(key_padding_mask)
    if qkv.ndim != 3 or num_heads <= 0 or qkv.shape[-1] % (3 * num_heads):
        raise ValueError(f"packed_self_attention: qkv must be (B, T, 3 * D) with D a multiple of num_heads="
                         f"{num_heads}; got shape {qkv.shape}")
    B, T, three_d = qkv.shape
    if three_d == 0 and scale is None:  # heads of size 0: the default scale 1/sqrt(hs) has no value
        raise ValueError(f"packed_self_attention: qkv of shape {qkv.shape} has heads of size 0, so the default "
                         f"scale 1/sqrt(head size) has no value; pass scale= or give the heads a size")
    D = three_d // 3
    hs = D // num_heads
    x = qkv.data
    x = x if x.flags.c_contiguous else contiguous(x)

    def heads(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = a.reshape(B, T, 3, num_heads, hs).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, hs), a view
        return parts[0], parts[1], parts[2]

    drop = _attention_dropout(dropout_p, rng, x.dtype)
    bf16 = bf16_attention(x.dtype)
    # At bfloat16 precision the kernels read qkv rounded once, and backward keeps that copy: half the bytes.
    q, k, v = heads(rounded(x.reshape(B * T, three_d)).reshape(x.shape) if bf16 else x)
    out = new((B, T, D), x.dtype)
    probs = new((B, num_heads, T, T), x.dtype)  # kept for backward
    host(_with_seed, kernel("attention_forward"), q, k, v, key_padding_mask, bool(causal), scale,
         _split_heads(out, num_heads), probs, drop=drop)
    leaf, dtype = leaf_or_none(qkv), x.dtype
    del x  # at bfloat16 precision, float32 qkv is not kept for backward

    def backward(g):
        dqkv = grad_out(leaf, (B, T, three_d), dtype)
        dq, dk, dv = heads(dqkv)
        g = contiguous(g)
        if bf16:
            g = rounded(g.reshape(B * T, D)).reshape(g.shape)
        host(_with_seed, kernel("attention_backward"), q, k, v, probs, _split_heads(g, num_heads), scale, dq, dk, dv,
             drop=drop)
        return (dqkv,)

    return Tensor._make(out, (qkv,), backward, saved=(qkv,))  # backward reads q, k, v: views of qkv (or a copy)


def _with_seed(attention_kernel, *args, drop: tuple | None) -> None:
    # One recorded call that reads the dropout seed when it runs (random.Seed), so a captured replay
    # drops with each step's new draw; the kernels take (seed, threshold, scale) or None.
    attention_kernel(*args, None if drop is None else (drop[0].value, *drop[1:]))


def _attention_dropout(p: float, rng: np.random.Generator | None, dtype) -> tuple | None:
    """(Seed, threshold, scale) for the attention kernels (through _with_seed), or None when nothing is dropped."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attention dropout must be in [0, 1), got {p}")
    if p == 0.0:
        return None
    from ..kernels.dropout import keep_threshold  # here, not at import: it loads Numba
    from ..random import Seed

    dtype = np.dtype(dtype)
    return Seed(rng), keep_threshold(p), dtype.type(1.0) / dtype.type(1.0 - p)


def _split_heads(a: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, T, D) viewed as (B, H, T, hs)."""
    B, T, D = a.shape
    return a.reshape(B, T, num_heads, D // num_heads).transpose(0, 2, 1, 3)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + bias) in one fused pass. Shape: (..., D) and (D,) -> (..., D)."""
    x, bias = as_tensor(x), as_tensor(bias)
    if x.ndim == 0 or bias.shape != x.shape[-1:]:
        raise ValueError(f"bias_gelu: bias shape {bias.shape} must be (D,) for input shape {x.shape} (..., D)")
    dtype = np.result_type(x.dtype, bias.dtype)
    d = x.shape[-1]
    x2 = contiguous(x.data, dtype).reshape(math.prod(x.shape[:-1]), d)  # (N, D); not -1: ambiguous at D = 0
    b = contiguous(bias.data, dtype)
    pre = new(x2.shape, dtype)  # x + bias, kept for backward
    out = new(x.shape, dtype)
    kernel("bias_gelu_forward")(x2, b, pre, out.reshape(x2.shape), approximate)
    # Backward needs only `pre`: keep x's metadata, not x (its memory would stay alive).
    x_shape, x_dtype, x_needs_grad = x.shape, x.dtype, x.requires_grad
    bias_leaf, bias_needs_grad = leaf_or_none(bias), bias.requires_grad
    bias_shape, bias_dtype = bias.shape, bias.dtype
    del x2

    def backward(g):
        dx = new(pre.shape, dtype)
        # dbias is a column sum of dx; a bias used once gets it written into its persistent buffer.
        db = grad_out(bias_leaf, bias_shape, bias_dtype) if bias_needs_grad else new(bias_shape, dtype)
        kernel("bias_gelu_backward")(pre, contiguous(g).reshape(pre.shape), dx, db, approximate)
        gx = as_dtype(dx.reshape(x_shape), x_dtype) if x_needs_grad else None
        return gx, db if bias_needs_grad else None

    return Tensor._make(out, (x, bias), backward)


def bias_gelu_linear(x: Tensor, bias: Tensor, weight: Tensor, out_bias: Tensor | None = None,
                     approximate: str = "none", recompute: bool = False) -> Tensor:
    """linear(gelu(x + bias), weight, out_bias): a transformer MLP's activation and second layer.

    Shape: x (..., M), bias (M,), weight (D, M), out_bias (D,) -> (..., D). Backward keeps two
    (..., M) buffers, as bias_gelu followed by linear would, but not the same two: the activation
    (for the weight's gradient) and GELU's derivative, both from one erf per element in forward
    (kernel bias_gelu_forward_with_grad), so backward evaluates no erf at all. recompute=True keeps
    only x + bias instead and recomputes both in backward (bias_gelu_backward_recompute): one (..., M)
    buffer per call less, for one erf pass more: on a fused ViT-Tiny batch-8 step, a predicted peak
    50 MiB lower for ~2% more step time (bench/vit_interleaved.py, "fused, GELU recomputed").
    """
    x, bias, weight = as_tensor(x), as_tensor(bias), as_tensor(weight)
    if x.ndim == 0 or bias.shape != x.shape[-1:] or weight.ndim != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"bias_gelu_linear: x {x.shape} (..., M) needs bias (M,) and weight (D, M); got bias "
                         f"{bias.shape} and weight {weight.shape}")
    if out_bias is not None and out_bias.shape != weight.shape[:1]:
        raise ValueError(f"bias_gelu_linear: out_bias shape {out_bias.shape} must be ({weight.shape[0]},)")
    dtype = np.result_type(x.dtype, bias.dtype, weight.dtype)
    m, d = x.shape[-1], weight.shape[0]
    x2 = contiguous(x.data, dtype).reshape(math.prod(x.shape[:-1]), m)  # (N, M); not -1: ambiguous at M = 0
    b = contiguous(bias.data, dtype)
    wd = weight.data
    act = new(x2.shape, dtype)  # gelu(x + bias)
    kept = new(x2.shape, dtype)  # what backward keeps: GELU's derivative at x + bias, or (recompute) x + bias
    if recompute:
        kernel("bias_gelu_forward")(x2, b, kept, act, approximate)
    else:
        kernel("bias_gelu_forward_with_grad")(x2, b, act, kept, approximate)
    out = new(x.shape[:-1] + (d,), dtype)
    out2 = out.reshape(x2.shape[0], d)
    in_bf16 = bf16_products(dtype)  # backward rounds its gradient once for both products then
    product(act, wd.T, out2)
    if out_bias is not None:
        elementwise.bias_add(out2, out_bias.data)
    # Metadata and leaves only (see leaf_or_none); the arrays backward reads are kept, wd, and act
    # when it is kept.
    x_shape, x_dtype, x_needs_grad = x.shape, x.dtype, x.requires_grad
    b_leaf, b_needs = leaf_or_none(bias), bias.requires_grad
    w_leaf, w_needs = leaf_or_none(weight), weight.requires_grad
    kept_act = act if w_needs and not recompute else None  # the weight's gradient reads it
    del act, x2
    ob_leaf, ob_needs = (leaf_or_none(out_bias), out_bias.requires_grad) if out_bias is not None else (None, False)
    # Each bias gets its gradient in its own dtype (the kernels round into that buffer: no cast copy);
    # the weight shares the products' dtype, which the GEMM already requires.
    b_dtype, ob_dtype = bias.dtype, out_bias.dtype if out_bias is not None else None
    parents = (x, bias, weight) if out_bias is None else (x, bias, weight, out_bias)

    def backward(g):
        g2 = contiguous(g, dtype).reshape(math.prod(g.shape[:-1]), d)  # (N, D)
        gw = gob = None
        if ob_needs:
            gob = grad_out(ob_leaf, (d,), ob_dtype)
            elementwise.column_sum(g2, gob)
        gs = rounded(g2) if in_bf16 else g2
        dx = new(kept.shape, dtype)
        product(gs, wd, dx)  # d act, turned into d x in place below
        db = grad_out(b_leaf, (m,), b_dtype) if b_needs else new((m,), dtype)
        if not recompute:
            kernel("bias_gelu_backward_stored")(kept, dx, dx, db)  # d act -> d x in place, and dbias
            if w_needs:
                gw = grad_out(w_leaf, wd.shape, dtype)
                product(gs.T, kept_act, gw)
        elif w_needs:
            # One pass evaluates erf once for both: the activation (recomputed, not kept since
            # forward) for the weight's gradient, and GELU's derivative for dx.
            act = new(kept.shape, dtype)
            kernel("bias_gelu_backward_recompute")(kept, dx, dx, db, act, approximate)
            gw = grad_out(w_leaf, wd.shape, dtype)
            product(gs.T, act, gw)
            del act
        else:  # bias_gelu_backward's dx must not alias its g (an aliased loop runs scalar)
            dact, dx = dx, new(kept.shape, dtype)
            kernel("bias_gelu_backward")(kept, dact, dx, db, approximate)
            del dact
        gx = as_dtype(dx.reshape(x_shape), x_dtype) if x_needs_grad else None
        grads = (gx, db if b_needs else None, gw)
        return grads if out_bias is None else grads + (gob,)

    # Backward reads `kept` and act (both made here) and the weight, which x's and the bias's gradients go
    # through.
    return Tensor._make(out, parents, backward, saved=(weight if x_needs_grad or b_needs else None,))
