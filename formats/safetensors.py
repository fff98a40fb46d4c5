"""safetensors files: headers read without touching tensor data, and one tensor read at a time.

A file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the data.
Only the first 8 + N bytes are ever read; every field is checked against the file size before use.
"""

from __future__ import annotations

import json
import math
import os
import struct
from itertools import chain, repeat
from operator import add, itemgetter, lt, mul, sub
from typing import TYPE_CHECKING

import orjson

from specpair.errors import BadInput
from specpair.formats import ReadRange, TensorInfo, TensorTable, brief

if TYPE_CHECKING:  # `check` reads headers without importing torch
    import torch

    from specpair.formats.regions import PartCut

# safetensors itself refuses headers over 100 MB.
MAX_HEADER_BYTES = 100_000_000

DTYPE_BYTES: dict[str, float] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "F8_E8M0": 1,
    "F4": 0.5,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
DTYPE_NAMES = frozenset(DTYPE_BYTES)


def read_header(read: ReadRange, file_size: int | None, where: str) -> tuple[list[TensorInfo], dict[str, str]]:
    """Parse one safetensors header: (tensors, __metadata__). Raises BadInput on any inconsistency."""
    table, metadata = read_table(read, file_size, where)
    return table.infos(), metadata


def read_table(
    read: ReadRange, file_size: int | None, where: str, file: str | None = None
) -> tuple[TensorTable, dict[str, str]]:
    """`read_header` as columns (`file` names the rows' file; default `where`)."""
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
        header = orjson.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadInput(where, "safetensors header is not UTF-8") from None
    except orjson.JSONDecodeError as e:
        if "depth limit" in e.msg:
            raise BadInput(where, "safetensors header is nested too deeply") from None
        raise BadInput(where, f"safetensors header is not valid JSON ({e.msg} at byte {e.pos})") from None
    data_size = None if file_size is None else file_size - 8 - length
    return parse_header_table(header, data_size, where, 8 + length, file or where)


def parse_header_table(
    header: object, data_size: int | None, where: str, data_start: int = 0, file: str | None = None
) -> tuple[TensorTable, dict[str, str]]:
    """Validate a decoded header into columns. The checks run over whole columns (a few C-level passes, not
    Python code per tensor: a MoE export holds ~10^5 tensors); when any fails, the per-tensor walk of
    `parse_header_json` names the first bad tensor, so both report the same error."""
    if not isinstance(header, dict):
        raise BadInput(where, "safetensors header is not a JSON object")
    table = _columns(header, data_size, data_start, file or where)
    if table is None:
        tensors, metadata = parse_header_json(header, data_size, where, data_start)
        table = TensorTable.of(tensors)
        table.files = [file or where] * len(table)
        return table, metadata
    return table, header.get("__metadata__") or {}


def _columns(header: dict, data_size: int | None, data_start: int, file: str) -> TensorTable | None:
    """The validated columns of a header, or None when any entry is not as it should be. Every pass is a C-level
    map or set over a column (map(type, ...) rather than a generator: ~10x less per tensor)."""
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict) or set(map(type, metadata.values())) - {str}:
        return None
    names, entries = list(header), list(header.values())
    if "__metadata__" in header:
        del entries[names.index("__metadata__")]
        names.remove("__metadata__")
    if set(map(type, entries)) - {dict}:
        return None
    dtypes = list(map(dict.get, entries, repeat("dtype")))
    shapes = list(map(dict.get, entries, repeat("shape")))
    offsets = list(map(dict.get, entries, repeat("data_offsets")))
    try:  # a list or dict where a dtype should be is unhashable; an offsets object other than a list fails below
        if set(dtypes) - DTYPE_NAMES or set(map(type, shapes)) - {list} or set(map(len, offsets)) - {2}:
            return None
        begins, ends = list(map(itemgetter(0), offsets)), list(map(itemgetter(1), offsets))
    except (TypeError, KeyError):
        return None
    dims = list(chain.from_iterable(shapes))
    if set(map(type, chain(dims, begins, ends))) - {int}:
        return None
    if begins and (min(chain(dims, begins)) < 0 or max(ends) >= 2**62) or dims and max(dims) >= 2**62:
        return None
    counts = list(map(math.prod, shapes))
    if counts and max(counts) >= 2**62:
        return None
    sizes = list(map(DTYPE_BYTES.__getitem__, dtypes))  # the products below are parse_header_json's, float for F4
    nbytes = list(map(mul, counts, sizes))
    if 0.5 in sizes:  # F4: two values per byte, the last byte half used
        nbytes = list(map(math.ceil, nbytes))
    if list(map(sub, ends, begins)) != nbytes or (data_size is not None and ends and max(ends) > data_size):
        return None
    # Writers put the data in header order (safetensors does): then one pass shows that each tensor begins where
    # the one before it ends or later; other orders are sorted by where they begin.
    if any(map(lt, begins[1:], ends)):
        order = sorted(range(len(begins)), key=begins.__getitem__)
        starts = list(map(begins.__getitem__, order))
        if any(map(lt, starts[1:], map(ends.__getitem__, order))):  # a tensor begins before the one below it ends
            return None
    return TensorTable(names, dtypes, shapes, nbytes, [file] * len(names), list(map(add, begins, repeat(data_start))))


def parse_header_json(
    header: object, data_size: int | None, where: str, data_start: int = 0
) -> tuple[list[TensorInfo], dict[str, str]]:
    """Validate a decoded header, tensor by tensor; `data_size` (bytes after the header) bounds the offsets when
    known, `data_start` (where the data section begins) makes each TensorInfo.offset absolute."""
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
            raise BadInput(
                where, f"tensor {name!r}: data_offsets span {end - begin} bytes, shape {shape} {dtype} needs {nbytes}"
            )
        if data_size is not None and end > data_size:
            raise BadInput(
                where, f"tensor {name!r}: data_offsets end {end} runs past the file's data ({data_size} bytes)"
            )
        spans.append((begin, end, name))
        tensors.append(TensorInfo(name, dtype, tuple(shape), nbytes, where, data_start + begin))
    spans.sort()
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise BadInput(where, f"tensors {name_a!r} and {name_b!r} overlap in the data section")
    return tensors, metadata


def read_local(path: str) -> tuple[list[TensorInfo], dict[str, str]]:
    """Header of a local .safetensors file (reads 8 + N bytes, nothing else)."""
    table, metadata = read_local_table(path)
    return table.infos(), metadata


def header_length(path: str) -> int | None:
    """The length its first 8 bytes give the header of a local .safetensors file; None when unreadable."""
    try:
        with open(path, "rb") as f:
            prefix = f.read(8)
    except OSError:
        return None
    return struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None


def read_local_table(path: str, file: str | None = None) -> tuple[TensorTable, dict[str, str]]:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)

            def read(offset: int, length: int) -> bytes:
                f.seek(offset)
                return f.read(length)

            return read_table(read, size, path, file)
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


def read_tensor(path: str, info: TensorInfo, cut: PartCut | None = None) -> torch.Tensor:
    """One tensor's data in its stored dtype, by one positioned read of exactly its bytes; with `cut`, only the
    cut's bytes (formats/regions.py), in the cut's shape.

    Not through safetensors' mmap: pages of a mapping stay counted in the process's RSS until it closes,
    so streaming a large checkpoint through it would grow RSS to the checkpoint's size.
    """
    raw = read_bytes(path, info) if cut is None else read_cut(path, info, cut)
    return raw.view(torch_dtype(info.dtype, path, info.name)).reshape(info.shape if cut is None else cut.shape)


def read_bytes(path: str, info: TensorInfo) -> torch.Tensor:
    import torch  # not at the top: `check` reads headers without importing torch

    buffer = torch.empty(info.nbytes, dtype=torch.uint8)
    try:
        with open(path, "rb") as f:
            read_at(f.fileno(), memoryview(buffer.numpy()), info.offset, path, info.name)
    except OSError as e:
        raise BadInput(path, f"cannot read tensor {info.name!r} ({e.strerror})") from None
    return buffer


def read_cut(path: str, info: TensorInfo, cut: PartCut) -> torch.Tensor:
    """The bytes of one tensor that `cut` takes (uint8, flat) by positioned reads: of its runs of whole rows, or of
    its runs of columns in each row where they lie pages apart (PartCut.whole_rows: else their rows are read and the
    columns taken in memory)."""
    import torch

    buffer = torch.empty(cut.nbytes, dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    try:
        with open(path, "rb") as f:
            if cut.whole_rows:
                rows = torch.empty(cut.read_nbytes, dtype=torch.uint8) if cut.byte_runs else buffer
                at = 0
                for offset, length in cut.ranges():
                    read_at(
                        f.fileno(), memoryview(rows.numpy())[at : at + length], info.offset + offset, path, info.name
                    )
                    at += length
                if cut.byte_runs:
                    buffer.numpy()[:] = cut.take(rows.numpy())
                return buffer
            at = 0
            for offset, length in cut.spans():
                read_at(f.fileno(), view[at : at + length], info.offset + offset, path, info.name)
                at += length
    except OSError as e:
        raise BadInput(path, f"cannot read tensor {info.name!r} ({e.strerror})") from None
    return buffer


def read_at(fd: int, into: memoryview, offset: int, path: str, name: str) -> None:
    """Fill `into` from `offset` of the file (every byte specpair reads of a tensor passes here)."""
    got = 0
    while got < len(into):
        n = os.preadv(fd, [into[got:]], offset + got)
        if n == 0:
            raise BadInput(path, f"tensor {name!r}: the file ends inside its data ({got} of {len(into)} bytes)")
        got += n


def torch_dtype(dtype: str, where: str, name: str) -> torch.dtype:
    from specpair.formats.codecs import TORCH_DTYPES

    if dtype not in TORCH_DTYPES:
        raise BadInput(where, f"tensor {name!r}: dtype {dtype} cannot be read as a tensor")
    return TORCH_DTYPES[dtype]


SHARD_BYTES = 5 * 1024**3  # Hugging Face's default shard size


class Writer:
    """Writes planned tensors into safetensors shards of a directory, one tensor at a time.

    Every tensor's name, dtype and shape is known before any data exists, so each shard's header is written
    first and tensors follow in plan order; memory holds one tensor, never a shard. Over `shard_bytes`,
    shards are `stem-0000k-of-0000n.safetensors` with `stem.safetensors.index.json`.
    """

    def __init__(
        self,
        directory: str,
        planned: list[tuple[str, str, tuple[int, ...]]],
        shard_bytes: int = SHARD_BYTES,
        stem: str = "model",
    ) -> None:
        self.directory = directory
        shards: list[list[tuple[str, str, tuple[int, ...], int]]] = [[]]
        size = 0
        for name, dtype, shape in planned:
            nbytes = math.ceil(math.prod(shape) * DTYPE_BYTES[dtype])
            if shards[-1] and size + nbytes > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append((name, dtype, tuple(shape), nbytes))
            size += nbytes
        count = len(shards)
        self.files = (
            [f"{stem}.safetensors"]
            if count == 1
            else [f"{stem}-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]
        )
        self._order = [(self.files[k], t) for k, shard in enumerate(shards) for t in shard]
        self._shards = shards
        self._next = 0
        self._file = None
        self._file_index = -1
        self.total_bytes = sum(t[3] for _, t in self._order)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """The next planned tensor: its name, dtype and shape must be the planned ones."""
        import torch

        from specpair.formats.codecs import SAFETENSORS_DTYPES

        if self._next >= len(self._order):
            raise ValueError(f"{name}: more tensors written than planned")
        file, (expected, dtype, shape, nbytes) = self._order[self._next]
        got = (name, SAFETENSORS_DTYPES.get(tensor.dtype), tuple(tensor.shape))
        if got != (expected, dtype, shape):
            raise ValueError(f"tensor {got} written where {(expected, dtype, shape)} was planned")
        if self.files.index(file) != self._file_index:
            self._open(self.files.index(file))
        data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        self._file.write(data)
        self._next += 1

    def close(self) -> None:
        if self._next != len(self._order):
            raise ValueError(f"{len(self._order) - self._next} planned tensors were not written")
        if self._file is not None:
            self._file.close()
            self._file = None
        index = self.index()
        if index is not None:
            with open(os.path.join(self.directory, index[0]), "w") as f:
                f.write(index[1])

    def index(self) -> tuple[str, str] | None:
        """(name, text) of the index file the plan's shards need; None for one file."""
        if len(self.files) == 1:
            return None
        weight_map = {t[0]: file for file, t in self._order}
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        return self.files[0].split("-00001-of-")[0] + ".safetensors.index.json", json.dumps(index, indent=2) + "\n"

    def header(self, k: int) -> bytes:
        """The bytes shard `k` starts with (its length, then its header as JSON), before its tensors' data."""
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape, nbytes in self._shards[k]:
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors writes it
        return struct.pack("<Q", len(raw)) + raw

    def shard_bytes(self, k: int) -> int:
        """The size of shard `k`'s file."""
        return len(self.header(k)) + sum(t[3] for t in self._shards[k])

    def _open(self, k: int) -> None:
        if self._file is not None:
            self._file.close()
        self._file = open(os.path.join(self.directory, self.files[k]), "wb")
        self._file.write(self.header(k))
        self._file_index = k
