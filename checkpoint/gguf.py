"""Build a `Checkpoint` from a GGUF header: `{arch}.*` hyper-parameters, tokenizer lists, tensor infos.

Upstream llama.cpp's DFlash arch is `dflash` (taps in `dflash.target_layers` = HF ids + 1); forks
write `dflash-draft` with `dflash-draft.dflash.*` keys and HF ids. Both are read; the rules decide
which stack loads which.
"""

from __future__ import annotations

import re

from specpair.checkpoint import MAX_LAYERS, Checkpoint, Drafter, FileEntry, Mtp, Quantization, Rope, Shapes, Taps
from specpair.checkpoint.groups import group_of, summarize
from specpair.checkpoint.tokenizer import from_gguf_fields
from specpair.errors import BadInput
from specpair.formats import brief
from specpair.formats.gguf import GGUFHeader
from specpair.formats.layouts import gguf_layout

ARCH_FAMILIES = {
    "llama": "llama", "qwen3": "qwen3", "qwen3moe": "qwen3_moe", "qwen3next": "qwen3_next",
    "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe",
}
DRAFTER_ARCHS = {"dflash": "dflash", "dflash-draft": "dflash", "eagle3": "eagle3"}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
ARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # every key name and message is built from it


def build(header: GGUFHeader, ref: str, source: str, revision: str | None = None) -> Checkpoint:
    where, arch = header.path, header.architecture
    if arch is None:
        raise BadInput(where, "GGUF has no general.architecture")
    if not ARCH_NAME.fullmatch(arch):
        raise BadInput(where, f"general.architecture {brief(arch)} is not an architecture name")
    f = header.fields
    nextn = _int(f.get(f"{arch}.nextn_predict_layers")) or 0
    block_count = _required(f, f"{arch}.block_count", where)
    if block_count > MAX_LAYERS:
        raise BadInput(where, f"{arch}.block_count is {block_count}, more than any model has ({MAX_LAYERS})")
    layers = block_count - nextn if nextn < block_count else block_count
    hidden = _required(f, f"{arch}.embedding_length", where)
    heads = _required(f, f"{arch}.attention.head_count", where)
    tensors = header.tensors
    by_name = {t.name: t for t in tensors}
    embed = by_name.get("token_embd.weight") or by_name.get("output.weight")
    tokenizer = from_gguf_fields(f, where)
    vocab = _int(f.get(f"{arch}.vocab_size")) or (embed.shape[0] if embed else None) or (
        len(f["tokenizer.ggml.tokens"]) if isinstance(f.get("tokenizer.ggml.tokens"), list) else None)
    # A weights-only DFlash drafter (no tokenizer, no token_embd) uses its target's embedding and vocabulary.
    if vocab is None and DRAFTER_ARCHS.get(arch) != "dflash":
        raise BadInput(where, f"GGUF gives no vocabulary size ({arch}.vocab_size, token_embd or tokenizer.ggml.tokens)")
    key_length = _int(f.get(f"{arch}.attention.key_length")) or hidden // heads
    shapes = Shapes(
        hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=_int(f.get(f"{arch}.attention.head_count_kv")) or heads, head_dim=key_length,
        vocab_size=vocab, layer_types=_layer_types(f, arch, layers),
        intermediate_size=_int(f.get(f"{arch}.feed_forward_length")),
        num_experts=_int(f.get(f"{arch}.expert_count")), experts_per_token=_int(f.get(f"{arch}.expert_used_count")),
        moe_intermediate_size=_int(f.get(f"{arch}.expert_feed_forward_length")),
        shared_expert_intermediate_size=_int(f.get(f"{arch}.expert_shared_feed_forward_length")),
        embedding_rows=embed.shape[0] if embed else None, tie_word_embeddings="output.weight" not in by_name,
        linear_key_heads=_int(f.get(f"{arch}.ssm.group_count")),
        linear_value_heads=_int(f.get(f"{arch}.ssm.time_step_rank")),
        linear_key_head_dim=_int(f.get(f"{arch}.ssm.state_size")),
        linear_value_head_dim=_linear_value_dim(f, arch), linear_conv_kernel=_int(f.get(f"{arch}.ssm.conv_kernel")),
    )
    rope_dims = _int(f.get(f"{arch}.rope.dimension_count"))
    scaling_type = f.get(f"{arch}.rope.scaling.type")
    rope = Rope(
        theta=_float(f.get(f"{arch}.rope.freq_base")),
        rope_type=scaling_type if isinstance(scaling_type, str) else None,
        scaling={k.rsplit(".", 1)[-1]: v for k, v in f.items()
                 if k.startswith(f"{arch}.rope.scaling.") and k != f"{arch}.rope.scaling.type"} or None,
        partial_rotary_factor=rope_dims / key_length if rope_dims and key_length and rope_dims != key_length else None,
        mrope=f"{arch}.rope.dimension_sections" in f,
        max_position_embeddings=_int(f.get(f"{arch}.context_length")),
        sliding_window=_int(f.get(f"{arch}.attention.sliding_window")),
        trained_context=_int(f.get(f"{arch}.rope.scaling.original_context_length")),
        schema="gguf",
    )

    def group_for(name: str) -> str:
        block = _block_index(name)
        return "mtp" if block is not None and block >= layers else group_of(name)

    mtp = None
    if nextn:
        mtp_tensors = [t for t in tensors if group_for(t.name) == "mtp"]
        mtp = Mtp(nextn, len(mtp_tensors), sum(t.nbytes for t in mtp_tensors))
    drafter = _drafter(header, arch, by_name, tokenizer) if arch in DRAFTER_ARCHS else None
    file_type = f.get("general.file_type")
    return Checkpoint(
        ref=ref, source=source, format="gguf",
        role="drafter" if drafter else ("both" if mtp and mtp.tensors else "target"),
        family=ARCH_FAMILIES.get(arch, "qwen3" if drafter and drafter.kind.startswith("dflash") else arch),
        architecture=arch, model_type=arch, shapes=shapes, rope=rope, drafter=drafter, mtp=mtp,
        tokenizer=tokenizer, groups=summarize(tensors, {t.name: gguf_layout(t.dtype) for t in tensors}, group_for),
        quantization=Quantization(method="gguf", algo=_file_type_name(file_type)),
        files=[FileEntry(where.rsplit("/", 1)[-1], header.size)], revision=revision,
    )


def _drafter(header: GGUFHeader, arch: str, by_name: dict, tokenizer) -> Drafter:
    f = header.fields
    if arch == "eagle3":
        fc = by_name.get("fc.weight")
        return Drafter(kind="eagle3", fc_shape=list(fc.shape) if fc else None, config_keys=sorted(f))
    fork = arch == "dflash-draft"
    prefix = "dflash-draft.dflash." if fork else "dflash."
    has_selector = any(f"{prefix}{k}" in f for k in DFLASH2_KEYS) or any("selector" in n for n in by_name)
    drafter = Drafter(kind="dflash2" if has_selector else "dflash", config_keys=sorted(f))
    taps_key = f"{prefix}target_layer_ids" if fork else "dflash.target_layers"
    raw = f.get(taps_key)
    if raw is not None:
        if not (isinstance(raw, list) and all(isinstance(v, int) for v in raw)):
            raise BadInput(header.path, f"{taps_key} is not a list of integers")
        if fork:
            drafter.taps = Taps(list(raw), list(raw), taps_key, "output of decoder layer k (HF ids, fork schema)")
        else:
            drafter.taps = Taps([v - 1 for v in raw], list(raw), taps_key, "input of target layer k (= HF id + 1)")
    drafter.block_size = _int(f.get(f"{prefix}block_size"))
    drafter.block_size_source = f"{prefix}block_size" if drafter.block_size is not None else None
    mask_key = f"{prefix}mask_token_id" if fork else "tokenizer.ggml.mask_token_id"
    drafter.mask_token_id = _int(f.get(mask_key))
    drafter.mask_token_source = mask_key if drafter.mask_token_id is not None else None
    for key in DFLASH2_KEYS:
        setattr(drafter, key, _int(f.get(f"{prefix}{key}")))
    causal = f.get(f"{prefix}attention.causal")
    drafter.is_causal = causal if isinstance(causal, bool) else None
    anchor = f.get(f"{prefix}sample_from_anchor")
    drafter.sample_from_anchor = anchor if isinstance(anchor, bool) else None
    fc = by_name.get("fc.weight") or by_name.get("dflash_fc.weight") or by_name.get("dflash.fc.weight")
    drafter.fc_shape = list(fc.shape) if fc else None
    drafter.has_lm_head = "output.weight" in by_name
    drafter.has_embeddings = "token_embd.weight" in by_name
    required = {"taps": taps_key, "mask_token_id": mask_key, "block_size": f"{prefix}block_size"}
    drafter.missing_keys = [key for attr, key in required.items() if getattr(drafter, attr) is None]
    if drafter.kind == "dflash2":
        drafter.missing_keys += [f"{prefix}{k}" for k in DFLASH2_KEYS if getattr(drafter, k) is None]
    return drafter


def _layer_types(f: dict, arch: str, layers: int) -> list[str]:
    interval = _int(f.get(f"{arch}.full_attention_interval"))
    if interval:
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]
    pattern = f.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == layers:
        return ["sliding" if p else "full" for p in pattern]
    return ["full"] * layers


def _linear_value_dim(f: dict, arch: str) -> int | None:
    inner, heads = _int(f.get(f"{arch}.ssm.inner_size")), _int(f.get(f"{arch}.ssm.time_step_rank"))
    return inner // heads if inner and heads else None


def _block_index(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    index = name.split(".", 2)[1]
    return int(index) if index.isascii() and index.isdigit() else None  # "²".isdigit(), but int("²") fails


def _file_type_name(value: object) -> str | None:
    if not isinstance(value, int):
        return None
    from gguf.constants import LlamaFileType

    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"file_type {value}"


def _required(f: dict, key: str, where: str) -> int:
    value = f.get(key)
    number = _int(value)  # some arches store per-layer head counts: _int takes their max
    if number is None or number <= 0:
        raise BadInput(where, f"missing or invalid GGUF key {key} ({brief(value)})")
    return number


def _int(value: object) -> int | None:
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return max(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
