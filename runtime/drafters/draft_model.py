"""A plain draft model: any family the runtime runs (runtime/models), sharing the target's tokenizer, drafting
autoregressively from its own cache.

Its cache holds the committed tokens at their positions. `propose` runs the anchor, then one step per draft
(each a keyed draw from its softmax when the round samples, else its argmax), and for an attention-only model
one more step, over the last draft, whose logits nobody reads; those steps are provisional: the Gated DeltaNet
state of a hybrid draft model is saved before them and restored after, and attention KV they leave at a
position is either what a committed token there computes (the same token after the same prefix: the same
bits, batch-invariant kernels) or rewritten before it is read. `observe` then runs the committed rows the
provisional steps did not leave in the cache: for an attention-only model none after a round (the last step
covered the whole block: known on the host, so a round reads nothing back), for a hybrid one every kept row,
from the restored state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.checkpoint.families import DRAFTER_KINDS
from specpair.errors import BadInput
from specpair.runtime import loading
from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed, Drafting, Proposal
from specpair.runtime.graphs import StepGraphs
from specpair.runtime.model import Transformer
from specpair.sources.model import Model


class DraftModel:
    kind = "draft_model"
    taps: tuple[int, ...] = ()
    hidden = False
    samples = DRAFTER_KINDS[kind].samples
    block_size = DRAFTER_KINDS["draft_model"].block_size

    def __init__(self, model: Transformer, target: Transformer, resident_bytes: int) -> None:
        self.model, self.target, self.resident_bytes = model, target, resident_bytes
        self.max_positions = model.config.max_position_embeddings
        self.vocab = min(
            model.config.vocab_size, target.config.vocab_size
        )  # padded rows past the target's are never drafted
        self.hybrid = "linear" in model.config.layer_types
        self.cache: Cache | None = None
        self.covered: Tensor | None = None  # [batch] positions below this hold committed tokens in the cache
        self.ahead = 0  # rows of the next observed step that the last proposal left in the cache (host-side)
        self.steps: StepGraphs | None = None

    @classmethod
    def load(cls, model: Model, target: Transformer, bits: int | None = None) -> DraftModel:
        if bits is not None:
            raise BadInput(model.ref, "a draft model loads as stored (quantize it with `specpair convert` instead)")
        plan = loading.plan_load(model, target.device, target.dtype)
        return cls(loading.load(plan), target, plan.resident_bytes)

    def start(self, batch: int, context: int, graphs: bool = False) -> None:
        self.cache = self.model.new_cache(batch, context)
        self.covered = torch.zeros(batch, dtype=torch.int64, device=self.model.device)
        self.ahead = 0
        self.steps = StepGraphs(self._step, graphs)

    def reorder(self, order: Tensor) -> None:
        self.cache.reorder(order)
        self.covered.copy_(self.covered[order])

    def _step(self, tokens: Tensor, positions: Tensor, logits: bool) -> Tensor | None:
        return self.model.forward(tokens, positions, self.cache, logits=logits).logits

    def observe(self, committed: Committed) -> None:
        batch, steps = committed.tokens.shape
        covered = self.covered[:batch]
        start = committed.positions[:, 0]
        first = (covered - start).clamp(min=0, max=steps)  # leading kept rows already in the cache
        first = torch.minimum(first, committed.kept)
        counts = committed.kept - first
        width = 0 if steps <= self.ahead else int(counts.max())
        if width:
            index = (first[:, None] + torch.arange(width, device=first.device)).clamp(max=steps - 1)
            tokens = committed.tokens.gather(1, index)
            positions = start[:, None] + first[:, None] + torch.arange(width, device=first.device)
            positions = positions.clamp(max=self.cache.context - 1)
            self.model.forward(tokens, positions, self.cache, logits=False, verify=True).pending.commit(counts)
        self.covered[:batch] = torch.where(committed.kept > 0, start + committed.kept, covered)

    def propose(self, anchors: Tensor, positions: Tensor, drafts: int, drafting: Drafting) -> Proposal:
        saved = {i: (self.cache.conv[i].clone(), self.cache.state[i].clone()) for i in self.cache.state}
        token, at, chosen, q_ids, q_probs = anchors[:, None], positions[:, None], [], [], []
        for i in range(drafts):
            logits = self.steps(token, at + i, logits=True)[..., : self.vocab]
            picked = drafting.pick(logits, at + i + 1)
            token = picked.tokens
            chosen.append(token)
            q_ids.append(picked.q_ids)
            q_probs.append(picked.q_probs)
        if not self.hybrid:
            self.steps(token, at + drafts, logits=False)
        for i, (conv, state) in saved.items():
            self.cache.conv[i].copy_(conv)
            self.cache.state[i].copy_(state)
        batch = anchors.shape[0]
        # what the provisional steps leave right: nothing of a hybrid model (restored), else anchor and every draft
        self.ahead = 0 if self.hybrid else drafts + 1
        self.covered[:batch] = positions + self.ahead
        tokens = torch.cat(chosen, dim=1)
        if q_ids[0] is None:
            return Proposal(tokens)
        return Proposal(tokens, torch.cat(q_ids, dim=1), torch.cat(q_probs, dim=1))
