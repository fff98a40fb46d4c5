"""Build a `Checkpoint` from a GGUF header: `{arch}.*` hyper-parameters, tokenizer lists, tensor infos.

An arch specpair models is read by the one parser: the header becomes a config.json the way the converter and
the runtime read it (checkpoint/gguf_arch.py `header_config`), then `parse_config`. Other archs (families no
stack here serves) are summarised from the few keys every llama.cpp arch has, for the rules to name.

Upstream llama.cpp's DFlash arch is `dflash` (taps in `dflash.target_layers` = HF ids + 1); forks
write `dflash-draft` with `dflash-draft.dflash.*` keys and HF ids. Both are read; the rules decide
which stack loads which.
"""

from __future__ import annotations

import re

from specpair.checkpoint import Checkpoint, Drafter, FileEntry, Mtp, Quantization, Rope, Shapes, Taps, gguf_arch
from specpair.checkpoint.config import MAX_LAYERS, ModelConfig, as_int, parse_config
from specpair.checkpoint.families import (
    BY_GGUF_ARCH,
    DRAFTER_BY_GGUF_ARCH,
    DRAFTER_KINDS,
    DSPARK,
    HEAD_KIND,
    with_own_keys,
)
from specpair.checkpoint.groups import group_of, summarize
from specpair.checkpoint.tokenizer import from_gguf_fields
from specpair.errors import BadInput
from specpair.formats import brief
from specpair.formats.gguf import GGUFHeader
from specpair.formats.layouts import gguf_layout

ARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # every key name and message is built from it
HUB_URL = re.compile(r"https://huggingface\.co/([\w.-]+/[\w.-]+)/?")
NO_VOCABULARY = 1  # the placeholder a weights-only drafter is parsed with: its vocabulary is its target's


def build(header: GGUFHeader, ref: str, source: str, revision: str | None = None) -> Checkpoint:
    where, arch = header.path, header.architecture
    if arch is None:
        raise BadInput(where, "GGUF has no general.architecture")
    if not ARCH_NAME.fullmatch(arch):
        raise BadInput(where, f"general.architecture {brief(arch)} is not an architecture name")
    f = header.fields
    tensors = header.tensors
    by_name = {t.name: t for t in tensors}
    embed = by_name.get("token_embd.weight") or by_name.get("output.weight")
    tokenizer = from_gguf_fields(f, where)
    if arch in gguf_arch.ARCHS or arch == gguf_arch.FORK_ARCH:
        with gguf_arch.naming(where):
            config, _ = gguf_arch.header_config(f, {t.name: t.shape for t in tensors})
        weights_only = "vocab_size" not in config
        model = parse_config({**config, "vocab_size": NO_VOCABULARY} if weights_only else config, where, summary=True)
        shapes = Shapes.of(model, None if weights_only else model.vocab_size, embed.shape[0] if embed else None)
        rope = Rope.of(model, "gguf")
    else:
        model = None
        shapes, rope = _unmodelled(header, arch, embed, tokenizer is not None)
    block_count = _per_layer(f.get(f"{arch}.block_count"))
    nextn = block_count - shapes.num_layers if block_count else 0
    layers = shapes.num_layers

    def group_for(name: str) -> str:
        block = _block_index(name)
        return HEAD_KIND.head_group if block is not None and block >= layers else group_of(name)

    mtp = None
    if nextn:
        mtp_tensors = [t for t in tensors if group_for(t.name) == HEAD_KIND.head_group]
        mtp = Mtp(nextn, len(mtp_tensors), sum(t.nbytes for t in mtp_tensors))
    kind = DRAFTER_BY_GGUF_ARCH.get(arch)
    drafter = _drafter(header, arch, by_name, model) if kind else None
    file_type = f.get("general.file_type")
    family = BY_GGUF_ARCH.get(arch)
    return Checkpoint(
        ref=ref,
        source=source,
        format="gguf",
        role="drafter" if drafter else ("both" if mtp and mtp.tensors else "target"),
        family=family.name if family else kind.family if kind and kind.family else arch,
        architecture=arch,
        model_type=arch,
        shapes=shapes,
        rope=rope,
        drafter=drafter,
        mtp=mtp,
        tokenizer=tokenizer,
        groups=summarize(tensors, {t.name: gguf_layout(t.dtype) for t in tensors}, group_for),
        quantization=Quantization(method="gguf", algo=_file_type_name(file_type)),
        files=[FileEntry(where.rsplit("/", 1)[-1], header.size)],
        revision=revision,
    )


def _unmodelled(header: GGUFHeader, arch: str, embed, has_tokenizer: bool) -> tuple[Shapes, Rope]:
    """The shapes and rope of an arch no family here has: its common keys, as llama.cpp names them."""
    where, f = header.path, header.fields
    nextn = _per_layer(f.get(f"{arch}.nextn_predict_layers")) or 0
    block_count = _required(f, f"{arch}.block_count", where)
    if block_count > MAX_LAYERS:
        raise BadInput(where, f"{arch}.block_count is {block_count}, more than any model has ({MAX_LAYERS})")
    layers = block_count - nextn if nextn < block_count else block_count
    hidden = _required(f, f"{arch}.embedding_length", where)
    heads = _required(f, f"{arch}.attention.head_count", where)
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = (
        _per_layer(f.get(f"{arch}.vocab_size"))
        or (embed.shape[0] if embed else None)
        or (len(tokens) if has_tokenizer and isinstance(tokens, list) else None)
    )
    if vocab is None and arch not in DRAFTER_BY_GGUF_ARCH:
        raise BadInput(where, f"GGUF gives no vocabulary size ({arch}.vocab_size, token_embd or tokenizer.ggml.tokens)")
    key_length = _per_layer(f.get(f"{arch}.attention.key_length")) or hidden // heads
    shapes = Shapes(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=_per_layer(f.get(f"{arch}.attention.head_count_kv")) or heads,
        head_dim=key_length,
        vocab_size=vocab,
        layer_types=_layer_types(f, arch, layers),
        intermediate_size=_per_layer(f.get(f"{arch}.feed_forward_length")),
        embedding_rows=embed.shape[0] if embed else None,
        tie_word_embeddings="output.weight" not in {t.name for t in header.tensors},
    )
    rope_dims = _per_layer(f.get(f"{arch}.rope.dimension_count"))
    scaling_type = f.get(f"{arch}.rope.scaling.type")
    theta = f.get(f"{arch}.rope.freq_base")
    rope = Rope(
        theta=float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None,
        rope_type=scaling_type if isinstance(scaling_type, str) else None,
        scaling={
            k.rsplit(".", 1)[-1]: v
            for k, v in f.items()
            if k.startswith(f"{arch}.rope.scaling.") and k != f"{arch}.rope.scaling.type"
        }
        or None,
        partial_rotary_factor=rope_dims / key_length if rope_dims and key_length and rope_dims != key_length else None,
        mrope=f"{arch}.rope.dimension_sections" in f,
        max_position_embeddings=_per_layer(f.get(f"{arch}.context_length")),
        sliding_window=_per_layer(f.get(f"{arch}.attention.sliding_window")),
        trained_context=_per_layer(f.get(f"{arch}.rope.scaling.original_context_length")),
        schema="gguf",
    )
    return shapes, rope


def _drafter(header: GGUFHeader, arch: str, by_name: dict, model: ModelConfig | None) -> Drafter:
    f = header.fields
    if model is None:  # eagle3: no config mapping, its tensors only
        fc = by_name.get("fc.weight")
        return Drafter(
            kind=DRAFTER_BY_GGUF_ARCH[arch].name, fc_shape=list(fc.shape) if fc else None, config_keys=sorted(f)
        )
    wiring = model.drafter
    fork = arch == gguf_arch.FORK_ARCH
    prefix = "dflash-draft.dflash." if fork else "dflash."
    schema = [k for k in DRAFTER_KINDS.values() if arch in k.gguf_archs]  # the kinds this arch holds
    own_keys = [key for k in schema for key in k.own_keys]
    has_own = any(f"{prefix}{k}" in f for k in own_keys) or any("selector" in n for n in by_name)
    kind = with_own_keys(schema, has_own)
    drafter = Drafter(kind=kind.name, config_keys=sorted(f), names=_names(f))
    taps_key = f"{prefix}target_layer_ids" if fork else "dflash.target_layers"
    raw = f.get(taps_key)
    if raw is not None:
        convention = (
            "output of decoder layer k (HF ids, fork schema)" if fork else "input of target layer k (= HF id + 1)"
        )
        drafter.taps = Taps(list(wiring.target_layer_ids), list(raw), taps_key, convention)
    drafter.block_size = wiring.block_size
    drafter.block_size_source = f"{prefix}block_size" if f.get(f"{prefix}block_size") is not None else None
    mask_key = f"{prefix}mask_token_id" if fork else gguf_arch.MASK_TOKEN_KEY
    drafter.mask_token_id = wiring.mask_token_id
    drafter.mask_token_source = mask_key if drafter.mask_token_id is not None else None
    for key in kind.own_keys:
        setattr(drafter, key, getattr(wiring, key))
    drafter.is_causal = wiring.is_causal
    anchor_key = f"{prefix}sample_from_anchor"
    anchor = f.get(anchor_key)
    # as llama.cpp reads it, the value's text against "true": converters write a bool or that string
    drafter.sample_from_anchor = None if anchor is None else anchor is True or anchor == "true"
    drafter.sample_from_anchor_source = anchor_key if anchor is not None else None
    drafter.dspark_marker = next((f"tensor {t}" for t in DSPARK.gguf_tensors if t in by_name), None)
    fc = by_name.get("fc.weight") or by_name.get("dflash_fc.weight") or by_name.get("dflash.fc.weight")
    drafter.fc_shape = list(fc.shape) if fc else None
    head = by_name.get("output.weight")
    drafter.head_rows = head.shape[0] if head and head.shape else None  # a 0-d one is no head: the loader refuses it
    drafter.has_embeddings = "token_embd.weight" in by_name
    required = {"taps": taps_key, "mask_token_id": mask_key, "block_size": f"{prefix}block_size"}
    drafter.missing_keys = [key for attr, key in required.items() if getattr(drafter, attr) is None]
    drafter.missing_keys += [f"{prefix}{k}" for k in kind.own_keys if getattr(drafter, k) is None]
    return drafter


def _names(f: dict) -> list[str]:
    """What the file says it is: the repo a general.*repo_url key gives, and general.name (under
    general.organization when set), which converters write from the HF repo's or folder's name. The
    general.base_model.* keys are left out: they name what a model was trained from, not the model."""
    urls = (f.get(key) for key in ("general.repo_url", "general.source.repo_url"))
    names = [match[1] for url in urls if isinstance(url, str) and (match := HUB_URL.fullmatch(url))]
    name, organization = f.get("general.name"), f.get("general.organization")
    if isinstance(name, str) and name.strip():
        names.append(f"{organization}/{name}" if isinstance(organization, str) and organization.strip() else name)
    return names


def _layer_types(f: dict, arch: str, layers: int) -> list[str]:
    interval = _per_layer(f.get(f"{arch}.full_attention_interval"))
    if interval:
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]
    pattern = f.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == layers:
        return ["sliding" if p else "full" for p in pattern]
    return ["full"] * layers


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
    number = _per_layer(value)
    if number is None or number <= 0:
        raise BadInput(where, f"missing or invalid GGUF key {key} ({brief(value)})")
    return number


def _per_layer(value: object) -> int | None:
    """An integer key, or the largest of a per-layer list of them (some archs store head counts per layer)."""
    if isinstance(value, list) and value and all(as_int(v) is not None and isinstance(v, int) for v in value):
        return max(value)
    return value if as_int(value) is not None and isinstance(value, int) else None
