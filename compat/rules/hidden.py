"""Hidden sizes: the drafter's against the target's it embeds with and reads."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    Values,
    rule,
)


@rule(
    "hidden.match",
    "error",
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    title="Draft hidden size equals the target's (the drafter embeds tokens with the target's embedding table).",
    message="{draft} has hidden size {draft_hidden} but {target} has {target_hidden}: the drafter embeds tokens with the target's embedding table, so the two must match; this drafter belongs to another target.",
    example={"draft_hidden": 4096, "target_hidden": 2048},
)
def _hidden(p: Pair, stack: str) -> Iterable[Values]:
    draft_hidden, target_hidden = p.draft.shapes.hidden_size, p.target.shapes.hidden_size
    d = p.draft.drafter
    own_embeddings = d is not None and d.has_embeddings
    if draft_hidden != target_hidden and not (stack in ("vllm", "sglang") and own_embeddings):
        yield {"draft_hidden": draft_hidden, "target_hidden": target_hidden}


@rule(
    "hidden.target_hidden_size",
    "error",
    ALL_STACKS,
    HIDDEN_STATE_DRAFTERS,
    title="A drafter that declares target_hidden_size declares the target's.",
    message="{draft} declares target_hidden_size {declared} but {target} has hidden size {target_hidden}; it was trained on another target.",
    example={"declared": 4096, "target_hidden": 2048},
)
def _target_hidden(p: Pair, stack: str) -> Iterable[Values]:
    d = p.draft.drafter
    if d is not None and d.target_hidden_size and d.target_hidden_size != p.target.shapes.hidden_size:
        yield {"declared": d.target_hidden_size, "target_hidden": p.target.shapes.hidden_size}
