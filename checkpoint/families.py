"""The family table: one row per model family and per drafter kind, everything specpair knows about each.

A family is the decoder architecture a checkpoint's blocks follow; a drafter kind is how a drafter is wired
to its target. Every reader, rule, converter and runtime module that needs a per-family fact reads it here:
adding a family is adding a row (gguf-py's habit).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    hf_architectures: tuple[str, ...]  # architectures[0] values in published configs (first: what we write)
    model_types: tuple[str, ...]  # model_type values, incl. the nested text_config's
    gguf_arch: str  # llama.cpp general.architecture
    hf_prefix: str  # where the language model sits in HF names ("model." or "model.language_model.")
    zero_centred_norms: bool = False  # RMSNorm gains applied as 1 + w (except the GDN output norm)
    qk_norm: bool = True  # per-head RMSNorm on q and k
    gated_attention: bool = False  # q_proj emits [query | gate] per head; output * sigmoid(gate)
    linear_attention: str | None = None  # Gated DeltaNet projections: "split" (Qwen3.5) or "fused" (Qwen3-Next)
    experts: str | None = None  # routed experts as stored in BF16 HF repos: "fused" (3-D) or "per-expert"
    shared_expert: bool = False  # a sigmoid-gated shared expert beside the routed ones
    partial_rotary: float = 1.0  # default partial_rotary_factor when the config gives none
    rope_theta: float = 10000.0  # default rope_theta when the config gives none (transformers' default)
    norm_topk_prob: bool = True  # default renormalisation of the top-k router weights
    mtp_key: str | None = None  # config key counting MTP layers
    mlx_wrapped: bool = False  # MLX checkpoints keep the LM under language_model.


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", ("LlamaForCausalLM",), ("llama",), "llama", "model.", qk_norm=False),
    Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), "qwen3", "model.", rope_theta=1e6),
    Family("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), "qwen3moe", "model.", experts="per-expert",
           rope_theta=1e6, norm_topk_prob=False),
    Family("qwen3_next", ("Qwen3NextForCausalLM",), ("qwen3_next",), "qwen3next", "model.", zero_centred_norms=True,
           gated_attention=True, linear_attention="fused", experts="per-expert", shared_expert=True,
           partial_rotary=0.25, rope_theta=1e7, mtp_key="num_nextn_predict_layers"),
    Family("qwen3_5", ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"), ("qwen3_5", "qwen3_5_text"),
           "qwen35", "model.language_model.", zero_centred_norms=True, gated_attention=True, linear_attention="split",
           partial_rotary=0.25, rope_theta=1e7, mtp_key="mtp_num_hidden_layers", mlx_wrapped=True),
    Family("qwen3_5_moe", ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
           ("qwen3_5_moe", "qwen3_5_moe_text"), "qwen35moe", "model.language_model.", zero_centred_norms=True,
           gated_attention=True, linear_attention="split", experts="fused", shared_expert=True, partial_rotary=0.25,
           rope_theta=1e7, mtp_key="mtp_num_hidden_layers", mlx_wrapped=True),
)}


@dataclass(frozen=True)
class DrafterKind:
    name: str
    hf_architectures: tuple[str, ...]
    family: str | None  # the family of its decoder blocks; None: the target's own (MTP) or any (draft models)
    gguf_archs: tuple[str, ...] = ()  # upstream first, then fork schemas read too


DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")

DRAFTER_KINDS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("dflash", ("DFlashDraftModel", "MuseGlimmerAssistantModel", "DFlashMuseGlimmerAssistantModel",
                           "DFlashLagunaForCausalLM", "DFlashQwen3XPressModel"), "qwen3", ("dflash", "dflash-draft")),
    DrafterKind("dflash2", ("DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel"), "qwen3",
                ("dflash", "dflash-draft")),
    DrafterKind("eagle3", ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"), "llama", ("eagle3",)),
    DrafterKind("mtp", (), None),  # the target's own mtp.* head: no checkpoint of its own
    DrafterKind("draft_model", (), None),  # a smaller model of any family, sharing the tokenizer
)}

BY_ARCHITECTURE: dict[str, Family] = {a: f for f in FAMILIES.values() for a in f.hf_architectures}
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}
BY_GGUF_ARCH: dict[str, Family] = {f.gguf_arch: f for f in FAMILIES.values()}
DRAFTER_BY_ARCHITECTURE: dict[str, DrafterKind] = {a: k for k in DRAFTER_KINDS.values() for a in k.hf_architectures}


def family_of(architecture: str | None, model_type: str | None) -> Family | None:
    """The family of a config's architectures[0] / model_type (the architecture decides when both are known)."""
    return BY_ARCHITECTURE.get(architecture or "") or BY_MODEL_TYPE.get(model_type or "")
