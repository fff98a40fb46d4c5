"""Speed: what a verify step of a MoE target reads beside a decode step (metadata only; `specpair bench` measures)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from specpair.checkpoint.config import experts_touched
from specpair.compat.memory import estimate
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, ALL_STACKS, Values, rule

SMALL_BLOCK = 4  # the block the finding also prices, where the pair's is larger
NOTABLE_RATIO = 1.5  # verify over decode bytes below which there is nothing to say


def step_reads(p: Pair) -> Callable[[int], tuple[float, float]]:
    """What a step of `tokens` tokens reads, expected under uniform routing: (experts a layer, weight bytes). A step
    reads the dense weights whole but the embedding (a row a token, unless tied to the head), and the share of
    experts its tokens touch."""
    s = p.target.shapes
    e = estimate(p.target, p.draft, p.kind_row.head_group, p.context, p.deployment.concurrency)
    embedding = 0 if s.tie_word_embeddings else p.target.bytes_of("embedding")
    dense = e.target_weights - e.experts - embedding

    def read(tokens: int) -> tuple[float, float]:
        share = experts_touched(s.num_experts, s.experts_per_token, tokens)
        return share * s.num_experts, dense + share * e.experts

    return read


@rule(
    "speed.moe_verify",
    "info",
    ALL_STACKS,
    ALL_KINDS,
    title="What a verify step of a MoE target reads beside a decode step, and the τ a round needs to gain.",
    message="{target} routes each token to {per_token} of {experts} experts: a verify step of {block} tokens a sequence ({users} sequence(s)) reads about {verify_experts} experts a layer against {decode_experts} at decode, {ratio}x a decode step's weight bytes (uniform routing). Where steps are bound by memory bandwidth, a round is faster than decoding only if it keeps more than about {ratio} tokens (sglang#29244: DFlash slowed Qwen3-30B-A3B from 146 to 93 tok/s at τ 2.0){smaller}; `specpair bench` measures it.",
    example={
        "per_token": 8,
        "experts": 128,
        "block": 16,
        "users": 1,
        "verify_experts": 82,
        "decode_experts": 8,
        "ratio": 6.2,
        "smaller": "; a block of 4 reads 2.6x",
    },
)
def _moe_verify(p: Pair, stack: str) -> Iterable[Values]:
    s = p.target.shapes
    if not (s.num_experts and s.experts_per_token and p.target.bytes_of("experts")) or p.block_size < 2:
        return
    read, users = step_reads(p), p.deployment.concurrency
    (decode_experts, decode_bytes), (verify_experts, verify_bytes) = read(users), read(users * p.block_size)
    ratio = verify_bytes / decode_bytes
    if ratio < NOTABLE_RATIO:
        return
    smaller = ""
    if p.block_size > SMALL_BLOCK:
        smaller = f"; a block of {SMALL_BLOCK} reads {read(users * SMALL_BLOCK)[1] / decode_bytes:.1f}x"
    yield {
        "per_token": s.experts_per_token,
        "experts": s.num_experts,
        "block": p.block_size,
        "users": users,
        "verify_experts": round(verify_experts),
        "decode_experts": round(decode_experts),
        "ratio": round(ratio, 1),
        "smaller": smaller,
    }
