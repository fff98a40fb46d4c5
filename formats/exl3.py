"""EXL3, ExLlamaV3's trellis layout (formats.md §5): decode bit for bit as ExLlamaV3 does, and a tail-biting
Viterbi encoder that runs in torch on the CPU and in a Triton kernel on CUDA, with the same codes on both.

Stored per linear `<m>` with logical weight W [out, in], both dims zero-padded to multiples of 128 (in_p, out_p):
  <m>.trellis  I16 [in_p/16, out_p/16, 16·K]  one tile per 16×16 block of Q [in_p, out_p] (input rows, output
               columns): a ring of 256·K bits, read MSB-first from little-endian uint32 words (each word's two
               int16 halves are swapped in storage, ExLlamaV3's SWAP16). Position t's 16-bit state is the ring
               window that ends where its chunk ends (K bits per position; at half-integer K = KA + 0.5 even
               positions take KA bits and odd ones KA + 1); the codebook turns it into an fp16 value, and
               position t is tile element TILE_ORDER[t] (row-major).
  <m>.suh      F16 [in_p],  <m>.svh  F16 [out_p]    input / output scales; old files: <m>.su / <m>.sv, I16
               bitfields of signs (bit j of word w set -> element 16w + j is -1)
  <m>.mcg | <m>.mul1  I32 []  names the codebook by its multiplier (absent: 3INST)
and, as LinearEXL3.get_weight_tensor computes it,
  W^T = fp16(fp16(fp16(H·Q)·suh)·H)·svh   (H: 128-wide block-diagonal Sylvester Hadamard / √128, fp32 products).

`dequantize` gives those bits (tests/exl3_fixtures: every codebook and K, bit for bit). ExLlamaV3's fused
prefill kernel (reconstruct_had_slice, fp16 butterflies) rounds the same weight differently, by up to ~0.006.

The encoder has no calibration data: random signs, per-channel RMS scales folded into svh and suh, both
Hadamard rotations, a fixed per-codebook input scale, then ExLlamaV3's two-pass tail-biting Viterbi per tile
(a free pass rolled by half a tile picks the ring's closing edge, a second pass is held to it). Writing
half-integer rates is not done yet.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from specpair.errors import BadInput
from specpair.formats.fp8 import true_divide

try:
    import triton
    import triton.language as tl
except ImportError:  # pyproject installs Triton on Linux only; elsewhere CUDA tensors take the torch path
    triton = None

CODEBOOKS = ("3inst", "mcg", "mul1")
BITS = (1, 2, 3, 4, 5, 6, 7, 8)  # what quantize writes
HALF_BITS = (1.5, 2.5, 3.5)  # read only: ExLlamaV3 stores them for the mul1 codebook
PAD = 128  # both dims are padded to whole Hadamard blocks
TILE = 16
TILE_LEN = TILE * TILE
STATES = 1 << 16
MULTIPLIERS = {"mcg": 0xCBAC1FED, "mul1": 0x83DCD12D}  # the marker's value, as ExLlamaV3 checks it
INST3_MUL, INST3_ADD = 89226354, 64248484
MUL1_INV, MUL1_BIAS = 0x1EEE, 0xC931  # fp16 bits of ~1/147.7 and ~-10.39
FORMAT_VERSION = "1.6.5"  # the ExLlamaV3 release whose layout is written (its loader reads no version)
DECODE_TILES = 1 << 16  # tiles unpacked at a time (int64 temporaries of ~130 MB each)
HAD_MAX_ROWS = 1 << 19  # ExLlamaV3 keeps each right-side Hadamard GEMM at or below this many rows

# Input RMS the Viterbi search sees, per codebook and K: a tile of N(0, τ²) values quantizes with the least
# relative error at this τ (this encoder on 16 Gaussian tiles, a 0.15 grid refined by 0.075:
# benchmarks/exl3_encode.py --calibrate).
TILE_RMS = {
    "3inst": (1.38, 1.23, 1.15, 1.08, 1.07, 1.0, 1.0, 1.0),
    "mcg": (1.45, 1.23, 1.23, 1.15, 1.07, 1.0, 1.0, 1.0),
    "mul1": (1.15, 1.0, 0.93, 0.93, 0.93, 0.85, 0.78, 0.78),
}


def _tile_order() -> Tensor:
    """Position t -> row-major tile element (ExLlamaV3's tensor_core_perm): lane l = t // 8 holds rows
    2(l % 4), +1, +8, +9 of columns l // 4 and l // 4 + 8."""
    order = []
    for lane in range(32):
        r0, c0 = 2 * (lane % 4), lane // 4
        order += [(r0 + dr) * TILE + c0 + dc for dc in (0, 8) for dr in (0, 1, 8, 9)]
    return torch.tensor(order)


TILE_ORDER = _tile_order()
TILE_POSITION = torch.argsort(TILE_ORDER)  # row-major element -> position


@functools.cache
def codebook_values(codebook: str) -> Tensor:
    """fp16 [65536]: the value of every 16-bit state (exllamav3_ext/quant/codebook.cuh).

    The GPU rounds once (an fp16 add of two fp16 halves; an fp16 fma for mul1); both are exact in float64,
    so each value is computed there and rounded to fp16 once.
    """
    state = np.arange(STATES, dtype=np.uint32)
    if codebook == "mul1":
        x = state * np.uint32(MULTIPLIERS["mul1"])  # wraps mod 2^32, as the kernel's uint32 multiply
        byte_sum = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24)
        h = _fp16_bits((byte_sum + 0x6400) & 0xFFFF)  # 1024 + byte sum
        value = h * _fp16_bits(MUL1_INV) + _fp16_bits(MUL1_BIAS)
    else:
        x = (
            state * np.uint32(INST3_MUL) + np.uint32(INST3_ADD)
            if codebook == "3inst"
            else state * np.uint32(MULTIPLIERS["mcg"])
        )
        x = (x & np.uint32(0x8FFF8FFF)) ^ np.uint32(0x3B603B60)  # two fp16 values in [0.125, 2), signed
        value = _fp16_bits(x & 0xFFFF) + _fp16_bits(x >> 16)
    return torch.from_numpy(value.astype(np.float16))


def _fp16_bits(bits: np.ndarray | int) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)


# --- reading -----------------------------------------------------------------------------------------------


def dequantize(parts: dict[str, Tensor], shape: tuple[int, int] | None = None, module: str = "") -> Tensor:
    """float32 [out, in] (cropped to `shape` when given) of one stored linear: LinearEXL3.get_weight_tensor.

    `parts` maps suffixes (".trellis", ".suh" or ".su", ".svh" or ".sv", ".mcg" / ".mul1") to tensors on any
    device; `module` names them in errors.
    """
    trellis, bits, codebook = _trellis(parts, module)
    in_p, out_p = trellis.shape[0] * TILE, trellis.shape[1] * TILE
    suh = _scales(parts, ".suh", ".su", in_p, module).to(trellis.device)
    svh = _scales(parts, ".svh", ".sv", out_p, module).to(trellis.device)
    if shape is not None:
        out, inp = shape
        if not (0 < out <= out_p and 0 < inp <= in_p and out_p - out < PAD and in_p - inp < PAD):
            raise BadInput(
                _name(module, ".trellis"),
                f"shape {list(trellis.shape)} stores a [{out_p}, {in_p}] weight, which does not pad [{out}, {inp}]",
            )
    q = reconstruct(trellis, bits, codebook)
    w = _hadamard_fp32(q, 0).to(torch.float16) * suh[:, None]
    w = _hadamard_fp32(w, 1).to(torch.float16) * svh[None, :]
    w = w.T.float()
    return w if shape is None else w[: shape[0], : shape[1]].contiguous()


def reconstruct(trellis: Tensor, bits: float, codebook: str) -> Tensor:
    """fp16 Q [in_p, out_p], the rotated-basis weight (ExLlamaV3's `reconstruct`): codebook values of the
    unpacked states, each tile's positions put back in row-major order. Inputs as `dequantize` checks them."""
    rows, cols = trellis.shape[:2]
    table = codebook_values(codebook).to(trellis.device)
    position = TILE_POSITION.to(trellis.device)
    q = torch.empty(rows, TILE, cols, TILE, dtype=torch.float16, device=trellis.device)
    step = max(1, DECODE_TILES // cols)
    for first in range(0, rows, step):
        tiles = table[unpack_states(trellis[first : first + step], bits)][..., position]
        q[first : first + step] = tiles.view(-1, cols, TILE, TILE).transpose(1, 2)
    return q.view(rows * TILE, cols * TILE)


def unpack_states(trellis: Tensor, bits: float) -> Tensor:
    """int64 [..., 256]: the 16-bit state of every position of each tile of int16 words [..., 16·K]."""
    first, second, shift = (index.to(trellis.device) for index in _window_index(float(bits)))
    halves = trellis.to(torch.int64) & 0xFFFF
    words = halves[..., 0::2] | (halves[..., 1::2] << 16)  # little-endian uint32: the stream's MSB-first words
    pair = (words[..., first] << 32) | words[..., second]  # int64 wraps; the window bits stay in place
    return (pair >> shift) & 0xFFFF


@functools.cache
def _window_index(bits: float) -> tuple[Tensor, Tensor, Tensor]:
    """For each position: the uint32 word its 16-bit window starts in, the next word (mod the ring), and the
    right shift that brings the window down from their 64-bit concatenation."""
    steps = [int(bits) + (position & 1 if bits % 1 else 0) for position in range(TILE_LEN)]
    ring = sum(steps)
    ends = np.cumsum(steps)
    starts = (ends - 16) % ring
    words = ring // 32
    first = starts // 32
    return (torch.from_numpy(first), torch.from_numpy((first + 1) % words), torch.from_numpy(48 - starts % 32))


@functools.cache
def _hadamard_matrix(device: torch.device) -> Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < PAD:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / math.sqrt(PAD)).to(torch.float32).to(device)


def _hadamard_fp32(x: Tensor, dim: int) -> Tensor:
    """float32 H·x (dim 0) or x·H (dim 1) per 128-wide block: the matmuls of ExLlamaV3's preapply_had_l / _r,
    row chunks included. cuBLAS and torch's CPU sgemm both sum each 128-term product with FMAs in order, so
    they give the same float32 bits (the fixtures: 10^6 values, none differ; correctly rounded sums would
    differ in 85% of them)."""
    had = _hadamard_matrix(x.device)
    x = x.float()
    rows, cols = x.shape
    if dim == 0:
        return (had @ x.view(-1, PAD, cols)).view(rows, cols)
    step = max(1, HAD_MAX_ROWS * PAD // cols)
    return torch.cat(
        [(x[first : first + step].reshape(-1, PAD) @ had).view(-1, cols) for first in range(0, rows, step)]
    )


def _trellis(parts: dict[str, Tensor], module: str) -> tuple[Tensor, float, str]:
    name = _name(module, ".trellis")
    trellis = parts.get(".trellis")
    if trellis is None:
        raise BadInput(name, "missing")
    if trellis.dtype != torch.int16:
        raise BadInput(name, f"dtype {trellis.dtype}, expected torch.int16")
    if trellis.ndim != 3 or 0 in trellis.shape:
        raise BadInput(name, f"expected [in/16, out/16, 16·bits], got shape {list(trellis.shape)}")
    bits = trellis.shape[-1] / 16
    if bits not in BITS + HALF_BITS:
        raise BadInput(name, f"last dim {trellis.shape[-1]} is not 16·bits for bits 1..8 or 1.5/2.5/3.5")
    if trellis.shape[0] % (PAD // TILE) or trellis.shape[1] % (PAD // TILE):
        raise BadInput(name, f"shape {list(trellis.shape)} is not whole {PAD}-wide blocks of 16×16 tiles")
    markers = [codebook for codebook in MULTIPLIERS if f".{codebook}" in parts]
    if len(markers) > 1:
        raise BadInput(_name(module, ".mcg"), "both codebook markers .mcg and .mul1 are present")
    codebook = markers[0] if markers else "3inst"
    if markers:
        marker_name = _name(module, f".{codebook}")
        marker = parts[f".{codebook}"]
        if marker.dtype != torch.int32 or marker.ndim != 0:
            raise BadInput(marker_name, f"expected an int32 scalar, got {marker.dtype} {list(marker.shape)}")
        if int(marker) & 0xFFFFFFFF != MULTIPLIERS[codebook]:
            raise BadInput(marker_name, f"holds {int(marker) & 0xFFFFFFFF:#x}, expected {MULTIPLIERS[codebook]:#x}")
    if bits in HALF_BITS and codebook != "mul1":
        raise BadInput(name, f"{bits:g} bits per weight exist only with the mul1 codebook, not {codebook}")
    return trellis, bits, codebook


def _scales(parts: dict[str, Tensor], suffix: str, bitfield_suffix: str, size: int, module: str) -> Tensor:
    """fp16 [size] from `suffix` (F16), or ±1 from the old sign bitfield `bitfield_suffix` (I16 [size/16])."""
    if suffix in parts:
        scales, expected = parts[suffix], (torch.float16, [size])
    elif bitfield_suffix in parts:
        scales, expected, suffix = parts[bitfield_suffix], (torch.int16, [size // 16]), bitfield_suffix
    else:
        raise BadInput(_name(module, suffix), f"missing (nor is there an old-style {bitfield_suffix} bitfield)")
    if (scales.dtype, list(scales.shape)) != expected:
        raise BadInput(
            _name(module, suffix),
            f"expected {expected[0]} {expected[1]} to fit the trellis, got {scales.dtype} {list(scales.shape)}",
        )
    if scales.dtype == torch.float16:
        return scales
    signs = (scales.to(torch.int64)[:, None] >> torch.arange(16, device=scales.device)) & 1
    return (1 - 2 * signs).flatten().to(torch.float16)


# --- writing -----------------------------------------------------------------------------------------------


def stored_shapes(shape: tuple[int, int], bits: int, codebook: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """suffix -> (safetensors dtype, shape) of what `quantize` writes for a weight of `shape` [out, in]."""
    _check_encoding(bits, codebook, "weight")
    out_p, in_p = (_padded(size) for size in shape)
    stored = {
        ".trellis": ("I16", (in_p // TILE, out_p // TILE, TILE * bits)),
        ".suh": ("F16", (in_p,)),
        ".svh": ("F16", (out_p,)),
    }
    if codebook in MULTIPLIERS:
        stored[f".{codebook}"] = ("I32", ())
    return stored


def quantization_config(bits: float, head_bits: int, codebook: str) -> dict:
    """config.json's quantization_config for a checkpoint of these tensors (conversion/compile.py's keys; no
    "calibration": none was used). quantization_config.json adds "tensor_storage" per module."""
    if codebook not in CODEBOOKS:
        raise BadInput("quantization_config", f"unknown codebook {codebook!r}; expected one of {', '.join(CODEBOOKS)}")
    return {
        "quant_method": "exl3",
        "version": FORMAT_VERSION,
        "bits": bits,
        "head_bits": head_bits,
        "out_scales": "always",
        "codebook": codebook,
    }


def quantize(w: Tensor, bits: int, codebook: str = "mul1", name: str = "weight", seed: int = 0) -> dict[str, Tensor]:
    """Stored parts (stored_shapes) of float `w` [out, in] at `bits` per weight, on w's device, the Viterbi
    search in Triton there when it is CUDA; `seed` draws the sign vectors; `name` names w in errors.

    Same input and seed give the same bytes on every device. Gaussian weights come back with a relative error
    of 0.26 / 0.13 / 0.067 at K = 2 / 3 / 4 (ExLlamaV3's own uncalibrated quantizer: 0.26 / 0.13 / 0.066).
    """
    _check_encoding(bits, codebook, name)
    if w.ndim != 2 or w.numel() == 0 or not w.is_floating_point():
        raise BadInput(name, f"expected a non-empty float matrix [out, in], got {w.dtype} {list(w.shape)}")
    if not torch.isfinite(w).all():
        raise BadInput(name, "has NaN or infinite values")
    rotated, suh, svh = _regularize(w, TILE_RMS[codebook][bits - 1], seed, name)
    rows, cols = rotated.shape[0] // TILE, rotated.shape[1] // TILE
    tiles = rotated.float().view(rows, TILE, cols, TILE).transpose(1, 2).reshape(-1, TILE_LEN)
    tiles = tiles[:, TILE_ORDER.to(w.device)]
    trellis = torch.cat(
        [pack_states(viterbi(batch, bits, codebook), bits) for batch in tiles.split(_batch_tiles(bits, w.device))]
    )
    parts = {".trellis": trellis.view(rows, cols, -1), ".suh": suh, ".svh": svh}
    if codebook in MULTIPLIERS:
        parts[f".{codebook}"] = torch.tensor(MULTIPLIERS[codebook] - (1 << 32), dtype=torch.int32, device=w.device)
    return parts


def pack_states(states: Tensor, bits: int) -> Tensor:
    """int16 trellis [..., 16·K] from the states [..., 256] of whole tiles: each state's low K bits (its chunk),
    MSB-first into a 256·K-bit stream, halves of each uint32 swapped as ExLlamaV3's pack_trellis stores them."""
    chunks = states.to(torch.int64) & ((1 << bits) - 1)
    stream = (chunks[..., None] >> torch.arange(bits - 1, -1, -1, device=states.device)) & 1
    stream = stream.flatten(-2).unflatten(-1, (-1, 16))  # [..., 16·K words, 16 bits]
    halves = (stream << torch.arange(15, -1, -1, device=states.device)).sum(-1)
    halves = halves.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # SWAP16: the first word is the high half
    return ((halves ^ 0x8000) - 0x8000).to(torch.int16)  # same 16 bits, signed, so the cast is exact


def viterbi(tiles: Tensor, bits: int, codebook: str) -> Tensor:
    """int64 states [T, 256] of fp32 tiles [T, 256] (in position order): ExLlamaV3's two-pass tail-biting
    search for the state ring with the least squared error, with float32 costs.

    Pass one starts free at position 128 and runs round the ring; tracing it back from its best end gives the
    edge (the low 16 - K bits of a state, all that carries to the next) before position 0. Pass two starts
    from that edge at position 0 and must end on it. Ties go to the lowest state on every device.
    """
    cb = codebook_values(codebook).to(tiles.device).float()
    forward = _forward_triton if tiles.is_cuda and triton is not None else _forward_torch
    states = []
    for batch in tiles.split(_batch_tiles(bits, tiles.device)):
        costs, back = forward(batch, cb, bits, TILE_LEN // 2, None)
        edge = _trace(back, costs.argmin(-1), bits, range(TILE_LEN // 2 - 1, -1, -1))[0]
        _, back = forward(batch, cb, bits, 0, edge)
        states.append(_trace(back, edge, bits, range(TILE_LEN - 1, -1, -1))[1])
        for count in _tile_counters:
            count(len(batch))
    return torch.cat(states)


_tile_counters: list[Callable[[int], None]] = []  # told the tiles each search batch finished (convert's rate and ETA)


@contextlib.contextmanager
def counting_tiles(count: Callable[[int], None]) -> Iterator[None]:
    """Call `count(tiles)` as searches finish batches of tiles, from whichever thread runs them, while inside."""
    _tile_counters.append(count)
    try:
        yield
    finally:
        _tile_counters.remove(count)


def tiles_of(stored: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """Tiles (256 weights each) the search encodes for a weight stored as `stored` (stored_shapes' parts)."""
    rows, cols, _ = stored[".trellis"][1]
    return rows * cols


def measured_rate(bits: int, codebook: str, device: str) -> float:
    """Tiles per second the search encodes on `device` now: one CPU step's worth of random tiles (CPU_TILES) timed,
    or on CUDA a batch of 4096 after one that pays Triton's compile."""
    import time

    count = CPU_TILES if device == "cpu" else 4096
    tiles = torch.randn(count, TILE_LEN, generator=torch.Generator().manual_seed(0)).to(device)
    if device != "cpu":
        viterbi(tiles, bits, codebook)
        torch.cuda.synchronize()
    started = time.perf_counter()
    viterbi(tiles, bits, codebook)
    if device != "cpu":
        torch.cuda.synchronize()
    return count / (time.perf_counter() - started)


def _trace(back: Tensor, edge: Tensor, bits: int, positions: range) -> tuple[Tensor, Tensor]:
    """Follow the back pointers (the top K bits of each position's state) from `edge` through `positions`,
    downwards: (the edge before the last position, the states of the positions visited)."""
    rows = torch.arange(back.shape[0], device=back.device)
    states = torch.empty(back.shape[0], TILE_LEN, dtype=torch.int64, device=back.device)
    for position in positions:
        state = (back[rows, position, edge].to(torch.int64) << (16 - bits)) | edge
        states[:, position] = state
        edge = state >> bits
    return edge, states


def _batch_tiles(bits: int, device: torch.device) -> int:
    """Tiles per search batch: bounded by the back pointers' bytes (256 · 2^(16-K) a tile)."""
    budget = 8 << 30 if device.type == "cuda" else 256 << 20
    return max(1, budget // (TILE_LEN * (STATES >> bits)))


def _initial_costs(rows: int, edges: int, start: Tensor | None, device: torch.device) -> Tensor:
    """Costs before the first step: all edges free, or only `start` (per tile) allowed."""
    if start is None:
        return torch.zeros(rows, edges, device=device)
    costs = torch.full((rows, edges), math.inf, device=device)
    return costs.scatter_(1, start[:, None], 0.0)


CPU_TILES = 8  # tiles per step on the CPU: [8, 65536] float32 candidates stay in the L2 cache


def _forward_torch(x: Tensor, cb: Tensor, bits: int, roll: int, start: Tensor | None) -> tuple[Tensor, Tensor]:
    """One pass: final costs [T, E] and back pointers [T, 256, E] (uint8: the top K bits of the best state).

    State s = k·E + a·2^K + b (E = 2^(16-K) edges) comes from edge k·A + a (A = E / 2^K) and leaves edge
    e = a·2^K + b. A step adds each state's squared error to its source edge's cost and keeps, per e, the
    least key (cost's float32 bits with the low K bits replaced by k): integer minima, so the order they are
    taken in cannot matter, and ties go to the lowest k. Costs carry on without those K bits (relative 2^-15
    at most). The errors are laid out [k, b, a] so that both the sum and the minimum run over whole rows.
    """
    count, edges, branches = x.shape[0], STATES >> bits, 1 << bits
    sources = edges // branches
    table = _branch_table(cb, bits)
    branch = torch.arange(branches, dtype=torch.int32, device=x.device).view(1, branches, 1, 1)
    low = branches - 1
    back = torch.empty(count, TILE_LEN, edges, dtype=torch.uint8, device=x.device)
    finals = torch.empty(count, edges, device=x.device)
    for first in range(0, count, CPU_TILES):
        rows = slice(first, first + CPU_TILES)
        tiles = x[rows]
        costs = _initial_costs(tiles.shape[0], edges, None if start is None else start[rows], x.device)
        for step in range(TILE_LEN):
            position = (step + roll) % TILE_LEN
            candidates = table - tiles[:, position, None, None, None]
            candidates.mul_(candidates).add_(costs.view(-1, branches, 1, sources))
            keys = candidates.view(torch.int32).bitwise_and_(~low).bitwise_or_(branch)
            while keys.shape[1] > 1:
                half = keys.shape[1] // 2
                keys = torch.minimum(keys[:, :half], keys[:, half:])
            keys = keys.view(-1, branches, sources).transpose(1, 2).reshape(-1, edges)  # [b, a] -> e = a·2^K + b
            back[rows, position] = (keys & low).to(torch.uint8)
            costs = (keys & ~low).view(torch.float32)
        finals[rows] = costs
    return finals, back


def _branch_table(cb: Tensor, bits: int) -> Tensor:
    """cb [65536] as [2^K, 2^K, A]: state k·E + a·2^K + b at [k, b, a]."""
    branches = 1 << bits
    return cb.view(branches, -1, branches).transpose(1, 2).contiguous()


def _forward_triton(x: Tensor, cb: Tensor, bits: int, roll: int, start: Tensor | None) -> tuple[Tensor, Tensor]:
    """_forward_torch in one Triton kernel (same float32 operations, no fused multiply-add, same integer
    keys), so both give the same bits; costs ping-pong through a [T, 2, E] buffer in L1/L2."""
    count, edges = x.shape[0], STATES >> bits
    costs = torch.empty(count, 2, edges, device=x.device)
    back = torch.empty(count, TILE_LEN, edges, dtype=torch.uint8, device=x.device)
    free = start is None
    start = torch.zeros(count, dtype=torch.int32, device=x.device) if free else start.to(torch.int32)
    tiles, chunk, warps = GPU_LAUNCH
    _viterbi_pass[(triton.cdiv(count, tiles),)](
        x.contiguous(),
        cb,
        start,
        costs,
        back,
        count,
        ROLL=roll,
        FREE=free,
        BITS=bits,
        TILES=tiles,
        CHUNK=min(edges, chunk),
        num_warps=warps,
        enable_fp_fusion=False,
    )
    return costs[:, 0], back


# (tiles per program, which share each codebook load; edges per block of work; warps): the fastest of
# benchmarks/exl3_encode.py's sweep on an H200. Any choice gives the same bits.
GPU_LAUNCH = (2, 512, 4)

if triton is not None:

    @triton.jit
    def _viterbi_pass(
        x_ptr,
        cb_ptr,
        start_ptr,
        cost_ptr,
        back_ptr,
        count,
        ROLL: tl.constexpr,
        FREE: tl.constexpr,
        BITS: tl.constexpr,
        TILES: tl.constexpr,
        CHUNK: tl.constexpr,
    ):
        EDGES: tl.constexpr = 65536 >> BITS
        BRANCHES: tl.constexpr = 1 << BITS
        SOURCES: tl.constexpr = EDGES // BRANCHES
        tile = tl.program_id(0) * TILES + tl.arange(0, TILES)
        live = (tile < count)[:, None]
        tile = tile.to(tl.int64)
        cost_row = cost_ptr + tile[:, None] * (2 * EDGES)
        back_row = back_ptr + tile[:, None] * (256 * EDGES)
        block = tl.arange(0, CHUNK)[None, :]
        if FREE:
            for first in range(0, EDGES, CHUNK):
                tl.store(cost_row + first + block, tl.zeros((TILES, CHUNK), tl.float32), mask=live)
        else:
            start = tl.load(start_ptr + tile, mask=tile < count, other=0)[:, None]
            for first in range(0, EDGES, CHUNK):
                initial = tl.where(first + block == start, 0.0, float("inf"))
                tl.store(cost_row + first + block, initial, mask=live)
        tl.debug_barrier()
        for step in range(256):
            position = (step + ROLL) % 256
            source_row = cost_row + (step % 2) * EDGES
            target_row = cost_row + (1 - step % 2) * EDGES
            weight = tl.load(x_ptr + tile * 256 + position, mask=tile < count, other=0.0)[:, None]
            for first in range(0, EDGES, CHUNK):
                edge = first + block
                best = tl.full((TILES, CHUNK), 0x7FFFFFFF, tl.int32)
                for branch in range(BRANCHES):
                    value = tl.load(cb_ptr + branch * EDGES + edge)
                    cost = tl.load(source_row + branch * SOURCES + edge // BRANCHES, mask=live, other=0.0)
                    diff = value - weight
                    key = (cost + diff * diff).to(tl.int32, bitcast=True)
                    best = tl.minimum(best, (key & -BRANCHES) | branch)
                tl.store(target_row + edge, (best & -BRANCHES).to(tl.float32, bitcast=True), mask=live)
                tl.store(back_row + position * EDGES + edge, (best & (BRANCHES - 1)).to(tl.uint8), mask=live)
            tl.debug_barrier()


def _regularize(w: Tensor, tile_rms: float, seed: int, name: str) -> tuple[Tensor, Tensor, Tensor]:
    """(float64 [in_p, out_p] the tiles are cut from, suh, svh).

    W^T [in_p, out_p] is divided by svh (random signs × each output channel's RMS over its mean), rotated on
    the output side, divided by suh (signs × each input row's RMS / tile_rms), then rotated on the input side.
    Both vectors are rounded to fp16 before dividing by them, so decoding multiplies by what was divided by;
    all-zero channels get scale 0 and decode to exact zeros. Sums run in a fixed order and the random signs
    come from a CPU generator, so every device computes the same bits.
    """
    out, inp = w.shape
    wt = torch.zeros(_padded(inp), _padded(out), dtype=torch.float64, device=w.device)
    wt[:inp, :out] = w.T
    generator = torch.Generator().manual_seed(seed)
    in_signs, out_signs = (_signs(size, generator).to(w.device) for size in wt.shape)
    channel_rms = _rms(wt.T)
    mean = _tree_sum(channel_rms) / channel_rms.shape[0]
    svh = _to_scales(out_signs * channel_rms / torch.where(mean > 0, mean, 1.0), name)
    rotated = _fwht(wt / _divisor(svh)[None, :], 1)
    suh = _to_scales(in_signs * true_divide(_rms(rotated), tile_rms), name)
    return _fwht(rotated / _divisor(suh)[:, None], 0), suh, svh


def _signs(size: int, generator: torch.Generator) -> Tensor:
    return torch.randint(0, 2, (size,), generator=generator).to(torch.float64) * 2 - 1


def _to_scales(scales: Tensor, name: str) -> Tensor:
    half = scales.to(torch.float16)
    if not torch.isfinite(half).all():
        raise BadInput(name, "a channel scale overflows fp16 (|w| too large for EXL3's fp16 suh/svh)")
    if ((half == 0) & (scales != 0)).any():
        raise BadInput(name, "a channel scale underflows fp16 (|w| too small for EXL3's fp16 suh/svh)")
    return half


def _divisor(scales: Tensor) -> Tensor:
    return torch.where(scales == 0, 1.0, scales.to(torch.float64))


def _rms(x: Tensor) -> Tensor:
    """Root mean square over the last dim (float64, fixed summation order)."""
    return torch.sqrt(_tree_sum(x * x) / x.shape[-1])


def _tree_sum(x: Tensor) -> Tensor:
    """Sum over the last dim by pairwise halving, zero-padded to a power of two: the same order, and so the
    same bits, on every device (torch's own reductions split differently on CPU and CUDA)."""
    size = 1 << (x.shape[-1] - 1).bit_length()
    x = torch.nn.functional.pad(x, (0, size - x.shape[-1]))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _fwht(x: Tensor, dim: int) -> Tensor:
    """x rotated by the 128-wide block Hadamard along `dim` (butterflies in float64, scaled 1/√128)."""
    moved = x.movedim(dim, -1)
    blocks = moved.reshape(-1, PAD)
    span = 1
    while span < PAD:
        pairs = blocks.view(-1, PAD // (2 * span), 2, span)
        low, high = pairs[:, :, 0], pairs[:, :, 1]
        blocks = torch.stack((low + high, low - high), 2).view(-1, PAD)
        span *= 2
    return (blocks * (1 / math.sqrt(PAD))).view(moved.shape).movedim(-1, dim)


def _padded(size: int) -> int:
    return -(-size // PAD) * PAD


def _check_encoding(bits: int, codebook: str, name: str) -> None:
    if codebook not in CODEBOOKS:
        raise BadInput(name, f"unknown EXL3 codebook {codebook!r}; expected one of {', '.join(CODEBOOKS)}")
    if isinstance(bits, bool) or bits not in BITS:
        raise BadInput(name, f"EXL3 encodes 1..8 bits per weight, not {bits!r}")


def _name(module: str, suffix: str) -> str:
    return f"{module}{suffix}" if module else suffix.lstrip(".")
