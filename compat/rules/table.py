"""The rule table: every pairing check as a row (id, severity, stacks, drafter kinds, message, check).

A rule's `check(pair, stack)` returns the values that clash, one dict per finding; the rule's
`message` template turns each into a sentence naming both checkpoints, the values and what to do.
docs/check.md is generated from this table with each rule's `example` values, so it cannot drift.
Rule families live one per module of this package, named by the prefix of their rules' ids, and register
themselves here with `@rule`; the package's __init__ imports them in table order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from specpair.checkpoint.families import BLOCK, CHAIN, DRAFTER_KINDS, TAPS, DrafterKind
from specpair.compat.pair import Pair
from specpair.compat.stacks import STACK_NAMES


def kinds_where(test: Callable[[DrafterKind], bool]) -> tuple[str, ...]:
    """The drafter kinds whose rows pass `test`, in table order: a rule's kinds, derived from the rows."""
    return tuple(k.name for k in DRAFTER_KINDS.values() if test(k))


SEVERITIES = ("error", "warn", "info")
ALL_STACKS = STACK_NAMES
ALL_KINDS = kinds_where(lambda k: True)
SEPARATE_DRAFTERS = kinds_where(lambda k: k.head_group is None)  # a checkpoint of their own
HEAD_DRAFTERS = kinds_where(lambda k: k.head_group is not None)  # a head inside the target
HIDDEN_STATE_DRAFTERS = kinds_where(lambda k: TAPS in k.reads)
BLOCK_DRAFTERS = kinds_where(lambda k: k.drafting == BLOCK)  # DFlash's config schema: taps, mask token, block size
SELECTOR_DRAFTERS = kinds_where(lambda k: bool(k.own_keys))  # DFlash2: a grouped conv and a candidate selector
CHAIN_DRAFTERS = kinds_where(lambda k: k.drafting == CHAIN)  # a token per step, on the target's positions
PLAIN_DRAFTERS = kinds_where(lambda k: k.plain)
REDUCED_VOCABULARY_DRAFTERS = kinds_where(lambda k: k.reduced_vocabulary)
MASK_EMBEDDING_DRAFTERS = kinds_where(lambda k: k.mask_embedding is not None)  # may ship a learned mask embedding
EAGLE_NORM_DRAFTERS = kinds_where(lambda k: any(s.eagle_norms for s in k.serving.values()))  # may turn on EAGLE-3.1's

Values = dict[str, Any]
Check = Callable[[Pair, str], Iterable[Values]]
Fix = Callable[[Pair, str], list[str] | None]  # the commands, in order, that clear the rule's findings


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    stacks: tuple[str, ...]
    kinds: tuple[str, ...]
    title: str  # what the rule checks, for docs
    message: str  # str.format template over the check's values plus {target}, {draft}, {stack}
    example: Values  # values that render `message` in docs
    check: Check
    fix: Fix | None = None

    def render(self, values: Values) -> str:
        return self.message.format(**values)


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    message: str
    values: Values  # the check's values the message was rendered from: its numbers as fields for --json


RULES: list[Rule] = []


def rule(
    id: str,
    severity: str,
    stacks: Iterable[str],
    kinds: Iterable[str],
    title: str,
    message: str,
    example: Values,
    fix: Fix | None = None,
) -> Callable[[Check], Check]:
    """Register the decorated check function as a row of the rule table."""
    stacks, kinds = tuple(stacks), tuple(kinds)
    assert severity in SEVERITIES and set(stacks) <= set(STACK_NAMES) and set(kinds) <= set(ALL_KINDS), id

    def register(check: Check) -> Check:
        # the id's prefix names the module the rule lives in: a reader finds a rule from its id
        assert check.__module__.rsplit(".", 1)[-1] == id.partition(".")[0], f"{id} lives in {check.__module__}"
        RULES.append(Rule(id, severity, stacks, kinds, title, message, example, check, fix))
        return check

    return register


def evaluate(pair: Pair, stack: str) -> list[tuple[Rule, Finding]]:
    """Every finding of every rule that applies to this stack and drafter kind, errors first."""
    found = []
    for r in RULES:
        if stack not in r.stacks or pair.kind not in r.kinds:
            continue
        for values in r.check(pair, stack):
            named = {"target": pair.target.ref, "draft": pair.draft_name, "stack": stack, **values}
            found.append((r, Finding(r.id, r.severity, r.render(named), values)))
    found.sort(key=lambda item: SEVERITIES.index(item[0].severity))
    return found
