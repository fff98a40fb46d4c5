"""Qwen3 dense (Qwen3ForCausalLM): Llama's layer plus a per-head RMSNorm on q and k before rope (plain gains,
not 1 + w); head_dim 128 independent of hidden_size."""

from __future__ import annotations

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import MLP, Attention, DecoderLayer, Fetch, norms
from specpair.runtime.rope import Rope


def decoder_layer(config: ModelConfig, i: int, fetch: Fetch, rope: Rope) -> DecoderLayer:
    before, after = norms(config, i, fetch)
    mlp = MLP.build(config, f"layers.{i}.mlp.", config.intermediate_size, fetch)
    return DecoderLayer(before, Attention.build(config, i, fetch, rope), after, mlp)
