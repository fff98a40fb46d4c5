"""`specpair convert`: a checkpoint from its layout and file format into another, streamed tensor by tensor.

1. `open_source` reads headers only: the normalized `Checkpoint`, and every logical weight with its layout.
2. `plan` decides, from headers alone, every output tensor: which source weights build it (tensor maps
   between HF, MLX and GGUF names), its layout (convert/policy.py) and how it is made:
     copy    the stored bytes, renamed (same layout, no value change);
     rows    row moves on the stored parts (stacking experts, head reorders) of row-wise layouts;
     repack  NVFP4 flavour to flavour, codes and scales moved as bits;
     float   dequantize to float32, transform, quantize (the only lossy path).
   The plan knows every output tensor's dtype and shape, so headers are written before any data.
3. `execute` streams: a few tensors in flight, each read, converted and written in plan order, into a
   temporary name beside the destination that is renamed at the end; on failure it is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch

from specpair.checkpoint import consistency, gguf_arch, speculators
from specpair.checkpoint.families import DRAFTER_KINDS, FAMILIES, DrafterKind
from specpair.checkpoint.gguf_tokenizer import gguf_tokenizer_fields, hf_tokenizer_files
from specpair.checkpoint.groups import group_of
from specpair.convert import policy, quant_configs
from specpair.errors import BadInput, Incomplete, Interrupted
from specpair.formats import gguf
from specpair.formats.codecs import FLOAT_LAYOUTS, TORCH_DTYPES, codec, repack, row_slice, stored_nbytes
from specpair.formats.gguf import GGUFHeader
from specpair.formats.layouts import AFFINE, EXL3, FP8, GGUF, NVFP4, layout_of
from specpair.formats.transforms import Step, TensorMap, compose, identity
from specpair.formats.weights import Weight
from specpair.sources.model import Model, open_model

# ------------------------------------------------------------------------------------------------ targets


@dataclass(frozen=True)
class Target:
    spec: str  # as typed
    file_format: str  # "safetensors" | "gguf"
    layout: str  # the layout quantized weights get
    naming: str  # "hf" | "mlx" | "gguf"
    family: str  # convert/policy.py POLICIES key, or "float"
    method: str | None = None  # quantizer, where a layout has two


GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "NVFP4")
SPECULATORS = "speculators"  # a drafter in vllm-project/speculators' format (checkpoint/speculators.py)
SPECULATORS_FLOATS = ("bf16", "f16", "f32")
NVFP4_FLAVOURS = {"modelopt": "nvfp4-modelopt", "ct": "nvfp4-ct", "mlx": "nvfp4-mlx"}
TARGET_HELP = (
    "bf16 | f16 | f32 | fp8[:block|tensor] | nvfp4[:modelopt|ct|mlx] | affine4 | "
    "affine:BITS:GROUP[:mlx|minmax] | gguf:TYPE[:search|rtn] (TYPE: " + ", ".join(GGUF_TYPES) + ") | "
    "exl3:BITS[:mul1|mcg|3inst] (BITS 1-8) | speculators[:bf16|f16|f32] (a drafter, its verifier pinned from --target)"
)


def parse_target(spec: str) -> Target:
    """The `--to` value: a layout, and where it lives (file format, naming)."""
    kind, *args = spec.lower().split(":")
    where = f"--to {spec}"
    if kind in FLOAT_LAYOUTS and not args:
        return Target(spec, "safetensors", kind, "hf", "float")
    if kind == SPECULATORS and len(args) <= 1:
        layout = args[0] if args else "bf16"
        if layout not in SPECULATORS_FLOATS:
            raise BadInput(where, f"speculators drafters are written in {', '.join(SPECULATORS_FLOATS)}")
        return Target(spec, "safetensors", layout, SPECULATORS, "float")
    if kind == FP8 and len(args) <= 1:
        variant = args[0] if args else "block"
        if variant not in ("block", "tensor"):
            raise BadInput(where, "fp8 comes as fp8:block (Qwen's 128x128 blocks) or fp8:tensor (ModelOpt)")
        return Target(spec, "safetensors", f"fp8-{variant}", "hf", "fp8")
    if kind == NVFP4 and len(args) <= 1:
        layout = NVFP4_FLAVOURS.get(args[0] if args else "modelopt")
        if layout is None:
            raise BadInput(where, f"NVFP4 flavours: {', '.join(NVFP4_FLAVOURS)}")
        return Target(spec, "safetensors", layout, "mlx" if layout == "nvfp4-mlx" else "hf", layout)
    if kind == "affine4" and not args:
        return Target(spec, "safetensors", "affine4-g64", "mlx", "affine", "mlx")
    if kind == AFFINE and len(args) in (2, 3):
        bits, group, method = args[0], args[1], args[2] if len(args) == 3 else "mlx"
        from specpair.formats import affine

        if (
            not (bits.isdigit() and group.isdigit())
            or int(bits) not in affine.BITS
            or int(group) not in affine.GROUP_SIZES
        ):
            raise BadInput(where, f"affine needs BITS in {affine.BITS} and GROUP in {affine.GROUP_SIZES}")
        if method not in affine.METHODS:
            raise BadInput(where, f"affine quantizers: {', '.join(affine.METHODS)}")
        return Target(spec, "safetensors", f"affine{bits}-g{group}", "mlx", "affine", method)
    if kind == GGUF and len(args) in (1, 2):
        qtype = args[0].upper()
        method = args[1] if len(args) == 2 else "search"
        if qtype not in GGUF_TYPES or method not in ("search", "rtn"):
            raise BadInput(where, f"GGUF types: {', '.join(GGUF_TYPES)}; k-quant methods: search, rtn")
        layout = (
            qtype.lower() if qtype.lower() in FLOAT_LAYOUTS else "nvfp4-gguf" if qtype == "NVFP4" else f"gguf-{qtype}"
        )
        family = "float" if layout in FLOAT_LAYOUTS else "nvfp4-gguf" if layout == "nvfp4-gguf" else "gguf"
        return Target(spec, "gguf", layout, "gguf", family, method)
    if kind == EXL3 and len(args) in (1, 2):
        from specpair.formats import exl3

        codebook = args[1] if len(args) == 2 else "mul1"
        if not args[0].isdigit() or int(args[0]) not in exl3.BITS or codebook not in exl3.CODEBOOKS:
            raise BadInput(
                where,
                f"exl3 needs whole BITS in {exl3.BITS[0]}..{exl3.BITS[-1]} and a codebook of "
                f"{', '.join(exl3.CODEBOOKS)} (half-integer rates are read, not written)",
            )
        return Target(spec, "safetensors", f"exl3-{int(args[0])}bpw", "hf", "exl3", codebook)
    raise BadInput(where, f"unknown target layout; expected {TARGET_HELP}")


def parse_layout(text: str, where: str) -> str:
    """A --keep layout: a --to spec (its layout) or a layout label such as bf16, gguf-Q6_K or affine8-g64."""
    label = text.strip()
    for known in (label, label.lower(), "gguf-" + label.upper().removeprefix("GGUF-")):
        try:
            codec(known)
            return known
        except BadInput:
            pass
    try:
        return parse_target(label).layout
    except BadInput:
        raise BadInput(
            where,
            f"unknown layout {text!r}; expected a layout label (bf16, f32, gguf-Q8_0, "
            f"affine8-g64, ...) or {TARGET_HELP}",
        ) from None


# ------------------------------------------------------------------------------------------------ sources

Source = Model  # a checkpoint to convert is the model layer's view of it: stored weights, config, HF names


def open_source(ref: str, gguf_file: str | None = None, target_vocab: int | None = None) -> Source:
    """A local checkpoint directory or .gguf file, or a Hub repo already in the HF cache. Headers only."""
    return open_model(ref, gguf_file, target_vocab)


def _hf_config(source: Source) -> dict[str, Any]:
    """The HF config.json of a checkpoint without its quantization announcements."""
    config = dict(source.hf_config)
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
    return config


def _quantized(source: Source) -> bool:
    return any(w.layout not in FLOAT_LAYOUTS and w.layout != "int" for w in source.weights.values())


def _metadata_file(source: Source) -> str:
    """The file the model's description comes from: the GGUF, or config.json."""
    return source.header.path if source.header is not None else os.path.join(source.root, "config.json")


def _embedding_rows(model: Model) -> int:
    """The rows a drafter sharing this model's embedding must match."""
    return model.shape("embed_tokens.weight")[0] if "embed_tokens.weight" in model.maps else model.config.vocab_size


# ------------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class Output:
    map: TensorMap  # output name and logical shape; sources are source weight names
    layout: str
    mode: str  # "copy" | "rows" | "repack" | "float"
    stored: dict[str, tuple[str, tuple[int, ...]]]  # part key -> (dtype, shape), in write order
    reason: str
    method: str | None = None
    fell_back_from: str | None = None  # the layout it was to get, had its rows split into that layout's blocks

    @property
    def nbytes(self) -> int:
        return sum(stored_nbytes(dtype, shape) for dtype, shape in self.stored.values())

    def part_name(self, key: str) -> str:
        return self.map.name if key == "" else self.map.name.removesuffix(".weight") + key


@dataclass
class Plan:
    source: Source
    target: Target
    outputs: list[Output]
    config: dict[str, Any] | None = None  # config.json to write (safetensors targets)
    files: dict[str, bytes] = field(default_factory=dict)  # other small files to write
    copies: list[str] = field(default_factory=list)  # small files copied from the source directory
    gguf_arch: str | None = None
    gguf_fields: list[tuple[str, object, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(o.nbytes for o in self.outputs)

    @property
    def fallbacks(self) -> list[Fallback]:
        """The weight matrices whose rows do not split into the blocks of the layout they were to get, counted
        by that layout and the one they got instead."""
        matrices = sum(len(o.map.shape) >= 2 for o in self.outputs)
        rows: dict[tuple[str, str], set[int]] = {}
        counts: dict[tuple[str, str], int] = {}
        for o in self.outputs:
            if o.fell_back_from is not None:
                key = (o.fell_back_from, o.layout)
                counts[key] = counts.get(key, 0) + 1
                rows.setdefault(key, set()).add(o.map.shape[-1])
        return [
            Fallback(wanted, layout, count, matrices, policy.block_of(wanted), tuple(sorted(rows[wanted, layout])))
            for (wanted, layout), count in sorted(counts.items(), key=lambda item: -item[1])
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": {
                "ref": self.source.ref,
                "format": self.source.file_format,
                "naming": self.source.naming,
                "bytes": sum(i.nbytes for w in self.source.weights.values() for i in w.parts.values()),
            },
            "target": {
                "spec": self.target.spec,
                "format": self.target.file_format,
                "layout": self.target.layout,
                "naming": self.target.naming,
            },
            "bytes": self.nbytes,
            "tensors": [
                {
                    "name": o.map.name,
                    "shape": list(o.map.shape),
                    "layout": o.layout,
                    "mode": o.mode,
                    "from": list(o.map.sources),
                    "steps": [str(s) for s in o.map.steps],
                    "reason": o.reason,
                    "bytes": o.nbytes,
                }
                for o in self.outputs
            ],
            "fallbacks": [f.to_json() for f in self.fallbacks],
            "notes": self.notes,
        }


@dataclass(frozen=True)
class Fallback:
    """Weight matrices that got another layout than the one asked for: their rows (last axis) do not split into
    that layout's blocks (SmolLM2's rows of 576 into Q4_K's 256)."""

    wanted: str
    layout: str  # what they got instead (llama.cpp's own fallback for GGUF targets, else float)
    tensors: int
    matrices: int  # weight matrices in the plan
    block: int  # values per block of `wanted`
    row_lengths: tuple[int, ...]

    def __str__(self) -> str:
        rows = ", ".join(map(str, self.row_lengths))
        return (
            f"{self.tensors:,} of {self.matrices:,} weight matrices fell back from {self.wanted} to {self.layout}: "
            f"rows of {rows} are not a multiple of {self.block}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.wanted,
            "to": self.layout,
            "tensors": self.tensors,
            "matrices": self.matrices,
            "block": self.block,
            "row_lengths": list(self.row_lengths),
            "message": str(self),
        }


def plan(
    source: Source, target: Target, keep: list[policy.KeepRule] | None = None, donor: Source | None = None
) -> Plan:
    """Every output tensor of converting `source` to `target`, from headers alone. `donor` is the target model
    of a drafter: its tokenizer goes into a drafter's GGUF, its config decides the drafter's rope sections."""
    if donor is not None and source.weights_only:
        # a weights-only drafter's vocabulary is its target's
        source = dataclasses.replace(
            open_source(source.header.path, target_vocab=_embedding_rows(donor)), ref=source.ref
        )
    maps, notes, config, arch, fields = _name_maps(source, target, donor)
    # the config goes out beside the tensors (config.json, or a GGUF's keys): it must describe them
    problem = consistency.contradiction(source.config, {name: m.shape for name, m in source.maps.items()})
    if problem is not None:
        raise BadInput(_metadata_file(source), f"{problem}; a checkpoint written so would not load")
    float_layout = _float_layout(source, target)
    gated = source.config.attn_output_gate and FAMILIES[source.config.family].gated_attention
    # the embedding is the head too where the config says so and no separate head is written
    tied = source.config.tie_word_embeddings and not any(group_of(m.name) == "lm_head" for m in maps)
    outputs = []
    for m in maps:
        weights = [_weight(source, s) for s in m.sources]
        source_float = all(w.layout in FLOAT_LAYOUTS for w in weights)
        if any(w.layout == "int" for w in weights):
            choice = policy.Choice(weights[0].layout, "integer tensor, copied")
        else:
            choice = policy.choose(
                m.name,
                m.shape,
                target.layout,
                target.family,
                float_layout(m),
                keep or [],
                source_float,
                _quantized(source) and source.file_format == "safetensors",
                gated,
                target.file_format == "gguf",
                tied,
                _as_bits(m, weights, target.layout),
            )
        outputs.append(_output(m, choice, weights, target))
    p = Plan(source, target, outputs, gguf_arch=arch, notes=notes)
    if target.file_format == "gguf":
        p.gguf_fields = _gguf_general(source, target) + fields + _gguf_tokenizer(source, donor, p)
    else:
        p.config, p.files, p.copies = _hf_files(source, target, config, outputs, p)
    return p


def _weight(source: Source, name: str) -> Weight:
    weight = source.weights.get(name)
    if weight is None:
        raise BadInput(source.ref, f"tensor {name!r} is needed but not in the checkpoint")
    return weight


NVFP4_LAYOUTS = ("nvfp4-modelopt", "nvfp4-ct", "nvfp4-gguf", "nvfp4-mlx")
NVFP4_REPACKED = NVFP4_LAYOUTS[:3]  # the flavours NVFP4 bits are repacked into


def _as_bits(m: TensorMap, weights: list[Weight], layout: str) -> bool:
    """Whether `layout` takes the one source weight's quantized bits as stored: the same layout, or NVFP4 from
    flavour to flavour."""
    if m.steps or len(weights) != 1 or weights[0].layout in FLOAT_LAYOUTS:
        return False
    stored = weights[0].layout
    return stored == layout or stored in NVFP4_LAYOUTS and layout in NVFP4_REPACKED


def _output(m: TensorMap, choice: policy.Choice, weights: list[Weight], target: Target) -> Output:
    layout, reason, fell_back_from = choice.layout, choice.reason, choice.fell_back_from
    layouts = {w.layout for w in weights}
    method = target.method if layout == target.layout else None
    if layouts == {layout}:
        if not m.steps and len(weights) == 1:
            stored = {k: (i.dtype, i.shape) for k, i in weights[0].parts.items()}
            return Output(m, layout, "copy", _gguf_dtypes(stored, target, m), reason, None, fell_back_from)
        exact = m.kind == "rows" and codec(layout).rows_exact or m.kind == "shape" and layout in FLOAT_LAYOUTS
        if exact and all(len(w.parts) == 1 for w in weights):
            return Output(
                m, layout, "rows", _gguf_dtypes(codec(layout).stored(m.shape), target, m), reason, None, fell_back_from
            )
    if layout == "int":
        raise BadInput(m.name, f"integer tensor cannot be built by {', '.join(map(str, m.steps))}")
    target_codec = codec(layout, method)
    try:
        stored = dict(target_codec.stored(m.shape))
    except BadInput as e:  # the codec knows the layout, not the tensor
        raise BadInput(m.name, f"cannot be stored as {layout}: {e.problem} (--keep '{m.name}=bf16' keeps it)") from None
    if _as_bits(m, weights, layout):
        from specpair.formats.nvfp4 import STORED

        input_scale = STORED[layout].get("input_scale")
        source_scale = STORED[weights[0].layout].get("input_scale")
        if input_scale and source_scale and source_scale[0] in weights[0].parts:
            stored[input_scale[0]] = ("F32", (1,) if layout in ("nvfp4-ct", "nvfp4-gguf") else ())
        return Output(m, layout, "repack", _gguf_dtypes(stored, target, m), reason, None, fell_back_from)
    for w in weights:
        _check_parts(w)
    return Output(m, layout, "float", _gguf_dtypes(stored, target, m), reason, method, fell_back_from)


def _gguf_dtypes(
    stored: dict[str, tuple[str, tuple[int, ...]]], target: Target, m: TensorMap
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF has no unsigned, F8 or complex types: refuse what llama.cpp could not read."""
    if target.file_format == "gguf":
        from gguf import GGMLQuantizationType

        for key, (dtype, _) in stored.items():
            if dtype not in GGMLQuantizationType.__members__:
                raise BadInput(
                    m.name if key == "" else m.name.removesuffix(".weight") + key, f"dtype {dtype} has no GGUF type"
                )
    return stored


def _check_parts(weight: Weight) -> None:
    """Missing or misshapen scales are refused before anything is written."""
    if weight.layout in FLOAT_LAYOUTS or layout_of(weight.layout).kind in (GGUF, EXL3):  # EXL3 checks its own
        return
    expected = codec(weight.layout).stored(weight.shape)
    for key, (_, shape) in expected.items():
        part = weight.parts.get(key)
        if part is None:
            if key in (".global_scale", ".scale"):  # optional where a factor of 1 is left out
                continue
            raise BadInput(weight.part_name(key), f"missing: a {weight.layout} weight needs it beside {weight.name}")
        if part.shape != shape and max(len(shape), len(part.shape)) > 1:  # scalars may be [] or [1]
            raise BadInput(
                weight.part_name(key),
                f"shape {list(part.shape)} does not fit {weight.layout} weight "
                f"{list(weight.shape)} (expected {list(shape)})",
            )


def _float_layout(source: Source, target: Target) -> Callable[[TensorMap], str]:
    """What kept tensors are written in: F32 for GGUF's 1-D and kept tensors (as llama.cpp's converter
    writes them), else the source's float dtype, else bf16."""

    def layout(m: TensorMap) -> str:
        if target.file_format == "gguf":
            return "f32"
        layouts = {source.weights[s].layout for s in m.sources if s in source.weights}
        return layouts.pop() if len(layouts) == 1 and layouts <= set(FLOAT_LAYOUTS) else "bf16"

    return layout


# ------------------------------------------------------------------------------------------------ naming


def _name_maps(
    source: Source, target: Target, donor: Source | None
) -> tuple[list[TensorMap], list[str], dict[str, Any] | None, str | None, list]:
    """(maps, notes, HF config, GGUF arch, GGUF arch fields) between the source's and target's naming."""
    shapes = {name: w.shape for name, w in source.weights.items()}
    family = source.config.family
    to, src = target.naming, source.naming
    target_config = _hf_config(donor) if donor else None
    if src == "gguf" and to == "gguf":
        arch = source.header.architecture
        if arch == gguf_arch.FORK_ARCH:  # a fork schema: rewritten as upstream's `dflash`
            _vocabulary_known(source)
            with gguf_arch.naming(_metadata_file(source)):
                forward = gguf_arch.to_gguf(
                    source.hf_config, {m.name: m.shape for m in source.hf}, target_config=target_config
                )
            notes = (
                source.notes
                + forward.notes
                + [f"{arch} (a fork schema) written as upstream llama.cpp's {forward.arch}"]
            )
            return compose(source.hf, forward.tensors), notes, None, forward.arch, forward.fields
        fields = [
            (k, v, t) for k, v, t in _source_fields(source.header) if not k.startswith(("tokenizer.", "general."))
        ]
        return [identity(n, s) for n, s in shapes.items()], [], None, arch, fields
    _vocabulary_known(source)
    hf_maps, notes = source.hf, list(source.notes)
    config = _hf_config(source)
    if to == "gguf":
        kv_scales = [m for m in hf_maps if m.name.endswith(KV_SCALES)]
        if kv_scales:
            notes.append(f"dropped {len(kv_scales)} KV-cache scales (.k_scale/.v_scale): llama.cpp has no FP8 KV cache")
            hf_maps = [m for m in hf_maps if m not in kv_scales]
        with gguf_arch.naming(_metadata_file(source)):
            forward = gguf_arch.to_gguf(config, {m.name: m.shape for m in hf_maps}, target_config=target_config)
        return compose(hf_maps, forward.tensors), notes + forward.notes, None, forward.arch, forward.fields
    if to == "mlx" and src != "mlx":
        from specpair.checkpoint.mlx_names import to_mlx

        maps, mlx_notes = to_mlx(family, {m.name: m.shape for m in hf_maps}, source.config.tie_word_embeddings)
        return compose(hf_maps, maps), notes + mlx_notes, config, None, []
    if to == SPECULATORS:
        return (
            _speculators_maps(source, hf_maps, config, donor),
            notes,
            _speculators_config(source, config, donor),
            None,
            [],
        )
    # HF to HF: the model's HF maps (the stored names, or a speculators drafter's in its kind's own names)
    maps = [identity(n, s) for n, s in shapes.items()] if to == src and to != "hf" else hf_maps
    if target.family != "float" and to == "hf":
        maps = _unstack_fused_experts(maps)
    return maps, notes, config, None, []


KV_SCALES = (".k_scale", ".v_scale")


def _speculators_kind(source: Source, donor: Source | None) -> DrafterKind:
    """The drafter kind `source` is written as in the speculators format; refused when it has none, or without the
    target (--target) whose pin it carries."""
    wiring = source.config.drafter
    kind = DRAFTER_KINDS[wiring.kind] if wiring else None
    if kind is None or kind.speculators is None:
        kinds = ", ".join(k.title for k in DRAFTER_KINDS.values() if k.speculators)
        raise BadInput(source.ref, f"is not a drafter the speculators format holds ({kinds})")
    if donor is None:
        raise BadInput("--to speculators", "pins the drafter's verifier: give the target with --target")
    if not wiring.target_layer_ids:
        raise BadInput(source.ref, "names no target layers it reads: the speculators format needs them")
    return kind


def _speculators_maps(
    source: Source, hf_maps: list[TensorMap], config: dict[str, Any], donor: Source | None
) -> list[TensorMap]:
    """The drafter's tensors in speculators' names (the row's renames, the other way)."""
    renames = _speculators_kind(source, donor).speculators.renames
    return [
        dataclasses.replace(
            m, name=next((old + m.name[len(new) :] for old, new in renames if m.name.startswith(new)), m.name)
        )
        for m in hf_maps
    ]


def _speculators_config(source: Source, config: dict[str, Any], donor: Source) -> dict[str, Any]:
    kind = _speculators_kind(source, donor)
    wiring = source.config.drafter
    archs = donor.hf_config.get("architectures") or ()
    verifier = speculators.Verifier(verifier_name(donor), tuple(a for a in archs if isinstance(a, str)))
    return speculators.write(config, wiring, wiring.block_size or kind.block_size, verifier)


HF_CACHE_REPO = re.compile(r"(^|/)models--(?P<org>[^/]+)--(?P<name>[^/]+)/snapshots/[^/]+/?$")


def verifier_name(target: Source) -> str:
    """How a speculators drafter names its verifier: the Hub repo a reference or an HF cache snapshot names, else
    the target's absolute path (what `vllm serve` opens)."""
    ref = target.ref.partition("@")[0]
    snapshot = HF_CACHE_REPO.search(os.path.abspath(target.root))
    if snapshot:
        return f"{snapshot['org']}/{snapshot['name']}"
    if not os.path.exists(ref) and os.path.abspath(target.root) != os.path.abspath(ref):
        return ref
    return os.path.abspath(target.root)


def _vocabulary_known(source: Source) -> None:
    """A weights-only drafter GGUF is written in HF names only with its target's vocabulary (plan's donor)."""
    if source.weights_only:
        raise BadInput(
            source.header.path, "no vocabulary size (dflash.vocab_size, token_embd.weight or tokenizer.ggml.tokens)"
        )


FUSED_EXPERTS = re.compile(r"(?P<mlp>.*\.mlp\.)experts\.(?P<proj>gate_up_proj|down_proj)$")


def _unstack_fused_experts(maps: list[TensorMap]) -> list[TensorMap]:
    """Quantized HF exports store routed experts one by one (ModelOpt, llm-compressor, Qwen FP8)."""
    out = []
    for m in maps:
        match = FUSED_EXPERTS.match(m.name)
        if not match or len(m.shape) != 3:
            out.append(m)
            continue
        experts, rows, cols = m.shape
        for e in range(experts):
            prefix = f"{match['mlp']}experts.{e}."
            select = Step("select", (e,))
            if match["proj"] == "down_proj":
                out.append(TensorMap(prefix + "down_proj.weight", (rows, cols), m.sources, m.steps + (select,)))
            else:
                half = rows // 2  # gate rows first
                out.append(
                    TensorMap(
                        prefix + "gate_proj.weight",
                        (half, cols),
                        m.sources,
                        m.steps + (select, Step("rows", (0, half))),
                    )
                )
                out.append(
                    TensorMap(
                        prefix + "up_proj.weight",
                        (half, cols),
                        m.sources,
                        m.steps + (select, Step("rows", (half, rows))),
                    )
                )
    return out


# ------------------------------------------------------------------------------------------------ files


def _hf_files(
    source: Source, target: Target, config: dict[str, Any], outputs: list[Output], p: Plan
) -> tuple[dict[str, Any], dict[str, bytes], list[str]]:
    """config.json, quantization files, tokenizer files (rebuilt from a GGUF) and the files to copy."""
    layouts = {
        o.map.name.removesuffix(".weight"): o.layout
        for o in outputs
        if len(o.map.shape) >= 2 and o.map.name.endswith(".weight")
    }
    input_scales = {
        o.map.name.removesuffix(".weight") for o in outputs if {".input_scale", ".input_global_scale"} & o.stored.keys()
    }
    stored = {o.map.name.removesuffix(".weight"): {o.part_name(k): v for k, v in o.stored.items()} for o in outputs}
    try:
        keys, extra = quant_configs.quantization_files(layouts, input_scales, stored, target.method)
    except ValueError as e:
        raise BadInput(f"--to {target.spec}", str(e)) from None
    config = {**config, **keys}
    if target.family == "exl3":  # ExLlamaV3 always reads a head of its own
        for holder in (config, config.get("text_config")):
            if isinstance(holder, dict) and "tie_word_embeddings" in holder:
                holder["tie_word_embeddings"] = False
    if target.family == "float":
        config["torch_dtype" if "torch_dtype" in config else "dtype"] = {
            "bf16": "bfloat16",
            "f16": "float16",
            "f32": "float32",
        }[target.layout]
    files = {name: orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n" for name, doc in extra.items()}
    copies = []
    if source.file_format == "gguf":
        files.update(hf_tokenizer_files(source.header.fields, source.header.path))
    else:
        copies = [f for f in source.files if _copied(f)]
    return config, files, copies


COPIED = re.compile(r"[^/]+\.(json|jinja|txt|model|py|md|tiktoken)$|LICENSE[^/]*")
REWRITTEN = ("config.json", "hf_quant_config.json", "quantization_config.json")


def _copied(name: str) -> bool:
    """Small top-level files that travel with the weights (tokenizer, generation config, chat template,
    code and docs); the configs this converter rewrites and the old index do not."""
    return bool(COPIED.fullmatch(name)) and name not in REWRITTEN and not name.endswith(".safetensors.index.json")


GGUF_FILE_TYPES = {
    "f32": "ALL_F32",
    "f16": "MOSTLY_F16",
    "bf16": "MOSTLY_BF16",
    "gguf-Q8_0": "MOSTLY_Q8_0",
    "gguf-Q4_0": "MOSTLY_Q4_0",
    "gguf-Q4_K": "MOSTLY_Q4_K_M",
    "gguf-Q5_K": "MOSTLY_Q5_K_M",
    "gguf-Q6_K": "MOSTLY_Q6_K",
    "nvfp4-gguf": "MOSTLY_NVFP4",
}
GGUF_GENERAL_REWRITTEN = (
    "general.architecture",
    "general.file_type",
    "general.quantization_version",
    "general.alignment",
)


def _gguf_general(source: Source, target: Target) -> list[tuple[str, object, object]]:
    from gguf import GGUFValueType, LlamaFileType

    fields = []
    if source.header is not None:
        fields += [
            (k, v, t)
            for k, v, t in _source_fields(source.header)
            if k.startswith("general.") and k not in GGUF_GENERAL_REWRITTEN
        ]
    if not any(k == "general.name" for k, _, _ in fields):
        fields.append(("general.name", model_name(source), GGUFValueType.STRING))
    fields.append(("general.file_type", int(LlamaFileType[GGUF_FILE_TYPES[target.layout]]), GGUFValueType.UINT32))
    fields.append(("general.quantization_version", 2, GGUFValueType.UINT32))
    return fields


HF_CACHE_SNAPSHOT = re.compile(r"(^|/)models--[^/]+--(?P<name>[^/]+)/snapshots/[^/]+/?$")


def model_name(source: Source) -> str:
    """The source model's name, for general.name: the config's `_name_or_path`, the repo of an HF cache snapshot,
    the repo a Hub reference names, else the source's own file or folder name."""
    recorded = source.hf_config.get("_name_or_path")
    if isinstance(recorded, str) and recorded.strip("/"):
        return recorded.rstrip("/").rsplit("/", 1)[-1]
    snapshot = HF_CACHE_SNAPSHOT.search(os.path.abspath(source.root))
    if snapshot:
        return snapshot["name"]
    return os.path.basename(os.path.normpath(source.ref.partition("@")[0])).removesuffix(".gguf")


def _gguf_tokenizer(source: Source, donor: Source | None, p: Plan) -> list[tuple[str, object, object]]:
    """The tokenizer keys: kept from a GGUF source, built from tokenizer.json, or copied from the --target."""
    has_tokenizer = (
        "tokenizer.ggml.tokens" in source.header.fields
        if source.header is not None
        else "tokenizer.json" in source.files
    )
    giver = source if has_tokenizer else donor
    if giver is None:
        raise BadInput(
            source.ref,
            "has no tokenizer.json, and llama.cpp needs a tokenizer in the GGUF; name the "
            "target model it was trained for with --target (its tokenizer is copied)",
        )
    # a drafter's mask token comes with its own keys (gguf_arch), not with the target's tokenizer
    own_mask = source.config.drafter is not None and source.config.drafter.mask_token_id is not None
    if giver.header is not None:
        return [
            (k, v, t)
            for k, v, t in _source_fields(giver.header)
            if k.startswith("tokenizer.") and not (own_mask and k == "tokenizer.ggml.mask_token_id")
        ]
    if "tokenizer.json" not in giver.files:
        raise BadInput(giver.ref, "has no tokenizer.json to copy into the GGUF")
    from specpair.sources import MAX_TOKENIZER_BYTES, read_json

    def small(name: str) -> bytes | None:
        return giver.reader.read(name, MAX_TOKENIZER_BYTES) if name in giver.files else None

    template = small("chat_template.jinja")
    tokenizer = gguf_tokenizer_fields(
        small("tokenizer.json"),
        read_json(giver.reader, "tokenizer_config.json"),
        read_json(giver.reader, "generation_config.json"),
        template.decode("utf-8", "replace") if template is not None else None,
        None if source.weights_only else source.config.vocab_size,
        os.path.join(giver.root, "tokenizer.json"),
    )
    p.notes.extend(tokenizer.notes)
    return [f for f in tokenizer.fields if not (own_mask and f[0] == "tokenizer.ggml.mask_token_id")]


def _source_fields(header: GGUFHeader) -> list[tuple[str, object, object]]:
    """A GGUF's key-value pairs with their GGUF value types (arrays: the element type is taken from the values)."""
    from gguf import GGUFValueType

    return [
        (key, value, GGUFValueType(header.types[key][0]))
        for key, value in header.fields.items()
        if not key.startswith("split.")
    ]


# ------------------------------------------------------------------------------------------------ execution


@dataclass
class TensorReport:
    name: str
    layout: str
    mode: str
    nbytes: int
    rel_error: float  # ‖out − in‖ / ‖in‖ in float32 (0 for exact paths)
    max_abs_error: float
    error_sq: float  # ‖out − in‖², for totals
    norm_sq: float  # ‖in‖²


WORST_SHOWN = 10  # tensors the human report lists by default


@dataclass
class Report:
    destination: str
    tensors: list[TensorReport]
    seconds: float
    source_bytes: int
    fallbacks: list[Fallback] = field(default_factory=list)  # the plan's

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def lossy(self) -> list[TensorReport]:
        """Tensors whose values changed: every quantization and every cast that rounds (to bf16 as much as to
        Q4_K); exact paths, and float casts that lose nothing, are not among them."""
        return [t for t in self.tensors if t.mode == "float" and t.error_sq > 0]

    @property
    def rel_error(self) -> float:
        """Relative Frobenius error over every lossy tensor together."""
        return _relative(self.lossy)

    def groups(self) -> list[dict[str, Any]]:
        """Totals per model part (checkpoint.groups' names: experts, attention, norm, ...), largest first."""
        from specpair.checkpoint.groups import group_of

        by_group: dict[str, list[TensorReport]] = {}
        for t in self.tensors:
            by_group.setdefault(group_of(t.name), []).append(t)
        rows = [
            {
                "group": group,
                "tensors": len(ts),
                "lossy": sum(t.mode == "float" and t.error_sq > 0 for t in ts),
                "bytes": sum(t.nbytes for t in ts),
                "rel_error": _relative([t for t in ts if t.error_sq > 0]),
                "max_abs_error": max(t.max_abs_error for t in ts),
                "layouts": sorted({t.layout for t in ts}),
            }
            for group, ts in by_group.items()
        ]
        return sorted(rows, key=lambda r: -r["bytes"])

    def worst(self, count: int = WORST_SHOWN) -> list[TensorReport]:
        return sorted(self.lossy, key=lambda t: -t.rel_error)[:count]

    def to_json(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "seconds": round(self.seconds, 3),
            "bytes": self.nbytes,
            "source_bytes": self.source_bytes,
            "rel_error": self.rel_error,
            "max_abs_error": max((t.max_abs_error for t in self.tensors), default=0.0),
            "lossy_tensors": len(self.lossy),
            "groups": self.groups(),
            "fallbacks": [f.to_json() for f in self.fallbacks],
            "tensors": [
                {
                    "name": t.name,
                    "layout": t.layout,
                    "mode": t.mode,
                    "bytes": t.nbytes,
                    "rel_error": t.rel_error,
                    "max_abs_error": t.max_abs_error,
                }
                for t in self.tensors
            ],
        }


def _relative(tensors: list[TensorReport]) -> float:
    norm = sum(t.norm_sq for t in tensors)
    return (sum(t.error_sq for t in tensors) / norm) ** 0.5 if norm else 0.0


PARTIAL_SUFFIX = ".specpair-partial"


class ConvertFailed(Incomplete):
    """A conversion that did not complete (a write failed, the disk filled up): exit 1. Nothing is left
    behind, so running it again starts afresh."""


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT raise Interrupted in the main thread while a conversion runs, so its cleanup runs (by
    default SIGTERM ends the process where it stands, leaving DST.specpair-partial behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def execute(
    p: Plan,
    destination: str,
    *,
    device: str = "cpu",
    workers: int = 2,
    shard_bytes: int | None = None,
    progress: Callable[[Output, int], None] | None = None,
) -> Report:
    """Write the plan's checkpoint at `destination` (a directory, or a .gguf file), streaming."""
    with signals_interrupt():
        return _execute(p, destination, device, workers, shard_bytes, progress)


def _execute(
    p: Plan,
    destination: str,
    device: str,
    workers: int,
    shard_bytes: int | None,
    progress: Callable[[Output, int], None] | None,
) -> Report:
    check_destination(destination)
    partial = destination.rstrip("/") + PARTIAL_SUFFIX
    started = time.perf_counter()
    reports: list[TensorReport] = []
    try:
        _remove(partial)  # a run killed earlier leaves only this name behind
        if p.target.file_format == "gguf":
            open(partial, "wb").close()
        else:
            os.makedirs(partial)
    except OSError as e:  # refused before any work, as download refuses a destination it cannot create
        _remove_quietly(partial)
        raise BadInput(destination, f"cannot create {partial} ({e.strerror or e})") from None
    try:
        writer = _open_writer(p, partial, shard_bytes)
        for output, parts, report in _converted(p, device, workers):
            for key in output.stored:
                writer.write(output.part_name(key), parts[key])
            reports.append(report)
            if progress:
                progress(output, report.nbytes)
        writer.close()
        if p.target.file_format == "safetensors":
            _write_small_files(p, partial)
        os.replace(partial, destination)
    except OSError as e:
        _remove_quietly(partial)
        raise ConvertFailed(*_io_problem(e, destination, partial)) from None
    except BaseException:
        _remove_quietly(partial)
        raise
    source_bytes = sum(i.nbytes for w in p.source.weights.values() for i in w.parts.values())
    return Report(destination, reports, time.perf_counter() - started, source_bytes, p.fallbacks)


def check_destination(destination: str) -> None:
    """A conversion never writes over anything: refused before any work (and any word of progress)."""
    if os.path.lexists(destination):
        raise BadInput(destination, "already exists; remove it or choose another destination")


def _open_writer(p: Plan, partial: str, shard_bytes: int | None):
    planned = [(o.part_name(k), dtype, shape) for o in p.outputs for k, (dtype, shape) in o.stored.items()]
    if p.target.file_format == "gguf":
        return gguf.Writer(partial, p.gguf_arch, p.gguf_fields, planned)
    from specpair.formats.safetensors import SHARD_BYTES, Writer

    return Writer(partial, planned, shard_bytes or SHARD_BYTES)


def _write_small_files(p: Plan, directory: str) -> None:
    for name in p.copies:  # through the source's checks: a symlink out of the checkpoint is refused
        shutil.copyfile(p.source.reader.inside(name), os.path.join(directory, name))
    for name, data in p.files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    with open(os.path.join(directory, "config.json"), "wb") as f:
        f.write(orjson.dumps(p.config, option=orjson.OPT_INDENT_2) + b"\n")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _remove_quietly(path: str) -> None:
    """Remove the partial after a failure without hiding that failure behind a second one."""
    with contextlib.suppress(OSError):
        _remove(path)


def _io_problem(error: OSError, destination: str, partial: str) -> tuple[str, str]:
    """(where, problem) of an OSError while converting: a write into the partial names the destination,
    anything else (a source file that became unreadable) names its own file."""
    reason = error.strerror or str(error)  # numpy's tofile raises OSError("N requested and M written"), no errno
    if error.filename and not os.path.abspath(error.filename).startswith(os.path.abspath(partial)):
        return error.filename, f"cannot read ({reason}); nothing was left behind: run again once it is readable"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return destination, f"the disk is full ({reason}); nothing was left behind: free some space and run again"
    return destination, f"writing failed ({reason}); nothing was left behind: run again once it can be written"


def _converted(p: Plan, device: str, workers: int) -> Iterator[tuple[Output, dict[str, torch.Tensor], TensorReport]]:
    """Outputs in plan order, `workers` converting at once; at most 2·workers tensors in flight. When the
    caller stops (an error, an interrupt) the queued tensors are dropped and nothing waits for the running ones:
    they write nothing, and the cleanup must not wait minutes for an EXL3 search to end."""
    held = _Held(p.source, [o.map.sources for o in p.outputs if not _goes_by_rows(p.source, o)])
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        pending: list[Future] = []
        for output in p.outputs:
            pending.append(pool.submit(_convert_one, p.source, output, device, held))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


class _Held:
    """The stored parts of source weights, each read once: from the first output that reads it whole to the
    last (the 2E per-expert outputs of a fused gate_up_proj read it once, not 2E times)."""

    def __init__(self, source: Source, readers: list[tuple[str, ...]]) -> None:
        self.source = source
        self.users: dict[str, int] = {}
        for sources in readers:
            for name in sources:
                self.users[name] = self.users.get(name, 0) + 1
        self.parts: dict[str, dict[str, torch.Tensor]] = {}
        self.reading: dict[str, threading.Lock] = {}
        self.lock = threading.Lock()

    def get(self, name: str) -> dict[str, torch.Tensor]:
        with self.lock:
            reading = self.reading.setdefault(name, threading.Lock())
        with reading:  # a second worker asking for the same weight waits for the first one's read
            with self.lock:
                if name in self.parts:
                    return self.parts[name]
            parts = self.source.read(name)
            with self.lock:
                self.parts[name] = parts
            return parts

    def release(self, name: str) -> None:
        with self.lock:
            self.users[name] -= 1
            if not self.users[name]:
                self.parts.pop(name, None)
                self.reading.pop(name, None)


def _weights(source: Source, output: Output) -> list[Weight]:
    return [source.weights[s] for s in output.map.sources]


def _convert_one(
    source: Source, output: Output, device: str, held: _Held
) -> tuple[Output, dict[str, torch.Tensor], TensorReport]:
    weights = _weights(source, output)
    m = output.map
    if _goes_by_rows(source, output):
        parts, errors = _convert_by_rows(source, output, weights[0], device)
        return output, _cpu(parts), errors.report(output)
    stored = [held.get(s) for s in m.sources]
    try:
        if output.mode == "float":
            reference = source.decode(m, stored, device).float()
            target_codec = codec(output.layout, output.method)
            parts = target_codec.encode(reference, m.name)
            errors = ErrorSum()
            errors.add(target_codec.decode(parts, m.shape, m.name), reference)
            return output, _cpu(parts), errors.report(output)
        if output.mode == "copy":
            parts = stored[0]
        elif output.mode == "rows":
            parts = {"": m.apply([s[""] for s in stored])}
        else:  # repack
            parts = repack(
                weights[0].layout,
                output.layout,
                stored[0],
                weights[0].name,
                input_scale=bool({".input_scale", ".input_global_scale"} & output.stored.keys()),
            )
    finally:
        for s in m.sources:
            held.release(s)
    _check_stored(output, parts)
    return output, parts, ErrorSum().report(output)


def _goes_by_rows(source: Source, output: Output) -> bool:
    return output.mode == "float" and _by_rows(output, _weights(source, output))


def _by_rows(output: Output, weights: list[Weight]) -> bool:
    """A one-source, step-free float conversion whose parts all split by rows runs a few MB at a time."""
    if output.map.steps or len(weights) != 1 or len(output.map.shape) < 2 or layout_of(output.layout).kind == EXL3:
        return False
    rows = math.prod(output.map.shape[:-1])
    shapes = [info.shape for info in weights[0].parts.values()] + [shape for _, shape in output.stored.values()]
    try:
        for shape in shapes:
            row_slice(shape, rows, 0, rows)
    except ValueError:
        return False
    return True


def _convert_by_rows(
    source: Source, output: Output, weight: Weight, device: str
) -> tuple[dict[str, torch.Tensor], ErrorSum]:
    """Decode, encode and measure one weight in slices of rows, into output parts allocated once. A layout with
    one per-tensor scale gets the whole tensor's amax from a first pass."""
    from specpair.formats.weights import read_rows

    source_codec, target_codec = codec(weight.layout), codec(output.layout, output.method)
    rows, cols = math.prod(weight.shape[:-1]), weight.shape[-1]
    unit = max(source_codec.row_block, target_codec.row_block)
    step = max(unit, target_codec.chunk_values // cols // unit * unit)
    chunks = [(start, min(start + step, rows)) for start in range(0, rows, step)]

    # One per-tensor scale takes the whole tensor's amax first: then its stored parts are read once and held
    # (as a copy holds them), not read twice; otherwise each slice of rows is read as it is encoded.
    whole = source.read(weight.name) if target_codec.tensor_amax else None

    def decoded(start: int, stop: int) -> torch.Tensor:
        if whole is None:
            parts = read_rows(weight, source.reader, start, stop)
        else:
            parts = {key: _stored_rows(part, weight.parts[key].shape, rows, start, stop) for key, part in whole.items()}
        return source_codec.decode(
            {k: v.to(device) for k, v in parts.items()}, (stop - start, cols), weight.name
        ).float()

    amax = max(float(decoded(*c).abs().amax()) for c in chunks) if target_codec.tensor_amax else None
    out = {key: _allocate(dtype, shape, device) for key, (dtype, shape) in output.stored.items()}
    errors = ErrorSum()
    for start, stop in chunks:
        x = decoded(start, stop)
        parts = target_codec.encode(x, output.map.name, amax)
        for key, tensor in parts.items():
            where = row_slice(out[key].shape, rows, start, stop)
            if where is None:
                out[key].copy_(tensor.reshape(out[key].shape))
            else:
                out[key].reshape(-1, out[key].shape[-1])[where] = tensor.reshape(where.stop - where.start, -1)
        errors.add(target_codec.decode(parts, (stop - start, cols), output.map.name), x)
    return out, errors


def _stored_rows(part: torch.Tensor, shape: tuple[int, ...], rows: int, start: int, stop: int) -> torch.Tensor:
    """Rows start:stop of a stored part held in memory, as formats/weights.read_rows reads them from a file."""
    where = row_slice(shape, rows, start, stop)
    return part if where is None else part.reshape(-1, part.shape[-1])[where]


def _allocate(dtype: str, shape: tuple[int, ...], device: str) -> torch.Tensor:
    if dtype in TORCH_DTYPES:
        return torch.empty(shape, dtype=TORCH_DTYPES[dtype], device=device)
    lead = math.prod(shape[:-1])  # GGUF blocks: rows of bytes
    return torch.empty(*shape[:-1], stored_nbytes(dtype, shape) // max(1, lead), dtype=torch.uint8, device=device)


class ErrorSum:
    """‖out − in‖² and ‖in‖² summed over slices, and the largest |out − in|."""

    def __init__(self) -> None:
        self.error_sq = self.norm_sq = self.max_abs = 0.0

    def add(self, decoded: torch.Tensor, reference: torch.Tensor) -> None:
        decoded, reference = decoded.to(reference.device).reshape(-1), reference.reshape(-1)
        for start in range(0, decoded.numel(), REPORT_CHUNK):  # no tensor-sized temporaries
            diff = decoded[start : start + REPORT_CHUNK] - reference[start : start + REPORT_CHUNK]
            self.error_sq += float(torch.linalg.vector_norm(diff)) ** 2
            self.norm_sq += float(torch.linalg.vector_norm(reference[start : start + REPORT_CHUNK])) ** 2
            self.max_abs = max(self.max_abs, float(diff.abs().max()))

    def report(self, output: Output) -> TensorReport:
        if self.norm_sq:
            rel = (self.error_sq / self.norm_sq) ** 0.5
        else:
            rel = 0.0 if self.error_sq == 0 else float("inf")
        return TensorReport(
            output.map.name, output.layout, output.mode, output.nbytes, rel, self.max_abs, self.error_sq, self.norm_sq
        )


REPORT_CHUNK = 1 << 20


def _cpu(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in parts.items()}


def _check_stored(output: Output, parts: dict[str, torch.Tensor]) -> None:
    from specpair.formats.codecs import SAFETENSORS_DTYPES

    for key, (dtype, shape) in output.stored.items():
        tensor = parts.get(key)
        if tensor is None:
            raise BadInput(output.part_name(key), "was planned but not produced")
        if dtype in SAFETENSORS_DTYPES.values() and tuple(tensor.shape) != shape and max(len(shape), tensor.ndim) > 1:
            raise BadInput(output.part_name(key), f"came out as {list(tensor.shape)}, planned {list(shape)}")
