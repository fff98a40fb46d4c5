"""runtime/kernels/activation.py: silu_mul's and sigmoid_mul's Triton kernels (interpreted) against their
references (the runtime's tests hold them to transformers' models); views of one fused gate|up output and of each
head's gate half; batch invariance."""

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


@pytest.mark.parametrize("shape", [(1, 1, 2, 16), (2, 3, 4, 40), (5, 1, 16, 256)])
def test_sigmoid_mul_reads_each_heads_gate_half_in_place(shape: tuple[int, ...]) -> None:
    """The gated attention's gate: the second half of each head of a [..., H, 2D] q|gate projection."""
    torch.manual_seed(shape[-1] + shape[-2])
    *lead, heads, width = shape
    projection = torch.randn(*lead, heads, 2 * width).bfloat16() * 4
    gate = projection[..., width:]
    o = torch.randn(shape).bfloat16()
    got = activation.sigmoid_mul_triton(o, gate)
    assert got.shape == o.shape and torch.equal(got, activation.sigmoid_mul_triton(o, gate.contiguous()))
    assert_within_one_ulp(got, activation.sigmoid_mul_reference(o, gate))
    rows_o, rows_g = o.reshape(-1, heads, width), gate.reshape(-1, heads, width)
    for i in (0, rows_o.shape[0] - 1):
        alone = activation.sigmoid_mul_triton(rows_o[i : i + 1].clone(), rows_g[i : i + 1].clone())
        assert torch.equal(alone[0], got.reshape(-1, heads, width)[i])
