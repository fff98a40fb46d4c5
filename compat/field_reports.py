"""Acceptance reported from the field for a published checkpoint on a stack, where no metadata explains it: one row
per report, read by rule trust.field_report. A row names what was measured and where; its cause, when the thread
found none, stays unstated."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldReport:
    # the published checkpoints it concerns (either of the pair, in each of its forms), as the Hub spells them
    repos: tuple[str, ...]
    stack: str
    finding: str  # what was measured, in the words of a message
    source: str  # the thread, and its state when read


FIELD_REPORTS = (
    FieldReport(
        ("z-lab/Qwen3.5-122B-A10B-DFlash",),
        "llama.cpp",
        "2-12 % of drafts accepted beside a UD-Q4_K_XL target (both published revisions, the drafter in Q8_0 and F16 "
        "alike, the target from Q3_K to Q5_K alike), where the same setup keeps 48-59 % with z-lab's "
        "Qwen3.6-35B-A3B drafter",
        "z-lab/dflash#152, open, no cause found as of 2026-08",
    ),
    FieldReport(
        ("z-lab/Qwen3.8-27B-DFlash2", "z-lab/Qwen3.8-27B-DFlash2-GGUF"),
        "llama.cpp",
        "2.2-3.3 tokens a round beside a UD-Q6_K_XL target (Q8_0 drafter), where the reporter saw about 5.5 on vLLM "
        "(an FP8 copy of the drafter, another target's quantization); llama.cpp's own bench measured τ 3.58 on an "
        "H200 (PR #27342)",
        "z-lab/dflash#170, open as of 2026-09",
    ),
)
