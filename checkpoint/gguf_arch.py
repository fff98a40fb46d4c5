"""HF checkpoints <-> llama.cpp GGUF, per architecture: the `{arch}.*` hyper-parameters and the tensor map.

`to_gguf(config, tensors)` plans a GGUF from a config.json and the logical HF tensors (name -> float shape,
[out, in]); `from_gguf(fields, tensors)` plans a config.json and HF tensors from a GGUF header (tensor
shapes in numpy order). Both directions build the same `_Layout` from the same tables, so every tensor
transform sits next to its inverse. Facts follow llama.cpp as vendored in llama-cpp-python 0.3.36
(conversion/qwen.py, conversion/llama.py, src/models/*.cpp); the `dflash` arch, missing from PyPI gguf
0.19.0, is defined here with llama.cpp's key and tensor names. Fork GGUFs of arch `dflash-draft`
(keys `dflash-draft.dflash.*` with HF tap ids, tensors `dflash_fc` / `dflash_hidden_norm`) are read too.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specpair.checkpoint.config import as_int, parse_config, rope_parameters
from specpair.checkpoint.families import (
    BY_ARCHITECTURE,
    BY_MODEL_TYPE,
    COMMON,
    DFLASH2_KEYS,
    DFLASH_KEYS,
    DRAFTER_KINDS,
    FAMILIES,
    HYBRID,
    MOE,
    MROPE,
    NEXTN,
    SHARED,
    UPSTREAM_GGUF_ARCH,
    VOCAB,
    Family,
    GGUFArch,
)
from specpair.errors import BadInput
from specpair.formats import brief
from specpair.formats.gguf import ValueType
from specpair.formats.transforms import Step, TensorMap

U32, F32, BOOL, STR, ARRAY = ValueType.UINT32, ValueType.FLOAT32, ValueType.BOOL, ValueType.STRING, ValueType.ARRAY
CONFIG = "config.json"
HEADER = "GGUF header"
MASK_TOKEN_KEY = "tokenizer.ggml.mask_token_id"
FORK_ARCH = "dflash-draft"
QWEN35_DEFAULT_SECTIONS = [11, 11, 10, 0]  # llama.cpp's qwen35 loaders require sections; its converter's default
LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 1.0, 4.0  # every Llama 3.x release


@dataclass(frozen=True)
class Arch:
    """How one GGUF architecture lays out a model: its family's facts and llama.cpp's (the family table's rows)."""

    hf_architecture: str  # what from_gguf writes
    model_type: str
    post_norm: str  # GGUF name of post_attention_layernorm
    groups: frozenset[str]  # hyper-parameter groups of HPARAMS it writes
    zero_centred: bool = False  # RMSNorm gains applied as 1 + w; llama.cpp stores 1 + w
    qk_norm: bool = True
    gated_attention: bool = False  # q_proj emits query and gate per head (2 * head_dim rows)
    linear: str | None = None  # Gated DeltaNet projections: "split" (Qwen3.5) or "fused" (Qwen3-Next)
    v_reorder: bool = False  # value heads grouped -> tiled when linear_num_value_heads != linear_num_key_heads
    experts: str | None = None  # from_gguf expert storage: "fused" 3-D or "per-expert"; None: dense MLP
    shared_expert: bool = False
    rope_dims: str = ""  # rope.dimension_count: "full" (head_dim), "partial" (head_dim * partial_rotary_factor)
    rope_permute: bool = False  # llama.cpp ropes llama GPT-J style: q/k rows go back to interleaved pairs
    mtp: bool = False  # MTP head as extra blocks with nextn.* tensors
    mtp_count_in_config: bool = False
    renormalises_topk: bool = False
    config_extras: dict[str, Any] = field(default_factory=dict)
    prefix: str = "model."  # HF name prefix of the language model (from_gguf)
    drafter: bool = False
    llama3_rope: bool = False


def _arch(family: Family, gguf: GGUFArch, drafter: bool) -> Arch:
    return Arch(
        gguf.hf_architecture,
        gguf.model_type,
        gguf.post_norm,
        gguf.groups,
        family.zero_centred_norms,
        family.qk_norm,
        family.gated_attention,
        family.linear_attention,
        gguf.v_reorder,
        family.experts,
        family.shared_expert,
        gguf.rope_dims,
        gguf.rope_permute,
        gguf.mtp,
        gguf.mtp_count_in_config,
        gguf.renormalises_topk,
        gguf.config_extras,
        "" if drafter else "model.",
        drafter,
        gguf.llama3_rope,
    )


ARCHS: dict[str, Arch] = {
    **{f.gguf_arch: _arch(f, f.gguf, False) for f in FAMILIES.values() if f.gguf},
    **{k.gguf_archs[0]: _arch(FAMILIES[k.family], k.gguf, True) for k in DRAFTER_KINDS.values() if k.gguf},
}
# drafter checkpoints written as GGUF: each kind's first architecture, into its first GGUF arch
DRAFTER_ARCHS = {k.hf_architectures[0]: k.gguf_archs[0] for k in DRAFTER_KINDS.values() if k.gguf}

# Hyper-parameters: (group, key under "{arch}.", canonical name, GGUF type). Canonical names are HF config
# keys where one exists; the others are computed on both sides by _hparams_from_config / _config_from_hparams.
HPARAMS: tuple[tuple[str, str, str, ValueType], ...] = (
    (COMMON, "context_length", "max_position_embeddings", U32),
    (COMMON, "embedding_length", "hidden_size", U32),
    (COMMON, "block_count", "block_count", U32),  # decoder blocks + MTP blocks
    (COMMON, "feed_forward_length", "intermediate_size", U32),
    (COMMON, "attention.head_count", "num_attention_heads", U32),
    (COMMON, "attention.head_count_kv", "num_key_value_heads", U32),
    (COMMON, "attention.key_length", "head_dim", U32),
    (COMMON, "attention.value_length", "head_dim", U32),
    (COMMON, "attention.layer_norm_rms_epsilon", "rms_norm_eps", F32),
    (COMMON, "rope.freq_base", "rope_theta", F32),
    (COMMON, "rope.dimension_count", "rope_dims", U32),
    (COMMON, "rope.scaling.type", "rope_scaling_type", STR),
    (COMMON, "rope.scaling.factor", "factor", F32),
    (COMMON, "rope.scaling.original_context_length", "original_max_position_embeddings", U32),
    (VOCAB, "vocab_size", "vocab_size", U32),  # only llama's loader reads it; the others count tokens
    (MOE, "expert_count", "num_experts", U32),
    (MOE, "expert_used_count", "num_experts_per_tok", U32),
    (MOE, "expert_feed_forward_length", "moe_intermediate_size", U32),
    (SHARED, "expert_shared_feed_forward_length", "shared_expert_intermediate_size", U32),
    (HYBRID, "full_attention_interval", "full_attention_interval", U32),
    (HYBRID, "attention.recurrent_layers", "recurrent_layers", ARRAY),  # per block, MTP blocks False
    (HYBRID, "ssm.conv_kernel", "linear_conv_kernel_dim", U32),
    (HYBRID, "ssm.state_size", "linear_key_head_dim", U32),
    (HYBRID, "ssm.group_count", "linear_num_key_heads", U32),
    (HYBRID, "ssm.time_step_rank", "linear_num_value_heads", U32),
    (HYBRID, "ssm.inner_size", "linear_value_size", U32),  # linear_value_head_dim * linear_num_value_heads
    (MROPE, "rope.dimension_sections", "rope_sections", ARRAY),
    (NEXTN, "nextn_predict_layers", "mtp_num_hidden_layers", U32),
    (DFLASH_KEYS, "block_size", "block_size", U32),
    (DFLASH_KEYS, "target_layers", "target_layers", ARRAY),  # HF target_layer_ids + 1: the input of target layer L
    (DFLASH_KEYS, "attention.sliding_window", "sliding_window", U32),
    (DFLASH_KEYS, "attention.sliding_window_pattern", "sliding_layers", ARRAY),
    (DFLASH_KEYS, "attention.causal", "is_causal", BOOL),
    (DFLASH_KEYS, "rope.dimension_sections", "rope_sections", ARRAY),  # degenerate M-RoPE for Qwen3.5 targets
    (DFLASH_KEYS, "conv_kernel_size", "conv_kernel_size", U32),
    (DFLASH_KEYS, "conv_group_size", "conv_group_size", U32),
    (DFLASH_KEYS, "selector_rank", "selector_rank", U32),
    (DFLASH_KEYS, "selector_top_k", "selector_top_k", U32),
)
GGUF_KEYS = {name: key for _, key, name, _ in HPARAMS}  # canonical name -> key under "{arch}."
# DFlash variant keys llama.cpp's converter maps but this module does not (yet): refused, never dropped.
UNMAPPED_DFLASH_KEYS = (
    "output_multiplier",
    "final_logit_softcapping",
    "input_embedding_scale",
    "attention_value_scale",
    "sample_from_anchor",
    "draft_vocab_size",
)
YARN_KEYS = ("factor", "original_max_position_embeddings")  # the YaRN keys mapped; others are refused
# The fork schema keeps DFlash keys under "dflash-draft.dflash." (HF tap ids, the mask token) -> upstream keys;
# n_target_features is fc.weight's input width, which the tensor check covers.
FORK_KEYS = {
    "block_size": "dflash.block_size",
    "target_layer_ids": "dflash.target_layers",
    "mask_token_id": MASK_TOKEN_KEY,
    "n_target_features": None,
}
# HF config keys copied as they are between the canonical values and config.json.
CONFIG_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "vocab_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "full_attention_interval",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "sliding_window",
)
CONFIG_ALIASES = {"num_local_experts": "num_experts"}  # transformers 5 saves Qwen3-MoE's expert count so
ROPE_SCALINGS = (None, "none", "linear", "yarn")  # rope.scaling.type values with an HF form
TOKEN_ID_KEYS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
}
# Tensor rows: (HF name under the block or model prefix, GGUF name under "blk.N." or top level,
# HF shape as size names of _sizes(), transform of TRANSFORMS or None).
Row = tuple[str, str, tuple[str, ...], str | None]
Steps = tuple[Step, ...]
# (arch, sizes, HF shape) -> (GGUF shape, steps HF -> GGUF, steps GGUF -> HF)
Transform = Callable[["Arch", dict[str, int], tuple[int, ...]], tuple[tuple[int, ...], Steps, Steps]]
TARGET_TOP: tuple[Row, ...] = (
    ("embed_tokens.weight", "token_embd.weight", ("vocab", "hidden"), None),
    ("norm.weight", "output_norm.weight", ("hidden",), "norm"),
)
LM_HEAD: Row = ("lm_head.weight", "output.weight", ("vocab", "hidden"), None)  # outside the prefix; absent when tied
DFLASH_TOP: tuple[Row, ...] = (
    ("fc.weight", "fc.weight", ("hidden", "fc_inputs"), None),
    ("hidden_norm.weight", "enc.output_norm.weight", ("hidden",), None),
    ("norm.weight", "output_norm.weight", ("hidden",), None),
)
DFLASH2_TOP: tuple[Row, ...] = (
    ("candidate_selector.hidden_projection.weight", "selector_hidden.weight", ("selector_rank", "hidden"), None),
    ("candidate_selector.predecessor_codebook", "selector_predecessor.weight", ("vocab", "selector_rank"), None),
    ("candidate_selector.successor_codebook", "selector_successor.weight", ("vocab", "selector_rank"), None),
)
ATTENTION: tuple[Row, ...] = (
    ("self_attn.q_proj.weight", "attn_q.weight", ("q_rows", "hidden"), "rope_q"),
    ("self_attn.k_proj.weight", "attn_k.weight", ("kv_rows", "hidden"), "rope_k"),
    ("self_attn.v_proj.weight", "attn_v.weight", ("kv_rows", "hidden"), None),
    ("self_attn.o_proj.weight", "attn_output.weight", ("hidden", "attn_size"), None),
)
QK_NORM: tuple[Row, ...] = (
    ("self_attn.q_norm.weight", "attn_q_norm.weight", ("head_dim",), "norm"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", ("head_dim",), "norm"),
)
GATED_DELTANET_SPLIT: tuple[Row, ...] = (  # Qwen3.5
    ("linear_attn.in_proj_qkv.weight", "attn_qkv.weight", ("conv_dim", "hidden"), "v_part_rows"),
    ("linear_attn.in_proj_z.weight", "attn_gate.weight", ("value_dim", "hidden"), "v_rows"),
    ("linear_attn.in_proj_b.weight", "ssm_beta.weight", ("v_heads", "hidden"), "head_rows"),
    ("linear_attn.in_proj_a.weight", "ssm_alpha.weight", ("v_heads", "hidden"), "head_rows"),
)
GATED_DELTANET_FUSED: tuple[Row, ...] = (  # Qwen3-Next; in_proj_qkvz is split by _split_qkvz
    ("linear_attn.in_proj_ba.weight", "ssm_ba.weight", ("ba_rows", "hidden"), None),
)
GATED_DELTANET: tuple[Row, ...] = (
    ("linear_attn.A_log", "ssm_a", ("v_heads",), "a_log"),
    ("linear_attn.dt_bias", "ssm_dt.bias", ("v_heads",), "head_entries"),
    ("linear_attn.conv1d.weight", "ssm_conv1d.weight", ("conv_dim", "one", "conv_kernel"), "conv"),
    ("linear_attn.norm.weight", "ssm_norm.weight", ("v_head_dim",), None),  # gated norm: a plain gain, no +1
    ("linear_attn.out_proj.weight", "ssm_out.weight", ("hidden", "value_dim"), "v_cols"),
)
DENSE_MLP: tuple[Row, ...] = (
    ("mlp.gate_proj.weight", "ffn_gate.weight", ("ff", "hidden"), None),
    ("mlp.up_proj.weight", "ffn_up.weight", ("ff", "hidden"), None),
    ("mlp.down_proj.weight", "ffn_down.weight", ("hidden", "ff"), None),
)
ROUTER: Row = ("mlp.gate.weight", "ffn_gate_inp.weight", ("experts", "hidden"), None)
SHARED_EXPERT: tuple[Row, ...] = (
    ("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", ("shared_ff", "hidden"), None),
    ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", ("shared_ff", "hidden"), None),
    ("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", ("hidden", "shared_ff"), None),
    ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", ("one", "hidden"), None),
)
MTP_HEAD: tuple[Row, ...] = (  # HF names at top level; GGUF names under the first MTP block
    ("mtp.fc.weight", "nextn.eh_proj.weight", ("hidden", "hidden2"), None),
    ("mtp.pre_fc_norm_embedding.weight", "nextn.enorm.weight", ("hidden",), "norm"),
    ("mtp.pre_fc_norm_hidden.weight", "nextn.hnorm.weight", ("hidden",), "norm"),
    ("mtp.norm.weight", "nextn.shared_head_norm.weight", ("hidden",), "norm"),
)
DFLASH2_CONV: tuple[Row, ...] = (
    ("attention_conv.base_kernel", "attn_conv_base", ("two", "conv_kernel_size", "hidden"), None),
    ("attention_conv.kernel_projection.weight", "attn_conv_proj.weight", ("conv_proj", "hidden"), None),
    ("mlp_conv.base_kernel", "ffn_conv_base", ("two", "conv_kernel_size", "hidden"), None),
    ("mlp_conv.kernel_projection.weight", "ffn_conv_proj.weight", ("conv_proj", "hidden"), None),
)
EXPERT_PROJECTIONS = (
    ("gate_proj", "ffn_gate_exps.weight"),
    ("up_proj", "ffn_up_exps.weight"),
    ("down_proj", "ffn_down_exps.weight"),
)
FUSED_GATE_UP_GGUF = "ffn_gate_up_exps.weight"  # llama.cpp's optional fused form: gate rows first, as HF
# Fork GGUF tensor names -> upstream names.
FORK_TENSORS = {
    "dflash_fc.weight": "fc.weight",
    "dflash.fc.weight": "fc.weight",
    "dflash_hidden_norm.weight": "enc.output_norm.weight",
    "dflash.hidden_norm.weight": "enc.output_norm.weight",
}
FORK_POST_NORM = re.compile(r"blk\.(\d+)\.post_attention_norm\.weight")  # forks use it for post_attention_layernorm
DROPPED_PREFIXES = {
    "model.visual.": "vision tower (llama.cpp keeps it in a separate mmproj GGUF)",
    **{
        k.mask_embedding.tensor: "the drafter's learned mask embedding: llama.cpp's dflash has no place for it and "
        "drafts with the target's row of the mask token"
        for k in DRAFTER_KINDS.values()
        if k.mask_embedding
    },
}


@dataclass
class GGUFPlan:
    arch: str  # general.architecture to write
    fields: list[tuple[str, object, ValueType]]  # every {arch}.* key (+ tokenizer.ggml.mask_token_id for dflash)
    tensors: list[TensorMap]  # GGUF name, numpy-order logical shape, HF sources, steps
    notes: list[str] = field(default_factory=list)  # what was dropped and why


@dataclass
class HFPlan:
    config: dict[str, Any]  # config.json
    tensors: list[TensorMap]  # HF name, logical shape, GGUF sources, steps
    notes: list[str] = field(default_factory=list)


def to_gguf(
    config: dict[str, Any],
    tensors: dict[str, tuple[int, ...]],
    *,
    mtp: bool = True,
    target_config: dict[str, Any] | None = None,
) -> GGUFPlan:
    """Plan the GGUF of an HF checkpoint. `mtp=False` drops the MTP head; `target_config` (a drafter's
    target config.json) decides the drafter's degenerate M-RoPE sections."""
    arch, notes = _arch_of_config(config), []
    names = set(tensors)
    for prefix, why in DROPPED_PREFIXES.items():
        dropped = sorted(n for n in names if n.startswith(prefix))
        if dropped:
            notes.append(f"dropped {len(dropped)} {prefix}* tensors: {why}")
            names -= set(dropped)
    mtp_names = {n for n in names if n.startswith("mtp.")}
    hp = _hparams_from_config(arch, config, names, mtp, target_config, notes)
    _check_counts(arch, hp, {n: tensors[n] for n in names}, CONFIG)
    _check_sizes(arch, hp, {n: tensors[n] for n in names}, CONFIG)
    if mtp_names and not hp.get("mtp_num_hidden_layers"):
        why = (
            "not asked for (mtp=False)"
            if not mtp
            else "no mtp.layers.* decoder layer to carry the head"
            if ARCHS[arch].mtp
            else f"llama.cpp's {arch} has no MTP head"
        )
        notes.append(f"dropped {len(mtp_names)} mtp.* tensors: {why}")
        names -= mtp_names
    layout = _layout(arch, hp, _hf_storage(arch, hp, names), gguf_fused=set())
    _check_tensors(CONFIG, {n: tensors[n] for n in names}, {m.name: m.shape for m in layout.hf}, "HF")
    fields = [
        (f"{arch}.{key}", hp[name], vtype)
        for group, key, name, vtype in HPARAMS
        if group in ARCHS[arch].groups and hp.get(name) is not None
    ]
    if "mask_token_id" in hp:
        fields.append((MASK_TOKEN_KEY, hp["mask_token_id"], U32))
    return GGUFPlan(arch, fields, layout.gguf, notes)


def hf_shapes(config: dict[str, Any], tensors: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shape of every HF tensor `config` describes, by name (`tensors`: the checkpoint's names, which decide
    fused or per-expert storage, with their stored shapes); for padded layouts whose stored shapes hide the real
    ones (EXL3)."""
    arch = _arch_of_config(config)
    names = set(tensors)
    hp = _hparams_from_config(arch, config, names, True, None, [])
    _check_counts(arch, hp, tensors, CONFIG)
    _check_sizes(arch, hp, tensors, CONFIG)
    return {m.name: m.shape for m in _layout(arch, hp, _hf_storage(arch, hp, names), gguf_fused=set()).hf}


def from_gguf(
    fields: dict[str, object],
    tensors: dict[str, tuple[int, ...]],
    *,
    rope_freqs: Sequence[float] | None = None,
    target_vocab: int | None = None,
) -> HFPlan:
    """Plan the config.json and HF tensors of a GGUF. `rope_freqs` are the values of `rope_freqs.weight`
    when the GGUF has one: llama.cpp keeps Llama 3 rope scaling as that tensor's data, not as keys.
    `target_vocab` is the vocabulary of a weights-only drafter GGUF (no tokenizer, no token_embd): its target's."""
    arch, fields, tensors, stored_names, hp, notes = _read_header(fields, tensors, target_vocab, complete=True)
    if "rope_freqs.weight" in tensors:
        if rope_freqs is None:
            raise BadInput(
                "rope_freqs.weight", "Llama 3 rope scaling is this tensor's data: pass its values as rope_freqs"
            )
        hp["llama3"] = _llama3_scaling(rope_freqs, hp["rope_theta"], hp["head_dim"])
    gguf_fused = {i for i in range(hp["block_count"]) if f"blk.{i}.{FUSED_GATE_UP_GGUF}" in tensors}
    layout = _layout(arch, hp, _hf_output_storage(arch, hp, "output.weight" in tensors), gguf_fused)
    # Numpy shapes that differ in leading 1s are one ggml tensor (ne padded with 1s): writers differ there.
    single = {m.sources[0] for m in layout.hf if len(m.sources) == 1}
    padded = {
        n
        for n, shape in tensors.items()
        if n in single
        and n in layout.gguf_shapes
        and _ggml_ne(shape) == _ggml_ne(layout.gguf_shapes[n])
        and tuple(shape) != layout.gguf_shapes[n]
    }
    _check_tensors(
        HEADER, {n: layout.gguf_shapes[n] if n in padded else s for n, s in tensors.items()}, layout.gguf_shapes, "GGUF"
    )
    hf = [
        TensorMap(m.name, m.shape, m.sources, (Step("reshape", (layout.gguf_shapes[m.sources[0]],)), *m.steps))
        if m.sources[0] in padded
        else m
        for m in layout.hf
    ]
    if stored_names:  # sources by the names the file stores them under
        hf = [TensorMap(m.name, m.shape, tuple(stored_names.get(s, s) for s in m.sources), m.steps) for m in hf]
    return HFPlan(_config_from_hparams(arch, hp, fields, tensors, notes), hf, notes)


def header_config(fields: dict[str, object], tensors: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[str]]:
    """The config.json of a GGUF header and notes, from its keys and tensor shapes alone: the hyper-parameters
    from_gguf reads, read the same way, for a summary (`check`). Keys a conversion needs but a summary can do
    without (the norm epsilon, the context length, a drafter's wiring) may be absent; Llama 3 rope scaling,
    which is tensor data, is left out."""
    arch, fields, tensors, _, hp, notes = _read_header(fields, tensors, None, complete=False)
    return _config_from_hparams(arch, hp, fields, tensors, notes), notes


def weights_only_drafter(fields: dict[str, object], tensors: dict[str, tuple[int, ...]]) -> bool:
    """A drafter GGUF that says nothing of its vocabulary (no tokenizer, no embedding or head): its target's,
    which from_gguf then needs as `target_vocab`."""
    arch = fields.get("general.architecture")
    arch = UPSTREAM_GGUF_ARCH.get(arch, arch)
    return (
        arch in ARCHS
        and ARCHS[arch].drafter
        and "tokenizer.ggml.tokens" not in fields
        and "token_embd.weight" not in tensors
        and "output.weight" not in tensors
    )


def _read_header(
    fields: dict[str, object], tensors: dict[str, tuple[int, ...]], target_vocab: int | None, complete: bool
) -> tuple[str, dict[str, object], dict[str, tuple[int, ...]], dict[str, str], dict[str, Any], list[str]]:
    """(arch, upstream fields, upstream tensor shapes, fork name of each upstream tensor, hyper-parameters,
    notes) of a GGUF header; a fork's `dflash-draft` header is read as upstream `dflash`."""
    stored_arch = fields.get("general.architecture")
    if not isinstance(stored_arch, str):
        raise BadInput(HEADER, "missing general.architecture")
    arch = UPSTREAM_GGUF_ARCH.get(stored_arch, stored_arch)
    if arch not in ARCHS:
        raise BadInput(
            HEADER,
            f"general.architecture {brief(stored_arch)} has no HF mapping "
            f"(known: {', '.join(sorted(ARCHS))}, {FORK_ARCH})",
        )
    notes: list[str] = []
    stored_names: dict[str, str] = {}
    if stored_arch == FORK_ARCH:
        fields, tensors, stored_names = _upstream_fork(fields, tensors, notes)
    hp = _hparams_from_fields(arch, fields, tensors, target_vocab, complete)
    _check_counts(arch, hp, tensors, HEADER)
    _check_sizes(arch, hp, tensors, HEADER)
    return arch, fields, tensors, stored_names, hp, notes


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """This module names what it reads "config.json" or "GGUF header": say which file (`path`) that is."""
    try:
        yield
    except BadInput as e:
        if e.where in (CONFIG, HEADER):
            raise BadInput(path, e.problem) from None
        raise


# --------------------------------------------------------------------------------------------------
# hyper-parameters


def _arch_of_config(config: dict[str, Any]) -> str:
    if not isinstance(config, dict):
        raise BadInput(CONFIG, "config is not a JSON object")
    archs = config.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if architecture in DRAFTER_ARCHS:
        return DRAFTER_ARCHS[architecture]
    model_type = config.get("model_type")
    family = BY_ARCHITECTURE.get(architecture or "") or (
        BY_MODEL_TYPE.get(model_type) if architecture is None and isinstance(model_type, str) else None
    )
    if family is None:
        raise BadInput(
            CONFIG,
            f"architecture {brief(architecture)} has no GGUF mapping (known: "
            f"{', '.join(sorted([*BY_ARCHITECTURE, *DRAFTER_ARCHS]))})",
        )
    return family.gguf_arch


def _hparams_from_config(
    arch: str,
    config: dict[str, Any],
    names: set[str],
    mtp: bool,
    target_config: dict[str, Any] | None,
    notes: list[str],
) -> dict[str, Any]:
    spec = ARCHS[arch]
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    text = {**{CONFIG_ALIASES[k]: v for k, v in text.items() if k in CONFIG_ALIASES}, **text}
    hp: dict[str, Any] = {}
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings"):
        hp[key] = _positive(text, key, CONFIG)
    hp["num_key_value_heads"] = _positive(text, "num_key_value_heads", CONFIG, hp["num_attention_heads"])
    hp["head_dim"] = _positive(text, "head_dim", CONFIG, hp["hidden_size"] // hp["num_attention_heads"])
    hp["rms_norm_eps"] = _number(text, "rms_norm_eps", CONFIG)
    if text.get("hidden_act", "silu") != "silu":
        raise BadInput(CONFIG, f"'hidden_act' is {brief(text['hidden_act'])}: llama.cpp builds these archs with SiLU")
    if spec.experts is None or text.get("intermediate_size") is not None:  # MoE configs may carry an unused one
        hp["intermediate_size"] = _positive(text, "intermediate_size", CONFIG)
    rope = _rope(text)
    hp["rope_theta"] = _number(rope, "rope_theta", CONFIG)
    hp.update(_rope_scaling(arch, spec, rope))
    partial = rope.get("partial_rotary_factor", 0.25 if spec.rope_dims == "partial" and not spec.drafter else None)
    if partial is not None and not (
        isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial <= 1
    ):
        raise BadInput(CONFIG, f"'partial_rotary_factor' is {brief(partial)}, not a number in (0, 1]")
    if spec.rope_dims == "full":
        hp["rope_dims"] = hp["head_dim"]
    elif spec.rope_dims == "partial" and partial is not None:
        hp["rope_dims"] = int(hp["head_dim"] * partial)
    if MROPE in spec.groups:
        section = rope.get("mrope_section")
        hp["rope_sections"] = [*section, 0, 0, 0][:4] if isinstance(section, list) else QWEN35_DEFAULT_SECTIONS
    if spec.experts is not None:
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            hp[key] = _positive(text, key, CONFIG)
        if spec.renormalises_topk and text.get("norm_topk_prob") is False:
            raise BadInput(CONFIG, "'norm_topk_prob' is false: llama.cpp always renormalises the top-k expert weights")
        if text.get("mlp_only_layers") or text.get("decoder_sparse_step", 1) != 1:
            raise BadInput(
                CONFIG, "'mlp_only_layers' / 'decoder_sparse_step' make dense layers: llama.cpp's MoE loaders have none"
            )
    if spec.shared_expert:
        hp["shared_expert_intermediate_size"] = _positive(text, "shared_expert_intermediate_size", CONFIG)
    if spec.linear:
        _hybrid_from_config(hp, text)
    if spec.mtp:
        declared = text.get("mtp_num_hidden_layers") or 0
        shipped = len({n.split(".")[2] for n in names if n.startswith("mtp.layers.")})
        if declared and not shipped:
            notes.append(f"config declares {declared} MTP layer(s) but the checkpoint has no mtp.* tensors")
        if shipped > 1:
            raise BadInput(CONFIG, f"{shipped} MTP layers: llama.cpp's {arch} loader takes one")
        if shipped and mtp:
            hp["mtp_num_hidden_layers"] = shipped
    hp["block_count"] = hp["num_hidden_layers"] + hp.get("mtp_num_hidden_layers", 0)
    if spec.linear:
        hp["recurrent_layers"] = [t == "linear" for t in hp["layer_types"]] + [False] * hp.get(
            "mtp_num_hidden_layers", 0
        )
    if spec.drafter:
        _dflash_from_config(hp, config, target_config, notes)
    return hp


def _rope(text: dict[str, Any]) -> dict[str, Any]:
    """config.py's one rope dict, with its rope_type spelled out."""
    rope = rope_parameters(text)
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope


def _rope_scaling(arch: str, spec: Arch, rope: dict[str, Any]) -> dict[str, Any]:
    rope_type = rope["rope_type"]
    if rope_type == "default":
        return {}
    if rope_type == "linear":
        return {"rope_scaling_type": "linear", "factor": _number(rope, "factor", CONFIG)}
    if rope_type == "yarn":
        extra = sorted(set(rope) - {*YARN_KEYS, "rope_type", "type", "rope_theta", "partial_rotary_factor"})
        if extra:
            raise BadInput(CONFIG, f"YaRN parameters {', '.join(extra)} have no GGUF mapping here")
        return {
            "rope_scaling_type": "yarn",
            "factor": _number(rope, "factor", CONFIG),
            "original_max_position_embeddings": _positive(rope, "original_max_position_embeddings", CONFIG),
        }
    if rope_type == "llama3" and spec.llama3_rope:
        return {
            "llama3": {
                "factor": _number(rope, "factor", CONFIG),
                "low_freq_factor": _number(rope, "low_freq_factor", CONFIG),
                "high_freq_factor": _number(rope, "high_freq_factor", CONFIG),
                "original_max_position_embeddings": _positive(rope, "original_max_position_embeddings", CONFIG),
            }
        }
    raise BadInput(CONFIG, f"rope_type {brief(rope_type)} has no GGUF form for {arch}")


def _hybrid_from_config(hp: dict[str, Any], text: dict[str, Any]) -> None:
    for key in (
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
    ):
        hp[key] = _positive(text, key, CONFIG)
    if hp["linear_num_value_heads"] % hp["linear_num_key_heads"]:
        raise BadInput(CONFIG, "'linear_num_value_heads' is not a multiple of 'linear_num_key_heads'")
    hp["linear_value_size"] = hp["linear_value_head_dim"] * hp["linear_num_value_heads"]
    interval = _positive(text, "full_attention_interval", CONFIG, 4)
    hp["full_attention_interval"] = interval
    layers = hp["num_hidden_layers"]
    given = text.get("layer_types")
    if given is None:
        hp["layer_types"] = ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]
    elif isinstance(given, list) and len(given) == layers and set(given) <= {"full_attention", "linear_attention"}:
        hp["layer_types"] = ["linear" if t == "linear_attention" else "full" for t in given]
    else:
        raise BadInput(CONFIG, f"'layer_types' is {brief(given)}, not {layers} of full_attention / linear_attention")


def _dflash_from_config(
    hp: dict[str, Any], config: dict[str, Any], target_config: dict[str, Any] | None, notes: list[str]
) -> None:
    nested = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}

    def key(name: str) -> Any:
        return nested.get(name, config.get(name))

    unmapped = [name for name in UNMAPPED_DFLASH_KEYS if key(name) is not None]
    if unmapped:
        raise BadInput(CONFIG, f"drafter key '{unmapped[0]}' has no GGUF mapping here")
    taps = key("target_layer_ids")
    if not (isinstance(taps, list) and taps and all(_is_int(t) and t >= 0 for t in taps)):
        raise BadInput(CONFIG, f"'dflash_config.target_layer_ids' is {brief(taps)}, not a list of layer ids")
    hp["target_layers"] = [as_int(t) + 1 for t in taps]
    hp["fc_inputs"] = len(taps) * hp["hidden_size"]  # llama.cpp feeds the taps at the draft's own width
    for name in ("block_size", "mask_token_id"):
        if not _is_int(key(name)):
            raise BadInput(CONFIG, f"missing required key 'dflash_config.{name}'")
        hp[name] = as_int(key(name))
    present = [k for k in DFLASH2_KEYS if key(k) is not None]
    if present and len(present) != len(DFLASH2_KEYS):
        raise BadInput(CONFIG, f"DFlash-2 needs all of {', '.join(DFLASH2_KEYS)}; has only {', '.join(present)}")
    for name in present:
        hp[name] = _positive({name: key(name)}, name, CONFIG)
    if present:
        hp["conv_proj"] = 2 * hp["conv_kernel_size"] * hp["hidden_size"] // hp["conv_group_size"]
    # the attention as specpair reads it (the window from every declaration: layer_types, use_sliding_window,
    # ModelOpt's use_swa), so the GGUF windows what the runtime and the stacks that read the HF config window
    model = parse_config(config, CONFIG)
    if model.drafter is not None and model.drafter.is_causal is not None:
        hp["is_causal"] = model.drafter.is_causal
    if "sliding" in model.layer_types:
        if model.sliding_window is None:
            raise BadInput(CONFIG, "the drafter has sliding layers but no window size")
        hp["sliding_window"] = model.sliding_window
        hp["sliding_layers"] = [t == "sliding" for t in model.layer_types]
    target_text = (target_config or {}).get("text_config", target_config or {})
    if "mrope_section" in _rope(target_text):  # the draft ropes on the target's temporal M-RoPE section
        hp["rope_sections"] = [hp["head_dim"] // 2, 0, 0, 0]
    for unmapped in ("num_target_layers", "target_hidden_size"):
        if config.get(unmapped) is not None:
            notes.append(f"'{unmapped}' dropped: llama.cpp's dflash arch has no key for it")


def _hparams_from_fields(
    arch: str, fields: dict[str, object], tensors: dict[str, tuple[int, ...]], target_vocab: int | None, complete: bool
) -> dict[str, Any]:
    """The hyper-parameters of a header; not `complete`: what a conversion needs but a summary does without may
    be absent (every value present is read and checked all the same)."""
    spec = ARCHS[arch]
    hp: dict[str, Any] = {
        name: _as_written(fields[f"{arch}.{key}"], vtype)
        for group, key, name, vtype in HPARAMS
        if group in spec.groups and f"{arch}.{key}" in fields
    }
    for key in ("block_count", "hidden_size", "num_attention_heads"):
        hp[key] = _positive(hp, key, HEADER, arch=arch)
    if hp["block_count"] > len(tensors):  # before any per-block list is made (_check_counts says why)
        raise BadInput(
            HEADER, f"'{arch}.block_count' is {hp['block_count']}, but the file holds only {len(tensors)} tensors"
        )
    hp["num_key_value_heads"] = _positive(hp, "num_key_value_heads", HEADER, hp["num_attention_heads"], arch=arch)
    hp["head_dim"] = _positive(hp, "head_dim", HEADER, hp["hidden_size"] // hp["num_attention_heads"], arch=arch)
    hp["rope_theta"] = _number(hp, "rope_theta", HEADER, arch) if "rope_theta" in hp else 10000.0  # llama.cpp's default
    for key in ("rope_dims", *(key for _, key in SIZE_KEYS)):
        if key in hp:  # one number each (llama.cpp reads per-layer arrays for archs not mapped here)
            hp[key] = _positive(hp, key, HEADER, arch=arch)
    if complete or "rms_norm_eps" in hp:
        hp["rms_norm_eps"] = _number(hp, "rms_norm_eps", HEADER, arch)
    tokens = fields.get("tokenizer.ggml.tokens")
    embedding = tensors.get("token_embd.weight") or tensors.get("output.weight")
    vocab = (
        hp.get("vocab_size")
        or (embedding[0] if embedding else None)
        or (len(tokens) if isinstance(tokens, list) else None)
        or (target_vocab if spec.drafter else None)
    )
    if _is_int(vocab):
        hp["vocab_size"] = as_int(vocab)
    elif complete or not spec.drafter:  # a weights-only drafter's vocabulary is its target's
        raise BadInput(HEADER, f"no vocabulary size ({arch}.vocab_size, token_embd.weight or tokenizer.ggml.tokens)")
    if complete or "max_position_embeddings" in hp:
        hp["max_position_embeddings"] = _positive(hp, "max_position_embeddings", HEADER, arch=arch)
    mtp_layers = hp.get("mtp_num_hidden_layers", 0) if spec.mtp else 0
    if not _is_int(mtp_layers) or not 0 <= mtp_layers <= 1:
        raise BadInput(HEADER, f"{arch}.nextn_predict_layers is {brief(mtp_layers)}, not 0 or 1")
    hp["mtp_num_hidden_layers"] = as_int(mtp_layers)
    hp["num_hidden_layers"] = hp["block_count"] - mtp_layers
    if spec.experts is None and (complete or "intermediate_size" in hp):
        hp["intermediate_size"] = _positive(hp, "intermediate_size", HEADER, arch=arch)
    elif spec.experts is not None:
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            hp[key] = _positive(hp, key, HEADER, arch=arch)
    if spec.shared_expert:
        hp["shared_expert_intermediate_size"] = _positive(hp, "shared_expert_intermediate_size", HEADER, arch=arch)
    if spec.linear:
        for key in (
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_value_size",
        ):
            hp[key] = _positive(hp, key, HEADER, arch=arch)
        hp["linear_value_head_dim"] = hp["linear_value_size"] // hp["linear_num_value_heads"]
        interval = _positive(hp, "full_attention_interval", HEADER, 4, arch=arch)
        hp["full_attention_interval"] = interval
        recurrent = hp.get("recurrent_layers")
        if isinstance(recurrent, list) and len(recurrent) == hp["block_count"]:
            hp["layer_types"] = ["linear" if r else "full" for r in recurrent[: hp["num_hidden_layers"]]]
        else:
            hp["layer_types"] = [
                "full" if (i + 1) % interval == 0 else "linear" for i in range(hp["num_hidden_layers"])
            ]
    if (
        MROPE in spec.groups
        and (complete or "rope_sections" in hp)
        and not (isinstance(hp.get("rope_sections"), list) and len(hp["rope_sections"]) == 4)
    ):
        raise BadInput(HEADER, f"{arch}.rope.dimension_sections is {brief(hp.get('rope_sections'))}, not 4 sections")
    if spec.drafter:
        taps = hp.get("target_layers")
        if complete or taps is not None:
            if not (isinstance(taps, list) and taps and all(_is_int(t) and t >= 1 for t in taps)):
                raise BadInput(HEADER, f"dflash.target_layers is {brief(taps)}, not a list of layer ids >= 1")
            hp["fc_inputs"] = len(taps) * hp["hidden_size"]
        if complete or "block_size" in hp:
            hp["block_size"] = _positive(hp, "block_size", HEADER, 16, arch=arch)  # llama.cpp's default
        mask = fields.get(MASK_TOKEN_KEY)
        if complete and not _is_int(mask):
            raise BadInput(HEADER, f"missing {MASK_TOKEN_KEY}")
        if mask is not None:
            hp["mask_token_id"] = as_int(mask) if _is_int(mask) else mask
        present = [k for k in DFLASH2_KEYS if k in hp]
        if complete and present and len(present) != len(DFLASH2_KEYS):
            raise BadInput(HEADER, f"DFlash-2 needs all of dflash.{', dflash.'.join(DFLASH2_KEYS)}")
        for key in present:
            hp[key] = _positive(hp, key, HEADER, arch=arch)
        if len(present) == len(DFLASH2_KEYS):
            hp["conv_proj"] = 2 * hp["conv_kernel_size"] * hp["hidden_size"] // hp["conv_group_size"]
    return hp


def _config_from_hparams(
    arch: str, hp: dict[str, Any], fields: dict[str, object], tensors: dict[str, tuple[int, ...]], notes: list[str]
) -> dict[str, Any]:
    spec = ARCHS[arch]
    dflash2 = "selector_rank" in hp
    config: dict[str, Any] = {
        "architectures": ["DFlash2DraftModel" if dflash2 else spec.hf_architecture],
        "model_type": spec.model_type,
        "num_hidden_layers": hp["num_hidden_layers"],
    }
    config.update({key: hp[key] for key in CONFIG_KEYS if hp.get(key) is not None})
    config.update(
        {key: as_int(fields[gguf_key]) for key, gguf_key in TOKEN_ID_KEYS.items() if _is_int(fields.get(gguf_key))}
    )
    config.update(spec.config_extras)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": hp["rope_theta"]}
    scaling = hp.get("rope_scaling_type")
    if scaling not in ROPE_SCALINGS:
        raise BadInput(HEADER, f"{arch}.rope.scaling.type {brief(scaling)} has no HF form")
    if scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=_number(hp, "factor", HEADER, arch))
    if scaling == "yarn":
        rope["original_max_position_embeddings"] = _positive(hp, "original_max_position_embeddings", HEADER, arch=arch)
    if "llama3" in hp:
        rope.update(rope_type="llama3", **hp["llama3"])
    if spec.rope_dims == "partial" and "rope_dims" in hp:
        rope["partial_rotary_factor"] = hp["rope_dims"] / hp["head_dim"]
    if MROPE in spec.groups and "rope_sections" in hp:
        rope.update(mrope_section=hp["rope_sections"][:3], mrope_interleaved=True)
    config["rope_parameters"] = rope
    if spec.linear:
        config["layer_types"] = [f"{t}_attention" for t in hp["layer_types"]]
    if spec.mtp_count_in_config:
        config["mtp_num_hidden_layers"] = hp["mtp_num_hidden_layers"]
    if not spec.drafter:
        config["tie_word_embeddings"] = "output.weight" not in tensors
        return config
    dflash_config = {key: hp[key] for key in ("block_size", "mask_token_id") if key in hp}
    if "target_layers" in hp:
        dflash_config["target_layer_ids"] = [t - 1 for t in hp["target_layers"]]
    dflash_config.update({key: hp[key] for key in DFLASH2_KEYS if key in hp})
    config["dflash_config"] = dflash_config
    if "is_causal" in hp:
        config["is_causal"] = hp["is_causal"]
    pattern = hp.get("sliding_layers")
    if hp.get("sliding_window") and isinstance(pattern, list) and len(pattern) == hp["num_hidden_layers"]:
        config["layer_types"] = ["sliding_attention" if s else "full_attention" for s in pattern]
        config["use_sliding_window"] = True  # so transformers' Qwen3Config keeps the window
    else:
        config.pop("sliding_window", None)
        config["layer_types"] = ["full_attention"] * hp["num_hidden_layers"]
    if "rope_sections" in hp:
        notes.append("dflash.rope.dimension_sections dropped: it follows the target's M-RoPE, not a drafter key")
    return config


def _upstream_fork(
    fields: dict[str, object], tensors: dict[str, tuple[int, ...]], notes: list[str]
) -> tuple[dict[str, object], dict[str, tuple[int, ...]], dict[str, str]]:
    """A `dflash-draft` fork header as the upstream `dflash` one: keys, tap ids + 1, tensor names, and the
    fork's name of each upstream tensor name."""
    fork_prefix = f"{FORK_ARCH}.dflash."
    upstream = {
        (f"dflash.{k.removeprefix(FORK_ARCH + '.')}" if k.startswith(FORK_ARCH + ".") else k): v
        for k, v in fields.items()
        if not k.startswith(fork_prefix)
    }
    for key, value in fields.items():
        if not key.startswith(fork_prefix):
            continue
        name = key.removeprefix(fork_prefix)
        if name not in FORK_KEYS:
            notes.append(f"{key} dropped: upstream dflash has no such key")
        elif name == "target_layer_ids":
            if not (isinstance(value, list) and all(_is_int(v) for v in value)):
                raise BadInput(HEADER, f"{key} is {brief(value)}, not a list of layer ids")
            upstream["dflash.target_layers"] = [as_int(v) + 1 for v in value]
        elif FORK_KEYS[name]:
            upstream[FORK_KEYS[name]] = value
    renamed, fork_names = {}, {}
    for name, shape in tensors.items():
        post_norm = FORK_POST_NORM.fullmatch(name)
        upstream_name = f"blk.{post_norm[1]}.ffn_norm.weight" if post_norm else FORK_TENSORS.get(name, name)
        renamed[upstream_name] = shape
        fork_names[upstream_name] = name
    return upstream, renamed, fork_names


# --------------------------------------------------------------------------------------------------
# tensors


@dataclass
class _Layout:
    gguf: list[TensorMap] = field(default_factory=list)  # GGUF tensors from HF sources (to_gguf)
    hf: list[TensorMap] = field(default_factory=list)  # HF tensors from GGUF sources (from_gguf)
    gguf_shapes: dict[str, tuple[int, ...]] = field(
        default_factory=dict
    )  # GGUF tensors, also forms to_gguf never writes

    def add_gguf(self, tensor: TensorMap) -> None:
        self.gguf.append(tensor)
        self.gguf_shapes[tensor.name] = tensor.shape

    def pair(
        self,
        hf_name: str,
        gguf_name: str,
        hf_shape: tuple[int, ...],
        gguf_shape: tuple[int, ...],
        to_gguf: Steps,
        from_gguf: Steps,
    ) -> None:
        self.add_gguf(TensorMap(gguf_name, gguf_shape, (hf_name,), to_gguf))
        self.hf.append(TensorMap(hf_name, hf_shape, (gguf_name,), from_gguf))


@dataclass(frozen=True)
class _Storage:
    """How the HF side stores what has more than one form."""

    prefix: str  # of the language model's names
    fused_experts: frozenset[int]  # blocks whose routed experts are 3-D gate_up_proj / down_proj
    lm_head: bool


def _hf_storage(arch: str, hp: dict[str, Any], names: set[str]) -> _Storage:
    spec = ARCHS[arch]
    prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in names else spec.prefix
    fused = frozenset(
        i for i in range(hp["block_count"]) if f"{_hf_block(prefix, i, hp)}mlp.experts.gate_up_proj" in names
    )
    return _Storage(prefix, fused, "lm_head.weight" in names)


def _hf_output_storage(arch: str, hp: dict[str, Any], lm_head: bool) -> _Storage:
    # Qwen3.5-MoE repos fuse the main layers' experts and keep the MTP layer's per expert.
    fused = range(hp["num_hidden_layers"]) if ARCHS[arch].experts == "fused" else ()
    return _Storage(ARCHS[arch].prefix, frozenset(fused), lm_head)


def _hf_block(prefix: str, i: int, hp: dict[str, Any]) -> str:
    layers = hp["num_hidden_layers"]
    return f"{prefix}layers.{i}." if i < layers else f"mtp.layers.{i - layers}."


def _layout(arch: str, hp: dict[str, Any], hf: _Storage, gguf_fused: set[int]) -> _Layout:
    spec, sizes, layout = ARCHS[arch], _sizes(arch, hp), _Layout()

    def add(rows: Sequence[Row], hf_prefix: str, gguf_prefix: str) -> None:
        for hf_name, gguf_name, shape_names, transform in rows:
            hf_shape = tuple(sizes[s] for s in shape_names)
            gguf_shape, forward, inverse = (
                TRANSFORMS[transform](spec, sizes, hf_shape) if transform else (hf_shape, (), ())
            )
            layout.pair(hf_prefix + hf_name, gguf_prefix + gguf_name, hf_shape, gguf_shape, forward, inverse)

    if spec.drafter:
        add(DFLASH_TOP + (DFLASH2_TOP if "selector_rank" in hp else ()), "", "")
    else:
        add(TARGET_TOP, hf.prefix, "")
    if hf.lm_head and not spec.drafter:
        add((LM_HEAD,), "", "")
    if "llama3" in hp:
        factors = tuple(_llama3_factors(hp["llama3"], hp["rope_theta"], hp["head_dim"]))
        layout.add_gguf(TensorMap("rope_freqs.weight", (len(factors),), (), (Step("values", (factors,)),)))
    for i in range(hp["block_count"]):
        hf_prefix, gguf_prefix = _hf_block(hf.prefix, i, hp), f"blk.{i}."
        add(
            (
                ("input_layernorm.weight", "attn_norm.weight", ("hidden",), "norm"),
                ("post_attention_layernorm.weight", f"{spec.post_norm}.weight", ("hidden",), "norm"),
            ),
            hf_prefix,
            gguf_prefix,
        )
        if i < hp["num_hidden_layers"] and spec.linear and hp["layer_types"][i] == "linear":
            if spec.linear == "fused":
                _split_qkvz(layout, sizes, hf_prefix, gguf_prefix)
            add(
                (GATED_DELTANET_SPLIT if spec.linear == "split" else GATED_DELTANET_FUSED) + GATED_DELTANET,
                hf_prefix,
                gguf_prefix,
            )
        else:
            add(ATTENTION + (QK_NORM if spec.qk_norm else ()), hf_prefix, gguf_prefix)
        if spec.experts is None:
            add(DENSE_MLP, hf_prefix, gguf_prefix)
        else:
            add((ROUTER,), hf_prefix, gguf_prefix)
            _experts(layout, sizes, hf_prefix, gguf_prefix, i in hf.fused_experts, i in gguf_fused)
        if spec.shared_expert:
            add(SHARED_EXPERT, hf_prefix, gguf_prefix)
        if "selector_rank" in hp:
            add(DFLASH2_CONV, hf_prefix, gguf_prefix)
        if i == hp["num_hidden_layers"]:
            add(MTP_HEAD, "", gguf_prefix)
    return layout


# the named sizes tensor shapes are made of, and the hyper-parameter each is
SIZE_KEYS = (
    ("ff", "intermediate_size"),
    ("experts", "num_experts"),
    ("moe_ff", "moe_intermediate_size"),
    ("shared_ff", "shared_expert_intermediate_size"),
    ("k_heads", "linear_num_key_heads"),
    ("v_heads", "linear_num_value_heads"),
    ("k_head_dim", "linear_key_head_dim"),
    ("v_head_dim", "linear_value_head_dim"),
    ("conv_kernel", "linear_conv_kernel_dim"),
    ("fc_inputs", "fc_inputs"),
    ("selector_rank", "selector_rank"),
    ("conv_kernel_size", "conv_kernel_size"),
    ("conv_proj", "conv_proj"),
)


def _sizes(arch: str, hp: dict[str, Any]) -> dict[str, int]:
    spec = ARCHS[arch]
    hidden, heads, head_dim = hp["hidden_size"], hp["num_attention_heads"], hp["head_dim"]
    sizes = {
        "hidden": hidden,
        "hidden2": 2 * hidden,
        "vocab": hp.get("vocab_size", 0),
        "head_dim": head_dim,
        "one": 1,
        "two": 2,
        "heads": heads,
        "kv_heads": hp["num_key_value_heads"],
        "q_rows": heads * head_dim * (2 if spec.gated_attention else 1),
        "attn_size": heads * head_dim,
        "kv_rows": hp["num_key_value_heads"] * head_dim,
    }
    sizes.update({name: hp[key] for name, key in SIZE_KEYS if key in hp})
    if spec.linear:
        sizes["keys"] = sizes["k_heads"] * sizes["k_head_dim"]
        sizes["value_dim"] = sizes["v_heads"] * sizes["v_head_dim"]
        sizes["conv_dim"] = 2 * sizes["keys"] + sizes["value_dim"]
        sizes["ba_rows"] = 2 * sizes["v_heads"]
    return sizes


def _experts(
    layout: _Layout, sizes: dict[str, int], hf_prefix: str, gguf_prefix: str, hf_fused: bool, gguf_fused: bool
) -> None:
    """Routed experts. GGUF stacks them: ffn_{gate,up,down}_exps [E, rows, cols], or (read only: to_gguf
    writes gate and up apart, as llama.cpp's converter does) ffn_gate_up_exps [E, 2I, H]. HF keeps one
    tensor per expert, or 3-D gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I]."""
    experts, moe_ff, hidden = sizes["experts"], sizes["moe_ff"], sizes["hidden"]
    base, gguf = f"{hf_prefix}mlp.experts.", {proj: gguf_prefix + name for proj, name in EXPERT_PROJECTIONS}
    shapes = {"gate_proj": (moe_ff, hidden), "up_proj": (moe_ff, hidden), "down_proj": (hidden, moe_ff)}
    halves = {"gate_proj": (0, moe_ff), "up_proj": (moe_ff, 2 * moe_ff)}
    for proj, name in gguf.items():
        if gguf_fused and proj != "down_proj":
            continue
        if hf_fused:
            source = f"{base}down_proj" if proj == "down_proj" else f"{base}gate_up_proj"
            steps = () if proj == "down_proj" else (Step("rows", halves[proj]),)
            layout.add_gguf(TensorMap(name, (experts, *shapes[proj]), (source,), steps))
        else:
            sources = tuple(f"{base}{e}.{proj}.weight" for e in range(experts))
            layout.add_gguf(TensorMap(name, (experts, *shapes[proj]), sources, (Step("stack"),)))
    if gguf_fused:
        layout.gguf_shapes[gguf_prefix + FUSED_GATE_UP_GGUF] = (experts, 2 * moe_ff, hidden)
    gate_up = (gguf_prefix + FUSED_GATE_UP_GGUF,) if gguf_fused else (gguf["gate_proj"], gguf["up_proj"])
    if hf_fused:
        steps = () if gguf_fused else (Step("cat_rows"),)
        layout.hf.append(TensorMap(f"{base}gate_up_proj", (experts, 2 * moe_ff, hidden), gate_up, steps))
        layout.hf.append(TensorMap(f"{base}down_proj", (experts, hidden, moe_ff), (gguf["down_proj"],)))
        return
    for proj, name in gguf.items():
        half = (Step("rows", halves[proj]),) if gguf_fused and proj != "down_proj" else ()
        source = gate_up[0] if half else name
        for e in range(experts):
            layout.hf.append(
                TensorMap(f"{base}{e}.{proj}.weight", shapes[proj], (source,), (Step("select", (e,)), *half))
            )


def _split_qkvz(layout: _Layout, sizes: dict[str, int], hf_prefix: str, gguf_prefix: str) -> None:
    """Qwen3-Next's in_proj_qkvz holds, per key head, [q, k, v (r heads), z (r heads)]; llama.cpp splits it
    into attn_qkv = [all q, all k, all v] and attn_gate = [all z], value heads still grouped by key head."""
    k_heads, k_dim = sizes["k_heads"], sizes["k_head_dim"]
    v_per_k = sizes["v_heads"] // k_heads * sizes["v_head_dim"]
    block = 2 * k_dim + 2 * v_per_k
    parts = {
        "q": (0, k_dim),
        "k": (k_dim, 2 * k_dim),
        "v": (2 * k_dim, 2 * k_dim + v_per_k),
        "z": (2 * k_dim + v_per_k, block),
    }

    def gather(*names: str) -> tuple[int, ...]:
        return tuple(g * block + r for name in names for g in range(k_heads) for r in range(*parts[name]))

    qkv, z = gather("q", "k", "v"), gather("z")
    hidden, hf_name = sizes["hidden"], f"{hf_prefix}linear_attn.in_proj_qkvz.weight"
    qkv_name, gate_name = f"{gguf_prefix}attn_qkv.weight", f"{gguf_prefix}attn_gate.weight"
    layout.add_gguf(TensorMap(qkv_name, (len(qkv), hidden), (hf_name,), (Step("take_rows", (qkv,)),)))
    layout.add_gguf(TensorMap(gate_name, (len(z), hidden), (hf_name,), (Step("take_rows", (z,)),)))
    layout.hf.append(
        TensorMap(
            hf_name,
            (k_heads * block, hidden),
            (qkv_name, gate_name),
            (Step("cat_rows"), Step("take_rows", (_inverse(qkv + z),))),
        )
    )


# Transforms: each gives the GGUF shape and both directions' steps, so every step sits next to its inverse.


def _norm(spec: Arch, sizes: dict[str, int], shape: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
    if not spec.zero_centred:
        return shape, (), ()
    return shape, (Step("add", (1.0,)),), (Step("add", (-1.0,)),)


def _permuted(shape: tuple[int, ...], op: str, perm: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
    return shape, (Step(op, (perm,)),), (Step(op, (_inverse(perm),)),)


def _rope_rows(heads: str) -> Transform:
    def transform(spec: Arch, sizes: dict[str, int], shape: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
        if not spec.rope_permute:
            return shape, (), ()
        # HF rotates half-dims (NeoX); llama.cpp's llama rotates adjacent pairs: per head, row 2i + s = HF row s * hd/2 + i.
        half = sizes["head_dim"] // 2
        perm = tuple(h * 2 * half + s * half + i for h in range(sizes[heads]) for i in range(half) for s in range(2))
        return _permuted(shape, "take_rows", perm)

    return transform


def _v_order(sizes: dict[str, int], head_dim: int) -> tuple[int, ...]:
    """Grouped -> tiled value heads: tiled head j * Hk + k is grouped head k * r + j (r per key head),
    `head_dim` rows each."""
    k_heads, per_k = sizes["k_heads"], sizes["v_heads"] // sizes["k_heads"]
    return tuple((k * per_k + j) * head_dim + t for j in range(per_k) for k in range(k_heads) for t in range(head_dim))


def _reorders(spec: Arch, sizes: dict[str, int]) -> bool:
    return spec.v_reorder and sizes["v_heads"] != sizes["k_heads"]


def _v_rows(after_qk: bool, head_dim: str | None) -> Transform:
    """Value-head rows in tiled order; `after_qk`: the q and k rows before them stay (in_proj_qkv, conv1d)."""

    def transform(spec: Arch, sizes: dict[str, int], shape: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
        if not _reorders(spec, sizes):
            return shape, (), ()
        offset = 2 * sizes["keys"] if after_qk else 0
        perm = tuple(range(offset)) + tuple(offset + p for p in _v_order(sizes, sizes[head_dim] if head_dim else 1))
        return _permuted(shape, "take_rows", perm)

    return transform


def _head_entries(spec: Arch, sizes: dict[str, int], shape: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
    if not _reorders(spec, sizes):
        return shape, (), ()
    return _permuted(shape, "take", _v_order(sizes, 1))


def _a_log(spec: Arch, sizes: dict[str, int], shape: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
    _, forward, inverse = _head_entries(spec, sizes, shape)
    return shape, (Step("neg_exp"), *forward), (*inverse, Step("log_neg"))


def _conv(spec: Arch, sizes: dict[str, int], shape: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
    squeezed = (shape[0], shape[2])
    _, forward, inverse = _v_rows(True, "v_head_dim")(spec, sizes, squeezed)
    return squeezed, (Step("reshape", (squeezed,)), *forward), (*inverse, Step("reshape", (shape,)))


def _v_cols(spec: Arch, sizes: dict[str, int], shape: tuple[int, ...]) -> tuple[tuple[int, ...], Steps, Steps]:
    if not _reorders(spec, sizes):
        return shape, (), ()
    return _permuted(shape, "take_cols", _v_order(sizes, sizes["v_head_dim"]))


TRANSFORMS: dict[str, Transform] = {
    "norm": _norm,  # zero-centred RMSNorm gains: llama.cpp stores 1 + w
    "rope_q": _rope_rows("heads"),
    "rope_k": _rope_rows("kv_heads"),
    "v_part_rows": _v_rows(True, "v_head_dim"),  # in_proj_qkv: only the value rows after q and k
    "v_rows": _v_rows(False, "v_head_dim"),
    "head_rows": _v_rows(False, None),  # one row per value head (in_proj_a / in_proj_b)
    "head_entries": _head_entries,  # dt_bias
    "a_log": _a_log,  # ssm_a = -exp(A_log)
    "conv": _conv,  # conv1d [C, 1, K] -> [C, K]
    "v_cols": _v_cols,  # out_proj columns
}


def _inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for position, source in enumerate(perm):
        inverse[source] = position
    return tuple(inverse)


def _llama3_factors(params: dict[str, Any], theta: float, head_dim: int) -> list[float]:
    """llama.cpp's rope_freqs for Llama 3 rope scaling: per frequency, the divisor of its rotation speed."""
    factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
    context = float(params["original_max_position_embeddings"])
    factors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * theta ** (i / head_dim)
        if wavelength < context / high:
            factors.append(1.0)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def _llama3_scaling(factors: Sequence[float], theta: float, head_dim: int) -> dict[str, Any]:
    """Llama 3 rope scaling back from rope_freqs. The factors fix only the wavelengths where smoothing
    starts and ends, so low / high frequency factors are taken as Meta's 1 and 4, which leaves
    original_max_position_embeddings: solved from a smoothed frequency, else 8192; then verified."""
    if len(factors) != head_dim // 2:
        raise BadInput("rope_freqs.weight", f"{len(factors)} values, not head_dim / 2 = {head_dim // 2}")
    factor = max(factors)
    context = 8192.0
    for i, f in enumerate(factors):
        if 1 + 1e-6 < f < factor - 1e-6:
            smooth = (1 / f - 1 / factor) / (1 - 1 / factor)
            wavelength = 2 * math.pi * theta ** (2 * i / head_dim)
            # smooth = (context / wavelength - low) / (high - low)
            context = round(
                wavelength * (LLAMA3_LOW_FREQ_FACTOR + smooth * (LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR))
            )
            break
    params = {
        "factor": factor,
        "low_freq_factor": LLAMA3_LOW_FREQ_FACTOR,
        "high_freq_factor": LLAMA3_HIGH_FREQ_FACTOR,
        "original_max_position_embeddings": int(context),
    }
    if any(abs(a - b) > 1e-4 * max(1.0, abs(b)) for a, b in zip(_llama3_factors(params, theta, head_dim), factors)):
        raise BadInput(
            "rope_freqs.weight", "values are not Llama 3 rope scaling with low/high frequency factors 1 and 4"
        )
    return params


def _check_tensors(
    where: str, given: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], side: str
) -> None:
    missing = sorted(set(expected) - set(given))
    if missing:
        raise BadInput(where, f"missing {side} tensor '{missing[0]}'{_more(missing)}")
    unexpected = sorted(set(given) - set(expected))
    if unexpected:
        raise BadInput(
            where, f"{side} tensor '{unexpected[0]}' has no place in this architecture's layout{_more(unexpected)}"
        )
    for name, shape in given.items():
        if tuple(shape) != expected[name]:
            raise BadInput(
                where, f"{side} tensor '{name}' has shape {list(shape)}, the config implies {list(expected[name])}"
            )


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


MAX_EXPERT_TENSORS = 1 << 20  # layers x routed experts: 61 x 384 in the largest MoE models today


def _check_counts(arch: str, hp: dict[str, Any], tensors: dict[str, tuple[int, ...]], where: str) -> None:
    """The layout is built block by block and expert by expert before it is compared with the checkpoint's
    tensors, so counts the tensors cannot hold are refused first: a tiny file claiming 10^7 experts must not
    make 10^7 tensor maps. Every block has tensors of its own; experts are tensors of their own or the
    leading dim of stacked 3-D ones."""
    count = len(tensors)
    if hp["block_count"] > count:
        key = "block_count" if where == HEADER else "num_hidden_layers"
        raise BadInput(
            where, f"'{_label(key, where, arch)}' is {hp['block_count']}, but the checkpoint holds only {count} tensors"
        )
    experts = hp.get("num_experts") if ARCHS[arch].experts else None
    if experts is None:
        return
    stacked = max((shape[0] for shape in tensors.values() if len(shape) == 3), default=0)
    if experts > max(count, stacked) or experts * hp["block_count"] > MAX_EXPERT_TENSORS:
        raise BadInput(
            where,
            f"'{_label('num_experts', where, arch)}' is {experts}, more experts than the checkpoint's tensors hold",
        )


def _check_sizes(arch: str, hp: dict[str, Any], tensors: dict[str, tuple[int, ...]], where: str) -> None:
    """Row permutations (rope, V-head order) are built from the hyper-parameters' sizes before any tensor is
    compared: a size larger than the largest tensor of the checkpoint is refused first, so a header field of
    2^32 cannot make a 2^32-entry permutation. Left out: the vocabulary (a drafter holds no embedding) and the
    expert count (_check_counts bounds it; no permutation runs over experts)."""
    largest = max((math.prod(shape) for shape in tensors.values()), default=0)
    for name, size in _sizes(arch, hp).items():
        if name not in ("vocab", "experts") and size > largest:
            raise BadInput(
                where,
                f"the hyper-parameters give a tensor dimension {name} of {size}, more values than "
                f"the checkpoint's largest tensor holds ({largest})",
            )


def _as_written(value: object, vtype: ValueType) -> object:
    """A float32 field as its writer wrote it in decimal (1e-05, not 9.999999747378752e-06): the shortest
    decimal that rounds to the same float32."""
    if vtype == F32 and isinstance(value, float):
        import numpy as np

        return float(str(np.float32(value)))
    return value


def _ggml_ne(shape: Sequence[int]) -> tuple[int, ...]:
    return (*reversed(shape), *[1] * (4 - len(shape)))


def _is_int(value: object) -> bool:
    """checkpoint/config.py's rule for integers in untrusted input (4 or 4.0, never true), as everywhere."""
    return as_int(value) is not None


def _label(key: str, where: str, arch: str | None) -> str:
    """The key as the input spells it: a config.json key, or the GGUF key of a canonical name."""
    return f"{arch}.{GGUF_KEYS[key]}" if where == HEADER and arch and key in GGUF_KEYS else key


def _positive(holder: dict[str, Any], key: str, where: str, default: int | None = None, arch: str | None = None) -> int:
    value = holder.get(key)
    if value is None:  # absent or null
        value = default
    if value is None:
        raise BadInput(where, f"missing required key '{_label(key, where, arch)}'")
    if not _is_int(value) or value <= 0:
        raise BadInput(where, f"'{_label(key, where, arch)}' is {brief(value)}, not a positive integer")
    return as_int(value)


def _number(holder: dict[str, Any], key: str, where: str, arch: str | None = None) -> float:
    value = holder.get(key)
    if value is None:
        raise BadInput(where, f"missing required key '{_label(key, where, arch)}'")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise BadInput(where, f"'{_label(key, where, arch)}' is {brief(value)}, not a positive number")
    return float(value)
