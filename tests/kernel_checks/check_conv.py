"""runtime/kernels/conv.py: the dynamic causal convolution's Triton kernel (interpreted, or compiled in the GPU tier)
against its reference, bitwise. No tolerance is needed: the reference rounds each product and each sum to float32
and the result once to z's dtype; the interpreter's numpy float32 does the same, in the same tap order, and rounds
to bf16 as torch does (triton_common.rounded); the compiled kernel is built without FMA contraction (a fused
multiply-add would skip the product's rounding and could move the float32 sum by an ulp, the bf16 result by one),
so its products and sums round as the reference's. Coefficients come as the runtime has them: a projection's
output [B, T, 2·K·G] whose two sides the convolutions read; z and the coefficients also as split-K partials
(linear.SplitSums), which the kernel adds as the sum kernel would."""

from __future__ import annotations

import pytest
import torch

from specpair.runtime.kernels import conv, linear

GROUP = 16


def operands(batch: int, block: int, width: int, taps: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    """(z [B, T, H], the coefficients [B, T, 2·K·G] as a projection of z gives them, base [2, K, H] float32)."""
    torch.manual_seed(seed)
    z = torch.randn(batch, block, width).to(dtype)
    projection = (torch.randn(2 * taps * (width // GROUP), width) / width**0.5).to(dtype)
    return z, z @ projection.T, torch.randn(2, taps, width) * 0.5


def partials(product: torch.Tensor, splits: int, seed: int) -> linear.SplitSums:
    """float32 partials over the product's rows that add up to about it: what a split-K matmul leaves."""
    torch.manual_seed(seed)
    rows = product.reshape(-1, product.shape[-1]).float()
    parts = torch.randn(splits, *rows.shape) * 0.3
    parts[-1] = rows - parts[:-1].sum(0)
    return linear.SplitSums(parts, product.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch, block, width, taps", [(3, 8, 560, 2), (2, 16, 1056, 2), (2, 5, 96, 3), (4, 1, 64, 2)])
def test_kernel_matches_reference_bitwise(batch: int, block: int, width: int, taps: int, dtype: torch.dtype) -> None:
    """Both sides of one projection's coefficients; a width past one program's block (masked columns); block 1 (no
    previous row) and more taps than the runtime's 2."""
    z, coefficients, base = operands(batch, block, width, taps, dtype)
    for side in (0, 1):
        got = conv.dynamic_conv_triton(z, coefficients, side, base[side], GROUP, block)
        want = conv.dynamic_conv_reference(z, coefficients, side, base[side], GROUP)
        assert got.shape == z.shape and got.dtype == dtype and not got.isnan().any(), "unwritten (NaN) elements"
        assert torch.equal(got, want)


@pytest.mark.parametrize("splits", [2, 3])
def test_partials_give_the_bits_of_summing_first(splits: int) -> None:
    """z (a sublayer's output) and the coefficients (the kernel projection's) as split-K partials over the B·T
    rows: the kernel adds them as linear.SplitSums.summed does, so the result is the convolution of the sums."""
    batch, block, width = 3, 8, 320
    z, coefficients, base = operands(batch, block, width, 2, torch.bfloat16, seed=splits)
    z_parts, c_parts = partials(z, splits, 1), partials(coefficients, splits, 2)
    z_sum = z_parts.summed().view(batch, block, width)
    c_sum = c_parts.summed().view(batch, block, -1)
    for side in (0, 1):
        want = conv.dynamic_conv_reference(z_sum, c_sum, side, base[side], GROUP)
        assert torch.equal(conv.dynamic_conv_triton(z_parts, c_parts, side, base[side], GROUP, block), want)
        assert torch.equal(conv.dynamic_conv_triton(z_sum, c_parts, side, base[side], GROUP, block), want)
        assert torch.equal(conv.dynamic_conv_triton(z_parts, c_sum, side, base[side], GROUP, block), want)


def test_a_row_alone_as_among_others() -> None:
    """A sequence alone gives its rows' bits in a batch (batch invariance), and a block's first rows the bits they
    have in a longer block (causal: no row reads a later one)."""
    z, coefficients, base = operands(5, 12, 320, 2, torch.bfloat16, seed=1)
    batched = conv.dynamic_conv_triton(z, coefficients, 0, base[0], GROUP, 12)
    for b in (0, 3):
        alone = conv.dynamic_conv_triton(z[b : b + 1].clone(), coefficients[b : b + 1].clone(), 0, base[0], GROUP, 12)
        assert torch.equal(alone[0], batched[b])
    shorter = conv.dynamic_conv_triton(z[:, :7].clone(), coefficients[:, :7].clone(), 0, base[0], GROUP, 7)
    assert torch.equal(shorter, batched[:, :7])
