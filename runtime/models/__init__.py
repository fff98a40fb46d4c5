"""One file per model family (mlx-lm's habit): each says which blocks a decoder layer of that family is made of.

Names and value conventions are already canonical (checkpoint/names.py), so a family file is only its
composition; `FAMILIES` maps ModelConfig.family to its `decoder_layer(config, i, fetch, rope)` and the layer
types it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specpair.runtime.models import llama, qwen3, qwen3_5, qwen3_5_moe, qwen3_moe, qwen3_next


@dataclass(frozen=True)
class Family:
    decoder_layer: Callable
    layer_types: tuple[str, ...]  # the ModelConfig.layer_types values it builds


FAMILIES: dict[str, Family] = {
    "llama": Family(llama.decoder_layer, ("full", "sliding")),
    "qwen3": Family(qwen3.decoder_layer, ("full", "sliding")),
    "qwen3_moe": Family(qwen3_moe.decoder_layer, ("full", "sliding")),
    "qwen3_next": Family(qwen3_next.decoder_layer, ("full", "linear")),
    "qwen3_5": Family(qwen3_5.decoder_layer, ("full", "linear")),
    "qwen3_5_moe": Family(qwen3_5_moe.decoder_layer, ("full", "linear")),
}
