"""safetensors file headers, read without touching tensor data.

A file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the data.
Only the first 8 + N bytes are ever read; every field is checked against the file size before use.
"""

from __future__ import annotations

import json
import math
import struct

from specpair.errors import BadInput
from specpair.formats import ReadRange, TensorInfo, brief

# safetensors itself refuses headers over 100 MB.
MAX_HEADER_BYTES = 100_000_000

DTYPE_BYTES: dict[str, float] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
    "F8_E8M0": 1, "F4": 0.5, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}


def read_header(read: ReadRange, file_size: int | None, where: str) -> tuple[list[TensorInfo], dict[str, str]]:
    """Parse one safetensors header: (tensors, __metadata__). Raises BadInput on any inconsistency."""
    prefix = read(0, 8)
    if len(prefix) < 8:
        raise BadInput(where, "truncated safetensors header (file shorter than 8 bytes)")
    (length,) = struct.unpack("<Q", prefix)
    if length == 0 or length > MAX_HEADER_BYTES:
        raise BadInput(where, f"safetensors header length {length} is out of range")
    if file_size is not None and 8 + length > file_size:
        raise BadInput(where, f"safetensors header length {length} runs past the end of the file ({file_size} bytes)")
    raw = read(8, length)
    if len(raw) < length:
        raise BadInput(where, f"truncated safetensors header ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadInput(where, "safetensors header is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise BadInput(where, f"safetensors header is not valid JSON ({e.msg} at byte {e.pos})") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise BadInput(where, "safetensors header is nested too deeply") from None
    data_size = None if file_size is None else file_size - 8 - length
    return parse_header_json(header, data_size, where)


def parse_header_json(header: object, data_size: int | None, where: str) -> tuple[list[TensorInfo], dict[str, str]]:
    """Validate a decoded header; `data_size` (bytes after the header) bounds the offsets when known."""
    if not isinstance(header, dict):
        raise BadInput(where, "safetensors header is not a JSON object")
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadInput(where, "safetensors __metadata__ is not an object of strings")
    tensors = []
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise BadInput(where, f"tensor {name!r}: entry is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise BadInput(where, f"tensor {name!r}: unknown dtype {brief(dtype)}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise BadInput(where, f"tensor {name!r}: shape {brief(shape)} is not a list of non-negative integers")
        if math.prod(shape) >= 2**62:  # bounds the element count before it meets a float dtype size
            raise BadInput(where, f"tensor {name!r}: shape {shape} is out of range")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise BadInput(where, f"tensor {name!r}: data_offsets {brief(offsets)} is not [begin, end]")
        begin, end = offsets
        nbytes = math.ceil(math.prod(shape) * DTYPE_BYTES[dtype])
        if end - begin != nbytes:
            raise BadInput(where, f"tensor {name!r}: data_offsets span {end - begin} bytes, shape {shape} {dtype} needs {nbytes}")
        if data_size is not None and end > data_size:
            raise BadInput(where, f"tensor {name!r}: data_offsets end {end} runs past the file's data ({data_size} bytes)")
        spans.append((begin, end, name))
        tensors.append(TensorInfo(name, dtype, tuple(shape), nbytes, where))
    spans.sort()
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise BadInput(where, f"tensors {name_a!r} and {name_b!r} overlap in the data section")
    return tensors, metadata


def read_local(path: str) -> tuple[list[TensorInfo], dict[str, str]]:
    """Header of a local .safetensors file (reads 8 + N bytes, nothing else)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)

            def read(offset: int, length: int) -> bytes:
                f.seek(offset)
                return f.read(length)

            return read_header(read, size, path)
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62
