"""Plain draft models: much smaller than the target, or drafting costs what it saves."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_STACKS,
    PLAIN_DRAFTERS,
    Values,
    rule,
)


@rule(
    "draft_model.size",
    "warn",
    ALL_STACKS,
    PLAIN_DRAFTERS,
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
