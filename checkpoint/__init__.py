"""The `Checkpoint` model: one normalized description of a target or drafter, whatever its layout.

Sources (local directory, GGUF file, Hub repo, built-in catalog) produce raw metadata; `hf.py` and
`gguf.py` turn it into a `Checkpoint`; the rules in `compat/` read only this object. Every field is
plain data so that `to_json`/`from_json` round-trip it (the catalog stores checkpoints this way).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specpair.checkpoint import families
from specpair.checkpoint.config import as_int
from specpair.checkpoint.tokenizer import Tokenizer

if TYPE_CHECKING:
    from specpair.checkpoint.config import ModelConfig

TARGET_FAMILIES = tuple(families.FAMILIES)
DRAFTER_KINDS = tuple(families.DRAFTER_KINDS)


@dataclass
class Shapes:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int | None  # None: a weights-only drafter, whose vocabulary is its target's
    layer_types: list[str] = field(default_factory=list)  # "full" | "linear" | "sliding", one per layer
    intermediate_size: int | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    embedding_rows: int | None = None  # from the embedding / lm_head tensor header when one exists
    tie_word_embeddings: bool = False
    linear_key_heads: int | None = None
    linear_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel: int | None = None

    @property
    def rows(self) -> int | None:
        """Embedding / lm_head rows: what a shared-embedding drafter must match (None: a weights-only drafter's)."""
        return self.embedding_rows or self.vocab_size

    def count(self, kind: str) -> int:
        return sum(t == kind for t in self.layer_types)

    @classmethod
    def of(cls, model: ModelConfig, vocab_size: int | None, embedding_rows: int | None) -> Shapes:
        return cls(
            hidden_size=model.hidden_size,
            num_layers=model.num_layers,
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            vocab_size=vocab_size,
            layer_types=list(model.layer_types),
            intermediate_size=model.intermediate_size,
            num_experts=model.num_experts,
            experts_per_token=model.experts_per_token,
            moe_intermediate_size=model.moe_intermediate_size,
            shared_expert_intermediate_size=model.shared_expert_intermediate_size,
            embedding_rows=embedding_rows,
            tie_word_embeddings=model.tie_word_embeddings,
            linear_key_heads=model.linear_num_key_heads,
            linear_value_heads=model.linear_num_value_heads,
            linear_key_head_dim=model.linear_key_head_dim,
            linear_value_head_dim=model.linear_value_head_dim,
            linear_conv_kernel=model.linear_conv_kernel,
        )


@dataclass
class Rope:
    theta: float | None = None
    rope_type: str | None = None
    scaling: dict[str, Any] | None = None  # yarn / linear / dynamic parameters as the config gives them
    partial_rotary_factor: float | None = None
    mrope: bool = False
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    window_source: str | None = None  # the config key that declares the sliding layers (families.WINDOW_SOURCES)
    trained_context: int | None = None  # length the checkpoint was trained at, where known
    schema: str = "none"  # "rope_parameters" | "rope_theta" (top-level legacy) | "gguf" | "none"

    @classmethod
    def of(cls, model: ModelConfig, schema: str) -> Rope:
        scaling = {k: v for k, v in (model.rope_scaling or {}).items() if k != "rope_type"}
        return cls(
            theta=model.rope_theta,
            rope_type=(model.rope_scaling or {}).get("rope_type", "default"),
            scaling=scaling or None,
            partial_rotary_factor=model.partial_rotary_factor,
            mrope=model.mrope_section is not None,
            max_position_embeddings=model.max_position_embeddings,
            sliding_window=model.sliding_window,
            window_source=model.window_source,
            trained_context=as_int(scaling.get("original_max_position_embeddings")),
            schema=schema,
        )


@dataclass
class Taps:
    """Target layers a drafter reads. `layers` are normalized: output of 0-based decoder layer k."""

    layers: list[int]
    raw: list[int]
    source: str  # the key they came from, e.g. "dflash_config.target_layer_ids", "gguf dflash.target_layers"
    convention: str  # how `raw` maps to `layers`, e.g. "output of layer k", "input of layer k (= HF id + 1)"
    layout: str | None = None  # TAP_LAYOUTS key of a config's ids (None: a GGUF's, read per its arch)


@dataclass
class Drafter:
    kind: str  # one of DRAFTER_KINDS
    taps: Taps | None = None
    block_size: int | None = None
    block_size_source: str | None = None
    mask_token_id: int | None = None
    mask_token_source: str | None = None
    num_target_layers: int | None = None
    target_hidden_size: int | None = None
    fc_shape: list[int] | None = None  # from the tensor header, never from config
    is_causal: bool | None = None
    sample_from_anchor: bool | None = None  # DSpark semantics; DFlash runtimes draft from the masked rows
    sample_from_anchor_source: str | None = None  # the key it came from, as the file spells it
    dspark_marker: str | None = None  # what shows DSpark's lineage (families.DSPARK.marker), whose layout varies
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    draft_vocab_size: int | None = None  # EAGLE-3 reduced vocabulary
    eagle_norms: list[str] = field(default_factory=list)  # the EAGLE-3.1 norms its config turns on (EAGLE_NORMS)
    has_d2t: bool = False
    head_rows: int | None = None  # rows of the lm_head it ships (speculators: maybe the verifier's copy)
    has_embeddings: bool = False
    mask_embedding_file: str | None = None  # the learned mask embedding as a pickle beside the weights
    mask_embedding_shape: list[int] | None = None  # ... as a tensor among them (its kind's MaskEmbedding row)
    missing_keys: list[str] = field(default_factory=list)  # keys the family defines that this config lacks
    config_keys: list[str] = field(default_factory=list)  # dotted keys present, for per-stack required-key rules
    names: list[str] = field(default_factory=list)  # what a GGUF's general.* keys say it is ("org/name" or a name),
    # for the catalog to match it to the published drafter it was converted from
    verifier: str | None = None  # speculators format: the verifier it pins (name_or_path); None: another format
    verifier_architectures: list[str] = field(default_factory=list)
    native_keys: bool = False  # a speculators drafter whose config also holds its kind's own keys (model_type, the
    # nested block), which stacks that do not read the format read


@dataclass
class Mtp:
    layers: int  # declared by config (mtp_num_hidden_layers / num_nextn_predict_layers / nextn_predict_layers)
    tensors: int | None = None  # tensors actually present (None when no header was read)
    bytes: int | None = None


@dataclass
class TensorGroup:
    """Tensors of one part of the model stored in one layout (e.g. experts in nvfp4-modelopt)."""

    group: str
    layout: str
    tensors: int
    bytes: int


@dataclass
class Quantization:
    method: str  # modelopt | compressed-tensors | fp8 | mlx | exl3 | gguf
    algo: str | None = None
    bits: float | None = None
    group_size: int | None = None
    kv_cache: str | None = None
    producer: str | None = None
    exclude: list[str] = field(default_factory=list)


@dataclass
class FileEntry:
    path: str
    size: int | None = None
    sha256: str | None = None
    blob_id: str | None = None


@dataclass
class Checkpoint:
    ref: str  # what the user typed (path, org/name[@rev])
    source: str  # "local" | "gguf" | "hub" | "hf-cache" | "catalog"
    format: str  # "safetensors" | "gguf" | "config-only"
    role: str  # "target" | "drafter" | "both" (a target that carries an MTP head)
    family: str | None  # model family of the decoder blocks: TARGET_FAMILIES or the raw model_type
    architecture: str | None  # architectures[0] or general.architecture
    model_type: str | None
    shapes: Shapes
    rope: Rope
    drafter: Drafter | None = None
    mtp: Mtp | None = None
    tokenizer: Tokenizer | None = None
    groups: list[TensorGroup] = field(default_factory=list)
    quantization: Quantization | None = None
    files: list[FileEntry] = field(default_factory=list)
    revision: str | None = None
    notes: list[str] = field(default_factory=list)  # facts found while reading (auto_map, pickle files, ...)
    provenance: str | None = None  # where catalog data came from, and how sure it is

    @property
    def is_hybrid(self) -> bool:
        return "linear" in self.shapes.layer_types

    @property
    def total_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    def bytes_of(self, *groups: str) -> int:
        return sum(g.bytes for g in self.groups if g.group in groups)

    def layouts_of(self, *groups: str) -> set[str]:
        return {g.layout for g in self.groups if not groups or g.group in groups}

    def to_json(self) -> dict[str, Any]:
        # Token lists stay in memory: they exist for exact comparison, not for output (and would be slow to copy).
        tokenizer = (
            dataclasses.replace(self.tokenizer, tokens=None, tokens_json=None, load_tokens=None)
            if self.tokenizer
            else None
        )
        data = dataclasses.asdict(dataclasses.replace(self, tokenizer=tokenizer))
        if data["tokenizer"]:
            del data["tokenizer"]["tokens"], data["tokenizer"]["tokens_json"], data["tokenizer"]["load_tokens"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        data = dict(data)
        data["shapes"] = Shapes(**data["shapes"])
        data["rope"] = Rope(**data["rope"])
        if data.get("drafter"):
            drafter = dict(data["drafter"])
            drafter["taps"] = Taps(**drafter["taps"]) if drafter.get("taps") else None
            data["drafter"] = Drafter(**drafter)
        data["mtp"] = Mtp(**data["mtp"]) if data.get("mtp") else None
        data["tokenizer"] = Tokenizer(**data["tokenizer"]) if data.get("tokenizer") else None
        data["groups"] = [TensorGroup(**g) for g in data.get("groups", [])]
        data["quantization"] = Quantization(**data["quantization"]) if data.get("quantization") else None
        data["files"] = [FileEntry(**f) for f in data.get("files", [])]
        return cls(**data)
