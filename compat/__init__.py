"""Pairing rules and verdicts: `rules/` is the table of checks, `stacks.py` what each serving stack
loads, `memory.py` the GPU table and memory estimate, `verdict.py` the per-stack answer."""
