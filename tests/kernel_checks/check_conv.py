"""runtime/kernels/conv.py: the dynamic causal convolution's Triton kernel (interpreted, or compiled in the GPU tier)
against its reference, bitwise. No tolerance is needed: the reference rounds each product and each sum to float32
and the result once to z's dtype; the interpreter's numpy float32 does the same, in the same tap order, and rounds
to bf16 as torch does (triton_common.rounded); the compiled kernel is built without FMA contraction (a fused
multiply-add would skip the product's rounding and could move the float32 sum by an ulp, the bf16 result by one),
so its products and sums round as the reference's. Coefficients come as the runtime has them: a bf16 projection's
output, viewed [B, T, 2, K, G] and sliced per side (strided, not copied); float32 too."""

from __future__ import annotations

import pytest
import torch

from specpair.runtime.kernels import conv

GROUP = 16


def operands(batch: int, block: int, width: int, taps: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    """(z, the coefficients of both sides [B, T, 2, K, G] as a projection of z gives them, base [2, K, H] float32)."""
    torch.manual_seed(seed)
    z = torch.randn(batch, block, width).to(dtype)
    projection = (torch.randn(2 * taps * (width // GROUP), width) / width**0.5).to(dtype)
    coefficients = (z @ projection.T).view(batch, block, 2, taps, -1)
    return z, coefficients, torch.randn(2, taps, width) * 0.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch, block, width, taps", [(3, 8, 560, 2), (2, 16, 1056, 2), (2, 5, 96, 3), (4, 1, 64, 2)])
def test_kernel_matches_reference_bitwise(batch: int, block: int, width: int, taps: int, dtype: torch.dtype) -> None:
    """Both sides' strided views of one projection; a width past one program's block (masked columns); block 1
    (no previous row) and more taps than the runtime's 2."""
    z, coefficients, base = operands(batch, block, width, taps, dtype)
    for side in (0, 1):
        dynamic = coefficients[:, :, side]
        assert not dynamic.is_contiguous()
        got = conv.dynamic_conv_triton(z, dynamic, base[side], GROUP)
        want = conv.dynamic_conv_reference(z, dynamic, base[side], GROUP)
        assert got.dtype == dtype and not got.isnan().any(), "unwritten (NaN) elements"
        assert torch.equal(got, want)


def test_a_row_alone_as_among_others() -> None:
    """A sequence alone gives its rows' bits in a batch (batch invariance), and a block's first rows the bits they
    have in a longer block (causal: no row reads a later one)."""
    z, coefficients, base = operands(5, 12, 320, 2, torch.bfloat16, seed=1)
    dynamic = coefficients[:, :, 0]
    batched = conv.dynamic_conv_triton(z, dynamic, base[0], GROUP)
    for b in (0, 3):
        alone = conv.dynamic_conv_triton(z[b : b + 1].clone(), dynamic[b : b + 1].clone(), base[0], GROUP)
        assert torch.equal(alone[0], batched[b])
    shorter = conv.dynamic_conv_triton(z[:, :7], dynamic[:, :7], base[0], GROUP)
    assert torch.equal(shorter, batched[:, :7])
