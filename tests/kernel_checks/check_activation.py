"""runtime/kernels/activation.py: silu_mul's Triton kernel (interpreted) against its reference (the runtime's tests
hold it to transformers' models); views of one fused gate|up output; split partials; batch invariance. The
attention's output gate (sigmoid_gated) is checked where the attention kernels apply it (check_attention.py)."""

from __future__ import annotations

import pytest
import torch

from specpair.runtime.kernels import activation, linear


def assert_within_one_ulp(got: torch.Tensor, want: torch.Tensor) -> None:
    """The interpreter's exp is numpy's, torch's is its own: the silu may differ in its last bit before the
    rounding to bf16, so the result by one bf16 ulp at most."""
    assert got.dtype == want.dtype and not got.isnan().any(), "unwritten (NaN) elements"
    assert ((got.float() - want.float()).abs() <= 2.0**-7 * want.float().abs() + 1e-30).all()


@pytest.mark.parametrize("splits", [2, 5])
def test_swiglu_adds_split_sums_as_the_sum_kernel_does(splits: int) -> None:
    """A gate|up product's float32 partials: the SwiGLU that adds them gives the bits of summing first (the
    matmul's sum kernel), then the SwiGLU of the two halves; a row alone as among others."""
    torch.manual_seed(splits)
    partial = torch.randn(splits, 7, 2 * 1100) * 3
    sums = linear.SplitSums(partial, torch.bfloat16)
    summed = sums.summed()
    want = activation.silu_mul_triton(*summed.chunk(2, dim=-1))
    got = activation.swiglu(sums)
    assert got.shape == (7, 1100) and torch.equal(got, want)
    alone = activation.swiglu(linear.SplitSums(partial[:, 3:4].clone(), torch.bfloat16))
    assert torch.equal(alone[0], got[3])


def test_silu_mul_adds_each_operands_partials() -> None:
    """A dense MLP's gate and up as their products' partials: column views of one fused product's (the same
    splits), or products of their own (other splits), or one stored and one split: the bits of summing first."""
    torch.manual_seed(3)
    fused = linear.SplitSums(torch.randn(3, 6, 2 * 700) * 3, torch.bfloat16)
    gate, up = fused.split([700, 700])
    want = activation.silu_mul_triton(*fused.summed().chunk(2, dim=-1))
    assert torch.equal(activation.silu_mul(gate, up), want)
    own_gate = linear.SplitSums(torch.randn(2, 6, 700) * 3, torch.bfloat16)
    own_up = linear.SplitSums(torch.randn(5, 6, 700) * 3, torch.bfloat16)
    want = activation.silu_mul_triton(own_gate.summed(), own_up.summed())
    assert torch.equal(activation.silu_mul(own_gate, own_up), want)
    assert torch.equal(activation.silu_mul(own_gate.summed(), own_up), want)
    with pytest.raises(ValueError, match="differ"):
        activation.silu_mul(own_gate, linear.SplitSums(torch.randn(2, 6, 600), torch.bfloat16))


@pytest.mark.parametrize("shape", [(1, 64), (19, 1500), (2, 3, 40)])
def test_silu_mul(shape: tuple[int, ...]) -> None:
    torch.manual_seed(shape[-1])
    gate, up = torch.randn(shape).bfloat16() * 4, torch.randn(shape).bfloat16()
    want = activation.silu_mul_reference(gate, up)
    got = activation.silu_mul_triton(gate, up)
    assert got.shape == want.shape
    assert_within_one_ulp(got, want)
    rows = gate.reshape(-1, shape[-1]), up.reshape(-1, shape[-1])
    for i in (0, rows[0].shape[0] - 1):
        alone = activation.silu_mul_triton(rows[0][i : i + 1].clone(), rows[1][i : i + 1].clone())
        assert torch.equal(alone[0], got.reshape(-1, shape[-1])[i])


def test_views_of_one_fused_output() -> None:
    """gate and up as the halves of a [M, 2I] gate|up product: read through their row stride, not copied."""
    torch.manual_seed(3)
    fused = torch.randn(5, 2 * 96).bfloat16()
    gate, up = fused.split(96, dim=-1)
    got = activation.silu_mul_triton(gate, up)
    assert torch.equal(got, activation.silu_mul_triton(gate.contiguous(), up.contiguous()))
    assert_within_one_ulp(got, activation.silu_mul_reference(gate, up))
    experts = torch.randn(3, 2, 2 * 40).bfloat16().chunk(2, dim=-1)  # [N, k, I] halves of routed outputs
    assert activation.silu_mul_triton(*experts).shape == (3, 2, 40)
    assert_within_one_ulp(activation.silu_mul_triton(*experts), activation.silu_mul_reference(*experts))
