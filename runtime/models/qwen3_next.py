"""Qwen3-Next (Qwen3NextForCausalLM): Gated DeltaNet layers and gated full attention every
full_attention_interval-th layer, zero-centred norms, partial rotary; routed experts with a sigmoid-gated
shared expert (dense MLP on mlp_only_layers / off decoder_sparse_step). Its fused in_proj_qkvz / in_proj_ba
arrive split as Qwen3.5 stores them (checkpoint/names.py), so the mixer is Qwen3.5's."""

from __future__ import annotations

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import MLP, DecoderLayer, Fetch, MoE, mixer, norms
from specpair.runtime.rope import Rope


def decoder_layer(config: ModelConfig, i: int, fetch: Fetch, rope: Rope) -> DecoderLayer:
    before, after = norms(config, i, fetch)
    mlp = (
        MoE.build(config, i, fetch, shared_expert=True)
        if config.is_moe_layer(i)
        else MLP.build(config, f"layers.{i}.mlp.", config.intermediate_size, fetch)
    )
    return DecoderLayer(before, mixer(config, i, fetch, rope), after, mlp)
