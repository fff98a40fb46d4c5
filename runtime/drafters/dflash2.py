"""DFlash2's two additions to a DFlash layer stack (dflash.md §3.4; z-lab's GroupedDynamicCausalConv and
CandidateSelector): a grouped dynamic causal convolution around each attention and MLP, and a candidate
selector that walks the block left to right over the top-K tokens of each row.

Convolution. `kernel_projection` maps a row x to 2·K·G coefficients (G = hidden / conv_group_size groups of
channels sharing one): half for the side before the sublayer (`prepare`), half for after it (`finish`), both
from the same pre-sublayer x. Each side is out[t, c] = sum_{j < K} (base[side, j, c] + dynamic[t, j, c // gs])
· z[t - j, c] over the rows of the block only (row t - j < 0 reads zeros), so a row's in-block position is its
index in the block the runtime drafts, whatever block size the drafter was trained with (SGLang's
`set_block_size`, vLLM's 1 + N).

Selector. With U_j the top-K logits of row j (ids C_j) and h_j = hidden_projection(out_j), the score of
candidate b after the previous token a is U_j(b) + <predecessor[a] · h_j, successor[C_j(b)]>; the walk starts
from the anchor and takes the best candidate (greedy) or draws one from softmax(scores / T) (sampled: that
K-candidate distribution is the q of the verify rule); on the GPU the candidates are three launches and the
whole walk one (runtime/kernels/selector.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import Fetch, Weight, project
from specpair.runtime.drafters import Drafting, Proposal
from specpair.runtime.kernels.conv import dynamic_conv
from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.kernels.selector import selector_walk, top_candidates


@dataclass
class DynamicConv:
    base: Tensor  # [2, K, H] float32
    projection: Weight  # [2 * K * G, H]
    group_size: int

    @classmethod
    def build(cls, config: ModelConfig, prefix: str, fetch: Fetch) -> DynamicConv:
        d, hidden = config.drafter, config.hidden_size
        taps, groups = d.conv_kernel_size, hidden // d.conv_group_size
        return cls(
            fetch(prefix + "base_kernel", (2, taps, hidden), fp32=True),
            fetch(prefix + "kernel_projection.weight", (2 * taps * groups, hidden), matmul=True),
            d.conv_group_size,
        )

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor | SplitSums]:
        """x [B, T, H] (one block per sequence) -> (the convolved x, the coefficients `finish` reads: the kernel
        projection's product, both sides, or its partials, which each convolution adds as it reads them)."""
        coefficients = project(x, self.projection, unsummed=True)
        return dynamic_conv(x, coefficients, 0, self.base[0], self.group_size, x.shape[1]), coefficients

    def finish(self, y: Tensor | SplitSums, coefficients: Tensor | SplitSums, block: int) -> Tensor:
        """y: the sublayer's output [B, T, H], or its product's partials over the B·T rows of blocks of `block`."""
        return dynamic_conv(y, coefficients, 1, self.base[1], self.group_size, block)


@dataclass
class CandidateSelector:
    projection: Weight  # [R, H]
    predecessors: Tensor  # [V, R]
    successors: Tensor  # [V, R]
    top_k: int

    @classmethod
    def build(cls, config: ModelConfig, fetch: Fetch) -> CandidateSelector:
        d, vocab = config.drafter, config.vocab_size
        rank = d.selector_rank
        p = "candidate_selector."
        return cls(
            fetch(p + "hidden_projection.weight", (rank, config.hidden_size), matmul=True),
            fetch(p + "predecessor_codebook", (vocab, rank), fp32=True),
            fetch(p + "successor_codebook", (vocab, rank), fp32=True),
            d.selector_top_k,
        )

    def walk(self, out: Tensor, logits: Tensor, anchors: Tensor, positions: Tensor, drafting: Drafting) -> Proposal:
        """out [B, k, H] the drafter's normed rows after the anchor, logits [B, k, V] their (scaled) logits,
        positions [B, k] where their tokens go."""
        unary, candidates = top_candidates(logits, self.top_k)
        hidden = project(out, self.projection).float()
        noise = drafting.candidate_noise(candidates, positions)
        tokens, q = selector_walk(
            unary,
            candidates,
            hidden,
            self.predecessors,
            self.successors,
            anchors,
            noise,
            drafting.sampling.temperature,
        )
        return Proposal(tokens) if q is None else Proposal(tokens, candidates, q)
