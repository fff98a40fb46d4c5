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
    message="{draft} is {share:.0%} of {target}'s weight bytes: drafting with it costs nearly as much as the target step it saves.",
    example={"share": 0.6},
)
def _draft_size(p: Pair, stack: str) -> Iterable[Values]:
    target, draft = p.target.total_bytes, p.draft.total_bytes
    if target and draft >= 0.5 * target:
        yield {"share": draft / target}
