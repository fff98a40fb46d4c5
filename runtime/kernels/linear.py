"""Weight-only matmuls, y = x @ W.T, for a dense weight or one kept in its stored layout (`Packed`).

x [M, K] (bf16 on the GPU, float32 on the CPU); W [N, K]; y [M, N] in x's dtype, accumulated in float32.
`matmul_experts` is the routed-expert form for few tokens: W stacked [E, N, K], expert_ids [T, k], and
y[t, s] = W[expert_ids[t, s]] @ x[t].

The CPU path (`*_reference`) dequantizes through the layout's codec (formats/codecs.py, bit-exact with the
reference libraries) and multiplies row by row (cpu_rows.py). The Triton path reads the stored parts and
dequantizes in registers, one pass over W for all rows of a tile. Layouts with a Triton kernel (LAYOUTS):
dense bf16/f16/f32, fp8-tensor, fp8-block, nvfp4-modelopt (other NVFP4 flavours: `to_kernel_layout`, exact),
affine4/affine8 in groups of 32/64/128, gguf-Q8_0, gguf-Q4_K, gguf-Q5_K, gguf-Q6_K.

Exact products: every tl.dot takes operands whose values are exact in bf16 (the bf16 activation; FP8 values;
E2M1 codes times their E4M3 block scale; integer codes; an f16 weight as two bf16 halves), and what a layout
scales by groups is applied to each group's float32 dot: s·Σx·q + b·Σx for affine and Q4_K/Q5_K, d·Σx·q for
Q8_0 and Q6_K, the 128x128 FP8 scale per block, per-tensor scales at the end. So y differs from x @ dequantize()
by float32 summation order only.

Batch invariance: BLOCK_M = 16 rows per tile whatever M (rows past M are zeros), one tile configuration per
(layout, N, K) (`_config`), never chosen by M or by the routing; a split of K, where the weight's shape asks
for one, sums its float32 partials in a fixed order in a second kernel (never atomics). A row's position in a
tile does not change its bits: the tensor-core dot treats every row alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from specpair.errors import BadInput
from specpair.formats import nvfp4
from specpair.formats.codecs import FLOAT_LAYOUTS, nvfp4_read
from specpair.formats.packed import Packed
from specpair.runtime.kernels.cpu_rows import rows_mm
from specpair.runtime.kernels.triton_common import (INTERPRETED, device_function, dot, require_triton, rounded, tl,
                                                    triton)

BLOCK_M = 16
BLOCK_N = 32
TARGET_PROGRAMS = 264  # two per SM of an H200 (132): K is split when the weight's N alone gives fewer


def matmul(x: Tensor, w: Tensor | Packed) -> Tensor:
    if x.is_cuda:
        return matmul_triton(x, w)
    return matmul_reference(x, w)


def matmul_experts(x: Tensor, w: Tensor | Packed, expert_ids: Tensor) -> Tensor:
    if x.is_cuda:
        return matmul_experts_triton(x, w, expert_ids)
    return matmul_experts_reference(x, w, expert_ids)


def _float_weight(w: Tensor | Packed) -> Tensor:
    return w.dequantize() if isinstance(w, Packed) else w.float()


def matmul_reference(x: Tensor, w: Tensor | Packed) -> Tensor:
    return rows_mm(x, _float_weight(w).T).to(x.dtype)


def matmul_experts_reference(x: Tensor, w: Tensor | Packed, expert_ids: Tensor) -> Tensor:
    tokens, top_k = expert_ids.shape
    weights: dict[int, Tensor] = {}
    out = torch.empty(tokens, top_k, w.shape[1], dtype=x.dtype)
    for t in range(tokens):
        for s in range(top_k):
            e = int(expert_ids[t, s])
            if e not in weights:
                weights[e] = _float_weight(w.expert(e) if isinstance(w, Packed) else w[e])
            out[t, s] = rows_mm(x[t:t + 1], weights[e].T)[0]
    return out


def to_kernel_layout(w: Packed) -> Packed:
    """An NVFP4 weight of any flavour as ModelOpt bits (codes and scales move unchanged); other layouts as
    they are. For loaders: the Triton kernel reads nvfp4-modelopt only."""
    if w.layout not in nvfp4.FLAVOURS or w.layout == "nvfp4-modelopt":
        return w
    experts = [w.expert(e) for e in range(w.experts)] if w.experts is not None else [w]
    parts = [nvfp4.to_modelopt(nvfp4_read(w.layout, one.parts, w.name), w.name.removesuffix(".weight"))
             for one in experts]
    parts = [{k: v for k, v in p.items() if k != ".input_scale"} for p in parts]
    stacked = parts[0] if w.experts is None else {k: torch.stack([p[k] for p in parts]) for k in parts[0]}
    return replace(w, layout="nvfp4-modelopt", parts=stacked)


# ---- the Triton path -----------------------------------------------------------------------------------

# Kernel codes per layout; the K step is the span of one iteration: a layout's block, or 128 columns.
DENSE, FP8_TENSOR, FP8_BLOCK, NVFP4, AFFINE4, AFFINE8, Q8_0, Q4_K, Q5_K, Q6_K = range(10)
LAYOUTS = {
    **{layout: DENSE for layout in FLOAT_LAYOUTS}, "fp8-tensor": FP8_TENSOR, "fp8-block": FP8_BLOCK,
    "nvfp4-modelopt": NVFP4, "gguf-Q8_0": Q8_0, "gguf-Q4_K": Q4_K, "gguf-Q5_K": Q5_K, "gguf-Q6_K": Q6_K,
    **{f"affine{bits}-g{group}": AFFINE4 if bits == 4 else AFFINE8 for bits in (4, 8) for group in (32, 64, 128)},
}
GGUF_BLOCKS = {Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}  # values, bytes
FIXED_STEPS = {FP8_BLOCK: 128, NVFP4: 128, **{code: values for code, (values, _) in GGUF_BLOCKS.items()}}
DENSE_STEP = 128


@dataclass(frozen=True)
class _Operand:
    """A weight as the kernel reads it: three part pointers, each with its expert and row strides (in its
    own elements; 0 where it has none), the layout's code and group, and the logical shape."""

    code: int
    group: int
    parts: tuple[Tensor, Tensor, Tensor]
    expert_strides: tuple[int, int, int]
    row_strides: tuple[int, int, int]
    n: int
    k: int
    experts: int | None
    f16_halves: bool  # a dense f16 weight, fed to bf16 dots as two exact halves
    f32_weight: bool  # a dense f32 weight: its values are not bf16, so the dot runs in float32


def _strides(part: Tensor, stacked: bool) -> tuple[int, int]:
    """(expert stride, row stride) of a part [(E,) rows, cols], [(E,)] or []."""
    lead = 1 if stacked else 0
    expert = part.stride(0) if stacked and part.ndim else 0
    row = part.stride(lead) if part.ndim >= lead + 2 else 0
    return expert, row


def _operand(w: Tensor | Packed) -> _Operand:
    stacked = len(w.shape) == 3
    n, k = w.shape[-2], w.shape[-1]
    if isinstance(w, Tensor):
        parts = [w.contiguous()]
        code, group, dtype = DENSE, 0, w.dtype
    else:
        if w.layout not in LAYOUTS:
            hint = " (repack it with kernels.linear.to_kernel_layout)" if w.layout in nvfp4.FLAVOURS else ""
            raise BadInput(w.name, f"layout {w.layout} has no Triton matmul kernel{hint}")
        code = LAYOUTS[w.layout]
        group = int(w.layout.rsplit("-g", 1)[1]) if code in (AFFINE4, AFFINE8) else 0
        p = w.parts
        if code == DENSE:
            parts = [p[""]]
        elif code in (FP8_TENSOR, FP8_BLOCK):
            parts = [p[".weight"], p[".weight_scale" if code == FP8_TENSOR else ".weight_scale_inv"]]
        elif code == NVFP4:
            parts = [p[".weight"], p[".weight_scale"], p[".weight_scale_2"]]
        elif code in (AFFINE4, AFFINE8):  # the U32 words as bytes: LSB-first codes are little-endian bytes
            parts = [p[".weight"].contiguous().view(torch.uint8), p[".scales"], p[".biases"]]
        else:
            parts = [p[""].view(torch.uint8).reshape(*w.shape[:-1], -1)]
        dtype = parts[0].dtype
        parts = [part.contiguous() for part in parts]
    parts += [parts[0]] * (3 - len(parts))
    strides = [_strides(part, stacked) for part in parts]
    return _Operand(code, group, tuple(parts), tuple(s[0] for s in strides), tuple(s[1] for s in strides),
                    n, k, w.shape[0] if stacked else None, f16_halves=code == DENSE and dtype == torch.float16,
                    f32_weight=code == DENSE and dtype == torch.float32)


def _config(op: _Operand) -> tuple[int, int, int]:
    """(K step, splits of K, columns per split), from the layout and the weight's shape alone."""
    step = FIXED_STEPS.get(op.code, op.group if op.code in (AFFINE4, AFFINE8) else DENSE_STEP)
    steps = triton.cdiv(op.k, step)
    splits = max(1, min(TARGET_PROGRAMS // triton.cdiv(op.n, BLOCK_N), steps // 2))
    per_split = triton.cdiv(steps, splits) * step
    return step, triton.cdiv(op.k, per_split), per_split


def _launch(x: Tensor, op: _Operand, out_rows: int, tiles: int, table: Tensor | None = None,
            order: Tensor | None = None, top_k: int = 0) -> Tensor:
    """y [out_rows, N]: rows of x in tiles of BLOCK_M, or with `table` (top_k > 0) the tiles of routed pairs."""
    step, splits, per_split = _config(op)
    f32 = INTERPRETED or x.dtype != torch.bfloat16 or op.f32_weight
    y = torch.empty(out_rows, op.n, dtype=x.dtype, device=x.device)
    if out_rows == 0 or op.n == 0:
        return y
    partial = y if splits == 1 else torch.empty(splits, out_rows, op.n, dtype=torch.float32, device=x.device)
    if table is None:  # int32 pointers the kernel never reads (its loads are masked off)
        table = order = torch.empty(3, dtype=torch.int32, device=x.device)
    grid = (tiles, triton.cdiv(op.n, BLOCK_N), splits)
    _matmul_kernel[grid](
        x, y, partial, *op.parts, table, order,
        out_rows, op.n, op.k, x.stride(0), per_split, splits, top_k,
        *op.expert_strides, *op.row_strides,
        LAYOUT=op.code, GROUP=op.group, STEP=step, F16_HALVES=op.f16_halves and not f32, F32=f32,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    if splits > 1:
        _sum_splits_kernel[(out_rows, triton.cdiv(op.n, 256))](partial, y, splits, out_rows * op.n, op.n, BLOCK=256)
    return y


def matmul_triton(x: Tensor, w: Tensor | Packed) -> Tensor:
    require_triton("matmul")
    op = _operand(w)
    if isinstance(w, Packed):
        x = w.inputs(x)
    if len(w.shape) != 2 or x.shape[-1] != op.k:
        raise ValueError(f"matmul: x {list(x.shape)} and weight {list(w.shape)} do not fit")
    x = x.contiguous()
    return _launch(x, op, x.shape[0], triton.cdiv(x.shape[0], BLOCK_M))


def matmul_experts_triton(x: Tensor, w: Tensor | Packed, expert_ids: Tensor) -> Tensor:
    """Pairs (t, s) are sorted by expert on the device and cut into tiles of one expert's rows, so each
    touched expert is read once per tile of its tokens; the tile table is built with a size bound that depends
    on T·k and E alone (no host synchronisation, fit for CUDA graphs)."""
    require_triton("matmul_experts")
    op = _operand(w)
    if isinstance(w, Packed):
        x = w.inputs(x)
    if op.experts is None or x.shape[-1] != op.k or expert_ids.shape[0] != x.shape[0]:
        raise ValueError(f"matmul_experts: x {list(x.shape)}, weight {list(w.shape)}, expert_ids "
                         f"{list(expert_ids.shape)} do not fit")
    tokens, top_k = expert_ids.shape
    pairs = tokens * top_k
    flat = expert_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True).to(torch.int32)
    # scatter_add, not bincount: bincount sizes its output from the data, a host synchronisation on CUDA
    counts = torch.zeros(op.experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    first_pair = torch.cumsum(counts, 0) - counts
    tiles_per_expert = (counts + BLOCK_M - 1) // BLOCK_M
    tiles_end = torch.cumsum(tiles_per_expert, 0)
    tiles = triton.cdiv(pairs, BLOCK_M) + min(op.experts, pairs)
    tile = torch.arange(tiles, device=x.device)
    expert = torch.searchsorted(tiles_end, tile, right=True).clamp_max(op.experts - 1)
    begin = first_pair[expert] + (tile - (tiles_end[expert] - tiles_per_expert[expert])) * BLOCK_M
    end = torch.minimum(begin + BLOCK_M, first_pair[expert] + counts[expert])
    end = torch.where(tile < tiles_end[-1], end, begin)  # tiles past the last one are empty
    table = torch.stack([expert, begin, end], 1).to(torch.int32).contiguous()
    y = _launch(x.contiguous(), op, pairs, tiles, table, order, top_k)
    return y.reshape(tokens, top_k, op.n)


if triton is not None:
    @device_function
    def _f16_at(ptr, n_in):
        """The little-endian f16 at byte pointers `ptr` (one per weight row), as float32."""
        low = tl.load(ptr, mask=n_in, other=0).to(tl.uint16)
        high = tl.load(ptr + 1, mask=n_in, other=0).to(tl.uint16)
        return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)

    @device_function
    def _e2m1(code):
        """E2M1 codes (uint8, 0..15) as float32, built from their bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and signs."""
        c = code.to(tl.uint32)
        magnitude = c & 7
        exponent = magnitude >> 1
        bits = tl.where(exponent == 0, tl.where(magnitude == 1, 0x3F000000, 0),
                        ((exponent + 126) << 23) | ((magnitude & 1) << 22))
        return (bits | ((c >> 3) << 31)).to(tl.float32, bitcast=True)

    @device_function
    def _x_tile(x_ptr, x_rows, valid, stride_xm, cols, K):
        return tl.load(x_ptr + x_rows[:, None] * stride_xm + cols[None, :],
                       mask=valid[:, None] & (cols < K)[None, :], other=0.0).to(tl.float32)

    @device_function
    def _bytes(ptr, n_in, offsets):
        """Bytes at offsets [1, X] from each weight row's pointer in `ptr` [BLOCK_N]: [BLOCK_N, X]."""
        return tl.load(ptr[:, None] + offsets, mask=n_in[:, None], other=0)

    @device_function
    def _byte(ptr, n_in):
        return tl.load(ptr, mask=n_in, other=0)

    # Routed or not, final store or float32 partials: runtime branches on unspecialised scalars, so each layout
    # compiles once (a K-quant kernel takes seconds to compile), whatever the call.
    @triton.jit(do_not_specialize=["out_rows", "splits", "top_k"], do_not_specialize_on_alignment=["x_ptr", "y_ptr"])
    def _matmul_kernel(x_ptr, y_ptr, partial_ptr, p0, p1, p2, table_ptr, order_ptr,
                       out_rows, N, K, stride_xm, per_split, splits, top_k,
                       e0, e1, e2, r0, r1, r2,
                       LAYOUT: tl.constexpr, GROUP: tl.constexpr, STEP: tl.constexpr, F16_HALVES: tl.constexpr,
                       F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        tile = tl.program_id(0)
        slot = tl.arange(0, BLOCK_M)
        # a tile is rows begin..end of the list of output rows: x's rows (top_k = 0), or the (token, slot) pairs
        # of one expert, sorted, with (expert, begin, end) in the table (top_k > 0)
        routed = top_k > 0
        expert = tl.load(table_ptr + tile * 3, mask=routed, other=0).to(tl.int64)
        begin = tl.where(routed, tl.load(table_ptr + tile * 3 + 1, mask=routed, other=0), tile * BLOCK_M)
        end = tl.where(routed, tl.load(table_ptr + tile * 3 + 2, mask=routed, other=0), out_rows)
        index = begin + slot
        valid = index < end
        pair = tl.where(routed, tl.load(order_ptr + index, mask=index < tl.where(routed, end, 0), other=0), index)
        x_rows = (pair // tl.maximum(top_k, 1)).to(tl.int64)
        y_rows = pair.to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_in = n < N
        n64 = n.to(tl.int64)
        w0 = p0 + expert * e0 + n64 * r0  # each weight row's first element (byte) of part 0
        k_lo = tl.program_id(2) * per_split
        k_hi = tl.where(begin < end, tl.minimum(K, k_lo + per_split), k_lo)  # an empty tile reads no weights
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(k_lo, k_hi, STEP):
            if LAYOUT == 0 or LAYOUT == 1:  # dense, fp8-tensor
                cols = k0 + tl.arange(0, STEP)
                x = _x_tile(x_ptr, x_rows, valid, stride_xm, cols, K)
                w = tl.load(w0[:, None] + cols[None, :], mask=n_in[:, None] & (cols < K)[None, :],
                            other=0.0).to(tl.float32)
                if F16_HALVES:
                    high = w.to(tl.bfloat16).to(tl.float32)
                    acc += dot(x, tl.trans(high), F32) + dot(x, tl.trans(w - high), F32)
                else:
                    acc += dot(x, tl.trans(w), F32)
            elif LAYOUT == 2:  # fp8-block: a 128x128 scale per block, applied to the block's dot
                cols = k0 + tl.arange(0, STEP)
                x = _x_tile(x_ptr, x_rows, valid, stride_xm, cols, K)
                w = tl.load(w0[:, None] + cols[None, :], mask=n_in[:, None] & (cols < K)[None, :],
                            other=0.0).to(tl.float32)
                scale = tl.load(p1 + expert * e1 + (n64 // 128) * r1 + k0 // 128, mask=n_in, other=0.0)
                acc += dot(x, tl.trans(w), F32) * scale.to(tl.float32)[None, :]
            elif LAYOUT == 3:  # nvfp4: byte i holds elements 2i (low nibble) and 2i+1 (high)
                pairs = tl.arange(0, STEP // 2)
                even = k0 + 2 * pairs
                codes = tl.load(w0[:, None] + (k0 // 2 + pairs)[None, :],
                                mask=n_in[:, None] & (even < K)[None, :], other=0)
                scale = tl.load(p1 + expert * e1 + n64[:, None] * r1 + (k0 + 2 * pairs)[None, :] // 16,
                                mask=n_in[:, None] & (even < K)[None, :], other=0.0).to(tl.float32)
                low = _e2m1(codes & 0xF) * scale  # exact: E2M1 times E4M3 fits in bf16
                high = _e2m1(codes >> 4) * scale
                acc += dot(_x_tile(x_ptr, x_rows, valid, stride_xm, even, K), tl.trans(low), F32)
                acc += dot(_x_tile(x_ptr, x_rows, valid, stride_xm, even + 1, K), tl.trans(high), F32)
            elif LAYOUT == 4 or LAYOUT == 5:  # affine: s·Σx·q + b·Σx per group of STEP = GROUP columns
                if LAYOUT == 4:
                    pairs = tl.arange(0, STEP // 2)
                    codes = _bytes(w0, n_in, (k0 // 2 + pairs)[None, :])
                    x_even = _x_tile(x_ptr, x_rows, valid, stride_xm, k0 + 2 * pairs, K)
                    x_odd = _x_tile(x_ptr, x_rows, valid, stride_xm, k0 + 2 * pairs + 1, K)
                    xq = dot(x_even, tl.trans((codes & 0xF).to(tl.float32)), F32)
                    xq += dot(x_odd, tl.trans((codes >> 4).to(tl.float32)), F32)
                    x_sum = tl.sum(x_even, axis=1) + tl.sum(x_odd, axis=1)
                else:
                    cols = k0 + tl.arange(0, STEP)
                    codes = _bytes(w0, n_in, cols[None, :])
                    x = _x_tile(x_ptr, x_rows, valid, stride_xm, cols, K)
                    xq = dot(x, tl.trans(codes.to(tl.float32)), F32)
                    x_sum = tl.sum(x, axis=1)
                group = n64 * r1 + k0 // GROUP
                scale = tl.load(p1 + expert * e1 + group, mask=n_in, other=0.0).to(tl.float32)
                bias = tl.load(p2 + expert * e2 + group, mask=n_in, other=0.0).to(tl.float32)
                acc += xq * scale[None, :] + x_sum[:, None] * bias[None, :]
            elif LAYOUT == 6:  # Q8_0: 34 bytes per 32 values, f16 d then int8 codes
                block = w0 + (k0 // 32) * 34
                d = _f16_at(block, n_in)
                i = tl.arange(0, 32)
                codes = _bytes(block + 2, n_in, i[None, :]).to(tl.int8, bitcast=True).to(tl.float32)
                x = _x_tile(x_ptr, x_rows, valid, stride_xm, k0 + i, K)
                acc += dot(x, tl.trans(codes), F32) * d[None, :]
            elif LAYOUT == 7 or LAYOUT == 8:  # Q4_K / Q5_K: 8 sub-blocks of 32, d·sc·Σx·q − dmin·m·Σx
                if LAYOUT == 7:
                    block = w0 + (k0 // 256) * 144
                    qs = block + 16
                else:
                    block = w0 + (k0 // 256) * 176
                    qs = block + 48
                d = _f16_at(block, n_in)
                dmin = _f16_at(block + 2, n_in)
                i = tl.arange(0, 32)
                if LAYOUT == 8:
                    qh = _bytes(block + 16, n_in, i[None, :])
                for j in tl.static_range(8):
                    if j < 4:  # 6-bit scale and min, packed in the 12 bytes at 4
                        sc = _byte(block + 4 + j, n_in) & 63
                        m = _byte(block + 8 + j, n_in) & 63
                    else:
                        sc = (_byte(block + 8 + j, n_in) & 15) | ((_byte(block + j, n_in) >> 6) << 4)
                        m = (_byte(block + 8 + j, n_in) >> 4) | ((_byte(block + 4 + j, n_in) >> 6) << 4)
                    codes = (_bytes(qs + 32 * (j // 2), n_in, i[None, :]) >> (4 * (j % 2))) & 0xF
                    if LAYOUT == 8:
                        codes = codes | (((qh >> j) & 1) << 4)
                    x = _x_tile(x_ptr, x_rows, valid, stride_xm, k0 + 32 * j + i, K)
                    xq = dot(x, tl.trans(codes.to(tl.float32)), F32)
                    acc += xq * (d * sc.to(tl.float32))[None, :]
                    acc -= tl.sum(x, axis=1)[:, None] * (dmin * m.to(tl.float32))[None, :]
            else:  # Q6_K: 16 sub-blocks of 16, d·sc·Σx·(q − 32); q = 4 low bits (ql) | 2 high bits (qh)
                block = w0 + (k0 // 256) * 210
                d = _f16_at(block + 208, n_in)
                i = tl.arange(0, 16)
                for sub in tl.static_range(16):  # values 16·sub.. : half h, quarter q, 16-run r
                    h = sub // 8
                    q = (sub // 2) % 4
                    r = sub % 2
                    low = _bytes(block + 64 * h + 32 * (q % 2) + 16 * r, n_in, i[None, :])
                    high = _bytes(block + 128 + 32 * h + 16 * r, n_in, i[None, :])
                    codes = ((low >> (4 * (q // 2))) & 0xF) | (((high >> (2 * q)) & 3) << 4)
                    sc = _byte(block + 192 + sub, n_in).to(tl.int8, bitcast=True).to(tl.float32)
                    x = _x_tile(x_ptr, x_rows, valid, stride_xm, k0 + 16 * sub + i, K)
                    acc += dot(x, tl.trans(codes.to(tl.float32) - 32.0), F32) * (d * sc)[None, :]
        if LAYOUT == 1:
            acc = acc * tl.load(p1 + expert * e1).to(tl.float32)
        if LAYOUT == 3:
            acc = acc * tl.load(p2 + expert * e2).to(tl.float32)
        mask = valid[:, None] & n_in[None, :]
        if splits > 1:  # float32 partials [splits, out_rows, N], summed in order by _sum_splits_kernel
            split_rows = tl.program_id(2).to(tl.int64) * out_rows + y_rows
            tl.store(partial_ptr + split_rows[:, None] * N + n64[None, :], acc, mask=mask)
        else:
            tl.store(y_ptr + y_rows[:, None] * N + n64[None, :], rounded(acc, y_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["plane"])
    def _sum_splits_kernel(partial_ptr, y_ptr, splits, plane, N, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = n < N
        total = tl.zeros([BLOCK], tl.float32)
        for s in range(splits):  # in order: the same bits for every row
            total += tl.load(partial_ptr + s * plane.to(tl.int64) + row * N + n, mask=inside, other=0.0)
        tl.store(y_ptr + row * N + n, rounded(total, y_ptr.dtype.element_ty), mask=inside)
