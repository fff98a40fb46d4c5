"""Build a `Checkpoint` from a Hugging Face layout: config.json, quantization configs, tensor headers.

Shapes, rope and drafter wiring come from the one config parser (checkpoint/config.py `parse_config`), so `check`
reads a config exactly as the converter and the runtime do; what is only a summary (where a key came from, which
keys a config lacks, what the tensor headers hold) is added here.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from specpair.checkpoint import Checkpoint, Drafter, FileEntry, Mtp, Quantization, Rope, Shapes, Taps, speculators
from specpair.checkpoint.config import ModelConfig, as_int, parse_config
from specpair.checkpoint.families import BLOCK, DRAFTER_KINDS, DSPARK, TAP_LAYOUTS, dotted, family_of
from specpair.checkpoint.groups import NameKinds, summarize_hf
from specpair.checkpoint.tokenizer import Tokenizer
from specpair.formats import TensorInfo, TensorTable

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
WEIGHT_PICKLE = re.compile(r"(pytorch_model|model)(-\d+-of-\d+)?\.bin")  # weights as torch.save writes them
PICKLE_WEIGHTS_NOTE = "pickle weights only"  # the note of a checkpoint whose weights are pickles alone


def from_pickle_command(ref: str) -> str:
    """The command that makes a safetensors copy of a checkpoint whose weights are pickles only (convert/pickled.py,
    torch's weights-only loader), into a directory named after it."""
    name = os.path.basename(ref.rstrip("/")).partition("@")[0] or "checkpoint"
    return shlex.join(["specpair", "convert", ref, f"{name}-safetensors", "--from-pickle"])


# Config objects whose keys the per-stack required-key rules name with a dot (Drafter.config_keys)
NESTED_KEYS = {"rope_parameters", *(k.config_block for k in DRAFTER_KINDS.values() if k.config_block)}


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
    pin, native_keys, kind = None, False, None
    if speculators.is_speculators(config):  # read as the config vLLM builds from it, the verifier pin kept
        config, pin, kind = speculators.read(meta.config, where)
        native_keys = "model_type" in meta.config and isinstance(meta.config.get(kind.config_block), dict)
    model = parse_config(config, where, summary=True)
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    model_type = next((t for t in (text.get("model_type"), config.get("model_type")) if isinstance(t, str)), None)
    tensors = TensorTable.of(meta.tensors) if isinstance(meta.tensors, list) else meta.tensors
    known = family_of(model.architecture, model_type)
    names = NameKinds.of(tensors) if tensors is not None else None
    shapes = _shapes(model, tensors or TensorTable.empty(), names or NameKinds.of(TensorTable.empty()))
    quant = _quantization(config, meta.quant_files)
    groups = summarize_hf(tensors, config.get("quantization"), names) if tensors is not None else []
    mtp = _mtp(model, tensors, names)
    drafter = _drafter(model, config, tensors or TensorTable.empty(), meta.files) if model.drafter else None
    if drafter and pin:
        drafter.verifier, drafter.verifier_architectures = pin.name_or_path, list(pin.architectures)
        drafter.native_keys = native_keys
        if drafter.taps:  # as the file has them
            key = kind.speculators.taps_key
            convention = "input of decoder layer k (speculators, vLLM: the output of layer k - 1)"
            drafter.taps = Taps(drafter.taps.layers, list(meta.config[key]), key, convention)
    role = "drafter" if drafter else ("both" if mtp and mtp.tensors != 0 else "target")
    return Checkpoint(
        ref=ref,
        source=source,
        format="safetensors" if tensors is not None else "config-only",
        role=role,
        family=known.name if known else model_type,
        architecture=model.architecture,
        model_type=model_type,
        shapes=shapes,
        rope=_rope(model, text),
        drafter=drafter,
        mtp=mtp,
        tokenizer=meta.tokenizer,
        groups=groups,
        quantization=quant,
        files=meta.files,
        revision=revision,
        notes=_notes(config, meta.files),
    )


def _shapes(model: ModelConfig, tensors: TensorTable, names: NameKinds) -> Shapes:
    # Embedding rows; a drafter's own lm_head may cover only a reduced draft vocabulary (EAGLE-3).
    modules = ("embed_tokens",) if model.drafter else ("embed_tokens", "lm_head")
    wanted = {kind for kind, *_ in names.signatures if kind.endswith(modules) and not kind.startswith("mtp.")}
    rows = names.rows_of(wanted, "weight")  # the names that end in "embed_tokens.weight" (or "lm_head.weight")
    tensor_shapes = tensors.shapes
    embedding_rows = next(
        (tensor_shapes[k][0] for k in sorted(rows, key=lambda k: "lm_head" in names.kinds[k]) if tensor_shapes[k]),
        None,
    )
    return Shapes.of(model, model.vocab_size, embedding_rows)


def _rope(model: ModelConfig, text: dict[str, Any]) -> Rope:
    schema = (
        "rope_parameters"
        if isinstance(text.get("rope_parameters"), dict)
        else ("rope_theta" if "rope_theta" in text else "none")
    )
    return Rope.of(model, schema)


def _mtp(model: ModelConfig, tensors: TensorTable | None, names: NameKinds | None) -> Mtp | None:
    layers = model.mtp_layers
    if not layers and tensors is not None:  # Qwen3-Next configs declare no MTP layer count, yet its repos ship mtp.*
        layers = len({n.split(".")[2] for n in tensors.names if n.startswith("mtp.layers.")})
    if not layers:
        return None
    if tensors is None or names is None:
        return Mtp(layers)
    return Mtp(layers, *names.prefixed("mtp."))


def _drafter(model: ModelConfig, config: dict[str, Any], tensors: TensorTable, files: list[FileEntry]) -> Drafter:
    wiring = model.drafter
    row = DRAFTER_KINDS[wiring.kind]
    block = row.config_block
    nested = config.get(block) if isinstance(config.get(block), dict) else {}
    drafter = Drafter(kind=wiring.kind, config_keys=_dotted_keys(config))
    if wiring.tap_key is not None:
        layout = TAP_LAYOUTS[wiring.tap_layout]
        drafter.taps = Taps(
            list(wiring.target_layer_ids), list(wiring.tap_ids), wiring.tap_key, layout.title, layout.name
        )

    def source(key: str) -> str | None:
        """The key a value came from, as the config spells it."""
        return f"{block}.{key}" if nested.get(key) is not None else key if config.get(key) is not None else None

    if row.drafting == BLOCK:
        drafter.mask_token_id, drafter.mask_token_source = wiring.mask_token_id, source("mask_token_id")
        drafter.block_size, drafter.block_size_source = wiring.block_size, source("block_size")
        drafter.num_target_layers = wiring.num_target_layers
        for key in row.own_keys:
            setattr(drafter, key, getattr(wiring, key))
        drafter.is_causal = wiring.is_causal
        # vLLM's DFlash reads the key in the block, SGLang's DSpark the top-level one
        anchor = next((k for k in (f"{block}.sample_from_anchor", "sample_from_anchor") if _is_bool(config, k)), None)
        drafter.sample_from_anchor = dotted(config, anchor) if anchor else None
        drafter.sample_from_anchor_source = anchor
        drafter.dspark_marker = DSPARK.marker(model.architecture, config, block)
        required = {"taps": "target_layer_ids", "mask_token_id": "mask_token_id", "block_size": "block_size"}
        missing = [key for attr, key in required.items() if getattr(drafter, attr) is None]
        missing += [k for k in row.own_keys if getattr(drafter, k) is None]
        drafter.missing_keys = [f"{block}.{key}" for key in missing]
    else:  # EAGLE-3
        drafter.draft_vocab_size = wiring.draft_vocab_size
        drafter.eagle_norms = sorted(wiring.eagle_norms)
    drafter.target_hidden_size = wiring.target_hidden_size
    names = set(tensors.names)
    fc = tensors.row("fc.weight") or tensors.row("encoder.fc.weight")
    drafter.fc_shape = list(fc.shape) if fc else None
    drafter.has_d2t = "d2t" in names
    head = tensors.row("lm_head.weight")
    drafter.head_rows = head.shape[0] if head and head.shape else None  # a 0-d one is no head: the loader refuses it
    drafter.has_embeddings = any(n.endswith("embed_tokens.weight") for n in names)
    if row.mask_embedding is not None:
        shipped = tensors.row(row.mask_embedding.tensor)
        drafter.mask_embedding_shape = list(shipped.shape) if shipped else None
        drafter.mask_embedding_file = next((f.path for f in files if f.path == row.mask_embedding.pickle), None)
    return drafter


def _is_bool(config: dict[str, Any], key: str) -> bool:
    return isinstance(dotted(config, key), bool)


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
    algo = (
        qc.get("quant_algo")
        or hf_quant.get("quant_algo")
        or qc.get("format")
        or qc.get("codebook")
        or (mlx or {}).get("mode")
        or (f"block{block[0]}x{block[1]}" if isinstance(block, list) and len(block) == 2 else None)
    )
    kv = hf_quant.get("kv_cache_quant_algo") or qc.get("kv_cache_quant_algo")
    if not kv and isinstance(qc.get("kv_cache_scheme"), dict):
        kv = f"{qc['kv_cache_scheme'].get('type', '')}{qc['kv_cache_scheme'].get('num_bits', '')}" or None
    bits = qc.get("bits", (mlx or {}).get("bits"))
    return Quantization(
        method=str(method),
        algo=str(algo) if algo else None,
        bits=float(bits) if isinstance(bits, (int, float)) and not isinstance(bits, bool) else None,
        group_size=as_int(qc.get("group_size") or hf_quant.get("group_size") or (mlx or {}).get("group_size")),
        kv_cache=str(kv) if kv else None,
        producer=f"{producer.get('name', '')} {producer.get('version', '')}".strip() or None
        if isinstance(producer, dict)
        else None,
        exclude=[str(e) for e in exclude] if isinstance(exclude, list) else [],
    )


def _notes(config: dict[str, Any], files: list[FileEntry]) -> list[str]:
    notes = []
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict) and auto_map:
        names = ", ".join(f"{k}={v}" for k, v in auto_map.items())
        notes.append(f"auto_map names custom code ({names}): reported, never run")
    weight_pickles = [f.path for f in files if WEIGHT_PICKLE.fullmatch(f.path)]
    if weight_pickles and not any(f.path.endswith(".safetensors") for f in files):
        notes.append(f"{PICKLE_WEIGHTS_NOTE} ({', '.join(weight_pickles)}): no .safetensors weights")
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
        if isinstance(value, dict) and key in NESTED_KEYS:
            keys += [f"{key}.{k}" for k in value]
    return sorted(keys)
