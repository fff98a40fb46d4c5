"""Drafter identity and config: kind served, architecture string, required keys, layer types, DFlash2 params."""

from __future__ import annotations

from collections.abc import Iterable

from specpair import runtime
from specpair.compat.fixes import convert_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, ALL_STACKS, DFLASH, HIDDEN_STATE_DRAFTERS, Values, rule
from specpair.compat.stacks import STACKS

KIND_NAMES = {"dflash": "DFlash", "dflash2": "DFlash2", "mtp": "MTP", "eagle3": "EAGLE-3", "draft_model": "draft-model"}

# Logical drafter fields each stack refuses to run without, per kind; the rest it defaults (see DEFAULTS).
REQUIRED: dict[str, dict[str, tuple[str, ...]]] = {
    "specpair": {"dflash": ("taps", "mask"), "dflash2": ("taps", "mask", "dflash2")},
    "sglang": {"dflash": (), "dflash2": ("dflash2",)},
    "vllm": {"dflash": ("taps", "mask"), "dflash2": ("taps", "mask", "dflash2")},
    "llama.cpp": {"dflash": ("taps", "mask"), "dflash2": ("taps", "mask", "dflash2")},
    "exllamav3": {"dflash": ("taps", "mask"), "dflash2": ("taps", "mask", "dflash2")},
    "tensorfold": {"dflash": ("taps", "mask"), "dflash2": ("mask", "dflash2")},
}
DEFAULTS: dict[str, dict[str, str]] = {
    "specpair": {"block": "block size 16"},
    "sglang": {
        "taps": "evenly spread target layers (build_target_layer_ids)",
        "mask": "the tokenizer's mask token '<|MASK|>', added if missing",
        "block": "block size 16",
    },
    "vllm": {"block": "block size 16"},
    "llama.cpp": {"block": "block size 16"},
    "exllamav3": {"block": "block size 16"},
    "tensorfold": {"taps": "the 27B layout [5, 19, 33, 47, 61]", "block": "block size 8 (its training block floor)"},
}
FIELD_KEYS = {"taps": "target_layer_ids", "mask": "mask_token_id", "block": "block_size"}
TENSORFOLD_DFLASH2_KEYS = ("sliding_window", "rope_parameters.rope_theta", "dflash_config.conv_group_size")


def _kind_stacks(kind: str) -> str:
    return ", ".join(s.name for s in STACKS.values() if kind in s.kinds)


@rule(
    "drafter.kind",
    "error",
    ALL_STACKS,
    ALL_KINDS,
    title="The stack serves this kind of drafter at all.",
    message="{stack} does not serve {kind_name} drafters, so it cannot run {draft} with {target}; stacks that do: {others}.",
    example={"kind_name": "EAGLE-3", "others": "sglang, vllm, llama.cpp"},
)
def _kind(p: Pair, stack: str) -> Iterable[Values]:
    if p.kind not in STACKS[stack].kinds:
        yield {"kind_name": KIND_NAMES[p.kind], "others": _kind_stacks(p.kind)}


def _arch_fix(p: Pair, stack: str) -> str | None:
    if p.draft.architecture == "dflash-draft" and stack == "llama.cpp":
        return convert_command(p.draft, stack, "draft", p.target.ref)
    return None


@rule(
    "drafter.arch",
    "error",
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    title="The drafter's architecture string is one the stack registers (DFlash/DFlash2/EAGLE-3 classes, GGUF arch).",
    message="{stack} registers no {kind_name} architecture {arch!r} (it knows {known}), so it cannot load {draft}{hint}.",
    example={
        "kind_name": "DFlash",
        "arch": "dflash-draft",
        "known": "dflash",
        "hint": ": 'dflash-draft' is a fork schema that upstream llama.cpp refuses (llama.cpp#25116)",
    },
    fix=_arch_fix,
)
def _arch(p: Pair, stack: str) -> Iterable[Values]:
    s = STACKS[stack]
    if p.kind not in s.kinds or not _format_matches(p, stack):
        return
    known = s.archs.get(p.kind, ())
    arch = p.draft.architecture
    # TensorFold reads a drafter without `architectures` as DFlash2.
    if arch is None and stack == "tensorfold" and p.kind == "dflash2":
        return
    if arch in known or (stack == "specpair" and arch in ("dflash", "dflash-draft")):
        return
    hint = ""
    if arch == "dflash-draft":
        hint = ": 'dflash-draft' is a fork schema that upstream llama.cpp refuses (llama.cpp#25116)"
    elif p.kind == "eagle3" and arch and not arch.endswith(("Eagle3", "Eagle3LlamaForCausalLM")):
        hint = ": the head declares its base architecture; use a repackaged EAGLE-3 copy (sglang#33966, vllm#11126)"
    yield {"kind_name": KIND_NAMES[p.kind], "arch": arch, "known": ", ".join(known) or "none", "hint": hint}


def _format_matches(p: Pair, stack: str) -> bool:
    wanted = STACKS[stack].file_format
    return wanted == "any" or p.draft.format in (wanted, "config-only")


def _missing(p: Pair) -> dict[str, str]:
    """Logical field -> the key that would hold it, for fields the drafter lacks."""
    d = p.draft.drafter
    if d is None:
        return {}
    keys = {k.rsplit(".", 1)[-1]: k for k in d.missing_keys}
    missing = {}
    for field, key in FIELD_KEYS.items():
        if key in keys or (field == "taps" and "target_layers" in keys):
            missing[field] = keys.get(key) or keys.get("target_layers", key)
    dflash2 = [
        k
        for k in d.missing_keys
        if k.rsplit(".", 1)[-1] in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    ]
    if dflash2:
        missing["dflash2"] = ", ".join(dflash2)
    return missing


@rule(
    "drafter.required_keys",
    "error",
    ALL_STACKS,
    DFLASH,
    title="The drafter's config has every key the stack requires (target_layer_ids, mask_token_id, DFlash2 conv/selector keys, TensorFold's loader keys).",
    message="{draft} lacks {keys}, which {stack} requires for {kind_name} drafters{why}.",
    example={
        "keys": "dflash.target_layers",
        "kind_name": "DFlash",
        "why": " (\"DFlash model requires 'target_layers' in GGUF metadata\"); pin a revision or file that has it",
    },
)
def _required(p: Pair, stack: str) -> Iterable[Values]:
    missing = _missing(p)
    needed = [missing[f] for f in REQUIRED[stack].get(p.kind, ()) if f in missing]
    if stack == "tensorfold" and p.kind == "dflash2" and p.draft.drafter:
        present = set(p.draft.drafter.config_keys)
        needed += [k for k in TENSORFOLD_DFLASH2_KEYS if k not in present and k not in needed]
    if not needed:
        return
    why = ""
    if stack == "llama.cpp" and any("target_layers" in k for k in needed):
        why = " (\"DFlash model requires 'target_layers' in GGUF metadata\"); files converted before llama.cpp#22105 merged lack it"
    elif stack == "vllm" and any("mask" in k for k in needed):
        why = ' ("Model config must specify dflash_config.mask_token_id ...")'
    elif stack == "tensorfold":
        why = " (its CUDA DFlash2 loader raises KeyError without them)"
    yield {"keys": ", ".join(needed), "kind_name": KIND_NAMES[p.kind], "why": why}


@rule(
    "drafter.defaulted_keys",
    "warn",
    ALL_STACKS,
    DFLASH,
    title="Keys the drafter omits and the stack fills with a default that may not match training.",
    message="{draft} has no {key}: {stack} assumes {default}; if the drafter was trained otherwise, acceptance drops with no error.",
    example={"key": "dflash_config.block_size", "default": "block size 16"},
)
def _defaulted(p: Pair, stack: str) -> Iterable[Values]:
    missing = _missing(p)
    required = REQUIRED[stack].get(p.kind, ())
    for field, default in DEFAULTS[stack].items():
        if field in missing and field not in required:
            yield {"key": missing[field], "default": default}


@rule(
    "drafter.layer_types",
    "error",
    ("specpair", "sglang", "vllm", "exllamav3", "tensorfold"),
    DFLASH,
    title="layer_types has one entry per drafter layer, and sliding layers have a window.",
    message="{draft}: {problem}; {stack} refuses such a config.",
    example={"problem": "layer_types lists 5 layers but num_hidden_layers is 6"},
)
def _layer_types(p: Pair, stack: str) -> Iterable[Values]:
    s = p.draft.shapes
    if len(s.layer_types) != s.num_layers:
        yield {"problem": f"layer_types lists {len(s.layer_types)} layers but num_hidden_layers is {s.num_layers}"}
    if "sliding" in s.layer_types and not p.draft.rope.sliding_window:
        yield {"problem": "it has sliding_attention layers but no sliding_window"}


@rule(
    "dflash2.params",
    "error",
    ALL_STACKS,
    ("dflash2",),
    title="DFlash2 conv and selector parameters are consistent (pairs set together, rank > 0, group divides hidden, kernel <= block, top-k in range).",
    message="{draft}: DFlash2 {problem} ({stack} checks this at load).",
    example={"problem": "conv_group_size 48 does not divide hidden_size 5120"},
)
def _dflash2(p: Pair, stack: str) -> Iterable[Values]:
    d, hidden = p.draft.drafter, p.draft.shapes.hidden_size
    if d is None:
        return
    if stack in ("sglang", "specpair") and (d.conv_kernel_size is None) != (d.conv_group_size is None):
        yield {"problem": "conv_kernel_size and conv_group_size must be set together"}
    if stack in ("sglang", "specpair") and (d.selector_rank is None) != (d.selector_top_k is None):
        yield {"problem": "selector_rank and selector_top_k must be set together"}
    if d.selector_rank is not None and d.selector_rank <= 0:
        yield {"problem": f"selector_rank {d.selector_rank} must be positive"}
    if d.conv_group_size is not None and (d.conv_group_size <= 0 or hidden % d.conv_group_size):
        yield {"problem": f"conv_group_size {d.conv_group_size} does not divide hidden_size {hidden}"}
    if stack in ("exllamav3", "specpair") and d.conv_kernel_size is not None:
        if not 0 < d.conv_kernel_size <= p.block_size:
            yield {
                "problem": f"conv_kernel_size {d.conv_kernel_size} must be positive and no larger than block_size {p.block_size}"
            }
    if stack in ("exllamav3", "specpair") and d.selector_top_k is not None:
        if not 1 <= d.selector_top_k <= p.target.shapes.rows:
            yield {
                "problem": f"selector_top_k {d.selector_top_k} must be between 1 and the vocabulary size {p.target.shapes.rows}"
            }
    if stack == "llama.cpp" and d.selector_top_k and hidden < d.selector_top_k * (d.selector_top_k + 1):
        yield {
            "problem": f"hidden_size {hidden} is smaller than top_k*(top_k+1) = {d.selector_top_k * (d.selector_top_k + 1)}"
        }


@rule(
    "drafter.tensor_parallel",
    "error",
    ("exllamav3", "tensorfold"),
    ALL_KINDS,
    title="The stack can split this drafter across GPUs when more than one is asked for.",
    message="{stack} runs {kind_name} drafters on one GPU only, but --gpus {gpus} asks for tensor parallelism; serve {target} with {draft} on one GPU or use sglang/vllm.",
    example={"kind_name": "DFlash", "gpus": 2},
)
def _tensor_parallel(p: Pair, stack: str) -> Iterable[Values]:
    if p.deployment.gpus > 1 and p.kind not in STACKS[stack].tensor_parallel_drafts:
        yield {"kind_name": KIND_NAMES[p.kind], "gpus": p.deployment.gpus}


@rule(
    "runtime.runs",
    "info",
    ("specpair",),
    ALL_KINDS,
    title="What specpair's own runtime runs: target families x drafter kinds, from every layout the model layer reads.",
    message="specpair's runtime runs {families} targets with {kinds} drafters, from BF16/F16/F32, FP8, NVFP4, MLX affine, EXL3 and GGUF weights (dequantized, or packed where a CUDA kernel reads them); `specpair run` verifies {draft} against {target} token for token.",
    example={
        "families": "llama, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe",
        "kinds": "DFlash, DFlash2, EAGLE-3, MTP, draft-model",
    },
)
def _runs(p: Pair, stack: str) -> Iterable[Values]:
    if p.kind == "mtp" and (p.target.mtp is None or p.target.mtp.tensors == 0):
        return  # no head to run: mtp.present says so
    yield {
        "families": ", ".join(runtime.AVAILABLE.families),
        "kinds": ", ".join(KIND_NAMES[k] for k in runtime.AVAILABLE.drafter_kinds),
    }


@rule(
    "runtime.draft_family",
    "error",
    ("specpair",),
    ("draft_model",),
    title="specpair's runtime has a model file for the draft model's family.",
    message="{draft} is a {family} model, which specpair's runtime does not build (it runs {known} draft models).",
    example={"family": "gemma3", "known": "llama, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe"},
)
def _draft_family(p: Pair, stack: str) -> Iterable[Values]:
    if p.draft.family not in runtime.AVAILABLE.families:
        yield {"family": p.draft.family, "known": ", ".join(runtime.AVAILABLE.families)}


@rule(
    "drafter.sample_from_anchor",
    "error",
    ("vllm",),
    DFLASH,
    title="The drafter does not ask for DSpark's sample-from-anchor readout, which vLLM's DFlash refuses.",
    message='{draft} sets dflash_config.sample_from_anchor: vLLM raises "sample_from_anchor=True is not supported for DFlash"; it is a DSpark-style drafter, not DFlash.',
    example={},
)
def _sample_from_anchor(p: Pair, stack: str) -> Iterable[Values]:
    if p.draft.drafter and p.draft.drafter.sample_from_anchor:
        yield {}


@rule(
    "vllm.runner",
    "info",
    ("vllm",),
    DFLASH,
    title="Drafters that only vLLM's V2 model runner serves correctly.",
    message='{draft} {why}: vLLM serves it only with the V2 model runner (the default in 0.33); VLLM_USE_V2_MODEL_RUNNER=0 refuses it ("Model Runner V1 does not support ...").',
    example={"why": "mixes sliding and full attention layers"},
)
def _vllm_runner(p: Pair, stack: str) -> Iterable[Values]:
    kinds = set(p.draft.shapes.layer_types)
    if p.kind == "dflash2":
        yield {"why": "is a DFlash2 drafter with a candidate selector"}
    elif {"sliding", "full"} <= kinds:
        yield {"why": "mixes sliding and full attention layers"}


@rule(
    "vllm.token_budget",
    "info",
    ("vllm",),
    DFLASH,
    title="vLLM's batched-token budget covers max_num_seqs x block tokens per decode step.",
    message="A DFlash decode step runs max_num_seqs x {block} tokens in one unchunkable pass: with vLLM's defaults (256 sequences, 2048 batched tokens) that overflows and crashes (vllm#53970); the launch line sets --max-num-seqs and --max-num-batched-tokens to fit.",
    example={"block": 16},
)
def _token_budget(p: Pair, stack: str) -> Iterable[Values]:
    yield {"block": p.block_size}


@rule(
    "sglang.dflash2_head",
    "warn",
    ("sglang",),
    ("dflash2",),
    title="SGLang's DFlash2 top-k reads a dense target lm_head (or a supported quantized one).",
    message="{target}'s lm_head is stored as {layout}: SGLang's DFlash2 candidate top-k \"requires a dense FP16/BF16/FP32 target lm_head or a supported lm_head.quant_method\"; if it refuses, serve a checkpoint with a BF16 head.",
    example={"layout": "nvfp4-modelopt"},
)
def _dflash2_head(p: Pair, stack: str) -> Iterable[Values]:
    head = p.target.layouts_of("lm_head") or (
        p.target.layouts_of("embedding") if p.target.shapes.tie_word_embeddings else set()
    )
    quantized = sorted(layout for layout in head if layout not in ("bf16", "f16", "f32"))
    if quantized:
        yield {"layout": ", ".join(quantized)}
