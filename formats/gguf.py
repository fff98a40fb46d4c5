"""GGUF headers (metadata and tensor infos), read sequentially without touching tensor data.

Layout (little-endian): magic "GGUF", version u32, tensor_count u64, kv_count u64, kv pairs
(key string, value type u32, value), tensor infos (name, n_dims u32, dims u64 in ggml order, type u32,
offset u64), padding to `general.alignment`, then data. Every count and length is checked against
the bytes that remain before it is used, so a hostile header cannot make us allocate or loop on
numbers it merely claims; the whole header is bounded by MAX_HEADER_BYTES, so a sparse file of many
GB cannot make us read (and loop over) what its counts claim either.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

from specpair.errors import BadInput
from specpair.formats import TensorInfo, brief

if TYPE_CHECKING:  # `check` reads headers without importing torch
    import torch

    from specpair.formats.regions import PartCut

MAGIC = b"GGUF"
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 2
# Headers with a 256k-token vocabulary and its merges take ~10 MB; parsing runs ~0.5 s per 10 MB.
MAX_HEADER_BYTES = 128 << 20


class ValueType(IntEnum):
    """The GGUF spec's value types, equal to gguf-py's GGUFValueType without importing gguf-py (~0.3 s)."""

    UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)


# GGUF value types: (struct format, size) for scalars; 8 = string, 9 = array.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9
_MIN_VALUE_BYTES = {**{t: size for t, (_, size) in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}


@dataclass
class GGUFHeader:
    """What a GGUF file says about itself; `tensors` shapes are in numpy order ([out, in])."""

    path: str
    version: int
    fields: dict[str, object]
    tensors: list[TensorInfo] = field(default_factory=list)
    size: int | None = None
    data_start: int = 0
    alignment: int = 32
    types: dict[str, tuple[int, ...]] = field(default_factory=dict)  # key -> GGUF value type (+ array element type)

    @property
    def architecture(self) -> str | None:
        arch = self.fields.get("general.architecture")
        return arch if isinstance(arch, str) else None


CHUNK = 1 << 20


class _Cursor:
    """Sequential reader over a stream with a known size; refuses to read past it.

    The header has no length field, so reads are sized by `floor`: an offset the header is known to
    reach (from the counts parsed so far). Reading ahead up to it, and never past it unless a value
    needs the bytes, keeps every read inside the header: tensor data is never read.
    """

    def __init__(self, read: Callable[[int], bytes], size: int, where: str) -> None:
        self._read, self.size, self.where = read, size, where
        self.limit = min(size, MAX_HEADER_BYTES)  # no header byte lies past this
        self._buf = b""
        self._buf_pos = 0
        self.pos = 0
        self.floor = 0
        self.last_element_type = 0  # of the array value read last

    def remaining(self) -> int:
        return self.limit - self.pos

    def reach(self, min_bytes: int) -> None:
        """The header holds at least `min_bytes` more bytes from here."""
        self.floor = max(self.floor, min(self.pos + min_bytes, self.limit))

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            if self.pos + n <= self.size:
                raise BadInput(
                    self.where, f"GGUF header runs past {MAX_HEADER_BYTES} bytes (needs {n} bytes at offset {self.pos})"
                )
            raise BadInput(
                self.where, f"truncated GGUF header (needs {n} bytes at offset {self.pos}, file has {self.size})"
            )
        end = self._buf_pos + n
        if end > len(self._buf):
            rest = self._buf[self._buf_pos :]
            buffered_to = self.pos + len(rest)
            more = self._read(max(n - len(rest), min(CHUNK, self.floor - buffered_to)))
            self._buf, self._buf_pos, end = rest + more, 0, n
            if n > len(self._buf):
                raise BadInput(self.where, f"truncated GGUF header at offset {self.pos}")
        out = self._buf[self._buf_pos : end]
        self._buf_pos = end
        self.pos += n
        return out

    def unpack(self, fmt: str, size: int) -> object:
        return struct.unpack(fmt, self.take(size))[0]

    def count(self, what: str, min_item_bytes: int) -> int:
        n = self.unpack("<Q", 8)
        if n * min_item_bytes > self.remaining():
            raise BadInput(self.where, f"GGUF {what} count {n} cannot fit in the {self.remaining()} header bytes left")
        return n

    def string(self) -> str:
        n = self.count("string length", 1)
        return self.take(n).decode("utf-8", "replace")


def read_header(read: Callable[[int], bytes], size: int, where: str) -> GGUFHeader:
    """Parse a GGUF header from a sequential `read(n)` over a file of `size` bytes."""
    cur = _Cursor(read, size, where)
    if size < 24:
        raise BadInput(where, f"too short to be a GGUF file ({size} bytes)")
    cur.reach(24)
    if cur.take(4) != MAGIC:
        raise BadInput(where, "not a GGUF file (bad magic)")
    version = cur.unpack("<I", 4)
    if version not in (2, 3):
        raise BadInput(where, f"unsupported GGUF version {version}")
    tensor_count = cur.count("tensor", 24)
    kv_count = cur.count("metadata", 13)
    fields: dict[str, object] = {}
    types: dict[str, tuple[int, ...]] = {}
    for i in range(kv_count):
        after = (kv_count - i - 1) * 13 + tensor_count * 24  # least the rest of the header can take
        cur.reach(13 + after)
        key = cur.string()
        vtype = cur.unpack("<I", 4)
        fields[key] = _value(cur, vtype, 0, after)
        types[key] = (vtype, cur.last_element_type) if vtype == _ARRAY else (vtype,)
    infos = []
    for j in range(tensor_count):
        cur.reach((tensor_count - j) * 24)
        name = cur.string()
        n_dims = cur.unpack("<I", 4)
        if not 1 <= n_dims <= MAX_DIMS:
            raise BadInput(where, f"tensor {name!r}: {n_dims} dimensions (GGUF allows 1..{MAX_DIMS})")
        dims = [cur.unpack("<Q", 8) for _ in range(n_dims)]
        ggml_type = cur.unpack("<I", 4)
        offset = cur.unpack("<Q", 8)
        infos.append((name, dims, ggml_type, offset))
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise BadInput(where, f"general.alignment {brief(alignment)} is not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    tensors = [_tensor(where, size - data_start, *info, data_start) for info in infos]
    return GGUFHeader(where, version, fields, tensors, size, data_start, alignment, types)


def read_local(path: str) -> GGUFHeader:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            return read_header(f.read, size, path)
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None


def _value(cur: _Cursor, vtype: int, depth: int, after: int) -> object:
    """One value; `after` is the least number of header bytes that follow it."""
    if vtype in _SCALARS:
        return cur.unpack(*_SCALARS[vtype])
    if vtype == _STRING:
        return cur.string()
    if vtype == _ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise BadInput(cur.where, "GGUF arrays nested too deeply")
        elem = cur.unpack("<I", 4)
        if elem not in _MIN_VALUE_BYTES:
            raise BadInput(cur.where, f"unknown GGUF array element type {elem}")
        cur.last_element_type = elem
        min_bytes = _MIN_VALUE_BYTES[elem]
        n = cur.count("array", min_bytes)
        if elem in _SCALARS:
            fmt, size = _SCALARS[elem]
            raw = cur.take(n * size)
            return list(struct.unpack(f"<{n}{fmt[1]}", raw))
        items = []
        for j in range(n):
            if j % 1024 == 0:  # token lists hold ~250k strings: refresh the read-ahead floor now and then
                cur.reach((n - j) * min_bytes + after)
            items.append(_value(cur, elem, depth + 1, after))
        cur.last_element_type = elem  # the outer array's, not its last item's
        return items
    raise BadInput(cur.where, f"unknown GGUF value type {vtype}")


def _tensor(
    where: str, data_size: int, name: str, dims: list[int], ggml_type: int, offset: int, data_start: int
) -> TensorInfo:
    type_name, block, block_bytes = ggml_type_info(ggml_type, where, name)
    if any(d == 0 for d in dims) or math.prod(dims) >= 2**60:
        raise BadInput(where, f"tensor {name!r}: dimensions {dims} are out of range")
    if dims[0] % block:
        raise BadInput(
            where, f"tensor {name!r}: row length {dims[0]} is not a multiple of the {type_name} block ({block})"
        )
    nbytes = math.prod(dims) // block * block_bytes
    if offset + nbytes > data_size:
        raise BadInput(
            where, f"tensor {name!r}: data at offset {offset} (+{nbytes} bytes) runs past the end of the file"
        )
    return TensorInfo(name, type_name, tuple(reversed(dims)), nbytes, where, data_start + offset)


def ggml_type_info(ggml_type: int, where: str, name: str) -> tuple[str, int, int]:
    """(type name, block elements, block bytes) from gguf-py's own tables."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy: gguf imports numpy

    try:
        qtype = GGMLQuantizationType(ggml_type)
    except ValueError:
        raise BadInput(where, f"tensor {name!r}: unknown ggml type {ggml_type}") from None
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    return qtype.name, block, block_bytes


def read_tensor(path: str, info: TensorInfo, cut: PartCut | None = None) -> torch.Tensor:
    """One tensor's data: float and integer types as tensors of their shape, block types as uint8 rows
    [..., rows, row bytes] (rows stay rows, so row moves need no decoding); with `cut`, only the cut's bytes
    (formats/regions.py), in the cut's shape."""
    from specpair.formats.safetensors import read_bytes, read_cut, torch_dtype

    raw = read_bytes(path, info) if cut is None else read_cut(path, info, cut)
    shape = info.shape if cut is None else cut.shape
    if info.dtype in GGML_PLAIN_DTYPES:
        return raw.view(torch_dtype(GGML_PLAIN_DTYPES[info.dtype], path, info.name)).reshape(shape)
    return raw.reshape(*shape[:-1], -1)


# ggml types that are plain arrays, by their safetensors dtype name
GGML_PLAIN_DTYPES = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "F64": "F64",
    "I8": "I8",
    "I16": "I16",
    "I32": "I32",
    "I64": "I64",
}


class Writer:
    """Writes planned tensors into one GGUF file through gguf-py's GGUFWriter, one tensor at a time.

    `fields` are (key, value, ValueType or GGUFValueType); `planned` are (name, ggml type name, numpy-order shape). The
    header and tensor infos go out first, then each tensor's data in plan order.
    """

    def __init__(
        self,
        path: str,
        arch: str,
        fields: list[tuple[str, object, object]],
        planned: list[tuple[str, str, tuple[int, ...]]],
    ) -> None:
        import numpy as np
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

        self._writer = GGUFWriter(path, arch)
        for key, value, value_type in fields:  # arrays: gguf-py takes the element type from the first value
            self._writer.add_key_value(key, value, GGUFValueType(value_type))
        self._planned = []
        for name, type_name, shape in planned:
            shape = tuple(shape) or (1,)  # GGUF has no 0-dim tensors
            qtype = GGMLQuantizationType[type_name]
            values, block_bytes = GGML_QUANT_SIZES[qtype]
            nbytes = math.prod(shape) // values * block_bytes
            self._writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
            self._planned.append((name, nbytes))
        self._writer.write_header_to_file()
        self._writer.write_kv_data_to_file()
        self._writer.write_ti_data_to_file()
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        import torch

        expected, nbytes = self._planned[self._next]
        data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        if (name, data.nbytes) != (expected, nbytes):
            raise ValueError(f"tensor {name!r} ({data.nbytes} bytes) written where {expected!r} ({nbytes}) was planned")
        self._writer.write_tensor_data(data)
        self._next += 1

    def close(self) -> None:
        if self._next != len(self._planned):
            raise ValueError(f"{len(self._planned) - self._next} planned tensors were not written")
        self._writer.close()
