"""Qwen3.5 / Qwen3.6 dense (Qwen3_5ForCausalLM, the LM of Qwen3_5ForConditionalGeneration): three Gated DeltaNet
layers then one gated full-attention layer (layer_types), zero-centred norms (1 + w) everywhere but the GDN
output norm, rotary on the first quarter of each head (M-RoPE, which is 1-D rope for text), SwiGLU MLP."""

from __future__ import annotations

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import MLP, DecoderLayer, Fetch, mixer, norms
from specpair.runtime.rope import Rope


def decoder_layer(config: ModelConfig, i: int, fetch: Fetch, rope: Rope) -> DecoderLayer:
    before, after = norms(config, i, fetch)
    mlp = MLP.build(config, f"layers.{i}.mlp.", config.intermediate_size, fetch)
    return DecoderLayer(before, mixer(config, i, fetch, rope), after, mlp)
