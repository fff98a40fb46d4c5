"""The rule table, filled: importing the package imports every rule module, in the order of the table and of
docs/check.md (the machinery, `rule`, `RULES` and `evaluate`, lives in table.py so rule modules never import
their own package)."""

from specpair.compat.rules import drafter, taps, vocab, lineage, context, formats, hardware, gguf, provenance  # noqa: F401,I001
from specpair.compat.rules.table import ALL_KINDS, RULES, Finding, Rule, evaluate

__all__ = ["ALL_KINDS", "RULES", "Finding", "Rule", "evaluate"]
