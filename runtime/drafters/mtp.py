"""The MTP head of Qwen3.5 / Qwen3.6 / Qwen3-Next targets (`mtp.*` in the target's checkpoint; dflash.md §5,
targets.md §3.7) as a chain drafter (chain.py).

A row at position p pairs the target's final normed hidden h_p with the next token x_{p+1}:
    z = fc([norm_e(embed(x_{p+1})) | norm_h(h_p)])      # zero-centred norms, embedding half first
    z = one full-attention decoder layer of the target's family (gated attention, MoE or MLP), own KV cache
    g = norm(z); logits = the target's head(g)            # the token at p + 2
`observe` runs every committed row (draft-extend: the KV of position p needs x_{p+1}, known once the round
after p is verified); chained steps feed g back in place of h.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.checkpoint.families import DRAFTER_KINDS
from specpair.errors import BadInput
from specpair.runtime.blocks import DecoderLayer, Fetch, Norm, Step, Weight, project
from specpair.runtime.drafters import Committed
from specpair.runtime.drafters.chain import ChainDrafter
from specpair.runtime.drafters.weights import load_weights
from specpair.runtime.model import Transformer
from specpair.runtime.models import FAMILIES
from specpair.sources.model import Model


class MTP(ChainDrafter):
    kind = "mtp"
    taps: tuple[int, ...] = ()
    hidden = True
    block_size = DRAFTER_KINDS["mtp"].block_size

    def __init__(
        self,
        config: ModelConfig,
        target: Transformer,
        fc: Weight,
        norm_embedding: Norm,
        norm_hidden: Norm,
        layer: DecoderLayer,
        norm: Norm,
    ) -> None:
        super().__init__()
        self.config, self.cache_config, self.target = config, config, target
        self.fc, self.norm_embedding, self.norm_hidden, self.layer, self.norm = (
            fc,
            norm_embedding,
            norm_hidden,
            layer,
            norm,
        )
        self.draft_vocab = config.vocab_size
        self.max_positions = target.config.max_position_embeddings

    @classmethod
    def load(cls, model: Model, target: Transformer, bits: int | None = None) -> MTP:
        """The MTP head inside `model`, the target's own checkpoint (`target` loaded from it)."""
        t = model.config
        if t.mtp_layers < 1 or not any(n.startswith("mtp.") for n in model.names):
            raise BadInput(
                model.ref,
                f"has no MTP head (mtp.* weights) to draft with; its {t.family} config "
                f"declares {t.mtp_layers} MTP layers",
            )
        if t.mtp_use_dedicated_embeddings:
            raise BadInput(model.ref, "declares MTP layers with dedicated embeddings, which the runtime does not build")
        config = dataclasses.replace(t, num_layers=1, layer_types=("full",), mlp_only_layers=(), drafter=None)
        hidden = t.hidden_size

        def build(fetch: Fetch) -> MTP:
            layer = FAMILIES[t.family].decoder_layer(config, 0, fetch, target.rope)
            return cls(
                config,
                target,
                fetch("fc.weight", (hidden, 2 * hidden), matmul=True),
                Norm.build(config, "pre_fc_norm_embedding.weight", hidden, fetch),
                Norm.build(config, "pre_fc_norm_hidden.weight", hidden, fetch),
                layer,
                Norm.build(config, "norm.weight", hidden, fetch),
            )

        return load_weights(model, build, target.device, target.dtype, bits, prefix="mtp.")

    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        z = torch.cat((self.norm_embedding(self.target.embed(tokens)), self.norm_hidden(hidden)), dim=-1)
        z = project(z, self.fc)
        cos, sin = self.target.rope.tables(positions)
        _, z, delta = self.layer(z, Step.of(positions, cos, sin, self.cache, None))
        _, g = self.norm.add(z, delta)
        return g, self.target.head(g)

    def observed(self, read: Tensor, following: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.step(read, following, positions)

    def read_of(self, committed: Committed) -> Tensor:
        return committed.hidden
