"""Regenerate the built-in catalog (catalog/*.json) from the facts in ../shared. Dev tool, not packaged.

    python tools/build_catalog.py [--shared DIR]

Targets: specpair's own config parser (`checkpoint.hf.build`) runs on the config.json copies in
shared/real-configs. Drafters: the same parser runs on config dicts reconstructed here from the tables
in shared/spec/dflash.md (no verbatim drafter config.json was found). No tensor header of these repos
was read, so the tensor list is derived from config shapes by per-family parameter formulas, stored
in the layout the checkpoint's quantization config implies, and handed to the parser as if it were
a header: groups, MTP size and embedding rows then come out of the same code as for a real repo.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import translate
from functools import partial
from pathlib import Path
from typing import Any

from specpair.checkpoint import Checkpoint, Shapes
from specpair.checkpoint.hf import HFMetadata, build
from specpair.checkpoint.tokenizer import Tokenizer
from specpair.formats import TensorInfo
from specpair.sources.catalog import SCHEMA, file_name

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHARED = REPO_ROOT.parent / "shared"
CATALOG_DIR = REPO_ROOT / "catalog"
DERIVED = "derived from config shapes"  # TensorInfo.file of every derived tensor

QWEN3_5_FAMILIES = ("qwen3_5", "qwen3_5_moe")
GATED_ATTENTION_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")  # q_proj emits query + output gate per head

# targets.md §5. bos/eos/pad of Qwen3.5/3.6 are generation_config's; Qwen3's are config.json's.
QWEN3_TOKENIZER = dict(length=151669, family="qwen3", bos_id=151643, eos_ids=[151645], pad_id=None)
QWEN3_5_TOKENIZER = dict(length=248077, family="qwen3_5", bos_id=248044, eos_ids=[248046, 248044], pad_id=248044)

AIC = "ai-dynamo/aiconfigurator"


# ---------------------------------------------------------------------------------------------------
# Parameter formulas: every tensor of a checkpoint as (name, shape), from the parsed config shapes.

@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    linear: bool = False  # an nn.Linear weight [out, in]: what a quantizer may convert


def linear(module: str, out_features: int, in_features: int) -> Param:
    return Param(f"{module}.weight", (out_features, in_features), linear=True)


def linear_with_bias(module: str, out_features: int, in_features: int) -> list[Param]:
    return [linear(module, out_features, in_features), Param(f"{module}.bias", (out_features,))]


def attention(p: str, s: Shapes, gated: bool) -> list[Param]:
    h, d = s.hidden_size, s.head_dim
    query_rows = s.num_heads * d * (2 if gated else 1)
    return [
        linear(f"{p}self_attn.q_proj", query_rows, h),
        linear(f"{p}self_attn.k_proj", s.num_kv_heads * d, h),
        linear(f"{p}self_attn.v_proj", s.num_kv_heads * d, h),
        linear(f"{p}self_attn.o_proj", h, s.num_heads * d),
        Param(f"{p}self_attn.q_norm.weight", (d,)),
        Param(f"{p}self_attn.k_norm.weight", (d,)),
    ]


def gated_deltanet(p: str, s: Shapes, fused: bool) -> list[Param]:
    """Qwen3.5 stores separate in_proj_qkv/z/a/b; Qwen3-Next fuses them into in_proj_qkvz and in_proj_ba."""
    h, heads_v = s.hidden_size, s.linear_value_heads
    keys, values = s.linear_key_heads * s.linear_key_head_dim, heads_v * s.linear_value_head_dim
    conv_channels = 2 * keys + values  # the depthwise conv covers q, k and v only
    if fused:
        projections = [linear(f"{p}linear_attn.in_proj_qkvz", 2 * keys + 2 * values, h),
                       linear(f"{p}linear_attn.in_proj_ba", 2 * heads_v, h)]
    else:
        projections = [linear(f"{p}linear_attn.in_proj_qkv", conv_channels, h),
                       linear(f"{p}linear_attn.in_proj_z", values, h),
                       linear(f"{p}linear_attn.in_proj_b", heads_v, h),
                       linear(f"{p}linear_attn.in_proj_a", heads_v, h)]
    return projections + [
        Param(f"{p}linear_attn.conv1d.weight", (conv_channels, 1, s.linear_conv_kernel)),
        Param(f"{p}linear_attn.A_log", (heads_v,)),
        Param(f"{p}linear_attn.dt_bias", (heads_v,)),
        Param(f"{p}linear_attn.norm.weight", (s.linear_value_head_dim,)),
        linear(f"{p}linear_attn.out_proj", h, values),
    ]


def swiglu(p: str, hidden: int, width: int) -> list[Param]:
    return [linear(f"{p}gate_proj", width, hidden), linear(f"{p}up_proj", width, hidden),
            linear(f"{p}down_proj", hidden, width)]


def moe(p: str, s: Shapes, fused_experts: bool, router_is_linear: bool) -> list[Param]:
    h, n, width = s.hidden_size, s.num_experts, s.moe_intermediate_size
    params = [Param(f"{p}mlp.gate.weight", (n, h), linear=router_is_linear)]
    if fused_experts:  # BF16 Qwen3.5 MoE repos: one 3-D tensor per projection, gate rows first (targets.md §4)
        params += [Param(f"{p}mlp.experts.gate_up_proj", (n, 2 * width, h)),
                   Param(f"{p}mlp.experts.down_proj", (n, h, width))]
    else:
        for e in range(n):
            params += swiglu(f"{p}mlp.experts.{e}.", h, width)
    if s.shared_expert_intermediate_size:
        params += swiglu(f"{p}mlp.shared_expert.", h, s.shared_expert_intermediate_size)
        params.append(linear(f"{p}mlp.shared_expert_gate", 1, h))
    return params


def decoder_layer(p: str, family: str, s: Shapes, kind: str, fused_experts: bool) -> list[Param]:
    h = s.hidden_size
    params = [Param(f"{p}input_layernorm.weight", (h,)), Param(f"{p}post_attention_layernorm.weight", (h,))]
    if kind == "linear":
        params += gated_deltanet(p, s, fused=family == "qwen3_next")
    else:
        params += attention(p, s, gated=family in GATED_ATTENTION_FAMILIES)
    if s.num_experts:
        # Qwen3.5's router is a custom module, not an nn.Linear, so ModelOpt never converts it.
        params += moe(p, s, fused_experts, router_is_linear=family not in QWEN3_5_FAMILIES)
    else:
        params += swiglu(f"{p}mlp.", h, s.intermediate_size)
    return params


def language_model(family: str, s: Shapes, fused_experts: bool) -> list[Param]:
    prefix = "model.language_model." if family in QWEN3_5_FAMILIES else "model."
    params = [Param(f"{prefix}embed_tokens.weight", (s.vocab_size, s.hidden_size))]
    for i, kind in enumerate(s.layer_types):
        params += decoder_layer(f"{prefix}layers.{i}.", family, s, kind, fused_experts)
    params.append(Param(f"{prefix}norm.weight", (s.hidden_size,)))
    if not s.tie_word_embeddings:
        params.append(linear("lm_head", s.vocab_size, s.hidden_size))
    return params


def mtp_head(family: str, s: Shapes, layers: int) -> list[Param]:
    """Qwen3.5 MTP: fc over [embedding, hidden], three norms, full-attention layers with the target's MLP.

    Its experts are counted per expert: the tensor count quoted for the BF16 35B-A3B repo matches
    that and not fused MTP experts (targets.md §4, inferred).
    """
    h = s.hidden_size
    params = [linear("mtp.fc", h, 2 * h)]
    params += [Param(f"mtp.{norm}.weight", (h,)) for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")]
    for i in range(layers):
        params += decoder_layer(f"mtp.layers.{i}.", family, s, "full", fused_experts=False)
    return params


def vision_tower(v: dict[str, Any]) -> list[Param]:
    """Qwen3.5 ViT: 3-D patch embedding, learned positions, pre-norm blocks, 2x2 patch merger."""
    if v.get("deepstack_visual_indexes"):
        raise ValueError("deepstack vision mergers have no formula here")
    h, width, p = v["hidden_size"], v["intermediate_size"], "model.visual."
    patch = (h, v["in_channels"], v["temporal_patch_size"], v["patch_size"], v["patch_size"])
    merged = h * v["spatial_merge_size"] ** 2
    params = [Param(f"{p}patch_embed.proj.weight", patch), Param(f"{p}patch_embed.proj.bias", (h,)),
              Param(f"{p}pos_embed.weight", (v["num_position_embeddings"], h))]
    for i in range(v["depth"]):
        b = f"{p}blocks.{i}."
        params += [Param(f"{b}{norm}.{part}", (h,)) for norm in ("norm1", "norm2") for part in ("weight", "bias")]
        params += linear_with_bias(f"{b}attn.qkv", 3 * h, h) + linear_with_bias(f"{b}attn.proj", h, h)
        params += linear_with_bias(f"{b}mlp.linear_fc1", width, h) + linear_with_bias(f"{b}mlp.linear_fc2", h, width)
    params += [Param(f"{p}merger.norm.weight", (h,)), Param(f"{p}merger.norm.bias", (h,))]
    params += linear_with_bias(f"{p}merger.linear_fc1", merged, merged)
    params += linear_with_bias(f"{p}merger.linear_fc2", v["out_hidden_size"], merged)
    return params


def dflash_drafter(ck: Checkpoint, target_hidden: int) -> list[Param]:
    """DFlash / DFlash2 drafter tensors (dflash.md §2): no embedding, no lm_head (the target's are used)."""
    s, d = ck.shapes, ck.drafter
    h = s.hidden_size
    params = [linear("fc", h, len(d.taps.raw) * target_hidden), Param("hidden_norm.weight", (h,))]
    for i in range(s.num_layers):
        p = f"layers.{i}."
        params += [Param(f"{p}input_layernorm.weight", (h,)), Param(f"{p}post_attention_layernorm.weight", (h,))]
        params += attention(p, s, gated=False) + swiglu(f"{p}mlp.", h, s.intermediate_size)
        if d.kind == "dflash2":
            groups = h // d.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                params += [Param(f"{p}{conv}.base_kernel", (2, d.conv_kernel_size, h)),
                           linear(f"{p}{conv}.kernel_projection", 2 * d.conv_kernel_size * groups, h)]
    params.append(Param("norm.weight", (h,)))
    if d.kind == "dflash2":
        params += [linear("candidate_selector.hidden_projection", d.selector_rank, h),
                   Param("candidate_selector.predecessor_codebook", (s.vocab_size, d.selector_rank)),
                   Param("candidate_selector.successor_codebook", (s.vocab_size, d.selector_rank))]
    return params


# ---------------------------------------------------------------------------------------------------
# Storage: the tensors one parameter becomes under a quantization scheme (formats.md §2.1, §4).

Storage = Callable[[Param], list[TensorInfo]]


def _tensor(name: str, dtype: str, shape: tuple[int, ...], bytes_per_element: float) -> TensorInfo:
    return TensorInfo(name, dtype, shape, int(math.prod(shape) * bytes_per_element), DERIVED)


def bf16(p: Param) -> list[TensorInfo]:
    return [_tensor(p.name, "BF16", p.shape, 2)]


def fp8_block(p: Param, block: tuple[int, int]) -> list[TensorInfo]:
    """Qwen FP8: E4M3 weight and one scale per block (BF16 in Qwen's repos, HabanaAI/vllm-fork#2141)."""
    rows, cols = p.shape
    scales = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    module = p.name.removesuffix(".weight")
    return [_tensor(p.name, "F8_E4M3", p.shape, 1), _tensor(f"{module}.weight_scale_inv", "BF16", scales, 2)]


def fp8_tensor(p: Param) -> list[TensorInfo]:
    module = p.name.removesuffix(".weight")
    return [_tensor(p.name, "F8_E4M3", p.shape, 1), _tensor(f"{module}.weight_scale", "F32", (), 4),
            _tensor(f"{module}.input_scale", "F32", (), 4)]


def nvfp4(p: Param, activation_scale: bool) -> list[TensorInfo]:
    """ModelOpt NVFP4: packed E2M1 pairs, an E4M3 scale per 16 inputs, an F32 global (+ input) scale."""
    rows, cols = p.shape
    module = p.name.removesuffix(".weight")
    tensors = [_tensor(p.name, "U8", (rows, cols // 2), 1),
               _tensor(f"{module}.weight_scale", "F8_E4M3", (rows, cols // 16), 1),
               _tensor(f"{module}.weight_scale_2", "F32", (), 4)]
    if activation_scale:  # W4A16 layers quantize weights only and store no input scale
        tensors.append(_tensor(f"{module}.input_scale", "F32", (), 4))
    return tensors


MODELOPT_STORAGE: dict[str, Storage] = {
    "FP8": fp8_tensor,
    "NVFP4": partial(nvfp4, activation_scale=True),
    "W4A16_NVFP4": partial(nvfp4, activation_scale=False),
}


def ancestors(module: str) -> list[str]:
    """'a.b.c' -> ['a.b.c', 'a.b', 'a']: a quantized or excluded module covers everything below it."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def quantization_scheme(config: dict[str, Any], quant_files: dict[str, Any]) -> Callable[[str], Storage]:
    """Storage of each Linear module, decided by the checkpoint's own quantization files."""
    if "hf_quant_config.json" in quant_files:
        q = quant_files["hf_quant_config.json"]["quantization"]
        excluded = re.compile("|".join(translate(p) for p in q.get("exclude_modules", [])) or r"(?!)")
        layers = q.get("quantized_layers")

        def modelopt(module: str) -> Storage:
            if excluded.match(module):
                return bf16
            if layers is None:
                return MODELOPT_STORAGE[q["quant_algo"]]
            algo = next((layers[m]["quant_algo"] for m in ancestors(module) if m in layers), None)
            return MODELOPT_STORAGE[algo] if algo else bf16

        return modelopt
    qc = config.get("quantization_config")
    if not qc:
        return lambda module: bf16
    if qc.get("quant_method") != "fp8":
        raise ValueError(f"no storage rule for quant_method {qc.get('quant_method')!r}")
    keep = set(qc.get("modules_to_not_convert") or [])
    converted = partial(fp8_block, block=tuple(qc["weight_block_size"]))
    return lambda module: bf16 if any(m in keep for m in ancestors(module)) else converted


def derived_tensors(ck: Checkpoint, config: dict[str, Any], quant_files: dict[str, Any],
                    target_hidden: int | None) -> list[TensorInfo]:
    if ck.drafter:
        params = dflash_drafter(ck, target_hidden)
    else:
        # Quantized exports unstack experts per expert (formats.md §1); BF16 Qwen3.5 repos keep them fused.
        quantized = ck.quantization is not None
        params = language_model(ck.family, ck.shapes, fused_experts=ck.family == "qwen3_5_moe" and not quantized)
        if ck.mtp:
            params += mtp_head(ck.family, ck.shapes, ck.mtp.layers)
        if "vision_config" in config:
            params += vision_tower(config["vision_config"])
    storage_of = quantization_scheme(config, quant_files)
    tensors = []
    for p in params:
        tensors += storage_of(p.name.removesuffix(".weight"))(p) if p.linear else bf16(p)
    return tensors


# ---------------------------------------------------------------------------------------------------
# Entries.

@dataclass(frozen=True)
class Target:
    repo: str
    config_copy: str  # stem of the files in shared/real-configs
    revision: str | None = None
    reconstructed_from_quantized: bool = False  # BF16 repo rebuilt from a quantized copy's config
    note: str = ""  # more provenance


@dataclass(frozen=True)
class Drafter:
    repo: str
    target: str  # catalog target the drafter is built for: its hidden size, vocabulary rows, context
    architecture: str
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    sliding_layers: int
    window: int | None
    taps: list[int]
    mask_token_id: int | None
    block_size: int
    sources: str
    assumed: list[str]
    revision: str | None = None
    revision_source: str = ""
    rope_theta: float = 1e7
    num_target_layers: int | None = None
    is_causal: bool | None = None
    legacy_top_level: bool = False  # block_size and rope_theta at top level (the pre-June z-lab schema)
    auto_map: bool = False  # z-lab v1 drafters name their remote code (dflash.md §1.1)
    extra: dict[str, int] = field(default_factory=dict)  # DFlash2 dflash_config keys


TARGETS = [
    Target("Qwen/Qwen3-0.6B", "Qwen__Qwen3-0.6B"),
    Target("Qwen/Qwen3-1.7B", "Qwen__Qwen3-1.7B"),
    Target("Qwen/Qwen3-8B", "Qwen__Qwen3-8B"),
    Target("Qwen/Qwen3-32B", "Qwen__Qwen3-32B"),
    Target("Qwen/Qwen3-30B-A3B", "Qwen__Qwen3-30B-A3B"),
    Target("Qwen/Qwen3-30B-A3B-FP8", "Qwen__Qwen3-30B-A3B-FP8"),
    Target("Qwen/Qwen3-235B-A22B", "Qwen__Qwen3-235B-A22B"),
    Target("Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen__Qwen3-Next-80B-A3B-Thinking"),
    Target("Qwen/Qwen3.5-27B", "Qwen__Qwen3.5-27B"),
    Target("Qwen/Qwen3.5-35B-A3B", "Qwen__Qwen3.5-35B-A3B"),
    Target("Qwen/Qwen3.5-122B-A10B", "Qwen__Qwen3.5-122B-A10B"),
    Target("Qwen/Qwen3.5-397B-A17B", "Qwen__Qwen3.5-397B-A17B"),
    Target("nvidia/Qwen3.5-122B-A10B-NVFP4", "nvidia__Qwen3.5-122B-A10B-NVFP4"),
    Target("nvidia/Qwen3.6-27B-NVFP4", "nvidia__Qwen3.6-27B-NVFP4"),
    Target("nvidia/Qwen3.6-35B-A3B-NVFP4", "nvidia__Qwen3.6-35B-A3B-NVFP4", revision="1355db6",
           note="Revision 1355db6 is the one TensorFold's README names for this repo (tensorfold.md §2.1: "
                "ModelOpt 0.44, MIXED_PRECISION, as this hf_quant_config.json's producer); the copies record none."),
    Target("Qwen/Qwen3.6-35B-A3B", "nvidia__Qwen3.6-35B-A3B-NVFP4", reconstructed_from_quantized=True,
           note="A third-party inventory of HF snapshot 7da1103 of this repo reports the same text_config values."),
    Target("Qwen/Qwen3.6-27B", "nvidia__Qwen3.6-27B-NVFP4", reconstructed_from_quantized=True),
]

DFLASH2_SELECTOR = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
TARGET_CONTEXT = "max_position_embeddings (the target's)"
FULL_LAYER_LAST = "the full-attention layer being the last one"

DRAFTERS = [
    Drafter("z-lab/Qwen3.5-122B-A10B-DFlash", "Qwen/Qwen3.5-122B-A10B", "DFlashDraftModel",
            layers=6, heads=32, kv_heads=8, intermediate=9216, sliding_layers=5, window=4096,
            taps=[1, 7, 14, 20, 26, 32, 39, 45], mask_token_id=248077, block_size=16, auto_map=True,
            sources="SGLang's test table (test_dflash_checkpoint_config_layouts) and a C++ fixture of the "
                    "trimmed config.json, as quoted in dflash.md §1.3",
            assumed=[FULL_LAYER_LAST, "block_size inside dflash_config", TARGET_CONTEXT]),
    Drafter("z-lab/Qwen3.6-35B-A3B-DFlash", "Qwen/Qwen3.6-35B-A3B", "DFlashDraftModel",
            layers=6, heads=32, kv_heads=8, intermediate=6144, sliding_layers=5, window=4096,
            taps=[1, 6, 11, 16, 22, 27, 32, 37], mask_token_id=248077, block_size=16, num_target_layers=41,
            auto_map=True, revision="c69b185",
            revision_source="the June 2026 revision (Jun 18-19); f181eec is reported with the same layout",
            sources="third-party test fixtures and SGLang's test table, as quoted in targets.md §8 and "
                    "dflash.md §1.3",
            assumed=[FULL_LAYER_LAST, TARGET_CONTEXT]),
    Drafter("z-lab/Qwen3.6-35B-A3B-DFlash", "Qwen/Qwen3.6-35B-A3B", "DFlashDraftModel",
            layers=8, heads=32, kv_heads=4, intermediate=6144, sliding_layers=0, window=None,
            taps=[1, 10, 19, 28, 37], mask_token_id=248070, block_size=16, num_target_layers=41,
            legacy_top_level=True, auto_map=True, revision="42d3b34",
            revision_source="the legacy revision (May 2026 or earlier)",
            sources="third-party test fixtures quoted in targets.md §8 and dflash.md §1.3; the model card "
                    "states 0.5B parameters in BF16",
            assumed=["rope_theta 1e7 at top level (the June revision is described as moving rope into "
                     "rope_parameters)", "target_layer_ids and mask_token_id inside dflash_config", TARGET_CONTEXT]),
    Drafter("z-lab/Qwen3.5-35B-A3B-DFlash", "Qwen/Qwen3.5-35B-A3B", "DFlashDraftModel",
            layers=6, heads=32, kv_heads=8, intermediate=6144, sliding_layers=5, window=4096,
            taps=[1, 6, 11, 16, 22, 27, 32, 37], mask_token_id=248077, block_size=16, num_target_layers=41,
            auto_map=True,
            sources="the dflash.md §1.3 row of the z-lab 35B-A3B draft, which names both the Qwen3.5 and "
                    "the Qwen3.6 35B-A3B targets",
            assumed=["the whole layout, taken equal to z-lab/Qwen3.6-35B-A3B-DFlash at c69b185",
                     FULL_LAYER_LAST, TARGET_CONTEXT]),
    Drafter("z-lab/Qwen3.5-27B-DFlash", "Qwen/Qwen3.5-27B", "DFlashDraftModel",
            layers=5, heads=32, kv_heads=8, intermediate=17408, sliding_layers=4, window=2048,
            taps=[1, 16, 31, 46, 61], mask_token_id=248070, block_size=16, auto_map=True,
            sources="the 64-layer (27B) layout in SGLang's DFlash tests (dflash.md §1.3); hidden size 5120 "
                    "from the target, which every stack requires a DFlash drafter to match",
            assumed=["heads 32:8 and intermediate_size 17408 (as z-lab/Qwen3.8-27B-DFlash2)", FULL_LAYER_LAST,
                     "block_size inside dflash_config", TARGET_CONTEXT]),
    Drafter("z-lab/Qwen3.8-27B-DFlash2", "Qwen/Qwen3.6-27B", "DFlash2DraftModel",
            layers=5, heads=32, kv_heads=8, intermediate=17408, sliding_layers=5, window=2048,
            taps=[5, 19, 33, 47, 61], mask_token_id=248070, block_size=8, is_causal=False, extra=DFLASH2_SELECTOR,
            sources="a third-party DFlash2 test quoting its config.json (2026-10-05; 1.924B parameters), as "
                    "summarized in dflash.md §1.3; TensorFold's Zig engine hard-codes the same hidden size, "
                    "layers, heads, taps, mask id and window (tensorfold.md §3.3)",
            assumed=["conv_kernel_size 2, conv_group_size 16, selector_rank 256, selector_top_k 16 (the values "
                     "of every DFlash2 checkpoint seen, dflash.md §1.2)",
                     "vocabulary rows and context of its 64-layer Qwen3.8-27B target, taken from Qwen/Qwen3.6-27B"]),
    Drafter("chutesai/Qwen3-32B-FP8-DFLASH", "Qwen/Qwen3-32B", "DFlashDraftModel",
            layers=5, heads=32, kv_heads=8, intermediate=9728, sliding_layers=0, window=None,
            taps=[1, 16, 31, 46, 61], mask_token_id=None, block_size=16, rope_theta=1e6,
            sources="the chutesai/Qwen3-32B-FP8-DFLASH model card (dflash.md §1.3); no mask_token_id is "
                    "recorded, so none is set",
            assumed=["layer_types (all full attention)", "rope_theta 1e6 (the Qwen3-32B target's)",
                     "the generic keys, as a z-lab drafter has them",
                     "target_layer_ids and block_size inside dflash_config", TARGET_CONTEXT]),
]


def drafter_config(d: Drafter, target: Checkpoint) -> dict[str, Any]:
    """A Qwen3Config-shaped DFlash config.json (dflash.md §1.1-1.2) with the values the sources give."""
    layer_types = ["sliding_attention"] * d.sliding_layers + ["full_attention"] * (d.layers - d.sliding_layers)
    config: dict[str, Any] = {
        "architectures": [d.architecture], "model_type": "qwen3", "dtype": "bfloat16",
        "hidden_size": target.shapes.hidden_size, "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads,
        "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False,
        "vocab_size": target.shapes.rows, "max_position_embeddings": target.rope.max_position_embeddings,
        "tie_word_embeddings": False, "layer_types": layer_types,
        "sliding_window": d.window if d.sliding_layers else None,
    }
    dflash: dict[str, Any] = {"target_layer_ids": d.taps}
    if d.mask_token_id is not None:
        dflash["mask_token_id"] = d.mask_token_id
    if d.legacy_top_level:
        config["rope_theta"] = d.rope_theta
        config["block_size"] = d.block_size
    else:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": d.rope_theta}
        dflash["block_size"] = d.block_size
    config["dflash_config"] = dflash | d.extra
    if d.num_target_layers is not None:
        config["num_target_layers"] = d.num_target_layers
    if d.is_causal is not None:
        config["is_causal"] = d.is_causal
    if d.auto_map:
        config["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    return config


def build_checkpoint(repo: str, config: dict[str, Any], quant_files: dict[str, Any], revision: str | None,
                     target_hidden: int | None = None) -> Checkpoint:
    """Parse the config with specpair's parser, then again with the derived tensor list as its header."""
    meta = HFMetadata(config=config, config_where=f"{repo}/config.json (catalog)", quant_files=quant_files)
    parsed = build(meta, ref=repo, source="catalog", revision=revision)
    if not parsed.drafter:  # DFlash drafters ship no tokenizer
        facts = QWEN3_5_TOKENIZER if parsed.family in QWEN3_5_FAMILIES else QWEN3_TOKENIZER
        meta.tokenizer = Tokenizer(source="catalog", **facts)
    meta.tensors = derived_tensors(parsed, config, quant_files, target_hidden)
    return build(meta, ref=repo, source="catalog", revision=revision)


def build_target(t: Target, real_configs: Path) -> Checkpoint:
    config = json.loads((real_configs / f"{t.config_copy}.json").read_text("utf-8"))
    quant_path = real_configs / f"{t.config_copy}.hf_quant_config.json"
    quant_files = {"hf_quant_config.json": json.loads(quant_path.read_text("utf-8"))} if quant_path.exists() else {}
    if t.reconstructed_from_quantized:
        config = {k: v for k, v in config.items() if k != "quantization_config"}
        quant_files = {}
        copy = t.config_copy.replace("__", "/")
        origin = (f"Reconstructed from {copy}'s config, revision not recorded. Its text_config and "
                  f"vision_config were parsed from the config.json copy of {copy} ({AIC}) with "
                  f"quantization_config dropped: no verbatim config of this BF16 repo was found (targets.md §2.1).")
    else:
        copies = "config.json and hf_quant_config.json copies" if quant_files else "config.json copy"
        pinned = f"revision {t.revision} per TensorFold" if t.revision else "revision not recorded"
        origin = f"Config copy ({AIC}), {pinned}. Parsed from the {copies} in shared/real-configs."
    checkpoint = build_checkpoint(t.repo, config, quant_files, t.revision)
    sentences = [origin, t.note, size_sentence(checkpoint, config, quant_files), TOKENIZER_SENTENCE]
    checkpoint.provenance = " ".join(s for s in sentences if s)
    return checkpoint


TOKENIZER_SENTENCE = ("Tokenizer length and bos/eos/pad ids from targets.md §5; no tokenizer.json was read, "
                      "so there is no fingerprint.")


def size_sentence(ck: Checkpoint, config: dict[str, Any], quant_files: dict[str, Any]) -> str:
    parts = ["Sizes derived from config shapes with per-family parameter formulas, not read from tensor headers"]
    if "hf_quant_config.json" in quant_files:
        parts.append("layouts per hf_quant_config.json (FP8 per-tensor and NVFP4 group-16 modules as listed, "
                     "everything else BF16, experts stored per expert; kv-cache scale tensors not counted)")
    elif ck.quantization:
        parts.append("Linear weights FP8 E4M3 with one BF16 scale per 128x128 block, modules_to_not_convert "
                     "and non-Linear tensors BF16 (scale dtype as reported for Qwen3 FP8 repos)")
    else:
        parts.append("all tensors BF16" + (", routed experts fused 3-D" if ck.family == "qwen3_5_moe" else ""))
    if ck.mtp:
        experts = " with per-expert experts (inferred, targets.md §4)" if ck.shapes.num_experts else ""
        parts.append(f"MTP head in BF16{experts}")
    if ck.family == "qwen3_next":
        parts.append("the mtp.* tensors this repo ships are not declared by its config and not counted")
    if "vision_config" in config:
        parts.append("vision tower from vision_config")
    return "; ".join(parts) + "."


GENERIC_KEYS = ("Generic keys (head_dim 128, hidden_act silu, rms_norm_eps 1e-6, attention_bias false, untied, "
                "BF16, vocab_size = the target's embedding rows) as dflash.md §1.1 describes z-lab DFlash drafters.")


def build_drafter(d: Drafter, target: Checkpoint) -> Checkpoint:
    revision = f"revision {d.revision}. It is {d.revision_source}" if d.revision else "revision not recorded"
    provenance = (f"Reconstructed from secondary sources, {revision}. No config.json of this repo was seen: "
                  f"values from {d.sources}. {GENERIC_KEYS} Assumed, not sourced: {'; '.join(d.assumed)}. "
                  f"Sizes derived from config shapes, not read from tensor headers: BF16, no embedding or lm_head "
                  f"(the target's are used), fc input = taps x the target's hidden size {target.shapes.hidden_size}.")
    checkpoint = build_checkpoint(d.repo, drafter_config(d, target), {}, d.revision, target.shapes.hidden_size)
    checkpoint.provenance = provenance
    return checkpoint


def render(shared: Path) -> dict[str, str]:
    """File name -> JSON text of every catalog file, each repo's default (newest) entry first."""
    by_repo: dict[str, list[Checkpoint]] = {}
    targets = {}
    for t in TARGETS:
        targets[t.repo] = build_target(t, shared / "real-configs")
        by_repo.setdefault(t.repo, []).append(targets[t.repo])
    for d in DRAFTERS:
        by_repo.setdefault(d.repo, []).append(build_drafter(d, targets[d.target]))
    return {
        file_name(repo): json.dumps({"schema": SCHEMA, "repo": repo, "entries": [c.to_json() for c in entries]},
                                    indent=1, ensure_ascii=False) + "\n"
        for repo, entries in by_repo.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=DEFAULT_SHARED, help="the shared/ folder (default: %(default)s)")
    args = parser.parse_args()
    files = render(args.shared)
    for stale in CATALOG_DIR.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        (CATALOG_DIR / name).write_text(text, "utf-8")
    sys.stdout.write(f"wrote {len(files)} files to {CATALOG_DIR}\n")


if __name__ == "__main__":
    main()
