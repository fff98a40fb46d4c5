"""specpair's own runtime: what it runs (target families x drafter kinds) and draft-model families."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import DRAFTER_KINDS
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_KINDS,
    PLAIN_DRAFTERS,
    Values,
    rule,
)
from specpair.compat.stacks import STACKS


@rule(
    "runtime.runs",
    "info",
    ("specpair",),
    ALL_KINDS,
    title="What specpair's own runtime runs: target families x drafter kinds, from every layout the model layer reads.",
    message="specpair's runtime runs {families} targets with {kinds} drafters, from BF16/F16/F32, FP8, NVFP4, MLX affine, EXL3 and GGUF weights (dequantized, or packed where a CUDA kernel reads them); `specpair run` verifies {draft} against {target} token for token.",
    example={
        "families": "llama, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe",
        "kinds": "DFlash, DFlash2, EAGLE-3, MTP, draft-model",
    },
)
def _runs(p: Pair, stack: str) -> Iterable[Values]:
    if p.head_missing:
        return  # no head to run: mtp.present says so
    runs = STACKS[stack]
    yield {
        "families": ", ".join(runs.families),
        "kinds": ", ".join(DRAFTER_KINDS[k].title for k in runs.kinds),
    }


@rule(
    "runtime.draft_family",
    "error",
    ("specpair",),
    PLAIN_DRAFTERS,
    title="specpair's runtime has a model file for the draft model's family.",
    message="{draft} is a {family} model, which specpair's runtime does not build (it runs {known} draft models).",
    example={"family": "gemma3", "known": "llama, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe"},
)
def _draft_family(p: Pair, stack: str) -> Iterable[Values]:
    families = STACKS[stack].families
    if p.draft.family not in families:
        yield {"family": p.draft.family, "known": ", ".join(families)}
