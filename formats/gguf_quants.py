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
Q8_0, the type most conversions write, and the k-quants also have torch quantizers with the same bytes
(`quantize_q8_0`, `quantize_kquant_torch`) and dequantizers with the same values (`dequantize_q8_0`,
`dequantize_kquant_torch`), on the tensor's device (the GPU too) and torch's threads.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import threading
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
    t.name: t
    for t in (
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
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
    "F16": (0,),
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
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
        if not np.isfinite(data[:, offset : offset + 2].copy().view("<f2")).all():
            raise BadInput(
                name,
                f"has values up to {np.abs(w).max():.4g}, too large for {ggml_type.name}'s f16 "
                "numbers (F32 and BF16 can hold them)",
            )
    return data.reshape(*w.shape[:-1], cols // block_values * block_bytes)


def dequantize(blocks: np.ndarray, qtype: str, shape: Sequence[int], name: str = "tensor") -> np.ndarray:
    """float32 `shape` from the ggml `qtype` bytes of a tensor (any type gguf-py reads, not only WRITABLE)."""
    ggml_type = GGMLQuantizationType.__members__.get(qtype.upper())
    if ggml_type is None:
        raise BadInput(name, f"unknown GGUF type {qtype!r}")
    shape = tuple(shape)
    block_values, block_bytes = GGML_QUANT_SIZES[ggml_type]
    if not shape or shape[-1] % block_values:
        raise BadInput(
            name, f"shape {shape} does not split into {ggml_type.name} rows of whole blocks of {block_values}"
        )
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
# With 2 cores, worker processes only contend with the converter's own threads (measured: Q4_K of a 1.85 GB
# checkpoint 111 s with them, 99 s without); 16 GIL-bound threads ran no faster than one (0.015 GB/s on the H200 host).
PROCESS_POOL_MIN_CPUS = 4


def quantize_in_processes(w: np.ndarray, qtype: str, method: str = "search", name: str = "tensor") -> np.ndarray:
    """`quantize` over slices of rows in worker processes, one per core: the numpy block search holds the
    GIL between its many small steps, so threads do not scale it. Same bytes (rows quantize independently)."""
    cols = w.shape[-1] if w.ndim else 0
    rows = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, cols) if cols else w
    if not use_processes() or not cols or rows.size < 2 * PARALLEL_VALUES:
        return quantize(w, qtype, method, name)
    step = max(1, PARALLEL_VALUES // cols)
    pieces = [rows[start : start + step] for start in range(0, len(rows), step)]
    data = list(_process_pool().map(quantize, pieces, repeat(qtype), repeat(method), repeat(name)))
    return np.concatenate(data).reshape(*w.shape[:-1], -1)


def use_processes() -> bool:
    return (os.cpu_count() or 1) >= PROCESS_POOL_MIN_CPUS


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
            chunk = blocks[start : start + CHUNK_BLOCKS]
            out[start : start + len(chunk)] = pack(chunk, qtype, search).view(np.uint8).reshape(len(chunk), -1)
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
    out["scales"] = np.concatenate(
        [
            low_sc | (high_sc >> 4) << 6,  # bytes 0-3: scales 0-3, top bits of scales 4-7
            low_m | (high_m >> 4) << 6,  # bytes 4-7: mins 0-3, top bits of mins 4-7
            (high_sc & 15) | (high_m & 15) << 4,  # bytes 8-11: low 4 bits of scales and mins 4-7
        ],
        axis=1,
    )
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
        x = blocks[start : start + Q8_CHUNK_BLOCKS].to(torch.float32, copy=True)  # worked on in place
        d = true_divide(x.abs().amax(-1, keepdim=True), 127.0)
        if not torch.isfinite(d).all():  # the block maximum carries any NaN or inf through
            raise BadInput(name, "has NaN or infinite values; Q8_0 cannot encode them (F32 and BF16 can)")
        scale = d.half()
        if not torch.isfinite(scale).all():
            raise BadInput(
                name,
                f"has values up to {float(d.max()) * 127:.4g}, too large for Q8_0's f16 scales "
                "(F32 and BF16 can hold them)",
            )
        x.mul_(torch.where(d == 0, 0.0, torch.ones_like(d) / d))  # a tensor divisor: correctly rounded on CUDA too
        magnitude = x.abs()
        floored = magnitude.floor()
        # gguf-py's np_roundf, halves away from zero: floor(a) + floor(2·(a − floor(a))), then x's sign
        codes = magnitude.sub_(floored).mul_(2).floor_().add_(floored).copysign_(x)
        chunk = out[start : start + Q8_CHUNK_BLOCKS]
        chunk[:, :2] = scale.view(torch.uint8)
        chunk[:, 2:] = codes.to(torch.int8).view(torch.uint8)
    return out.reshape(*w.shape[:-1], cols // 32 * 34)


def dequantize_q8_0(data: torch.Tensor, shape: Sequence[int], name: str = "tensor") -> torch.Tensor:
    """float32 `shape` from Q8_0 bytes, in torch (gguf-py's dequantize, same values)."""
    import torch

    blocks = data.reshape(-1, 34)
    if blocks.shape[0] * 32 != math.prod(shape):
        raise BadInput(
            name, f"has {data.numel()} bytes of data; Q8_0 {list(shape)} needs {math.prod(shape) // 32 * 34}"
        )
    out = torch.empty(blocks.shape[0], 32, dtype=torch.float32, device=data.device)
    for start in range(0, blocks.shape[0], Q8_CHUNK_BLOCKS):
        chunk = blocks[start : start + Q8_CHUNK_BLOCKS]
        scale = chunk[:, :2].contiguous().view(torch.float16).float()
        torch.mul(chunk[:, 2:].view(torch.int8).float(), scale, out=out[start : start + Q8_CHUNK_BLOCKS])
    return out.reshape(shape)


# ---- Q4_K, Q5_K, Q6_K in torch: the numpy quantizers above, op for op ---------------------------------
# Every float32 operation is the numpy code's (sums in order, no fused multiply-add: eager torch rounds each
# op), on the tensor's device and torch's threads. Constants are float32 tensors on that device: CUDA divides by a
# Python number through its reciprocal, and `number / tensor` is a reciprocal and a multiply on every device.
# Where numpy picks between whole arrays of codes with np.where, these keep what the codes are made from and
# make them once, or pick by arithmetic (codes are small integers): torch.where over [32, n] costs several
# multiplies on the CPU.

# Super-blocks per pass: on the CPU the [32, n] float32 temporaries stay in cache (fewer: more time in op
# overheads, more: in memory traffic); a pass is some 2,500 ops, so a GPU takes many more per pass, to keep
# kernel launches from dominating: on the H200, 2^12 blocks per pass ran at 51 M values/s, 2^15 at 414 M,
# 2^17 at 813 M (64 M values of Q4_K search), with [32, 2^22] float32 temporaries of 512 MB.
TORCH_CHUNK_BLOCKS = {"cpu": 1024, "cuda": 1 << 17}
# One thread at a time launches a GPU pass's small kernels: 8 Python threads launching at once ran at 0.39x
# one thread's rate (GIL contention, H200); waiting threads meanwhile read and decode.
GPU_LAUNCHES = threading.Lock()


def quantize_kquant_torch(w: torch.Tensor, qtype: str, search: bool, name: str = "tensor") -> torch.Tensor:
    """Q4_K, Q5_K or Q6_K blocks in torch on w's device: uint8 [..., cols/256·block bytes] for float `w`
    [..., cols], `quantize`'s bytes (so llama.cpp's) and errors; `search` is method "search", else "rtn"."""
    import torch

    if qtype not in KQUANT_BLOCKS:
        raise BadInput(name, f"no torch quantizer for GGUF type {qtype!r}; there is one for {', '.join(KQUANT_BLOCKS)}")
    if w.ndim == 0:
        raise BadInput(name, "is a scalar; GGUF tensors have at least one dimension")
    cols = w.shape[-1]
    if cols % QK_K:
        raise BadInput(name, f"rows of {cols} values do not split into {qtype} blocks of {QK_K}")
    if w.numel() and not torch.isfinite(torch.stack(torch.aminmax(w))).all():  # both carry any NaN through
        raise BadInput(name, f"has NaN or infinite values; {qtype} cannot encode them (F32 and BF16 can)")
    blocks = w.reshape(-1, QK_K)
    out = torch.empty(blocks.shape[0], KQUANT_BLOCKS[qtype].itemsize, dtype=torch.uint8, device=w.device)
    pack = _quantize_q6_k_torch if qtype == "Q6_K" else _quantize_affine_k_torch
    step = TORCH_CHUNK_BLOCKS.get(w.device.type, TORCH_CHUNK_BLOCKS["cuda"])
    with GPU_LAUNCHES if w.device.type != "cpu" else contextlib.nullcontext():
        for start in range(0, blocks.shape[0], step):
            chunk = blocks[start : start + step].to(torch.float32)
            out[start : start + chunk.shape[0]] = pack(chunk, qtype, search)
    for offset in F16_OFFSETS[qtype]:
        if not torch.isfinite(out[:, offset : offset + 2].contiguous().view(torch.float16)).all():
            raise BadInput(
                name,
                f"has values up to {float(w.abs().max()):.4g}, too large for {qtype}'s f16 "
                "numbers (F32 and BF16 can hold them)",
            )
    return out.reshape(*w.shape[:-1], cols // QK_K * out.shape[1])


def _constant(value: float, like: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _sum_in_order_torch(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """`_sum_in_order` in torch over row views (made once where a buffer is summed again and again)."""
    import torch

    total = torch.zeros_like(rows[0])
    for row in rows:
        total += row
    return total


def _at_least_zero(v: torch.Tensor) -> torch.Tensor:
    """np.maximum(v, 0): NaN stays, and ±0 gives +0 (numpy returns the second operand of a tie)."""
    import torch

    return torch.where(v <= 0, 0.0, v)


def _at_most_zero(v: torch.Tensor) -> torch.Tensor:
    """np.minimum(v, 0), as _at_least_zero."""
    import torch

    return torch.where(v >= 0, 0.0, v)


def _finite_or_zero(v: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)


def _pick_codes(fallback: torch.Tensor, codes: torch.Tensor, use_codes: torch.Tensor) -> torch.Tensor:
    """np.where(use_codes, codes, fallback) per column (use_codes [m] bool), in place in `codes`: float codes
    are small integers, so arithmetic picks them exactly."""
    return codes.sub_(fallback).mul_(use_codes.to(codes.dtype)).add_(fallback)


def _codes_by_block_torch(codes: torch.Tensor) -> torch.Tensor:
    """int32 [n, QK_K] in value order from float codes [size, n·QK_K/size] (the layout of the sub-blocks)."""
    import torch

    by_value = torch.empty(codes.shape[1], codes.shape[0], dtype=torch.int32, device=codes.device)
    return by_value.copy_(codes.T).view(-1, QK_K)


def _affine_codes_torch(
    x: torch.Tensor, low: torch.Tensor, inverse: torch.Tensor, top: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`_affine_codes` in torch, into `out` if given. An overflowed `inverse` is made 0, so its codes come out
    ±0 where numpy writes +0: the same values, and the signs of zero reach no byte."""
    import torch

    return torch.sub(x, low, out=out).mul_(_finite_or_zero(inverse)).round_().clamp_(0, top)


def _fit_affine_torch(x: torch.Tensor, grid: AffineSearch, search: bool) -> tuple[torch.Tensor, ...]:
    """`_fit_affine` in torch: (scale [m], min [m], codes [32, m]) for x [32, m]. The search keeps, per
    sub-block, the offset and inverse scale its best codes came from, and makes those codes once at the end."""
    import torch

    f32 = np.float32
    top = float(grid.top)
    low = _at_most_zero(x.amin(0))
    high = x.amax(0)
    flat = high == low  # then inverse is inf: codes 0, as numpy's where(flat, 0, codes)
    inverse = _constant(top, x) / (high - low)
    scale = _constant(1.0, x) / inverse
    codes_low, codes_inverse = low, inverse
    if search:
        # torch's float32 sqrt on the CPU (MKL) is off by an ulp at times; float64's, rounded, is exact
        mean_square = _sum_in_order_torch((x * x).unbind(0)) / _constant(AFFINE_SUB_BLOCK, x)
        weights = torch.sqrt(mean_square.double()).float() + x.abs()
        trial = _affine_codes_torch(x, low, inverse, top)
        error_terms = torch.mul(trial, scale).add_(low).sub_(x).square_().mul_(weights)
        error_rows = error_terms.unbind(0)
        best_error = torch.where(flat, -math.inf, _sum_in_order_torch(error_rows))  # a flat one never improves
        all_levels = torch.tensor(
            [float(f32(grid.first) + f32(grid.step) * f32(k) + f32(top)) for k in range(grid.steps + 1)],
            device=x.device,
        )
        terms = torch.empty(3, AFFINE_SUB_BLOCK, x.shape[1], device=x.device)  # per value: w·l, w·l², w·l·x
        terms_rows = terms.unbind(1)
        terms[0], terms[1] = weights, weights * x
        sum_w, sum_x = _sum_in_order_torch([row[:2] for row in terms_rows])
        for levels in all_levels:
            inverse = levels / (high - low)  # with the best offset so far, as numpy
            _affine_codes_torch(x, low, inverse, top, out=trial)
            weighted = torch.mul(weights, trial, out=terms[0])
            torch.mul(weighted, trial, out=terms[1])
            torch.mul(weighted, x, out=terms[2])
            sum_l, sum_l2, sum_xl = _sum_in_order_torch(terms_rows)
            det = sum_w * sum_l2 - sum_l * sum_l
            trial_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            trial_low = (sum_l2 * sum_x - sum_l * sum_xl) / det
            trial_scale = torch.where(trial_low > 0, sum_xl / sum_l2, trial_scale)  # refit without an offset
            trial_low = trial_low.clamp_max_(0)
            torch.mul(trial, trial_scale, out=error_terms).add_(trial_low).sub_(x).square_().mul_(weights)
            error = _sum_in_order_torch(error_rows)
            better = (det > 0) & (error < best_error)
            codes_low = torch.where(better, low, codes_low)
            codes_inverse = torch.where(better, inverse, codes_inverse)
            best_error = torch.where(better, error, best_error)
            scale = torch.where(better, trial_scale, scale)
            low = torch.where(better, trial_low, low)
    return torch.where(flat, 0.0, scale), -low, _affine_codes_torch(x, codes_low, codes_inverse, top)


def _six_bit_torch(values: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    import torch

    inverse = _finite_or_zero(torch.where(largest > 0, _constant(SCALE_TOP, largest) / largest, 0.0))
    codes = torch.round(inverse[:, None] * values)
    # numpy's float -> int32 cast makes NaN and out-of-range values INT_MIN (low byte 0), as x86 does; CUDA's
    # saturates instead
    codes = torch.where(codes.abs() < 2.0**31, codes, 0.0)
    return codes.to(torch.int32).to(torch.uint8).clamp_max_(SCALE_TOP)


def _quantize_affine_k_torch(blocks: torch.Tensor, qtype: str, search: bool) -> torch.Tensor:
    """`_quantize_affine_k` in torch: uint8 [n, block bytes] for float32 [n, QK_K]."""
    import torch

    grid = AFFINE_SEARCH[qtype]
    n, per_block = blocks.shape[0], QK_K // AFFINE_SUB_BLOCK
    x = blocks.reshape(-1, AFFINE_SUB_BLOCK).T.contiguous()
    scale, minimum, fit_codes = _fit_affine_torch(x, grid, search)
    scale, minimum = scale.reshape(n, per_block), minimum.reshape(n, per_block)
    largest_scale, largest_min = _at_least_zero(scale.amax(1)), _at_least_zero(minimum.amax(1))
    scale_codes, min_codes = _six_bit_torch(scale, largest_scale), _six_bit_torch(minimum, largest_min)
    d = (largest_scale / _constant(SCALE_TOP, x)).to(torch.float16)
    dmin = (largest_min / _constant(SCALE_TOP, x)).to(torch.float16)

    # Requantize against the stored scales; a sub-block whose scale became 0 keeps the fit's codes.
    step = (d.float()[:, None] * scale_codes).reshape(-1)
    offset = (dmin.float()[:, None] * min_codes).reshape(-1)
    used = step != 0
    final = torch.round((x + offset).div_(torch.where(used, step, 1.0))).clamp_(0, grid.top)
    codes = _codes_by_block_torch(_pick_codes(fit_codes, final, used))

    out = torch.empty(n, KQUANT_BLOCKS[qtype].itemsize, dtype=torch.uint8, device=x.device)
    out[:, 0:2] = d.view(torch.uint8).reshape(n, 2)
    out[:, 2:4] = dmin.view(torch.uint8).reshape(n, 2)
    low_sc, high_sc = scale_codes[:, :4], scale_codes[:, 4:]
    low_m, high_m = min_codes[:, :4], min_codes[:, 4:]
    out[:, 4:8] = low_sc | (high_sc >> 4) << 6  # scales 0-3, top bits of scales 4-7
    out[:, 8:12] = low_m | (high_m >> 4) << 6  # mins 0-3, top bits of mins 4-7
    out[:, 12:16] = (high_sc & 15) | (high_m & 15) << 4  # low 4 bits of scales and mins 4-7
    # qs: 4 runs of 32 bytes; run r holds sub-block 2r in low nibbles and 2r+1 in high nibbles
    nibbles = (codes & 15).view(n, 4, 2, AFFINE_SUB_BLOCK)
    out[:, -128:].view(n, 4, AFFINE_SUB_BLOCK).copy_(nibbles[:, :, 0] | nibbles[:, :, 1] << 4)
    if qtype == "Q5_K":  # qh[l] bit j = fifth bit of value 32j + l
        fifth = (codes >> 4).view(n, per_block, AFFINE_SUB_BLOCK)
        qh = fifth[:, 0].clone()
        for j in range(1, per_block):
            qh |= fifth[:, j] << j
        out[:, 16:48] = qh
    return out


def _first_peak(x: torch.Tensor) -> torch.Tensor:
    """[m]: per column of x [S, m], its first value of the largest magnitude, signed (numpy's argmax picks
    the first; torch's argmax over dim 0 is several times slower than this)."""
    import torch

    magnitude = x.abs()
    peaks = torch.eq(magnitude, magnitude.amax(0), out=torch.empty_like(x))  # 1.0 where |x| is largest
    rank = torch.arange(x.shape[0], 0, -1, dtype=torch.float32, device=x.device)[:, None]  # S − row
    first = x.shape[0] - peaks.mul_(rank).amax(0)
    return x.gather(0, first.long()[None])[0]


def _fit_q6_torch(x: torch.Tensor, search: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`_fit_q6` in torch: (scale [m], codes + 32 [16, m]) for x [16, m]. The search keeps the inverse scale
    of each sub-block's best codes, and makes those codes once at the end."""
    import torch

    f32 = np.float32
    half = float(Q6_HALF)
    peak = _first_peak(x)
    empty = peak.abs() < float(GROUP_MAX_EPS)
    inverse = _constant(-half, x) / peak  # the peak lands on −32, the level with no +32 counterpart
    codes_inverse = inverse
    if search:
        trial = torch.mul(x, inverse).round_().clamp_(-half, half - 1)
        terms = torch.empty(2, Q6_SUB_BLOCK, x.shape[1], device=x.device)  # per value: w·x·l, w·l² (w = x²)
        terms_rows = terms.unbind(1)
        weights = x * x
        weighted_x = weights * x
        torch.mul(weighted_x, trial, out=terms[0])
        torch.mul(weights, trial, out=terms[1]).mul_(trial)
        sum_lx, sum_l2 = _sum_in_order_torch(terms_rows)
        scale = torch.where(sum_l2 != 0, sum_lx / sum_l2, 0.0)
        best = scale * sum_lx
        for levels in torch.tensor([float(-(f32(half) + f32(0.1) * f32(k))) for k in Q6_TRIES], device=x.device):
            trial_inverse = levels / peak
            torch.mul(x, trial_inverse, out=trial).round_().clamp_(-half, half - 1)
            torch.mul(weighted_x, trial, out=terms[0])
            torch.mul(weights, trial, out=terms[1]).mul_(trial)
            sum_lx, sum_l2 = _sum_in_order_torch(terms_rows)
            better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)  # larger (Σwxl)²/Σwl² = smaller error
            codes_inverse = torch.where(better, trial_inverse, codes_inverse)
            scale = torch.where(better, sum_lx / sum_l2, scale)
            best = torch.where(better, scale * sum_lx, best)
    else:
        scale = _constant(1.0, x) / inverse
    codes = torch.mul(x, codes_inverse).round_().clamp_(-half, half - 1).add_(half)
    return torch.where(empty, 0.0, scale), codes.mul_((~empty).to(codes.dtype))


def _quantize_q6_k_torch(blocks: torch.Tensor, qtype: str, search: bool) -> torch.Tensor:
    """`_quantize_q6_k` in torch: uint8 [n, 210] for float32 [n, QK_K]."""
    import torch

    n, per_block = blocks.shape[0], QK_K // Q6_SUB_BLOCK
    x = blocks.reshape(-1, Q6_SUB_BLOCK).T.contiguous()
    scale, fit_codes = _fit_q6_torch(x, search)
    scale = scale.reshape(n, per_block)
    peak = scale.gather(1, scale.abs().argmax(1, keepdim=True))[:, 0]
    empty = peak.abs() < float(GROUP_MAX_EPS)  # llama.cpp writes such a block as all zero bytes
    inverse = _constant(-Q6_SCALE_HALF, x) / peak
    d = torch.where(empty, 0.0, _constant(1.0, x) / inverse).to(torch.float16)
    scale_codes = torch.round(inverse[:, None] * scale).clamp_max_(127)
    scale_codes = torch.where(empty[:, None], 0.0, scale_codes).to(torch.int8)

    # an empty block has d = 0, so all its sub-blocks take the fit's codes: zero those
    fit_codes.mul_((~empty).to(fit_codes.dtype).repeat_interleave(per_block))
    step = (d.float()[:, None] * scale_codes).reshape(-1)
    used = step != 0
    half = float(Q6_HALF)
    final = torch.div(x, torch.where(used, step, 1.0)).round_().clamp_(-half, half - 1).add_(half)
    codes = _codes_by_block_torch(_pick_codes(fit_codes, final, used))

    out = torch.empty(n, KQUANT_BLOCKS[qtype].itemsize, dtype=torch.uint8, device=x.device)
    # Two halves of 128 values, each four quarters q of 32: ql byte 32i + l of a half holds quarter i in its
    # low nibble and quarter i + 2 in its high nibble; qh byte l holds the top 2 bits of quarter q at bits 2q.
    quarters = codes.view(n, 2, 4, 32)
    low = quarters & 15
    out[:, :128].view(n, 2, 2, 32).copy_(low[:, :, :2] | low[:, :, 2:] << 4)
    top = quarters >> 4
    out[:, 128:192].view(n, 2, 32).copy_(top[:, :, 0] | top[:, :, 1] << 2 | top[:, :, 2] << 4 | top[:, :, 3] << 6)
    out[:, 192:208] = scale_codes.view(torch.uint8)
    out[:, 208:] = d.view(torch.uint8).reshape(n, 2)
    return out


def dequantize_kquant_torch(data: torch.Tensor, qtype: str, shape: Sequence[int], name: str = "tensor") -> torch.Tensor:
    """float32 `shape` from Q4_K, Q5_K or Q6_K bytes, in torch on data's device: gguf-py's values, op for op."""
    import torch

    block_bytes = KQUANT_BLOCKS[qtype].itemsize
    blocks = data.reshape(-1, block_bytes)
    if blocks.shape[0] * QK_K != math.prod(shape) or shape[-1] % QK_K:
        raise BadInput(
            name,
            f"has {data.numel()} bytes of data; {qtype} {list(shape)} needs "
            f"{math.prod(shape) // QK_K * block_bytes} in rows of whole blocks",
        )
    out = torch.empty(blocks.shape[0], QK_K, dtype=torch.float32, device=data.device)
    unpack = _dequantize_q6_k_torch if qtype == "Q6_K" else _dequantize_affine_k_torch
    step = TORCH_CHUNK_BLOCKS.get(data.device.type, TORCH_CHUNK_BLOCKS["cuda"])
    for start in range(0, blocks.shape[0], step):
        chunk = blocks[start : start + step]
        out[start : start + chunk.shape[0]] = unpack(chunk, qtype)
    return out.reshape(tuple(shape))


def _f16_column(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    import torch

    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()  # [n, 1]


def _shifted(packed: torch.Tensor, shifts: Sequence[int], mask: int) -> torch.Tensor:
    """(packed[:, g, None, :] >> each shift) & mask: [n, groups·len(shifts), width], as gguf-py unpacks."""
    import torch

    n, groups, width = packed.shape
    by = torch.tensor(shifts, dtype=torch.uint8, device=packed.device).reshape(1, 1, -1, 1)
    return ((packed[:, :, None, :] >> by) & mask).reshape(n, groups * len(shifts), width)


def _dequantize_affine_k_torch(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    import torch

    n = blocks.shape[0]
    d, dmin = _f16_column(blocks, 0), _f16_column(blocks, 2)
    low_sc, low_m, high = blocks[:, 4:16].reshape(n, 3, 4).unbind(1)  # the 12 bytes of 6-bit scales and mins
    sc = torch.cat([low_sc & 0x3F, (high & 0x0F) | ((low_sc >> 2) & 0x30)], dim=1)
    mins = torch.cat([low_m & 0x3F, (high >> 4) | ((low_m >> 2) & 0x30)], dim=1)
    step = (d * sc.float())[:, :, None]
    offset = (dmin * mins.float())[:, :, None]
    codes = _shifted(blocks[:, -128:].reshape(n, 4, 32), (0, 4), 0x0F)
    if qtype == "Q5_K":
        codes = codes | _shifted(blocks[:, 16:48].reshape(n, 1, 32), range(8), 0x01) << 4
    return (step * codes.float() - offset).reshape(n, QK_K)


def _dequantize_q6_k_torch(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    import torch

    n = blocks.shape[0]
    step = (_f16_column(blocks, 208) * blocks[:, 192:208].view(torch.int8).float())[:, :, None]  # [n, 16, 1]
    low = _shifted(blocks[:, :128].reshape(n, 2, 64), (0, 4), 0x0F)
    high = _shifted(blocks[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6), 0x03)
    codes = (low.reshape(n, 8, 32) | high << 4).float() - 32
    return (step * codes.reshape(n, QK_K // Q6_SUB_BLOCK, Q6_SUB_BLOCK)).reshape(n, QK_K)
