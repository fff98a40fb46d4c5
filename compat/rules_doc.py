"""Render docs/check.md from the rule table: `python -m specpair.compat.rules_doc > docs/check.md`.

A test regenerates it and compares, so the page cannot drift from the rules.
"""

from __future__ import annotations

from specpair.compat.rules import ALL_KINDS, RULES
from specpair.compat.stacks import STACK_NAMES

EXAMPLE_NAMES = {"target": "Qwen/Qwen3.6-35B-A3B", "draft": "z-lab/Qwen3.6-35B-A3B-DFlash", "stack": "llama.cpp"}


def render() -> str:
    lines = [
        "# `specpair check` rules",
        "",
        "Generated from the rule table in `compat/rules/` by `python -m specpair.compat.rules_doc`; do not edit.",
        "",
        "A stack's verdict is `fail` when any rule of severity `error` fires for it, `warn` when a `warn` rule",
        "fires, else `ok`; `info` findings explain without changing the status. Each rule applies to the listed",
        f"stacks and drafter kinds ({', '.join(f'`{k}`' for k in ALL_KINDS)}).",
        "",
        f"{len(RULES)} rules.",
        "",
        "| id | severity | stacks | drafter kinds | checks |",
        "|---|---|---|---|---|",
    ]
    for r in RULES:
        stacks = "all" if set(r.stacks) == set(STACK_NAMES) else ", ".join(r.stacks)
        kinds = "all" if set(r.kinds) == set(ALL_KINDS) else ", ".join(r.kinds)
        lines.append(f"| `{r.id}` | {r.severity} | {stacks} | {kinds} | {r.title} |")
    lines += ["", "## Example messages", ""]
    for r in RULES:
        example = r.render({**EXAMPLE_NAMES, "stack": r.stacks[0], **r.example})
        lines += [f"- `{r.id}` ({r.severity}): {example}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
