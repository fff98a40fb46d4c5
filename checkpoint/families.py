"""The family table: one row per model family and per drafter kind, everything specpair knows about each.

A family is the decoder architecture a checkpoint's blocks follow; a drafter kind is how a drafter is wired
to its target. Every reader, rule, converter and runtime module that needs a per-family fact reads it here:
adding a family is adding a row (gguf-py's habit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Serving stacks that load the decoder blocks of every family here (compat/stacks.py); specpair's own runtime says
# what it runs in runtime/__init__.py.
STACKS = ("sglang", "vllm", "llama.cpp", "exllamav3")


@dataclass(frozen=True)
class GGUFArch:
    """How llama.cpp's arch for a family lays it out, beyond the family's own facts (checkpoint/gguf_arch.py)."""

    hf_architecture: str  # what a GGUF of this arch reads back as (multimodal wrappers: their text model)
    model_type: str
    post_norm: str  # GGUF name of post_attention_layernorm
    groups: frozenset[str]  # hyper-parameter groups of gguf_arch.HPARAMS it writes
    v_reorder: bool = False  # value heads grouped -> tiled when linear_num_value_heads != linear_num_key_heads
    rope_dims: str = ""  # rope.dimension_count: "full" (head_dim), "partial" (head_dim * partial_rotary_factor)
    rope_permute: bool = False  # llama.cpp ropes llama GPT-J style: q/k rows go back to interleaved pairs
    mtp: bool = False  # MTP head as extra blocks with nextn.* tensors
    mtp_count_in_config: bool = False  # the HF config declares the MTP layer count (Qwen3-Next's never does)
    renormalises_topk: bool = (
        False  # llama.cpp always renormalises top-k router weights: norm_topk_prob false is refused
    )
    config_extras: dict[str, Any] = field(default_factory=dict)  # what a config read from a GGUF carries beyond
    # the hyper-parameters, as the published configs have it


COMMON_EXTRAS = {"attention_bias": False, "hidden_act": "silu"}


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
    stacks: tuple[str, ...] = STACKS  # serving stacks that load it
    gguf: GGUFArch | None = None


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "llama",
            ("LlamaForCausalLM",),
            ("llama",),
            "llama",
            "model.",
            qk_norm=False,
            gguf=GGUFArch(
                "LlamaForCausalLM",
                "llama",
                "ffn_norm",
                frozenset({"common", "vocab"}),
                rope_dims="full",
                rope_permute=True,
                config_extras={**COMMON_EXTRAS, "mlp_bias": False},
            ),
        ),
        Family(
            "qwen3",
            ("Qwen3ForCausalLM",),
            ("qwen3",),
            "qwen3",
            "model.",
            rope_theta=1e6,
            gguf=GGUFArch(
                "Qwen3ForCausalLM",
                "qwen3",
                "ffn_norm",
                frozenset({"common"}),
                config_extras={**COMMON_EXTRAS, "use_sliding_window": False},
            ),
        ),
        Family(
            "qwen3_moe",
            ("Qwen3MoeForCausalLM",),
            ("qwen3_moe",),
            "qwen3moe",
            "model.",
            experts="per-expert",
            rope_theta=1e6,
            norm_topk_prob=False,
            gguf=GGUFArch(
                "Qwen3MoeForCausalLM",
                "qwen3_moe",
                "ffn_norm",
                frozenset({"common", "moe"}),
                renormalises_topk=True,
                config_extras={
                    **COMMON_EXTRAS,
                    "use_sliding_window": False,
                    "norm_topk_prob": True,
                    "decoder_sparse_step": 1,
                    "mlp_only_layers": [],
                },
            ),
        ),
        Family(
            "qwen3_next",
            ("Qwen3NextForCausalLM",),
            ("qwen3_next",),
            "qwen3next",
            "model.",
            zero_centred_norms=True,
            gated_attention=True,
            linear_attention="fused",
            experts="per-expert",
            shared_expert=True,
            partial_rotary=0.25,
            rope_theta=1e7,
            mtp_key="num_nextn_predict_layers",
            gguf=GGUFArch(
                "Qwen3NextForCausalLM",
                "qwen3_next",
                "post_attention_norm",
                frozenset({"common", "moe", "shared", "hybrid", "mtp"}),
                rope_dims="partial",
                mtp=True,
                renormalises_topk=True,
                config_extras={
                    "hidden_act": "silu",
                    "norm_topk_prob": True,
                    "decoder_sparse_step": 1,
                    "mlp_only_layers": [],
                },
            ),
        ),
        Family(
            "qwen3_5",
            ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
            ("qwen3_5", "qwen3_5_text"),
            "qwen35",
            "model.language_model.",
            zero_centred_norms=True,
            gated_attention=True,
            linear_attention="split",
            partial_rotary=0.25,
            rope_theta=1e7,
            mtp_key="mtp_num_hidden_layers",
            mlx_wrapped=True,
            stacks=(*STACKS, "tensorfold"),
            gguf=GGUFArch(
                "Qwen3_5ForCausalLM",
                "qwen3_5_text",
                "post_attention_norm",
                frozenset({"common", "hybrid", "mrope", "mtp"}),
                v_reorder=True,
                rope_dims="partial",
                mtp=True,
                mtp_count_in_config=True,
                config_extras={**COMMON_EXTRAS, "attn_output_gate": True},
            ),
        ),
        Family(
            "qwen3_5_moe",
            ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
            ("qwen3_5_moe", "qwen3_5_moe_text"),
            "qwen35moe",
            "model.language_model.",
            zero_centred_norms=True,
            gated_attention=True,
            linear_attention="split",
            experts="fused",
            shared_expert=True,
            partial_rotary=0.25,
            rope_theta=1e7,
            mtp_key="mtp_num_hidden_layers",
            mlx_wrapped=True,
            stacks=(*STACKS, "tensorfold"),
            gguf=GGUFArch(
                "Qwen3_5MoeForCausalLM",
                "qwen3_5_moe_text",
                "post_attention_norm",
                frozenset({"common", "moe", "shared", "hybrid", "mrope", "mtp"}),
                v_reorder=True,
                rope_dims="partial",
                mtp=True,
                mtp_count_in_config=True,
                config_extras={**COMMON_EXTRAS, "attn_output_gate": True},
            ),
        ),
    )
}


@dataclass(frozen=True)
class DrafterKind:
    name: str
    hf_architectures: tuple[str, ...]
    family: str | None  # the family of its decoder blocks; None: the target's own (MTP) or any (draft models)
    gguf_archs: tuple[str, ...] = ()  # upstream first, then fork schemas read too
    gguf: GGUFArch | None = None  # llama.cpp's layout of the first gguf_arch, where specpair converts it; only
    # checkpoints of the first architecture are written as GGUF
    block_size: int = 16  # tokens verified a round where the checkpoint does not say: `run` uses it and `check`'s
    # launch lines print it, so both run the same block


# llama.cpp's `dflash` arch holds DFlash and DFlash-2 drafters alike (the selector keys tell them apart)
DFLASH_GGUF = GGUFArch(
    "DFlashDraftModel",
    "qwen3",
    "ffn_norm",
    frozenset({"common", "dflash"}),
    rope_dims="partial",
    config_extras={**COMMON_EXTRAS, "tie_word_embeddings": False},
)

DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")

DRAFTER_KINDS: dict[str, DrafterKind] = {
    k.name: k
    for k in (
        DrafterKind(
            "dflash",
            (
                "DFlashDraftModel",
                "MuseGlimmerAssistantModel",
                "DFlashMuseGlimmerAssistantModel",
                "DFlashLagunaForCausalLM",
                "DFlashQwen3XPressModel",
            ),
            "qwen3",
            ("dflash", "dflash-draft"),
            DFLASH_GGUF,
        ),
        DrafterKind(
            "dflash2",
            ("DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel"),
            "qwen3",
            ("dflash", "dflash-draft"),
            DFLASH_GGUF,
        ),
        # the target's own mtp.* head: no checkpoint of its own; three chained drafts a round, vLLM's and
        # SGLang's usual num_speculative_tokens
        DrafterKind("mtp", (), None, block_size=4),
        # seven chained drafts a round, as vLLM's EAGLE-3 examples run
        DrafterKind("eagle3", ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"), "llama", ("eagle3",), block_size=8),
        DrafterKind("draft_model", (), None, block_size=5),  # a smaller model of any family, sharing the tokenizer
    )
}

BY_ARCHITECTURE: dict[str, Family] = {a: f for f in FAMILIES.values() for a in f.hf_architectures}
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}
BY_GGUF_ARCH: dict[str, Family] = {f.gguf_arch: f for f in FAMILIES.values()}
DRAFTER_BY_ARCHITECTURE: dict[str, DrafterKind] = {a: k for k in DRAFTER_KINDS.values() for a in k.hf_architectures}
DRAFTER_BY_GGUF_ARCH: dict[str, DrafterKind] = {a: k for k in reversed(DRAFTER_KINDS.values()) for a in k.gguf_archs}


def family_of(architecture: str | None, model_type: str | None) -> Family | None:
    """The family of a config's architectures[0] / model_type (the architecture decides when both are known)."""
    return BY_ARCHITECTURE.get(architecture or "") or BY_MODEL_TYPE.get(model_type or "")


def families_served_by(stack: str) -> tuple[str, ...]:
    return tuple(f.name for f in FAMILIES.values() if stack in f.stacks)
