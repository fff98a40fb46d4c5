"""File layouts: headers and tensor listings now; readers, dequantizers and writers per layout later.

Every reader describes tensors with the same `TensorInfo` record, so the checkpoint model above it
does not care whether a tensor came from a safetensors shard, a GGUF file or a Hub range request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file's header describes it; `dtype` is a safetensors dtype or a ggml type name."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str


ReadRange = Callable[[int, int], bytes]
"""read(offset, length) -> bytes: a local file or an HTTP range request."""
