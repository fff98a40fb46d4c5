"""docs/check.md is generated from the rule table and must match it."""

from pathlib import Path

from specpair.compat.rules import RULES
from specpair.compat.rules_doc import render

ROOT = Path(__file__).resolve().parent.parent


def test_check_md_matches_the_rule_table():
    assert (ROOT / "docs" / "check.md").read_text() == render(), (
        "run: python -m specpair.compat.rules_doc > docs/check.md"
    )


def test_every_rule_is_documented_with_a_rendered_example():
    text = render()
    for r in RULES:
        assert f"| `{r.id}` | {r.severity} |" in text
        assert f"- `{r.id}` ({r.severity}): " in text
    assert "{" not in text.split("## Example messages")[1]
