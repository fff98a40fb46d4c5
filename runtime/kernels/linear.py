"""Weight-only matmuls, y = x @ W.T, for a dense weight or one kept in its stored layout (`Packed`).

x [M, K] (bf16 on the GPU, float32 on the CPU); W [N, K]; y [M, N] in x's dtype, accumulated in float32.
`matmul_experts` is the routed-expert form for few tokens: W stacked [E, N, K], expert_ids [T, k], and
y[t, s] = W[expert_ids[t, s]] @ x[t]; or, `per_pair` (the down projection, whose input is each pair's SwiGLU),
x [T·k, K] and y[t, s] = W[expert_ids[t, s]] @ x[t·k + s].

The CPU path (`*_reference`) dequantizes through the layout's codec (formats/codecs.py, bit-exact with the
reference libraries) and multiplies in fixed tiles of rows (cpu_rows.py). The Triton path streams the stored parts once
and dequantizes in registers. Layouts with a Triton kernel (KERNEL_LAYOUTS): dense bf16/f16/f32, fp8-tensor,
fp8-block, nvfp4-modelopt (other NVFP4 flavours: `to_kernel_layout`, exact), affine4/affine8 in groups of
32/64/128, gguf-Q8_0, gguf-Q4_K, gguf-Q5_K, gguf-Q6_K.

How the GPU kernel streams weights (few rows of x against a large W):
- The weight is the tensor core's wide operand: a program computes acc[BLOCK_N weight rows, BLOCK_M = 16
  tokens] += W_tile @ x_tileᵀ (on an H200, wgmma with the dequantized weights in registers and x in shared
  memory), so rows of x past M cost nothing but masked loads, and one pass over W serves up to 16 rows.
- Packed codes are read as 32-bit words (so a row must be whole words: an FP8 weight's K a multiple of 4,
  refused otherwise) and decoded two values at a time in 16-bit lanes with shifts, masks and bf16x2 FMAs
  (no integer-to-float conversion instructions, which are slow on Hopper): the values land in the
  lanes in pairs (s, s + 4) for 4-bit codes and (s, s + 2) for bytes. A dot sums over K in any order, so
  the kernel does not move the decoded values back: it feeds the tensor core the pairs where the registers
  hold them and permutes the x tile (small, in shared memory) the same way (`_x_w4`, `_x_w8`). The
  permutation only renames which product goes to which lane; every product is still x_k·w_k.
- GGUF Q8_0 and Q6_K blocks (34 and 210 bytes) are only 2-byte aligned: their words are read at the
  4-byte boundary below and realigned with a 16-bit funnel shift (`_words_at`). That kernel reads GGUF bytes
  as stored; loaders give the GGUF types it serves best as planes instead (`to_kernel_layout`).

GGUF Q8_0, Q4_K, Q5_K and Q6_K as planes (formats/gguf_planes.py: each field of every block gathered into
an aligned array, the same bytes) run `_planes_kernel`, which streams them at 16 bytes a load and keeps the
tensor cores fed without shared-memory staging or barriers between groups (benchmarks/results/gguf_kernels.md
says why the GGUF-bytes kernel could not): a program's BLOCK_N rows are `warps` row groups, the batch axis of
every dot, which Triton lowers to the synchronous mma with one warp a row group; each group of 16 or 32 values
is decoded with constant shifts (two or four codes a register in PTX), dotted with x's group (one x tile for
all row groups), and scaled per row into the accumulator: d·Σx·q for Q8_0 and Q6_K (whose high bit pairs are a
second dot accumulated into the first), d·sc·Σx·q − dmin·m·Σx for Q4_K and Q5_K (Σx a dot with ones, in the
same register layout as the codes). Its tiles per type are PLANES_TILES, chosen from the benchmark's sweep; a
tile may hold 8 tokens (half the dot and scaling work of 16; calls of 9 to 16 tokens then read the weight twice).

Exact products: every tensor-core dot takes operands whose values are exact in bf16 (the bf16 activation;
FP8 values; E2M1 codes times their E4M3 block scale (times 2^-8, undone on the per-tensor scale); integer
codes; an f16 weight as two bf16 halves), and what a layout scales by groups is applied to each group's
float32 dot: s·Σx·q + b·Σx for affine and Q4_K/Q5_K, d·Σx·q for Q8_0 and Q6_K, the 128x128 FP8 scale per
block, per-tensor scales at the end. So y differs from x @ dequantize() by float32 summation order only (an
E4M3 NaN code, which no quantizer writes, decodes to a finite value here).

Batch invariance: a fixed number of tokens per tile whatever M (16, or 8 in some planes tilings; rows past M
are zeros), one tile configuration per (layout, N, K) (`_config`), never chosen by M or by the routing; a split
of K, where the weight's shape asks for one, sums its float32 partials in a fixed order in a second kernel
(never atomics), or, where the caller asks for them (`unsummed`: SplitSums), in the kernel that reads the product
next, in the same order and rounding: the routed experts' gate|up in their SwiGLU (activation.swiglu), a mixer's
output projection in the residual add and norm after it (norm.add_rms_norm). A row's position in a tile, and
which other rows share it, do not change its bits: the tensor core treats every token column alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from specpair.errors import BadInput
from specpair.formats import gguf_planes, nvfp4
from specpair.formats.codecs import FLOAT_LAYOUTS, codec, nvfp4_read
from specpair.formats.layouts import layout_of
from specpair.formats.packed import Packed
from specpair.runtime.kernels.cpu_rows import rows_mm, weight_mm
from specpair.runtime.kernels.triton_common import (
    INTERPRETED,
    after_previous_kernel,
    device_function,
    dot,
    dot3,
    dot3_acc,
    launch_options,
    prefetch_to_l2,
    require_triton,
    rounded,
    split_sum,
    tl,
    triton,
)

BLOCK_M = 16  # tokens per tile: the tensor core's narrow side
SMS = 132  # streaming multiprocessors of an H100 or H200
# K is split until a weight's programs reach this: each SM hides one program's latency behind another's
TARGET_PROGRAMS = 2 * SMS
# A routed call's programs cover the rows of every expert it touches: a decode token's top 8 and the shared expert
# in Qwen3.5/3.6
EXPERTS_PER_CALL = 9
WINDOW_TOP_K = 16  # routed calls of at most BLOCK_M tokens with top-k up to this find their rows in the kernel


@dataclass(frozen=True)
class Tiles:
    """How the kernel cuts one weight: rows per program, K values per loop step, splits of K, warps, and
    software-pipeline stages. A function of the layout and the weight's shape only (`_config`)."""

    block_n: int
    step: int
    splits: int
    warps: int
    stages: int
    block_m: int = BLOCK_M  # tokens per tile


@dataclass(frozen=True)
class PlanesTiling:
    """A GGUF type's tiles in the planes kernel: weight rows per program, K values per loop step (whole
    blocks), tokens per tile (16, or 8: the tensor core's narrowest, half the dot and scaling work, but calls
    of 9 to 16 tokens read the weight twice), warps, pipeline stages, and the programs K is split to reach."""

    block_n: int
    step: int
    block_m: int
    warps: int
    stages: int
    programs: int


# The planes kernel's tiles per GGUF type, picked from benchmarks/gguf_kernels_gpu.py's sweep on an H200 (its
# table prints each candidate as a row of this form).
PLANES_TILES = {
    "Q8_0": PlanesTiling(block_n=64, step=256, block_m=8, warps=4, stages=3, programs=528),
    "Q4_K": PlanesTiling(block_n=64, step=256, block_m=8, warps=4, stages=3, programs=528),
    "Q5_K": PlanesTiling(block_n=64, step=256, block_m=8, warps=4, stages=3, programs=528),
    "Q6_K": PlanesTiling(block_n=128, step=256, block_m=8, warps=8, stages=3, programs=264),
}


def matmul(x: Tensor, w: Tensor | Packed, unsummed: bool = False) -> Tensor | SplitSums:
    """`unsummed`: where the GPU kernel splits K, its partials (SplitSums) for the next kernel to add."""
    if x.is_cuda:
        return matmul_triton(x, w, unsummed=unsummed)
    return matmul_reference(x, w)


def expert_stacks(weights: Sequence[Tensor | Packed], smallest: int = 1024) -> list[Tensor]:
    """The tensors of stacked expert weights ([E, ...] each, an expert's bytes contiguous) whose expert holds at
    least `smallest` bytes, largest first: what a router can ask L2 for once it knows the experts
    (experts.route's prefetch)."""
    tensors = [t for w in weights for t in (w.parts.values() if isinstance(w, Packed) else [w])]
    stacked = [t for t in tensors if t.ndim >= 2 and t.is_contiguous() and t.stride(0) * t.element_size() >= smallest]
    return sorted(stacked, key=lambda t: -t.stride(0) * t.element_size())


def matmul_experts(
    x: Tensor,
    w: Tensor | Packed,
    expert_ids: Tensor,
    per_pair: bool = False,
    unsummed: bool = False,
    tables: TileTables | None = None,
) -> Tensor | SplitSums:
    """`unsummed`: where the GPU kernel splits K, its partials over the pairs' rows (SplitSums of [splits, T·k, N])
    for the next kernel to add; else (and always on the CPU) y [T, k, N]. `tables`: expert_ids' tile tables,
    shared with the other calls that read them (on the GPU, past the in-kernel window)."""
    if x.is_cuda:
        return matmul_experts_triton(x, w, expert_ids, per_pair=per_pair, unsummed=unsummed, tables=tables)
    return matmul_experts_reference(x, w, expert_ids, per_pair)


class TileTables:
    """The tile tables (tile_table) of one step's routed pairs, each built once per (experts, rows) and shared by
    the calls that read the same expert_ids: a MoE layer's gate|up and down matmuls, past the in-kernel window."""

    def __init__(self, expert_ids: Tensor) -> None:
        self.expert_ids = expert_ids
        self._built: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}

    def __call__(self, experts: int, rows: int) -> tuple[Tensor, Tensor]:
        if (experts, rows) not in self._built:
            self._built[experts, rows] = tile_table(self.expert_ids, experts, rows)
        return self._built[experts, rows]


def _product_weight(w: Tensor | Packed) -> Tensor:
    """A CPU product's weight: a packed one decoded (float32, exact), a tensor as held (its dtype picks the product)."""
    return w.dequantize() if isinstance(w, Packed) else w


def matmul_reference(x: Tensor, w: Tensor | Packed) -> Tensor:
    return weight_mm(x, _product_weight(w)).to(x.dtype)


def matmul_experts_reference(x: Tensor, w: Tensor | Packed, expert_ids: Tensor, per_pair: bool = False) -> Tensor:
    out = torch.empty(*expert_ids.shape, w.shape[1], dtype=x.dtype)
    pairs = x.reshape(*expert_ids.shape, -1) if per_pair else None
    for e in expert_ids.unique().tolist():  # an expert's tokens in tiles: a row's bits are its own (cpu_rows.py)
        tokens, slots = (expert_ids == e).nonzero(as_tuple=True)
        weight = _product_weight(w.expert(e) if isinstance(w, Packed) else w[e])
        rows = x[tokens] if pairs is None else pairs[tokens, slots]
        out[tokens, slots] = rows_mm(rows, weight.T).to(x.dtype)
    return out


def to_kernel_layout(w: Packed) -> Packed:
    """For loaders, the layout the Triton kernels read best, exactly: an NVFP4 weight of any flavour as
    ModelOpt bits (codes and scales move unchanged), a GGUF Q8_0, Q4_K, Q5_K or Q6_K weight as planes
    (formats/gguf_planes.py: its bytes rearranged, none added; the GGUF bytes are let go with `w`); other
    layouts as they are."""
    planes = gguf_planes.of(layout_of(w.layout).flavour or "") if layout_of(w.layout).kind == "gguf" else None
    if planes is not None and "" in w.parts:
        return replace(w, parts=gguf_planes.to_planes(w.parts[""], planes.qtype, w.shape, w.name))
    if w.layout not in nvfp4.FLAVOURS or w.layout == "nvfp4-modelopt":
        return w
    experts = [w.expert(e) for e in range(w.experts)] if w.experts is not None else [w]
    parts = [
        nvfp4.to_modelopt(nvfp4_read(w.layout, one.parts, w.name), w.name.removesuffix(".weight")) for one in experts
    ]
    parts = [{k: v for k, v in p.items() if k != ".input_scale"} for p in parts]
    stacked = parts[0] if w.experts is None else {k: torch.stack([p[k] for p in parts]) for k in parts[0]}
    return replace(w, layout="nvfp4-modelopt", parts=stacked)


def on_cuda(w: Tensor | Packed) -> bool:
    return (w if isinstance(w, Tensor) else next(iter(w.parts.values()))).is_cuda


def fusable_rows(weights: Sequence[Tensor | Packed]) -> bool:
    """Whether `fuse_rows` can make one operand of these: not for a different dtype, layout, width or column
    order, per-tensor scales that differ, or block scales that a row boundary would cut."""
    first = weights[0]
    lead = len(first.shape) - 2  # the row axis: 1 for a stack of experts
    if any(
        type(w) is not type(first) or w.shape[:lead] != first.shape[:lead] or w.shape[-1] != first.shape[-1]
        for w in weights
    ):
        return False
    if isinstance(first, Tensor):
        return all(w.dtype == first.dtype for w in weights)
    if any(
        w.layout != first.layout or w.parts.keys() != first.parts.keys() or not _same_columns(w, first) for w in weights
    ):
        return False
    if any(w.shape[lead] % codec(first.layout).row_block for w in weights[:-1]):
        return False  # a piece would end inside one of FP8's 128-row scale tiles
    scalars = [key for key, part in first.parts.items() if part.ndim == lead]  # per-tensor (per-expert) scales
    return all(torch.equal(w.parts[key], first.parts[key]) for key in scalars for w in weights)


def _same_columns(a: Packed, b: Packed) -> bool:
    """Whether two packed weights store their columns in the same order (Packed.col_order)."""
    if a.col_order is None or b.col_order is None:
        return a.col_order is b.col_order
    return torch.equal(a.col_order, b.col_order)


def fuse_rows(weights: Sequence[Tensor | Packed]) -> Tensor | Packed:
    """One weight whose output rows are the given weights' rows in order (q|k|v, gate|up, router|shared gate:
    one matmul, one pass over x, instead of one each); stacks of experts fuse along their rows too. The kernel
    computes each output row from its own weight row alone."""
    if not fusable_rows(weights):
        raise ValueError(
            f"{', '.join(w.name if isinstance(w, Packed) else str(list(w.shape)) for w in weights)}: not one operand"
        )
    first = weights[0]
    lead = len(first.shape) - 2
    if isinstance(first, Tensor):
        return torch.cat(list(weights), dim=lead)
    parts = {
        key: part if part.ndim == lead else torch.cat([w.parts[key] for w in weights], dim=lead)
        for key, part in first.parts.items()
    }
    shape = (*first.shape[:lead], sum(w.shape[lead] for w in weights), first.shape[-1])
    return replace(first, name="|".join(w.name for w in weights), shape=shape, parts=parts)


def appendable_expert(stacks: Sequence[Tensor | Packed], expert: Sequence[Tensor | Packed]) -> bool:
    """Whether `with_expert` can add `expert` (one weight per stack, each [rows, in]) to `stacks` (each [E, rows,
    in], fused along their rows where there are several) as one more expert: the same dtype, or layout, parts and
    column order, as one expert of its stack, every part shaped as that expert's; each side fusable along rows."""
    if len(stacks) != len(expert) or not fusable_rows(stacks) or not fusable_rows(expert):
        return False
    for stack, one in zip(stacks, expert):
        if type(stack) is not type(one) or len(stack.shape) != 3 or tuple(stack.shape[1:]) != tuple(one.shape):
            return False
        if isinstance(stack, Tensor):
            if stack.dtype != one.dtype:
                return False
            continue
        if stack.layout != one.layout or stack.parts.keys() != one.parts.keys() or not _same_columns(stack, one):
            return False
        if any(p.shape[1:] != one.parts[k].shape or p.dtype != one.parts[k].dtype for k, p in stack.parts.items()):
            return False
    return True


def with_expert(stacks: Sequence[Tensor | Packed], expert: Sequence[Tensor | Packed]) -> Tensor | Packed:
    """One stack of E + 1 experts: the stacks' E fused along their rows (as fuse_rows), then `expert` fused the
    same way (a MoE's shared expert: the expert launches read it with the routed ones, by id E). Written once into
    one new tensor per part, so a load holds no intermediate copy."""
    if not appendable_expert(stacks, expert):
        raise ValueError(
            f"{', '.join(w.name if isinstance(w, Packed) else str(list(w.shape)) for w in [*stacks, *expert])}: "
            "not one stack of experts"
        )

    def stacked(parts: Sequence[Tensor], ones: Sequence[Tensor]) -> Tensor:
        """[E, rows_i, ...] and [rows_i, ...] -> [E + 1, sum rows_i, ...]; per-expert scalars [E] and [] -> [E + 1]."""
        first = parts[0]
        if first.ndim == 1:
            return torch.cat((first, ones[0][None]))
        out = first.new_empty((first.shape[0] + 1, sum(p.shape[1] for p in parts), *first.shape[2:]))
        at = 0
        for part, one in zip(parts, ones):
            out[:-1, at : at + part.shape[1]] = part
            out[-1, at : at + part.shape[1]] = one
            at += part.shape[1]
        return out

    first = stacks[0]
    if isinstance(first, Tensor):
        return stacked(stacks, expert)
    parts = {key: stacked([w.parts[key] for w in stacks], [w.parts[key] for w in expert]) for key in first.parts}
    name = "|".join(w.name for w in stacks) + "+" + "|".join(w.name for w in expert)
    shape = (first.shape[0] + 1, sum(w.shape[1] for w in stacks), first.shape[-1])
    return replace(first, name=name, shape=shape, parts=parts)


# ---- the Triton path -----------------------------------------------------------------------------------

DENSE, FP8_TENSOR, FP8_BLOCK, NVFP4, AFFINE4, AFFINE8, Q8_0, Q4_K, Q5_K, Q6_K = range(10)  # the kernel's LAYOUT


@dataclass(frozen=True)
class KernelLayout:
    """How the matmul kernel reads one layout: the LAYOUT code its body decodes by, the Packed parts it takes
    (in order; "" the whole tensor), K values per loop step (a multiple of the layout's block), and how part 0's
    codes travel: "dense" as they are; "words" as int32 words of a row (K a multiple of `word_rows` makes a row
    whole words); "realigned" as words of the whole tensor, realigned in the kernel (blocks at 2-byte
    boundaries). `group`: affine's values per scale (the kernel's GROUP); `group_scales`: part 1 holds a scale
    per group of a row (its columns bound the kernel's loads)."""

    code: int
    parts: tuple[str, ...]
    step: int
    codes: str = "words"
    word_rows: int = 1
    group: int = 0
    group_scales: bool = False


KERNEL_LAYOUTS: dict[str, KernelLayout] = {  # every layout with a Triton matmul kernel, one row each
    **{layout: KernelLayout(DENSE, ("",), 128, codes="dense") for layout in FLOAT_LAYOUTS},
    "fp8-tensor": KernelLayout(FP8_TENSOR, (".weight", ".weight_scale"), 128, word_rows=4),
    # a step of one 128-column scale block
    "fp8-block": KernelLayout(FP8_BLOCK, (".weight", ".weight_scale_inv"), 128, word_rows=4),
    "nvfp4-modelopt": KernelLayout(
        NVFP4, (".weight", ".weight_scale", ".weight_scale_2"), 256, word_rows=8, group_scales=True
    ),
    "gguf-Q8_0": KernelLayout(Q8_0, ("",), 128, codes="realigned"),  # 34-byte blocks
    "gguf-Q4_K": KernelLayout(Q4_K, ("",), 256, word_rows=256),
    "gguf-Q5_K": KernelLayout(Q5_K, ("",), 256, word_rows=256),
    "gguf-Q6_K": KernelLayout(Q6_K, ("",), 256, codes="realigned"),  # 210-byte blocks
    **{  # a step of two groups
        f"affine{bits}-g{group}": KernelLayout(
            AFFINE4 if bits == 4 else AFFINE8,
            (".weight", ".scales", ".biases"),
            2 * group,
            group=group,
            group_scales=True,
        )
        for bits in (4, 8)
        for group in (32, 64, 128)
    },
}


def reads_packed(layout: str) -> bool:
    """A quantized layout the matmul kernels read as stored, or as ModelOpt bits (other NVFP4 flavours, repacked
    exactly by to_kernel_layout): loaders keep such weights packed."""
    return layout not in FLOAT_LAYOUTS and (layout in KERNEL_LAYOUTS or layout in nvfp4.FLAVOURS)


# how many bf16 values sum to any value of a dtype exactly (8 significant bits each): an affine bias's parts
BF16_PARTS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}


@dataclass(frozen=True)
class _Operand:
    """A weight as the kernel reads it: three part pointers, each with its expert and row strides (in its
    own elements; 0 where it has none), its layout's row, and the logical shape. Packed codes travel as
    int32 words: part 0 viewed per row (bytes or words of a row), or for "realigned" layouts the whole
    tensor as words, with part 0's strides then in bytes."""

    layout: KernelLayout
    parts: tuple[Tensor, Tensor, Tensor]
    expert_strides: tuple[int, int, int]
    row_strides: tuple[int, int, int]
    n: int
    k: int
    experts: int | None
    f16_halves: bool  # a dense f16 weight, fed to bf16 dots as two exact halves
    f32_weight: bool  # a dense f32 weight: its values are not bf16, so the dot runs in float32
    # elements per row of parts 0 and 1 (masks; as kernel arguments their divisibility lets loads vectorize);
    # for "realigned" layouts part 0's count is the whole tensor's words
    cols: tuple[int, int]


@dataclass(frozen=True)
class _PlanesOperand:
    """A GGUF weight as planes, as the planes kernel reads it: the code, high, scale and super planes (the
    code plane standing in for those a type has not), each with its expert and row strides in its own
    elements, and the type's descriptor."""

    planes: gguf_planes.Planes
    parts: tuple[Tensor, Tensor, Tensor, Tensor]
    expert_strides: tuple[int, int, int, int]
    row_strides: tuple[int, int, int, int]
    n: int
    k: int
    experts: int | None
    f32_weight: bool = False


def _planes_operand(w: Packed, planes: gguf_planes.Planes) -> _PlanesOperand:
    stacked = len(w.shape) == 3
    given = {role: part.contiguous() for role, part in w.parts.items()}
    if set(given) != {p.role for p in planes.planes}:
        raise BadInput(
            w.name, f"{w.layout} planes are {', '.join(p.role for p in planes.planes)}; got {', '.join(given)}"
        )
    parts = tuple(given.get(role, given["codes"]) for role in gguf_planes.ROLES)
    strides = [_strides(part, stacked) for part in parts]
    return _PlanesOperand(
        planes,
        parts,
        tuple(e for e, _ in strides),
        tuple(r for _, r in strides),
        w.shape[-2],
        w.shape[-1],
        w.shape[0] if stacked else None,
    )


def _strides(part: Tensor, stacked: bool) -> tuple[int, int]:
    """(expert stride, row stride) of a part [(E,) rows, cols], [(E,)] or []."""
    lead = 1 if stacked else 0
    expert = part.stride(0) if stacked and part.ndim else 0
    row = part.stride(lead) if part.ndim >= lead + 2 else 0
    return expert, row


def _words(part: Tensor) -> Tensor:
    """The bytes of a contiguous part as int32 words, copied into a fresh buffer when they do not start at a
    4-byte boundary or do not fill whole words (zero-padded)."""
    flat = part.reshape(-1).view(torch.uint8)
    if flat.data_ptr() % 4 or flat.numel() % 4:
        padded = torch.zeros((flat.numel() + 3) // 4 * 4, dtype=torch.uint8, device=flat.device)
        padded[: flat.numel()] = flat
        flat = padded
    return flat.view(torch.int32)


def _operand(w: Tensor | Packed) -> _Operand | _PlanesOperand:
    if isinstance(w, Packed) and gguf_planes.is_planes(w.parts) and layout_of(w.layout).kind == "gguf":
        planes = gguf_planes.of(layout_of(w.layout).flavour or "")
        if planes is None:
            raise BadInput(w.name, f"{w.layout} has no planes form")
        return _planes_operand(w, planes)
    stacked = len(w.shape) == 3
    n, k = w.shape[-2], w.shape[-1]
    if isinstance(w, Tensor):
        layout, parts = KERNEL_LAYOUTS["bf16"], [w.contiguous()]  # the row of every float layout
    else:
        if w.layout not in KERNEL_LAYOUTS:
            hint = " (repack it with kernels.linear.to_kernel_layout)" if w.layout in nvfp4.FLAVOURS else ""
            raise BadInput(w.name, f"layout {w.layout} has no Triton matmul kernel{hint}")
        layout = KERNEL_LAYOUTS[w.layout]
        if k % layout.word_rows:
            raise BadInput(
                w.name,
                f"{w.layout} rows of {k} values are not whole words; the Triton kernel needs a multiple of "
                f"{layout.word_rows}",
            )
        parts = [w.parts[key].contiguous() for key in layout.parts]
        if layout.codes != "dense":  # bytes of a row (realigned: words made after the strides, in bytes)
            parts[0] = parts[0].view(torch.uint8).reshape(*w.shape[:-1], -1)
        if layout.codes == "words":
            parts[0] = parts[0].view(torch.int32)
    dtype = parts[0].dtype
    parts += [parts[0]] * (3 - len(parts))
    strides = [_strides(part, stacked) for part in parts]
    if layout.codes == "realigned":
        parts[0] = _words(parts[0])
    cols = (
        parts[0].numel() if layout.codes == "realigned" else parts[0].shape[-1],
        parts[1].shape[-1] if layout.group_scales else 0,
    )
    return _Operand(
        layout,
        tuple(parts),
        tuple(s[0] for s in strides),
        tuple(s[1] for s in strides),
        n,
        k,
        w.shape[0] if stacked else None,
        f16_halves=layout.code == DENSE and dtype == torch.float16,
        f32_weight=layout.code == DENSE and dtype == torch.float32,
        cols=cols,
    )


def _config(op: _Operand | _PlanesOperand) -> Tiles:
    """The tiles of a weight, from its layout and shape alone."""
    if isinstance(op, _PlanesOperand):
        return planes_tiles(op.n, op.k, PLANES_TILES[op.planes.qtype])
    step = op.layout.step
    if op.f32_weight:  # float32 dots run on the FMA units: a narrower step keeps their operands in registers
        step = 32
    block_n = 64
    steps = triton.cdiv(op.k, step)
    row_blocks = triton.cdiv(op.n, block_n) * (1 if op.experts is None else EXPERTS_PER_CALL)
    if op.layout.group:
        # an affine step waits on each group's dot before scaling it, so a program is a chain of waits: more,
        # shorter programs hide them, down to one step each, up to 3 programs an SM, splits a power of two (H100,
        # tiles_sweep.py, DFlash2's affine-4 weights: q|k|v 9.9 -> 7.9 µs a call at 4 splits, its convolution's
        # kernel projection 3.6 -> 2.9 at 16; o_proj and down best at the 8 they had, gate|up at 2; the 35B
        # pair's DFlash2 round 0.810 -> 0.801 ms, its consumers reading the extra partials taking back a third)
        splits = 1 << max(0, min(3 * SMS // row_blocks, steps).bit_length() - 1)
    else:
        # row blocks that fill the SMs once but not twice are split in two: whole, a second wave of a few programs
        # leaves most SMs idle (H100, benchmarks/tiles_sweep.py: the 35B-A3B's FP8 GDN input projection, 192 blocks,
        # 13.7 -> 12.5 µs a call; attention's, 144, 12.7 -> 11.2; its routed NVFP4 gate|up, 9 experts of 16 blocks,
        # 13.1 -> 11.2 at 1 token, 40.1 -> 31.0 at 4; its down, 9 of 32, whole: 7.8 µs against 10.0 in two)
        wave = 2 if SMS < row_blocks < TARGET_PROGRAMS else 1
        splits = max(1, min(max(TARGET_PROGRAMS // row_blocks, wave), steps // 2))
    return Tiles(block_n, step, splits, warps=4, stages=3)


def planes_tiles(n: int, k: int, tiling: PlanesTiling) -> Tiles:
    """The planes kernel's tiles of an [n, k] weight (per expert) under `tiling`: K split until the programs
    reach tiling.programs, each split at least two steps."""
    splits = max(1, min(tiling.programs // triton.cdiv(n, tiling.block_n), triton.cdiv(k, tiling.step) // 2))
    return Tiles(tiling.block_n, tiling.step, splits, tiling.warps, tiling.stages, tiling.block_m)


def tiles_of(w: Tensor | Packed) -> Tiles:
    """The tiles the kernel cuts `w` into (benchmarks derive candidate configurations from them)."""
    return _config(_operand(w))


@dataclass(frozen=True)
class SplitSums:
    """A product whose K was split, before its float32 partials [splits, rows, N] are added: a kernel that reads
    it adds them itself, in split order, rounded to `dtype` (the bits `summed` gives), saving a launch."""

    partial: Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        """The product's shape."""
        return self.partial.shape[1:]

    def summed(self, y: Tensor | None = None) -> Tensor:
        """The product [rows, N], into `y` where given."""
        _, rows, n = self.partial.shape
        y = torch.empty(rows, n, dtype=self.dtype, device=self.partial.device) if y is None else y
        sum_splits_triton(self.partial, y)
        return y

    def columns(self, start: int, stop: int) -> SplitSums:
        """Output columns start:stop (one projection of a fused weight's product), a view."""
        return SplitSums(self.partial[..., start:stop], self.dtype)

    def split(self, sizes: Sequence[int], dim: int = -1) -> list[SplitSums]:
        """The last dimension cut into views of `sizes`, as Tensor.split cuts the product."""
        if dim != -1:
            raise ValueError("SplitSums.split: only the last dimension")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [self.columns(start, start + size) for start, size in zip(starts, sizes)]

    def view(self, *shape: int) -> SplitSums:
        """The product regrouped as Tensor.view regroups it (rows into batch and tokens, columns into heads), every
        plane alike."""
        return SplitSums(self.partial.view(self.partial.shape[0], *shape), self.dtype)

    def planes(self) -> tuple[Tensor, int, int]:
        """What a kernel reads it through: the first plane (a view of the product's shape), the elements from one
        plane to the next, and the splits."""
        return self.partial[0], self.partial.stride(0), self.partial.shape[0]


def planes_of(x: Tensor | SplitSums) -> tuple[Tensor, int, int]:
    """What a kernel that reads a product or its partials is given: the product itself (no planes, 0 splits), or
    SplitSums.planes()."""
    return x.planes() if isinstance(x, SplitSums) else (x, 0, 0)


def sum_splits_triton(partial: Tensor, y: Tensor) -> None:
    """y [rows, N] = float32 partials [splits, rows, N] added in split order, rounded once to y's dtype."""
    splits, rows, n = partial.shape
    partial = partial.contiguous()  # a column view (SplitSums.columns) is copied first
    grid = (rows, triton.cdiv(n, 256))
    _sum_splits_kernel[grid](partial, y, rows * n, n, SPLITS=splits, BLOCK=256, **launch_options())


def _launch(
    x: Tensor,
    op: _Operand | _PlanesOperand,
    out_rows: int,
    tiles: int,
    tiling: Tiles,
    routing: int = 0,
    table: Tensor | None = None,
    order: Tensor | None = None,
    top_k: int = 0,
    unsummed: bool = False,
) -> Tensor | SplitSums:
    """y [out_rows, N]: rows of x in tiles of block_m (routing 0); the routed pairs of a tile table
    (routing 1: `table` rows (expert, begin, end) over the expert-sorted `order`); or, for at most block_m
    tokens, the pairs each program finds itself in expert_ids, given as `table` (routing 2, 3). `unsummed`: a
    split K's partials as they are (SplitSums)."""
    f32 = INTERPRETED or x.dtype != torch.bfloat16 or op.f32_weight
    if out_rows == 0 or op.n == 0:
        return torch.empty(out_rows, op.n, dtype=x.dtype, device=x.device)
    step = tiling.step
    per_split = triton.cdiv(triton.cdiv(op.k, step), tiling.splits) * step
    splits = triton.cdiv(op.k, per_split)
    # the product, unless the caller keeps the partials: then a row the kernel never writes (it types y_ptr)
    y = torch.empty(1 if splits > 1 and unsummed else out_rows, op.n, dtype=x.dtype, device=x.device)
    partial = y if splits == 1 else torch.empty(splits, out_rows, op.n, dtype=torch.float32, device=x.device)
    if table is None:  # int32 pointers the kernel never reads
        table = torch.empty(3, dtype=torch.int32, device=x.device)
    if order is None:
        order = table
    tokens = out_rows // top_k if routing >= 2 else x.shape[0]  # routing 3: x has a row per pair
    grid = (tiles, triton.cdiv(op.n, tiling.block_n), splits)
    if isinstance(op, _PlanesOperand):
        desc = op.planes
        _planes_kernel[grid](
            x,
            y,
            partial,
            *op.parts,
            table,
            order,
            out_rows,
            op.n,
            op.k,
            x.stride(0),
            per_split // step,
            splits,
            routing,
            top_k,
            tokens,
            *op.expert_strides,
            *op.row_strides,
            GROUP=desc.group,
            LOW_BITS=desc.low_bits,
            LOW_FIELDS=desc.code_bits // desc.low_bits,
            HIGH_BITS=desc.high_bits,
            HIGH_FIELDS=desc.high_element_bits // desc.high_bits if desc.high_bits else 1,
            OFFSET=desc.code_offset,
            SCALES=PLANE_SCALES.index(desc.scales),
            ASM_LOW=_field_asm(desc, "codes"),
            ASM_HIGH=_field_asm(desc, "high"),
            STEP=step,
            EVEN_K=op.k % step == 0,
            F32=f32,
            WDT=tl.float32 if INTERPRETED else tl.bfloat16,
            BLOCK_M=tiling.block_m,
            BLOCK_N=tiling.block_n,
            ROW_GROUPS=tiling.warps,
            TOPK=WINDOW_TOP_K,
            num_warps=tiling.warps,
            num_stages=tiling.stages,
            **launch_options(),
        )
    else:
        _matmul_kernel[grid](
            x,
            y,
            partial,
            *op.parts,
            table,
            order,
            out_rows,
            op.n,
            op.k,
            x.stride(0),
            per_split // step,
            splits,
            routing,
            top_k,
            tokens,
            *op.expert_strides,
            *op.row_strides,
            *op.cols,
            LAYOUT=op.layout.code,
            GROUP=op.layout.group,
            STEP=step,
            F16_HALVES=op.f16_halves and not f32,
            F32=f32,
            WDT=tl.float32 if INTERPRETED else tl.bfloat16,
            BLOCK_M=tiling.block_m,
            BLOCK_N=tiling.block_n,
            TOPK=WINDOW_TOP_K,
            BIAS_PARTS=BF16_PARTS[op.parts[2].dtype] if op.layout.group else 1,  # affine's biases
            num_warps=tiling.warps,
            num_stages=tiling.stages,
            **launch_options(),
        )
    if splits == 1:
        return y
    sums = SplitSums(partial, y.dtype)
    return sums if unsummed else sums.summed(y)


PLANE_SCALES = ("f16", "int8", "kquant")  # the planes kernel's SCALES codes, for gguf_planes.Planes.scales


def _bf16_pair(value: float) -> int:
    bits = int(torch.tensor(value, dtype=torch.bfloat16).view(torch.int16)) & 0xFFFF
    return bits | bits << 16


def _field_asm(desc: gguf_planes.Planes, role: str) -> tuple[str, ...]:
    """PTX of `_low_values` (role "codes") or `_high_values` ("high") for each field of a plane's elements,
    on two 16-bit or four 8-bit elements a register: field f as bf16 (128 + f)·scale + offset, bf16 lanes
    of 128 + f made under bf16 128's bits. Empty strings under the interpreter, and for 8-bit codes (Triton's
    own conversion)."""
    bits, element_bits = (
        (desc.low_bits, desc.code_bits) if role == "codes" else (desc.high_bits, desc.high_element_bits)
    )
    if INTERPRETED or not bits or bits == element_bits:
        return ("",) * max(1, element_bits // max(bits, 1))
    scale, offset = (1.0, -128.0 - desc.code_offset) if role == "codes" else (16.0, -2048.0)
    mask = (1 << bits) - 1
    out = []
    for field in range(element_bits // bits):
        shift = [f"shr.u32 t, $2, {bits * field};" if field else "mov.b32 t, $2;"]
        if element_bits == 16:  # two elements: each one bf16 lane already
            body = [*shift, f"and.b32 t, t, {mask * 0x00010001:#010x};", "or.b32 t, t, 0x43004300;"]
            body += ["fma.rn.bf16x2 $0, t, k, c;"]
            body = [line.replace("$2", "$1") for line in body]
        else:  # four bytes: spread into two registers of bf16 lanes
            body = [*shift, f"and.b32 t, t, {mask * 0x01010101:#010x};"]
            body += ["prmt.b32 $0, t, 0x43434343, 0x5140;", "prmt.b32 $1, t, 0x43434343, 0x7362;"]
            body += ["fma.rn.bf16x2 $0, $0, k, c;", "fma.rn.bf16x2 $1, $1, k, c;"]
        constants = [f"mov.b32 k, {_bf16_pair(scale):#010x};", f"mov.b32 c, {_bf16_pair(offset):#010x};"]
        out.append("{ .reg .b32 t, k, c; " + " ".join(constants + body) + " }")
    return tuple(out)


def _activations(x: Tensor) -> Tensor:
    """x contiguous and 16-byte aligned: the kernel is compiled for aligned activations, so a call never
    runs another binary (a misaligned view is copied)."""
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()


def matmul_triton(
    x: Tensor, w: Tensor | Packed, tiles: Tiles | None = None, unsummed: bool = False
) -> Tensor | SplitSums:
    """`tiles` overrides the weight's configuration (benchmarks compare candidates with it)."""
    require_triton("matmul")
    op = _operand(w)
    if isinstance(w, Packed):
        x = w.inputs(x)
    if len(w.shape) != 2 or x.shape[-1] != op.k:
        raise ValueError(f"matmul: x {list(x.shape)} and weight {list(w.shape)} do not fit")
    x = _activations(x)
    tiling = tiles or _config(op)
    return _launch(x, op, x.shape[0], triton.cdiv(x.shape[0], tiling.block_m), tiling, unsummed=unsummed)


def matmul_experts_triton(
    x: Tensor,
    w: Tensor | Packed,
    expert_ids: Tensor,
    tiles: Tiles | None = None,
    window: bool | None = None,
    per_pair: bool = False,
    unsummed: bool = False,
    tables: TileTables | None = None,
) -> Tensor | SplitSums:
    """Each touched expert is read once per tile of its tokens. Up to a tile's tokens (decode, a verify
    block) one program per (token, slot) pair finds the other tokens routed to its expert in expert_ids and
    computes them all if it is the first of them, so no sorting runs before the matmul (`per_pair`: it reads
    each pair's own row of x: routing 3). Longer calls sort the pairs by expert on the device and cut them into
    tiles of one expert's rows (tile_table_triton). Either way a pair's bits are the same. `window` forces one
    way or the other (tests compare them)."""
    require_triton("matmul_experts")
    op = _operand(w)
    if isinstance(w, Packed):
        x = w.inputs(x)
    x_rows = expert_ids.numel() if per_pair else expert_ids.shape[0]
    if op.experts is None or x.shape[-1] != op.k or x.shape[0] != x_rows:
        raise ValueError(
            f"matmul_experts: x {list(x.shape)}, weight {list(w.shape)}, expert_ids {list(expert_ids.shape)} do not fit"
        )
    tokens, top_k = expert_ids.shape
    pairs = tokens * top_k
    x = _activations(x)
    tiling = tiles or _config(op)
    rows = tiling.block_m
    if window is None:
        window = tokens <= rows and top_k <= WINDOW_TOP_K
    if window:
        ids = expert_ids.to(torch.int32).contiguous()
        y = _launch(
            x, op, pairs, pairs, tiling, routing=3 if per_pair else 2, table=ids, top_k=top_k, unsummed=unsummed
        )
        return y if isinstance(y, SplitSums) else y.reshape(tokens, top_k, op.n)
    if tables is not None and tables.expert_ids is not expert_ids:
        raise ValueError("matmul_experts: tile tables of other expert_ids")
    table, order = (tables or TileTables(expert_ids))(op.experts, rows)
    # a sorted pair's row of x: its token's (pair // top_k), or its own
    y = _launch(
        x,
        op,
        pairs,
        table.shape[0],
        tiling,
        routing=1,
        table=table,
        order=order,
        top_k=1 if per_pair else top_k,
        unsummed=unsummed,
    )
    return y if isinstance(y, SplitSums) else y.reshape(tokens, top_k, op.n)


TILE_TABLE_PAIRS = 64  # pairs per program of the tile table's kernel, and per step of its loop over all pairs
TILE_TABLE_MAX_PAIRS = 2048  # past this many pairs (T·k: a prefill) the table comes from a sort of torch launches


def tile_table(expert_ids: Tensor, experts: int, rows: int) -> tuple[Tensor, Tensor]:
    """The routed pairs of expert_ids [T, k] sorted by expert and cut into tiles of at most `rows` pairs of one
    expert, from each expert's first: (table [tiles, 3] int32 rows (expert, begin, end) over `order`, the rows no
    tile takes empty (begin = end); order [T·k] int32, the pairs' flat indices sorted stably by expert). The same
    tiles either way (a row's place in the table is the only difference), so the same bits; no host
    synchronisation, fit for CUDA graphs. Ids must lie in [0, experts)."""
    if expert_ids.numel() <= TILE_TABLE_MAX_PAIRS:
        return tile_table_triton(expert_ids, experts, rows)
    return _sorted_tile_table(expert_ids, experts, rows)


def tile_table_triton(expert_ids: Tensor, experts: int, rows: int) -> tuple[Tensor, Tensor]:
    """tile_table in two launches (a fill, then one kernel) instead of some twenty. Each pair counts the pairs
    before it in the order (of a lower expert, earlier of its own), so the table needs no scan: tile m of expert
    e, whose pairs begin at place p_e, takes row p_e // rows + e + m, a different row for every tile (the next
    expert's first row is past this one's last), of T·k // rows + E. A pair compares itself with every pair:
    T·k² comparisons over T·k / TILE_TABLE_PAIRS programs, cheap up to a few thousand pairs."""
    flat = expert_ids.reshape(-1).to(torch.int32).contiguous()
    pairs = flat.numel()
    order = torch.empty(pairs, dtype=torch.int32, device=flat.device)
    table = torch.zeros(pairs // rows + experts, 3, dtype=torch.int32, device=flat.device)
    if pairs:
        _tile_table_kernel[(triton.cdiv(pairs, TILE_TABLE_PAIRS),)](
            flat, order, table, pairs, rows, BLOCK=TILE_TABLE_PAIRS, **launch_options()
        )
    return table, order


def _sorted_tile_table(expert_ids: Tensor, experts: int, rows: int) -> tuple[Tensor, Tensor]:
    """tile_table through torch: a stable argsort, the experts' counts, and each tile's expert found by a search
    over their tiles' ends (a table of cdiv(T·k, rows) + min(E, T·k) rows, the tiles first)."""
    flat = expert_ids.reshape(-1).long()
    pairs = flat.numel()
    order = torch.argsort(flat, stable=True).to(torch.int32)
    # scatter_add, not bincount: bincount sizes its output from the data, a host synchronisation on CUDA
    counts = torch.zeros(experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    first_pair = torch.cumsum(counts, 0) - counts
    tiles_per_expert = (counts + rows - 1) // rows
    tiles_end = torch.cumsum(tiles_per_expert, 0)
    tile = torch.arange(triton.cdiv(pairs, rows) + min(experts, pairs), device=flat.device)
    expert = torch.searchsorted(tiles_end, tile, right=True).clamp_max(experts - 1)
    begin = first_pair[expert] + (tile - (tiles_end[expert] - tiles_per_expert[expert])) * rows
    end = torch.minimum(begin + rows, first_pair[expert] + counts[expert])
    end = torch.where(tile < tiles_end[-1], end, begin)  # tiles past the last one are empty
    return torch.stack([expert, begin, end], 1).to(torch.int32).contiguous(), order


if triton is not None:
    # bit patterns of 2^k as float constants for exact power-of-two scalings
    _ASM = tl.constexpr(not INTERPRETED)
    _PREFETCH_STEPS = tl.constexpr(4)  # PDL mode 2: K steps of each row a program asks L2 for before it waits
    _TWO_118 = tl.constexpr(2.0**118)  # E2M1 bits in bf16 places read as value·2^-126; the block scale brings 2^118

    @device_function
    def _halves(v, WDT: tl.constexpr):
        """32-bit words -> the bf16 values in their low and high 16 bits, in WDT: bf16, or float32 under the
        interpreter, whose bf16 arithmetic is wrong and whose bf16 -> float32 cast flushes subnormals (so
        there the bits move to the top of a float32 instead). Every operation on them here is exact."""
        if WDT == tl.float32:
            low = ((v & 0xFFFF) << 16).to(tl.float32, bitcast=True)
            high = (v & 0xFFFF0000).to(tl.float32, bitcast=True)
        else:
            low = (v & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
            high = (v >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return low, high

    @device_function
    def _x_cols(x_ptr, x_rows, valid, stride_xm, k0, K, G: tl.constexpr):
        """x [BLOCK_M, G]: columns k0.. of the tile's rows, zeros past K and for rows not in the tile."""
        cols = k0 + tl.arange(0, G)
        return tl.load(
            x_ptr + x_rows[:, None] * stride_xm + cols[None, :], mask=valid[:, None] & (cols < K)[None, :], other=0.0
        )

    # Where the tensor core wants a weight tile's values: a thread (lane q = 0..3 of its quad) holds, per row,
    # the k pairs 16c + 8h + 2q + {0, 1}. The decode gives each thread the pairs of its own words (a thread's
    # words are consecutive, so they load as one vector); `_tile_*` name those pairs' k, `_x_*` put x in the
    # same order. Word layout [rows, q, u]: word q·U + u of the group. The decode's last arithmetic (a scale,
    # an offset) runs on the joined pairs, so each bf16x2 register stays one pair of one word.

    @device_function
    def _w4(v0, v1, v2, v3, WDT: tl.constexpr):
        """bf16 bit pairs v_p (p = 2·ph + h) of 4-bit words, [BLOCK_N, 4, U] each (lanes: values p and p + 4)
        -> values [BLOCK_N, 4, U, h, ph, lane]."""
        a0, b0 = _halves(v0, WDT)
        a1, b1 = _halves(v1, WDT)
        a2, b2 = _halves(v2, WDT)
        a3, b3 = _halves(v3, WDT)
        return tl.join(tl.join(tl.join(a0, a1), tl.join(a2, a3)), tl.join(tl.join(b0, b1), tl.join(b2, b3)))

    @device_function
    def _tile_w4(v, BLOCK_N: tl.constexpr, G: tl.constexpr):
        """`_w4` values -> the tile [BLOCK_N, G] at k = 32u + 16ph + 8h + 2q + lane."""
        return tl.permute(v, (0, 2, 4, 3, 1, 5)).reshape(BLOCK_N, G)

    @device_function
    def _x_w4(xs, BLOCK_M: tl.constexpr, G: tl.constexpr):
        """x [BLOCK_M, G] in stored order -> [G, BLOCK_M] in `_tile_w4`'s order: stored s = 8(q·U + u) +
        4·lane + 2·ph + h."""
        U: tl.constexpr = G // 32
        return tl.permute(xs.reshape(BLOCK_M, 4, U, 2, 2, 2), (2, 4, 5, 1, 3, 0)).reshape(G, BLOCK_M)

    @device_function
    def _w8(v0, v1, WDT: tl.constexpr):
        """bf16 bit pairs v_h of byte words, [BLOCK_N, 4, U] each (lanes: bytes h and h + 2) -> values
        [BLOCK_N, 4, U, h, lane]."""
        a0, b0 = _halves(v0, WDT)
        a1, b1 = _halves(v1, WDT)
        return tl.join(tl.join(a0, a1), tl.join(b0, b1))

    @device_function
    def _tile_w8(v, BLOCK_N: tl.constexpr, G: tl.constexpr):
        """`_w8` values -> the tile [BLOCK_N, G] at k = 16u + 8h + 2q + lane."""
        return tl.permute(v, (0, 2, 3, 1, 4)).reshape(BLOCK_N, G)

    @device_function
    def _x_w8(xs, BLOCK_M: tl.constexpr, G: tl.constexpr):
        """x [BLOCK_M, G] in stored order -> [G, BLOCK_M] in `_tile_w8`'s order: stored s = 4(q·U + u) +
        2·lane + h."""
        U: tl.constexpr = G // 16
        return tl.permute(xs.reshape(BLOCK_M, 4, U, 2, 2), (2, 4, 1, 3, 0)).reshape(G, BLOCK_M)

    @device_function
    def _load_words(ptr, rows_ptr, n_in, first, count, G: tl.constexpr):
        """Words first.. (G of them) of each row (`rows_ptr` [BLOCK_N] points at a row's word 0), zero past
        `count` words; as uint32."""
        i = first + tl.arange(0, G)
        words = tl.load(rows_ptr[:, None] + i[None, :], mask=n_in[:, None] & (i < count)[None, :], other=0)
        return words.to(tl.uint32, bitcast=True)

    @device_function
    def _words_at(word_ptr, offset, n_in, n_words, G: tl.constexpr):
        """G words of the bytes at each row's byte `offset` [BLOCK_N] (even, not always a multiple of 4):
        the aligned words below and above, funnel-shifted by 16 bits where the offset is 2 mod 4."""
        base = offset >> 2
        i = base[:, None] + tl.arange(0, G)[None, :]
        low = tl.load(word_ptr + i, mask=n_in[:, None] & (i < n_words), other=0).to(tl.uint32, bitcast=True)
        high = tl.load(word_ptr + i + 1, mask=n_in[:, None] & (i + 1 < n_words), other=0).to(tl.uint32, bitcast=True)
        return tl.where((offset & 2)[:, None] == 0, low, (low >> 16) | (high << 16))

    @device_function
    def _word_at(word_ptr, offset, n_in, n_words):
        """The 16 bits at each row's even byte `offset`, in the low half of a uint32."""
        word = tl.load(word_ptr + (offset >> 2), mask=n_in & ((offset >> 2) < n_words), other=0)
        return (word.to(tl.uint32, bitcast=True) >> ((offset & 2) * 8).to(tl.uint32)) & 0xFFFF

    @device_function
    def _f16(bits):
        """uint32 with an f16 in its low 16 bits -> float32."""
        return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)

    # bf16 pairs as 32-bit words: the constants below, and packed arithmetic on them. On the GPU one PTX
    # instruction a pair (ptxas pairs scalar bf16 arithmetic badly and shuffles the halves back); under the
    # interpreter, the same arithmetic on the two lanes in float32 (every result here is exact in bf16).
    _ONES = tl.constexpr(0x3F803F80)  # 1.0, 1.0
    _MINUS_ONES = tl.constexpr(0xBF80BF80)
    _TWO_120_PAIR = tl.constexpr(0x7B807B80)  # 2^120: E4M3 bits in bf16 places read as value·2^-120
    _MINUS_128 = tl.constexpr(0xC300C300)
    _PLUS_128 = tl.constexpr(0x43004300)
    _MINUS_160 = tl.constexpr(0xC320C320)

    @device_function
    def _lanes(v):
        return ((v & 0xFFFF) << 16).to(tl.float32, bitcast=True), (v & 0xFFFF0000).to(tl.float32, bitcast=True)

    @device_function
    def _fma2(a, b, c):
        """a·b + c on bf16 pairs."""
        if _ASM:
            return tl.inline_asm_elementwise(
                "fma.rn.bf16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.uint32, is_pure=True, pack=1
            )
        else:
            a0, a1 = _lanes(a)
            b0, b1 = _lanes(b)
            c0, c1 = _lanes(c)
            low = (a0 * b0 + c0).to(tl.uint32, bitcast=True) >> 16
            return low | ((a1 * b1 + c1).to(tl.uint32, bitcast=True) & 0xFFFF0000)

    @device_function
    def _fma2_const(a, B: tl.constexpr, C: tl.constexpr):
        return _fma2(a, tl.full(a.shape, B, tl.uint32), tl.full(a.shape, C, tl.uint32))

    @device_function
    def _fp8_tile(w, WDT: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr):
        """E4M3 bytes of words: sign and the 7 other bits moved to their bf16 places read as value·2^-120
        (subnormals included), times 2^120."""
        v0 = _fma2_const(((w << 4) & 0x07F007F0) | ((w << 8) & 0x80008000), _TWO_120_PAIR, 0)
        v1 = _fma2_const(((w >> 4) & 0x07F007F0) | (w & 0x80008000), _TWO_120_PAIR, 0)
        return _tile_w8(_w8(v0, v1, WDT), BLOCK_N, G)

    @device_function
    def _signed_bytes(t):
        """Signed bytes 0 and 2 of t: 128 + (b & 127) from the bits of bf16 128, less 128 or 256 by the sign."""
        minus_ones = tl.full(t.shape, _MINUS_ONES, tl.uint32)
        return _fma2((t & 0x00800080) | 0x43004300, minus_ones, (t & 0x007F007F) | 0x43004300)

    @device_function
    def _byte_tile(w, SIGNED: tl.constexpr, WDT: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr):
        """Bytes of words as integers; unsigned bytes as the signed bytes of b ^ 0x80 (value − 128), plus 128."""
        if SIGNED:
            v0 = _signed_bytes(w)
            v1 = _signed_bytes(w >> 8)
        else:
            v0 = _fma2_const(_signed_bytes(w ^ 0x00800080), _ONES, _PLUS_128)
            v1 = _fma2_const(_signed_bytes((w >> 8) ^ 0x00800080), _ONES, _PLUS_128)
        return _tile_w8(_w8(v0, v1, WDT), BLOCK_N, G)

    @device_function
    def _code_pair(codes, OFFSET: tl.constexpr):
        """Unsigned codes below 128 in the two 16-bit lanes: 128 + q from the bits of bf16 128, plus OFFSET
        (−128, or −160 for Q6_K's q − 32)."""
        return _fma2_const(codes | 0x43004300, _ONES, OFFSET)

    @device_function
    def _nibble_tile(w, WDT: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr):
        """Unsigned 4-bit codes of words (8 a word, LSB first)."""
        v = _w4(
            _code_pair(w & 0x000F000F, _MINUS_128),
            _code_pair((w >> 4) & 0x000F000F, _MINUS_128),
            _code_pair((w >> 8) & 0x000F000F, _MINUS_128),
            _code_pair((w >> 12) & 0x000F000F, _MINUS_128),
            WDT,
        )
        return _tile_w4(v, BLOCK_N, G)

    @device_function
    def _e2m1_tile(w, scale, WDT: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr):
        """E2M1 codes of words (8 a word, LSB first): magnitude bits and sign moved to their bf16 places read
        as value·2^-126 (0.5 is a subnormal), times the block scale·2^118 (bf16 [BLOCK_N, 4, U])."""
        bits = scale.to(tl.uint16, bitcast=True).to(tl.uint32)
        s2 = bits | (bits << 16)
        zero = tl.full(w.shape, 0, tl.uint32)
        v = _w4(
            _fma2(((w << 6) & 0x01C001C0) | ((w << 12) & 0x80008000), s2, zero),
            _fma2(((w << 2) & 0x01C001C0) | ((w << 8) & 0x80008000), s2, zero),
            _fma2(((w >> 2) & 0x01C001C0) | ((w << 4) & 0x80008000), s2, zero),
            _fma2(((w >> 6) & 0x01C001C0) | (w & 0x80008000), s2, zero),
            WDT,
        )
        return _tile_w4(v, BLOCK_N, G)

    @device_function
    def _add_broadcast_dot(acc, b, xt, PARTS: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, F32: tl.constexpr):
        """acc + b·Σ_k xt[k] (b float32 [BLOCK_N], one value a weight row) as tensor-core dots of b broadcast
        along the group, in PARTS exact bf16 parts: the products b·x are exact, as in the dequantized weight's
        product, and no separate sum of x is needed."""
        rest = b
        for _ in tl.static_range(PARTS):
            part = rest.to(tl.bfloat16)
            acc += dot(tl.broadcast_to(part[:, None], (BLOCK_N, G)), xt, F32)
            rest = rest - part.to(tl.float32)
        return acc

    @device_function
    def _kq_scales(h1, h2, h3, J: tl.constexpr):
        """Q4_K / Q5_K sub-block J's 6-bit scale and min from the 12 scale bytes (words h1, h2, h3)."""
        if J < 4:
            sc = (h1 >> (8 * J)) & 63
            m = (h2 >> (8 * J)) & 63
        else:
            sc = ((h3 >> (8 * (J - 4))) & 15) | (((h1 >> (8 * (J - 4) + 6)) & 3) << 4)
            m = ((h3 >> (8 * (J - 4) + 4)) & 15) | (((h2 >> (8 * (J - 4) + 6)) & 3) << 4)
        return sc.to(tl.float32), m.to(tl.float32)

    @device_function
    def _split4(t):
        """[R, 4] -> its four columns."""
        even, odd = tl.split(t.reshape(t.shape[0], 2, 2))
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
        return c0, c1, c2, c3

    @device_function
    def _tile_rows(table_ptr, order_ptr, out_rows, routing, top_k, tokens, BLOCK_M: tl.constexpr, TOPK: tl.constexpr):
        """(expert, rows of x, rows of y, which of the BLOCK_M slots hold a row) of this program's tile: rows of
        x (routing 0), or (token, slot) pairs of one expert (1: the sorted tile table; 2: found in expert_ids, x a
        row per token; 3: likewise, x a row per pair)."""
        tile = tl.program_id(0)
        slot = tl.arange(0, BLOCK_M)
        x_rows = tile * BLOCK_M + slot
        y_rows = x_rows
        valid = x_rows < out_rows
        expert = tile * 0
        if routing == 1:  # (expert, begin, end) of the expert-sorted pairs
            expert = tl.load(table_ptr + tile * 3)
            begin = tl.load(table_ptr + tile * 3 + 1)
            end = tl.load(table_ptr + tile * 3 + 2)
            index = begin + slot
            valid = index < end
            pair = tl.load(order_ptr + index, mask=valid, other=0)
            x_rows = pair // top_k
            y_rows = pair
        if routing >= 2:  # pair `tile` of expert_ids [tokens <= BLOCK_M, top_k] (in table_ptr)
            # its expert straight from memory, so the weight's address waits on one load, not on the reductions
            expert = tl.load(table_ptr + tile)
            token = tile // top_k
            ss = tl.arange(0, TOPK)
            # a token may name an expert twice: its n-th naming goes with the others' n-th, so a tile never
            # holds a token twice
            before = tl.load(table_ptr + token * top_k + ss, mask=ss < tile % top_k, other=-1)
            nth = tl.sum((before == expert).to(tl.int32))
            ids = tl.load(
                table_ptr + slot[:, None] * top_k + ss[None, :],
                mask=(slot < tokens)[:, None] & (ss < top_k)[None, :],
                other=-1,
            )
            named = ids == expert
            match = named & (tl.cumsum(named.to(tl.int32), axis=1) == nth + 1)
            choice = tl.max(tl.where(match, ss[None, :], -1), axis=1)  # [BLOCK_M]: the token's matching slot
            # the first token to match computes the tile: no earlier token does (this one's match is this pair)
            leader = tl.sum(((slot < token) & (choice >= 0)).to(tl.int32)) == 0
            valid = tl.where(leader, choice, -1) >= 0
            y_rows = slot * top_k + tl.maximum(choice, 0)
            x_rows = y_rows if routing == 3 else slot
        return expert.to(tl.int64), x_rows.to(tl.int64), y_rows.to(tl.int64), valid

    @device_function
    def _prefetch_part0(p0, r0, N, K, split_steps, LAYOUT: tl.constexpr, STEP: tl.constexpr, BLOCK_N: tl.constexpr):
        """`_prefetch_rows` of a layout's part 0 (codes, or the dense weight): values per element 1 dense, 4 FP8
        and affine-8, 8 NVFP4 and affine-4; Q4_K and Q5_K: 36 and 44 words per 256."""
        NUM: tl.constexpr = 36 if LAYOUT == 7 else (44 if LAYOUT == 8 else 1)
        DEN: tl.constexpr = 1 if LAYOUT == 0 else (8 if LAYOUT == 3 or LAYOUT == 4 else (256 if LAYOUT >= 7 else 4))
        _prefetch_rows(p0, r0, N, K, split_steps, NUM, DEN, STEP, BLOCK_N)

    @device_function
    def _prefetch_rows(
        p, r, N, K, split_steps, NUM: tl.constexpr, DEN: tl.constexpr, STEP: tl.constexpr, BLOCK_N: tl.constexpr
    ):
        """Ask L2 for the start of this program's stretch of each of its rows of a weight's array `p` (rows `r`
        elements apart, NUM elements per DEN values): the first _PREFETCH_STEPS steps of its split's K values
        (what its pipeline loads first; all of a wide weight's programs asking for whole rows would pass L2's
        size: an LM head's first wave alone is 67 MB)."""
        ELEMENT_BYTES: tl.constexpr = p.dtype.element_ty.primitive_bitwidth // 8
        n = tl.minimum(tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
        k_lo = tl.program_id(2).to(tl.int64) * split_steps * STEP
        k_hi = tl.minimum(K, k_lo + tl.minimum(split_steps, _PREFETCH_STEPS) * STEP)
        first = p + n * r + k_lo * NUM // DEN
        nbytes = (k_hi - k_lo) * NUM // DEN * ELEMENT_BYTES + n * 0
        prefetch_to_l2(first, nbytes)

    @device_function
    def _store_tile(acc, y_ptr, partial_ptr, n64, n_in, y_rows, valid, out_rows, N, splits):
        """acc [..., BLOCK_M] (weight rows n64 [..., 1], in n_in; y rows y_rows [..., BLOCK_M], in valid) into
        y, rounded once, or as this split's float32 partials [splits, out_rows, N], which _sum_splits_kernel
        sums in order."""
        mask = n_in & valid
        if splits > 1:
            split_rows = tl.program_id(2).to(tl.int64) * out_rows + y_rows
            tl.store(partial_ptr + split_rows * N + n64, acc, mask=mask)
        else:
            tl.store(y_ptr + y_rows * N + n64, rounded(acc, y_ptr.dtype.element_ty), mask=mask)

    # Routed or not, final store or float32 partials: runtime branches on unspecialised scalars, so a weight's
    # calls all run one binary, whatever the call (the routing table's alignment is not specialised on either).
    @triton.jit(
        do_not_specialize=["out_rows", "split_steps", "splits", "routing", "top_k", "tokens"],
        do_not_specialize_on_alignment=["table_ptr", "order_ptr"],
    )
    def _matmul_kernel(
        x_ptr,
        y_ptr,
        partial_ptr,
        p0,
        p1,
        p2,
        table_ptr,
        order_ptr,
        out_rows,
        N,
        K,
        stride_xm,
        split_steps,
        splits,
        routing,
        top_k,
        tokens,
        e0,
        e1,
        e2,
        r0,
        r1,
        r2,
        cols0,
        cols1,
        LAYOUT: tl.constexpr,
        GROUP: tl.constexpr,
        STEP: tl.constexpr,
        F16_HALVES: tl.constexpr,
        F32: tl.constexpr,
        WDT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        TOPK: tl.constexpr,
        BIAS_PARTS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        if PDL == 2 and LAYOUT != 6 and LAYOUT != 9:  # not "realigned": part 0's rows start at whole elements
            if routing == 0:  # a routed call's experts come from the previous kernel
                _prefetch_part0(p0, r0, N, K, split_steps, LAYOUT, STEP, BLOCK_N)
        after_previous_kernel(PDL)
        expert, x_rows, y_rows, valid = _tile_rows(
            table_ptr, order_ptr, out_rows, routing, top_k, tokens, BLOCK_M, TOPK
        )
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_in = n < N
        n64 = n.to(tl.int64)
        w0 = p0 + expert * e0 + n64 * r0  # each weight row's first element (word) of part 0
        k_lo = tl.program_id(2) * split_steps * STEP  # a multiple of STEP, known to the compiler
        k_hi = tl.where(tl.max(valid.to(tl.int32), axis=0) > 0, tl.minimum(K, k_lo + split_steps * STEP), k_lo)
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for k0 in range(k_lo, k_hi, STEP):
            if LAYOUT == 0:  # dense
                cols = k0 + tl.arange(0, STEP)
                w = tl.load(w0[:, None] + cols[None, :], mask=n_in[:, None] & (cols < K)[None, :], other=0.0)
                xt = tl.trans(_x_cols(x_ptr, x_rows, valid, stride_xm, k0, K, STEP))
                if F16_HALVES:
                    high = w.to(tl.float32).to(tl.bfloat16)
                    acc += dot(high, xt, F32) + dot((w.to(tl.float32) - high.to(tl.float32)).to(tl.bfloat16), xt, F32)
                else:
                    acc += dot(w, xt, F32)
            elif LAYOUT == 1 or LAYOUT == 2:  # fp8-tensor, fp8-block: 4 values a word
                words = _load_words(p0, w0, n_in, k0 // 4, cols0, STEP // 4).reshape(BLOCK_N, 4, STEP // 16)
                xs = _x_cols(x_ptr, x_rows, valid, stride_xm, k0, K, STEP)
                part = dot(_fp8_tile(words, WDT, BLOCK_N, STEP), _x_w8(xs, BLOCK_M, STEP), F32)
                if LAYOUT == 2:  # the 128x128 block's scale
                    scale = tl.load(p1 + expert * e1 + (n64 // 128) * r1 + k0 // 128, mask=n_in, other=0.0)
                    part = part * scale.to(tl.float32)[:, None]
                acc += part
            elif LAYOUT == 3:  # nvfp4: 8 E2M1 codes a word, an E4M3 scale per 16 values (2 words)
                U: tl.constexpr = STEP // 32
                words = _load_words(p0, w0, n_in, k0 // 8, cols0, STEP // 8).reshape(BLOCK_N, 4, U)
                g = k0 // 16 + tl.arange(0, STEP // 16)
                scale = tl.load(
                    p1 + expert * e1 + n64[:, None] * r1 + g[None, :],
                    mask=n_in[:, None] & (g < cols1)[None, :],
                    other=0.0,
                )
                scale = (scale.to(tl.float32) * _TWO_118).to(tl.bfloat16)  # exact: E4M3 values are bf16 values
                scale = tl.broadcast_to(scale.reshape(BLOCK_N, 4, U // 2, 1), (BLOCK_N, 4, U // 2, 2))
                scale = scale.reshape(BLOCK_N, 4, U)
                xs = _x_cols(x_ptr, x_rows, valid, stride_xm, k0, K, STEP)
                acc += dot(_e2m1_tile(words, scale, WDT, BLOCK_N, STEP), _x_w4(xs, BLOCK_M, STEP), F32)
            elif LAYOUT == 4 or LAYOUT == 5:  # affine: two groups a step, s·Σx·q + b·Σx each
                g = k0 // GROUP + tl.arange(0, 2)
                g_in = n_in[:, None] & (g < cols1)[None, :]
                s_first, s_second = tl.split(
                    tl.load(p1 + expert * e1 + n64[:, None] * r1 + g[None, :], mask=g_in, other=0.0).to(tl.float32)
                )
                b_first, b_second = tl.split(
                    tl.load(p2 + expert * e2 + n64[:, None] * r2 + g[None, :], mask=g_in, other=0.0).to(tl.float32)
                )
                for j in tl.static_range(2):
                    kj = k0 + j * GROUP
                    xs = _x_cols(x_ptr, x_rows, valid, stride_xm, kj, K, GROUP)
                    if LAYOUT == 4:
                        words = _load_words(p0, w0, n_in, kj // 8, cols0, GROUP // 8).reshape(BLOCK_N, 4, GROUP // 32)
                        xt = _x_w4(xs, BLOCK_M, GROUP)
                        xq = dot(_nibble_tile(words, WDT, BLOCK_N, GROUP), xt, F32)
                    else:
                        words = _load_words(p0, w0, n_in, kj // 4, cols0, GROUP // 4).reshape(BLOCK_N, 4, GROUP // 16)
                        xt = _x_w8(xs, BLOCK_M, GROUP)
                        xq = dot(_byte_tile(words, False, WDT, BLOCK_N, GROUP), xt, F32)
                    if j == 0:
                        acc += xq * s_first[:, None]
                        acc = _add_broadcast_dot(acc, b_first, xt, BIAS_PARTS, BLOCK_N, GROUP, F32)
                    else:
                        acc += xq * s_second[:, None]
                        acc = _add_broadcast_dot(acc, b_second, xt, BIAS_PARTS, BLOCK_N, GROUP, F32)
            elif LAYOUT == 6:  # Q8_0: 34 bytes per 32 values, f16 d then int8 codes
                row = expert * e0 + n64 * r0  # bytes
                for j in tl.static_range(STEP // 32):
                    block = row + (k0 // 32 + j) * 34
                    b_in = n_in & (n * 0 + k0 + 32 * j < K)
                    d = _f16(_word_at(p0, block, b_in, cols0))
                    words = _words_at(p0, block + 2, b_in, cols0, 8).reshape(BLOCK_N, 4, 2)
                    xs = _x_cols(x_ptr, x_rows, valid, stride_xm, k0 + 32 * j, K, 32)
                    acc += dot(_byte_tile(words, True, WDT, BLOCK_N, 32), _x_w8(xs, BLOCK_M, 32), F32) * d[:, None]
            elif LAYOUT == 7 or LAYOUT == 8:  # Q4_K / Q5_K: 8 sub-blocks of 32, d·sc·Σx·q − dmin·Σ m·Σx
                block = (k0 // 256) * (36 if LAYOUT == 7 else 44)  # in words
                h0, h1, h2, h3 = _split4(_load_words(p0, w0, n_in, block, r0, 4))
                d = _f16(h0 & 0xFFFF)
                dmin = _f16(h0 >> 16)
                qh3 = h0  # Q5_K only: the 32 high-bit bytes, laid out as a qs chunk's words
                if LAYOUT == 8:
                    qh3 = _load_words(p0, w0, n_in, block + 4, r0, 8).reshape(BLOCK_N, 4, 2)
                mins = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # Σ_j m_j·Σx of the sub-blocks, times dmin below
                for c in tl.static_range(4):  # 32-byte chunks: low nibbles sub-block 2c, high 2c + 1
                    qs = block + (4 if LAYOUT == 7 else 12) + 8 * c
                    w3 = _load_words(p0, w0, n_in, qs, r0, 8).reshape(BLOCK_N, 4, 2)
                    for par in tl.static_range(2):
                        j = 2 * c + par
                        low = (w3 >> (4 * par)) & 0x000F000F  # bytes 0, 2 of each word
                        high = (w3 >> (4 * par + 8)) & 0x000F000F  # bytes 1, 3
                        if LAYOUT == 8:  # the 5th bit: bit j of the qh byte at the same position
                            low |= ((qh3 >> j) & 0x00010001) << 4
                            high |= ((qh3 >> (j + 8)) & 0x00010001) << 4
                        xs = _x_cols(x_ptr, x_rows, valid, stride_xm, k0 + 32 * j, K, 32)
                        sc, m = _kq_scales(h1, h2, h3, j)
                        w = _tile_w8(_w8(_code_pair(low, _MINUS_128), _code_pair(high, _MINUS_128), WDT), BLOCK_N, 32)
                        xt = _x_w8(xs, BLOCK_M, 32)
                        xq = dot(w, xt, F32)
                        acc += xq * (d * sc)[:, None]
                        mins = _add_broadcast_dot(mins, m, xt, 1, BLOCK_N, 32, F32)
                acc -= mins * dmin[:, None]
            else:  # Q6_K: 16 sub-blocks of 16, d·sc·Σx·(q − 32); q = 4 low bits (ql) | 2 high bits (qh)
                block = expert * e0 + n64 * r0 + (k0 // 256) * 210  # bytes
                d = _f16(_word_at(p0, block + 208, n_in, cols0))
                s0, s1, s2, s3 = _split4(_words_at(p0, block + 192, n_in, cols0, 4))
                for half in tl.static_range(2):  # values 128·half..: ql bytes 64·half.., qh bytes 128 + 32·half..
                    for l0 in tl.static_range(0, 32, 16):
                        qh = _words_at(p0, block + 128 + 32 * half + l0, n_in, cols0, 4).reshape(BLOCK_N, 4, 1)
                        for odd in tl.static_range(2):  # quarters 1, 3 read ql bytes 32.. of the half
                            ql = _words_at(p0, block + 64 * half + 32 * odd + l0, n_in, cols0, 4)
                            ql = ql.reshape(BLOCK_N, 4, 1)
                            for high in tl.static_range(2):  # quarters 2, 3: the high nibbles
                                i = 2 * high + odd
                                sub = 8 * half + 2 * i + l0 // 16
                                v0 = ((ql >> (4 * high)) & 0x000F000F) | (((qh >> (2 * i)) & 0x00030003) << 4)
                                v1 = ((ql >> (4 * high + 8)) & 0x000F000F) | (((qh >> (2 * i + 8)) & 0x00030003) << 4)
                                w = _w8(_code_pair(v0, _MINUS_160), _code_pair(v1, _MINUS_160), WDT)
                                w = _tile_w8(w, BLOCK_N, 16)
                                xs = _x_cols(x_ptr, x_rows, valid, stride_xm, k0 + 128 * half + 32 * i + l0, K, 16)
                                if sub % 16 < 4:
                                    sw = s0
                                elif sub % 16 < 8:
                                    sw = s1
                                elif sub % 16 < 12:
                                    sw = s2
                                else:
                                    sw = s3
                                sc = ((sw >> (8 * (sub % 4))) & 0xFF).to(tl.uint8).to(tl.int8, bitcast=True)
                                acc += dot(w, _x_w8(xs, BLOCK_M, 16), F32) * (d * sc.to(tl.float32))[:, None]
        if LAYOUT == 1:
            acc = acc * tl.load(p1 + expert * e1).to(tl.float32)
        if LAYOUT == 3:  # the 2^-8 the E2M1 decode left in every product
            acc = acc * (tl.load(p2 + expert * e2).to(tl.float32) * 256.0)
        _store_tile(
            acc, y_ptr, partial_ptr, n64[:, None], n_in[:, None], y_rows[None, :], valid[None, :], out_rows, N, splits
        )

    @device_function
    def _low_values(
        codes, ASMS: tl.constexpr, FIELD: tl.constexpr, LOW_BITS: tl.constexpr, OFFSET: tl.constexpr, WDT: tl.constexpr
    ):
        """Group FIELD of a code plane chunk [ROW_GROUPS, ROWS, GROUP] as values in WDT (small integers: exact):
        signed bytes, or the LOW_BITS-bit field less OFFSET. ASMS[FIELD] (the GPU's, `_field_asm`) does two or
        four elements at a time: 128 + field in bf16 lanes from bf16 128's bits, less 128 + OFFSET."""
        if LOW_BITS == 8:
            return codes.to(WDT)
        elif ASMS[FIELD] != "":
            if codes.dtype.primitive_bitwidth == 8:
                return tl.inline_asm_elementwise(
                    ASMS[FIELD], "=r,=r,r", [codes], dtype=tl.bfloat16, is_pure=True, pack=4
                )
            else:
                return tl.inline_asm_elementwise(ASMS[FIELD], "=r,r", [codes], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            return (((codes.to(tl.int32) >> (LOW_BITS * FIELD)) & ((1 << LOW_BITS) - 1)) - OFFSET).to(WDT)

    @device_function
    def _ones_like(codes, ASM: tl.constexpr, WDT: tl.constexpr):
        """Ones in codes' shape, WDT. On the GPU made by asm from the codes (whose bits it ignores), so that
        Triton lays them out as it does the decoded codes and both dots take x in one register layout (a
        constant would get a layout of its own, and x a second conversion through shared memory)."""
        if ASM:
            if codes.dtype.primitive_bitwidth == 8:
                return tl.inline_asm_elementwise(
                    "mov.b32 $0, 0x3F803F80; mov.b32 $1, 0x3F803F80;",
                    "=r,=r,r",
                    [codes],
                    dtype=tl.bfloat16,
                    is_pure=True,
                    pack=4,
                )
            else:
                return tl.inline_asm_elementwise(
                    "mov.b32 $0, 0x3F803F80;", "=r,r", [codes], dtype=tl.bfloat16, is_pure=True, pack=2
                )
        else:
            return tl.full(codes.shape, 1.0, WDT)

    @device_function
    def _high_values(high, ASMS: tl.constexpr, FIELD: tl.constexpr, HIGH_BITS: tl.constexpr, WDT: tl.constexpr):
        """Group FIELD of a high plane row: its bits times 16 (above 4-bit codes), in WDT. A dot of its own: the
        two planes decoded in one expression would be two loaded operands of one elementwise op, which Triton
        does not decode in the tensor cores' register layout (it converts the values through shared memory)."""
        if ASMS[FIELD] != "":
            if high.dtype.primitive_bitwidth == 8:
                return tl.inline_asm_elementwise(
                    ASMS[FIELD], "=r,=r,r", [high], dtype=tl.bfloat16, is_pure=True, pack=4
                )
            else:
                return tl.inline_asm_elementwise(ASMS[FIELD], "=r,r", [high], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            return (((high.to(tl.int32) >> (HIGH_BITS * FIELD)) & ((1 << HIGH_BITS) - 1)) * 16).to(WDT)

    # The scale planes' strides are not specialised (their loads are one value a row, never vectors): one binary
    # for every K of a type, and the code planes' strides, which vectorised loads need, are multiples of 16.
    @triton.jit(
        do_not_specialize=["out_rows", "split_steps", "splits", "routing", "top_k", "tokens", "e2", "e3", "r2", "r3"],
        do_not_specialize_on_alignment=["table_ptr", "order_ptr"],
    )
    def _planes_kernel(
        x_ptr,
        y_ptr,
        partial_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        super_ptr,
        table_ptr,
        order_ptr,
        out_rows,
        N,
        K,
        stride_xm,
        split_steps,
        splits,
        routing,
        top_k,
        tokens,
        e0,
        e1,
        e2,
        e3,
        r0,
        r1,
        r2,
        r3,
        GROUP: tl.constexpr,
        LOW_BITS: tl.constexpr,
        LOW_FIELDS: tl.constexpr,
        HIGH_BITS: tl.constexpr,
        HIGH_FIELDS: tl.constexpr,
        OFFSET: tl.constexpr,
        SCALES: tl.constexpr,
        ASM_LOW: tl.constexpr,
        ASM_HIGH: tl.constexpr,
        STEP: tl.constexpr,
        EVEN_K: tl.constexpr,
        F32: tl.constexpr,
        WDT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        ROW_GROUPS: tl.constexpr,
        TOPK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """GGUF weights as planes (formats/gguf_planes.py). The BLOCK_N rows of a program are ROW_GROUPS groups
        of rows, the batch axis of every dot (Triton lays a batched dot's warps along its batch and runs it on
        the tensor cores' synchronous mma: one warp a row group, no shared-memory staging of the weight). A
        step is STEP values: for each group of GROUP values, in static order, the codes (and high bits) of the
        rows decoded with constant shifts, one dot with x's group (the same for every row group), scaled per
        row into acc, less the min times Σx (a dot with ones) for the affine k-quants."""
        if PDL == 2:  # the code plane, the largest: LOW_FIELDS values an element
            if routing == 0:  # a routed call's experts come from the previous kernel
                _prefetch_rows(codes_ptr, r0, N, K, split_steps, 1, LOW_FIELDS, STEP, BLOCK_N)
        after_previous_kernel(PDL)
        expert, x_rows, y_rows, valid = _tile_rows(
            table_ptr, order_ptr, out_rows, routing, top_k, tokens, BLOCK_M, TOPK
        )
        ROWS: tl.constexpr = BLOCK_N // ROW_GROUPS
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, ROW_GROUPS)[:, None] * ROWS + tl.arange(0, ROWS)[None, :]
        n_in = n < N
        n64 = n.to(tl.int64)
        lane = tl.arange(0, GROUP)
        codes_rows = (codes_ptr + expert * e0 + n64 * r0)[:, :, None] + lane[None, None, :]
        high_rows = (high_ptr + expert * e1 + n64 * r1)[:, :, None] + lane[None, None, :]
        scale_rows = scales_ptr + expert * e2 + n64 * r2
        super_rows = super_ptr + expert * e3 + n64 * r3
        x_cols = x_ptr + x_rows[None, :] * stride_xm + lane[:, None]  # [GROUP, BLOCK_M]
        k_lo = tl.program_id(2) * split_steps * STEP
        k_hi = tl.where(tl.max(valid.to(tl.int32), axis=0) > 0, tl.minimum(K, k_lo + split_steps * STEP), k_lo)
        acc = tl.zeros([ROW_GROUPS, ROWS, BLOCK_M], tl.float32)
        for k0 in range(k_lo, k_hi, STEP):
            for g in tl.static_range(STEP // GROUP):
                k = k0 + g * GROUP
                inside = n_in
                x_in = valid[None, :]
                if not EVEN_K:  # a last step past K (tensor compares: the interpreter masks with no scalar bools)
                    inside = n_in & (n * 0 + k < k_hi)
                    x_in = x_in & (x_rows[None, :] * 0 + k < k_hi)
                if (g * GROUP) % 256 == 0 and SCALES == 1:  # an int8 per group, times the block's f16 d
                    d = tl.load(super_rows + k // 256, mask=inside, other=0.0).to(tl.float32)
                if (g * GROUP) % 256 == 0 and SCALES == 2:  # the block's 16 head bytes as words
                    head = scale_rows + k // 64
                    h0 = tl.load(head, mask=inside, other=0).to(tl.uint32, bitcast=True)
                    h1 = tl.load(head + 1, mask=inside, other=0).to(tl.uint32, bitcast=True)
                    h2 = tl.load(head + 2, mask=inside, other=0).to(tl.uint32, bitcast=True)
                    h3 = tl.load(head + 3, mask=inside, other=0).to(tl.uint32, bitcast=True)
                    d = _f16(h0 & 0xFFFF)
                    dmin = _f16(h0 >> 16)
                if g % LOW_FIELDS == 0:  # the chunk holding groups g.. g + LOW_FIELDS - 1
                    codes = tl.load(codes_rows + (k // (GROUP * LOW_FIELDS)) * GROUP, mask=inside[:, :, None], other=0)
                if HIGH_BITS > 0:
                    if g % HIGH_FIELDS == 0:
                        high = tl.load(
                            high_rows + (k // (GROUP * HIGH_FIELDS)) * GROUP, mask=inside[:, :, None], other=0
                        )
                xs = tl.load(x_cols + k, mask=x_in, other=0.0)
                if F32:
                    xs = xs.to(tl.float32)
                xs = tl.broadcast_to(xs[None, :, :], (ROW_GROUPS, GROUP, BLOCK_M))
                part = dot3(_low_values(codes, ASM_LOW, g % LOW_FIELDS, LOW_BITS, OFFSET, WDT), xs, F32)
                if HIGH_BITS > 0:
                    values = _high_values(high, ASM_HIGH, g % HIGH_FIELDS, HIGH_BITS, WDT)
                    part = dot3_acc(values, xs, part, F32)
                if SCALES == 0:  # an f16 per group
                    scale = tl.load(scale_rows + k // GROUP, mask=inside, other=0.0).to(tl.float32)
                elif SCALES == 1:
                    scale = d * tl.load(scale_rows + k // GROUP, mask=inside, other=0).to(tl.float32)
                else:
                    sc, m = _kq_scales(h1, h2, h3, g % 8)
                    scale = d * sc
                acc += part * scale[:, :, None]
                if SCALES == 2:  # the min: dmin·m times the group's Σx, summed by the tensor core
                    acc -= dot3(_ones_like(codes, ASM_LOW[0] != "", WDT), xs, F32) * (dmin * m)[:, :, None]
        _store_tile(
            acc,
            y_ptr,
            partial_ptr,
            n64[:, :, None],
            n_in[:, :, None],
            y_rows[None, None, :],
            valid[None, None, :],
            out_rows,
            N,
            splits,
        )

    @triton.jit(do_not_specialize=["pairs"])
    def _tile_table_kernel(ids_ptr, order_ptr, table_ptr, pairs, rows, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """BLOCK pairs a program: each one's place in the expert-sorted order (pairs of a lower expert, and earlier
        pairs of its own: a stable sort), and, where it begins a tile, that tile's row (integer counts: exact)."""
        after_previous_kernel(PDL)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = i < pairs
        mine = tl.load(ids_ptr + i, mask=inside, other=0)
        lower = tl.zeros([BLOCK], tl.int32)  # pairs of a lower expert
        earlier = tl.zeros([BLOCK], tl.int32)  # earlier pairs of the same expert
        same = tl.zeros([BLOCK], tl.int32)  # pairs of the same expert
        for start in range(0, pairs, BLOCK):
            j = start + tl.arange(0, BLOCK)
            theirs = tl.load(ids_ptr + j, mask=j < pairs, other=-1)
            real = (j < pairs)[None, :]
            match = (theirs[None, :] == mine[:, None]) & real
            lower += tl.sum(((theirs[None, :] < mine[:, None]) & real).to(tl.int32), axis=1)
            earlier += tl.sum((match & (j[None, :] < i[:, None])).to(tl.int32), axis=1)
            same += tl.sum(match.to(tl.int32), axis=1)
        place = lower + earlier
        tl.store(order_ptr + place, i, mask=inside)
        begins = inside & (earlier % rows == 0)
        row = lower // rows + mine + earlier // rows
        tl.store(table_ptr + row * 3, mine, mask=begins)
        tl.store(table_ptr + row * 3 + 1, place, mask=begins)
        tl.store(table_ptr + row * 3 + 2, tl.minimum(place + rows, lower + same), mask=begins)

    @triton.jit(do_not_specialize=["plane"])
    def _sum_splits_kernel(partial_ptr, y_ptr, plane, N, SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = n < N
        total = split_sum(partial_ptr, plane, SPLITS, row * N + n, inside)  # the same bits every row
        tl.store(y_ptr + row * N + n, rounded(total, y_ptr.dtype.element_ty), mask=inside)
