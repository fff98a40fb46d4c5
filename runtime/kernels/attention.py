"""Attention of a few query rows over a static KV cache indexed by absolute position.

q [B, T, Hq, D]; k_cache, v_cache [B, S, Hkv, D]; query head h reads KV head h // (Hq // Hkv) (transformers'
repeat_kv). Query (b, t) attends to cache positions kv_start[b, t] <= p < kv_end[b, t] of sequence b: causal
decode and verify (kv_end = pos + 1), sliding windows (kv_start = pos + 1 - W) and DFlash's bidirectional
blocks (kv_end = block end) are all this one rule. An empty range gives zeros. Softmax in float32; output in
q's dtype.

Batch invariance: a query's result depends on its own row, its own range and the cache alone. The Triton
kernel walks the cache in blocks at absolute positions (BLOCK_N), each row masking what lies outside its
range, so a row that shares a tile with others sees its own blocks in the same order with the same masks;
blocks outside its range leave its running max, sum and accumulator bit for bit unchanged. The cache is cut
into splits of SPLIT positions, also at absolute positions, whose count depends on S alone; a second kernel
merges each row's own splits in order. Rows of a call are grouped (t, query head of one KV head) into tiles of
BLOCK_M, a fixed size. Cache entries between a sequence's smallest kv_start and largest kv_end in one call are
read (and multiplied by zero where masked), so they must be finite: written entries, or zeros.
A gated layer (Qwen3.5/3.6) passes its output gate: the kernel that stores the output (the attention kernel with
one split, the merge with several) multiplies it by sigmoid(gate) as activation.sigmoid_mul_reference rounds it,
reading the gate in place or adding its projection's partials, so the gate costs no launch of its own.
Both paths round the probabilities to the cache dtype for the product with V, as transformers' eager attention and
flash attention do (the CPU's through torch's fused CPU attention); the CPU reads whole spans of SPAN positions
around the ranges (attention_reference), which must be finite likewise: the runtime's cache holds zeros past
every commit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional

from specpair.runtime.kernels.activation import sigmoid_gated, sigmoid_mul_reference
from specpair.runtime.kernels.cpu_rows import tile_rows
from specpair.runtime.kernels.linear import SplitSums, planes_of
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    device_function,
    dot,
    dot_in_float32,
    launch_options,
    require_triton,
    rounded,
    summed_values,
    tl,
    triton,
)

BLOCK_M = 16  # query rows per tile
BLOCK_N = 64  # cache positions per block
SPLIT = 1024  # cache positions per split: the merge reads only the splits a row's range touches
SCRATCH_BYTES = 1 << 28  # float32 partials of one launch; longer calls go in chunks of query rows
SPAN = 64  # the CPU reference's cache positions per span: its products' lengths are multiples of it


def attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_start: Tensor,
    kv_end: Tensor,
    scale: float,
    gate: Tensor | SplitSums | None = None,
) -> Tensor:
    """`gate` [B, T, Hq, D]: the gated attention's output gate (o · sigmoid(gate)), or its projection's partials."""
    if q.is_cuda:
        return attention_triton(q, k_cache, v_cache, kv_start, kv_end, scale, gate)
    o = attention_reference(q, k_cache, v_cache, kv_start, kv_end, scale)
    return o if gate is None else sigmoid_mul_reference(o, gate)


def attention_reference(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, kv_start: Tensor, kv_end: Tensor, scale: float
) -> Tensor:
    """The CPU's attention (torch's fused CPU attention, masked), over spans of the cache at absolute positions, as
    the Triton kernel's blocks are: a row's span runs from its kv_start rounded down to a multiple of SPAN to its
    kv_end rounded up, so the shapes it goes through and the place of each of its keys follow from its own range
    alone. A sequence's rows go in tiles of a fixed number of query rows (their role's: cpu_rows.tile_rows),
    zero-padded, the rows of a tile sharing a span (a verify block's, a drafted block's, a prompt's within SPAN);
    the tiles of one span, of every sequence, go in one call, where each tile is an item of its batch, computed
    alone. Each row is masked to its own range: entries of the span outside it get probability 0 and add nothing,
    but are read, so they must be finite (the runtime's cache is: zeros past every commit); a span past the
    cache's end is read from a zero-padded copy. Which rows go where and the masks are worked out once per ranges
    (`_span_tiles`): every layer of a step reads the same ones."""
    batch, tokens, q_heads, head_dim = q.shape
    cache_len = k_cache.shape[1]
    rows = q.reshape(batch * tokens, q_heads, head_dim)
    out = torch.zeros(batch * tokens, q_heads, head_dim, dtype=q.dtype)
    for span in _span_tiles(kv_start, kv_end, tile_rows(), q.dtype):
        keys, values = k_cache[span.sequences, span.first : span.last], v_cache[span.sequences, span.first : span.last]
        if span.last > cache_len:
            keys, values = (functional.pad(c, (0, 0, 0, 0, 0, span.last - cache_len)) for c in (keys, values))
        tiles, _, per_tile, _ = span.outside.shape
        queries = torch.zeros(tiles * per_tile, q_heads, head_dim, dtype=q.dtype)
        queries[span.slots] = rows[span.rows]
        attended = functional.scaled_dot_product_attention(
            queries.view(tiles, per_tile, q_heads, head_dim).transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=span.outside,
            scale=scale,
            enable_gqa=True,
        ).transpose(1, 2)  # [tiles, per_tile, Hq, D]
        out[span.rows] = attended.reshape(-1, q_heads, head_dim)[span.slots]
    return out.view(batch, tokens, q_heads, head_dim)


@dataclass(frozen=True)
class _SpanTiles:
    """The tiles of one span of the cache, positions first .. last, in one call of the fused attention."""

    first: int
    last: int
    sequences: slice | list[int]  # each tile's sequence: its keys and values
    rows: Tensor  # the query rows (b * T + t) the tiles hold, in tile order
    slots: Tensor  # their places in the tiles (tile * rows per tile + slot)
    outside: Tensor  # [tiles, 1, rows per tile, last - first]: -inf outside each row's range, added to its scores


KEPT_PLANS = 4  # a step's full and sliding layers' ranges, a drafter's beside them


def _span_tiles(kv_start: Tensor, kv_end: Tensor, per_tile: int, dtype: torch.dtype) -> tuple[_SpanTiles, ...]:
    """The tiles of these ranges, planned once for their values: a step's layers attend over the same ranges."""
    return _plan_span_tiles(tuple(map(tuple, kv_start.tolist())), tuple(map(tuple, kv_end.tolist())), per_tile, dtype)


@functools.lru_cache(maxsize=KEPT_PLANS)
def _plan_span_tiles(
    starts: tuple[tuple[int, ...], ...], ends: tuple[tuple[int, ...], ...], per_tile: int, dtype: torch.dtype
) -> tuple[_SpanTiles, ...]:
    tokens = len(starts[0]) if starts else 0
    by_span: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}  # span -> (sequence, its rows) per tile
    for b, (row_starts, row_ends) in enumerate(zip(starts, ends)):
        rows: dict[tuple[int, int], list[int]] = {}
        for t, (start, end) in enumerate(zip(row_starts, row_ends)):
            if end > start:
                rows.setdefault((start // SPAN * SPAN, -(-end // SPAN) * SPAN), []).append(t)
        for span, ts in rows.items():
            by_span.setdefault(span, []).extend((b, ts[i : i + per_tile]) for i in range(0, len(ts), per_tile))
    plans = []
    for (first, last), items in by_span.items():
        sequences: slice | list[int] = [b for b, _ in items]
        if sequences == list(range(sequences[0], sequences[-1] + 1)):  # a tile a sequence: views, no copies
            sequences = slice(sequences[0], sequences[-1] + 1)
        outside = torch.full((len(items), per_tile, last - first), float("-inf"), dtype=dtype)
        rows, slots = [], []
        for i, (b, ts) in enumerate(items):
            outside[i, len(ts) :] = 0.0  # padding rows: a finite softmax, never read
            for slot, t in enumerate(ts):
                outside[i, slot, starts[b][t] - first : ends[b][t] - first] = 0.0
                rows.append(b * tokens + t)
                slots.append(i * per_tile + slot)
        plans.append(_SpanTiles(first, last, sequences, torch.tensor(rows), torch.tensor(slots), outside[:, None]))
    return tuple(plans)


def attention_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_start: Tensor,
    kv_end: Tensor,
    scale: float,
    gate: Tensor | SplitSums | None = None,
) -> Tensor:
    require_triton("attention")
    batch, tokens, q_heads, head_dim = q.shape
    # the gate read in place (a strided half of each head of q|gate), or its first plane of partials; ungated, a
    # tensor the kernels never read
    gates, gate_plane, gate_splits = planes_of(gate)
    cache_len, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    if (
        q_heads % kv_heads
        or k_cache.shape != v_cache.shape
        or k_cache.shape[0] != batch
        or k_cache.shape[3] != head_dim
        or (gate is not None and (gate.shape != q.shape or gates.stride(-1) != 1))
    ):
        gated = "" if gate is None else f" and gate {list(gate.shape)}"
        raise ValueError(
            f"attention: q {list(q.shape)}{gated} do not fit caches {list(k_cache.shape)}, {list(v_cache.shape)}"
        )
    out = torch.empty(batch, tokens, q_heads, head_dim, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    gates = out if gates is None else gates
    starts = kv_start.to(torch.int32).contiguous()
    ends = kv_end.to(torch.int32).contiguous()
    splits = triton.cdiv(cache_len, SPLIT)
    block_d = triton.next_power_of_2(head_dim)
    f32 = dot_in_float32(q.dtype, k_cache.dtype, v_cache.dtype)
    # query rows per launch: a whole number of tokens, bounded so the partials fit SCRATCH_BYTES
    per_token = batch * q_heads * splits * (head_dim + 2) * 4
    chunk = tokens if splits == 1 else max(1, min(tokens, SCRATCH_BYTES // per_token))
    partial = m = sums = out  # unused when there is one split
    if splits > 1:
        rows = batch * kv_heads * chunk * group
        partial = torch.empty(rows, splits, head_dim, dtype=torch.float32, device=q.device)
        m = torch.empty(rows, splits, dtype=torch.float32, device=q.device)
        sums = torch.empty(rows, splits, dtype=torch.float32, device=q.device)
    for t0 in range(0, tokens, chunk):
        t1 = min(tokens, t0 + chunk)
        grid = (batch * kv_heads, triton.cdiv((t1 - t0) * group, BLOCK_M), splits)
        _attention_kernel[grid](
            q,
            k_cache,
            v_cache,
            starts,
            ends,
            out,
            partial,
            m,
            sums,
            t0,
            t1 - t0,
            tokens,
            kv_heads,
            group,
            head_dim,
            cache_len,
            scale,
            *q.stride(),
            *k_cache.stride(),
            *v_cache.stride(),
            *out.stride(),
            gates,
            *gates.stride()[:3],
            gate_plane,
            SPLITS=splits,
            SPLIT_LEN=SPLIT,
            GATE_SPLITS=gate_splits,
            GATED=gate is not None,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_D=block_d,
            F32=f32,
            # float32 tiles of a 256-wide head overflow shared memory with the default 3 pipeline stages
            num_stages=1 if f32 and block_d > 128 else 3,
            **launch_options(),
        )
        if splits > 1:
            _merge_kernel[(batch * kv_heads * (t1 - t0) * group,)](
                starts,
                ends,
                out,
                partial,
                m,
                sums,
                t0,
                t1 - t0,
                tokens,
                kv_heads,
                group,
                head_dim,
                *out.stride(),
                gates,
                *gates.stride()[:3],
                gate_plane,
                SPLITS=splits,
                SPLIT_LEN=SPLIT,
                GATE_SPLITS=gate_splits,
                GATED=gate is not None,
                BLOCK_D=block_d,
                **launch_options(),
            )
    return out


if triton is not None:

    @device_function
    def _output(o, gate_base, offsets, mask, gate_plane, GATE_SPLITS: tl.constexpr, GATED: tl.constexpr, out_ptr):
        """float32 `o` rounded to the output's dtype and, in a gated layer, times sigmoid of its gate at `offsets`
        from `gate_base` (as stored, or its projection's partials added)."""
        dtype = out_ptr.dtype.element_ty
        o = rounded(o, dtype)
        if GATED:
            o = sigmoid_gated(o, summed_values(gate_base, offsets, mask, gate_plane, GATE_SPLITS, dtype), dtype)
        return o

    @triton.jit(do_not_specialize=["t0", "chunk", "tokens"], do_not_specialize_on_alignment=["q_ptr", "out_ptr"])
    def _attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        start_ptr,
        end_ptr,
        out_ptr,
        partial_ptr,
        m_ptr,
        l_ptr,
        t0,
        chunk,
        tokens,
        kv_heads,
        group,
        head_dim,
        cache_len,
        scale,
        sqb,
        sqt,
        sqh,
        sqd,
        skb,
        sks,
        skh,
        skd,
        svb,
        svs,
        svh,
        svd,
        sob,
        sot,
        soh,
        sod,
        gate_ptr,
        sgb,
        sgt,
        sgh,
        gate_plane,
        SPLITS: tl.constexpr,
        SPLIT_LEN: tl.constexpr,
        GATE_SPLITS: tl.constexpr,
        GATED: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        F32: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        bh = tl.program_id(0)
        b = bh // kv_heads
        kv_head = bh % kv_heads
        split = tl.program_id(2)
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # (token in chunk, head in group)
        valid = rows < chunk * group
        t = t0 + rows // group
        head = kv_head * group + rows % group
        d = tl.arange(0, BLOCK_D)
        d_in = d < head_dim
        q = tl.load(
            q_ptr + b.to(tl.int64) * sqb + t[:, None] * sqt + head[:, None] * sqh + d[None, :] * sqd,
            mask=valid[:, None] & d_in[None, :],
            other=0.0,
        ).to(tl.float32)
        start = tl.load(start_ptr + b * tokens + t, mask=valid, other=0)
        end = tl.load(end_ptr + b * tokens + t, mask=valid, other=0)
        row_lo = tl.maximum(start, split * SPLIT_LEN)
        row_hi = tl.minimum(tl.minimum(end, (split + 1) * SPLIT_LEN), cache_len)
        some = valid & (row_lo < row_hi)
        tile_lo = tl.min(tl.where(some, row_lo, cache_len), axis=0)
        tile_hi = tl.max(tl.where(some, row_hi, 0), axis=0)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = k_ptr + b.to(tl.int64) * skb + kv_head * skh
        v_base = v_ptr + b.to(tl.int64) * svb + kv_head * svh
        for block in range((tile_lo // BLOCK_N) * BLOCK_N, tile_hi, BLOCK_N):
            pos = block + tl.arange(0, BLOCK_N)
            loaded = ((pos >= tile_lo) & (pos < tile_hi))[:, None] & d_in[None, :]
            k = tl.load(k_base + pos[:, None].to(tl.int64) * sks + d[None, :] * skd, mask=loaded, other=0.0)
            v = tl.load(v_base + pos[:, None].to(tl.int64) * svs + d[None, :] * svd, mask=loaded, other=0.0)
            scores = dot(q, tl.trans(k.to(tl.float32)), F32) * scale
            inside = (pos[None, :] >= row_lo[:, None]) & (pos[None, :] < row_hi[:, None])
            scores = tl.where(inside, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(scores - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + dot(p, v.to(tl.float32), F32)
            m_i = m_new

        if SPLITS == 1:
            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty range: acc is 0
            stored = valid[:, None] & d_in[None, :]
            gate_at = t[:, None] * sgt + head[:, None] * sgh + d[None, :]
            o = _output(o, gate_ptr + b.to(tl.int64) * sgb, gate_at, stored, gate_plane, GATE_SPLITS, GATED, out_ptr)
            tl.store(
                out_ptr + b.to(tl.int64) * sob + t[:, None] * sot + head[:, None] * soh + d[None, :] * sod,
                o,
                mask=stored,
            )
        else:
            row = (bh * chunk * group + rows).to(tl.int64)
            tl.store(
                partial_ptr + (row[:, None] * SPLITS + split) * head_dim + d[None, :],
                acc,
                mask=some[:, None] & d_in[None, :],
            )
            tl.store(m_ptr + row * SPLITS + split, m_i, mask=some)
            tl.store(l_ptr + row * SPLITS + split, l_i, mask=some)

    @triton.jit(do_not_specialize=["t0", "chunk", "tokens"], do_not_specialize_on_alignment=["out_ptr"])
    def _merge_kernel(
        start_ptr,
        end_ptr,
        out_ptr,
        partial_ptr,
        m_ptr,
        l_ptr,
        t0,
        chunk,
        tokens,
        kv_heads,
        group,
        head_dim,
        sob,
        sot,
        soh,
        sod,
        gate_ptr,
        sgb,
        sgt,
        sgh,
        gate_plane,
        SPLITS: tl.constexpr,
        SPLIT_LEN: tl.constexpr,
        GATE_SPLITS: tl.constexpr,
        GATED: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0)  # (b, kv head, token in chunk, head in group), as the first kernel numbers them
        bh = row // (chunk * group)
        in_tile = row % (chunk * group)
        b = bh // kv_heads
        t = t0 + in_tile // group
        head = (bh % kv_heads) * group + in_tile % group
        start = tl.load(start_ptr + b * tokens + t)
        end = tl.load(end_ptr + b * tokens + t)
        first = start // SPLIT_LEN
        last = tl.where(end > start, (end - 1) // SPLIT_LEN + 1, first)
        d = tl.arange(0, BLOCK_D)
        d_in = d < head_dim
        base = row.to(tl.int64) * SPLITS
        m_max = float("-inf")
        for s in range(first, last):  # the splits this row's range touches, in order
            m_max = tl.maximum(m_max, tl.load(m_ptr + base + s))
        m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
        total = 0.0
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s in range(first, last):
            weight = tl.exp(tl.load(m_ptr + base + s) - m_safe)
            total += tl.load(l_ptr + base + s) * weight
            acc += tl.load(partial_ptr + (base + s) * head_dim + d, mask=d_in, other=0.0) * weight
        o = acc / tl.where(total > 0, total, 1.0)  # an empty range: acc is 0
        gate_base = gate_ptr + b.to(tl.int64) * sgb + t * sgt + head * sgh
        o = _output(o, gate_base, d, d_in, gate_plane, GATE_SPLITS, GATED, out_ptr)
        tl.store(out_ptr + b.to(tl.int64) * sob + t * sot + head * soh + d * sod, o, mask=d_in)
