"""Qwen3.5 / Qwen3.6 MoE (Qwen3_5MoeForCausalLM: Qwen3.6-35B-A3B, Qwen3.5-122B-A10B, ...): Qwen3.5's mixers and
norms; every layer routes (softmax -> top-k -> always renormalised) and adds a sigmoid-gated shared expert."""

from __future__ import annotations

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import DecoderLayer, Fetch, MoE, mixer, norms
from specpair.runtime.rope import Rope


def decoder_layer(config: ModelConfig, i: int, fetch: Fetch, rope: Rope) -> DecoderLayer:
    before, after = norms(config, i, fetch)
    return DecoderLayer(before, mixer(config, i, fetch, rope), after, MoE.build(config, i, fetch, shared_expert=True))
