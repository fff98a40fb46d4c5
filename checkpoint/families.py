"""The family and drafter-kind tables: one row per model family and per drafter kind, everything specpair knows
about each.

A family is the decoder architecture a checkpoint's blocks follow; a drafter kind is how a drafter is wired
to its target, and how each serving stack serves it. Every reader, rule, converter and runtime module that needs a
per-family or per-kind fact reads it here, by the row's properties rather than its name: adding a family or a kind
is adding a row (gguf-py's habit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# specpair's own runtime, as a stack of the stack table (compat/stacks.py)
OWN_STACK = "specpair"
# Stacks that load the decoder blocks of every family here (compat/stacks.py holds what else each stack accepts).
STACKS = (OWN_STACK, "sglang", "vllm", "llama.cpp", "exllamav3")

# Hyper-parameter groups of gguf_arch.HPARAMS, named where a GGUF arch lists those it writes.
COMMON, VOCAB, MOE, SHARED, HYBRID, MROPE, NEXTN, DFLASH_KEYS = (
    "common",
    "vocab",
    "moe",
    "shared",
    "hybrid",
    "mrope",
    "mtp",
    "dflash",
)


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
    llama3_rope: bool = False  # Llama 3 rope scaling, which llama.cpp keeps as a rope_freqs tensor (its llama arch)
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
                frozenset({COMMON, VOCAB}),
                rope_dims="full",
                rope_permute=True,
                llama3_rope=True,
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
                frozenset({COMMON}),
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
                frozenset({COMMON, MOE}),
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
                frozenset({COMMON, MOE, SHARED, HYBRID, NEXTN}),
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
                frozenset({COMMON, HYBRID, MROPE, NEXTN}),
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
                frozenset({COMMON, MOE, SHARED, HYBRID, MROPE, NEXTN}),
                v_reorder=True,
                rope_dims="partial",
                mtp=True,
                mtp_count_in_config=True,
                config_extras={**COMMON_EXTRAS, "attn_output_gate": True},
            ),
        ),
    )
}


# Target features a drafter reads (DrafterKind.reads)
TAPS = "taps"  # the hidden states of chosen target layers
FINAL_HIDDEN = "final_hidden"  # the target's last hidden state
# How a drafter proposes (DrafterKind.drafting)
BLOCK = "block"  # a block of tokens in one forward pass
CHAIN = "chain"  # one token per step, each fed back


@dataclass(frozen=True)
class IdReading:
    """How a list of tap ids maps to target layers: id j is fed the output of decoder layer j + shift, except that a
    list starting at `first_id` is read with `first_id_shift` (SGLang's EAGLE-3 rule since sglang#25454)."""

    shift: int
    first_id: int | None = None
    first_id_shift: int = 0

    def layers(self, ids: Sequence[int]) -> list[int]:
        """The target layers whose outputs feed `ids`, in order."""
        shift = self.first_id_shift if self.first_id is not None and ids and ids[0] == self.first_id else self.shift
        return [i + shift for i in ids]


# The forms a drafter's learned mask embedding is shipped in (MaskEmbedding), as stacks read them (Serves)
MASK_TENSOR = "tensor"  # a tensor among its safetensors weights
MASK_PICKLE = "pickle"  # a torch.save file beside its weights


@dataclass(frozen=True)
class MaskEmbedding:
    """A learned vector a block drafter may ship for its mask token: the block's rows holding mask_token_id take it
    in place of the target's embedding row of that id (the target itself is unchanged). Sources, and where the
    stacks disagree: docs/drafters.md "A shipped mask embedding"."""

    tensor: str  # its name among the drafter's safetensors weights (ExLlamaV3's), [hidden] or [1, hidden]
    pickle: str  # the torch.save file beside the weights that SGLang and vLLM load: a dict {"embedding": [hidden],
    # "mask_token_id": id} (vLLM also takes the bare tensor); specpair reads it only through `convert --from-pickle`
    before_scale: bool  # substituted before input_embedding_scale multiplies the block's rows, so scaled with them
    # (vLLM's DFlash2 embed_input_ids, SGLang's merged table row); False: written over the scaled rows (ExLlamaV3)

    @property
    def forms(self) -> dict[str, str]:
        """Form (MASK_TENSOR, MASK_PICKLE) -> its name."""
        return {MASK_TENSOR: self.tensor, MASK_PICKLE: self.pickle}


SHIPPED_MASK_EMBEDDING = MaskEmbedding("mask_embedding", "mask_embedding.pt", before_scale=True)

# Serves.draft_head: what a stack does with a head of its own (lm_head, with d2t over a reduced vocabulary) that a
# block drafter ships, where the kind drafts through the target's head
HEAD_READ = "reads"  # drafts through the drafter's own head
HEAD_REFUSED = "refuses"  # drafts through the target's, and refuses to load a drafter shipping a head of its own
HEAD_IGNORED = "ignores"  # drafts through the target's, leaving the drafter's own head unread

# Serves.anchor_readout: what a stack serving a block kind does with a drafter whose sample_from_anchor is true (DSpark's
# readout: the anchor row drafts too, block slot k predicting anchor + k + 1), where established
ANCHOR_REFUSED = "refuses"  # refuses to load it, where the kind's config block sets the key (and reads it nowhere else)
ANCHOR_IGNORED = "ignores"  # drafts from the rows after the anchor all the same: every draft one position off

# How a drafter's config declares its sliding-window layers -> what it says, in the words of a message. vLLM and
# SGLang build a config's layer_types through transformers' Qwen3Config, which derives them from use_sliding_window
# and max_window_layers where the list is absent, so both read those two alike; ModelOpt's DFlash export
# (Model-Optimizer#1960) windows every layer through its block's use_swa and leaves layer_types all full.
WINDOW_IN_LAYER_TYPES = "layer_types"
WINDOW_IN_USE_SLIDING = "use_sliding_window"
WINDOW_IN_USE_SWA = "dflash_config.use_swa"
WINDOW_SOURCES = {
    WINDOW_IN_LAYER_TYPES: "layer_types naming its sliding_attention layers",
    WINDOW_IN_USE_SLIDING: "use_sliding_window with max_window_layers",
    WINDOW_IN_USE_SWA: "dflash_config.use_swa with swa_window_size, every layer windowed (NVIDIA ModelOpt's export)",
}
# The declarations a stack's block-drafter path reads where established: vLLM's _resolve_layer_attention
# (qwen3_dflash.py, 036a00d) reads use_swa where layer_types name no sliding layer; SGLang's (dflash_utils.py,
# 00731f0) windows a layer only where layer_types says sliding_attention; ExLlamaV3's DFlashConfig
# (architecture/dflash.py, 4f8ad01) reads layer_types from config.json itself, defaulting to all full attention, so
# it derives nothing from use_sliding_window and reads no use_swa
READS_EVERY_WINDOW = frozenset(WINDOW_SOURCES)
READS_LAYER_TYPES_ONLY = frozenset({WINDOW_IN_LAYER_TYPES, WINDOW_IN_USE_SLIDING})
READS_LAYER_TYPES_LIST = frozenset({WINDOW_IN_LAYER_TYPES})

# EAGLE-3.1's norms (arXiv 2605.09992; speculators 0.9.0 Eagle3SpeculatorConfig): the config key that turns each on ->
# what it adds to EAGLE-3, in the words of a message. The first two are exclusive (speculators refuses both).
EAGLE_NORMS = {
    "norm_before_fc": "one RMSNorm over the concatenated taps before fc (input_norm.weight)",
    "fc_norm": "an RMSNorm on each tap before fc (fc_norm.N.weight)",
    "norm_output": "the final norm's output, not the layer's, fed to the next step",
}


@dataclass(frozen=True)
class Serves:
    """How one serving stack serves a drafter kind."""

    archs: tuple[str, ...] = ()  # architecture strings it registers for the kind (HF classes, or GGUF archs)
    method: str | None = None  # the kind's name on its launch line (SGLang's algorithm, vLLM's method, llama.cpp's
    # spec type)
    required: tuple[str, ...] = ()  # drafter fields it refuses to run without (compat/rules/drafter.py FIELD_KEYS)
    required_keys: tuple[str, ...] = ()  # config keys its loader reads with no default
    # Its tap convention: tap id j of the drafter's config is fed the output of target decoder layer j + tap_shift.
    # None: the kind reads no taps, how this stack reads them is not established, or (specpair) it feeds what the
    # drafter's TAP_LAYOUTS row names.
    tap_shift: int | None = None
    tap_first_id: tuple[int, int] | None = None  # (id, shift): a list of ids starting at id is read with this shift
    tap_keys: tuple[str, ...] = ()  # the config keys (dotted) it reads tap ids from; empty: the kind's every key. Ids
    # under another key are not seen: it taps its own default (TAP_LAYOUTS' default layout of the kind).
    tensor_parallel: int | None = 1  # the most GPUs it splits a pair of this kind across; None: as many as given
    unnamed: bool = False  # it loads a drafter whose config names no architecture as this kind
    min_capability: tuple[int, int] | None = None  # the CUDA compute capability it needs to run the kind
    mask_embedding: tuple[str, ...] = ()  # the forms of a shipped mask embedding it reads (MASK_TENSOR,
    # MASK_PICKLE); a drafter shipping it in no such form is drafted with the target's row of its mask token
    draft_head: str | None = None  # HEAD_READ, HEAD_REFUSED or HEAD_IGNORED; None: not established
    eagle_norms: frozenset[str] = frozenset()  # the EAGLE_NORMS it applies where a drafter's config turns them on
    unserved_layout: str = ""  # what it does with a drafter of the kind in a layout it does not serve, where it loads
    # one all the same
    anchor_readout: str | None = None  # ANCHOR_REFUSED or ANCHOR_IGNORED; None: not established
    window_sources: frozenset[str] | None = None  # the WINDOW_SOURCES it windows a drafter's layers from; None: not
    # established

    @property
    def reading(self) -> IdReading | None:
        """How it reads a drafter's tap ids; None where it reads none or is not established."""
        if self.tap_shift is None:
            return None
        first, shift = self.tap_first_id or (None, 0)
        return IdReading(self.tap_shift, first, shift)


@dataclass(frozen=True)
class SpeculatorsSchema:
    """How vllm-project/speculators writes a drafter kind (speculators 0.9.0: src/speculators/models/<type>/config.py,
    src/speculators/convert/) and how vLLM reads it back (vllm/transformers_utils/configs/speculators/algos.py).

    Its tap ids (`taps_key`) follow vLLM's capture: id j is the residual stream entering decoder layer j, the output
    of layer j - 1, for every kind (its DFlash converter writes z-lab's target_layer_ids + 1)."""

    model_type: str  # speculators_model_type, and speculators_config.algorithm
    architecture: str  # architectures[0] its save_pretrained writes (the model class's name)
    read_as: str  # architectures[0] of the config specpair builds from it as vLLM does (a name of the kind's that
    # the stacks serving it register: what `convert` writes back in the kind's own layout)
    taps_key: str  # the top-level key holding its tap ids
    taps_into: str  # where vLLM puts them in the config it builds ("block.key" or a top-level key)
    taps_offset: int  # the built config's id = its id + taps_offset (DFlash: target_layer_ids = aux - 1)
    keys: tuple[str, ...]  # the kind's drafter keys it keeps at the top level, beside transformer_layer_config
    block_keys: tuple[str, ...] = ()  # of those, the ones the kind's own layout nests in its config block (as
    # vLLM's updater nests mask_token_id)
    defaults: dict[str, Any] = field(default_factory=dict)  # what vLLM assumes for a key the config lacks
    renames: tuple[tuple[str, str], ...] = ()  # (its tensor-name prefix, the kind's own)
    verifier_tensors: tuple[str, ...] = ()  # tensors its converter copies from the verifier: the target's own here
    readers: tuple[str, ...] = (OWN_STACK,)  # the stacks that read the kind in this format (vLLM: where its algos.py
    # registers an updater for the model type; `vllm serve DRAFT` then takes the target from the pin)
    native_beside: bool = False  # convert also writes the kind's own config (model_type, the nested block), which
    # stacks that do not read this format read


@dataclass(frozen=True)
class DrafterKind:
    name: str
    title: str  # as people write it, in messages
    hf_architectures: tuple[str, ...]  # architectures[0] values that name the kind
    family: str | None  # the family of its decoder blocks; None: the target's own (MTP) or any (draft models)
    head_group: str | None  # a head inside the target: its tensors' group (checkpoint/groups.py); None: a checkpoint
    # of its own
    reads: frozenset[str]  # target features it reads (TAPS, FINAL_HIDDEN); none: a plain model reading tokens only
    drafting: str  # BLOCK or CHAIN
    block_size: int  # tokens verified a round when its config does not say: `run` uses it and `check`'s launch
    # lines print it, so both run the same block
    runtime: str  # "module:Class" of its drafter in specpair's runtime, whose `load` builds it (imported there only)
    serving: dict[str, Serves]  # stack -> how it serves the kind; the stacks that serve it
    config_block: str | None = None  # the nested config object of its drafter keys
    config_markers: tuple[str, ...] = ()  # top-level config keys that mark a config of this kind
    own_keys: tuple[str, ...] = ()  # keys of its own that tell it apart from a kind of the same schema
    base_architecture: bool = False  # its configs may name their base model's architecture instead of the kind's
    reduced_vocabulary: bool = False  # may draft over fewer ids than the target's, mapped to them by a d2t tensor
    samples: bool = False  # at a temperature its drafts are draws from its own distribution (the runtime's, and
    # vLLM's draft_sample_method "probabilistic" on its launch line); else its argmax
    gguf_archs: tuple[str, ...] = ()  # upstream first, then fork schemas read too
    gguf: GGUFArch | None = None  # llama.cpp's layout of the first gguf_arch, where specpair converts it; only
    # checkpoints of the first architecture are written as GGUF
    speculators: SpeculatorsSchema | None = None  # its vllm-project/speculators format, where it has one
    mask_embedding: MaskEmbedding | None = None  # the learned mask embedding its drafters may ship

    @property
    def plain(self) -> bool:
        """A plain model: it reads only tokens, with a tokenizer and embeddings of its own."""
        return not self.reads


# llama.cpp's `dflash` arch holds DFlash and DFlash-2 drafters alike (the selector keys tell them apart)
DFLASH_GGUF = GGUFArch(
    "DFlashDraftModel",
    "qwen3",
    "ffn_norm",
    frozenset({COMMON, DFLASH_KEYS}),
    rope_dims="partial",
    config_extras={**COMMON_EXTRAS, "tie_word_embeddings": False},
)

DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# speculators' full-vocabulary DFlash models hold frozen copies of the verifier's embedding, head and final norm
# (DFlashConverter copies them in); specpair's DFlash reads the target's own, as z-lab's layout does
DFLASH_VERIFIER_TENSORS = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight")
# sample_from_anchor true: DSpark's block (the anchor row drafts too), which drafter.sample_from_anchor reports
DFLASH_SPECULATORS_KEYS = (
    "block_size",
    "mask_token_id",
    "draft_vocab_size",
    "target_hidden_size",
    "num_target_layers",
    "sample_from_anchor",
)

# Architecture strings the stacks register for DFlash drafters (each stack lists its own).
DFLASH_ARCHS = ("DFlashDraftModel", "MuseGlimmerAssistantModel", "DFlashLagunaForCausalLM")
EVERY_GPU = None  # Serves.tensor_parallel: as many GPUs as the deployment gives
# SGLang's context K/V injection takes no quantized q/k/v (sglang PR #28957, closed, kept them float for it)
QUANTIZED_BLOCK_DRAFTER_ON_SGLANG = (
    "SGLang 0.5.19 loads a quantized DFlash-family drafter without a word and drafts garbage (sglang#39087: 3.7 to "
    "1.0 tokens a round with a W4A16 DFlash2, slower than no drafter)"
)
# What each stack's DFlash path (DFlash and DFlash2 alike) does with sample_from_anchor true, where established:
# specpair's runtime reads rows 1..B-1 out whatever the config says (runtime/drafters/dflash.py `_drafted`); vLLM's
# speculator (v1/worker/gpu/spec_decode/dflash/speculator.py) reads dflash_config's and raises "sample_from_anchor=True
# is not supported for DFlash" (vllm#54154, open, would serve it on the V2 runner); llama.cpp's common/speculative.cpp
# reads dflash.sample_from_anchor only under --spec-type draft-dspark (is_dspark), draft-dflash drafting the rows after
# the anchor. SGLang's, ExLlamaV3's and TensorFold's are not established.
ANCHOR_READOUTS = {OWN_STACK: ANCHOR_IGNORED, "vllm": ANCHOR_REFUSED, "llama.cpp": ANCHOR_IGNORED}
# Where EAGLE-3 drafters keep their aux layer ids: vLLM's and speculators' top level, SGLang's and SpecForge's
# eagle_config
EAGLE3_IDS = "eagle_aux_hidden_state_layer_ids"
EAGLE3_IDS_NESTED = f"eagle_config.{EAGLE3_IDS}"

DRAFTER_KINDS: dict[str, DrafterKind] = {
    k.name: k
    for k in (
        DrafterKind(
            "dflash",
            "DFlash",
            (
                "DFlashDraftModel",
                "MuseGlimmerAssistantModel",
                "DFlashMuseGlimmerAssistantModel",
                "DFlashLagunaForCausalLM",
                "DFlashQwen3XPressModel",
            ),
            "qwen3",
            None,
            frozenset({TAPS}),
            BLOCK,
            16,
            "specpair.runtime.drafters.dflash:DFlash",
            {
                OWN_STACK: Serves(
                    DFLASH_ARCHS[:2] + ("DFlashMuseGlimmerAssistantModel",),
                    required=("taps", "mask"),
                    tensor_parallel=EVERY_GPU,
                    mask_embedding=(MASK_TENSOR,),
                    draft_head=HEAD_REFUSED,
                    anchor_readout=ANCHOR_READOUTS[OWN_STACK],
                    window_sources=READS_EVERY_WINDOW,
                ),
                # SGLang's DFlashDraftModel has no head; its load_weights skips any weight it has no place for
                "sglang": Serves(
                    DFLASH_ARCHS,
                    "DFLASH",
                    tap_shift=0,
                    tensor_parallel=EVERY_GPU,
                    mask_embedding=(MASK_PICKLE,),
                    draft_head=HEAD_IGNORED,
                    unserved_layout=QUANTIZED_BLOCK_DRAFTER_ON_SGLANG,
                    window_sources=READS_LAYER_TYPES_ONLY,
                ),
                # vLLM's DFlashQwen3ForCausalLM builds its lm_head over draft_vocab_size, and d2t where it is smaller
                "vllm": Serves(
                    DFLASH_ARCHS + ("DFlashMuseGlimmerAssistantModel", "DFlashQwen3XPressModel"),
                    "dflash",
                    ("taps", "mask"),
                    tap_shift=0,
                    tensor_parallel=EVERY_GPU,
                    mask_embedding=(MASK_PICKLE,),
                    draft_head=HEAD_READ,
                    anchor_readout=ANCHOR_READOUTS["vllm"],
                    window_sources=READS_EVERY_WINDOW,
                ),
                # llama.cpp's dflash arch: optional `output` and `d2t` tensors
                "llama.cpp": Serves(
                    ("dflash",),
                    "draft-dflash",
                    ("taps", "mask"),
                    tap_shift=0,
                    tensor_parallel=EVERY_GPU,
                    draft_head=HEAD_READ,
                    anchor_readout=ANCHOR_READOUTS["llama.cpp"],
                ),
                # ExLlamaV3 1.6.5 reads DFlashDraftModel taps one layer later (its tap_shift +1, set empirically)
                "exllamav3": Serves(
                    DFLASH_ARCHS,
                    required=("taps", "mask"),
                    tap_shift=1,
                    mask_embedding=(MASK_TENSOR,),
                    window_sources=READS_LAYER_TYPES_LIST,
                ),
                "tensorfold": Serves(("DFlashDraftModel",), required=("taps", "mask"), tap_shift=0),
            },
            config_block="dflash_config",
            config_markers=("target_layer_ids",),
            gguf_archs=("dflash", "dflash-draft"),
            gguf=DFLASH_GGUF,
            speculators=SpeculatorsSchema(
                "dflash",
                "DFlashDraftModel",
                "DFlashDraftModel",
                "aux_hidden_state_layer_ids",
                "dflash_config.target_layer_ids",
                -1,
                DFLASH_SPECULATORS_KEYS,
                ("block_size", "mask_token_id", "sample_from_anchor"),
                verifier_tensors=DFLASH_VERIFIER_TENSORS,
                readers=(OWN_STACK, "vllm"),
            ),
            mask_embedding=SHIPPED_MASK_EMBEDDING,
        ),
        DrafterKind(
            "dflash2",
            "DFlash2",
            ("DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel"),
            "qwen3",
            None,
            frozenset({TAPS}),
            BLOCK,
            16,
            "specpair.runtime.drafters.dflash:DFlash",
            {
                OWN_STACK: Serves(
                    ("DFlash2DraftModel",),
                    required=("taps", "mask", "conv_selector"),
                    tensor_parallel=EVERY_GPU,
                    mask_embedding=(MASK_TENSOR,),
                    draft_head=HEAD_REFUSED,
                    anchor_readout=ANCHOR_READOUTS[OWN_STACK],
                    window_sources=READS_EVERY_WINDOW,
                ),
                # SGLang's DFlash2DraftModel subclasses its DFlashDraftModel (sglang#35371, models/dflash.py): its
                # layers' DFlashAttention windows from layer_types as DFlash's do
                "sglang": Serves(
                    ("DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel"),
                    "DFLASH",
                    ("conv_selector",),
                    tap_shift=0,
                    tensor_parallel=EVERY_GPU,
                    mask_embedding=(MASK_PICKLE,),
                    draft_head=HEAD_IGNORED,
                    unserved_layout=QUANTIZED_BLOCK_DRAFTER_ON_SGLANG,
                    window_sources=READS_LAYER_TYPES_ONLY,
                ),
                # vLLM's DFlash2Qwen3DecoderLayer subclasses DFlashQwen3DecoderLayer (qwen3_dflash2.py, 030da62),
                # whose __init__ resolves each layer's window through _resolve_layer_attention
                "vllm": Serves(
                    ("DFlash2DraftModel", "DFlash2BeamDraftModel"),
                    "dflash",
                    ("taps", "mask", "conv_selector"),
                    tap_shift=0,
                    tensor_parallel=EVERY_GPU,
                    mask_embedding=(MASK_PICKLE,),
                    anchor_readout=ANCHOR_READOUTS["vllm"],
                    window_sources=READS_EVERY_WINDOW,
                ),
                "llama.cpp": Serves(
                    ("dflash",),
                    "draft-dflash",
                    ("taps", "mask", "conv_selector"),
                    tap_shift=0,
                    tensor_parallel=EVERY_GPU,
                    draft_head=HEAD_READ,
                    anchor_readout=ANCHOR_READOUTS["llama.cpp"],
                ),
                # DFlash2 residuals exceed FP16 range: ExLlamaV3 needs BF16 hardware for them (exl3#334). Its
                # DFlash2 input layer is built without the mask_embedding tensor its DFlash one reads (1.6.5). Its
                # DFlash2Config subclasses DFlashConfig (architecture/dflash2.py, 37381f4), so it windows alike.
                "exllamav3": Serves(
                    ("DFlash2DraftModel",),
                    required=("taps", "mask", "conv_selector"),
                    tap_shift=0,
                    min_capability=(8, 0),
                    window_sources=READS_LAYER_TYPES_LIST,
                ),
                # TensorFold reads a drafter without `architectures` as DFlash2; its CUDA loader reads these keys
                "tensorfold": Serves(
                    ("DFlash2DraftModel",),
                    required=("mask", "conv_selector"),
                    required_keys=("sliding_window", "rope_parameters.rope_theta", "dflash_config.conv_group_size"),
                    tap_shift=0,
                    tensor_parallel=2,
                    unnamed=True,
                ),
            },
            config_block="dflash_config",
            config_markers=("target_layer_ids",),
            own_keys=DFLASH2_KEYS,
            samples=True,  # its candidate selector's drafts
            gguf_archs=("dflash", "dflash-draft"),
            gguf=DFLASH_GGUF,
            # speculators' DFlash2 (its PR #1006) is written flat and vLLM 0.33 has no `dflash2` updater: the
            # DFlash2's own config (model_type, dflash_config) is written beside, which vLLM and SGLang read
            speculators=SpeculatorsSchema(
                "dflash2",
                "DFlash2DraftModel",
                "DFlash2DraftModel",
                "aux_hidden_state_layer_ids",
                "dflash_config.target_layer_ids",
                -1,
                DFLASH_SPECULATORS_KEYS + DFLASH2_KEYS,
                ("block_size", "mask_token_id", "sample_from_anchor", *DFLASH2_KEYS),
                verifier_tensors=DFLASH_VERIFIER_TENSORS,
                native_beside=True,
            ),
            mask_embedding=SHIPPED_MASK_EMBEDDING,
        ),
        DrafterKind(
            "eagle3",
            "EAGLE-3",
            ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"),
            "llama",
            None,
            frozenset({TAPS}),
            CHAIN,
            8,
            "specpair.runtime.drafters.eagle3:Eagle3",
            {
                OWN_STACK: Serves(
                    ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"),
                    tensor_parallel=EVERY_GPU,
                    eagle_norms=frozenset(EAGLE_NORMS),
                ),
                # SGLang reads eagle_config's ids only; it adds 1 to a list starting at 1 (the output of layer id),
                # else takes id j as the input of layer j (set_eagle3_layers_to_capture, sglang#25454); docs/taps.md
                "sglang": Serves(
                    ("LlamaForCausalLMEagle3",),
                    "EAGLE3",
                    tap_shift=-1,
                    tap_first_id=(1, 0),
                    tap_keys=(EAGLE3_IDS_NESTED,),
                    tensor_parallel=EVERY_GPU,
                    # norm_before_fc: sglang#32334 (fixing sglang#32226); norm_output: llama_eagle3.py reads it,
                    # default false (SpecForge#879, 2026-09-15); fc_norm: not established
                    eagle_norms=frozenset({"norm_before_fc", "norm_output"}),
                ),
                # vLLM: aux id j is the residual stream entering layer j, the output of layer j - 1; it reads the
                # top-level ids only (_get_eagle3_aux_layers_from_config), else its default; docs/taps.md
                "vllm": Serves(
                    ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"),
                    "eagle3",
                    tap_shift=-1,
                    tap_keys=(EAGLE3_IDS,),
                    tensor_parallel=EVERY_GPU,
                    # norm_before_fc: vllm#38111 (read from eagle_config too: #42143); fc_norm: #42764; norm_output:
                    # #46488 (2026-06-23: before it, fc_norm and norm_output silently fell back to false)
                    eagle_norms=frozenset(EAGLE_NORMS),
                ),
                # src/models/eagle3.cpp (0274f0f) reads norm_before_residual and none of EAGLE_NORMS: fc reads the raw
                # taps, the next step the layer's output (forks' eagle3.norm_before_fc is not upstream's)
                "llama.cpp": Serves(("eagle3",), "draft-eagle3", tensor_parallel=EVERY_GPU),
            },
            config_block="eagle_config",
            config_markers=("draft_vocab_size",),
            base_architecture=True,
            reduced_vocabulary=True,
            gguf_archs=("eagle3",),
            # vLLM's update_eagle3 passes the ids unchanged and assumes norm_before_residual when it is missing;
            # speculators' Eagle3Speculator names the decoder layer layers.0 where EAGLE's layout has midlayer
            speculators=SpeculatorsSchema(
                "eagle3",
                "Eagle3Speculator",
                "LlamaForCausalLMEagle3",  # the architecture every stack serving EAGLE-3 registers
                "eagle_aux_hidden_state_layer_ids",
                "eagle_aux_hidden_state_layer_ids",
                0,
                ("draft_vocab_size", "target_hidden_size", "norm_before_residual", *EAGLE_NORMS),
                defaults={"norm_before_residual": True},
                renames=(("layers.0.", "midlayer."),),
                verifier_tensors=("verifier_lm_head.weight", "verifier_norm.weight"),
                readers=(OWN_STACK, "vllm"),
            ),
        ),
        DrafterKind(
            "mtp",
            "MTP",
            (),
            None,
            "mtp",  # the target's own mtp.* head: no checkpoint of its own
            frozenset({FINAL_HIDDEN}),
            CHAIN,
            4,
            "specpair.runtime.drafters.mtp:MTP",
            {
                OWN_STACK: Serves(tensor_parallel=EVERY_GPU),
                "sglang": Serves(method="NEXTN", tensor_parallel=EVERY_GPU),
                "vllm": Serves(method="mtp", tensor_parallel=EVERY_GPU),
                "llama.cpp": Serves(method="draft-mtp", tensor_parallel=EVERY_GPU),
                "exllamav3": Serves(),
                "tensorfold": Serves(),
            },
        ),
        DrafterKind(
            "draft_model",
            "draft-model",
            (),
            None,  # a smaller model of any family, sharing the tokenizer
            None,
            frozenset(),
            CHAIN,
            5,
            "specpair.runtime.drafters.draft_model:DraftModel",
            {
                OWN_STACK: Serves(tensor_parallel=EVERY_GPU),
                "sglang": Serves(method="STANDALONE", tensor_parallel=EVERY_GPU),
                "vllm": Serves(method="draft_model", tensor_parallel=EVERY_GPU),
                "llama.cpp": Serves(method="draft-simple", tensor_parallel=EVERY_GPU),
                "exllamav3": Serves(tensor_parallel=EVERY_GPU),
            },
            samples=True,  # its softmax's draws
        ),
    )
}


@dataclass(frozen=True)
class Lineage:
    """A training lineage of block drafters that their configs show, and that some stacks serve under a method of its
    own: there they read the block from the anchor row unless the config's sample_from_anchor says false, where their
    path for the drafter's kind drafts from the rows after the anchor. Its drafters are trained either way (DeepSpec's
    from the anchor; speculators' from the rows after it before its #760, and others since: sglang#30982,
    vllm#56792), so a config showing the lineage without the key leaves the layout unknown, and one of the two paths
    drafts one position off."""

    title: str  # as people write it, in messages
    architectures: tuple[str, ...]  # architectures[0] values that name it
    keys: tuple[str, ...]  # config keys only its configs hold, at the top level or in the kind's block, whatever value
    gguf_tensors: tuple[str, ...]  # tensors only its GGUF files hold
    methods: dict[str, str]  # stack -> how its launch line asks for the lineage's path
    speculators_type: str  # its speculators_model_type, a format specpair does not read for it
    notes: dict[tuple[str, str], str] = field(default_factory=dict)  # (stack, architecture) -> what the stack does
    # with that name

    def marker(self, architecture: str | None, config: dict[str, Any], block: str | None) -> str | None:
        """What in a drafter's config shows the lineage: its architecture, else the first of its keys present; None
        when nothing does."""
        if architecture in self.architectures:
            return f"architectures {architecture}"
        paths = [f"{block}.{key}" for key in self.keys if block] + list(self.keys)
        return next((path for path in paths if dotted(config, path) is not None), None)


# DSpark (DeepSeek's DeepSpec, SpecForge, speculators): DFlash's backbone plus a Markov head. DeepSpec writes markov_rank
# into every drafter it trains, 0 for its DFlash ones (dflash_qwen3_*_block7), which are anchor-first all the same
# (sglang-jax#1619). Sources: deepseek-ai/DeepSpec deepspec/modeling/dspark/{qwen3,gemma4}/config.py (afdfa7c) and
# eval/dspark/draft_ops.py (every block row drafts); vLLM's DSpark path (vllm#46995, #47093) reads sample_from_anchor,
# default true (vllm#48639, vllm#56792); SGLang's reads the top-level key, default true (sglang#36186); llama.cpp's
# draft-dspark reads dflash.sample_from_anchor, default true, from a dflash-arch GGUF with markov_w1/markov_w2 tensors
# (llama.cpp#25173, common/speculative.cpp).
DSPARK = Lineage(
    "DSpark",
    ("DSparkDraftModel", "Qwen3DSparkModel", "Gemma4DSparkModel"),
    ("markov_rank",),
    ("markov_w1.weight",),
    {
        "vllm": 'method "dspark" in --speculative-config',
        "sglang": "--speculative-algorithm DSPARK",
        "llama.cpp": "--spec-type draft-dspark",
    },
    "dspark",  # speculators' DSpark config (sample_from_anchor default true, speculators#760)
    # vLLM's registry (registry.py:637-638 in 0.28) names DeepSeek-V4's class DSparkDraftModel, Qwen3's Qwen3DSparkModel
    {
        ("vllm", "DSparkDraftModel"): "vLLM 0.28 builds that name as DeepSeek-V4's DSpark, and a Qwen3 drafter dies "
        "on 'hc_mult' (syv-ai/qwen38-27b-rtx3090#25): name it Qwen3DSparkModel, as vllm#52197 does for model_type qwen3"
    },
)


@dataclass(frozen=True)
class TapLayout:
    """A convention for a drafter's tap ids, named for the training framework whose feature capture they index: the
    config key that holds them, how that framework's configs are told apart, and the target layers the ids name
    (what the drafter was trained on, so what specpair's runtime feeds it). Sources: docs/taps.md."""

    name: str
    title: str  # as people write it, in messages
    kinds: tuple[str, ...]  # DRAFTER_KINDS keys it applies to
    keys: tuple[str, ...]  # dotted config keys holding the ids, first found wins; empty: the framework writes none
    reading: IdReading
    marker: str | None = None  # a top-level config key present only in this framework's configs
    default_ids: Callable[[int], list[int]] | None = None  # its ids when the config has none, from the target's
    # layer count


# First row that fits a drafter's config wins: a row with a marker before the rows sharing its keys, a row without
# keys last (the default of a config naming no ids).
TAP_LAYOUTS: dict[str, TapLayout] = {
    t.name: t
    for t in (
        TapLayout(
            "zlab_dflash",
            "z-lab DFlash (target_layer_ids: hidden_states[id + 1])",
            ("dflash", "dflash2"),
            ("dflash_config.target_layer_ids", "target_layer_ids"),
            IdReading(0),
        ),
        TapLayout(
            "speculators",
            "speculators format (ids index vLLM's capture)",
            ("eagle3",),
            (EAGLE3_IDS,),
            IdReading(-1),
            marker="speculators_config",
        ),
        TapLayout(
            "specforge",
            "SpecForge via SGLang's capture (eagle_config ids: outputs for a list starting at 1, else inputs)",
            ("eagle3",),
            (EAGLE3_IDS_NESTED,),
            IdReading(-1, first_id=1, first_id_shift=0),
        ),
        TapLayout("vllm", "vLLM (top-level aux ids)", ("eagle3",), (EAGLE3_IDS,), IdReading(-1)),
        TapLayout(
            "eagle",
            "EAGLE repository default (inputs of layers 2, L//2, L-3)",
            ("eagle3",),
            (),
            IdReading(-1),
            default_ids=lambda layers: [2, layers // 2, layers - 3],
        ),
    )
}


def dotted(config: dict[str, Any], key: str) -> Any:
    """The value at a dotted key ("eagle_config.x") of a config, or None."""
    holder: Any = config
    for part in key.split("."):
        holder = holder.get(part) if isinstance(holder, dict) else None
    return holder


def tap_layout(kind: str, config: dict[str, Any]) -> tuple[TapLayout, str | None] | None:
    """The layout of a drafter config's tap ids and the key they are under (None: its default ids); None when the
    kind reads no taps or its config names none and the kind has no default."""
    for layout in TAP_LAYOUTS.values():
        if kind not in layout.kinds or (layout.marker and layout.marker not in config):
            continue
        if not layout.keys:
            return layout, None
        key = next((k for k in layout.keys if dotted(config, k) is not None), None)
        if key is not None:
            return layout, key
    return None


def default_layout(kind: str) -> TapLayout | None:
    """The layout a stack falls back to for a drafter of `kind` whose ids it does not see."""
    return next((t for t in TAP_LAYOUTS.values() if kind in t.kinds and not t.keys), None)


BY_ARCHITECTURE: dict[str, Family] = {a: f for f in FAMILIES.values() for a in f.hf_architectures}
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}
BY_GGUF_ARCH: dict[str, Family] = {f.gguf_arch: f for f in FAMILIES.values()}
DRAFTER_BY_ARCHITECTURE: dict[str, DrafterKind] = {a: k for k in DRAFTER_KINDS.values() for a in k.hf_architectures}
DRAFTER_BY_GGUF_ARCH: dict[str, DrafterKind] = {a: k for k in reversed(DRAFTER_KINDS.values()) for a in k.gguf_archs}
# A fork's GGUF arch -> the upstream arch it is read as (each kind lists upstream's first)
UPSTREAM_GGUF_ARCH: dict[str, str] = {a: k.gguf_archs[0] for k in DRAFTER_KINDS.values() for a in k.gguf_archs[1:]}
# The kind of a pair with no separate drafter (the target's own head), and of a drafter whose config names no kind
HEAD_KIND = next(k for k in DRAFTER_KINDS.values() if k.head_group is not None)
HEAD_GROUPS = tuple(k.head_group for k in DRAFTER_KINDS.values() if k.head_group is not None)
PLAIN_KIND = next(k for k in DRAFTER_KINDS.values() if k.plain)
DRAFTER_BY_SPECULATORS_TYPE: dict[str, DrafterKind] = {
    k.speculators.model_type: k for k in DRAFTER_KINDS.values() if k.speculators
}


def family_of(architecture: str | None, model_type: str | None) -> Family | None:
    """The family of a config's architectures[0] / model_type (the architecture decides when both are known)."""
    return BY_ARCHITECTURE.get(architecture or "") or BY_MODEL_TYPE.get(model_type or "")


def families_served_by(stack: str) -> tuple[str, ...]:
    return tuple(f.name for f in FAMILIES.values() if stack in f.stacks)


def kinds_served_by(stack: str) -> tuple[str, ...]:
    return tuple(k.name for k in DRAFTER_KINDS.values() if stack in k.serving)


def drafter_kind(own_kind: str | None, separate: bool) -> str:
    """How a pair speculates: with no separate drafter, through the target's own head; else the drafter's own
    kind (`own_kind`, from its config), or as a plain draft model when its config names none."""
    if not separate:
        return HEAD_KIND.name
    return own_kind or PLAIN_KIND.name


def with_own_keys(kinds: list[DrafterKind], present: bool) -> DrafterKind:
    """Of kinds that share one schema (config object, GGUF arch), the one whose own keys are `present`, or else
    the base kind (none of its own)."""
    return next(k for k in kinds if bool(k.own_keys) == present)
