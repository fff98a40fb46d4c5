"""Hybrid targets: how each stack rolls back recurrent (Gated DeltaNet) state after a rejected draft."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_KINDS,
    Values,
    rule,
)


@rule(
    "hybrid.rollback",
    "info",
    ("specpair", "sglang", "vllm", "exllamav3"),
    ALL_KINDS,
    title="How the stack rolls back recurrent (Gated DeltaNet) state after a partly rejected draft.",
    message="{target} is hybrid ({linear} Gated DeltaNet + {full} attention layers): after a partly accepted draft the recurrent state must roll back; {how}.",
    example={
        "linear": 30,
        "full": 10,
        "how": "SGLang needs --mamba-scheduler-strategy extra_buffer (in the launch line)",
    },
)
def _rollback(p: Pair, stack: str) -> Iterable[Values]:
    if not p.target.is_hybrid:
        return
    how = {
        "specpair": "specpair keeps the state from before verify and re-runs the accepted prefix",
        "sglang": "SGLang needs --mamba-scheduler-strategy extra_buffer (in the launch line)",
        "vllm": "vLLM keeps one state slot per draft position and resumes from the last accepted one",
        "exllamav3": "ExLlamaV3 checkpoints the recurrent state per draft round",
    }[stack]
    yield {"linear": p.target.shapes.count("linear"), "full": p.target.shapes.count("full"), "how": how}


@rule(
    "hybrid.rollback_build",
    "warn",
    ("llama.cpp",),
    ALL_KINDS,
    title="llama.cpp rolls back hybrid state only in builds with the hybrid-state fallback.",
    message="{target} is hybrid ({linear} recurrent layers): llama.cpp rewinds its state after rejected drafts only in builds with the hybrid-state fallback (PRs #19493, #22227); older builds cannot speculate on it.",
    example={"linear": 30},
)
def _rollback_build(p: Pair, stack: str) -> Iterable[Values]:
    if p.target.is_hybrid:
        yield {"linear": p.target.shapes.count("linear")}
