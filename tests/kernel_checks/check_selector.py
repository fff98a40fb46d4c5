"""runtime/kernels/selector.py: DFlash2's candidates (the top-k over the vocabulary) and its walk, interpreted or
compiled in the GPU tier, against the references: torch.topk's values, and for each tie the lowest id; the walk's
loop in torch ops. The walk kernel sums over the rank in another order than torch, so its scores may differ in the
last bit: on random operands no two candidates' scores come that close, so the tokens are the same and the sampled
walk's q agrees to float32 rounding. The reference itself is checked against scores computed in float64."""

from __future__ import annotations

import pytest
import torch

from specpair.runtime.kernels import selector
from specpair.runtime.sampling import gumbel_of


def operands(batch: int, steps: int, top_k: int, rank: int, vocab: int = 300, seed: int = 0) -> tuple:
    """(unary [B, k, K] descending, candidates [B, k, K] distinct ids a row, hidden [B, k, R], predecessors,
    successors [V, R], anchors [B]), float32 as the selector has them."""
    torch.manual_seed(seed)
    unary = torch.randn(batch, steps, top_k).sort(dim=-1, descending=True).values * 2
    candidates = torch.stack([torch.randperm(vocab)[:top_k] for _ in range(batch * steps)]).view(batch, steps, top_k)
    hidden = torch.randn(batch, steps, rank)
    predecessors, successors = torch.randn(vocab, rank) / rank**0.25, torch.randn(vocab, rank) / rank**0.25
    anchors = torch.randint(0, vocab, (batch,))
    return unary, candidates, hidden, predecessors, successors, anchors


SHAPES = [(1, 7, 16, 256), (3, 5, 16, 64), (2, 3, 5, 48), (4, 1, 16, 32)]


@pytest.mark.parametrize("batch, steps, top_k, rank", SHAPES)
def test_greedy_walk_matches_reference(batch: int, steps: int, top_k: int, rank: int) -> None:
    """The published shape (K 16, rank 256, 7 drafts), and K and rank that are no power of two (masked lanes)."""
    ops = operands(batch, steps, top_k, rank)
    tokens, q = selector.selector_walk_triton(*ops, None, 1.0)
    want, want_q = selector.selector_walk_reference(*ops, None, 1.0)
    assert q is None and want_q is None
    assert tokens.dtype == torch.int64 and torch.equal(tokens, want)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
@pytest.mark.parametrize("batch, steps, top_k, rank", SHAPES[:3])
def test_sampled_walk_matches_reference(batch: int, steps: int, top_k: int, rank: int, temperature: float) -> None:
    """A keyed draw among each row's candidates (the noise the runtime gives: sampling.gumbel_of at the tokens'
    positions), with its distribution q."""
    ops = operands(batch, steps, top_k, rank, seed=1)
    positions = torch.arange(steps)[None, :] + torch.tensor([10, 200, 37, 5][:batch])[:, None]
    noise = gumbel_of(7, 0, positions, ops[1])
    tokens, q = selector.selector_walk_triton(*ops, noise, temperature)
    want, want_q = selector.selector_walk_reference(*ops, noise, temperature)
    assert torch.equal(tokens, want)
    torch.testing.assert_close(q, want_q, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q.sum(dim=-1), torch.ones(batch, steps))
    chosen = ops[1] == tokens[..., None]  # each token is one of its row's candidates, one q allows
    assert torch.equal(chosen.sum(dim=-1), torch.ones(batch, steps, dtype=torch.int64)) and (q[chosen] > 0).all()


def test_reference_takes_the_best_candidate_in_float64() -> None:
    """Each row's token is the candidate with the best score computed in float64 from the token chosen before."""
    unary, candidates, hidden, predecessors, successors, anchors = operands(3, 6, 16, 64, seed=2)
    tokens, _ = selector.selector_walk_reference(
        unary, candidates, hidden, predecessors, successors, anchors, None, 1.0
    )
    previous = anchors
    for j in range(unary.shape[1]):
        scores = unary[:, j].double() + torch.einsum(
            "br,bkr->bk", predecessors[previous].double() * hidden[:, j].double(), successors[candidates[:, j]].double()
        )
        best = candidates[:, j].gather(1, scores.argmax(dim=-1, keepdim=True))[:, 0]
        assert torch.equal(tokens[:, j], best)
        previous = best


def test_a_sequence_alone_as_in_a_batch() -> None:
    """One program per sequence: a sequence drafts the same tokens (and q) alone as beside others."""
    ops = operands(4, 7, 16, 64, seed=3)
    positions = torch.arange(7)[None, :] + torch.tensor([3, 9, 27, 81])[:, None]
    noise = gumbel_of(1, 0, positions, ops[1])
    tokens, q = selector.selector_walk_triton(*ops, noise, 0.9)
    for b in (0, 2):
        unary, candidates, hidden, predecessors, successors, anchors = ops
        alone = [t[b : b + 1].clone() for t in (unary, candidates, hidden)]
        one, one_q = selector.selector_walk_triton(
            *alone, predecessors, successors, anchors[b : b + 1].clone(), noise[b : b + 1].clone(), 0.9
        )
        assert torch.equal(one[0], tokens[b]) and torch.equal(one_q[0], q[b])


def sorted_top(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row, a larger value first and between equal values the lower id: the order the kernel
    promises (torch.topk leaves ties open)."""
    order = sorted(range(logits.shape[-1]), key=lambda i: (-logits[i].item(), i))[:k]
    return logits[order].float(), torch.tensor(order)


@pytest.mark.parametrize(
    "rows, vocab, k",
    [(3, 5000, 16), (2, 2048, 16), (4, 4100, 5), (1, 20, 16)],  # a last chunk part-full, of fewer than k; one chunk
)
def test_top_candidates_match_torch_topk(rows: int, vocab: int, k: int) -> None:
    """bf16 logits, as the drafter's head gives them: many values repeat, so ties between chunks and inside one
    occur. The values are torch.topk's, in its order; the ids are the lowest for each tie."""
    torch.manual_seed(vocab)
    logits = (torch.randn(rows, vocab) * 2).bfloat16()
    logits[0, 7] = logits[0, vocab - 3] = logits[0].max() + 1  # a tie for first place, in two chunks
    values, ids = selector.top_candidates_triton(logits, k)
    want_values, _ = selector.top_candidates_reference(logits, k)
    assert values.dtype == torch.float32 and ids.dtype == torch.int64 and torch.equal(values, want_values)
    for r in range(rows):
        assert torch.equal(ids[r], sorted_top(logits[r], k)[1])
    assert ids[0, 0].item() == 7 and ids[0, 1].item() == vocab - 3


def test_top_candidates_among_chunks_of_equal_maxima() -> None:
    """More chunks than k share the largest maximum: the k lowest ids of it win (the chunks of lower ids are
    ranked first); and a row whose k largest lie in one chunk takes them all from there."""
    chunk = selector.CHUNK
    logits = torch.rand(2, 20 * chunk + 100) - 1
    logits[0, torch.arange(3, 21) * chunk + 1000 - (torch.arange(3, 21) == 20).long() * 1000] = 5.0
    logits[1, 7 * chunk + torch.tensor([9, 3, 2047, 600])] = torch.tensor([9.0, 8.0, 7.0, 6.0])
    values, ids = selector.top_candidates_triton(logits, 4)
    assert ids[0].tolist() == [c * chunk + 1000 for c in (3, 4, 5, 6)] and values[0].tolist() == [5.0] * 4
    assert ids[1].tolist() == [7 * chunk + i for i in (9, 3, 2047, 600)]
    for r in range(2):
        assert torch.equal(ids[r], sorted_top(logits[r], 4)[1])


def test_top_candidates_with_minus_infinity() -> None:
    """Logits of -inf (a vocabulary's unused rows, masked) are picked only after every finite one, by id."""
    logits = torch.full((2, 3000), float("-inf"))
    logits[0, [5, 2500, 40]] = torch.tensor([1.0, 3.0, 2.0])
    logits[1, 2999] = 0.5
    values, ids = selector.top_candidates_triton(logits, 4)
    assert ids.tolist() == [[2500, 40, 5, 0], [2999, 0, 1, 2]]
    assert values[0, :3].tolist() == [3.0, 2.0, 1.0] and values[1, 0].item() == 0.5
    assert torch.isinf(values[0, 3]) and torch.isinf(values[1, 1:]).all()
