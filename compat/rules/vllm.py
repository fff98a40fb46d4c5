"""vLLM specifics: its model runner, its batched-token budget for DFlash, and DFlash's context K/V projection."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.fixes import convert_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    BLOCK_DRAFTERS,
    Values,
    rule,
)
from specpair.compat.stacks import FLOAT_LAYOUTS


@rule(
    "vllm.runner",
    "info",
    ("vllm",),
    BLOCK_DRAFTERS,
    title="Drafters that only vLLM's V2 model runner serves correctly.",
    message='{draft} {why}: vLLM serves it only with the V2 model runner (the default in 0.33); VLLM_USE_V2_MODEL_RUNNER=0 refuses it ("Model Runner V1 does not support ...").',
    example={"why": "mixes sliding and full attention layers"},
)
def _vllm_runner(p: Pair, stack: str) -> Iterable[Values]:
    kinds = set(p.draft.shapes.layer_types)
    if p.kind_row.own_keys:
        yield {"why": "is a DFlash2 drafter with a candidate selector"}
    elif {"sliding", "full"} <= kinds:
        yield {"why": "mixes sliding and full attention layers"}


@rule(
    "vllm.token_budget",
    "info",
    ("vllm",),
    BLOCK_DRAFTERS,
    title="vLLM's batched-token budget covers max_num_seqs x block tokens per decode step.",
    message="A DFlash decode step runs max_num_seqs x {block} tokens in one unchunkable pass: with vLLM's defaults (256 sequences, 2048 batched tokens) that overflows and crashes (vllm#53970); the launch line sets --max-num-seqs and --max-num-batched-tokens to fit.",
    example={"block": 16},
)
def _token_budget(p: Pair, stack: str) -> Iterable[Values]:
    yield {"block": p.block_size}


@rule(
    "vllm.quantized_context_kv",
    "error",
    ("vllm",),
    BLOCK_DRAFTERS,
    title="A DFlash drafter's attention weights are unquantized, as vLLM's context K/V projection reads them.",
    message="{draft} keeps its attention weights in {layouts}: vLLM's DFlash projects the target's context into the "
    "drafter's K/V with the raw qkv_proj weight (qwen3_dflash.py _build_context_kv_buffers, F.linear past the "
    "quantization method), so it fails at start-up on a dtype mismatch or a missing weight, or where the dtypes agree "
    "drops the scales silently (vllm#51581; fixes not merged as of 2026-09).",
    example={"layouts": "fp8"},
    fix=lambda p, stack: convert_command(p.draft, stack, "draft"),
)
def _quantized_context_kv(p: Pair, stack: str) -> Iterable[Values]:
    layouts = sorted({g.layout for g in p.draft.groups if g.group == "attention"} - FLOAT_LAYOUTS)
    if layouts:
        yield {"layouts": ", ".join(layouts)}
