"""File formats and weight layouts each stack loads, and quantization crossing from target to draft."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import FAMILIES, HEAD_GROUPS
from specpair.compat.fixes import WEIGHT_GROUPS, convert_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, ALL_STACKS, SEPARATE_DRAFTERS, Values, rule
from specpair.compat.stacks import FLOAT_LAYOUTS, STACKS
from specpair.formats.layouts import layout_of

# Tensor groups that are not weights a stack computes with (vision towers load through their own path).
SKIPPED_GROUPS = ("vision",)


def _layouts(p: Pair, which: str) -> set[str]:
    checkpoint = p.target if which == "target" else p.draft
    # a head inside the target is loaded only as the pair's drafter
    heads = tuple(g for g in HEAD_GROUPS if which != "target" or g != p.kind_row.head_group)
    skipped = SKIPPED_GROUPS + heads
    return {g.layout for g in checkpoint.groups if g.group not in skipped}


def _describe(format_: str, layouts: set[str]) -> str:
    return f"{format_} ({', '.join(sorted(layouts))})" if layouts else format_


def _target_fix(p: Pair, stack: str) -> list[str] | None:
    return convert_command(p.target, stack, "target")


def draft_fix(p: Pair, stack: str) -> list[str] | None:
    return convert_command(p.draft, stack, "draft", p.target)


def _unloadable(p: Pair, stack: str, which: str) -> Iterable[Values]:
    s = STACKS[stack]
    checkpoint = p.target if which == "target" else p.draft
    layouts = _layouts(p, which)
    if s.file_format not in ("any", checkpoint.format) and checkpoint.format != "config-only":
        yield {
            "which": which,
            "name": checkpoint.ref,
            "wanted": s.file_format,
            "have": _describe(checkpoint.format, layouts),
        }
        return
    # A plain draft model loads like any model; dedicated drafters often only unquantized.
    accepted = s.target_layouts if which == "target" or p.kind_row.plain else s.draft_layouts
    floats = {layout for layout in accepted if layout in FLOAT_LAYOUTS}
    refused = {layout for layout in s.unloadable(layouts - FLOAT_LAYOUTS, accepted)}
    if floats:
        refused |= (layouts & FLOAT_LAYOUTS) - floats - {"int"}
    else:
        # Quantized-only stacks still read float norms and embeddings; they refuse float weight matrices.
        weights = {g.layout for g in checkpoint.groups if g.group in WEIGHT_GROUPS}
        refused |= weights & FLOAT_LAYOUTS if weights and weights <= FLOAT_LAYOUTS else set()
    family = FAMILIES.get(p.target.family or "")
    if which == "target" and family and family.experts:
        for kind, labels in s.moe_layouts.items():
            refused |= {layout for layout in layouts if layout_of(layout).kind == kind and layout not in labels}
    if refused:
        serves = p.serves(stack) if which == "draft" else None
        misread = f": {serves.unserved_layout}" if serves and serves.unserved_layout else ""
        yield {
            "which": which,
            "name": checkpoint.ref,
            "wanted": ", ".join(accepted),
            "have": f"{checkpoint.format} with {', '.join(sorted(refused))} weights{misread}",
        }


@rule(
    "format.target",
    "error",
    ALL_STACKS,
    ALL_KINDS,
    title="The stack loads the target's file format and every weight layout in it.",
    message="{stack} loads {which}s as {wanted}; {name} is {have}.",
    example={"which": "target", "name": "Qwen/Qwen3.6-35B-A3B", "wanted": "gguf", "have": "safetensors (bf16)"},
    fix=_target_fix,
)
def _target_format(p: Pair, stack: str) -> Iterable[Values]:
    yield from _unloadable(p, stack, "target")


@rule(
    "format.draft",
    "error",
    ALL_STACKS,
    SEPARATE_DRAFTERS,
    title="The stack loads the drafter's file format and weight layouts (many stacks take only unquantized drafters).",
    message="{stack} loads {which}s as {wanted}; {name} is {have}.",
    example={"which": "draft", "name": "z-lab/Qwen3.6-35B-A3B-DFlash", "wanted": "gguf", "have": "safetensors (bf16)"},
    fix=draft_fix,
)
def _draft_format(p: Pair, stack: str) -> Iterable[Values]:
    yield from _unloadable(p, stack, "draft")


@rule(
    "format.family",
    "error",
    ALL_STACKS,
    ALL_KINDS,
    title="The stack has a model family for the target's model_type.",
    message="{stack} has no family for model_type {model_type!r} ({target}); it serves {known}.",
    example={"model_type": "gemma3", "known": "qwen3_5, qwen3_5_moe"},
)
def _family(p: Pair, stack: str) -> Iterable[Values]:
    families = STACKS[stack].families
    if p.target.family not in families:
        yield {"model_type": p.target.model_type or p.target.family, "known": ", ".join(families)}


@rule(
    "format.quant_inherit",
    "warn",
    ("sglang", "vllm"),
    SEPARATE_DRAFTERS,
    title="An unquantized drafter is not built under the quantized target's quantization config.",
    message="{target} is quantized ({method}) and {draft} is not: {detail}",
    example={
        "method": "modelopt MIXED_PRECISION",
        "detail": "SGLang applies the target's quantization to the draft by default and then drafts garbage (club-3090#1261); the launch line passes --speculative-draft-model-quantization unquant.",
    },
)
def _quant_inherit(p: Pair, stack: str) -> Iterable[Values]:
    if p.target.quantization is None or p.target.quantization.method == "gguf" or p.draft.quantization is not None:
        return
    method = " ".join(x for x in (p.target.quantization.method, p.target.quantization.algo) if x)
    if stack == "sglang":
        detail = (
            "SGLang applies the target's quantization to the draft by default and then drafts garbage "
            "(club-3090#1261); the launch line passes --speculative-draft-model-quantization unquant."
        )
    else:
        detail = (
            "vLLM has built drafts under the target's quant config (vllm#49133, vllm#44087): a draft without its own "
            "quantization_config loads as BF16 in 0.33, but check acceptance after upgrades."
        )
    yield {"method": method, "detail": detail}
