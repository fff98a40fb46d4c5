"""runtime/kernels/gdn.py: the reference equals transformers' torch_recurrent_gated_delta_rule bit for bit; the
Triton kernel (interpreted) agrees within float32 rounding; both give the same bits token by token as in one
call of T tokens, for a sequence alone as in a batch, and the per-token states are those of shorter runs."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

from specpair.runtime.kernels import gdn

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
