"""GGUF tensor data: rows of float32 to ggml blocks (what `specpair convert --to gguf:TYPE` writes), and back.

F32, F16, BF16, Q8_0 and Q4_0 are gguf-py's own quantizers. Its Q8_0 bytes are llama.cpp's; its Q4_0 bytes
are too, except the sign of d in an all-zero block whose first value is -0.0 (the values are the same).
gguf-py has no k-quant quantizer, so Q4_K, Q5_K and Q6_K are ours, over whole arrays of blocks:
  "search"  llama.cpp's reference quantizers without an importance matrix (quantize_row_q{4,5,6}_K_ref,
            which is what llama-quantize runs when given no imatrix): a scale (and min) search per sub-block,
            then 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) sub-block scales under one f16 scale per super-block.
            Every float32 operation happens in the C code's order, sums included, so the bytes equal
            those of an x86-64 llama.cpp build (where that code is compiled without FMA contraction).
  "rtn"     the same pipeline without the search: each sub-block's plain range fit, then round to nearest.
            Kept to measure what the search buys; the other types are round-to-nearest already.
Types with f16 numbers refuse NaN and inf, and values so large that an f16 scale would overflow.
Dequantizing goes through gguf-py, which reads every type it knows (k-quants, IQ*, NVFP4, ...).
Q8_0, the type most conversions write, also has a torch quantizer with the same bytes (`quantize_q8_0`):
it runs on every core and on the GPU, where gguf-py's runs on one core.
"""

from __future__ import annotations

import math
import atexit
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from specpair.errors import BadInput

if TYPE_CHECKING:  # worker processes import this module for the numpy quantizers alone
    import torch

WRITABLE: dict[str, GGMLQuantizationType] = {
    t.name: t for t in (
        GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
    )
}
BLOCK_SIZES: dict[str, tuple[int, int]] = {name: GGML_QUANT_SIZES[t] for name, t in WRITABLE.items()}
"""Type name -> (values per block, bytes per block)."""


def block_size(qtype: str) -> tuple[int, int]:
    """(values per block, bytes per block) of any ggml type gguf-py knows."""
    ggml_type = GGMLQuantizationType.__members__.get(qtype.upper())
    if ggml_type is None:
        raise BadInput(qtype, "unknown GGUF type")
    return GGML_QUANT_SIZES[ggml_type]
METHODS = ("search", "rtn")
# Byte offsets of the f16 numbers in each block (an F16 "block" is one value): checked after quantizing,
# since values too large for them come out as inf.
F16_OFFSETS: dict[str, tuple[int, ...]] = {
    "F16": (0,), "Q8_0": (0,), "Q4_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}

# One super-block of QK_K values (ggml-common.h block_q4_K, block_q5_K, block_q6_K), little-endian.
KQUANT_BLOCKS: dict[str, np.dtype] = {
    "Q4_K": np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]),
    "Q5_K": np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]),
    "Q6_K": np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]),
}


@dataclass(frozen=True)
class AffineSearch:
    """Q4_K/Q5_K sub-block fit x ≈ scale·q − min with codes q in 0..top (make_qkx2_quants).

    Besides the plain fit of the range onto `top` levels, try mapping it onto top + first + k·step levels
    for k = 0..steps, refit scale and min by weighted least squares, and keep the smallest weighted error.
    """

    top: int
    first: float
    step: float
    steps: int


AFFINE_SUB_BLOCK = 32
AFFINE_SEARCH: dict[str, AffineSearch] = {
    "Q4_K": AffineSearch(top=15, first=-1.0, step=0.1, steps=20),
    "Q5_K": AffineSearch(top=31, first=-0.5, step=0.1, steps=15),
}
SCALE_TOP = 63  # Q4_K/Q5_K sub-block scales and mins are 6-bit
# Q6_K (make_qx_quants): sub-blocks of 16, codes −32..31 stored +32; the search tries 32 + 0.1·k levels.
Q6_SUB_BLOCK = 16
Q6_HALF = 32
Q6_TRIES = tuple(k for k in range(-9, 10) if k)
Q6_SCALE_HALF = 128  # sub-block scales are int8 under d = max|scale| / 128
GROUP_MAX_EPS = np.float32(1e-15)  # llama.cpp treats a sub-block whose peak is below this as all zero

CHUNK_BLOCKS = 1024  # super-blocks per pass: keeps the [32, n] float32 temporaries in cache


def quantize(w: np.ndarray, qtype: str, method: str = "search", name: str = "tensor") -> np.ndarray:
    """uint8 [..., row_bytes] of ggml `qtype` blocks for float32 `w` [..., cols], one tensor row per last-axis row.

    `method` picks the k-quant quantizer ("search" or "rtn"); the other types have one. `name` is the
    tensor's name for errors. For F32 the result may share memory with `w`.
    """
    ggml_type = WRITABLE.get(qtype.upper())
    if ggml_type is None:
        raise BadInput(name, f"cannot write GGUF type {qtype!r}; writable: {', '.join(WRITABLE)}")
    if method not in METHODS:
        raise BadInput(name, f"unknown GGUF quantization method {method!r}; expected one of {', '.join(METHODS)}")
    if np.ndim(w) == 0:
        raise BadInput(name, "is a scalar; GGUF tensors have at least one dimension")
    w = np.ascontiguousarray(w, dtype=np.float32)
    block_values, block_bytes = GGML_QUANT_SIZES[ggml_type]
    cols = w.shape[-1]
    if cols % block_values:
        raise BadInput(name, f"rows of {cols} values do not split into {ggml_type.name} blocks of {block_values}")
    if ggml_type.name in F16_OFFSETS and not np.isfinite(w).all():
        raise BadInput(name, f"has NaN or infinite values; {ggml_type.name} cannot encode them (F32 and BF16 can)")
    if ggml_type.name in KQUANT_BLOCKS:
        data = _quantize_kquant(w.reshape(-1, QK_K), ggml_type.name, method == "search")
    else:
        # f16 overflow is reported below; in blocks of values under ~1e-38 gguf-py's 1/d overflows, but d
        # itself rounds to 0 in f16 there, so those blocks decode to 0 whatever their codes
        with np.errstate(over="ignore", invalid="ignore"):
            data = gguf_quantize(w, ggml_type)
    data = data.view(np.uint8).reshape(-1, block_bytes)
    for offset in F16_OFFSETS.get(ggml_type.name, ()):
        if not np.isfinite(data[:, offset:offset + 2].copy().view("<f2")).all():
            raise BadInput(name, f"has values up to {np.abs(w).max():.4g}, too large for {ggml_type.name}'s f16 "
                                 "numbers (F32 and BF16 can hold them)")
    return data.reshape(*w.shape[:-1], cols // block_values * block_bytes)


def dequantize(blocks: np.ndarray, qtype: str, shape: Sequence[int], name: str = "tensor") -> np.ndarray:
    """float32 `shape` from the ggml `qtype` bytes of a tensor (any type gguf-py reads, not only WRITABLE)."""
    ggml_type = GGMLQuantizationType.__members__.get(qtype.upper())
    if ggml_type is None:
        raise BadInput(name, f"unknown GGUF type {qtype!r}")
    shape = tuple(shape)
    block_values, block_bytes = GGML_QUANT_SIZES[ggml_type]
    if not shape or shape[-1] % block_values:
        raise BadInput(name, f"shape {shape} does not split into {ggml_type.name} rows of whole blocks "
                             f"of {block_values}")
    rows, row_bytes = math.prod(shape[:-1]), shape[-1] // block_values * block_bytes
    data = np.ascontiguousarray(blocks).view(np.uint8)
    if data.size != rows * row_bytes:
        raise BadInput(name, f"has {data.size} bytes of data; {ggml_type.name} {list(shape)} needs {rows * row_bytes}")
    try:
        values = gguf_dequantize(data.reshape(rows, row_bytes), ggml_type)
    except NotImplementedError:
        raise BadInput(name, f"gguf-py cannot dequantize {ggml_type.name}") from None
    return values.astype(np.float32, copy=False).reshape(shape)


PARALLEL_VALUES = 1 << 21  # rows of about this many values go to each worker process


def quantize_in_processes(w: np.ndarray, qtype: str, method: str = "search", name: str = "tensor") -> np.ndarray:
    """`quantize` over slices of rows in worker processes, one per core: the numpy block search holds the
    GIL between its many small steps, so threads do not scale it. Same bytes (rows quantize independently)."""
    cols = w.shape[-1] if w.ndim else 0
    rows = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, cols) if cols else w
    workers = os.cpu_count() or 1
    if workers == 1 or not cols or rows.size < 2 * PARALLEL_VALUES:
        return quantize(w, qtype, method, name)
    step = max(1, PARALLEL_VALUES // cols)
    pieces = [rows[start:start + step] for start in range(0, len(rows), step)]
    data = list(_process_pool().map(quantize, pieces, repeat(qtype), repeat(method), repeat(name)))
    return np.concatenate(data).reshape(*w.shape[:-1], -1)


@functools.cache
def _process_pool():
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawned, not forked: the parent runs torch and OpenMP threads, which a fork would copy mid-flight
    pool = ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn"))
    atexit.register(pool.shutdown)  # before interpreter teardown, which the pool's own exit hook does not survive
    return pool


def _quantize_kquant(blocks: np.ndarray, qtype: str, search: bool) -> np.ndarray:
    """uint8 [n, block bytes] for float32 super-blocks [n, QK_K], a cache-sized slice of blocks at a time."""
    out = np.empty((len(blocks), KQUANT_BLOCKS[qtype].itemsize), np.uint8)
    pack = _quantize_q6_k if qtype == "Q6_K" else _quantize_affine_k
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # masked lanes: flat or all-zero sub-blocks
        for start in range(0, len(blocks), CHUNK_BLOCKS):
            chunk = blocks[start:start + CHUNK_BLOCKS]
            out[start:start + len(chunk)] = pack(chunk, qtype, search).view(np.uint8).reshape(len(chunk), -1)
    return out


def _sum_in_order(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 from 0, one row after another: the C loop's float32 rounding (np.sum pairs terms up)."""
    total = np.zeros(terms.shape[1:], np.float32)
    for row in terms:
        total += row
    return total


def _sub_blocks(blocks: np.ndarray, size: int) -> np.ndarray:
    """[size, n·QK_K/size]: column c is sub-block c % (QK_K/size) of super-block c // (QK_K/size)."""
    return np.ascontiguousarray(blocks.reshape(-1, size).T)


def _codes_by_block(codes: np.ndarray) -> np.ndarray:
    """uint8 [n, QK_K] in value order from the [size, n·QK_K/size] layout of _sub_blocks."""
    return codes.T.reshape(-1, QK_K).astype(np.uint8)


def _fit_affine(x: np.ndarray, grid: AffineSearch, search: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale [n], min [n], codes [32, n]) per column of x [32, n], with x ≈ scale·codes − min."""
    f32 = np.float32
    top = f32(grid.top)
    low = np.minimum(x.min(axis=0), f32(0))  # the offset is never positive: a zero always fits
    high = x.max(axis=0)
    flat = high == low
    weights = np.sqrt(_sum_in_order(x * x) / f32(AFFINE_SUB_BLOCK)) + np.abs(x)
    inverse = top / (high - low)
    scale = f32(1) / inverse
    codes = _affine_codes(x, low, inverse, top)
    if search:
        best_error = _sum_in_order(weights * np.square(scale * codes + low - x))
        sum_w = _sum_in_order(weights)
        sum_x = _sum_in_order(weights * x)
        for k in range(grid.steps + 1):
            # (high - low) uses the best offset so far, as llama.cpp does
            inverse = (f32(grid.first) + f32(grid.step) * f32(k) + top) / (high - low)
            trial = _affine_codes(x, low, inverse, top)
            weighted = weights * trial
            sum_l = _sum_in_order(weighted)
            sum_l2 = _sum_in_order(weighted * trial)
            sum_xl = _sum_in_order(weighted * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            trial_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            trial_low = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = trial_low > 0  # refit without an offset
            trial_scale = np.where(positive, sum_xl / sum_l2, trial_scale)
            trial_low = np.where(positive, f32(0), trial_low)
            error = _sum_in_order(weights * np.square(trial_scale * trial + trial_low - x))
            better = ~flat & (det > 0) & (error < best_error)
            codes = np.where(better, trial, codes)
            best_error = np.where(better, error, best_error)
            scale = np.where(better, trial_scale, scale)
            low = np.where(better, trial_low, low)
    return np.where(flat, f32(0), scale), -low, np.where(flat, f32(0), codes)


def _affine_codes(x: np.ndarray, low: np.ndarray, inverse: np.ndarray, top: np.float32) -> np.ndarray:
    """clip(rint(inverse·(x − low)), 0, top) per column; where a range under ~1e-37 overflowed `inverse`,
    0s, which is what llama.cpp's nearest_int turns inf and NaN into (and never a NaN code here)."""
    codes = np.clip(np.rint(inverse * (x - low)), np.float32(0), top)
    overflowed = ~np.isfinite(inverse)
    if overflowed.any():
        codes[:, overflowed] = 0
    return codes


def _six_bit(values: np.ndarray, largest: np.ndarray) -> np.ndarray:
    """Sub-block scales (or mins) [n, 8] as 6-bit codes of largest/63; the C code's uint8 wrap kept,
    and 0s where 63/largest overflows, as there."""
    inverse = np.where(largest > 0, np.float32(SCALE_TOP) / largest, np.float32(0))
    inverse = np.where(np.isfinite(inverse), inverse, np.float32(0))
    return np.minimum(np.rint(inverse[:, None] * values).astype(np.int32).astype(np.uint8), SCALE_TOP)


def _quantize_affine_k(blocks: np.ndarray, qtype: str, search: bool) -> np.ndarray:
    """Q4_K or Q5_K super-blocks for float32 [n, QK_K]."""
    grid = AFFINE_SEARCH[qtype]
    n, per_block = len(blocks), QK_K // AFFINE_SUB_BLOCK
    x = _sub_blocks(blocks, AFFINE_SUB_BLOCK)
    scale, minimum, codes = _fit_affine(x, grid, search)
    scale, minimum = scale.reshape(n, per_block), minimum.reshape(n, per_block)
    largest_scale = np.maximum(scale.max(axis=1), np.float32(0))
    largest_min = np.maximum(minimum.max(axis=1), np.float32(0))
    scale_codes, min_codes = _six_bit(scale, largest_scale), _six_bit(minimum, largest_min)
    d = (largest_scale / np.float32(SCALE_TOP)).astype(np.float16)
    dmin = (largest_min / np.float32(SCALE_TOP)).astype(np.float16)

    # Requantize against the stored scales; a sub-block whose scale became 0 keeps the fit's codes.
    step = (d.astype(np.float32)[:, None] * scale_codes).reshape(-1)
    offset = (dmin.astype(np.float32)[:, None] * min_codes).reshape(-1)
    final = np.clip(np.rint((x + offset) / step), np.float32(0), np.float32(grid.top))
    codes = _codes_by_block(np.where(step != 0, final, codes))

    out = np.zeros(n, KQUANT_BLOCKS[qtype])
    out["d"], out["dmin"] = d, dmin
    low_sc, high_sc = scale_codes[:, :4], scale_codes[:, 4:]
    low_m, high_m = min_codes[:, :4], min_codes[:, 4:]
    out["scales"] = np.concatenate([
        low_sc | (high_sc >> 4) << 6,  # bytes 0-3: scales 0-3, top bits of scales 4-7
        low_m | (high_m >> 4) << 6,  # bytes 4-7: mins 0-3, top bits of mins 4-7
        (high_sc & 15) | (high_m & 15) << 4,  # bytes 8-11: low 4 bits of scales and mins 4-7
    ], axis=1)
    # qs: 4 runs of 32 bytes; run r holds sub-block 2r in low nibbles and 2r+1 in high nibbles
    nibbles = (codes & 15).reshape(n, 4, 2, AFFINE_SUB_BLOCK)
    out["qs"] = (nibbles[:, :, 0] | nibbles[:, :, 1] << 4).reshape(n, -1)
    if qtype == "Q5_K":  # qh[l] bit j = fifth bit of value 32j + l
        fifth = (codes >> 4).reshape(n, per_block, AFFINE_SUB_BLOCK) << np.arange(per_block, dtype=np.uint8)[:, None]
        out["qh"] = np.bitwise_or.reduce(fifth, axis=1)
    return out


def _fit_q6(x: np.ndarray, search: bool) -> tuple[np.ndarray, np.ndarray]:
    """(scale [n], codes + 32 [16, n]) per column of x [16, n], x ≈ scale·codes (make_qx_quants, x² weights)."""
    f32 = np.float32
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=0)[None], axis=0)[0]  # signed; first of equal magnitudes
    empty = np.abs(peak) < GROUP_MAX_EPS
    half = f32(Q6_HALF)
    inverse = -half / peak  # the peak lands on −32, the level with no +32 counterpart
    codes = np.clip(np.rint(inverse * x), -half, half - 1)
    if search:
        weights = x * x
        weighted_x = weights * x
        sum_lx = _sum_in_order(weighted_x * codes)
        sum_l2 = _sum_in_order(weights * codes * codes)
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, f32(0))
        best = scale * sum_lx
        for k in Q6_TRIES:
            trial = np.clip(np.rint(-(half + f32(0.1) * f32(k)) / peak * x), -half, half - 1)
            sum_lx = _sum_in_order(weighted_x * trial)
            sum_l2 = _sum_in_order(weights * trial * trial)
            better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)  # larger (Σwxl)²/Σwl² = smaller error
            codes = np.where(better, trial, codes)
            scale = np.where(better, sum_lx / sum_l2, scale)
            best = np.where(better, scale * sum_lx, best)
    else:
        scale = f32(1) / inverse
    return np.where(empty, f32(0), scale), np.where(empty, f32(0), codes + half)


def _quantize_q6_k(blocks: np.ndarray, qtype: str, search: bool) -> np.ndarray:
    """Q6_K super-blocks for float32 [n, QK_K]."""
    n = len(blocks)
    x = _sub_blocks(blocks, Q6_SUB_BLOCK)
    scale, codes = _fit_q6(x, search)
    scale = scale.reshape(n, QK_K // Q6_SUB_BLOCK)
    peak = np.take_along_axis(scale, np.abs(scale).argmax(axis=1)[:, None], axis=1)[:, 0]
    empty = np.abs(peak) < GROUP_MAX_EPS  # llama.cpp writes such a block as all zero bytes
    inverse = np.float32(-Q6_SCALE_HALF) / peak
    d = np.where(empty, np.float32(0), np.float32(1) / inverse).astype(np.float16)
    scale_codes = np.minimum(np.rint(inverse[:, None] * scale), np.float32(127))
    scale_codes = np.where(empty[:, None], np.float32(0), scale_codes).astype(np.int8)

    step = (d.astype(np.float32)[:, None] * scale_codes).reshape(-1)
    half = np.float32(Q6_HALF)
    final = np.clip(np.rint(x / step), -half, half - 1) + half
    codes = np.where(step != 0, final, codes)
    codes = np.where(np.repeat(empty, QK_K // Q6_SUB_BLOCK), np.float32(0), codes)
    codes = _codes_by_block(codes)

    out = np.zeros(n, KQUANT_BLOCKS[qtype])
    # Two halves of 128 values, each four quarters q of 32: ql byte 32i + l of a half holds quarter i in its
    # low nibble and quarter i + 2 in its high nibble; qh byte l holds the top 2 bits of quarter q at bits 2q.
    quarters = codes.reshape(n, 2, 4, 32)
    low = quarters & 15
    out["ql"] = (low[:, :, :2] | low[:, :, 2:] << 4).reshape(n, -1)
    top_bits = (quarters >> 4) << np.array([0, 2, 4, 6], np.uint8)[:, None]
    out["qh"] = np.bitwise_or.reduce(top_bits, axis=2).reshape(n, -1)
    out["scales"], out["d"] = scale_codes, d
    return out


Q8_CHUNK_BLOCKS = 1 << 15  # blocks per pass: 4 MB of float32, reused from the allocator instead of faulted in


def quantize_q8_0(w: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """Q8_0 in torch, byte for byte gguf-py's (and llama.cpp's quantize_row_q8_0_ref), on w's device and
    every core: uint8 [..., cols/32·34] for float `w` [..., cols]."""
    import torch

    from specpair.formats.fp8 import true_divide

    cols = w.shape[-1] if w.ndim else 0
    if w.ndim == 0 or cols % 32:
        raise BadInput(name, f"rows of {cols} values do not split into Q8_0 blocks of 32")
    blocks = w.reshape(-1, 32)
    out = torch.empty(blocks.shape[0], 34, dtype=torch.uint8, device=w.device)
    for start in range(0, blocks.shape[0], Q8_CHUNK_BLOCKS):
        x = blocks[start:start + Q8_CHUNK_BLOCKS].to(torch.float32, copy=True)  # worked on in place
        d = true_divide(x.abs().amax(-1, keepdim=True), 127.0)
        if not torch.isfinite(d).all():  # the block maximum carries any NaN or inf through
            raise BadInput(name, "has NaN or infinite values; Q8_0 cannot encode them (F32 and BF16 can)")
        scale = d.half()
        if not torch.isfinite(scale).all():
            raise BadInput(name, f"has values up to {float(d.max()) * 127:.4g}, too large for Q8_0's f16 scales "
                                 "(F32 and BF16 can hold them)")
        x.mul_(torch.where(d == 0, 0.0, torch.ones_like(d) / d))  # a tensor divisor: correctly rounded on CUDA too
        magnitude = x.abs()
        floored = magnitude.floor()
        # gguf-py's np_roundf, halves away from zero: floor(a) + floor(2·(a − floor(a))), then x's sign
        codes = magnitude.sub_(floored).mul_(2).floor_().add_(floored).copysign_(x)
        chunk = out[start:start + Q8_CHUNK_BLOCKS]
        chunk[:, :2] = scale.view(torch.uint8)
        chunk[:, 2:] = codes.to(torch.int8).view(torch.uint8)
    return out.reshape(*w.shape[:-1], cols // 32 * 34)


def dequantize_q8_0(data: torch.Tensor, shape: Sequence[int], name: str = "tensor") -> torch.Tensor:
    """float32 `shape` from Q8_0 bytes, in torch (gguf-py's dequantize, same values)."""
    import torch

    blocks = data.reshape(-1, 34)
    if blocks.shape[0] * 32 != math.prod(shape):
        raise BadInput(name, f"has {data.numel()} bytes of data; Q8_0 {list(shape)} needs {math.prod(shape) // 32 * 34}")
    out = torch.empty(blocks.shape[0], 32, dtype=torch.float32, device=data.device)
    for start in range(0, blocks.shape[0], Q8_CHUNK_BLOCKS):
        chunk = blocks[start:start + Q8_CHUNK_BLOCKS]
        scale = chunk[:, :2].contiguous().view(torch.float16).float()
        torch.mul(chunk[:, 2:].view(torch.int8).float(), scale, out=out[start:start + Q8_CHUNK_BLOCKS])
    return out.reshape(shape)
