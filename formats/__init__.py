"""File formats and weight layouts: headers, tensor readers and writers, and one codec per layout.

Every reader describes tensors with the same `TensorInfo` record, so the checkpoint model above it
does not care whether a tensor came from a safetensors shard, a GGUF file or a Hub range request.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import dataclass

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


ReadRange = Callable[[int, int], bytes]
"""read(offset, length) -> bytes: a local file or an HTTP range request."""


def nests_deeper_than(value: object, levels: int) -> bool:
    """Whether a decoded JSON value has containers more than `levels` deep (walked level by level, no recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(levels):  # after k rounds, `level` holds the containers k + 1 levels deep
        if not level:
            return False
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
    return bool(level)


_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 80


def brief(value: object) -> str:
    """repr of an untrusted value for an error message: a few levels and items, long strings cut."""
    return _BRIEF.repr(value)
