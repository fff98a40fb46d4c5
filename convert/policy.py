"""Which layout each output tensor gets when a checkpoint is converted: the conversion policy, as tables.

A quantized target does not quantize everything. Kept in float, as every reference exporter does:
norms, routers, convolutions, GatedDeltaNet decay and gate projections, 1-D tensors, vision towers,
and per target what its consumers expect (embeddings and heads differ between ModelOpt, llm-compressor,
Qwen FP8, MLX, llama.cpp and ExLlamaV3). Qwen3.5/3.6 gated attention's q_proj (whose gate half is reported
to degrade 2-6x in perplexity at 4 bits, Model-Optimizer#2091) gets at least 8 bits. Patterns match HF,
MLX and GGUF names alike.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from specpair.checkpoint.groups import group_of
from specpair.errors import BadInput
from specpair.formats import gguf_quants
from specpair.formats.layouts import layout_of

# (pattern on the output name, why it stays float)
KEPT_FLOAT: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), why)
    for p, why in [
        (r"norm", "a norm"),
        (r"(^|\.)mlp\.gate\.weight$|ffn_gate_inp|shared_expert_gate", "a router"),
        (r"conv1d|base_kernel|conv_base", "a convolution"),
        (r"A_log|\.ssm_a$|dt_bias|ssm_dt", "GatedDeltaNet decay"),
        (r"in_proj_a\.|in_proj_b\.|in_proj_ba\.|ssm_alpha|ssm_beta|ssm_ba\.", "a GatedDeltaNet gate projection"),
        (r"codebook|selector_predecessor|selector_successor", "a DFlash2 selector table (gathered, not multiplied)"),
    ]
]
ROUTER = re.compile(r"(^|\.)mlp\.gate\.weight$|shared_expert_gate")
GATED_Q_PROJ = re.compile(r"self_attn\.q_proj\.weight$|\.attn_q\.weight$")


@dataclass(frozen=True)
class TargetPolicy:
    embeddings: str | bool  # True: quantized like the rest; False: float; a layout: that layout
    lm_head: bool | str  # whether the output head is quantized; a layout: in that layout
    routers: str | None  # layout for routers, None = float
    eight_bit: str | None  # layout for tensors that need ≥ 8 bits; None = float


# by target family (Target.family)
POLICIES: dict[str, TargetPolicy] = {
    "fp8": TargetPolicy(embeddings=False, lm_head=False, routers=None, eight_bit=None),  # Qwen's FP8 repos
    "nvfp4-modelopt": TargetPolicy(embeddings=False, lm_head=True, routers=None, eight_bit=None),  # nvidia/*-NVFP4
    "nvfp4-ct": TargetPolicy(embeddings=False, lm_head=False, routers=None, eight_bit=None),  # llm-compressor ignores
    "nvfp4-mlx": TargetPolicy(embeddings=False, lm_head=True, routers=None, eight_bit=None),
    "affine": TargetPolicy(embeddings=True, lm_head=True, routers="affine8-g64", eight_bit="affine8-g64"),  # mlx-lm
    "gguf": TargetPolicy(embeddings=True, lm_head=True, routers=None, eight_bit="gguf-Q8_0"),  # llama.cpp
    # llama.cpp applies NVFP4's tensor scale after matmuls only: an embedding lookup would miss it
    "nvfp4-gguf": TargetPolicy(embeddings="gguf-Q8_0", lm_head=True, routers=None, eight_bit="gguf-Q8_0"),
    # ExLlamaV3: every linear at the average bits, the head at head_bits 6, embeddings and routers float
    "exl3": TargetPolicy(embeddings=False, lm_head="exl3-6bpw", routers=None, eight_bit="exl3-8bpw"),
}

# Row-length blocks each quantized layout needs (values per block along the last axis).
BLOCKS = {"nvfp4-modelopt": 16, "nvfp4-ct": 16, "nvfp4-mlx": 16, "nvfp4-gguf": 64, "fp8-block": 1, "fp8-tensor": 1}
GGUF_FALLBACK = ("gguf-Q8_0", "f16")  # llama.cpp's own fallback when rows do not fit a k-quant block


@dataclass(frozen=True)
class KeepRule:
    pattern: str  # glob on the output tensor name
    layout: str
    spec: str  # as typed, for errors


def parse_keep(spec: str, parse_layout) -> KeepRule:
    """GLOB=LAYOUT; LAYOUT is a --to spec or a bare layout label (bf16, f32, gguf-Q6_K, affine8-g64, ...)."""
    pattern, sep, layout = spec.rpartition("=")
    if not sep or not pattern or not layout:
        raise BadInput(
            f"--keep {spec}", "expected GLOB=LAYOUT, e.g. '*.mlp.gate.weight=bf16' or 'output.weight=gguf:Q6_K'"
        )
    return KeepRule(pattern, parse_layout(layout, f"--keep {spec}"), spec)


def block_of(layout: str) -> int:
    form = layout_of(layout)
    if form.kind == "gguf":
        return gguf_quants.block_size(form.flavour)[0]
    if form.kind == "affine":
        return form.group
    return BLOCKS.get(layout, 1)


def fits(layout: str, shape: tuple[int, ...]) -> bool:
    return len(shape) >= 1 and shape[-1] % block_of(layout) == 0


def choose(
    name: str,
    shape: tuple[int, ...],
    target_layout: str,
    family: str,
    float_layout: str,
    keep: list[KeepRule],
    source_float: bool,
    source_quantized: bool,
    gated_attention: bool,
    gguf_output: bool,
) -> tuple[str, str]:
    """(layout, reason) for one output tensor of a conversion to `target_layout`.

    `float_layout` is what kept tensors are written in; `source_float` says the tensor is float in the source,
    `source_quantized` that the source checkpoint is quantized (so its float tensors were left float on purpose).
    """
    for rule in keep:
        if fnmatch.fnmatchcase(name, rule.pattern):
            if rule.layout not in ("bf16", "f16", "f32") and not fits(rule.layout, shape):
                raise BadInput(
                    name,
                    f"--keep {rule.spec}: shape {list(shape)} does not fit {rule.layout} "
                    f"(rows must split into blocks of {block_of(rule.layout)})",
                )
            return rule.layout, f"--keep {rule.spec}"
    kept = next((why for pattern, why in KEPT_FLOAT if pattern.search(name)), None)
    if gguf_output and (len(shape) < 2 or kept):  # as llama.cpp's converter writes them
        return "f32", "GGUF keeps 1-D tensors, norms, routers and convolutions in F32"
    if target_layout in ("bf16", "f16", "f32"):
        return target_layout, "target"
    if len(shape) < 2:
        return float_layout, "1-D"
    policy = POLICIES[family]
    if kept:
        if ROUTER.search(name) and policy.routers:
            return policy.routers, "a router: 8 bits, as mlx-lm quantizes it"
        return float_layout, f"kept: {kept}"
    group = group_of(name)
    if group == "vision":
        return float_layout, "kept: vision tower"
    if group == "mtp" and family not in ("gguf", "nvfp4-gguf", "affine") and source_float:
        return float_layout, "kept: MTP head (left unquantized, as ModelOpt and Qwen FP8 exports do)"
    # what the source already quantized stays quantized (a repack must not grow it back to float)
    if group == "embedding" and policy.embeddings is not True and source_float:
        if policy.embeddings:
            return policy.embeddings, "embeddings: llama.cpp looks NVFP4 rows up without their tensor scale"
        return float_layout, "kept: embeddings"
    if group == "lm_head" and not policy.lm_head and source_float:
        return float_layout, "kept: lm_head"
    if group == "lm_head" and isinstance(policy.lm_head, str):
        return policy.lm_head, "the head at ExLlamaV3's head_bits"
    if source_quantized and source_float:
        return float_layout, "kept: unquantized in the source"
    layout, reason = target_layout, "target"
    if gated_attention and GATED_Q_PROJ.search(name):
        if _bits(target_layout) < 8:
            layout = policy.eight_bit or float_layout
            reason = "gated attention q_proj: at least 8 bits (Model-Optimizer#2091)"
    if not fits(layout, shape):
        fallback = (
            next((f for f in GGUF_FALLBACK if fits(f, shape)), "f16") if family.endswith("gguf") else float_layout
        )
        return fallback, f"rows of {shape[-1]} do not split into {layout} blocks of {block_of(layout)}"
    return layout, reason


def _bits(layout: str) -> float:
    from specpair.formats.codecs import codec

    return codec(layout).bits
