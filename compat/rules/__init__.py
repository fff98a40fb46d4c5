"""The rule table, filled: importing the package imports every rule module, in the order of the table and of
docs/check.md (the machinery, `rule`, `RULES` and `evaluate`, lives in table.py so that no rule module imports
its own package)."""

from specpair.compat.rules import drafter, runtime, vllm, sglang, taps, hidden, vocab, mask, base, mtp, draft_model  # noqa: F401,I001
from specpair.compat.rules import rope, format, tensorfold, hw, memory, hybrid, gguf, revision, trust  # noqa: F401,I001
from specpair.compat.rules import speculators, speed  # noqa: F401,I001
from specpair.compat.rules.table import ALL_KINDS, RULES, Finding, Rule, evaluate

__all__ = ["ALL_KINDS", "RULES", "Finding", "Rule", "evaluate"]
