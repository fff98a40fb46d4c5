"""runtime/kernels/gdn.py: the reference equals transformers' torch_recurrent_gated_delta_rule bit for bit; the
Triton kernel (interpreted) agrees within float32 rounding; both give the same bits token by token as in one
call of T tokens, for a sequence alone as in a batch, the per-token states are those of shorter runs, and a step
that does not write its state (a verify step's) leaves it as it was."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

from specpair.runtime.kernels import gdn, linear

SHAPES = [  # B, T, Hk, Hv, dk, dv: grouped value heads, dv past a multiple of BLOCK_V, dk not a power of 2
    (3, 6, 2, 4, 32, 48),
    (1, 1, 1, 1, 24, 16),
]


def inputs(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    batch, tokens, key_heads, value_heads, key_dim, value_dim = shape
    torch.manual_seed(sum(shape))
    return {
        "q": torch.randn(batch, tokens, key_heads, key_dim).to(dtype),
        "k": torch.randn(batch, tokens, key_heads, key_dim).to(dtype),
        "v": torch.randn(batch, tokens, value_heads, value_dim).to(dtype),
        "g": -torch.rand(batch, tokens, value_heads) * 2,
        "beta": torch.rand(batch, tokens, value_heads).to(dtype),
        "state": torch.randn(batch, value_heads, key_dim, value_dim),
    }


def run(fn, t: dict[str, torch.Tensor], steps: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    state = t["state"].clone()
    batch, tokens, value_heads, value_dim = t["v"].shape
    step_states = torch.full((batch, tokens, value_heads, t["k"].shape[-1], value_dim), float("nan")) if steps else None
    out = fn(t["q"], t["k"], t["v"], t["g"], t["beta"], state, step_states)
    return out, state, step_states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_is_transformers(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    t = inputs(shape, dtype)
    out, state, _ = run(gdn.gdn_recurrent_reference, t, steps=False)
    want, want_state = torch_recurrent_gated_delta_rule(
        t["q"],
        t["k"],
        t["v"],
        t["g"],
        t["beta"],
        initial_state=t["state"].clone(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert out.dtype == dtype
    assert torch.equal(out, want) and torch.equal(state, want_state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_against_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    t = inputs(shape, dtype)
    out, state, steps = run(gdn.gdn_recurrent_triton, t)
    want, want_state, want_steps = run(gdn.gdn_recurrent_reference, t)
    assert out.dtype == dtype and not out.isnan().any() and not steps.isnan().any()
    rounding = 2.0**-8 if dtype == torch.bfloat16 else 0.0
    assert ((out.float() - want.float()).abs() <= 1e-5 + rounding * want.float().abs()).all()
    assert ((state - want_state).abs() <= 1e-5).all()
    assert ((steps - want_steps).abs() <= 1e-5).all()
    assert torch.equal(steps[:, -1], state)


@pytest.mark.parametrize("fn", [gdn.gdn_recurrent_triton, gdn.gdn_recurrent_reference], ids=["triton", "reference"])
def test_batch_invariance(fn) -> None:
    t = inputs(SHAPES[0])
    out, state, steps = run(fn, t)
    batch, tokens = t["v"].shape[:2]
    # token by token (decode) from the same start: the same outputs, states, and per-token states
    decoded = {"state": t["state"].clone()}
    for i in range(tokens):
        one = {k: v[:, i : i + 1] for k, v in t.items() if k != "state"} | {"state": decoded["state"]}
        o, decoded["state"], s = run(fn, one)
        assert torch.equal(o[:, 0], out[:, i])
        assert torch.equal(s[:, 0], steps[:, i])
    assert torch.equal(decoded["state"], state)
    # one sequence alone vs in the batch
    for b in (0, batch - 1):
        alone = {k: v[b : b + 1].clone() for k, v in t.items()}
        o, s, st = run(fn, alone)
        assert torch.equal(o[0], out[b]) and torch.equal(s[0], state[b]) and torch.equal(st[0], steps[b])


@pytest.mark.parametrize("fn", [gdn.gdn_recurrent_triton, gdn.gdn_recurrent_reference], ids=["triton", "reference"])
def test_step_states_are_the_states_of_shorter_runs(fn) -> None:
    """A verify of T tokens rolled back to a prefix of p tokens: step_states[:, p - 1] is the state a run of
    those p tokens ends with."""
    t = inputs(SHAPES[0])
    _, _, steps = run(fn, t)
    for prefix in (1, 4):
        _, state, _ = run(fn, {k: v[:, :prefix] if k != "state" else v for k, v in t.items()}, steps=False)
        assert torch.equal(steps[:, prefix - 1], state)


@pytest.mark.parametrize("fn", [gdn.gdn_recurrent_triton, gdn.gdn_recurrent_reference], ids=["triton", "reference"])
def test_lengths_run_each_sequence_through_its_own_prefix(fn) -> None:
    """A rollback's replay in one call: sequence b through its first lengths[b] tokens (0, all, and counts out of
    range clamped) ends in the state, with the outputs, of a run of that prefix alone."""
    t = inputs(SHAPES[0])
    batch, tokens = t["v"].shape[:2]
    lengths = torch.tensor([0, 4, tokens + 3])[:batch]
    state = t["state"].clone()
    out = fn(t["q"], t["k"], t["v"], t["g"], t["beta"], state, None, lengths)
    for b, n in enumerate([0, 4, tokens]):
        alone = {k: v[b : b + 1, :n].clone() if k != "state" else v[b : b + 1] for k, v in t.items()}
        o, s, _ = run(fn, alone, steps=False)
        assert torch.equal(state[b], s[0]) and torch.equal(out[b, :n], o[0])


@pytest.mark.parametrize("fn", [gdn.gdn_recurrent_triton, gdn.gdn_recurrent_reference], ids=["triton", "reference"])
def test_a_step_that_does_not_write_the_state_leaves_it_and_gives_the_same_outputs(fn) -> None:
    """A verify step's recurrence (write_state=False): the outputs and per-token states of a step that writes its
    state, and the state bitwise as it was, for the commit's replay to start from."""
    t = inputs(SHAPES[0])
    out, state, steps = run(fn, t)
    kept = t["state"].clone()
    unwritten_steps = torch.full_like(steps, float("nan"))
    unwritten = fn(t["q"], t["k"], t["v"], t["g"], t["beta"], kept, unwritten_steps, write_state=False)
    assert torch.equal(kept, t["state"]) and not torch.equal(state, t["state"])
    assert torch.equal(unwritten, out) and torch.equal(unwritten_steps, steps)


def conv_inputs(batch: int, tokens: int, channels: int = 300, taps: int = 4):
    """A fused projection's output [B, T, C + 40] whose first C columns are qkv; window [B, K-1, C]."""
    torch.manual_seed(batch * 100 + tokens)
    fused = torch.randn(batch, tokens, channels + 40).bfloat16()
    window = torch.randn(batch, taps - 1, channels).bfloat16()
    return window, fused[..., :channels], torch.randn(channels, taps) * 0.5


SIZES = (96, 96, 108)  # q, k, v channels: boundaries inside a program's block of channels


@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 5), (1, 2)])
@pytest.mark.parametrize("keep", [False, True])
def test_conv_silu(batch: int, tokens: int, keep: bool) -> None:
    window, qkv, weight = conv_inputs(batch, tokens)
    ref_window, got_window = window.clone(), window.clone()
    want = gdn.conv_silu_reference(ref_window, qkv, weight, SIZES, keep)
    got = gdn.conv_silu_triton(got_window, qkv, weight, SIZES, keep)
    for w, g in zip(want[:3], got[:3]):
        assert g.is_contiguous() and g.shape == w.shape and not g.isnan().any(), "unwritten (NaN) elements"
        # the same float32 sums in the same order; the interpreter's exp (numpy's) may move the SiLU by an ulp
        assert ((g.float() - w.float()).abs() <= 2.0**-7 * w.float().abs() + 1e-6).all()
    assert torch.equal(got_window, ref_window)  # the window moved on by the step's columns, exactly
    assert torch.equal(got_window, torch.cat((window, qkv), dim=1)[:, tokens:])
    if keep:
        assert torch.equal(got[3], want[3]) and torch.equal(got[3], torch.cat((window, qkv), dim=1))
    else:
        assert got[3] is None and want[3] is None


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("keep", [False, True])
def test_conv_silu_adds_the_qkv_products_split_sums(splits: int, keep: bool) -> None:
    """qkv as its product's float32 partials (columns of the GDN's fused input projection, SplitSums [splits, B·T,
    ...]): q, k, v, the window and the kept columns are the bits of summing them first (the matmul's sum kernel);
    partials of other rows are refused."""
    torch.manual_seed(splits)
    batch, tokens = 2, 3
    window, _, weight = conv_inputs(batch, tokens)
    channels = sum(SIZES)
    sums = linear.SplitSums(torch.randn(splits, batch * tokens, channels + 40) * 2, torch.bfloat16)
    qkv = sums.columns(0, channels)
    summed = sums.summed()[:, :channels].reshape(batch, tokens, channels)
    want_window, got_window = window.clone(), window.clone()
    want = gdn.conv_silu_triton(want_window, summed, weight, SIZES, keep)
    got = gdn.conv_silu(got_window, qkv, weight, SIZES, keep)
    for w, g in zip(want, got):
        assert (g is None and w is None) or torch.equal(g, w)
    assert torch.equal(got_window, want_window)
    with pytest.raises(ValueError, match="do not fit"):
        gdn.conv_silu_triton(torch.cat((window, window)), qkv, weight, SIZES, keep)  # 6 rows for 4 sequences


@pytest.mark.parametrize("fn", [gdn.conv_silu_reference, gdn.conv_silu_triton])
def test_conv_silu_token_by_token_is_one_call(fn) -> None:
    """A verify step of T tokens gives the bits of T decode steps (the window carries the state between them),
    and a sequence alone gives the bits it has in a batch."""
    window, qkv, weight = conv_inputs(2, 5)
    together_window = window.clone()
    together = fn(together_window, qkv, weight, SIZES, False)
    one_window = window[1:].clone()
    steps = [fn(one_window, qkv[1:, t : t + 1], weight, SIZES, False) for t in range(5)]
    for part in range(3):
        assert torch.equal(torch.cat([s[part] for s in steps], dim=1), together[part][1:])
    assert torch.equal(one_window, together_window[1:])


@pytest.mark.parametrize("batch,tokens,heads", [(1, 1, 32), (3, 4, 5)])
def test_gates(batch: int, tokens: int, heads: int) -> None:
    torch.manual_seed(heads)
    fused = torch.randn(batch, tokens, 2 * heads + 7).bfloat16() * 8  # [.. | b | a] of a fused projection
    b, a = fused[..., 7 : 7 + heads], fused[..., 7 + heads :]
    a_log, dt_bias = torch.rand(heads).mul(15).add(1).log(), torch.randn(heads)
    a[0, 0, 0] = 30  # softplus past its threshold: x itself
    want_g, want_beta = gdn.gates_reference(a, b, a_log, dt_bias)
    got_g, got_beta = gdn.gates_triton(a, b, a_log, dt_bias)
    for got, want in ((got_g, want_g), (got_beta, want_beta)):
        assert got.dtype == torch.float32 and got.shape == (batch, tokens, heads) and not got.isnan().any()
        assert ((got - want).abs() <= 2.0**-20 * want.abs() + 1e-7).all()
    assert torch.equal(
        gdn.gates_triton(a[-1:, -1:].clone(), b[-1:, -1:].clone(), a_log, dt_bias)[0][0, 0], got_g[-1, -1]
    )


@pytest.mark.parametrize("splits", [2, 8])
def test_gates_add_the_b_a_products_split_sums(splits: int) -> None:
    """The b|a product's float32 partials, as column views of one SplitSums: g and beta are those of summing them
    first (the matmul's sum kernel) and reading the bf16 sums; a token alone as among others; a and b given as
    one tensor and one partials, or partials of products of other rows, are refused."""
    torch.manual_seed(splits)
    tokens, heads = 5, 32
    partial = torch.randn(splits, tokens, 7 + 2 * heads) * 3  # [.. | b | a], as the GDN's fused input projection
    sums = linear.SplitSums(partial, torch.bfloat16)
    summed = sums.summed()
    b, a = sums.columns(7, 7 + heads), sums.columns(7 + heads, 7 + 2 * heads)
    a_log, dt_bias = torch.rand(heads).mul(15).add(1).log(), torch.randn(heads)
    want_g, want_beta = gdn.gates_triton(summed[:, 7 + heads :], summed[:, 7 : 7 + heads], a_log, dt_bias)
    got_g, got_beta = gdn.gates(a, b, a_log, dt_bias)
    assert got_g.shape == (tokens, heads) and torch.equal(got_g, want_g) and torch.equal(got_beta, want_beta)
    alone = linear.SplitSums(partial[:, 3:4].clone(), torch.bfloat16)
    g, beta = gdn.gates_triton(alone.columns(7 + heads, 7 + 2 * heads), alone.columns(7, 7 + heads), a_log, dt_bias)
    assert torch.equal(g[0], got_g[3]) and torch.equal(beta[0], got_beta[3])
    with pytest.raises(ValueError, match="both"):
        gdn.gates_triton(a, summed[:, 7 : 7 + heads], a_log, dt_bias)
    with pytest.raises(ValueError, match="both"):  # partials of products of other rows
        gdn.gates_triton(a, alone.columns(7, 7 + heads), a_log, dt_bias)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("keep", [False, True])
def test_conv_and_gates_share_a_launch(split: bool, keep: bool) -> None:
    """conv_silu_gates: the conv's programs and the gates' in one launch give each part's bits alone (q, k, v, the
    window and the kept columns; g and beta), from the GDN input's products as tensors or as split partials; on
    the CPU, the two references."""
    torch.manual_seed(30 + split + 2 * keep)
    batch, tokens, heads = 2, 3, 5
    window, _, weight = conv_inputs(batch, tokens)
    channels = sum(SIZES)
    fused = torch.randn(2, batch * tokens, channels + 2 * heads) * 2  # [q|k|v | b | a], split in two
    sums = linear.SplitSums(fused, torch.bfloat16)
    if split:
        qkv, b, a = (
            sums.columns(0, channels),
            sums.columns(channels, channels + heads),
            sums.columns(channels + heads, channels + 2 * heads),
        )
    else:
        summed = sums.summed().reshape(batch, tokens, -1)
        qkv, b, a = summed[..., :channels], summed[..., channels : channels + heads], summed[..., channels + heads :]
    a_log, dt_bias = torch.rand(heads).mul(15).add(1).log(), torch.randn(heads)
    alone_window, together_window = window.clone(), window.clone()
    alone = (*gdn.conv_silu_triton(alone_window, qkv, weight, SIZES, keep), *gdn.gates_triton(a, b, a_log, dt_bias))
    together = gdn.conv_silu_gates_triton(together_window, qkv, weight, SIZES, keep, a, b, a_log, dt_bias)
    assert len(together) == 6 and torch.equal(together_window, alone_window)
    for x, y in zip(together, alone):
        assert (x is None and y is None) or torch.equal(x, y)
    dispatched = gdn.conv_silu_gates(window.clone(), qkv, weight, SIZES, keep, a, b, a_log, dt_bias)
    if split:  # partials go to the kernel wherever the tensors are
        for x, y in zip(dispatched, together):
            assert (x is None and y is None) or torch.equal(x, y)
    else:
        reference = dispatched
        want = (
            *gdn.conv_silu_reference(window.clone(), qkv, weight, SIZES, keep),
            *gdn.gates_reference(a, b, a_log, dt_bias),
        )
        for x, y in zip(reference, want):
            assert (x is None and y is None) or torch.equal(x, y)
