"""File formats and weight layouts: headers, tensor readers and writers, and one codec per layout.

Every reader describes tensors with the same `TensorInfo` record, so the checkpoint model above it
does not care whether a tensor came from a safetensors shard, a GGUF file or a Hub range request.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import dataclass

import orjson

# Real metadata nests under 10 levels. Deeper JSON is refused: repr, dataclasses.asdict and json.dumps
# recurse once per level and fail near 1000, orjson.dumps at 255.
MAX_JSON_DEPTH = 64


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file's header describes it; `dtype` is a safetensors dtype or a ggml type name."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str
    offset: int = 0  # where its data starts in `file` (absolute); 0 where only the header was read remotely


@dataclass
class TensorTable:
    """Tensors of one or more headers as parallel columns, for code that summarises ~10^5 tensors (a checkpoint
    that stores every expert apart) without building an object per tensor. Row k is one tensor."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    nbytes: list[int]
    files: list[str]
    offsets: list[int]  # where each tensor's data starts in its file (absolute; 0 where only known remotely)

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def empty(cls) -> TensorTable:
        return cls([], [], [], [], [], [])

    @classmethod
    def of(cls, tensors: list[TensorInfo]) -> TensorTable:
        return cls(
            [t.name for t in tensors],
            [t.dtype for t in tensors],
            [list(t.shape) for t in tensors],
            [t.nbytes for t in tensors],
            [t.file for t in tensors],
            [t.offset for t in tensors],
        )

    def extend(self, other: TensorTable) -> None:
        for mine, theirs in zip(self.columns(), other.columns()):
            mine.extend(theirs)

    def columns(self) -> tuple[list, ...]:
        return self.names, self.dtypes, self.shapes, self.nbytes, self.files, self.offsets

    def to_bytes(self) -> bytes:
        """The columns as JSON, for another process (`from_bytes`): ~5x cheaper to read back than the headers."""
        return orjson.dumps(self.columns())

    @classmethod
    def from_bytes(cls, data: bytes) -> TensorTable:
        return cls(*orjson.loads(data))

    def infos(self) -> list[TensorInfo]:
        return [TensorInfo(n, d, tuple(s), b, f, o) for n, d, s, b, f, o in zip(*self.columns())]

    def row(self, name: str) -> TensorInfo | None:
        """The one tensor of this name (a linear scan: for the few lookups a summary needs)."""
        try:
            k = self.names.index(name)
        except ValueError:
            return None
        return TensorInfo(
            self.names[k], self.dtypes[k], tuple(self.shapes[k]), self.nbytes[k], self.files[k], self.offsets[k]
        )


ReadRange = Callable[[int, int], bytes]
"""read(offset, length) -> bytes: a local file or an HTTP range request."""


def nests_deeper_than(value: object, levels: int) -> bool:
    """Whether a decoded JSON value has containers more than `levels` deep (walked level by level, no recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(levels):  # after k rounds, `level` holds the containers k + 1 levels deep
        if not level:
            return False
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
    return bool(level)


_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 80


def brief(value: object) -> str:
    """repr of an untrusted value for an error message: a few levels and items, long strings cut."""
    return _BRIEF.repr(value)
