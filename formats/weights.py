"""Logical weights of a checkpoint: each tensor a model computes with, with the stored parts that hold it.

A quantized linear is stored as several tensors (codes, scales, ...); a `Weight` gathers them under the
weight's name (module + ".weight") with its layout and its float shape, from headers alone. Float tensors,
GGUF tensors and anything without companions are their own weight, with the single part "". Readers and
the runtime go through this view, so they never care how a layout splits a tensor. Their bytes come from a
`TensorReader` (sources/local.py's LocalFiles reads files; any other source of the same tensors serves alike).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from specpair.errors import BadInput
from specpair.formats import TensorInfo, gguf
from specpair.formats.layouts import (
    COMPANION_SUFFIXES,
    EXL3,
    PLAIN_LAYOUTS,
    WEIGHT_SUFFIXES,
    classify,
    gguf_layout,
    layout_of,
    split_module,
)

if TYPE_CHECKING:
    from specpair.formats.regions import Cut, PartCut


class TensorReader(Protocol):
    """Where a checkpoint's stored tensors come from."""

    def tensor(self, info: TensorInfo, cut: PartCut | None = None) -> Tensor:
        """One stored tensor (a header's entry) in its stored dtype and shape; with `cut`, only the cut's bytes, in
        the cut's shape (formats/regions.py)."""


@dataclass(frozen=True)
class Weight:
    name: str
    layout: str
    shape: tuple[int, ...]  # the float tensor's shape; padded layouts (EXL3) give the padded one
    parts: dict[str, TensorInfo]  # "" for the weight itself, else the suffix after the module name

    @property
    def module(self) -> str:
        return self.name.removesuffix(".weight")

    def part_name(self, key: str) -> str:
        return self.name if key == "" else self.module + key


def hf_weights(tensors: list[TensorInfo], mlx: dict | None = None) -> list[Weight]:
    """Weights of safetensors tensors (any number of shards), in the order their first part appears;
    `mlx` is an MLX config's `quantization` block, if any."""
    labels = classify(tensors, mlx)
    modules: dict[str, dict[str, TensorInfo]] = defaultdict(dict)
    for t in tensors:
        module, suffix = split_module(t.name)
        modules[module][suffix] = t
    weights = []
    seen: set[str] = set()
    for t in tensors:
        module, _ = split_module(t.name)
        layout = labels[t.name]
        if layout in PLAIN_LAYOUTS and not _quantized_fp8(modules[module]):
            _refuse_orphans(module, modules[module])
            weights.append(Weight(t.name, layout, t.shape, {"": t}))
        elif module not in seen:
            seen.add(module)
            parts = modules[module]
            weights.append(Weight(module + ".weight", layout, _logical_shape(layout, parts, module), parts))
    return weights


def gguf_weights(header: gguf.GGUFHeader) -> list[Weight]:
    """Weights of a GGUF file: one per tensor; an NVFP4 tensor's `.scale` / `.input_scale` sidecars join it."""
    by_name = {t.name: t for t in header.tensors}
    weights = []
    for t in header.tensors:
        module = t.name.removesuffix(".weight")
        if (
            t.name.endswith((".scale", ".input_scale"))
            and by_name.get(t.name.rsplit(".", 1)[0] + ".weight", t).dtype == "NVFP4"
        ):
            continue
        parts = {"": t}
        if t.dtype == "NVFP4":
            parts.update({s: by_name[module + s] for s in (".scale", ".input_scale") if module + s in by_name})
        weights.append(Weight(t.name, gguf_layout(t.dtype), t.shape, parts))
    return weights


def read_parts(weight: Weight, reader: TensorReader) -> dict[str, Tensor]:
    """The stored tensors of one weight."""
    return {key: reader.tensor(info) for key, info in weight.parts.items()}


def read_rows(weight: Weight, reader: TensorReader, start: int, stop: int) -> dict[str, Tensor]:
    """Rows start:stop of a weight's stored parts (its leading dims flattened into rows, each part seen as
    [entries, last]), reading only their bytes; per-tensor values are read whole. See codecs.row_slice for which
    parts split how."""
    from specpair.formats.codecs import row_slice
    from specpair.formats.regions import PartCut

    rows = math.prod(weight.shape[:-1])
    parts = {}
    for key, info in weight.parts.items():
        where = row_slice(info.shape, rows, start, stop)
        if where is None:
            parts[key] = reader.tensor(info)
            continue
        entries = math.prod(info.shape[:-1])
        taken = (where.start, where.stop)
        shape = (where.stop - where.start, info.shape[-1])
        parts[key] = reader.tensor(info, PartCut(1, entries, info.nbytes // entries, (taken,), None, shape))
    return parts


def read_cut(weight: Weight, reader: TensorReader, cut: Cut) -> dict[str, Tensor]:
    """The stored parts of a weight that hold `cut` of it (its rows and columns, formats/regions.py), reading only
    their bytes; per-tensor values are read whole. Unaligned where the cut ends inside a block of a part."""
    from specpair.formats.codecs import grains
    from specpair.formats.regions import part_cut

    table = grains(weight.layout) or {}
    parts = {}
    for key, info in weight.parts.items():
        where = part_cut(info.shape, info.nbytes, weight.shape, table[key], cut, weight.part_name(key))
        parts[key] = reader.tensor(info, where)
    return parts


def _refuse_orphans(module: str, parts: dict[str, TensorInfo]) -> None:
    """A weight with scale companions that form no known layout lost a tensor: refused, not read as raw ints."""
    suffix = next((s for s in WEIGHT_SUFFIXES if s in parts), None)
    companions = sorted(s for s in parts if s in COMPANION_SUFFIXES and s not in (".k_scale", ".v_scale"))
    if suffix is not None and companions:
        weight = parts[suffix]
        raise BadInput(
            module + suffix,
            f"{weight.dtype} {list(weight.shape)} with {', '.join(module + c for c in companions)} "
            "beside it forms no known quantized layout (a scale tensor is missing or has the wrong dtype)",
        )


def _quantized_fp8(parts: dict[str, TensorInfo]) -> bool:
    """An F8 `.weight` with its scale is one quantized weight, not two plain tensors."""
    weight = parts.get(".weight")
    return (
        weight is not None
        and weight.dtype.startswith("F8")
        and (".weight_scale" in parts or ".weight_scale_inv" in parts)
    )


def _logical_shape(layout: str, parts: dict[str, TensorInfo], module: str) -> tuple[int, ...]:
    main = parts.get(".weight") or parts.get(".weight_packed") or parts.get(".trellis")
    if main is None or not main.shape:
        raise BadInput(module, f"{layout} weight has no stored weight tensor (parts: {', '.join(sorted(parts))})")
    lead, last = main.shape[:-1], main.shape[-1]
    form = layout_of(layout)
    if form.packing:
        element, code = form.packing
        return (*lead, last * element // code)
    if form.kind == EXL3:  # trellis [in/16, out/16, 16K]: 16x16 tiles of the transposed weight
        if len(main.shape) != 3:
            raise BadInput(module + ".trellis", f"shape {list(main.shape)} is not [in/16, out/16, 16·bits]")
        return (main.shape[1] * 16, main.shape[0] * 16)
    return main.shape
