"""Was the drafter trained for this target: layer count, hidden size, vocabulary; MTP presence; draft size."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules import ALL_STACKS, HIDDEN_STATE_DRAFTERS, Values, rule

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
    ("dflash", "dflash2"),
    title="TensorFold requires num_target_layers, when present, to equal the target's layer count exactly.",
    message="TensorFold requires num_target_layers to equal the target's num_hidden_layers: {draft} says {declared}, {target} has {layers} (\"drafter num_target_layers must match the target's num_hidden_layers\").",
    example={"declared": 41, "layers": 40},
)
def _num_target_layers_strict(p: Pair, stack: str) -> Iterable[Values]:
    d, layers = p.draft.drafter, p.target.shapes.num_layers
    if d and d.num_target_layers and d.num_target_layers != layers:
        yield {"declared": d.num_target_layers, "layers": layers}


@rule(
    "mtp.present",
    "error",
    ALL_STACKS,
    ("mtp",),
    title="A target used as its own MTP drafter declares MTP layers and still ships their weights.",
    message="{target} {problem}, so it has no MTP head to draft with; {what}.",
    example={
        "problem": "declares 1 MTP layer in its config but ships no mtp.* tensors",
        "what": "use a checkpoint that keeps the MTP weights (quantizers and converters often drop them)",
    },
)
def _mtp(p: Pair, stack: str) -> Iterable[Values]:
    mtp = p.target.mtp
    if mtp is None:
        yield {
            "problem": "declares no MTP layers (mtp_num_hidden_layers / num_nextn_predict_layers)",
            "what": "pair it with a separate drafter",
        }
    elif mtp.tensors == 0:
        yield {
            "problem": f"declares {mtp.layers} MTP layer(s) in its config but ships no MTP tensors",
            "what": "use a checkpoint that keeps the MTP weights (quantizers and converters often drop them)",
        }


@rule(
    "draft_model.size",
    "warn",
    ALL_STACKS,
    ("draft_model",),
    title="A plain draft model is much smaller than its target.",
    message="{draft} is {share:.0%} of {target}'s weight bytes: {cost}.",
    example={"share": 0.6, "cost": "each drafted token costs about 60% of a target step, so drafting gains little"},
)
def _draft_size(p: Pair, stack: str) -> Iterable[Values]:
    target, draft = p.target.total_bytes, p.draft.total_bytes
    if target and draft >= 0.5 * target:
        share = draft / target
        if share > 1.05:
            cost = "each drafted token costs more than the target step it is to save, so drafting slows decoding"
        elif share >= 0.9:
            cost = "each drafted token costs about as much as the target step it is to save"
        else:
            cost = f"each drafted token costs about {share:.0%} of a target step, so drafting gains little"
        yield {"share": share, "cost": cost}
