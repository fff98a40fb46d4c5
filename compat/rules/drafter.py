"""Drafter identity and config: kind served, architecture string, required keys, layer types, DFlash2 params,
tensor parallelism, DSpark's readout."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import (
    ANCHOR_IGNORED,
    ANCHOR_REFUSED,
    DRAFTER_KINDS,
    DSPARK,
    EAGLE_NORMS,
    UPSTREAM_GGUF_ARCH,
    WINDOW_SOURCES,
    family_of,
)
from specpair.compat.fixes import convert_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_KINDS,
    ALL_STACKS,
    BLOCK_DRAFTERS,
    EAGLE_NORM_DRAFTERS,
    HIDDEN_STATE_DRAFTERS,
    SELECTOR_DRAFTERS,
    Values,
    rule,
)
from specpair.compat.stacks import STACKS

# The logical drafter fields a stack refuses to run without are its Serves.required (checkpoint/families.py); it
# defaults these:
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
CONV_SELECTOR = "conv_selector"  # the logical field of a selector drafter's own keys (DrafterKind.own_keys)


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
        yield {"kind_name": p.kind_row.title, "others": _kind_stacks(p.kind)}


def _arch_fix(p: Pair, stack: str) -> list[str] | None:
    if p.draft.architecture == "dflash-draft" and stack == "llama.cpp":
        return convert_command(p.draft, stack, "draft", p.target)
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
        "known": UPSTREAM_GGUF_ARCH["dflash-draft"],
        "hint": ": 'dflash-draft' is a fork schema that upstream llama.cpp refuses (llama.cpp#25116)",
    },
    fix=_arch_fix,
)
def _arch(p: Pair, stack: str) -> Iterable[Values]:
    serves, row = p.serves(stack), p.kind_row
    if serves is None or not _format_matches(p, stack):
        return
    arch = p.draft.architecture
    if arch is None and serves.unnamed:
        return
    # A stack that reads any file format reads the GGUF archs specpair converts the kind to (and forks of them).
    if arch in serves.archs or (STACKS[stack].file_format == "any" and row.gguf and arch in row.gguf_archs):
        return
    hint = ""
    if arch == "dflash-draft":
        hint = ": 'dflash-draft' is a fork schema that upstream llama.cpp refuses (llama.cpp#25116)"
    elif row.base_architecture and family_of(arch, None) is not None:
        hint = (
            f": the head declares its base architecture; use a repackaged {row.title} copy (sglang#33966, vllm#11126)"
        )
    elif arch in DSPARK.architectures:
        method = DSPARK.methods.get(stack)
        served = f"{stack} serves with {method}, not as {row.title}" if method else f"{stack} is not known to serve"
        note = DSPARK.notes.get((stack, arch))
        hint = f": {arch} names a {DSPARK.title} drafter, which {served}" + (f"; {note}" if note else "")
    yield {"kind_name": row.title, "arch": arch, "known": ", ".join(serves.archs) or "none", "hint": hint}


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
    own = [k for k in d.missing_keys if k.rsplit(".", 1)[-1] in DRAFTER_KINDS[d.kind].own_keys]
    if own:
        missing[CONV_SELECTOR] = ", ".join(own)
    return missing


@rule(
    "drafter.required_keys",
    "error",
    ALL_STACKS,
    BLOCK_DRAFTERS,
    title="The drafter's config has every key the stack requires (target_layer_ids, mask_token_id, DFlash2 conv/selector keys, TensorFold's loader keys).",
    message="{draft} lacks {keys}, which {stack} requires for {kind_name} drafters{why}.",
    example={
        "keys": "dflash.target_layers",
        "kind_name": "DFlash",
        "why": " (\"DFlash model requires 'target_layers' in GGUF metadata\"); pin a revision or file that has it",
    },
)
def _required(p: Pair, stack: str) -> Iterable[Values]:
    missing, serves = _missing(p), p.serves(stack)
    if serves is None:
        return
    needed = [missing[f] for f in serves.required if f in missing]
    if p.draft.drafter:
        present = set(p.draft.drafter.config_keys)
        needed += [k for k in serves.required_keys if k not in present and k not in needed]
    if not needed:
        return
    why = ""
    if stack == "llama.cpp" and any("target_layers" in k for k in needed):
        why = " (\"DFlash model requires 'target_layers' in GGUF metadata\"); files converted before llama.cpp#22105 merged lack it"
    elif stack == "vllm" and any("mask" in k for k in needed):
        why = ' ("Model config must specify dflash_config.mask_token_id ...")'
    elif stack == "tensorfold":
        why = " (its CUDA DFlash2 loader raises KeyError without them)"
    yield {"keys": ", ".join(needed), "kind_name": p.kind_row.title, "why": why}


@rule(
    "drafter.defaulted_keys",
    "warn",
    ALL_STACKS,
    BLOCK_DRAFTERS,
    title="Keys the drafter omits and the stack fills with a default that may not match training.",
    message="{draft} has no {key}: {stack} assumes {default}; if the drafter was trained otherwise, acceptance drops with no error.",
    example={"key": "dflash_config.block_size", "default": "block size 16"},
)
def _defaulted(p: Pair, stack: str) -> Iterable[Values]:
    missing, serves = _missing(p), p.serves(stack)
    required = serves.required if serves else ()
    for field, default in DEFAULTS[stack].items():
        if field in missing and field not in required:
            yield {"key": missing[field], "default": default}


@rule(
    "drafter.layer_types",
    "error",
    ("specpair", "sglang", "vllm", "exllamav3", "tensorfold"),
    BLOCK_DRAFTERS,
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


# the stacks whose path for some block kind is established to leave some declaration of a window unread
_WINDOW_UNREAD = tuple(
    s
    for s in ALL_STACKS
    if any(
        set(WINDOW_SOURCES) - (serves.window_sources or set(WINDOW_SOURCES))
        for k in BLOCK_DRAFTERS
        if (serves := DRAFTER_KINDS[k].serving.get(s))
    )
)


@rule(
    "drafter.window_source",
    "warn",
    _WINDOW_UNREAD,
    BLOCK_DRAFTERS,
    title="The stack reads the sliding window where the drafter's config declares it.",
    message="{draft} declares a {window}-token sliding window on {sliding} of {layers} layers through {how}; {stack} "
    "windows a drafter's layers only from {reads}, so it runs every layer with full attention, which the drafter "
    "was not trained for: fewer drafts are accepted, more so past the window (z-lab/dflash#126; ik_llama.cpp#2021: "
    "17.4 points of acceptance on Qwen3.6-35B-A3B past 4096 tokens). A config whose layer_types name the sliding "
    "layers (Model-Optimizer#2338's export) is read by every stack.",
    example={
        "window": 2048,
        "sliding": 5,
        "layers": 5,
        "how": WINDOW_SOURCES["dflash_config.use_swa"],
        "reads": "layer_types naming its sliding_attention layers, or use_sliding_window with max_window_layers",
    },
)
def _window_source(p: Pair, stack: str) -> Iterable[Values]:
    source, serves = p.draft.rope.window_source, p.serves(stack)
    reads = serves.window_sources if serves else None
    if source is None or reads is None or source in reads:
        return
    yield {
        "window": p.draft.rope.sliding_window,
        "sliding": p.draft.shapes.count("sliding"),
        "layers": p.draft.shapes.num_layers,
        "how": WINDOW_SOURCES[source],
        "reads": ", or ".join(WINDOW_SOURCES[r] for r in WINDOW_SOURCES if r in reads),
    }


@rule(
    "drafter.dflash2_params",
    "error",
    ALL_STACKS,
    SELECTOR_DRAFTERS,
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
    serves = p.serves(stack)
    if p.deployment.gpus > 1 and (serves is None or serves.tensor_parallel == 1):
        yield {"kind_name": p.kind_row.title, "gpus": p.deployment.gpus}


def _readout_stacks(readout: str) -> tuple[str, ...]:
    """The stacks whose path for some block kind does `readout` with sample_from_anchor true (Serves.anchor_readout)."""
    rows = [DRAFTER_KINDS[k].serving for k in BLOCK_DRAFTERS]
    return tuple(s for s in ALL_STACKS if any(s in row and row[s].anchor_readout == readout for row in rows))


def _refused_anchor(p: Pair, stack: str) -> bool:
    """The drafter sets sample_from_anchor where the stack's path for its kind reads it and refuses it: its block."""
    d, serves = p.draft.drafter, p.serves(stack)
    where = f"{p.kind_row.config_block}.sample_from_anchor"
    readout = serves.anchor_readout if serves else None
    return bool(d and d.sample_from_anchor and readout == ANCHOR_REFUSED and d.sample_from_anchor_source == where)


@rule(
    "drafter.sample_from_anchor",
    "error",
    _readout_stacks(ANCHOR_REFUSED),
    BLOCK_DRAFTERS,
    title="The drafter does not ask for DSpark's sample-from-anchor readout, which vLLM's DFlash refuses.",
    message='{draft} sets dflash_config.sample_from_anchor: vLLM raises "sample_from_anchor=True is not supported for DFlash"; it is a DSpark-style drafter, not DFlash.',
    example={},
)
def _sample_from_anchor(p: Pair, stack: str) -> Iterable[Values]:
    if _refused_anchor(p, stack):
        yield {}


def _anchor_fix(stack: str, declared: bool) -> str:
    """What serves the anchor row's draft on `stack`: DSpark's path, which reads the key (declared: the drafter sets
    it true; else it shows DSpark's lineage without it)."""
    method = DSPARK.methods.get(stack)
    served = f"serve it with {method}, which reads the key" if method else f"{stack} has no known path that reads it"
    if declared:
        return served
    if method:
        served += " (and assumes true without it: below 1 % for a drafter trained the other way, vllm#56792)"
    return f"declare sample_from_anchor as it was trained; if true, {served}"


@rule(
    "drafter.anchor_layout",
    "warn",
    ALL_STACKS,
    BLOCK_DRAFTERS,
    title="The stack drafts from the block rows the drafter was trained to draft from: DSpark's lineage draws from the anchor row too, DFlash's only from the rows after it.",
    message="{draft} {problem}: {stack} serves it as {kind_name}, drafting from the rows after the anchor, and a drafter trained to draft from the anchor row too (DSpark's DeepSpec layout) then proposes every token one position off with no error (acceptance capped near 24 %, llm-scaler#620; sglang-jax#1619); {fix}.",
    example={
        "stack": "vllm",
        "problem": "shows DSpark's lineage (markov_rank) but does not declare sample_from_anchor",
        "kind_name": "DFlash",
        "fix": _anchor_fix("vllm", False),
    },
)
def _anchor_layout(p: Pair, stack: str) -> Iterable[Values]:
    d, serves = p.draft.drafter, p.serves(stack)
    if d is None or serves is None:
        return
    if d.sample_from_anchor is None and d.dspark_marker:
        problem = f"shows {DSPARK.title}'s lineage ({d.dspark_marker}) but does not declare sample_from_anchor"
        yield {"problem": problem, "kind_name": p.kind_row.title, "fix": _anchor_fix(stack, False)}
    elif (
        d.sample_from_anchor
        and serves.anchor_readout in (ANCHOR_IGNORED, ANCHOR_REFUSED)
        and not _refused_anchor(p, stack)
    ):
        problem = f"sets {d.sample_from_anchor_source} (DSpark's readout: the anchor row drafts too)"
        yield {"problem": problem, "kind_name": p.kind_row.title, "fix": _anchor_fix(stack, True)}


# the stacks serving a kind that may turn EAGLE-3.1's norms on, where some norm is not known to be applied
_NORMS_UNAPPLIED = tuple(
    s
    for s in ALL_STACKS
    if any(
        set(EAGLE_NORMS) - DRAFTER_KINDS[k].serving[s].eagle_norms
        for k in EAGLE_NORM_DRAFTERS
        if s in DRAFTER_KINDS[k].serving
    )
)


@rule(
    "drafter.eagle_norms",
    "warn",
    _NORMS_UNAPPLIED,
    EAGLE_NORM_DRAFTERS,
    title="The stack applies the EAGLE-3.1 norms the drafter's config turns on.",
    message="{draft} turns on {norms} ({what}); {stack} is not known to apply {unapplied}: a stack that ignores them "
    "feeds the drafter other features than it was trained on, silently, and fewer drafts are accepted (vllm#46488, "
    "sglang#32334).",
    example={
        "norms": "fc_norm, norm_output",
        "what": "an RMSNorm on each tap before fc (fc_norm.N.weight); the final norm's output, not the layer's, fed "
        "to the next step",
        "unapplied": "fc_norm",
    },
)
def _eagle_norms(p: Pair, stack: str) -> Iterable[Values]:
    d, serves = p.draft.drafter, p.serves(stack)
    if d is None or serves is None:
        return
    unapplied = [k for k in d.eagle_norms if k not in serves.eagle_norms]
    if unapplied:
        yield {
            "norms": ", ".join(d.eagle_norms),
            "what": "; ".join(EAGLE_NORMS[k] for k in d.eagle_norms),
            "unapplied": ", ".join(unapplied),
        }
