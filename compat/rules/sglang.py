"""SGLang specifics: the target head its DFlash2 candidate selector reads."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    SELECTOR_DRAFTERS,
    Values,
    rule,
)


@rule(
    "sglang.dflash2_head",
    "warn",
    ("sglang",),
    SELECTOR_DRAFTERS,
    title="SGLang's DFlash2 top-k reads a dense target lm_head (or a supported quantized one).",
    message="{target}'s lm_head is stored as {layout}: SGLang's DFlash2 candidate top-k \"requires a dense FP16/BF16/FP32 target lm_head or a supported lm_head.quant_method\"; if it refuses, serve a checkpoint with a BF16 head.",
    example={"layout": "nvfp4-modelopt"},
)
def _dflash2_head(p: Pair, stack: str) -> Iterable[Values]:
    head = p.target.layouts_of("lm_head") or (
        p.target.layouts_of("embedding") if p.target.shapes.tie_word_embeddings else set()
    )
    quantized = sorted(layout for layout in head if layout not in ("bf16", "f16", "f32"))
    if quantized:
        yield {"layout": ", ".join(quantized)}
