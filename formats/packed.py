"""A weight kept in its stored layout, as a weight-only matmul kernel reads it.

`parts` are the stored tensors keyed as formats/codecs.py keys them ("" for GGUF block data and float
layouts, ".weight", ".weight_scale", ".scales", ...). A stack of experts is one Packed whose every part
has the expert axis in front, per-tensor scalars included (shape [E]); `expert(e)` is one of them.
A source convention that no exact move of stored rows can undo travels as data: `col_order`, where
logical column j is stored column col_order[j], so W @ x == W_stored @ inputs(x) (GGUF's tiled value heads
in a Gated DeltaNet out_proj: permuting a few thousand activations is free, permuting packed columns is not).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from specpair.formats.codecs import codec


@dataclass(frozen=True)
class Packed:
    name: str
    layout: str  # formats/layouts.py label: nvfp4-modelopt, fp8-tensor, fp8-block, affine4-g64, gguf-Q4_K, ...
    shape: tuple[int, ...]  # logical float shape [..., out, in]; a leading dim stacks experts
    parts: dict[str, Tensor]
    col_order: Tensor | None = None  # int64 [in]: logical column j is stored column col_order[j]

    @property
    def nbytes(self) -> int:
        """The bytes its parts hold, as a tensor's `nbytes`: a weight's size whichever form it has."""
        return sum(part.nbytes for part in self.parts.values())

    @property
    def experts(self) -> int | None:
        return self.shape[0] if len(self.shape) == 3 else None

    def expert(self, e: int) -> Packed:
        if self.experts is None:
            raise ValueError(f"{self.name} is not a stack of experts")
        return replace(self, shape=self.shape[1:], parts={k: v[e] for k, v in self.parts.items()})

    def inputs(self, x: Tensor) -> Tensor:
        """x [..., in] in stored column order: x'[col_order[j]] = x[j]."""
        if self.col_order is None:
            return x
        stored_input = torch.empty_like(x)
        stored_input[..., self.col_order] = x
        return stored_input

    def dequantize(self) -> Tensor:
        """The logical float32 weight."""
        if self.experts is not None:
            return torch.stack([self.expert(e).dequantize() for e in range(self.experts)])
        w = codec(self.layout).decode(self.parts, self.shape, self.name)
        return w if self.col_order is None else w[:, self.col_order]

    def to(self, device: str | torch.device) -> Packed:
        col_order = self.col_order.to(device) if self.col_order is not None else None
        return replace(self, parts={k: v.to(device) for k, v in self.parts.items()}, col_order=col_order)
