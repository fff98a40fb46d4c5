"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention; routed experts (no shared expert), top-k renormalised
only when norm_topk_prob; layers in mlp_only_layers or off decoder_sparse_step keep a dense MLP."""

from __future__ import annotations

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import MLP, Attention, DecoderLayer, Fetch, MoE, norms
from specpair.runtime.rope import Rope


def decoder_layer(config: ModelConfig, i: int, fetch: Fetch, rope: Rope) -> DecoderLayer:
    before, after = norms(config, i, fetch)
    mlp = (
        MoE.build(config, i, fetch, shared_expert=False)
        if config.is_moe_layer(i)
        else MLP.build(config, f"layers.{i}.mlp.", config.intermediate_size, fetch)
    )
    return DecoderLayer(before, Attention.build(config, i, fetch, rope), after, mlp)
