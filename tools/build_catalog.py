"""Regenerate the built-in catalog (catalog/*.json) from catalog/sources/ and the facts below. Dev tool, not packaged.

    python tools/build_catalog.py

Targets: specpair's own config parser (`checkpoint.hf.build`) runs on the config.json copies in
catalog/sources/real-configs. Drafters: the same parser runs on config dicts reconstructed here from
published tables and model cards (no verbatim drafter config.json was found). No tensor header of these repos
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
from specpair.checkpoint.families import FAMILIES
from specpair.checkpoint.hf import HFMetadata, build
from specpair.checkpoint.tokenizer import Tokenizer
from specpair.formats import TensorInfo
from specpair.sources.catalog import SCHEMA, file_name

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_CONFIGS = REPO_ROOT / "catalog" / "sources" / "real-configs"
CATALOG_DIR = REPO_ROOT / "catalog"
DERIVED = "derived from config shapes"  # TensorInfo.file of every derived tensor

QWEN3_5_FAMILIES = tuple(f.name for f in FAMILIES.values() if f.hf_prefix == "model.language_model.")

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
        projections = [
            linear(f"{p}linear_attn.in_proj_qkvz", 2 * keys + 2 * values, h),
            linear(f"{p}linear_attn.in_proj_ba", 2 * heads_v, h),
        ]
    else:
        projections = [
            linear(f"{p}linear_attn.in_proj_qkv", conv_channels, h),
            linear(f"{p}linear_attn.in_proj_z", values, h),
            linear(f"{p}linear_attn.in_proj_b", heads_v, h),
            linear(f"{p}linear_attn.in_proj_a", heads_v, h),
        ]
    return projections + [
        Param(f"{p}linear_attn.conv1d.weight", (conv_channels, 1, s.linear_conv_kernel)),
        Param(f"{p}linear_attn.A_log", (heads_v,)),
        Param(f"{p}linear_attn.dt_bias", (heads_v,)),
        Param(f"{p}linear_attn.norm.weight", (s.linear_value_head_dim,)),
        linear(f"{p}linear_attn.out_proj", h, values),
    ]


def swiglu(p: str, hidden: int, width: int) -> list[Param]:
    return [
        linear(f"{p}gate_proj", width, hidden),
        linear(f"{p}up_proj", width, hidden),
        linear(f"{p}down_proj", hidden, width),
    ]


def moe(p: str, s: Shapes, fused_experts: bool, router_is_linear: bool) -> list[Param]:
    h, n, width = s.hidden_size, s.num_experts, s.moe_intermediate_size
    params = [Param(f"{p}mlp.gate.weight", (n, h), linear=router_is_linear)]
    if fused_experts:  # BF16 Qwen3.5 MoE repos: one 3-D tensor per projection, gate rows first (targets.md §4)
        params += [
            Param(f"{p}mlp.experts.gate_up_proj", (n, 2 * width, h)),
            Param(f"{p}mlp.experts.down_proj", (n, h, width)),
        ]
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
        params += gated_deltanet(p, s, fused=FAMILIES[family].linear_attention == "fused")
    else:
        params += attention(p, s, gated=FAMILIES[family].gated_attention)  # q_proj emits query + output gate
    if s.num_experts:
        # Qwen3.5's router is a custom module, not an nn.Linear, so ModelOpt never converts it.
        params += moe(p, s, fused_experts, router_is_linear=family not in QWEN3_5_FAMILIES)
    else:
        params += swiglu(f"{p}mlp.", h, s.intermediate_size)
    return params


def language_model(family: str, s: Shapes, fused_experts: bool) -> list[Param]:
    prefix = FAMILIES[family].hf_prefix
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
    params = [
        Param(f"{p}patch_embed.proj.weight", patch),
        Param(f"{p}patch_embed.proj.bias", (h,)),
        Param(f"{p}pos_embed.weight", (v["num_position_embeddings"], h)),
    ]
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
                params += [
                    Param(f"{p}{conv}.base_kernel", (2, d.conv_kernel_size, h)),
                    linear(f"{p}{conv}.kernel_projection", 2 * d.conv_kernel_size * groups, h),
                ]
    params.append(Param("norm.weight", (h,)))
    if d.kind == "dflash2":
        params += [
            linear("candidate_selector.hidden_projection", d.selector_rank, h),
            Param("candidate_selector.predecessor_codebook", (s.vocab_size, d.selector_rank)),
            Param("candidate_selector.successor_codebook", (s.vocab_size, d.selector_rank)),
        ]
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
    return [
        _tensor(p.name, "F8_E4M3", p.shape, 1),
        _tensor(f"{module}.weight_scale", "F32", (), 4),
        _tensor(f"{module}.input_scale", "F32", (), 4),
    ]


def nvfp4(p: Param, activation_scale: bool) -> list[TensorInfo]:
    """ModelOpt NVFP4: packed E2M1 pairs, an E4M3 scale per 16 inputs, an F32 global (+ input) scale."""
    rows, cols = p.shape
    module = p.name.removesuffix(".weight")
    tensors = [
        _tensor(p.name, "U8", (rows, cols // 2), 1),
        _tensor(f"{module}.weight_scale", "F8_E4M3", (rows, cols // 16), 1),
        _tensor(f"{module}.weight_scale_2", "F32", (), 4),
    ]
    if activation_scale:  # W4A16 layers quantize weights only and store no input scale
        tensors.append(_tensor(f"{module}.input_scale", "F32", (), 4))
    return tensors


def exl3(p: Param, bits: float) -> list[TensorInfo]:
    """EXL3 (ExLlamaV3's trellis): the parts its codec stores for a weight of this shape (formats/exl3.py)."""
    from specpair.formats.codecs import codec, stored_nbytes

    module = p.name.removesuffix(".weight")
    return [
        TensorInfo(module + suffix, dtype, shape, stored_nbytes(dtype, shape), DERIVED)
        for suffix, (dtype, shape) in codec(f"exl3-{bits:g}bpw").stored(p.shape).items()
    ]


EXL3_KEPT = re.compile(r".*(mlp\.gate|shared_expert_gate)$|model\.visual\.")  # routers and the vision tower stay BF16


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
    exl3_config = quant_files.get("quantization_config.json")
    if exl3_config is not None:
        # Tensors are stored at whole bits: a fractional average (2.5) is a mix, here attention and fc one bit above
        bits = exl3_config["bits"]
        low, high = partial(exl3, bits=math.floor(bits)), partial(exl3, bits=math.ceil(bits))
        head = partial(exl3, bits=exl3_config["head_bits"])

        def exl3_storage(module: str) -> Storage:
            if module == "lm_head":
                return head
            if EXL3_KEPT.match(module):
                return bf16
            return high if "self_attn" in module or module.endswith("fc") else low

        return exl3_storage
    qc = config.get("quantization_config")
    if not qc:
        return lambda module: bf16
    if qc.get("quant_method") != "fp8":
        raise ValueError(f"no storage rule for quant_method {qc.get('quant_method')!r}")
    keep = set(qc.get("modules_to_not_convert") or [])
    converted = partial(fp8_block, block=tuple(qc["weight_block_size"]))
    return lambda module: bf16 if any(m in keep for m in ancestors(module)) else converted


def derived_tensors(
    ck: Checkpoint, config: dict[str, Any], quant_files: dict[str, Any], target_hidden: int | None
) -> list[TensorInfo]:
    if ck.drafter:
        params = dflash_drafter(ck, target_hidden)
    else:
        # Quantized exports unstack experts per expert (formats.md §1); BF16 Qwen3.5 repos keep them fused.
        quantized = ck.quantization is not None
        params = language_model(
            ck.family, ck.shapes, fused_experts=FAMILIES[ck.family].experts == "fused" and not quantized
        )
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
    config_copy: str  # stem of the files in catalog/sources/real-configs
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
    Target(
        "nvidia/Qwen3.6-35B-A3B-NVFP4",
        "nvidia__Qwen3.6-35B-A3B-NVFP4",
        revision="1355db6",
        note="Revision 1355db6 is the one TensorFold's README names for this repo (tensorfold.md §2.1: "
        "ModelOpt 0.44, MIXED_PRECISION, as this hf_quant_config.json's producer); the copies record none.",
    ),
    Target(
        "Qwen/Qwen3.6-35B-A3B",
        "nvidia__Qwen3.6-35B-A3B-NVFP4",
        reconstructed_from_quantized=True,
        note="A third-party inventory of HF snapshot 7da1103 of this repo reports the same text_config values.",
    ),
    Target("Qwen/Qwen3.6-27B", "nvidia__Qwen3.6-27B-NVFP4", reconstructed_from_quantized=True),
]

DFLASH2_SELECTOR = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
TARGET_CONTEXT = "max_position_embeddings (the target's)"
FULL_LAYER_LAST = "the full-attention layer being the last one"

DRAFTERS = [
    Drafter(
        "z-lab/Qwen3.5-122B-A10B-DFlash",
        "Qwen/Qwen3.5-122B-A10B",
        "DFlashDraftModel",
        layers=6,
        heads=32,
        kv_heads=8,
        intermediate=9216,
        sliding_layers=5,
        window=4096,
        taps=[1, 7, 14, 20, 26, 32, 39, 45],
        mask_token_id=248077,
        block_size=16,
        auto_map=True,
        sources="SGLang's test table (test_dflash_checkpoint_config_layouts) and a C++ fixture of the "
        "trimmed config.json, as quoted in dflash.md §1.3",
        assumed=[FULL_LAYER_LAST, "block_size inside dflash_config", TARGET_CONTEXT],
    ),
    Drafter(
        "z-lab/Qwen3.6-35B-A3B-DFlash",
        "Qwen/Qwen3.6-35B-A3B",
        "DFlashDraftModel",
        layers=6,
        heads=32,
        kv_heads=8,
        intermediate=6144,
        sliding_layers=5,
        window=4096,
        taps=[1, 6, 11, 16, 22, 27, 32, 37],
        mask_token_id=248077,
        block_size=16,
        num_target_layers=41,
        auto_map=True,
        revision="c69b185",
        revision_source="the June 2026 revision (Jun 18-19); f181eec is reported with the same layout",
        sources="third-party test fixtures and SGLang's test table, as quoted in targets.md §8 and dflash.md §1.3",
        assumed=[FULL_LAYER_LAST, TARGET_CONTEXT],
    ),
    Drafter(
        "z-lab/Qwen3.6-35B-A3B-DFlash",
        "Qwen/Qwen3.6-35B-A3B",
        "DFlashDraftModel",
        layers=8,
        heads=32,
        kv_heads=4,
        intermediate=6144,
        sliding_layers=0,
        window=None,
        taps=[1, 10, 19, 28, 37],
        mask_token_id=248070,
        block_size=16,
        num_target_layers=41,
        legacy_top_level=True,
        auto_map=True,
        revision="42d3b34",
        revision_source="the legacy revision (May 2026 or earlier)",
        sources="third-party test fixtures quoted in targets.md §8 and dflash.md §1.3; the model card "
        "states 0.5B parameters in BF16",
        assumed=[
            "rope_theta 1e7 at top level (the June revision is described as moving rope into rope_parameters)",
            "target_layer_ids and mask_token_id inside dflash_config",
            TARGET_CONTEXT,
        ],
    ),
    Drafter(
        "z-lab/Qwen3.5-35B-A3B-DFlash",
        "Qwen/Qwen3.5-35B-A3B",
        "DFlashDraftModel",
        layers=6,
        heads=32,
        kv_heads=8,
        intermediate=6144,
        sliding_layers=5,
        window=4096,
        taps=[1, 6, 11, 16, 22, 27, 32, 37],
        mask_token_id=248077,
        block_size=16,
        num_target_layers=41,
        auto_map=True,
        sources="the dflash.md §1.3 row of the z-lab 35B-A3B draft, which names both the Qwen3.5 and "
        "the Qwen3.6 35B-A3B targets",
        assumed=[
            "the whole layout, taken equal to z-lab/Qwen3.6-35B-A3B-DFlash at c69b185",
            FULL_LAYER_LAST,
            TARGET_CONTEXT,
        ],
    ),
    Drafter(
        "z-lab/Qwen3.5-27B-DFlash",
        "Qwen/Qwen3.5-27B",
        "DFlashDraftModel",
        layers=5,
        heads=32,
        kv_heads=8,
        intermediate=17408,
        sliding_layers=0,
        window=None,
        taps=[1, 16, 31, 46, 61],
        mask_token_id=248070,
        block_size=16,
        auto_map=True,
        sources="the 64-layer (27B) taps in SGLang's DFlash tests (dflash.md §1.3); every layer full attention "
        "(Luce-Org/lucebox PR #94: 3.5 layer_types all full_attention, the 4-sliding + 1-full 2048 layout being "
        "Qwen3.6-27B's; PR #129: the Qwen3.5 draft uses all full layers); hidden size 5120 from the target, which "
        "every stack requires a DFlash drafter to match",
        assumed=[
            "heads 32:8 and intermediate_size 17408 (as z-lab/Qwen3.8-27B-DFlash2)",
            "block_size inside dflash_config",
            TARGET_CONTEXT,
        ],
    ),
    Drafter(
        "z-lab/Qwen3.8-27B-DFlash2",
        "Qwen/Qwen3.6-27B",
        "DFlash2DraftModel",
        layers=5,
        heads=32,
        kv_heads=8,
        intermediate=17408,
        sliding_layers=5,
        window=2048,
        taps=[5, 19, 33, 47, 61],
        mask_token_id=248070,
        block_size=8,
        is_causal=False,
        extra=DFLASH2_SELECTOR,
        sources="a third-party DFlash2 test quoting its config.json (2026-10-05; 1.924B parameters), as "
        "summarized in dflash.md §1.3; TensorFold's Zig engine hard-codes the same hidden size, "
        "layers, heads, taps, mask id and window (tensorfold.md §3.3)",
        assumed=[
            "conv_kernel_size 2, conv_group_size 16, selector_rank 256, selector_top_k 16 (the values "
            "of every DFlash2 checkpoint seen, dflash.md §1.2)",
            "vocabulary rows and context of its 64-layer Qwen3.8-27B target, taken from Qwen/Qwen3.6-27B",
        ],
    ),
    Drafter(
        "chutesai/Qwen3-32B-FP8-DFLASH",
        "Qwen/Qwen3-32B",
        "DFlashDraftModel",
        layers=5,
        heads=32,
        kv_heads=8,
        intermediate=9728,
        sliding_layers=0,
        window=None,
        taps=[1, 16, 31, 46, 61],
        mask_token_id=None,
        block_size=16,
        rope_theta=1e6,
        sources="the chutesai/Qwen3-32B-FP8-DFLASH model card (dflash.md §1.3); no mask_token_id is "
        "recorded, so none is set",
        assumed=[
            "layer_types (all full attention)",
            "rope_theta 1e6 (the Qwen3-32B target's)",
            "the generic keys, as a z-lab drafter has them",
            "target_layer_ids and block_size inside dflash_config",
            TARGET_CONTEXT,
        ],
    ),
    Drafter(
        "incoai/Qwen3.6-35B-A3B-DFlash2",
        "Qwen/Qwen3.6-35B-A3B",
        "DFlash2DraftModel",
        layers=6,
        heads=32,
        kv_heads=8,
        intermediate=6144,
        sliding_layers=6,
        window=4096,
        taps=[1, 6, 11, 16, 22, 27, 32, 37],
        mask_token_id=248077,
        block_size=8,
        is_causal=False,
        extra=DFLASH2_SELECTOR,
        revision="51ef7b6923ad6c14cb1bb41c37a9041446496ab6",
        revision_source="the revision SGLang's DFlash recipe for nvidia/Qwen3.6-35B-A3B-NVFP4 (@1355db6a) and "
        "a GB10 measurement log name",
        sources='an SGLang deploy script and recipe ("6 sliding-window layers, block size 8, ~1 GB BF16"; '
        "tensorfold.md §3.4) and a boot log giving its draft KV per token as 6 layers x 8 KV heads x 128; "
        "TensorFold quantizes it to affine-4 at load; hidden size 2048 from the target, which every stack "
        "requires a DFlash drafter to match",
        assumed=[
            "32 query heads and intermediate_size 6144 (as z-lab's 35B-A3B drafter)",
            "taps [1, 6, 11, 16, 22, 27, 32, 37] and mask id 248077 (z-lab's 35B-A3B layout)",
            "sliding window 4096",
            "conv_kernel_size 2, conv_group_size 16, selector_rank 256, selector_top_k "
            "16 (every DFlash2 checkpoint seen, dflash.md §1.2)",
            TARGET_CONTEXT,
        ],
    ),
    Drafter(
        "coral-bricks-ai/qwen35-122b-dflash2-drafter",
        "Qwen/Qwen3.5-122B-A10B",
        "DFlash2DraftModel",
        layers=6,
        heads=32,
        kv_heads=8,
        intermediate=9216,
        sliding_layers=6,
        window=8192,
        taps=[1, 7, 14, 20, 26, 32, 39, 45],
        mask_token_id=248077,
        block_size=12,
        is_causal=False,
        extra=DFLASH2_SELECTOR,
        sources="its model card: a DFlash2 drafter for Qwen/Qwen3.5-122B-A10B-FP8, block 12, 6 layers, taps "
        "[1, 7, 14, 20, 26, 32, 39, 45], sliding window 8192, mask 248077, one BF16 safetensors file of "
        "~1.86 GB (~930 M parameters), served by SGLang with --tp-size 2 --speculative-algorithm DFLASH "
        "--speculative-dflash-block-size 12 --speculative-draft-model-quantization unquant (dflash.md "
        "§1.3: not confirmed from a config.json)",
        assumed=[
            "32:8 heads and intermediate_size 9216 (as z-lab's 122B drafter; with them the parameter count "
            "comes to the card's ~930 M)",
            "every layer sliding",
            "conv_kernel_size 2, conv_group_size 16, selector_rank 256, selector_top_k 16",
            TARGET_CONTEXT,
        ],
    ),
    Drafter(
        "modal-labs/Qwen3.6-35B-A3B-DFlash",
        "Qwen/Qwen3.6-35B-A3B",
        "DFlashDraftModel",
        layers=6,
        heads=32,
        kv_heads=8,
        intermediate=6144,
        sliding_layers=5,
        window=4096,
        taps=[1, 6, 11, 16, 22, 27, 32, 37],
        mask_token_id=248077,
        block_size=16,
        num_target_layers=41,
        auto_map=True,
        sources="its model card (a joint Z-Lab and Modal retrain mirrored as z-lab/Qwen3.6-35B-A3B-DFlash, "
        "safetensors only, no GGUF) and loader tests quoting its 6 layers and taps "
        "[1, 6, 11, 16, 22, 27, 32, 37]",
        assumed=[
            "the rest of the layout equal to z-lab/Qwen3.6-35B-A3B-DFlash at c69b185",
            FULL_LAYER_LAST,
            TARGET_CONTEXT,
        ],
    ),
]


@dataclass(frozen=True)
class QuantizedCopy:
    """A published quantization of a catalog checkpoint whose own config was not seen: the base config with the
    quantization its card describes."""

    repo: str
    base: str  # catalog repo whose config it quantizes
    scheme: str  # "fp8-block" (Qwen's 128x128 FP8) | "exl3" (ExLlamaV3)
    sources: str
    assumed: list[str]
    bits: float = 4.0  # exl3
    head_bits: int = 6  # exl3
    revision: str | None = None


QUANTIZED_COPIES = [
    QuantizedCopy(
        "Qwen/Qwen3.5-122B-A10B-FP8",
        "Qwen/Qwen3.5-122B-A10B",
        "fp8-block",
        sources="targets.md §2.3: Qwen's official FP8 exports are quant_method fp8, e4m3, dynamic "
        "activations, 128x128 weight blocks with BF16 weight_scale_inv, embeddings, lm_head, norms, "
        "routers, shared_expert_gate, conv1d, in_proj_a/b, A_log and dt_bias left in BF16",
        assumed=["routed experts stored one by one", "the vision tower and the MTP head in BF16"],
    ),
    QuantizedCopy(
        "UnstableLlama/Qwen3.6-35B-A3B-exl3-4.00bpw",
        "Qwen/Qwen3.6-35B-A3B",
        "exl3",
        bits=4.0,
        sources="TensorFold's tested EXL3 pack for Qwen3.6 MoE (tensorfold.md §2.1) and published "
        "benchmarks of it beside nvidia/Qwen3.6-35B-A3B-NVFP4",
        assumed=[
            "4.00 bpw for every quantized linear, lm_head at ExLlamaV3's default 6 bits",
            "routers, the vision tower, embeddings and norms unquantized",
            "experts stored one by one",
        ],
    ),
    QuantizedCopy(
        "UnstableLlama/Qwen3.6-35B-A3B-DFlash-exl3-2.50bpw",
        "z-lab/Qwen3.6-35B-A3B-DFlash",
        "exl3",
        bits=2.5,
        head_bits=6,
        sources="its repo name (an EXL3 repack of z-lab's Qwen3.6-35B-A3B DFlash drafter, listed among "
        "drafters for other runtimes than llama.cpp); ExLlamaV3 loads EXL3-quantized DFlash "
        "drafters (dflash.md §7.4)",
        assumed=[
            "z-lab/Qwen3.6-35B-A3B-DFlash's June layout (c69b185)",
            "the 2.50 bpw average as 3-bit attention and fc, 2-bit MLP (ExLlamaV3 stores whole bits per tensor)",
        ],
    ),
]


@dataclass(frozen=True)
class GgufFile:
    """One GGUF file of a published repo, reconstructed from the catalog checkpoint it converts: tensor names and
    hyper-parameters from specpair's HF -> GGUF map (checkpoint/gguf_arch.py), ggml types per llama.cpp's rule."""

    repo: str
    file: str
    base: str  # catalog repo of the HF checkpoint it converts
    qtype: str  # "Q4_K_M" | "Q8_0"
    sources: str
    assumed: list[str]
    fork: bool = False  # the `dflash-draft` schema of llama.cpp forks instead of upstream `dflash`
    tokenizer: bool = True  # carries its (target's) tokenizer
    size: int | None = None  # the published file size, bytes
    revision: str | None = None


GGUF_FILES = [
    GgufFile(
        "unsloth/Qwen3.6-35B-A3B-GGUF",
        "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf",
        "Qwen/Qwen3.6-35B-A3B",
        "Q4_K_M",
        size=22_134_528_992,
        revision="a483e9e6cbd595906af30beda3187c2663a1118c",
        sources="targets.md §2.3 (arch qwen35moe, tensor names, value transforms) and third-party download "
        "manifests (file size 22,134,528,992 bytes, sha256 ac0e2c11..., repo revision a483e9e6); the "
        "MTP head ships in the separate unsloth/Qwen3.6-35B-A3B-MTP-GGUF (22.66 GB)",
        assumed=[
            "ggml types per llama.cpp's Q4_K_M rule (Q6_K for output and half of attn_v/ffn_down, Q4_K "
            "otherwise, F32 for norms and 1-D tensors); Unsloth's dynamic mix differs per tensor",
            "no MTP layer, no vision tower (mmproj is a separate file)",
        ],
    ),
    GgufFile(
        "williamliao/Qwen3.6-35B-A3B-DFlash-GGUF",
        "Qwen3.6-35B-A3B-DFlash-Q8_0.gguf",
        "z-lab/Qwen3.6-35B-A3B-DFlash",
        "Q8_0",
        size=421_060_896,
        sources="field reports of the pair that runs on llama.cpp (target unsloth/Qwen3.6-35B-A3B-GGUF "
        "UD-Q4_K_M): arch dflash, block 16, 8 taps, 6 layers, vocabulary 248320, Q8_0 421 MB; download "
        "manifests give the file name and 421,060,896 bytes",
        assumed=[
            "a conversion of z-lab/Qwen3.6-35B-A3B-DFlash at c69b185 by upstream's converter with the "
            "target's tokenizer",
            "Q8_0 for every matrix, F32 for norms",
        ],
    ),
    GgufFile(
        "Anbeeld/Qwen3.6-35B-A3B-DFlash-GGUF",
        "qwen36-35b-a3b-dflash-Q8_0.gguf",
        "z-lab/Qwen3.6-35B-A3B-DFlash",
        "Q8_0",
        fork=True,
        tokenizer=False,
        sources="field reports: a quantization of z-lab's Qwen3.6-35B-A3B DFlash drafter in the dflash-draft "
        "fork schema (dflash_fc.weight, dflash_hidden_norm.weight), which upstream llama.cpp rejects; "
        "~0.42 GB at Q8_0",
        assumed=[
            "the fork's keys dflash-draft.dflash.{block_size, mask_token_id, target_layer_ids, "
            "n_target_features} with HF tap ids",
            "no tokenizer (weights only)",
            "Q8_0 for every matrix",
        ],
    ),
]


def drafter_config(d: Drafter, target: Checkpoint) -> dict[str, Any]:
    """A Qwen3Config-shaped DFlash config.json (dflash.md §1.1-1.2) with the values the sources give."""
    layer_types = ["sliding_attention"] * d.sliding_layers + ["full_attention"] * (d.layers - d.sliding_layers)
    config: dict[str, Any] = {
        "architectures": [d.architecture],
        "model_type": "qwen3",
        "dtype": "bfloat16",
        "hidden_size": target.shapes.hidden_size,
        "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": 128,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "vocab_size": target.shapes.rows,
        "max_position_embeddings": target.rope.max_position_embeddings,
        "tie_word_embeddings": False,
        "layer_types": layer_types,
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


def build_checkpoint(
    repo: str,
    config: dict[str, Any],
    quant_files: dict[str, Any],
    revision: str | None,
    target_hidden: int | None = None,
) -> Checkpoint:
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
        origin = (
            f"Reconstructed from {copy}'s config, revision not recorded. Its text_config and "
            f"vision_config were parsed from the config.json copy of {copy} ({AIC}) with "
            f"quantization_config dropped: no verbatim config of this BF16 repo was found (targets.md §2.1)."
        )
    else:
        copies = "config.json and hf_quant_config.json copies" if quant_files else "config.json copy"
        pinned = f"revision {t.revision} per TensorFold" if t.revision else "revision not recorded"
        origin = f"Config copy ({AIC}), {pinned}. Parsed from the {copies} in catalog/sources/real-configs."
    checkpoint = build_checkpoint(t.repo, config, quant_files, t.revision)
    sentences = [origin, t.note, size_sentence(checkpoint, config, quant_files), TOKENIZER_SENTENCE]
    checkpoint.provenance = " ".join(s for s in sentences if s)
    return checkpoint


TOKENIZER_SENTENCE = (
    "Tokenizer length and bos/eos/pad ids from targets.md §5; no tokenizer.json was read, so there is no fingerprint."
)


def size_sentence(ck: Checkpoint, config: dict[str, Any], quant_files: dict[str, Any]) -> str:
    parts = ["Sizes derived from config shapes with per-family parameter formulas, not read from tensor headers"]
    if "hf_quant_config.json" in quant_files:
        parts.append(
            "layouts per hf_quant_config.json (FP8 per-tensor and NVFP4 group-16 modules as listed, "
            "everything else BF16, experts stored per expert; kv-cache scale tensors not counted)"
        )
    elif ck.quantization:
        parts.append(
            "Linear weights FP8 E4M3 with one BF16 scale per 128x128 block, modules_to_not_convert "
            "and non-Linear tensors BF16 (scale dtype as reported for Qwen3 FP8 repos)"
        )
    else:
        parts.append(
            "all tensors BF16" + (", routed experts fused 3-D" if FAMILIES[ck.family].experts == "fused" else "")
        )
    if ck.mtp:
        experts = " with per-expert experts (inferred, targets.md §4)" if ck.shapes.num_experts else ""
        parts.append(f"MTP head in BF16{experts}")
    if FAMILIES[ck.family].mtp_key == "num_nextn_predict_layers":  # Qwen3-Next: its configs declare none
        parts.append("the mtp.* tensors this repo ships are not declared by its config and not counted")
    if "vision_config" in config:
        parts.append("vision tower from vision_config")
    return "; ".join(parts) + "."


GENERIC_KEYS = (
    "Generic keys (head_dim 128, hidden_act silu, rms_norm_eps 1e-6, attention_bias false, untied, "
    "BF16, vocab_size = the target's embedding rows) as dflash.md §1.1 describes z-lab DFlash drafters."
)


def build_drafter(d: Drafter, target: Checkpoint) -> Checkpoint:
    revision = f"revision {d.revision}. It is {d.revision_source}" if d.revision else "revision not recorded"
    provenance = (
        f"Reconstructed from secondary sources, {revision}. No config.json of this repo was seen: "
        f"values from {d.sources}. {GENERIC_KEYS} Assumed, not sourced: {'; '.join(d.assumed)}. "
        f"Sizes derived from config shapes, not read from tensor headers: BF16, no embedding or lm_head "
        f"(the target's are used), fc input = taps x the target's hidden size {target.shapes.hidden_size}."
    )
    checkpoint = build_checkpoint(d.repo, drafter_config(d, target), {}, d.revision, target.shapes.hidden_size)
    checkpoint.provenance = provenance
    return checkpoint


def base_configs(real_configs: Path, targets: dict[str, Checkpoint]) -> dict[str, tuple[dict[str, Any], int | None]]:
    """Repo -> (the config the catalog built it from, the hidden size of the target a drafter taps)."""
    configs: dict[str, tuple[dict[str, Any], int | None]] = {}
    for t in TARGETS:
        config = json.loads((real_configs / f"{t.config_copy}.json").read_text("utf-8"))
        configs[t.repo] = ({k: v for k, v in config.items() if k != "quantization_config"}, None)
    for d in DRAFTERS:
        if d.revision in (None, "c69b185"):  # a repo's default entry
            configs.setdefault(d.repo, (drafter_config(d, targets[d.target]), targets[d.target].shapes.hidden_size))
    return configs


def not_converted_by_qwen_fp8(config: dict[str, Any]) -> list[str]:
    """modules_to_not_convert as Qwen's FP8 exports list them (targets.md §2.3), layer by layer."""
    text = config.get("text_config", config)
    modules = ["lm_head", "model.visual", "mtp"]
    for i, kind in enumerate(text["layer_types"]):
        p = f"model.language_model.layers.{i}."
        modules += [p + "input_layernorm", p + "post_attention_layernorm", p + "mlp.gate", p + "mlp.shared_expert_gate"]
        if kind == "linear_attention":
            modules += [p + "linear_attn.in_proj_a", p + "linear_attn.in_proj_b"]
    return modules


def build_quantized_copy(q: QuantizedCopy, configs: dict[str, tuple[dict[str, Any], int | None]]) -> Checkpoint:
    config, target_hidden = configs[q.base]
    config, quant_files = json.loads(json.dumps(config)), {}
    if q.scheme == "fp8-block":
        config["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": not_converted_by_qwen_fp8(config),
        }
    else:
        from specpair.formats import exl3

        quant_files["quantization_config.json"] = exl3.quantization_config(q.bits, q.head_bits, "mul1")
    checkpoint = build_checkpoint(q.repo, config, quant_files, q.revision, target_hidden)
    revision = f"revision {q.revision}" if q.revision else "revision not recorded"
    checkpoint.provenance = (
        f"Reconstructed from published facts, {revision}. No config.json of this repo was seen: "
        f"{q.base}'s catalog config with the quantization of {q.sources}. Assumed, not sourced: "
        f"{'; '.join(q.assumed)}. Sizes derived from config shapes, not read from tensor headers."
    )
    return checkpoint


GGUF_TYPE_CODES = {"Q4_K_M": 15, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*


def ggml_type(name: str, shape: tuple[int, ...], qtype: str, layers: int) -> str:
    """llama.cpp's per-tensor choice for a file type (llama_tensor_get_type, simplified): 1-D tensors and norms F32;
    Q4_K_M gives output and the 'more bits' half of attn_v / ffn_down Q6_K, the rest Q4_K."""
    if len(shape) < 2 or name.endswith(("_norm.weight", "norm.weight")) or "ssm_" in name or "gate_inp" in name:
        return "F32"
    if qtype == "Q8_0":
        return "Q8_0"
    block = int(name.split(".")[1]) if name.startswith("blk.") else None
    more_bits = block is not None and (
        block < layers // 8 or block >= 7 * layers // 8 or (block - layers // 8) % 3 == 2
    )
    if name == "output.weight" or (more_bits and any(k in name for k in ("attn_v.", "ffn_down"))):
        return "Q6_K"
    return "Q4_K"


FORK_TENSORS = {"fc.weight": "dflash_fc.weight", "enc.output_norm.weight": "dflash_hidden_norm.weight"}


def build_gguf_file(
    g: GgufFile, catalog: dict[str, Checkpoint], configs: dict[str, tuple[dict[str, Any], int | None]]
) -> Checkpoint:
    """Plan the GGUF of the base checkpoint with specpair's own HF -> GGUF map and read it back as a header."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from specpair.checkpoint import gguf as gguf_builder
    from specpair.checkpoint import gguf_arch
    from specpair.formats.gguf import GGUFHeader

    base, (config, target_hidden) = catalog[g.base], configs[g.base]
    derived = derived_tensors(base, config, {}, target_hidden)
    shapes = {t.name: t.shape for t in derived if not t.name.startswith(("model.visual.", "mtp."))}
    target = next((d.target for d in DRAFTERS if d.repo == g.base), None)  # a drafter's target sets its rope
    plan = gguf_arch.to_gguf(config, shapes, mtp=False, target_config=configs[target][0] if target else None)
    fields: dict[str, object] = {key: value for key, value, _ in plan.fields}
    arch = plan.arch
    tensors = []
    for m in plan.tensors:
        kind = ggml_type(m.name, m.shape, g.qtype, base.shapes.num_layers)
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        name = FORK_TENSORS.get(m.name, m.name) if g.fork else m.name
        tensors.append(TensorInfo(name, kind, tuple(m.shape), math.prod(m.shape) // block * size, DERIVED))
    if g.fork:  # the fork's schema: its own arch prefix, HF tap ids, the mask id among its keys
        d = base.drafter
        fields = {
            key.replace("dflash.", "dflash-draft.", 1): value
            for key, value in fields.items()
            if key.startswith("dflash.") and key not in ("dflash.target_layers", "dflash.block_size")
        }
        fields |= {
            "dflash-draft.dflash.block_size": d.block_size,
            "dflash-draft.dflash.mask_token_id": d.mask_token_id,
            "dflash-draft.dflash.target_layer_ids": list(d.taps.layers),
            "dflash-draft.dflash.n_target_features": len(d.taps.layers) * target_hidden,
        }
        arch = "dflash-draft"
    fields |= {
        "general.architecture": arch,
        "general.name": g.base.split("/")[1],
        "general.file_type": GGUF_TYPE_CODES[g.qtype],
    }
    header = GGUFHeader(g.file, 3, fields, tensors, g.size)
    checkpoint = gguf_builder.build(header, g.repo, "catalog", g.revision)
    if g.tokenizer:  # the target's tokenizer, whose token list is not stored in the catalog
        checkpoint.tokenizer = Tokenizer(source="catalog", **QWEN3_5_TOKENIZER)
        checkpoint.shapes.vocab_size = checkpoint.shapes.vocab_size or configs[g.base][0].get("vocab_size")
    revision = f"revision {g.revision}" if g.revision else "revision not recorded"
    size = (
        f"the published file is {g.size:,} bytes, the derived tensors {checkpoint.total_bytes:,}"
        if g.size
        else "no file size recorded"
    )
    checkpoint.provenance = (
        f"Reconstructed from published facts, {revision}. No header of {g.file} was read: "
        f"{g.base}'s catalog checkpoint planned as GGUF by specpair's HF -> GGUF map, from "
        f"{g.sources}. Assumed, not sourced: {'; '.join(g.assumed)}. Sizes derived from config "
        f"shapes, not read from tensor headers ({size})."
    )
    return checkpoint


def render(real_configs: Path = REAL_CONFIGS) -> dict[str, str]:
    """File name -> JSON text of every catalog file, each repo's default (newest) entry first."""
    by_repo: dict[str, list[Checkpoint]] = {}
    targets = {}
    for t in TARGETS:
        targets[t.repo] = build_target(t, real_configs)
        by_repo.setdefault(t.repo, []).append(targets[t.repo])
    for d in DRAFTERS:
        by_repo.setdefault(d.repo, []).append(build_drafter(d, targets[d.target]))
    configs = base_configs(real_configs, targets)
    catalog = {repo: entries[0] for repo, entries in by_repo.items()}
    for q in QUANTIZED_COPIES:
        by_repo.setdefault(q.repo, []).append(build_quantized_copy(q, configs))
    for g in GGUF_FILES:
        by_repo.setdefault(g.repo, []).append(build_gguf_file(g, catalog, configs))
    return {
        file_name(repo): json.dumps(
            {"schema": SCHEMA, "repo": repo, "entries": [c.to_json() for c in entries]}, indent=1, ensure_ascii=False
        )
        + "\n"
        for repo, entries in by_repo.items()
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    files = render()
    for stale in CATALOG_DIR.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        (CATALOG_DIR / name).write_text(text, "utf-8")
    sys.stdout.write(f"wrote {len(files)} files to {CATALOG_DIR}\n")


if __name__ == "__main__":
    main()
