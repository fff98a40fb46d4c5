"""Drafters: what proposes the tokens a target verifies, one module per kind.

Every drafter speaks the same three calls to the speculative loop (runtime/speculative.py):

    drafter.start(batch, context, graphs)   # preallocate its caches; graphs: capture its fixed-shape steps
    drafter.observe(committed)              # after every target step: the rows the target kept, with their features
    drafter.propose(anchors, positions, drafts, drafting) -> Proposal
    drafter.reorder(order)                  # between rounds: sequence rows moved (the finished behind the live)

Positions are the target's. The anchor of sequence b is the last token chosen and not yet run through the
target, at `positions[b]`; a proposal is `drafts` tokens for positions[b] + 1 .. positions[b] + drafts.
`Committed` describes one target step (a prefill chunk or a verify block): its rows t = 0..T-1 at positions
p, the token x_p each row ran and the token x_{p+1} that follows it, and how many leading rows of each
sequence the target kept; only kept rows are committed history. A drafter's attention caches are the target's
Cache class (runtime/cache.py, store() writing K and V at their positions), each position at its absolute index;
a row beyond what was kept is overwritten before any later query can read it (each drafter's docstring says
why), so no drafter needs to roll its own cache back; a draft model, a target itself, commits its verify steps.

Drafts never change the output (the target verifies them), only how many tokens a round commits: a wrong
proposal costs speed, never exactness.

With `graphs`, a drafter runs the steps whose shapes recur (a proposal, whole for block and chain drafters or a
step at a time for a draft model, and the observation of a round's block, which is one row wider than the
proposal's drafts; a DFlash drafter's inside its next proposal) through runtime/graphs.py's StepGraphs: CUDA graphs
captured at the second call of each shape, on CUDA; the same steps eagerly through static buffers on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from specpair.runtime.sampling import Sampling, greedy_choice, gumbel_of, keyed_choice


@dataclass
class Committed:
    tokens: Tensor  # [B, T] x_p, the token each row ran
    positions: Tensor  # [B, T] p
    following: Tensor  # [B, T] x_{p+1} (valid on kept rows)
    kept: Tensor  # [B] leading rows of each sequence the target kept
    taps: Tensor | None  # [B, T, n_taps * H] target residual streams after the drafter's tap layers
    hidden: Tensor | None  # [B, T, H] the target's final normed hidden


@dataclass
class Proposal:
    tokens: Tensor  # [B, k]
    q_ids: Tensor | None = None  # [B, k, K] the sparse draft distribution each token was drawn from;
    q_probs: Tensor | None = None  # None: one-hot at tokens (the drafter's argmax)


@dataclass(frozen=True)
class Drafting:
    """How a drafter turns its logits into tokens: its argmax (greedy), or a keyed draw from its sampling
    distribution, with the target's own noise (`stream` = sampling.TOKEN_STREAM: the drafter guesses the target's
    draw, acceptance.by_choice) or noise of its own (acceptance.rejection)."""

    sampling: Sampling
    sampled: bool
    stream: int

    def pick(self, logits: Tensor, positions: Tensor) -> Proposal:
        """logits [B, k, V] for the tokens at positions [B, k]."""
        if not self.sampled:
            return Proposal(greedy_choice(logits))
        probs = self.sampling.probabilities(logits)
        tokens = keyed_choice(probs, self.sampling.seed, self.stream, positions)
        ids = torch.arange(logits.shape[-1], device=logits.device).expand_as(probs)
        return Proposal(tokens, ids, probs)

    def candidate_noise(self, candidates: Tensor, positions: Tensor) -> Tensor | None:
        """The keyed Gumbel noise of candidates [B, k, K] for the tokens at positions [B, k], which DFlash2's
        selector draws among (kernels/selector.py), or None when greedy."""
        if not self.sampled:
            return None
        return gumbel_of(self.sampling.seed, self.stream, positions, candidates)


class Drafter(Protocol):
    kind: str
    block_size: int  # tokens verified per round by default: the anchor and block_size - 1 drafts
    taps: tuple[int, ...]  # target layers whose outputs `observe` needs
    hidden: bool  # whether `observe` needs the target's final normed hidden
    max_positions: int | None  # the drafter's trained context (max_position_embeddings)
    samples: bool  # at a temperature it draws from its q (DFlash2, draft models); else it drafts its argmax
    resident_bytes: int  # its weights on the device

    def start(self, batch: int, context: int, graphs: bool = False) -> None: ...

    def observe(self, committed: Committed) -> None: ...

    def propose(self, anchors: Tensor, positions: Tensor, drafts: int, drafting: Drafting) -> Proposal: ...

    def reorder(self, order: Tensor) -> None:
        """Its per-sequence state's row b becomes row order[b]'s (Cache.reorder), between rounds."""
