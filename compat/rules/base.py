"""Was the drafter trained for this target (its base model): layer count, hidden size, vocabulary, taps."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_STACKS, BLOCK_DRAFTERS, HIDDEN_STATE_DRAFTERS, Values, rule

ALL_BUT_TENSORFOLD = tuple(s for s in ALL_STACKS if s != "tensorfold")


def _evidence(p: Pair) -> list[str]:
    """Facts of the drafter that point at a different base than this target."""
    d, t = p.draft.drafter, p.target.shapes
    found = []
    if p.draft.shapes.hidden_size != t.hidden_size:
        found.append(f"hidden size {p.draft.shapes.hidden_size} (target {t.hidden_size})")
    tokens = p.target.tokenizer.length if p.target.tokenizer else None
    if p.draft.shapes.vocab_size is not None and p.draft.shapes.vocab_size < (tokens or t.rows):
        found.append(f"vocabulary {p.draft.shapes.vocab_size} rows (target {t.rows})")
    taps = p.taps
    if d and d.fc_shape and len(d.fc_shape) == 2 and taps and taps.layers and d.fc_shape[1] % len(taps.layers) == 0:
        implied = d.fc_shape[1] // len(taps.layers)
        if implied != t.hidden_size:
            found.append(
                f"fc input {d.fc_shape[1]} = {len(taps.layers)} taps x hidden {implied} (target {t.hidden_size})"
            )
    if taps and taps.layers and max(taps.layers) >= t.num_layers:
        found.append(f"taps up to layer {max(taps.layers)} (target has {t.num_layers})")
    if d and d.num_target_layers and d.num_target_layers not in (t.num_layers, t.num_layers + 1):
        found.append(f"num_target_layers {d.num_target_layers} (target has {t.num_layers})")
    return found


@rule(
    "base.lineage",
    "error",
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    title="The drafter's shapes point at the target it is paired with (not another base model).",
    message="{draft} looks trained for another target than {target}: {evidence}. Use the drafter published for {target}.",
    example={"evidence": "vocabulary 151936 rows (target 248320); num_target_layers 36 (target has 40)"},
)
def _lineage(p: Pair, stack: str) -> Iterable[Values]:
    evidence = _evidence(p)
    # A layer count that differs alone is only a hint (see base.num_target_layers).
    if evidence and not (len(evidence) == 1 and evidence[0].startswith("num_target_layers")):
        yield {"evidence": "; ".join(evidence)}


@rule(
    "base.num_target_layers",
    "warn",
    ALL_BUT_TENSORFOLD,
    HIDDEN_STATE_DRAFTERS,
    title="The drafter's num_target_layers matches the target's depth (z-lab's layers + 1 is tolerated).",
    message="{draft} says it was trained against a {declared}-layer target, but {target} has {layers} layers: probably a drafter for another model of the family; SGLang only warns and uses the runtime count.",
    example={"declared": 64, "layers": 40},
)
def _num_target_layers(p: Pair, stack: str) -> Iterable[Values]:
    d, layers = p.draft.drafter, p.target.shapes.num_layers
    if d and d.num_target_layers and d.num_target_layers not in (layers, layers + 1):
        yield {"declared": d.num_target_layers, "layers": layers}


@rule(
    "base.num_target_layers_strict",
    "error",
    ("tensorfold",),
    BLOCK_DRAFTERS,
    title="TensorFold requires num_target_layers, when present, to equal the target's layer count exactly.",
    message="TensorFold requires num_target_layers to equal the target's num_hidden_layers: {draft} says {declared}, {target} has {layers} (\"drafter num_target_layers must match the target's num_hidden_layers\").",
    example={"declared": 41, "layers": 40},
)
def _num_target_layers_strict(p: Pair, stack: str) -> Iterable[Values]:
    d, layers = p.draft.drafter, p.target.shapes.num_layers
    if d and d.num_target_layers and d.num_target_layers != layers:
        yield {"declared": d.num_target_layers, "layers": layers}
