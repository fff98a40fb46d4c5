"""EAGLE-3 heads (LlamaForCausalLMEagle3: dflash.md §6; speculators' / vLLM's llama_eagle3) as a chain drafter
(chain.py).

A row at position p pairs a feature f_p with the next token x_{p+1}. For committed rows f_p = fc(taps_p), the
outputs of the target layers the drafter was trained on: its aux ids read in its training framework's convention
(checkpoint/families.py TAP_LAYOUTS, docs/taps.md; ModelConfig holds them as "output of layer k" taps), the EAGLE
repository's inputs of layers (2, L // 2, L - 3) when its config names none; for chained steps f is the previous
step's output. The one decoder layer ("midlayer") attends from [input_layernorm(embed(x_{p+1})) |
hidden_norm(f_p)] (2H wide q/k/v), its residual is f_p (hidden_norm(f_p) with norm_before_residual), then a
SwiGLU MLP; logits = lm_head(norm(z)) over the draft vocabulary, whose id i is target id i + d2t[i]. The
embedding is the head's own where it ships one, else the target's.

EAGLE-3.1's norms, where its config turns them on (checkpoint/families.py EAGLE_NORMS, as speculators trains them):
norm_before_fc normalizes the concatenated taps before fc (input_norm.weight; ones where the checkpoint ships none,
as speculators loads it), fc_norm each tap (fc_norm.N.weight); norm_output feeds norm(z), not z, to the next step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.checkpoint.families import DRAFTER_KINDS, default_layout
from specpair.errors import BadInput
from specpair.runtime.blocks import MLP, Fetch, Norm, Weight, optional_bias, project
from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed
from specpair.runtime.drafters.chain import ChainDrafter
from specpair.runtime.drafters.weights import load_weights
from specpair.runtime.kernels import attention
from specpair.runtime.model import Transformer
from specpair.runtime.rope import Rope
from specpair.sources.model import Model


@dataclass
class MidLayer:
    input_norm: Norm
    hidden_norm: Norm
    post_norm: Norm
    q_proj: Weight
    k_proj: Weight
    v_proj: Weight
    o_proj: Weight
    biases: tuple[Tensor | None, ...]
    mlp: MLP
    heads: int
    kv_heads: int
    head_dim: int
    norm_before_residual: bool

    @classmethod
    def build(cls, config: ModelConfig, fetch: Fetch) -> MidLayer:
        p, hidden = "midlayer.", config.hidden_size
        heads, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
        shapes = {
            "q_proj": (heads * d, 2 * hidden),
            "k_proj": (kv * d, 2 * hidden),
            "v_proj": (kv * d, 2 * hidden),
            "o_proj": (hidden, heads * d),
        }
        weights = [fetch(f"{p}self_attn.{k}.weight", s, matmul=True) for k, s in shapes.items()]
        biases = tuple(
            optional_bias(config.attention_bias, fetch, f"{p}self_attn.{k}.weight", s[0]) for k, s in shapes.items()
        )
        norms = [
            Norm.build(config, f"{p}{n}.weight", hidden, fetch)
            for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")
        ]
        return cls(
            *norms,
            *weights,
            biases,
            MLP.build(config, p + "mlp.", config.intermediate_size, fetch, bias=config.mlp_bias),
            heads,
            kv,
            d,
            config.drafter.norm_before_residual,
        )

    def __call__(self, embeds: Tensor, feature: Tensor, positions: Tensor, rope: Rope, cache: Cache) -> Tensor:
        B, T, _ = embeds.shape
        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        x = torch.cat((self.input_norm(embeds), normed), dim=-1)
        bq, bk, bv, bo = self.biases
        q = project(x, self.q_proj, bq).view(B, T, self.heads, self.head_dim)
        k = project(x, self.k_proj, bk).view(B, T, self.kv_heads, self.head_dim)
        v = project(x, self.v_proj, bv).view(B, T, self.kv_heads, self.head_dim)
        cos, sin = rope.tables(positions)
        q, k = rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)
        k_cache, v_cache = cache.store(0, positions, k, v)
        o = attention.attention(
            q.contiguous(), k_cache, v_cache, torch.zeros_like(positions), positions + 1, self.head_dim**-0.5
        )
        h = residual + project(o.reshape(B, T, -1), self.o_proj, bo)
        return h + self.mlp(self.post_norm(h))


class Eagle3(ChainDrafter):
    kind = "eagle3"
    hidden = False
    block_size = DRAFTER_KINDS["eagle3"].block_size

    def __init__(
        self,
        config: ModelConfig,
        target: Transformer,
        taps: tuple[int, ...],
        fc: Weight,
        embed_tokens: Tensor | None,
        layer: MidLayer,
        norm: Norm,
        lm_head: Weight,
        d2t: Tensor,
        tap_norms: tuple[Norm, ...],
    ) -> None:
        super().__init__()
        self.config, self.target, self.taps = config, target, taps
        self.tap_norms = tap_norms  # before fc, each over its equal share of the concatenated taps
        self.norm_output = "norm_output" in config.drafter.eagle_norms
        self.cache_config = dataclasses.replace(config, num_layers=1, layer_types=("full",))
        self.fc, self.embed_tokens, self.layer, self.norm, self.lm_head = fc, embed_tokens, layer, norm, lm_head
        self.to_target = torch.arange(d2t.shape[0], device=d2t.device) + d2t
        self.draft_vocab = lm_head.shape[0]
        self.max_positions = config.max_position_embeddings
        self.rope = Rope(config, target.device)

    @classmethod
    def load(cls, model: Model, target: Transformer, bits: int | None = None) -> Eagle3:
        config, t = model.config, target.config
        taps = config.drafter.target_layer_ids
        if not taps:  # no ids in its config: the EAGLE repository's default, as every stack assumes
            layout = default_layout(config.drafter.kind)
            taps = tuple(layout.reading.layers(layout.default_ids(t.num_layers)))
        if max(taps) >= t.num_layers or min(taps) < 0:
            raise BadInput(
                model.ref,
                f"reads the outputs of the target's layers {list(taps)}, but the target has layers "
                f"0..{t.num_layers - 1}",
            )
        hidden, vocab = config.hidden_size, config.drafter.draft_vocab_size or config.vocab_size
        target_hidden = config.drafter.target_hidden_size or t.hidden_size
        if target_hidden != t.hidden_size:
            raise BadInput(
                model.ref, f"target_hidden_size {target_hidden} is not the target's hidden size {t.hidden_size}"
            )
        own_embedding = "embed_tokens.weight" in model.names
        if not own_embedding and hidden != t.hidden_size:
            raise BadInput(
                model.ref, f"has no embedding of its own and hidden_size {hidden}, not the target's {t.hidden_size}"
            )

        norms, width = config.drafter.eagle_norms, len(taps) * t.hidden_size

        def tap_norms(fetch: Fetch) -> tuple[Norm, ...]:
            if "fc_norm" in norms:
                return tuple(Norm.build(config, f"fc_norm.{i}.weight", t.hidden_size, fetch) for i in range(len(taps)))
            if "norm_before_fc" not in norms:
                return ()
            if "input_norm.weight" in model.names:
                return (Norm.build(config, "input_norm.weight", width, fetch),)
            return (Norm(torch.ones(width, device=target.device, dtype=target.dtype), config.rms_norm_eps, False),)

        def build(fetch: Fetch) -> Eagle3:
            embed = fetch("embed_tokens.weight", (config.vocab_size, hidden)) if own_embedding else None
            return cls(
                config,
                target,
                taps,
                fetch("fc.weight", (hidden, len(taps) * t.hidden_size), matmul=True),
                embed,
                MidLayer.build(config, fetch),
                Norm.build(config, "norm.weight", hidden, fetch),
                fetch("lm_head.weight", (vocab, hidden), matmul=True),
                fetch("d2t", (vocab,), fp32=True),
                tap_norms(fetch),
            )

        drafter = load_weights(model, build, target.device, target.dtype, bits, ignored=("t2d",))
        drafter.to_target = drafter.to_target.to(torch.int64)
        if bool((drafter.to_target < 0).any() | (drafter.to_target >= t.vocab_size).any()):
            raise BadInput(model.ref, "has d2t offsets that map draft ids outside the target's vocabulary")
        return drafter

    def step(self, feature: Tensor, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        own = self.embed_tokens
        embeds = torch.nn.functional.embedding(tokens, own) if own is not None else self.target.embed(tokens)
        z = self.layer(embeds, feature, positions, self.rope, self.cache)
        normed = self.norm(z)
        return normed if self.norm_output else z, project(normed, self.lm_head)

    def observed(self, read: Tensor, following: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        if self.tap_norms:
            parts = read.chunk(len(self.tap_norms), dim=-1)
            read = torch.cat([norm(part) for norm, part in zip(self.tap_norms, parts, strict=True)], dim=-1)
        return self.step(project(read, self.fc), following, positions)

    def read_of(self, committed: Committed) -> Tensor:
        return committed.taps

    def target_ids(self, ids: Tensor) -> Tensor:
        return self.to_target[ids]
