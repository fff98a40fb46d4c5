"""Target layers a drafter reads (taps), the width of its fc projection, and how each stack reads the tap ids."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import BLOCK, CHAIN, DRAFTER_KINDS, OWN_STACK, TAPS
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_STACKS, HIDDEN_STATE_DRAFTERS, Values, rule


def _read_otherwise(drafting: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(stacks, kinds): the stacks that feed a tap id of these kinds (those reading taps, drafting so) from another
    target layer than specpair's runtime does (their Serves.tap_shift), and those kinds."""
    found = [
        (stack, kind.name)
        for kind in DRAFTER_KINDS.values()
        if kind.drafting == drafting and TAPS in kind.reads
        for stack, serves in kind.serving.items()
        if serves.tap_shift not in (None, kind.serving[OWN_STACK].tap_shift)
    ]
    return tuple(s for s in ALL_STACKS if s in {s for s, _ in found}), tuple(dict.fromkeys(k for _, k in found))


@rule(
    "taps.range",
    "error",
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    title="Every tap is a decoder layer the target has (0-based, output of layer k).",
    message="{draft} taps target layers {taps} (from {source}), but {target} has {layers} decoder layers (0..{last}): layer {bad} does not exist; this drafter was built for a deeper target.",
    example={
        "taps": [1, 10, 19, 28, 37, 46],
        "source": "dflash_config.target_layer_ids",
        "layers": 40,
        "last": 39,
        "bad": 46,
    },
)
def _range(p: Pair, stack: str) -> Iterable[Values]:
    taps = p.taps
    if taps is None:
        return
    layers = p.target.shapes.num_layers
    bad = [t for t in taps.layers if t < 0 or t >= layers]
    if bad:
        yield {"taps": taps.layers, "source": taps.source, "layers": layers, "last": layers - 1, "bad": bad[0]}


@rule(
    "taps.unique",
    "error",
    ("exllamav3", "tensorfold", "specpair"),
    HIDDEN_STATE_DRAFTERS,
    title="Taps are a nonempty list without repeats.",
    message='{draft}: target_layer_ids {taps} {problem}; {stack} refuses it ("target_layer_ids must be nonempty, unique").',
    example={"taps": [1, 6, 6, 11], "problem": "repeats layer 6"},
)
def _unique(p: Pair, stack: str) -> Iterable[Values]:
    taps = p.taps
    if taps is None:
        return
    if not taps.layers:
        yield {"taps": taps.raw, "problem": "is empty"}
    repeated = sorted({t for t in taps.layers if taps.layers.count(t) > 1})
    if repeated:
        yield {"taps": taps.raw, "problem": f"repeats layer {repeated[0]}"}


@rule(
    "taps.fc_width",
    "error",
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    title="fc.weight (read from the tensor header) is [draft hidden, taps x target hidden].",
    message="{draft} fc.weight is {fc_shape}, but {count} taps x {target} hidden size {target_hidden} needs [{draft_hidden}, {expected}]: the tap list and the projection disagree, or the drafter was trained on another target.",
    example={"fc_shape": [2048, 10240], "count": 8, "target_hidden": 2048, "draft_hidden": 2048, "expected": 16384},
)
def _fc_width(p: Pair, stack: str) -> Iterable[Values]:
    d, taps = p.draft.drafter, p.taps
    if d is None or d.fc_shape is None or taps is None:
        return
    target_hidden = p.target.shapes.hidden_size
    if stack == "vllm" and d.target_hidden_size:
        target_hidden = d.target_hidden_size  # vLLM sizes the fc input from target_hidden_size
    expected = [p.draft.shapes.hidden_size, len(taps.layers) * target_hidden]
    if list(d.fc_shape) != expected:
        yield {
            "fc_shape": list(d.fc_shape),
            "count": len(taps.layers),
            "target_hidden": target_hidden,
            "draft_hidden": expected[0],
            "expected": expected[1],
        }


@rule(
    "taps.fc_unknown",
    "info",
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    title="The fc.weight header could be read, so the tap count was checked against it.",
    message="{draft}: no fc.weight header was available ({why}), so the tap count was not checked against the projection width.",
    example={"why": "tensor headers not read"},
)
def _fc_unknown(p: Pair, stack: str) -> Iterable[Values]:
    d = p.draft.drafter
    if d is not None and d.fc_shape is None:
        yield {
            "why": "tensor headers not read"
            if p.draft.format == "config-only"
            else "the checkpoint has no fc.weight tensor"
        }


@rule(
    "taps.convention",
    "warn",
    *_read_otherwise(BLOCK),
    title="Stacks that read DFlash taps one layer off from the reference convention.",
    message="ExLlamaV3 1.6.5 reads DFlashDraftModel taps one layer later than SGLang, vLLM and llama.cpp (tap_shift +1, set empirically); {draft} was trained on outputs of layers {taps} of {target}: compare acceptance, and set dflash_config.tap_shift if it is low.",
    example={"taps": [1, 6, 11, 16, 22, 27, 32, 37]},
)
def _convention(p: Pair, stack: str) -> Iterable[Values]:
    if p.draft.architecture == "DFlashDraftModel" and p.taps:
        yield {"taps": p.taps.layers}


@rule(
    "taps.eagle3_convention",
    "info",
    *_read_otherwise(CHAIN),
    title="How SGLang reads EAGLE-3 aux layer ids.",
    message="SGLang infers the EAGLE-3 aux-id convention from the first id (sglang#25454): {draft} starts at {first}, read as {reading}; vLLM always reads id j as the input of layer j.",
    example={"first": 2, "reading": "the input of layer 2"},
)
def _eagle3_convention(p: Pair, stack: str) -> Iterable[Values]:
    taps = p.taps
    if taps and taps.raw:
        first = taps.raw[0]
        reading = f"the output of layer {first}" if first == 1 else f"the input of layer {first}"
        yield {"first": first, "reading": reading}
