"""Target layers a drafter reads (taps), the width of its fc projection, and how each stack reads the tap ids."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import BLOCK, CHAIN, DRAFTER_KINDS, TAP_LAYOUTS, TAPS, default_layout
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_STACKS, HIDDEN_STATE_DRAFTERS, Values, rule


def _read_otherwise(drafting: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(stacks, kinds): the stacks that may feed a tap id of these kinds (those reading taps, drafting so) from another
    target layer than the drafter's layout names (their Serves.reading against TAP_LAYOUTS, or ids under a key they do
    not read), and those kinds."""
    found = [
        (stack, kind.name)
        for kind in DRAFTER_KINDS.values()
        if kind.drafting == drafting and TAPS in kind.reads
        for stack, serves in kind.serving.items()
        for layout in TAP_LAYOUTS.values()
        if kind.name in layout.kinds and serves.reading is not None
        if serves.reading != layout.reading or not set(layout.keys) <= set(serves.tap_keys or layout.keys)
    ]
    return tuple(s for s in ALL_STACKS if s in {s for s, _ in found}), tuple(dict.fromkeys(k for _, k in found))


def stack_taps(p: Pair, stack: str) -> tuple[list[int], str] | None:
    """(layers, ids): the target layers whose outputs `stack` feeds the pair's drafter, and the ids it reads them
    from, in words; None where it reads none or how is not established."""
    serves, taps = p.serves(stack), p.taps
    if serves is None or serves.reading is None or taps is None or taps.layout is None:
        return None
    if serves.tap_keys and taps.source not in serves.tap_keys:  # ids it does not see: its default ones
        layout = default_layout(p.kind)
        raw = layout.default_ids(p.target.shapes.num_layers)
        return serves.reading.layers(raw), f"its default ids {raw}, as it reads no {taps.source}"
    return serves.reading.layers(taps.raw), f"{taps.source} {taps.raw}"


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
    "taps.layout",
    "warn",
    *_read_otherwise(CHAIN),
    title="The stack feeds an EAGLE-3 drafter the target layers its training framework captured (docs/taps.md).",
    message="{stack} will feed {draft} the outputs of target layers {tapped} (from {ids}), but it was trained on the outputs of layers {expected} ({layout}): acceptance on {stack} will be lower than specpair measures; serve it where the two agree.",
    example={
        "tapped": [1, 46, 90],
        "ids": "its default ids [2, 47, 91], as it reads no eagle_aux_hidden_state_layer_ids",
        "expected": [1, 40, 80],
        "layout": "vLLM (top-level aux ids)",
    },
)
def _layout(p: Pair, stack: str) -> Iterable[Values]:
    taps, fed = p.taps, stack_taps(p, stack)
    if fed is not None and fed[0] != taps.layers:
        yield {"tapped": fed[0], "ids": fed[1], "expected": taps.layers, "layout": taps.convention}
