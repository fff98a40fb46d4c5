"""runtime/kernels/qk.py: rotate_and_store's Triton kernel (interpreted) against its reference, for the three
ways families shape queries and keys: Qwen3 (per-head RMS norm, full rotary), Qwen3.5/3.6 (zero-centred norm,
rotary on a quarter of the head, q a strided view beside its output gate), Llama (no norm); the cache rows it
writes and the ones it must leave alone; batch invariance; and the reference rotation against transformers'."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from specpair.runtime.kernels import linear, qk

EPS = 1e-6
HQ, HKV, LAYERS, CONTEXT = 4, 2, 3, 12


def assert_within_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and not got.isnan().any(), "unwritten (NaN) elements"
    assert ((got.float() - want.float()).abs() <= 2.0**-7 * want.float().abs() + 1e-6).all()


def case(family: str, batch: int, tokens: int):
    torch.manual_seed(batch * 10 + tokens)
    d = 32
    rotary = {"qwen3": 32, "qwen3_5": 8, "llama": 32}[family]
    q_rows = HQ * d * (2 if family == "qwen3_5" else 1)
    fused = torch.randn(batch, tokens, q_rows + 2 * HKV * d).bfloat16()  # one q|k|v projection's output
    q, k, v = fused.split([q_rows, HKV * d, HKV * d], dim=-1)
    q = q.view(batch, tokens, HQ, -1)
    if family == "qwen3_5":
        q = q.chunk(2, dim=-1)[0]  # [query | gate] per head
    k, v = k.view(batch, tokens, HKV, d), v.view(batch, tokens, HKV, d)
    gains = (torch.randn(d).bfloat16(), torch.randn(d).bfloat16()) if family != "llama" else (None, None)
    positions = torch.stack([torch.randperm(CONTEXT)[:tokens] for _ in range(batch)])
    angles = positions[..., None].float() * (10000.0 ** (-torch.arange(0, rotary, 2) / rotary))
    angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]
    return q, k, v, gains, family == "qwen3_5", angles.cos(), angles.sin(), rotary, positions


def run(fn, q, k, v, gains, zero_centred, cos, sin, rotary, positions, slot=1):
    kv = torch.zeros(2, LAYERS, q.shape[0] + 1, CONTEXT, HKV, q.shape[-1]).bfloat16()  # a spare cache row
    out = fn(q, k, v, *gains, EPS, zero_centred, cos, sin, rotary, kv, slot, positions)
    return out, kv


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "llama"])
@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 5)])
def test_rotate_and_store(family: str, batch: int, tokens: int) -> None:
    args = case(family, batch, tokens)
    want, want_kv = run(qk.rotate_and_store_reference, *args)
    got, got_kv = run(qk.rotate_and_store_triton, *args)
    assert got.is_contiguous() and got.shape == want.shape
    assert_within_rounding(got, want)
    assert_within_rounding(got_kv, want_kv)
    assert torch.equal(got_kv[1], want_kv[1])  # v is copied, not computed
    positions = args[-1]
    written = torch.zeros(2, LAYERS, batch + 1, CONTEXT, dtype=torch.bool)
    for b in range(batch):
        written[:, 1, b, positions[b]] = True
    assert not got_kv[~written].any(), "a cache row outside the slot and the step's positions was written"
    for b, t in ((0, 0), (batch - 1, tokens - 1)):  # a token alone vs in its batch and block: the same bits
        q, k, v, gains, zc, cos, sin, rotary, pos = args
        one = [a[b : b + 1, t : t + 1].clone() for a in (q, k, v, cos, sin, pos)]
        alone, alone_kv = run(
            qk.rotate_and_store_triton, one[0], one[1], one[2], gains, zc, one[3], one[4], rotary, one[5]
        )
        assert torch.equal(alone[0, 0], got[b, t])
        assert torch.equal(alone_kv[:, 1, 0, pos[b, t]], got_kv[:, 1, b, pos[b, t]])


def test_reference_rotation_is_transformers() -> None:
    q, k, _, _, _, cos, sin, rotary, _ = case("qwen3", 2, 3)
    theirs_q, theirs_k = apply_rotary_pos_emb(
        q.float().transpose(1, 2), k.float().transpose(1, 2), cos[:, :, 0], sin[:, :, 0]
    )
    assert torch.equal(qk.rotate(q.float(), cos, sin, rotary), theirs_q.transpose(1, 2))
    assert torch.equal(qk.rotate(k.float(), cos, sin, rotary), theirs_k.transpose(1, 2))


def test_gains_both_or_neither() -> None:
    q, k, v, gains, zc, cos, sin, rotary, positions = case("qwen3", 1, 1)
    with pytest.raises(ValueError, match="do not fit"):
        run(qk.rotate_and_store_triton, q, k, v, (gains[0], None), zc, cos, sin, rotary, positions)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_rotate_and_store_adds_a_split_products_partials(family: str) -> None:
    """q|k|v as the split-K partials of one fused projection (linear.SplitSums), which the kernel adds first: the
    same bits, query and cache, as from the product summed by the matmul's own sum."""
    q, k, v, gains, zc, cos, sin, rotary, positions = case(family, 2, 3)
    batch, tokens, d = q.shape[0], q.shape[1], k.shape[-1]
    q_rows = HQ * d * (2 if family == "qwen3_5" else 1)
    torch.manual_seed(7)
    sums = linear.SplitSums(torch.randn(3, batch * tokens, q_rows + 2 * HKV * d), torch.bfloat16)
    summed = sums.summed().view(batch, tokens, -1)

    def heads(fused):  # as blocks.Attention cuts its projection: a Tensor or a SplitSums, the same calls
        q, k, v = fused.split([q_rows, HKV * d, HKV * d], dim=-1)
        q = q.view(batch, tokens, HQ, -1)
        if family == "qwen3_5":
            q = q.split([d, d], dim=-1)[0]
        return q, k.view(batch, tokens, HKV, d), v.view(batch, tokens, HKV, d)

    want, want_kv = run(qk.rotate_and_store_triton, *heads(summed), gains, zc, cos, sin, rotary, positions)
    got, got_kv = run(qk.rotate_and_store_triton, *heads(sums), gains, zc, cos, sin, rotary, positions)
    assert torch.equal(got, want) and torch.equal(got_kv, want_kv)
    mixed, mixed_kv = run(  # one partial among tensors: each operand read its own way
        qk.rotate_and_store_triton,
        heads(summed)[0],
        heads(sums)[1],
        heads(summed)[2],
        gains,
        zc,
        cos,
        sin,
        rotary,
        positions,
    )
    assert torch.equal(mixed, want) and torch.equal(mixed_kv, want_kv)


@pytest.mark.parametrize("fn", [qk.rotate_and_store_reference, qk.rotate_and_store_triton])
def test_context_rows_give_no_queries_and_negative_positions_store_nothing(fn) -> None:
    """DFlash's context beside its block in one call: the queries of the rows from context_rows on, the bits of
    the call that returns every row's; a row at a negative position (a context row the target rejected) leaves the
    cache as it was, the others written as before."""
    q, k, v, gains, zc, cos, sin, rotary, positions = case("qwen3", 2, 5)
    everything, everything_kv = run(fn, q, k, v, gains, zc, cos, sin, rotary, positions)
    masked = positions.clone()
    masked[0, 1] = masked[1, 0] = -1
    kv = torch.full((2, LAYERS, 3, CONTEXT, HKV, q.shape[-1]), 7.0).bfloat16()
    out = fn(q, k, v, *gains, EPS, zc, cos, sin, rotary, kv, 1, masked, context_rows=2)
    assert out.is_contiguous() and torch.equal(out, everything[:, 2:])
    for b in range(2):
        for t in range(5):
            at = (slice(None), 1, b, int(positions[b, t]))
            if masked[b, t] < 0:
                assert (kv[at] == 7.0).all(), (b, t)
            else:
                assert torch.equal(kv[at], everything_kv[at]), (b, t)
