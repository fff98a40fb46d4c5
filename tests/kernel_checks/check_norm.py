"""runtime/kernels/norm.py: the references equal transformers' norm modules bit for bit (dtype handling
included); the Triton kernel (interpreted) agrees with them within rounding; both are batch-invariant.

Bit equality with transformers holds where a row's width is a multiple of torch's SIMD chunk (every real
model's): torch's CPU elementwise kernels compute the last elements of a tensor on a scalar path whose exp
can differ in the last bit, so silu over [2, 3, 40] at once (transformers) and over each row of 40 alone
(the reference, which is batch-invariant for it) may differ there."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm, Qwen3_5RMSNormGated
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm, Qwen3NextRMSNormGated

from specpair.runtime.kernels import linear, norm

EPS = 1e-6
SHAPES = [(1, 128), (17, 64), (2, 3, 128)]  # a row alone, rows past a multiple of 16, three dims
ODD_SHAPES = [(17, 96), (2, 3, 40)]  # widths that are not powers of 2 (nor multiples of the SIMD chunk)
DTYPES = [torch.float32, torch.bfloat16]


def module(cls: type, weight: torch.Tensor) -> torch.nn.Module:
    m = cls(weight.shape[0], eps=EPS)
    m.weight.data = weight.clone()
    return m.to(weight.dtype)


def assert_within_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and not got.isnan().any()
    ulps = 2.0**-21 if want.dtype == torch.float32 else 2.0**-7  # a few float32 ulps, or one bf16 ulp
    assert ((got.float() - want.float()).abs() <= ulps * want.float().abs() + 1e-30).all()


def inputs(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(len(shape) * 100 + shape[-1])
    return (torch.randn(shape).to(dtype), torch.randn(shape[-1]).to(dtype) * 0.5, torch.randn(shape).to(dtype))


def assert_rows_alone_equal(fn, x: torch.Tensor, *rest: torch.Tensor) -> None:
    full = fn(x, *rest)
    rows, others = x.reshape(-1, x.shape[-1]), [r.reshape(-1, x.shape[-1]) if r.shape == x.shape else r for r in rest]
    for i in (0, rows.shape[0] - 1):
        alone = fn(rows[i : i + 1].clone(), *[o[i : i + 1].clone() if o.shape == rows.shape else o for o in others])
        assert torch.equal(alone[0], full.reshape(rows.shape)[i])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_zero_centred(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, w, _ = inputs(shape, dtype)
    reference = norm.rms_norm_reference(x, w, EPS, zero_centred=True)
    with torch.no_grad():
        assert torch.equal(reference, module(Qwen3_5RMSNorm, w)(x))
        assert torch.equal(reference, module(Qwen3NextRMSNorm, w)(x))
    assert_within_rounding(norm.rms_norm_triton(x, w, EPS, zero_centred=True), reference)
    for fn in (norm.rms_norm_reference, norm.rms_norm_triton):
        assert_rows_alone_equal(lambda x, w, fn=fn: fn(x, w, EPS, True), x, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_plain(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, w, _ = inputs(shape, dtype)
    reference = norm.rms_norm_reference(x, w, EPS, zero_centred=False)
    with torch.no_grad():
        assert torch.equal(reference, module(Qwen3RMSNorm, w)(x))
    assert_within_rounding(norm.rms_norm_triton(x, w, EPS, zero_centred=False), reference)
    for fn in (norm.rms_norm_reference, norm.rms_norm_triton):
        assert_rows_alone_equal(lambda x, w, fn=fn: fn(x, w, EPS, False), x, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gated(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, w, gate = inputs(shape, dtype)
    reference = norm.gated_rms_norm_reference(x, gate, w, EPS)
    with torch.no_grad():
        assert torch.equal(reference, module(Qwen3_5RMSNormGated, w)(x, gate))
        assert torch.equal(reference, module(Qwen3NextRMSNormGated, w)(x, gate))
    assert_within_rounding(norm.gated_rms_norm_triton(x, gate, w, EPS), reference)
    for fn in (norm.gated_rms_norm_reference, norm.gated_rms_norm_triton):
        assert_rows_alone_equal(lambda x, g, w, fn=fn: fn(x, g, w, EPS), x, gate, w)


def test_gated_float32_weight_with_bf16_input() -> None:
    """transformers promotes w·x̂ to float32 when w is float32: the middle product is not rounded to bf16."""
    x, _, gate = inputs((5, 64), torch.bfloat16)
    w = torch.randn(64)
    reference = norm.gated_rms_norm_reference(x, gate, w, EPS)
    m = Qwen3_5RMSNormGated(64, eps=EPS)
    m.weight.data = w.clone()
    with torch.no_grad():
        assert torch.equal(reference, m(x, gate))
    assert_within_rounding(norm.gated_rms_norm_triton(x, gate, w, EPS), reference)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ODD_SHAPES)
def test_odd_widths(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, w, gate = inputs(shape, dtype)
    for zero_centred in (True, False):
        reference = norm.rms_norm_reference(x, w, EPS, zero_centred)
        assert_within_rounding(norm.rms_norm_triton(x, w, EPS, zero_centred), reference)
        for fn in (norm.rms_norm_reference, norm.rms_norm_triton):
            assert_rows_alone_equal(lambda x, w, fn=fn, zero_centred=zero_centred: fn(x, w, EPS, zero_centred), x, w)
    assert_within_rounding(norm.gated_rms_norm_triton(x, gate, w, EPS), norm.gated_rms_norm_reference(x, gate, w, EPS))
    for fn in (norm.gated_rms_norm_reference, norm.gated_rms_norm_triton):
        assert_rows_alone_equal(lambda x, g, w, fn=fn: fn(x, g, w, EPS), x, gate, w)


@pytest.mark.parametrize("zero_centred", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + ODD_SHAPES)
def test_add_then_norm(shape: tuple[int, ...], dtype: torch.dtype, zero_centred: bool) -> None:
    """The sum is torch's add bit for bit (one rounding of the float32 sum), the norm is rms_norm of that sum."""
    h, w, delta = inputs(shape, dtype)
    summed, normed = norm.add_rms_norm_reference(h, delta, w, EPS, zero_centred)
    assert torch.equal(summed, h + delta)
    assert torch.equal(normed, norm.rms_norm_reference(h + delta, w, EPS, zero_centred))
    got_sum, got_norm = norm.add_rms_norm_triton(h, delta, w, EPS, zero_centred)
    assert torch.equal(got_sum, summed)
    assert_within_rounding(got_norm, normed)
    assert torch.equal(got_norm, norm.rms_norm_triton(summed, w, EPS, zero_centred))
    for fn in (norm.add_rms_norm_reference, norm.add_rms_norm_triton):
        assert_rows_alone_equal(lambda h, d, w, fn=fn: fn(h, d, w, EPS, zero_centred)[1], h, delta, w)


@pytest.mark.parametrize("zero_centred", [False, True])
@pytest.mark.parametrize("splits", [2, 8])
def test_add_split_sums_then_norm(splits: int, zero_centred: bool) -> None:
    """delta as a split product's float32 partials (a mixer's output projection): the kernel that adds them gives
    the bits of summing them first (the matmul's sum kernel) and adding the sum; a row alone as among others."""
    torch.manual_seed(splits)
    h, w, _ = inputs((5, 96), torch.bfloat16)
    partial = torch.randn(splits, 5, 96)
    sums = linear.SplitSums(partial, torch.bfloat16)
    want = norm.add_rms_norm_triton(h, sums.summed(), w, EPS, zero_centred)
    got = norm.add_rms_norm_triton(h, sums, w, EPS, zero_centred)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    alone = norm.add_rms_norm_triton(
        h[2:3].clone(), linear.SplitSums(partial[:, 2:3].clone(), torch.bfloat16), w, EPS, zero_centred
    )
    assert torch.equal(alone[1][0], got[1][2])
