"""Build a `Checkpoint` from a Hugging Face layout: config.json, quantization configs, tensor headers.

Families and drafter kinds are told apart by table lookups on `architectures` and `model_type`;
Qwen3.5/3.6 keep their language-model fields under `text_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import methodcaller
from typing import Any

from specpair.checkpoint import (
    MAX_LAYERS, Checkpoint, Drafter, FileEntry, Mtp, Quantization, Rope, Shapes, Taps,
)
from specpair.checkpoint.groups import summarize_hf
from specpair.checkpoint.tokenizer import Tokenizer
from specpair.errors import BadInput
from specpair.formats import TensorInfo, TensorTable, brief

TARGET_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
}
MODEL_TYPES = {
    "llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen3_next": "qwen3_next",
    "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
}
DRAFTER_ARCHITECTURES = {
    "DFlashDraftModel": "dflash",
    "MuseGlimmerAssistantModel": "dflash",
    "DFlashMuseGlimmerAssistantModel": "dflash",
    "DFlashLagunaForCausalLM": "dflash",
    "DFlashQwen3XPressModel": "dflash",
    "DFlash2DraftModel": "dflash2",
    "DFlash2BeamDraftModel": "dflash2",
    "MiniMaxDFlash2DraftModel": "dflash2",
    "LlamaForCausalLMEagle3": "eagle3",
    "Eagle3LlamaForCausalLM": "eagle3",
}
LAYER_TYPES = {"full_attention": "full", "linear_attention": "linear", "sliding_attention": "sliding"}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclass
class HFMetadata:
    """The small files and headers of one HF-layout checkpoint, as a source read them."""

    config: dict[str, Any]
    config_where: str
    generation_config: dict[str, Any] | None = None
    tokenizer: Tokenizer | None = None
    quant_files: dict[str, dict[str, Any]] = field(default_factory=dict)  # file name -> parsed JSON
    tensors: TensorTable | list[TensorInfo] | None = None  # None: headers were not available
    files: list[FileEntry] = field(default_factory=list)


def build(meta: HFMetadata, ref: str, source: str, revision: str | None = None) -> Checkpoint:
    config, where = meta.config, meta.config_where
    if not isinstance(config, dict):
        raise BadInput(where, "config is not a JSON object")
    architecture = _first_architecture(config, where)
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    model_type = next((t for t in (text.get("model_type"), config.get("model_type")) if isinstance(t, str)), None)
    tensors = TensorTable.of(meta.tensors) if isinstance(meta.tensors, list) else meta.tensors

    kind = _drafter_kind(config, architecture)
    family = TARGET_ARCHITECTURES.get(architecture or "") or MODEL_TYPES.get(model_type or "") or model_type
    shapes = _shapes(config, text, where, tensors or TensorTable.empty(), drafter_head=kind is not None)
    quant = _quantization(config, meta.quant_files)
    groups = summarize_hf(tensors, config.get("quantization")) if tensors is not None else []
    mtp = _mtp(text, tensors)
    drafter = _drafter(kind, config, where, tensors or TensorTable.empty(), meta.files) if kind else None
    role = "drafter" if drafter else ("both" if mtp and mtp.tensors != 0 else "target")
    return Checkpoint(
        ref=ref, source=source, format="safetensors" if tensors is not None else "config-only",
        role=role, family=family, architecture=architecture, model_type=model_type,
        shapes=shapes, rope=_rope(text), drafter=drafter, mtp=mtp, tokenizer=meta.tokenizer,
        groups=groups,
        quantization=quant, files=meta.files, revision=revision, notes=_notes(config, meta.files),
    )


def _first_architecture(config: dict[str, Any], where: str) -> str | None:
    archs = config.get("architectures")
    if archs is None:
        return None
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise BadInput(where, f"'architectures' is {brief(archs)}, not a list of strings")
    return archs[0]


def _drafter_kind(config: dict[str, Any], architecture: str | None) -> str | None:
    if architecture in DRAFTER_ARCHITECTURES:
        return DRAFTER_ARCHITECTURES[architecture]
    dflash = config.get("dflash_config")
    if isinstance(dflash, dict) or "target_layer_ids" in config:
        keys = dflash if isinstance(dflash, dict) else config
        return "dflash2" if any(k in keys for k in DFLASH2_KEYS) else "dflash"
    if isinstance(config.get("eagle_config"), dict) or "draft_vocab_size" in config:
        return "eagle3"  # EAGLE-3 heads that declare their base architecture (e.g. LlamaForCausalLM)
    return None


def _shapes(config: dict[str, Any], text: dict[str, Any], where: str, tensors: TensorTable,
            drafter_head: bool) -> Shapes:
    hidden = _required(text, "hidden_size", where)
    layers = _required(text, "num_hidden_layers", where)
    if layers > MAX_LAYERS:
        raise BadInput(where, f"'num_hidden_layers' is {layers}, more than any model has ({MAX_LAYERS})")
    heads = _required(text, "num_attention_heads", where)
    vocab = _required(text, "vocab_size", where)
    kv_heads = _int(text.get("num_key_value_heads")) or heads
    head_dim = _int(text.get("head_dim")) or hidden // heads
    layer_types = _layer_types(text, layers, where)
    # Embedding rows; a drafter's own lm_head may cover only a reduced draft vocabulary (EAGLE-3).
    suffixes = ("embed_tokens.weight",) if drafter_head else ("embed_tokens.weight", "lm_head.weight")
    names, tensor_shapes = tensors.names, tensors.shapes
    heads_and_embeddings = [k for k in compress(range(len(names)), map(methodcaller("endswith", suffixes), names))
                            if not names[k].startswith("mtp.")]
    rows = next((tensor_shapes[k][0] for k in sorted(heads_and_embeddings, key=lambda k: "lm_head" in names[k])
                 if tensor_shapes[k]), None)
    tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return Shapes(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        vocab_size=vocab, layer_types=layer_types, intermediate_size=_int(text.get("intermediate_size")),
        num_experts=_int(text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts")),
        experts_per_token=_int(text.get("num_experts_per_tok")),
        moe_intermediate_size=_int(text.get("moe_intermediate_size")),
        shared_expert_intermediate_size=_int(text.get("shared_expert_intermediate_size")),
        embedding_rows=rows, tie_word_embeddings=bool(tie),
        linear_key_heads=_int(text.get("linear_num_key_heads")),
        linear_value_heads=_int(text.get("linear_num_value_heads")),
        linear_key_head_dim=_int(text.get("linear_key_head_dim")),
        linear_value_head_dim=_int(text.get("linear_value_head_dim")),
        linear_conv_kernel=_int(text.get("linear_conv_kernel_dim")),
    )


def _layer_types(text: dict[str, Any], layers: int, where: str) -> list[str]:
    given = text.get("layer_types")
    if given is not None:
        if not (isinstance(given, list) and all(isinstance(t, str) for t in given)):
            raise BadInput(where, "'layer_types' is not a list of strings")
        return [LAYER_TYPES.get(t, t) for t in given]
    interval = _int(text.get("full_attention_interval"))
    if interval:  # Qwen3-Next: every interval-th layer is full attention, the rest Gated DeltaNet
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]
    if text.get("use_sliding_window") and _int(text.get("sliding_window")):
        first_sliding = _int(text.get("max_window_layers")) or 0
        return ["sliding" if i >= first_sliding else "full" for i in range(layers)]
    return ["full"] * layers


def _rope(text: dict[str, Any]) -> Rope:
    params = text.get("rope_parameters")
    if isinstance(params, dict):
        theta, rope_type, schema = params.get("rope_theta"), params.get("rope_type"), "rope_parameters"
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type", "partial_rotary_factor",
                                                                  "mrope_section", "mrope_interleaved")}
        partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor"))
        mrope = "mrope_section" in params
    else:
        theta, schema = text.get("rope_theta"), "rope_theta" if "rope_theta" in text else "none"
        legacy = text.get("rope_scaling") if isinstance(text.get("rope_scaling"), dict) else {}
        rope_type = legacy.get("rope_type") or legacy.get("type")
        scaling = {k: v for k, v in legacy.items() if k not in ("rope_type", "type")}
        partial, mrope = text.get("partial_rotary_factor"), "mrope_section" in legacy
    scaled = rope_type not in (None, "default")
    has_sliding = any(t == "sliding_attention" for t in text.get("layer_types") or []) or text.get("use_sliding_window")
    return Rope(
        theta=float(theta) if isinstance(theta, (int, float)) else None,
        rope_type=rope_type if isinstance(rope_type, str) else None,
        scaling=scaling if scaled and scaling else None,
        partial_rotary_factor=float(partial) if isinstance(partial, (int, float)) else None,
        mrope=mrope, max_position_embeddings=_int(text.get("max_position_embeddings")),
        sliding_window=_int(text.get("sliding_window")) if has_sliding else None,
        trained_context=_int((scaling or {}).get("original_max_position_embeddings")) if scaled else None,
        schema=schema,
    )


def _mtp(text: dict[str, Any], tensors: TensorTable | None) -> Mtp | None:
    layers = _int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers"))
    names = tensors.names if tensors is not None else []
    mtp = list(compress(range(len(names)), map(methodcaller("startswith", "mtp."), names)))
    if not layers:  # Qwen3-Next configs declare no MTP layer count, yet its repos ship mtp.* weights
        layers = len({names[k].split(".")[2] for k in mtp if names[k].startswith("mtp.layers.")})
    if not layers:
        return None
    if tensors is None:
        return Mtp(layers)
    return Mtp(layers, len(mtp), sum(tensors.nbytes[k] for k in mtp))


def _drafter(kind: str, config: dict[str, Any], where: str, tensors: TensorTable,
             files: list[FileEntry]) -> Drafter:
    nested = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    drafter = Drafter(kind=kind, config_keys=_dotted_keys(config))
    if kind in ("dflash", "dflash2"):
        for key, source in (("target_layer_ids", "dflash_config.target_layer_ids"), ("target_layer_ids", "target_layer_ids")):
            holder = nested if source.startswith("dflash_config") else config
            if key in holder:
                raw = _int_list(holder[key], where, source)
                drafter.taps = Taps(raw, raw, source, "output of decoder layer k (HF hidden_states[k + 1])")
                break
        holders = [(nested, "dflash_config."), (config, "")]
        drafter.mask_token_id, drafter.mask_token_source = _first_int(holders, "mask_token_id", where)
        drafter.block_size, drafter.block_size_source = _first_int(holders, "block_size", where)
        drafter.num_target_layers, _ = _first_int(holders, "num_target_layers", where)
        for key in DFLASH2_KEYS:
            setattr(drafter, key, _first_int(holders, key, where)[0])
        causal = config.get("is_causal", nested.get("causal"))
        drafter.is_causal = causal if isinstance(causal, bool) else None
        anchor = nested.get("sample_from_anchor")
        drafter.sample_from_anchor = anchor if isinstance(anchor, bool) else None
        required = {"taps": "dflash_config.target_layer_ids", "mask_token_id": "dflash_config.mask_token_id",
                    "block_size": "dflash_config.block_size"}
        drafter.missing_keys = [key for attr, key in required.items() if getattr(drafter, attr) is None]
        if kind == "dflash2":
            drafter.missing_keys += [f"dflash_config.{k}" for k in DFLASH2_KEYS if getattr(drafter, k) is None]
    elif kind == "eagle3":
        eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
        source = "eagle_config.eagle_aux_hidden_state_layer_ids"
        raw = eagle.get("eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids"))
        if raw is not None:
            ids = _int_list(raw, where, source)
            # vLLM: aux id j is the residual stream entering layer j, i.e. the output of layer j - 1.
            drafter.taps = Taps([i - 1 for i in ids], ids, source, "input of decoder layer k (output of layer k - 1)")
        drafter.draft_vocab_size = _int(config.get("draft_vocab_size"))
    drafter.target_hidden_size = _int(config.get("target_hidden_size"))
    names = set(tensors.names)
    fc = tensors.row("fc.weight") or tensors.row("encoder.fc.weight")
    drafter.fc_shape = list(fc.shape) if fc else None
    drafter.has_d2t = "d2t" in names
    drafter.has_lm_head = "lm_head.weight" in names
    drafter.has_embeddings = any(n.endswith("embed_tokens.weight") for n in names)
    drafter.mask_embedding_file = next((f.path for f in files if f.path.endswith("mask_embedding.pt")), None)
    return drafter


def _quantization(config: dict[str, Any], quant_files: dict[str, dict[str, Any]]) -> Quantization | None:
    qc = config.get("quantization_config") if isinstance(config.get("quantization_config"), dict) else {}
    modelopt = quant_files.get("hf_quant_config.json", {})
    hf_quant = modelopt.get("quantization", {}) if isinstance(modelopt.get("quantization"), dict) else {}
    exl3 = quant_files.get("quantization_config.json", {})
    mlx = config.get("quantization") if isinstance(config.get("quantization"), dict) else None
    method = qc.get("quant_method") or ("modelopt" if hf_quant else None) or exl3.get("quant_method")
    if not method and mlx:
        method = "mlx"
    if not method:
        return None
    producer = qc.get("producer") or modelopt.get("producer") or {}
    exclude = qc.get("ignore") or hf_quant.get("exclude_modules") or qc.get("modules_to_not_convert") or []
    block = qc.get("weight_block_size")
    algo = (qc.get("quant_algo") or hf_quant.get("quant_algo") or qc.get("format") or qc.get("codebook")
            or (mlx or {}).get("mode") or (f"block{block[0]}x{block[1]}" if isinstance(block, list) and len(block) == 2 else None))
    kv = hf_quant.get("kv_cache_quant_algo") or qc.get("kv_cache_quant_algo")
    if not kv and isinstance(qc.get("kv_cache_scheme"), dict):
        kv = f"{qc['kv_cache_scheme'].get('type', '')}{qc['kv_cache_scheme'].get('num_bits', '')}" or None
    bits = qc.get("bits", (mlx or {}).get("bits"))
    return Quantization(
        method=str(method), algo=str(algo) if algo else None,
        bits=float(bits) if isinstance(bits, (int, float)) and not isinstance(bits, bool) else None,
        group_size=_int(qc.get("group_size") or hf_quant.get("group_size") or (mlx or {}).get("group_size")),
        kv_cache=str(kv) if kv else None,
        producer=f"{producer.get('name', '')} {producer.get('version', '')}".strip() or None if isinstance(producer, dict) else None,
        exclude=[str(e) for e in exclude] if isinstance(exclude, list) else [],
    )


def _notes(config: dict[str, Any], files: list[FileEntry]) -> list[str]:
    notes = []
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict) and auto_map:
        names = ", ".join(f"{k}={v}" for k, v in auto_map.items())
        notes.append(f"auto_map names custom code ({names}): reported, never run")
    for f in files:
        if f.path.endswith(PICKLE_SUFFIXES):
            notes.append(f"pickle file {f.path}: reported, never loaded")
        elif f.path.endswith(".incomplete"):
            notes.append(f"incomplete download {f.path}: a transfer was interrupted here")
    return notes


def _dotted_keys(config: dict[str, Any]) -> list[str]:
    keys = []
    for key, value in config.items():
        keys.append(key)
        if isinstance(value, dict) and key in ("dflash_config", "rope_parameters", "eagle_config"):
            keys += [f"{key}.{k}" for k in value]
    return sorted(keys)


def _required(config: dict[str, Any], key: str, where: str) -> int:
    if key not in config:
        raise BadInput(where, f"missing required key '{key}'")
    value = _int(config[key])
    if value is None or value <= 0:
        raise BadInput(where, f"'{key}' is {brief(config[key])}, not a positive integer")
    return value


def _first_int(holders: list[tuple[dict[str, Any], str]], key: str, where: str) -> tuple[int | None, str | None]:
    """First integer value of `key` among (dict, label prefix) holders, with the key it came from."""
    for holder, prefix in holders:
        if holder.get(key) is not None:
            value = _int(holder[key])
            if value is None:
                raise BadInput(where, f"'{prefix}{key}' is {brief(holder[key])}, not an integer")
            return value, f"{prefix}{key}"
    return None, None


def _int_list(value: object, where: str, key: str) -> list[int]:
    if not (isinstance(value, list) and all(_int(v) is not None for v in value)):
        raise BadInput(where, f"'{key}' is {brief(value)}, not a list of integers")
    return [int(v) for v in value]


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() else None
