"""Which layout each output tensor gets when a checkpoint is converted: the conversion policy, as tables.

A quantized target does not quantize everything. Kept in float, as every reference exporter does:
norms, routers, convolutions, GatedDeltaNet decay and gate projections, 1-D tensors, vision towers,
and per target what its consumers expect (embeddings and heads differ between ModelOpt, llm-compressor,
Qwen FP8, MLX, llama.cpp and ExLlamaV3). Qwen3.5/3.6 gated attention's q_proj (whose gate half is reported
to degrade 2-6x in perplexity at 4 bits, Model-Optimizer#2091) gets at least 8 bits. Patterns match HF,
MLX and GGUF names alike.

Embeddings, heads and MTP heads follow the target's row whatever the source holds (a Q8_0 GGUF and its BF16
copy give one plan); a tied embedding is also the head, and gets the more precise of the two layouts.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from specpair.checkpoint.families import HEAD_GROUPS
from specpair.checkpoint.groups import group_of
from specpair.errors import BadInput
from specpair.formats import gguf_quants
from specpair.formats.layouts import AFFINE, EXL3, FP8, GGUF, NVFP4, layout_of

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
    embeddings: str | bool  # True: at the target layout; False: float; a layout: that layout
    lm_head: bool | str  # the output head, alike
    routers: str | None  # layout for routers, None = float
    eight_bit: str | None  # layout for tensors that need ≥ 8 bits; None = float
    why: str  # whose choice for embeddings and heads this row follows
    head_floor: bool = False  # lm_head's layout is the least it gets: a target of more bits keeps its own
    quantizes_heads: bool = False  # a drafter head inside the target (MTP) is quantized like the body


# by the target layout's kind and flavour; a kind's row (flavour None) serves its flavours without one of their own
POLICIES: dict[tuple[str, str | None], TargetPolicy] = {
    (FP8, None): TargetPolicy(False, False, None, None, "as Qwen's FP8 exports"),
    (NVFP4, "modelopt"): TargetPolicy(False, True, None, None, "as nvidia's NVFP4 exports"),
    (NVFP4, "ct"): TargetPolicy(False, False, None, None, "as llm-compressor's NVFP4 recipes ignore lm_head"),
    (NVFP4, "mlx"): TargetPolicy(
        False, True, None, None, "as nvidia's NVFP4 exports, which mlx-lm converts as they are"
    ),
    (AFFINE, None): TargetPolicy(
        True, True, "affine8-g64", "affine8-g64", "as mlx-lm quantizes them", quantizes_heads=True
    ),
    # llama.cpp's llama-quantize: token_embd at the type; output.weight, and a tied token_embd, at Q6_K (Q8_0
    # where the type is Q8_0 or rows do not split into 256)
    (GGUF, None): TargetPolicy(
        True, "gguf-Q6_K", None, "gguf-Q8_0", "as llama.cpp's llama-quantize", head_floor=True, quantizes_heads=True
    ),
    # llama.cpp applies NVFP4's tensor scale after matmuls only: an embedding lookup would miss it
    (NVFP4, GGUF): TargetPolicy(
        "gguf-Q8_0",
        True,
        None,
        "gguf-Q8_0",
        "llama.cpp looks NVFP4 rows up without their tensor scale",
        quantizes_heads=True,
    ),
    # ExLlamaV3: every linear at the average bits, the head at head_bits 6, embeddings and routers float
    (EXL3, None): TargetPolicy(False, "exl3-6bpw", None, "exl3-8bpw", "as ExLlamaV3 (head_bits 6)"),
}

NVFP4_BLOCK = 16  # values per FP8 scale of NVFP4 (ModelOpt, compressed-tensors, MLX)
NVFP4_GGUF_BLOCK = 64  # llama.cpp's NVFP4 block: four scales of 16 values in one block of 64


def policy_of(target_layout: str) -> TargetPolicy:
    """The embedding/head/router policy of a conversion to `target_layout`."""
    form = layout_of(target_layout)
    return POLICIES.get((form.kind, form.flavour)) or POLICIES[(form.kind, None)]


# where rows do not fit a k-quant block: Q8_0, then F16 (llama-quantize takes Q8_0 for Q6_K and the head, but Q5_0
# for Q4_K and Q5_1 for Q5_K, types convert does not write)
GGUF_FALLBACK = ("gguf-Q8_0", "f16")


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
    """Values per block along a row's last axis that `layout` needs (1: any row length)."""
    form = layout_of(layout)
    if form.kind == GGUF:
        return gguf_quants.block_size(form.flavour)[0]
    if form.kind == AFFINE:
        return form.group
    if form.kind == NVFP4:
        return NVFP4_GGUF_BLOCK if form.flavour == GGUF else NVFP4_BLOCK
    return 1


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
    tied: bool = False,
    as_bits: bool = False,
) -> Choice:
    """The layout of one output tensor of a conversion to `target_layout`, and why.

    `float_layout` is what kept tensors are written in; `source_float` says the tensor is float in the source,
    `source_quantized` that the source checkpoint is quantized (so its float tensors were left float on purpose);
    `tied`: the model's embedding is also its head; `as_bits`: the source stores the tensor in bits the target
    layout takes as they are (NVFP4 from flavour to flavour).
    """
    for rule in keep:
        if fnmatch.fnmatchcase(name, rule.pattern):
            if rule.layout not in ("bf16", "f16", "f32") and not fits(rule.layout, shape):
                raise BadInput(
                    name,
                    f"--keep {rule.spec}: shape {list(shape)} does not fit {rule.layout} "
                    f"(rows must split into blocks of {block_of(rule.layout)})",
                )
            return Choice(rule.layout, f"--keep {rule.spec}")
    kept = next((why for pattern, why in KEPT_FLOAT if pattern.search(name)), None)
    if gguf_output and (len(shape) < 2 or kept):  # as llama.cpp's converter writes them
        return Choice("f32", "GGUF keeps 1-D tensors, norms, routers and convolutions in F32")
    if target_layout in ("bf16", "f16", "f32"):
        return Choice(target_layout, "target")
    if len(shape) < 2:
        return Choice(float_layout, "1-D")
    policy = policy_of(target_layout)
    if kept:
        if ROUTER.search(name) and policy.routers:
            return Choice(policy.routers, "a router: 8 bits, as mlx-lm quantizes it")
        return Choice(float_layout, f"kept: {kept}")
    group = group_of(name)
    if group == "vision":
        return Choice(float_layout, "kept: vision tower")
    if group in HEAD_GROUPS and not policy.quantizes_heads:
        return Choice(float_layout, "kept: MTP head (left unquantized, as ModelOpt and Qwen FP8 exports do)")
    if group in ("embedding", "lm_head"):
        roles = ("embedding", "lm_head") if tied and group == "embedding" else (group,)
        layout, reason = max(
            (_role_layout(policy, role, target_layout, float_layout) for role in roles), key=lambda c: _bits(c[0])
        )
        reason += " (tied: the embedding is the head too)" if len(roles) == 2 else ""
        if as_bits and layout == float_layout:  # through float it would only be rounded and grow
            return Choice(target_layout, f"moved as bits: quantized so in the source ({reason})")
        return _fitted(Choice(layout, reason), shape, family, float_layout)
    if source_quantized and source_float:
        return Choice(float_layout, "kept: unquantized in the source")
    layout, reason = target_layout, "target"
    if gated_attention and GATED_Q_PROJ.search(name):
        if _bits(target_layout) < 8:
            layout = policy.eight_bit or float_layout
            reason = "gated attention q_proj: at least 8 bits (Model-Optimizer#2091)"
    return _fitted(Choice(layout, reason), shape, family, float_layout)


@dataclass(frozen=True)
class Choice:
    layout: str
    reason: str
    fell_back_from: str | None = None  # the layout it was to get, had its rows split into that layout's blocks


def _role_layout(policy: TargetPolicy, role: str, target_layout: str, float_layout: str) -> tuple[str, str]:
    """(layout, reason) of an embedding or a head under the target's row."""
    setting = policy.embeddings if role == "embedding" else policy.lm_head
    what = "embeddings" if role == "embedding" else "the head"
    if setting is True:
        return target_layout, "target"
    if setting is False:
        return float_layout, f"kept: {what}, {policy.why}"
    if role == "lm_head" and policy.head_floor and _bits(target_layout) > _bits(setting):
        return target_layout, f"{what} at the target's layout, {policy.why}"
    return setting, f"{what} at {setting}, {policy.why}"


def _fitted(choice: Choice, shape: tuple[int, ...], family: str, float_layout: str) -> Choice:
    """The choice, or where its rows do not split into the layout's blocks, its fallback: Q8_0, else F16, for GGUF
    targets; float for the others."""
    if fits(choice.layout, shape):
        return choice
    fallback = next((f for f in GGUF_FALLBACK if fits(f, shape)), "f16") if family.endswith("gguf") else float_layout
    return Choice(
        fallback,
        f"rows of {shape[-1]} do not split into {choice.layout} blocks of {block_of(choice.layout)}",
        choice.layout,
    )


def _bits(layout: str) -> float:
    from specpair.formats.codecs import codec

    return codec(layout).bits
