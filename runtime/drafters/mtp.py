"""The MTP head of Qwen3.5 / Qwen3.6 / Qwen3-Next targets (`mtp.*` in the target's checkpoint; dflash.md §5,
targets.md §3.7) as a drafter.

A row at position p pairs the target's final normed hidden h_p with the next token x_{p+1}:
    z = fc([norm_e(embed(x_{p+1})) | norm_h(h_p)])      # zero-centred norms, embedding half first
    z = one full-attention decoder layer of the target's family (gated attention, MoE or MLP), own KV cache
    g = norm(z); logits = the target's head(g)            # the token at p + 2
`observe` runs every committed row (draft-extend: the KV of position p needs x_{p+1}, known once the round
after p is verified) and keeps the last kept row's g and logits; `propose` drafts d_1 from those and chains:
step i feeds (g_{i-1}, d_{i-1}) at the next position, the one trained layer reused each step. Drafts are each
step's argmax.

Cache hygiene without rollback: a chained step writes KV at positions from the next anchor on, and so does a
rejected verify row; the next round's chained steps rewrite each such position before a query there reads it
(causal attention reads no position after its own), and verified rows rewrite them with the target's hidden.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.errors import BadInput
from specpair.runtime.blocks import DecoderLayer, Fetch, Norm, Step, Weight, project
from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed, Drafting, Proposal
from specpair.runtime.drafters.weights import load_weights
from specpair.runtime.graphs import StepGraphs
from specpair.runtime.model import Transformer
from specpair.runtime.models import FAMILIES
from specpair.sources.model import Model


class MTP:
    kind = "mtp"
    taps: tuple[int, ...] = ()
    hidden = True
    samples = False
    block_size = 4  # three chained drafts a round: vLLM's and SGLang's usual num_speculative_tokens

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
        self.config, self.target = config, target
        self.fc, self.norm_embedding, self.norm_hidden, self.layer, self.norm = (
            fc,
            norm_embedding,
            norm_hidden,
            layer,
            norm,
        )
        self.max_positions = target.config.max_position_embeddings
        self.cache: Cache | None = None
        self.last_hidden: Tensor | None = None  # [batch, H] g of each sequence's last committed row
        self.last_logits: Tensor | None = None  # [batch, V]
        self.steps: StepGraphs | None = None  # `step` for a proposal's rows and a round's block
        self.round = 0  # rows of a round's block: drafts + 1

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

    def start(self, batch: int, context: int, graphs: bool = False) -> None:
        t = self.target
        self.cache = Cache(self.config, batch, context, t.dtype, t.device)
        self.last_hidden = torch.zeros(batch, self.config.hidden_size, dtype=t.dtype, device=t.device)
        self.last_logits = torch.zeros(batch, self.config.vocab_size, dtype=t.dtype, device=t.device)
        self.steps, self.round = StepGraphs(self.step, graphs), 0

    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Rows (hidden [B, T, H], next tokens [B, T]) at positions [B, T] -> (g [B, T, H], logits [B, T, V])."""
        z = torch.cat((self.norm_embedding(self.target.embed(tokens)), self.norm_hidden(hidden)), dim=-1)
        z = project(z, self.fc)
        cos, sin = self.target.rope.tables(positions)
        z, delta = self.layer(z, Step.of(positions, cos, sin, self.cache, False))
        _, g = self.norm.add(z, delta)
        return g, self.target.head(g)

    def observe(self, committed: Committed) -> None:
        step = self.steps if committed.tokens.shape[1] == self.round else self.step  # prefill chunks: as they come
        g, logits = step(committed.hidden, committed.following, committed.positions)
        last = (committed.kept - 1).clamp(min=0)
        rows = torch.arange(g.shape[0], device=g.device)
        some = (committed.kept > 0)[:, None]
        batch = g.shape[0]
        self.last_hidden[:batch] = torch.where(some, g[rows, last], self.last_hidden[:batch])
        self.last_logits[:batch] = torch.where(some, logits[rows, last], self.last_logits[:batch])

    def propose(self, anchors: Tensor, positions: Tensor, drafts: int, drafting: Drafting) -> Proposal:
        batch = anchors.shape[0]
        self.round = drafts + 1
        tokens = [drafting.pick(self.last_logits[:batch, None], positions[:, None] + 1).tokens[:, 0]]
        hidden, at = self.last_hidden[:batch, None], positions[:, None]
        for i in range(1, drafts):
            hidden, logits = self.steps(hidden, tokens[-1][:, None], at + i - 1)
            tokens.append(drafting.pick(logits, at + i + 1).tokens[:, 0])
        return Proposal(torch.stack(tokens[:drafts], dim=1))
