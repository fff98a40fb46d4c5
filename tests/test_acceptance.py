"""The acceptance rules (runtime/acceptance.py) and keyed sampling (runtime/sampling.py) as pure functions.

The distribution tests draw 20k verify rounds over a vocabulary of 5 with fixed target distributions per row
and compare, position by position, the emitted token's frequencies with the target's (Pearson's chi-squared,
p > 0.01). The noise is keyed, so each test is deterministic: it either always passes or always fails.
"""

from __future__ import annotations

import pytest
import torch

from specpair.runtime import acceptance
from specpair.runtime.sampling import (
    TOKEN_STREAM,
    Sampling,
    greedy_choice,
    gumbel,
    keyed_choice,
    keyed_sample,
    uniform,
)

DRAWS = 20_000
VOCAB = 5
DRAFTS = 3
DRAFT_STREAM, ACCEPT_STREAM = 7, 8  # test-local streams, independent of the target's


def chi_squared_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-squared test of observed counts against expected probabilities (cells with p > 0)."""
    expected = probs * counts.sum()
    cells = expected > 0
    assert bool((counts[~cells] == 0).all()), "a token the target gives probability 0 was emitted"
    statistic = ((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum()
    dof = int(cells.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic.double() / 2))


def target_rows(seed: int) -> torch.Tensor:
    """k+1 fixed target distributions [k+1, V], one with a zero entry (top-k style)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(DRAFTS + 1, VOCAB, generator=g) * 1.5, dim=-1)
    p[1, 2] = 0
    return p / p.sum(dim=-1, keepdim=True)


def draft_rows(seed: int, kind: str, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [k, V] of one kind as sparse (ids [k, K], probs [k, K]); a one-hot draft is the target's argmax, as a
    greedy drafter that tracks the target drafts."""
    g = torch.Generator().manual_seed(seed)
    if kind == "one-hot":
        return p[:DRAFTS].argmax(dim=-1, keepdim=True), torch.ones(DRAFTS, 1)
    if kind == "candidates":  # DFlash2's selector: a distribution over 3 candidate ids
        ids = torch.stack([torch.randperm(VOCAB, generator=g)[:3] for _ in range(DRAFTS)])
        return ids, torch.softmax(torch.randn(DRAFTS, 3, generator=g), dim=-1)
    return torch.arange(VOCAB).expand(DRAFTS, VOCAB), torch.softmax(torch.randn(DRAFTS, VOCAB, generator=g), dim=-1)


def emitted(
    accepted: torch.Tensor, next_token: torch.Tensor, drafts: torch.Tensor, position: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token each round emits at drafted position `position` (1-based) among the rounds that reach it."""
    reached = accepted >= position - 1
    tokens = torch.where(accepted[reached] >= position, drafts[reached, min(position, DRAFTS) - 1], next_token[reached])
    return tokens, reached


@pytest.mark.parametrize("kind", ["one-hot", "candidates", "softmax"])
def test_rejection_emits_the_target_distribution(kind):
    p = target_rows(1)
    q_ids, q_probs = draft_rows(2, kind, p)
    rounds = torch.arange(DRAWS)
    q_dense = torch.zeros(DRAFTS, VOCAB).scatter_add(1, q_ids, q_probs)
    # drafts drawn from q with noise of their own, independent of the verifier's
    keys = rounds[:, None] * (DRAFTS + 1) + torch.arange(DRAFTS)
    drafts = keyed_sample(q_dense.expand(DRAWS, -1, -1), gumbel(5, DRAFT_STREAM, keys, VOCAB))
    accept_u = uniform(5, ACCEPT_STREAM, keys, torch.zeros(1, dtype=torch.int64))[..., 0]
    noise = gumbel(5, TOKEN_STREAM, rounds[:, None] * (DRAFTS + 1) + torch.arange(DRAFTS + 1), VOCAB)
    accepted, next_token = acceptance.rejection(
        p.expand(DRAWS, -1, -1), drafts, q_ids.expand(DRAWS, -1, -1), q_probs.expand(DRAWS, -1, -1), accept_u, noise
    )
    for position in range(1, DRAFTS + 2):
        tokens, reached = emitted(accepted, next_token, drafts, position)
        if position > 1:
            assert int(reached.sum()) > 1000, "too few rounds reach this position for a test"
        counts = torch.bincount(tokens, minlength=VOCAB).double()
        assert chi_squared_p(counts, p[position - 1].double()) > 0.01, (kind, position)
    # the first draft is kept with probability sum_x min(p, q)
    overlap = float(torch.minimum(p[0], q_dense[0]).sum())
    assert abs(float((accepted >= 1).double().mean()) - overlap) < 4 * (overlap * (1 - overlap) / DRAWS) ** 0.5 + 1e-9


def test_rejection_with_a_one_hot_draft_keeps_it_with_probability_p():
    """q one-hot at d: P(keep) = p(d), and after a rejection the token is p without d (never d itself)."""
    p = target_rows(3)
    d = torch.full((DRAWS, 1), int(p[0].argmin()))
    rounds = torch.arange(DRAWS)[:, None]
    accept_u = uniform(9, ACCEPT_STREAM, rounds, torch.zeros(1, dtype=torch.int64))[..., 0]
    noise = gumbel(9, TOKEN_STREAM, rounds * 2 + torch.arange(2), VOCAB)
    accepted, next_token = acceptance.rejection(
        p[:2].expand(DRAWS, -1, -1), d, d[..., None], torch.ones(DRAWS, 1, 1), accept_u, noise
    )
    rejected = accepted == 0
    assert not bool((next_token[rejected] == d[rejected, 0]).any())
    pd = float(p[0, d[0, 0]])
    assert abs(float((~rejected).double().mean()) - pd) < 4 * (pd * (1 - pd) / DRAWS) ** 0.5
    residual = p[0].clone()
    residual[d[0, 0]] = 0
    counts = torch.bincount(next_token[rejected], minlength=VOCAB).double()
    assert chi_squared_p(counts, (residual / residual.sum()).double()) > 0.01


def test_by_choice_keeps_leading_matches_then_the_targets_choice():
    choices = torch.tensor([[4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7]])
    drafts = torch.tensor([[1, 5, 6], [4, 1, 6], [4, 5, 6], [4, 5, 1]])
    accepted, next_token = acceptance.by_choice(drafts, choices)
    assert accepted.tolist() == [0, 1, 3, 2]  # none, one, all, two: a later match after a miss does not count
    assert next_token.tolist() == [4, 5, 7, 6]
    none = acceptance.by_choice(torch.zeros(2, 0, dtype=torch.int64), torch.tensor([[3], [8]]))
    assert none[0].tolist() == [0, 0] and none[1].tolist() == [3, 8]


@pytest.mark.parametrize("kind", ["one-hot", "softmax"])
def test_coupled_drafts_leave_the_targets_draws_unchanged(kind):
    """Keyed target samples as choices: the output is the target's own draw at every position whatever the
    drafts, so it has the target's distribution; drafts sampled from q with the same keyed noise are kept
    often, and a one-hot draft exactly with probability p(d)."""
    p = target_rows(4)
    sampling = Sampling(temperature=1.0, seed=11)
    rounds = torch.arange(DRAWS)
    positions = rounds[:, None] * (DRAFTS + 1) + torch.arange(DRAFTS + 1)
    logits = p.log().clamp(min=-1e4).expand(DRAWS, -1, -1)
    choices = sampling.choose(logits, positions)
    q_ids, q_probs = draft_rows(5, kind, p)
    q_dense = torch.zeros(DRAFTS, VOCAB).scatter_add(1, q_ids, q_probs)
    drafts = keyed_sample(q_dense.expand(DRAWS, -1, -1), gumbel(11, TOKEN_STREAM, positions[:, :DRAFTS], VOCAB))
    accepted, next_token = acceptance.by_choice(drafts, choices)
    for position in range(1, DRAFTS + 2):
        tokens, reached = emitted(accepted, next_token, drafts, position)
        assert torch.equal(tokens, choices[reached, position - 1])
        assert chi_squared_p(torch.bincount(tokens, minlength=VOCAB).double(), p[position - 1].double()) > 0.01
    kept = float((accepted >= 1).double().mean())
    overlap = float(torch.minimum(p[0], q_dense[0]).sum())
    if kind == "one-hot":
        assert abs(kept - overlap) < 4 * (overlap * (1 - overlap) / DRAWS) ** 0.5
    else:
        assert kept >= overlap / (2 - overlap) - 0.02


def test_keyed_draws_depend_on_seed_position_and_token_alone():
    sampling = Sampling(temperature=0.8, top_k=40, seed=3)
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([5, 9, 9, 100, 7, 4096])
    together = sampling.choose(logits, positions)
    alone = torch.stack([sampling.choose(logits[i : i + 1], positions[i : i + 1])[0] for i in range(6)])
    assert torch.equal(together, alone)
    assert torch.equal(sampling.choose(logits, positions), together)  # reproducible
    many, at = logits.repeat(10, 1), torch.arange(60)
    assert not torch.equal(Sampling(temperature=0.8, top_k=40, seed=4).choose(many, at), sampling.choose(many, at))
    assert not torch.equal(sampling.choose(many, at + 1), sampling.choose(many, at))
    u = uniform(0, 0, torch.arange(100_000), torch.zeros(1, dtype=torch.int64))[:, 0]
    assert 0 < float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.005


def test_the_top_hash_is_a_uniform_below_one_and_finite_noise():
    """Seed 0, position 2, token 4603156 hash to 0xffffff1b: 24 bits of it made (2^24 - 1/2) / 2^24, which float32
    rounds to 1.0, whose Gumbel noise is +inf (that token then won any draw it was allowed in)."""
    u = uniform(0, 0, torch.tensor([2]), torch.tensor([4603156]))
    assert float(u) == 1 - 2.0**-24
    assert torch.isfinite(gumbel(0, 0, torch.tensor([2]), 4603157)).all()


def murmur_uniform(seed: int, stream: int, position: int, token: int) -> float:
    """The keyed uniform as sampling.py's docstring states it, in Python integers: murmur3's 32-bit finalizer over the
    key, then xor the position, then xor the token id, the top 23 bits of the last as (k + 1/2) / 2^23."""

    def fmix32(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & 0xFFFFFFFF
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & 0xFFFFFFFF
        return x ^ (x >> 16)

    key = fmix32((seed ^ (seed >> 32) ^ (stream * 0x9E3779B9)) & 0xFFFFFFFF)
    h = fmix32(fmix32(key ^ (position & 0xFFFFFFFF)) ^ (token & 0xFFFFFFFF))
    return ((h >> 9) + 0.5) / (1 << 23)


def test_the_keyed_uniform_is_its_integer_hash():
    """uniform's bits are the hash's, as Python's integers compute it: positions against a row of ids and position-id
    pairs (keyed_choice's candidates), positions past 2^32, the largest seed and stream."""
    g = torch.Generator().manual_seed(3)
    positions = torch.cat((torch.randint(0, 1 << 20, (40,), generator=g), torch.tensor([(1 << 33) + 5, 0])))
    ids = torch.randint(0, 262_144, (50,), generator=g)
    for seed, stream in ((0, 0), (7, 3), ((1 << 63) - 1, 255)):
        got = uniform(seed, stream, positions, ids)
        want = [[murmur_uniform(seed, stream, int(p), int(t)) for t in ids] for p in positions]
        assert torch.equal(got, torch.tensor(want, dtype=torch.float32))
        pairs = uniform(seed, stream, positions, ids[: len(positions), None])[:, 0]
        assert pairs.tolist() == [murmur_uniform(seed, stream, int(p), int(t)) for p, t in zip(positions, ids)]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(0.8, seed=6), Sampling(1.0, 40, 0.95, seed=2)])
def test_choosing_rows_in_turn_is_choosing_them_all(sampling: Sampling):
    """by_choice_of on the CPU chooses a sequence's row only while its drafts so far were kept: the same accepted
    counts and next tokens as by_choice over every row's choice, for rounds that keep none, some and all drafts."""
    g = torch.Generator().manual_seed(11)
    batch, k, vocab = 12, 5, 300
    logits = (torch.randn(batch, k + 1, vocab, generator=g) * 3).bfloat16()
    positions = torch.randint(0, 1 << 16, (batch, 1), generator=g) + torch.arange(k + 1)
    choices = sampling.choose(logits, positions)
    keep = torch.rand(batch, k, generator=g) < torch.linspace(0, 1, batch)[:, None]  # row 0 keeps none, row 11 all
    drafts = torch.where(keep, choices[:, :k], (choices[:, :k] + 1) % vocab)
    accepted, following = acceptance.by_choice_of(drafts, logits, positions, sampling.choose)
    want_accepted, want_following = acceptance.by_choice(drafts, choices)
    assert torch.equal(accepted, want_accepted) and torch.equal(following, want_following)
    assert int(accepted.min()) == 0 and int(accepted.max()) == k


@pytest.mark.parametrize(
    "sampling",
    [Sampling(0.7, seed=1), Sampling(1.0, 40, 0.95, seed=2), Sampling(1.5, seed=3), Sampling(0.05, 5, seed=4)],
    ids=["t0.7", "topk-topp", "t1.5", "t0.05-topk5"],
)
def test_keyed_choice_is_the_draw_from_every_tokens_noise(sampling: Sampling):
    """On the CPU keyed_choice makes noise only for the tokens that can win; its token is the one keyed_sample draws
    with every token's noise: over bf16 logits (ties common), rows with one token left, and rows of other spreads."""
    generator = torch.Generator().manual_seed(5)
    logits = (torch.randn(64, 4096, generator=generator) * torch.linspace(0.5, 12, 64)[:, None]).bfloat16().float()
    logits[0, :] = 0.0  # every token tied
    logits[1, 7] = 1e4  # one token left after top-k / top-p, or all but one near zero
    positions = torch.randint(0, 1 << 20, (64,), generator=generator)
    probs = sampling.probabilities(logits)
    every = keyed_sample(probs, gumbel(sampling.seed, TOKEN_STREAM, positions, logits.shape[-1]))
    assert torch.equal(keyed_choice(probs, sampling.seed, TOKEN_STREAM, positions), every)
    assert torch.equal(sampling.choose(logits, positions), every)
    # [B, k] rows as the verify step has them
    assert torch.equal(
        keyed_choice(probs.reshape(8, 8, -1), sampling.seed, TOKEN_STREAM, positions.reshape(8, 8)), every.reshape(8, 8)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_greedy_choice_is_the_first_of_equal_largest_logits(dtype):
    """On the CPU the greedy token comes from max's indices, not argmax: the same token as argmax over rows of many
    ties (bf16 logits of few values), a row with a NaN, a transposed view, and the shapes of a verify
    step's [B, k, V] and of SmolLM2's vocabulary."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randint(-4, 5, (12, 5, 49_152), generator=generator).to(dtype)
    logits[0, 0, 17] = float("nan")  # argmax's rule: a NaN is the largest
    assert torch.equal(greedy_choice(logits), logits.argmax(dim=-1))
    assert greedy_choice(logits)[0, 0] == 17
    tied = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 3.0, 3.0, 3.0]], dtype=dtype)
    assert greedy_choice(tied).tolist() == [1, 0]
    strided = logits[1, :, :300].t().contiguous().t()
    assert torch.equal(greedy_choice(strided), strided.argmax(dim=-1))
    assert torch.equal(Sampling().choose(logits, torch.zeros(12, 5, dtype=torch.int64)), logits.argmax(dim=-1))
