"""What the chain drafters share, EAGLE-3 heads (eagle3.py) and the MTP head (mtp.py): one trained layer drafts a
token a step, each step reading the previous one's output.

A row at position p pairs a feature f_p with the next token x_{p+1}; `step(features, tokens, positions)` runs rows
through the layer and returns (the output feature, the draft logits) of each. `observe` runs every committed row
(its features come from the target: `observed` says how) and keeps the last kept row's output and logits;
`propose` drafts d_1 from those logits and chains: step i feeds (the output of step i - 1, d_{i-1}) at the next
position. Drafts are each step's argmax (keyed draws from the same logits when sampling). Draft ids are the
drafter's vocabulary; `target_ids` maps them to the target's (a reduced vocabulary's d2t for EAGLE-3).

Cache hygiene without rollback: a chained step writes KV at positions from the next anchor on, and so does a
rejected verify row; the next round's chained steps rewrite each such position before a query there reads it
(causal attention reads no position after its own), and verified rows rewrite them with the target's features.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.checkpoint.families import DRAFTER_KINDS
from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed, Drafting, Proposal
from specpair.runtime.graphs import StepGraphs
from specpair.runtime.model import Transformer


class ChainDrafter(ABC):
    kind: str
    config: ModelConfig  # the drafter's own (its hidden size is the feature width)
    cache_config: ModelConfig  # its one attention layer, as the cache lays it out
    target: Transformer
    draft_vocab: int

    @property
    def samples(self) -> bool:
        return DRAFTER_KINDS[self.kind].samples

    def __init__(self) -> None:
        self.cache: Cache | None = None
        self.last_feature: Tensor | None = None  # [batch, H] the output of each sequence's last committed row
        self.last_logits: Tensor | None = None  # [batch, draft vocab]
        self.drafting: StepGraphs | None = None  # `_drafted`: a proposal's chain
        self.observing: StepGraphs | None = None  # `observed` for a round's block
        self.round = 0  # rows of a round's block: drafts + 1

    @abstractmethod
    def step(self, features: Tensor, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Rows (features [B, T, H], next tokens [B, T] in the target's ids) at positions [B, T] through the layer:
        (output features [B, T, H], draft logits [B, T, draft vocab])."""

    @abstractmethod
    def observed(self, read: Tensor, following: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """`step` over committed rows, from what the drafter reads of the target (`read_of`)."""

    @abstractmethod
    def read_of(self, committed: Committed) -> Tensor:
        """What the drafter reads of a target step: its taps, or its final normed hidden."""

    def target_ids(self, ids: Tensor) -> Tensor:
        return ids

    def start(self, batch: int, context: int, graphs: bool = False) -> None:
        t = self.target
        self.cache = Cache(self.cache_config, batch, context, t.dtype, t.device)
        self.last_feature = torch.zeros(batch, self.config.hidden_size, dtype=t.dtype, device=t.device)
        self.last_logits = torch.zeros(batch, self.draft_vocab, dtype=t.dtype, device=t.device)
        self.drafting, self.observing = StepGraphs(self._drafted, graphs), StepGraphs(self.observed, graphs)
        self.round = 0

    def observe(self, committed: Committed) -> None:
        rows = self.observing if committed.tokens.shape[1] == self.round else self.observed  # prefill: as they come
        out, logits = rows(self.read_of(committed), committed.following, committed.positions)
        last = (committed.kept - 1).clamp(min=0)
        batch = out.shape[0]
        index = torch.arange(batch, device=out.device)
        some = (committed.kept > 0)[:, None]
        self.last_feature[:batch] = torch.where(some, out[index, last], self.last_feature[:batch])
        self.last_logits[:batch] = torch.where(some, logits[index, last], self.last_logits[:batch])

    def reorder(self, order: Tensor) -> None:
        self.cache.reorder(order)
        self.last_feature.copy_(self.last_feature[order])
        self.last_logits.copy_(self.last_logits[order])

    def propose(self, anchors: Tensor, positions: Tensor, drafts: int, drafting: Drafting) -> Proposal:
        batch = anchors.shape[0]
        self.round = drafts + 1
        return self.drafting(
            self.last_feature[:batch], self.last_logits[:batch], positions, drafts=drafts, drafting=drafting
        )

    def _drafted(self, feature: Tensor, logits: Tensor, positions: Tensor, drafts: int, drafting: Drafting) -> Proposal:
        """A whole proposal from the last committed row's feature and logits: on CUDA one graph, the draws
        included (keyed by position, so they replay)."""
        ids = [drafting.pick(logits[:, None], positions[:, None] + 1).tokens[:, 0]]
        feature, at = feature[:, None], positions[:, None]
        for i in range(1, drafts):
            feature, logits = self.step(feature, self.target_ids(ids[-1])[:, None], at + i - 1)
            ids.append(drafting.pick(logits, at + i + 1).tokens[:, 0])
        return Proposal(self.target_ids(torch.stack(ids, dim=1)))
