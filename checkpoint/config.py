"""The typed model config: every hyper-parameter a model constructor needs, for every family and drafter kind.

One parser, `parse_config`, reads an HF config.json (flat, or with the LM under `text_config`); MLX and EXL3
checkpoints carry the same config.json, and a GGUF header is first turned into one by `gguf_arch.from_gguf`,
so every source is read by the same code with the same defaults (the family table's).
Values follow transformers' conventions: norm weights as stored in HF checkpoints (the `1 + w` of
zero-centred norms is the model's business, flagged by `zero_centred_norms`), taps as "output of decoder
layer k", rope scaling under transformers' key names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specpair.checkpoint.families import (
    CHAIN,
    DFLASH2_KEYS,
    DRAFTER_BY_ARCHITECTURE,
    DRAFTER_KINDS,
    EAGLE_NORMS,
    FAMILIES,
    WINDOW_IN_LAYER_TYPES,
    WINDOW_IN_USE_SLIDING,
    WINDOW_IN_USE_SWA,
    Family,
    dotted,
    family_of,
    tap_layout,
    with_own_keys,
)
from specpair.errors import BadInput
from specpair.formats import brief

MAX_LAYERS = 100_000  # bound on an untrusted layer count before per-layer lists are built from it
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")  # as families' configs spell it
LAYER_TYPES = {"full_attention": "full", "linear_attention": "linear", "sliding_attention": "sliding"}
QWEN_MAX_WINDOW_LAYERS = 28  # transformers' Qwen2Config/Qwen3Config default for max_window_layers


def experts_touched(experts: int, per_token: int, tokens: int) -> float:
    """The share of a MoE layer's `experts` routed experts that `tokens` tokens read, each routed to `per_token`,
    expected under uniform routing: 1 - (1 - per_token/experts)^tokens."""
    return 1 - (1 - per_token / experts) ** tokens


@dataclass(frozen=True)
class DrafterConfig:
    """What wires a drafter to its target (DFlash, DFlash2, EAGLE-3)."""

    kind: str  # a DRAFTER_KINDS key with a config of its own
    target_layer_ids: tuple[int, ...] = ()  # taps: the output of target decoder layer k, in fc input order
    tap_layout: str | None = None  # TAP_LAYOUTS key: the convention its tap ids were written in (None: none found)
    tap_ids: tuple[int, ...] = ()  # the ids as its config writes them (under tap_key)
    tap_key: str | None = None  # the dotted config key they came from; None: the layout's default ids
    block_size: int | None = None
    mask_token_id: int | None = None
    is_causal: bool | None = None  # None: full layers bidirectional in-block, sliding layers causal
    num_target_layers: int | None = None  # what it was trained against (informational)
    target_hidden_size: int | None = None  # fc input per tap, when it differs from hidden_size
    conv_kernel_size: int | None = None  # DFlash2 grouped dynamic conv
    conv_group_size: int | None = None
    selector_rank: int | None = None  # DFlash2 candidate selector
    selector_top_k: int | None = None
    output_multiplier: float | None = None  # logits *= this
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    input_embedding_scale: float | None = None  # block embeddings *= this
    draft_vocab_size: int | None = None  # EAGLE-3 reduced vocabulary (d2t maps draft ids to target ids)
    norm_before_residual: bool = False  # EAGLE-3 (speculators' key)
    eagle_norms: frozenset[str] = frozenset()  # the EAGLE_NORMS its config turns on (EAGLE-3.1)


@dataclass(frozen=True)
class ModelConfig:
    family: str  # FAMILIES key: the architecture of the decoder blocks
    architecture: str | None
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]  # "full" | "linear" (Gated DeltaNet) | "sliding", one per layer
    rms_norm_eps: float
    max_position_embeddings: int | None
    intermediate_size: int | None = None
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = True
    zero_centred_norms: bool = False
    attn_output_gate: bool = False
    sliding_window: int | None = None
    window_source: str | None = None  # the config key that declares the sliding layers (families.WINDOW_SOURCES)
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    rope_scaling: dict[str, Any] | None = None  # rope_type + its parameters, transformers' names; None: default
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    num_experts: int | None = None
    experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel: int | None = None
    mtp_layers: int = 0
    mtp_use_dedicated_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    drafter: DrafterConfig | None = field(default=None)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    def experts_touched(self, tokens: int) -> float:
        """The share of a MoE layer's routed experts that a step of `tokens` tokens reads, expected under uniform
        routing (each token's k of E drawn alike): 1 - (1 - k/E)^tokens; what rooflines count of expert bytes."""
        if self.num_experts is None or self.experts_per_token is None:
            raise ValueError(f"experts_touched: {self.family} has no routed experts")
        return experts_touched(self.num_experts, self.experts_per_token, tokens)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` has routed experts (mlp_only_layers / decoder_sparse_step make dense ones)."""
        return (
            self.num_experts is not None
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def linear_conv_dim(self) -> int:
        keys = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * keys + self.linear_num_value_heads * self.linear_value_head_dim


def parse_config(
    config: dict[str, Any], where: str, generation_config: dict[str, Any] | None = None, *, summary: bool = False
) -> ModelConfig:
    """The ModelConfig of an HF config.json (`where` names it in errors); `generation_config` adds stop ids.
    `summary` (what `check` reads, whose rules judge any config): a family specpair does not model is read with
    transformers' defaults and keeps its model_type as `family`, and layer_types are kept as given; the runtime
    and the converter need a known family and one type per layer."""
    if not isinstance(config, dict):
        raise BadInput(where, "config is not a JSON object")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    architecture = _architecture(config, where)
    kind = config_kind(config, architecture)
    model_type = next((t for t in (text.get("model_type"), config.get("model_type")) if isinstance(t, str)), None)
    family = family_of(architecture, model_type)
    if kind is not None:
        row = DRAFTER_KINDS[kind]
        family = FAMILIES[row.family] if architecture in DRAFTER_BY_ARCHITECTURE else family or FAMILIES[row.family]
    if family is None and summary:
        family = Family(model_type or architecture or "unknown", (), (), "", "model.", qk_norm=False)
    if family is None:
        known = ", ".join(a for f in FAMILIES.values() for a in f.hf_architectures)
        raise BadInput(
            where,
            f"architecture {brief(architecture)} (model_type {brief(model_type)}) is not a family "
            f"specpair models (known: {known})",
        )
    hidden = positive(text, "hidden_size", where)
    layers = positive(text, "num_hidden_layers", where)
    if layers > MAX_LAYERS:
        raise BadInput(where, f"'num_hidden_layers' is {layers}, more than any model has ({MAX_LAYERS})")
    heads = positive(text, "num_attention_heads", where)
    rope = rope_parameters(text)
    theta = number(rope, "rope_theta", where, family.rope_theta)
    partial = rope.get("partial_rotary_factor", family.partial_rotary)
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise BadInput(where, f"'partial_rotary_factor' is {brief(partial)}, not a number in (0, 1]")
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    scaling = None
    if rope_type != "default":
        scaling = {
            k: v
            for k, v in rope.items()
            if k not in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved", "type")
        }
        scaling["rope_type"] = rope_type
    section = rope.get("mrope_section")
    if section is not None and not (isinstance(section, list) and all(as_int(s) is not None for s in section)):
        raise BadInput(where, f"'mrope_section' is {brief(section)}, not a list of integers")
    linear = family.linear_attention is not None
    layer_types = _layer_types(text, layers, linear, where, strict=not summary)
    # serving stacks window the sliding_attention layers whatever use_sliding_window says
    sliding = text.get("sliding_window") if "sliding" in layer_types else None
    window_source = _window_source(text, layer_types)
    swa = _swa_block(config, kind)
    if swa is not None and "sliding" not in layer_types:
        # ModelOpt's DFlash export (Model-Optimizer#1960) trains every layer with the window while writing
        # layer_types all full; vLLM's _resolve_layer_attention reads it the same way
        layer_types = ("sliding",) * layers
        sliding = swa.get("swa_window_size")
        sliding = text.get("sliding_window") if sliding is None else sliding
        window_source = WINDOW_IN_USE_SWA
    generation = generation_config or {}
    eos = _ids(generation.get("eos_token_id")) or _ids(text.get("eos_token_id", config.get("eos_token_id")))
    tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return ModelConfig(
        family=family.name,
        architecture=architecture,
        vocab_size=positive(text, "vocab_size", where),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=positive(text, "num_key_value_heads", where, heads),
        head_dim=positive(text, "head_dim", where, hidden // heads),
        layer_types=layer_types,
        rms_norm_eps=number(text, "rms_norm_eps", where, 1e-6),
        max_position_embeddings=optional_positive(text, "max_position_embeddings", where),
        intermediate_size=optional_positive(text, "intermediate_size", where),
        hidden_act=str(text.get("hidden_act", "silu")),
        tie_word_embeddings=bool(tie),
        attention_bias=bool(text.get("attention_bias", False)),
        mlp_bias=bool(text.get("mlp_bias", False)),
        qk_norm=family.qk_norm,
        zero_centred_norms=family.zero_centred_norms,
        attn_output_gate=bool(text.get("attn_output_gate", family.gated_attention)),
        sliding_window=optional_positive({"sliding_window": sliding}, "sliding_window", where),
        window_source=window_source,
        rope_theta=theta,
        partial_rotary_factor=float(partial),
        rope_scaling=scaling,
        mrope_section=tuple(int(s) for s in section) if section else None,
        mrope_interleaved=bool(rope.get("mrope_interleaved", False)),
        num_experts=next(
            (optional_positive(text, k, where) for k in EXPERT_COUNT_KEYS if text.get(k) is not None), None
        ),
        experts_per_token=optional_positive(text, "num_experts_per_tok", where),
        moe_intermediate_size=optional_positive(text, "moe_intermediate_size", where),
        shared_expert_intermediate_size=optional_positive(text, "shared_expert_intermediate_size", where),
        norm_topk_prob=bool(text.get("norm_topk_prob", family.norm_topk_prob)),
        decoder_sparse_step=positive(text, "decoder_sparse_step", where, 1),
        mlp_only_layers=tuple(_int_list(text.get("mlp_only_layers") or [], where, "mlp_only_layers")),
        linear_num_key_heads=optional_positive(text, "linear_num_key_heads", where) if linear else None,
        linear_num_value_heads=optional_positive(text, "linear_num_value_heads", where) if linear else None,
        linear_key_head_dim=optional_positive(text, "linear_key_head_dim", where) if linear else None,
        linear_value_head_dim=optional_positive(text, "linear_value_head_dim", where) if linear else None,
        linear_conv_kernel=optional_positive(text, "linear_conv_kernel_dim", where) if linear else None,
        mtp_layers=_count(text, family.mtp_key, where) if family.mtp_key else 0,
        mtp_use_dedicated_embeddings=bool(text.get("mtp_use_dedicated_embeddings", False)),
        bos_token_id=as_int(generation.get("bos_token_id", text.get("bos_token_id", config.get("bos_token_id")))),
        eos_token_ids=tuple(eos),
        pad_token_id=as_int(generation.get("pad_token_id", text.get("pad_token_id", config.get("pad_token_id")))),
        drafter=_drafter(kind, config, where) if kind else None,
    )


def config_kind(config: dict[str, Any], architecture: str | None) -> str | None:
    """The drafter kind a config declares: by its architecture, else by the drafter keys it carries (EAGLE-3 heads
    may name their base architecture, e.g. LlamaForCausalLM); None for a plain model."""
    if architecture in DRAFTER_BY_ARCHITECTURE:
        return DRAFTER_BY_ARCHITECTURE[architecture].name
    for block in dict.fromkeys(k.config_block for k in DRAFTER_KINDS.values() if k.config_block):
        schema = [k for k in DRAFTER_KINDS.values() if k.config_block == block]
        nested = config.get(block)
        if isinstance(nested, dict) or any(m in config for s in schema for m in s.config_markers):
            keys = nested if isinstance(nested, dict) else config
            return with_own_keys(schema, any(k in keys for s in schema for k in s.own_keys)).name
    return None


def _drafter(kind: str, config: dict[str, Any], where: str) -> DrafterConfig:
    row = DRAFTER_KINDS[kind]
    nested = config.get(row.config_block) if isinstance(config.get(row.config_block), dict) else {}

    def key(name: str) -> Any:
        return nested.get(name, config.get(name))

    # taps as the output of target layer k, read in the convention of the framework that trained the drafter
    found = tap_layout(kind, config)
    layout, tap_key = found if found else (None, None)
    ids = tuple(_int_list(dotted(config, tap_key), where, tap_key)) if tap_key else ()
    wiring = {
        "target_layer_ids": tuple(layout.reading.layers(ids)) if layout else (),
        "tap_layout": layout.name if layout else None,
        "tap_ids": ids,
        "tap_key": tap_key,
    }
    if row.drafting == CHAIN:  # EAGLE-3
        return DrafterConfig(
            kind,
            **wiring,
            target_hidden_size=optional_positive(config, "target_hidden_size", where),
            draft_vocab_size=optional_positive(config, "draft_vocab_size", where),
            norm_before_residual=bool(config.get("norm_before_residual", False)),
            eagle_norms=_eagle_norms(key, where),
        )
    causal = config.get("is_causal", nested.get("causal"))
    return DrafterConfig(
        kind,
        **wiring,
        block_size=_drafter_int(nested, config, "block_size", where),
        mask_token_id=_drafter_int(nested, config, "mask_token_id", where),
        is_causal=causal if isinstance(causal, bool) else None,
        num_target_layers=_drafter_int(nested, config, "num_target_layers", where),
        target_hidden_size=optional_positive(config, "target_hidden_size", where),
        **{k: _drafter_int(nested, config, k, where) for k in DFLASH2_KEYS},
        output_multiplier=_optional_number(key("output_multiplier")),
        final_logit_softcapping=_optional_number(key("final_logit_softcapping")),
        input_embedding_scale=_optional_number(key("input_embedding_scale")),
        draft_vocab_size=optional_positive(config, "draft_vocab_size", where),
    )


def _eagle_norms(key: Callable[[str], Any], where: str) -> frozenset[str]:
    """The EAGLE-3.1 norms a config turns on, at its top level or in eagle_config (NVIDIA's checkpoints: vllm#42143)."""
    on = frozenset(k for k in EAGLE_NORMS if key(k) is True)
    if {"norm_before_fc", "fc_norm"} <= on:
        raise BadInput(
            where, "turns on both norm_before_fc and fc_norm: one norm over the taps or one per tap, not both"
        )
    return on


def _drafter_int(nested: dict[str, Any], config: dict[str, Any], key: str, where: str) -> int | None:
    """A DFlash integer from dflash_config, else the top level, named in errors as the config spells it."""
    for holder, prefix in ((nested, "dflash_config."), (config, "")):
        if holder.get(key) is not None:
            value = as_int(holder[key])
            if value is None:
                raise BadInput(where, f"'{prefix}{key}' is {brief(holder[key])}, not an integer")
            return value
    return None


def _architecture(config: dict[str, Any], where: str) -> str | None:
    archs = config.get("architectures")
    if archs is None:
        return None
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise BadInput(where, f"'architectures' is {brief(archs)}, not a list of strings")
    return archs[0]


def rope_parameters(text: dict[str, Any]) -> dict[str, Any]:
    """rope_parameters (transformers 5), else the legacy rope_scaling + top-level keys, as one dict."""
    params = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else text.get("rope_scaling")
    rope = dict(params) if isinstance(params, dict) else {}
    for key in ("rope_theta", "partial_rotary_factor"):
        if rope.get(key) is None and text.get(key) is not None:
            rope[key] = text[key]
    return rope


def _layer_types(text: dict[str, Any], layers: int, linear: bool, where: str, strict: bool) -> tuple[str, ...]:
    """One type per layer; not `strict`: as given, other layer type names and counts kept."""
    given = text.get("layer_types")
    if given is not None:
        if not strict and isinstance(given, list) and all(isinstance(t, str) for t in given):
            return tuple(LAYER_TYPES.get(t, t) for t in given)
        if not (
            isinstance(given, list)
            and len(given) == layers
            and all(isinstance(t, str) and t in LAYER_TYPES for t in given)
        ):
            raise BadInput(where, f"'layer_types' is {brief(given)}, not {layers} of {', '.join(LAYER_TYPES)}")
        return tuple(LAYER_TYPES[t] for t in given)
    if linear or text.get("full_attention_interval") is not None:
        # Qwen3-Next: every interval-th layer is full attention, the rest Gated DeltaNet
        interval = positive(text, "full_attention_interval", where, 4)
        return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(layers))
    if text.get("use_sliding_window") and as_int(text.get("sliding_window")):
        # transformers' Qwen2/Qwen3 configs derive sliding layers from max_window_layers, default 28: a drafter of
        # fewer layers that leaves it out is all full attention in every stack that builds its config there
        first_sliding = as_int(text.get("max_window_layers"))
        first_sliding = QWEN_MAX_WINDOW_LAYERS if first_sliding is None else first_sliding
        return tuple("sliding" if i >= first_sliding else "full" for i in range(layers))
    return ("full",) * layers


def _window_source(text: dict[str, Any], layer_types: tuple[str, ...]) -> str | None:
    """Which declaration gave `layer_types` their sliding layers: the list itself, else use_sliding_window's rule."""
    if "sliding" not in layer_types:
        return None
    return WINDOW_IN_LAYER_TYPES if text.get("layer_types") is not None else WINDOW_IN_USE_SLIDING


def _swa_block(config: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    """A DFlash drafter's config block where it sets use_swa (ModelOpt's export), else None."""
    row = DRAFTER_KINDS[kind] if kind is not None else None
    nested = config.get(row.config_block) if row and row.config_block and row.drafting != CHAIN else None
    return nested if isinstance(nested, dict) and nested.get("use_swa") is True else None


def _count(holder: dict[str, Any], key: str, where: str) -> int:
    value = holder.get(key)
    if value is None:
        return 0
    count = as_int(value)
    if count is None or count < 0:
        raise BadInput(where, f"'{key}' is {brief(value)}, not a count")
    return count


def _ids(value: object) -> list[int]:
    if as_int(value) is not None:
        return [int(value)]
    if isinstance(value, list):
        return [int(v) for v in value if as_int(v) is not None]
    return []


def _int_list(value: object, where: str, key: str) -> list[int]:
    if not (isinstance(value, list) and all(as_int(v) is not None for v in value)):
        raise BadInput(where, f"'{key}' is {brief(value)}, not a list of integers")
    return [int(v) for v in value]


def _optional_number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# One set of rules for numbers in untrusted configs: integers may be written as 4 or 4.0, never as true.


def as_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() else None


def positive(holder: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = holder.get(key)
    if value is None:
        if default is None:
            raise BadInput(where, f"missing required key '{key}'")
        return default
    number_ = as_int(value)
    if number_ is None or number_ <= 0:
        raise BadInput(where, f"'{key}' is {brief(value)}, not a positive integer")
    return number_


def optional_positive(holder: dict[str, Any], key: str, where: str) -> int | None:
    return positive(holder, key, where) if holder.get(key) is not None else None


def number(holder: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = holder.get(key)
    if value is None:
        if default is None:
            raise BadInput(where, f"missing required key '{key}'")
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise BadInput(where, f"'{key}' is {brief(value)}, not a positive number")
    return float(value)
