"""runtime/kernels/attention.py: the reference and the Triton kernel (interpreted) against float64 masked
softmax attention, for causal verify rows, sliding windows, DFlash's bidirectional blocks and empty ranges,
with GQA; with one split of the cache and with several (the merge kernel), in one launch and in chunks of
query rows; the gated attention's output gate; both batch-invariant (a query alone, a sequence alone) and blind to what lies outside the ranges."""

from __future__ import annotations

import pytest
import torch

from specpair.runtime.kernels import activation, attention, linear

BATCH, TOKENS, Q_HEADS, KV_HEADS, CACHE = 3, 5, 4, 2, 300


def cache(head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(head_dim)
    return (
        torch.randn(BATCH, CACHE, KV_HEADS, head_dim).to(dtype),
        torch.randn(BATCH, CACHE, KV_HEADS, head_dim).to(dtype),
    )


def ranges(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] int32 kv_start, kv_end: each sequence at its own depth, one of them crossing a block of 64."""
    first = torch.tensor([3, 60, 250])[:, None]
    pos = first + torch.arange(TOKENS)[None, :]
    start = torch.zeros_like(pos)
    end = pos + 1
    if kind == "window":
        start = (pos + 1 - 16).clamp_min(0)
    elif kind == "block":  # every row of a drafted block sees the whole block
        end = torch.full_like(pos, 0) + (first + TOKENS)
    elif kind == "empty":
        start[:, 2] = end[:, 2]
    return start.int(), end.int()


def exact(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor, end: torch.Tensor, scale: float
) -> torch.Tensor:
    group = Q_HEADS // KV_HEADS
    keys = k.double().repeat_interleave(group, 2).transpose(1, 2)  # [B, Hq, S, D]
    values = v.double().repeat_interleave(group, 2).transpose(1, 2)
    scores = q.double().transpose(1, 2) @ keys.transpose(2, 3) * scale  # [B, Hq, T, S]
    p = torch.arange(CACHE)
    inside = (p[None, None, :] >= start[:, :, None]) & (p[None, None, :] < end[:, :, None])  # [B, T, S]
    scores = scores.masked_fill(~inside[:, None], float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # an empty range: zeros
    return (probs @ values).transpose(1, 2)


FUNCTIONS = {"triton": attention.attention_triton, "reference": attention.attention_reference}


@pytest.mark.parametrize("kind", ["causal", "window", "block", "empty"])
@pytest.mark.parametrize("split", [1024, 128], ids=["one-split", "three-splits"])
def test_attention(kind: str, split: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "SPLIT", split)
    head_dim = 32
    k, v = cache(head_dim, torch.float32)
    q = torch.randn(BATCH, TOKENS, Q_HEADS, head_dim)
    start, end = ranges(kind)
    scale = head_dim**-0.5
    want = exact(q, k, v, start, end, scale)
    for name, fn in FUNCTIONS.items():
        got = fn(q, k, v, start, end, scale)
        assert not got.isnan().any(), name
        assert ((got.double() - want).abs() <= 1e-5).all(), name
        # a query alone (decode) vs in its verify block and batch: every one for the reference, whose rows share
        # products where their spans are the same; three for the (interpreted) kernel
        picks = (
            [(b, t) for b in range(BATCH) for t in range(TOKENS)] if name == "reference" else [(0, 0), (2, 4), (1, 2)]
        )
        for b, t in picks:
            alone = fn(
                q[b : b + 1, t : t + 1].clone(),
                k[b : b + 1].clone(),
                v[b : b + 1].clone(),
                start[b : b + 1, t : t + 1].clone(),
                end[b : b + 1, t : t + 1].clone(),
                scale,
            )
            assert torch.equal(alone[0, 0], got[b, t]), name
        sequence = fn(q[1:2].clone(), k[1:2].clone(), v[1:2].clone(), start[1:2].clone(), end[1:2].clone(), scale)
        assert torch.equal(sequence[0], got[1]), name


@pytest.mark.parametrize("split", [1024, 128], ids=["one-split", "three-splits"])
def test_gated_output(split: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen3.5/3.6's output gate, applied as the output is stored (by the attention kernel with one split, by the
    merge with several): o · sigmoid(gate) as the reference rounds it (within one bf16 ulp: the interpreter's exp is
    numpy's), the gate read in place as each head's second half of q|gate or added from that projection's split-K
    partials (the bits of its summed product), a query alone as in its batch; the CPU path gates alike."""
    monkeypatch.setattr(attention, "SPLIT", split)
    head_dim, scale = 32, 0.2
    k, v = cache(head_dim, torch.bfloat16)
    start, end = ranges("causal")
    torch.manual_seed(split)
    sums = linear.SplitSums(torch.randn(2, BATCH * TOKENS, Q_HEADS * 2 * head_dim) * 3, torch.bfloat16)
    q, gate = sums.summed().view(BATCH, TOKENS, Q_HEADS, -1).split([head_dim, head_dim], dim=-1)
    got = attention.attention_triton(q, k, v, start, end, scale, gate)
    plain = attention.attention_triton(q, k, v, start, end, scale)
    want = activation.sigmoid_mul_reference(plain, gate)
    assert not got.isnan().any() and ((got.float() - want.float()).abs() <= 2.0**-7 * want.float().abs()).all()
    assert not torch.equal(got, plain)
    assert torch.equal(got, attention.attention_triton(q, k, v, start, end, scale, gate.contiguous()))
    partial_gate = sums.view(BATCH, TOKENS, Q_HEADS, -1).split([head_dim, head_dim], dim=-1)[1]
    assert torch.equal(got, attention.attention_triton(q, k, v, start, end, scale, partial_gate))
    for b, t in ((0, 0), (BATCH - 1, TOKENS - 1)):
        one = (slice(b, b + 1), slice(t, t + 1))
        alone = attention.attention_triton(
            q[one].clone(), k[one[0]], v[one[0]], start[one].clone(), end[one].clone(), scale, gate[one].clone()
        )
        assert torch.equal(alone[0, 0], got[b, t])
    cpu = attention.attention(q, k, v, start, end, scale, gate)
    assert torch.equal(
        cpu, activation.sigmoid_mul_reference(attention.attention_reference(q, k, v, start, end, scale), gate)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_head_dim_not_a_power_of_two(dtype: torch.dtype) -> None:
    head_dim = 24
    k, v = cache(head_dim, dtype)
    q = torch.randn(BATCH, TOKENS, Q_HEADS, head_dim).to(dtype)
    start, end = ranges("causal")
    want = exact(q, k, v, start, end, head_dim**-0.5)
    got = attention.attention_triton(q, k, v, start, end, head_dim**-0.5)
    assert got.dtype == dtype and not got.isnan().any()
    rounding = 2.0**-8 if dtype == torch.bfloat16 else 0.0
    # on the GPU the probabilities are rounded to the cache dtype before the product with V (the module's
    # docstring): each term p·v errs by up to one bf16 rounding of p, so the sum by 2^-8·Σ p|v|, beside the
    # output's own rounding (the interpreter keeps p in float32)
    spread = exact(q, k, v.abs(), start, end, head_dim**-0.5)
    assert ((got.double() - want).abs() <= 1e-5 + rounding * (want.abs() + spread)).all()


def test_cache_outside_the_ranges_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN before each sequence's smallest kv_start and from its largest kv_end on (the kernel), or outside the
    spans of SPAN positions those fall in (the reference, whose products read whole spans): the same bits."""
    monkeypatch.setattr(attention, "SPLIT", 128)
    k, v = cache(32, torch.float32)
    q = torch.randn(BATCH, TOKENS, Q_HEADS, 32)
    start, end = ranges("window")
    span = attention.SPAN
    for name, fn in FUNCTIONS.items():
        clean = fn(q, k, v, start, end, 0.2)
        poisoned_k, poisoned_v = k.clone(), v.clone()
        for b in range(BATCH):
            low, high = int(start[b].min()), int(end[b].max())
            if name == "reference":
                low, high = low // span * span, -(-high // span) * span
            for c in (poisoned_k, poisoned_v):
                c[b, :low] = float("nan")
                c[b, high:] = float("nan")
        assert torch.equal(fn(q, poisoned_k, poisoned_v, start, end, 0.2), clean), name


def test_a_span_past_the_caches_end_gives_the_bits_of_a_longer_cache() -> None:
    """The reference reads a row's whole span: where it passes the cache's end (a run whose cache is only as long as
    it needs) it reads a zero-padded copy, and a row has the bits it has in a longer cache (a drafted run's, longer
    by a block) whose span lies inside."""
    k, v = cache(32, torch.float32)
    q = torch.randn(BATCH, TOKENS, Q_HEADS, 32)
    start, end = ranges("causal")
    short = 70  # sequence 1's rows end at 61..65: spans [0, 64) and [64, 128), the second past 70
    k[:, short:], v[:, short:] = 0.0, 0.0  # as the runtime's cache holds past what was committed
    inside = attention.attention_reference(q[:2], k[:2], v[:2], start[:2], end[:2], 0.2)
    past = attention.attention_reference(q[:2], k[:2, :short].clone(), v[:2, :short].clone(), start[:2], end[:2], 0.2)
    assert torch.equal(past, inside)


def test_query_rows_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scratch budget of one token per launch: launches of one token each give the bits of one launch."""
    monkeypatch.setattr(attention, "SPLIT", 128)
    k, v = cache(32, torch.float32)
    q = torch.randn(BATCH, TOKENS, Q_HEADS, 32)
    start, end = ranges("causal")
    whole = attention.attention_triton(q, k, v, start, end, 0.2)
    monkeypatch.setattr(attention, "SCRATCH_BYTES", 1)
    assert torch.equal(attention.attention_triton(q, k, v, start, end, 0.2), whole)


def test_the_reference_plans_each_ranges_once_and_only_for_those_ranges() -> None:
    """The reference's tiles and masks are worked out once per ranges' values: a second call on the same ranges
    reuses them (what every layer of a step does), while the same ranges in another role's tiles and other values
    (ranges written in place too) get plans of their own: each result is what a plan made afresh gives."""
    from specpair.runtime.kernels.cpu_rows import prompt_tiles

    k, v = cache(32, torch.float32)
    q = torch.randn(BATCH, TOKENS, Q_HEADS, 32)
    start, end = ranges("causal")
    first = attention.attention_reference(q, k, v, start, end, 0.2)
    plan = attention._span_tiles(start, end, attention.tile_rows(), q.dtype)
    assert attention._span_tiles(start, end, attention.tile_rows(), q.dtype) is plan
    assert torch.equal(attention.attention_reference(q, k, v, start, end, 0.2), first)
    with prompt_tiles():
        assert attention._span_tiles(start, end, attention.tile_rows(), q.dtype) is not plan
        assert torch.equal(attention.attention_reference(q, k, v, start, end, 0.2), planned_afresh(q, k, v, start, end))
    window_start, window_end = ranges("window")
    start.copy_(window_start)  # the same tensors, written in place
    end.copy_(window_end)
    windowed = attention.attention_reference(q, k, v, start, end, 0.2)
    assert torch.equal(windowed, planned_afresh(q, k, v, window_start, window_end)) and not torch.equal(windowed, first)


def planned_afresh(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor, end: torch.Tensor
) -> torch.Tensor:
    """The reference with no plan kept from earlier calls."""
    attention._plan_span_tiles.cache_clear()
    return attention.attention_reference(q, k, v, start, end, 0.2)
