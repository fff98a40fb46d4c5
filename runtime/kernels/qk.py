"""Queries and keys as attention reads them, in one pass: the per-head RMS norm where the family has one
(Qwen3, Qwen3.5/3.6), rotary embedding on each head's first rotary_dim dims, and the cache write of k and v at
their positions. On the GPU one kernel replaces the ~20 small ops (norms, casts, halves, concatenations, the
index_put) a layer would otherwise launch for them.

    q_out = rotate_and_store(q, k, v, q_gain, k_gain, eps, zero_centred, cos, sin, rotary_dim, kv, slot, positions)

q [B, T, Hq, D], k and v [B, T, Hkv, D] (views of a fused projection's output: heads and tokens through
strides, dims contiguous; on the GPU each may be that product's split-K partials, linear.SplitSums, which the
kernel adds as it reads them, the bits of the summed product); gains [D], both or neither; cos, sin
[B, T, 1, rotary_dim] float32 (rope.py's tables: each half repeats the other); kv the cache's buffer
[2, layers, batch, context, Hkv, D], slot the layer's index in it; positions [B, T]. Returns the rotated q,
contiguous, of the rows from `context_rows` (default 0) on: the rows before are a drafter's context, whose k and v
alone are kept (DFlash's context beside its block in one product). A row at a negative position stores nothing (a
context row the target rejected, whose position the block's row writes in the same launch). The norm rounds as
norm.py's `rms_norm` does; the rotation is `x·cos + rotate_half(x)·sin` in float32
on the (normed, rounded) values, rounded once. Each (token, head) is its own program and its own reference step:
batch-invariant by construction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.linear import SplitSums, planes_of
from specpair.runtime.kernels.norm import rms_norm_reference
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    device_function,
    launch_options,
    require_triton,
    rounded,
    summed_values,
    tl,
    triton,
)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int) -> Tensor:
    """x [B, T, heads, head_dim] with its first rotary_dim dims rotated (in float32, cast back)."""
    turned, passed = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat((-turned[..., half:], turned[..., :half]), dim=-1)
    out = (turned * cos + rotated * sin).to(x.dtype)
    return torch.cat((out, passed), dim=-1) if passed.shape[-1] else out


def rotate_and_store(
    q: Tensor | SplitSums,
    k: Tensor | SplitSums,
    v: Tensor | SplitSums,
    q_gain: Tensor | None,
    k_gain: Tensor | None,
    eps: float,
    zero_centred: bool,
    cos: Tensor,
    sin: Tensor,
    rotary_dim: int,
    kv: Tensor,
    slot: int,
    positions: Tensor,
    context_rows: int = 0,
) -> Tensor:
    args = (q, k, v, q_gain, k_gain, eps, zero_centred, cos, sin, rotary_dim, kv, slot, positions, context_rows)
    if any(isinstance(x, SplitSums) or x.is_cuda for x in (q, k, v)):
        return rotate_and_store_triton(*args)
    return rotate_and_store_reference(*args)


def rotate_and_store_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_gain: Tensor | None,
    k_gain: Tensor | None,
    eps: float,
    zero_centred: bool,
    cos: Tensor,
    sin: Tensor,
    rotary_dim: int,
    kv: Tensor,
    slot: int,
    positions: Tensor,
    context_rows: int = 0,
) -> Tensor:
    if q_gain is not None:
        q = rms_norm_reference(q, q_gain, eps, zero_centred)
    if k_gain is not None:
        k = rms_norm_reference(k, k_gain, eps, zero_centred)
    # q's and k's heads rotated in one pass: the rotation is elementwise (+, *), an element's bits its own
    turned = rotate(torch.cat((q, k), dim=2), cos, sin, rotary_dim)
    q, k = turned[:, :, : q.shape[2]], turned[:, :, q.shape[2] :]
    rows = torch.arange(positions.shape[0], device=positions.device)[:, None].expand_as(positions)
    stored = positions >= 0
    # one write into the cache's shared buffer (autograd, which tests train drafters through, refuses in-place
    # writes into views taken before another write to their buffer: the caller takes its views after)
    kv[:, slot, rows[stored], positions[stored]] = torch.stack((k, v))[:, stored]
    return q[:, context_rows:].contiguous()


def rotate_and_store_triton(
    q: Tensor | SplitSums,
    k: Tensor | SplitSums,
    v: Tensor | SplitSums,
    q_gain: Tensor | None,
    k_gain: Tensor | None,
    eps: float,
    zero_centred: bool,
    cos: Tensor,
    sin: Tensor,
    rotary_dim: int,
    kv: Tensor,
    slot: int,
    positions: Tensor,
    context_rows: int = 0,
) -> Tensor:
    require_triton("rotate_and_store")
    dtype = q.dtype
    (q, q_plane, q_splits), (k, k_plane, k_splits), (v, v_plane, v_splits) = map(planes_of, (q, k, v))
    batch, tokens, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    if (
        k.shape != v.shape
        or k.shape[:2] != (batch, tokens)
        or k.shape[3] != head_dim
        or kv.shape[-2:] != (kv_heads, head_dim)
        or rotary_dim % 2
        or rotary_dim > head_dim
        or any(t.stride(-1) != 1 for t in (q, k, v, kv))
        or (q_gain is None) != (k_gain is None)
    ):
        raise ValueError(
            f"rotate_and_store: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, cache {list(kv.shape)}, "
            f"rotary_dim {rotary_dim} do not fit"
        )
    out = torch.empty(batch, tokens - context_rows, q_heads, head_dim, dtype=dtype, device=q.device)
    if batch * tokens == 0:
        return out
    cos = cos.reshape(batch * tokens, rotary_dim).contiguous()
    sin = sin.reshape(batch * tokens, rotary_dim).contiguous()
    half = rotary_dim // 2
    _rotate_and_store_kernel[(batch * tokens, q_heads + kv_heads)](
        q,
        k,
        v,
        q if q_gain is None else q_gain,
        q if k_gain is None else k_gain,
        cos,
        sin,
        positions.to(torch.int64).contiguous(),
        out,
        kv[0, slot],
        kv[1, slot],
        tokens,
        context_rows,
        q_heads,
        head_dim,
        half,
        eps,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *kv.stride()[2:5],
        q_plane,
        k_plane,
        v_plane,
        Q_SPLITS=q_splits,
        K_SPLITS=k_splits,
        V_SPLITS=v_splits,
        NORM=q_gain is not None,
        ZERO_CENTRED=zero_centred,
        BLOCK_HALF=triton.next_power_of_2(max(half, 1)),
        BLOCK_PASS=triton.next_power_of_2(max(head_dim - rotary_dim, 1)),
        **launch_options(),
    )
    return out


if triton is not None:

    @device_function
    def _head_values(src, lo, in_half, rest, in_rest, half, plane, SPLITS: tl.constexpr, dtype: tl.constexpr):
        """A head's rotated halves and its passed-through rest, float32 (partials added and rounded first)."""
        x1 = summed_values(src, lo, in_half, plane, SPLITS, dtype).to(tl.float32)
        x2 = summed_values(src, half + lo, in_half, plane, SPLITS, dtype).to(tl.float32)
        x3 = summed_values(src, rest, in_rest, plane, SPLITS, dtype).to(tl.float32)
        return x1, x2, x3

    @triton.jit(do_not_specialize_on_alignment=["q_ptr", "k_ptr", "v_ptr", "out_ptr", "kc_ptr", "vc_ptr"])
    def _rotate_and_store_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        qg_ptr,
        kg_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        out_ptr,
        kc_ptr,
        vc_ptr,
        tokens,
        context_rows,
        q_heads,
        head_dim,
        half,
        eps,
        sqb,
        sqt,
        sqh,
        skb,
        skt,
        skh,
        svb,
        svt,
        svh,
        scb,
        scs,
        sch,
        q_plane,
        k_plane,
        v_plane,
        Q_SPLITS: tl.constexpr,
        K_SPLITS: tl.constexpr,
        V_SPLITS: tl.constexpr,
        NORM: tl.constexpr,
        ZERO_CENTRED: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        BLOCK_PASS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        bt = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        b = bt // tokens
        t = bt % tokens
        rotary = 2 * half
        lo = tl.arange(0, BLOCK_HALF)
        in_half = lo < half
        rest = rotary + tl.arange(0, BLOCK_PASS)
        in_rest = rest < head_dim
        is_query = head < q_heads
        position = tl.load(pos_ptr + bt)
        # a context row's query is not asked for; a key and value at a negative position are not stored
        if (is_query and t < context_rows) or (not is_query and position < 0):
            return
        kv_head = head - q_heads
        dtype = out_ptr.dtype.element_ty
        if is_query:  # q's and k's pointers may differ in type (a product, or partials): no shared variable
            q_at = q_ptr + b * sqb + t * sqt + head * sqh
            x1, x2, x3 = _head_values(q_at, lo, in_half, rest, in_rest, half, q_plane, Q_SPLITS, dtype)
            gain_ptr = qg_ptr
        else:
            k_at = k_ptr + b * skb + t * skt + kv_head * skh
            x1, x2, x3 = _head_values(k_at, lo, in_half, rest, in_rest, half, k_plane, K_SPLITS, dtype)
            gain_ptr = kg_ptr
        if NORM:
            w1 = tl.load(gain_ptr + lo, mask=in_half, other=0.0).to(tl.float32)
            w2 = tl.load(gain_ptr + half + lo, mask=in_half, other=0.0).to(tl.float32)
            w3 = tl.load(gain_ptr + rest, mask=in_rest, other=0.0).to(tl.float32)
            squares = tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0) + tl.sum(x3 * x3, axis=0)
            inverse = tl.math.rsqrt(squares / head_dim + eps)
            if ZERO_CENTRED:
                x1 = rounded(x1 * inverse * (1.0 + w1), dtype).to(tl.float32)
                x2 = rounded(x2 * inverse * (1.0 + w2), dtype).to(tl.float32)
                x3 = rounded(x3 * inverse * (1.0 + w3), dtype).to(tl.float32)
            else:
                x1 = rounded(w1 * rounded(x1 * inverse, dtype).to(tl.float32), dtype).to(tl.float32)
                x2 = rounded(w2 * rounded(x2 * inverse, dtype).to(tl.float32), dtype).to(tl.float32)
                x3 = rounded(w3 * rounded(x3 * inverse, dtype).to(tl.float32), dtype).to(tl.float32)
        c1 = tl.load(cos_ptr + bt * rotary + lo, mask=in_half, other=0.0)
        c2 = tl.load(cos_ptr + bt * rotary + half + lo, mask=in_half, other=0.0)
        s1 = tl.load(sin_ptr + bt * rotary + lo, mask=in_half, other=0.0)
        s2 = tl.load(sin_ptr + bt * rotary + half + lo, mask=in_half, other=0.0)
        y1 = rounded(x1 * c1 + (-x2) * s1, dtype)
        y2 = rounded(x2 * c2 + x1 * s2, dtype)
        y3 = rounded(x3, dtype)
        if is_query:
            dst = out_ptr + ((b * (tokens - context_rows) + t - context_rows) * q_heads + head) * head_dim
        else:
            dst = kc_ptr + b * scb + position * scs + kv_head * sch
            vsrc = v_ptr + b * svb + t * svt + kv_head * svh
            vdst = vc_ptr + b * scb + position * scs + kv_head * sch
            tl.store(vdst + lo, summed_values(vsrc, lo, in_half, v_plane, V_SPLITS, dtype), mask=in_half)
            tl.store(vdst + half + lo, summed_values(vsrc, half + lo, in_half, v_plane, V_SPLITS, dtype), mask=in_half)
            tl.store(vdst + rest, summed_values(vsrc, rest, in_rest, v_plane, V_SPLITS, dtype), mask=in_rest)
        tl.store(dst + lo, y1, mask=in_half)
        tl.store(dst + half + lo, y2, mask=in_half)
        tl.store(dst + rest, y3, mask=in_rest)
