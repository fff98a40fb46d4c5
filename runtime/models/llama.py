"""Llama (LlamaForCausalLM: Llama 2/3, SmolLM2, ...): grouped-query attention with optional biases, RMSNorm,
SwiGLU MLP; rope default, linear, Llama 3 or YaRN as the config says. GGUF's interleaved q/k rows are undone by
the model layer, so the rope here is transformers' half-split one."""

from __future__ import annotations

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import MLP, Attention, DecoderLayer, Fetch, norms
from specpair.runtime.rope import Rope


def decoder_layer(config: ModelConfig, i: int, fetch: Fetch, rope: Rope) -> DecoderLayer:
    before, after = norms(config, i, fetch)
    mlp = MLP.build(config, f"layers.{i}.mlp.", config.intermediate_size, fetch, bias=config.mlp_bias)
    return DecoderLayer(before, Attention.build(config, i, fetch, rope), after, mlp)
