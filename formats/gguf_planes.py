"""GGUF blocks as planes: the arrangement the GGUF matmul kernels read (runtime/kernels/linear.py), one
descriptor per type.

A GGUF row is a run of blocks, each its fields side by side (Q6_K: 128 bytes of low nibbles, 64 of high bit
pairs, 16 scales, an f16 d), so a field of one block starts wherever the blocks before it end: Q8_0's
34-byte and Q6_K's 210-byte blocks leave most fields 2-byte aligned, and a kernel reading codes, scales and d
from one stream reads a few bytes at a time. Planes are the same bytes rearranged: each field of every block
of a row gathered into its own array (`Plane`), so each plane's rows are whole 16-byte vectors, and within
the code planes the bit fields are put in the kernel's order (below). Nothing is recomputed and nothing is
added: the planes of a tensor take its GGUF bytes exactly, `to_planes` and `from_planes` are inverse
permutations of bits, and the kernel decodes the values gguf-py decodes.

The kernel's order (what `Planes` promises the kernel, whatever the type):
- Values come in groups of `group` (the values one scale covers). The code plane is an array of
  `code_bits`-bit elements, each holding one position of code_bits / low_bits consecutive groups (the low
  `low_bits` bits of each value, lowest group in the lowest bits); a chunk of `group` elements holds those
  groups whole. So the kernel loads a chunk as a [rows, group] tensor of whole elements, with no element
  narrower than 16 bits along a dot of 16 values (Triton decodes 8-bit operands in the tensor cores' register
  layout only for dots of 32 or more), and takes group j of it with a constant shift.
- The high plane (`high_bits` > 0) likewise: elements of `high_element_bits` bits, each one position of
  high_element_bits / high_bits consecutive groups, `group` elements to a row.
- A code is low | high << low_bits, less `code_offset` (Q8_0: signed bytes, 0).
- `scales` says how a group's scale (and, for the affine k-quants, its min) is found: "f16" a plane of one
  f16 per group (Q8_0's d); "int8" a plane of one int8 per group times the super plane's f16 d per block
  (Q6_K); "kquant" a plane of the block's first 16 bytes (d, dmin and twelve bytes of 6-bit scales and mins,
  Q4_K and Q5_K), read as four 32-bit words. A value is scale·code (− min).
Q8_0, Q4_K and Q5_K's codes are in that order in GGUF already (their planes only gather fields); Q6_K's low
nibbles pair values 64 apart and its high bit pairs values 32 apart, so its two code planes are reordered
into 16-bit elements of four (low) and eight (high) groups of 16.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.errors import BadInput

ROW_CHUNK_BYTES = 1 << 24  # bit fields are reordered a slice of rows at a time: bounded temporaries


@dataclass(frozen=True)
class Plane:
    """The bytes [offset, offset + size) of every block of a row, gathered. `element` numbers where each
    `unit_bits`-bit field of the span goes in GGUF (field index -> value index in the block): a code plane
    is reordered into the kernel's order from it; None: the bytes move as they are."""

    role: str  # codes | high | scales | super: what the kernel reads it as
    offset: int
    size: int
    dtype: torch.dtype  # the kernel reads the plane as this (its bytes are GGUF's either way)
    unit_bits: int = 8
    element: Callable[[int], int] | None = None


@dataclass(frozen=True)
class Planes:
    """One GGUF type's descriptor: its block, its planes, and how the kernel decodes them."""

    qtype: str
    values: int  # per block
    block_bytes: int
    planes: tuple[Plane, ...]
    group: int  # values per scale
    low_bits: int  # code bits in the code plane
    code_bits: int  # bits of a code plane element
    high_bits: int  # code bits in the high plane (0: no high plane)
    high_element_bits: int  # bits of a high plane element
    code_offset: int  # subtracted from a code (Q8_0: signed bytes, 0)
    scales: str  # f16 | int8 | kquant

    def plane(self, role: str) -> Plane | None:
        return next((p for p in self.planes if p.role == role), None)

    def kernel_element(self, plane: Plane, unit: int) -> int:
        """Which value of a block the kernel order puts at field `unit` of a code plane (fields numbered
        from an element's lowest bits, elements little-endian)."""
        bits, element_bits = (
            (self.low_bits, self.code_bits) if plane.role == "codes" else (self.high_bits, self.high_element_bits)
        )
        per_element = element_bits // bits
        element, field = divmod(unit, per_element)
        chunk, position = divmod(element, self.group)
        return self.group * (per_element * chunk + field) + position


def _q6_low(unit: int) -> int:
    """Q6_K ql: byte 64h + r holds value 128h + r in its low nibble and 128h + 64 + r in its high one."""
    byte, nibble = divmod(unit, 2)
    half, r = divmod(byte, 64)
    return 128 * half + 64 * nibble + r


def _q6_high(unit: int) -> int:
    """Q6_K qh: byte 32h + l holds the top bit pairs of values 128h + 32i + l at bits 2i."""
    byte, i = divmod(unit, 4)
    half, position = divmod(byte, 32)
    return 128 * half + 32 * i + position


def _q4_low(unit: int) -> int:
    """Q4_K/Q5_K qs: byte 32c + l holds value 64c + l in its low nibble and 64c + 32 + l in its high one."""
    byte, nibble = divmod(unit, 2)
    chunk, position = divmod(byte, 32)
    return 64 * chunk + 32 * nibble + position


def _q5_high(unit: int) -> int:
    """Q5_K qh: bit j of byte l is the fifth bit of value 32j + l."""
    position, bit = divmod(unit, 8)
    return 32 * bit + position


_KQUANT_HEAD = Plane("scales", 0, 16, torch.int32)  # d, dmin, scales[12]
PLANES: dict[str, Planes] = {
    p.qtype: p
    for p in (
        Planes(
            "Q8_0",
            32,
            34,
            (Plane("scales", 0, 2, torch.float16), Plane("codes", 2, 32, torch.int8)),
            group=32,
            low_bits=8,
            code_bits=8,
            high_bits=0,
            high_element_bits=0,
            code_offset=0,
            scales="f16",
        ),
        Planes(
            "Q4_K",
            256,
            144,
            (_KQUANT_HEAD, Plane("codes", 16, 128, torch.uint8, 4, _q4_low)),
            group=32,
            low_bits=4,
            code_bits=8,
            high_bits=0,
            high_element_bits=0,
            code_offset=0,
            scales="kquant",
        ),
        Planes(
            "Q5_K",
            256,
            176,
            (
                _KQUANT_HEAD,
                Plane("high", 16, 32, torch.uint8, 1, _q5_high),
                Plane("codes", 48, 128, torch.uint8, 4, _q4_low),
            ),
            group=32,
            low_bits=4,
            code_bits=8,
            high_bits=1,
            high_element_bits=8,
            code_offset=0,
            scales="kquant",
        ),
        Planes(
            "Q6_K",
            256,
            210,
            (
                Plane("codes", 0, 128, torch.int16, 4, _q6_low),
                Plane("high", 128, 64, torch.int16, 2, _q6_high),
                Plane("scales", 192, 16, torch.int8),
                Plane("super", 208, 2, torch.float16),
            ),
            group=16,
            low_bits=4,
            code_bits=16,
            high_bits=2,
            high_element_bits=16,
            code_offset=32,
            scales="int8",
        ),
    )
}
ROLES = ("codes", "high", "scales", "super")


def of(qtype: str) -> Planes | None:
    return PLANES.get(qtype)


def is_planes(parts: dict[str, Tensor]) -> bool:
    """Whether a GGUF weight's parts are planes (keyed by role) rather than its block bytes (key "")."""
    return "" not in parts and "codes" in parts


@functools.cache
def _order(qtype: str, role: str) -> tuple[int, ...] | None:
    """GGUF field index of each kernel field of a code plane (None where they coincide): kernel field u is
    GGUF field order[u]."""
    desc = PLANES[qtype]
    plane = desc.plane(role)
    if plane.element is None:
        return None
    units = plane.size * 8 // plane.unit_bits
    gguf_unit = {plane.element(u): u for u in range(units)}
    if sorted(gguf_unit) != list(range(units)) or len(gguf_unit) != units:
        raise AssertionError(f"{qtype} {role}: the GGUF field map is not a permutation")  # a wrong table row
    order = tuple(gguf_unit[desc.kernel_element(plane, u)] for u in range(units))
    return None if order == tuple(range(units)) else order


def _fields(span: Tensor, bits: int) -> Tensor:
    """uint8 [..., size] -> its `bits`-bit fields [..., size·8/bits], lowest bits of each byte first."""
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=span.device)
    return ((span[..., None] >> shifts) & ((1 << bits) - 1)).flatten(-2)


def _bytes(fields: Tensor, bits: int) -> Tensor:
    per_byte = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=fields.device)
    grouped = fields.unflatten(-1, (-1, per_byte)) << shifts
    out = grouped[..., 0].clone()
    for i in range(1, per_byte):
        out |= grouped[..., i]
    return out


def _reordered(span: Tensor, bits: int, order: tuple[int, ...], inverse: bool) -> Tensor:
    """span [rows, blocks, size] with its fields permuted (inverse: back), a slice of rows at a time."""
    index = torch.tensor(order, device=span.device)
    if inverse:
        index = torch.argsort(index)
    out = torch.empty_like(span)
    step = max(1, ROW_CHUNK_BYTES // max(1, span[0].numel()))
    for start in range(0, span.shape[0], step):
        out[start : start + step] = _bytes(_fields(span[start : start + step], bits)[..., index], bits)
    return out


def _blocks(data: Tensor, desc: Planes, shape: tuple[int, ...], name: str) -> Tensor:
    rows = math.prod(shape[:-1])
    if shape[-1] % desc.values or data.numel() != rows * shape[-1] // desc.values * desc.block_bytes:
        raise BadInput(
            name,
            f"has {data.numel()} bytes of data; {desc.qtype} {list(shape)} needs "
            f"{rows * (shape[-1] // desc.values) * desc.block_bytes} in rows of whole blocks",
        )
    return data.reshape(-1).view(torch.uint8).reshape(rows, shape[-1] // desc.values, desc.block_bytes)


def to_planes(data: Tensor, qtype: str, shape: tuple[int, ...], name: str = "tensor") -> dict[str, Tensor]:
    """The planes of a GGUF tensor's bytes (any shape holding them), keyed by role; each [*shape[:-1], bytes
    per row] in its plane's dtype, on data's device."""
    desc = PLANES[qtype]
    blocks = _blocks(data, desc, shape, name)
    planes = {}
    for plane in desc.planes:
        span = blocks[..., plane.offset : plane.offset + plane.size]
        order = _order(qtype, plane.role)
        span = _reordered(span, plane.unit_bits, order, inverse=False) if order else span.contiguous()
        planes[plane.role] = span.reshape(*shape[:-1], -1).view(plane.dtype)
    return planes


def from_planes(planes: dict[str, Tensor], qtype: str, shape: tuple[int, ...], name: str = "tensor") -> Tensor:
    """The GGUF bytes [*shape[:-1], bytes per row] (uint8) that `to_planes` took the planes from."""
    desc = PLANES[qtype]
    if set(planes) != {p.role for p in desc.planes}:
        raise BadInput(name, f"{qtype} planes are {', '.join(p.role for p in desc.planes)}; got {', '.join(planes)}")
    rows, blocks = math.prod(shape[:-1]), shape[-1] // desc.values
    first = next(iter(planes.values()))
    out = torch.empty(rows, blocks, desc.block_bytes, dtype=torch.uint8, device=first.device)
    for plane in desc.planes:
        part = planes[plane.role].contiguous().view(torch.uint8)
        if part.numel() != rows * blocks * plane.size:
            raise BadInput(
                name, f"{qtype} plane {plane.role} has {part.numel()} bytes, not {rows * blocks * plane.size}"
            )
        span = part.reshape(rows, blocks, plane.size)
        order = _order(qtype, plane.role)
        out[..., plane.offset : plane.offset + plane.size] = (
            _reordered(span, plane.unit_bits, order, inverse=True) if order else span
        )
    return out.reshape(*shape[:-1], blocks * desc.block_bytes)
