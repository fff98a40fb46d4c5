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

from specpair.runtime.kernels import experts, linear, norm

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


@pytest.mark.parametrize("splits", [0, 2])
def test_gated_reads_a_tokens_gate_in_place(splits: int) -> None:
    """The GDN's norm: a row per (token, head), the gate a row per token, columns of a fused projection's output
    (read in place, any row stride) or that product's split partials (added as the sum kernel adds them): the
    bits of the gate copied out, summed first, into x's shape; a token alone as among others; a gate of other
    rows is refused."""
    torch.manual_seed(21 + splits)
    tokens, heads, width = 5, 3, 64
    x, w, _ = inputs((tokens * heads, width), torch.bfloat16)
    fused = torch.randn(max(splits, 1), tokens, 40 + heads * width) * 2
    if splits:
        gate = linear.SplitSums(fused, torch.bfloat16).columns(40, 40 + heads * width)
        copied = linear.SplitSums(fused, torch.bfloat16).summed()[:, 40:].contiguous()
        alone = linear.SplitSums(fused[:, 2:3].clone(), torch.bfloat16).columns(40, 40 + heads * width)
    else:
        gate = fused[0].bfloat16()[:, 40:]  # a column view: rows 40 + heads·width apart
        copied = gate.contiguous()
        alone = gate[2:3]
    want = norm.gated_rms_norm_triton(x, copied.reshape(x.shape), w, EPS)
    got = norm.gated_rms_norm_triton(x, gate, w, EPS)
    assert torch.equal(got, want)
    if splits:  # partials go to the kernel wherever x is
        assert torch.equal(norm.gated_rms_norm(x, gate, w, EPS), got)
    else:
        assert torch.equal(
            norm.gated_rms_norm_reference(x, gate, w, EPS), norm.gated_rms_norm_reference(x, copied, w, EPS)
        )
    assert torch.equal(
        norm.gated_rms_norm_triton(x[2 * heads : 3 * heads].clone(), alone, w, EPS), got[2 * heads : 3 * heads]
    )
    with pytest.raises(ValueError, match="gate"):
        norm.gated_rms_norm_triton(x[:7], gate, w, EPS)


@pytest.mark.parametrize("zero_centred", [False, True])
@pytest.mark.parametrize("shared", ["none", "column", "partials"])
@pytest.mark.parametrize("tokens,top_k,width", [(5, 3, 96), (3, 8, 2048)], ids=["small", "35b"])
def test_add_a_moes_terms_then_norm(shared: str, zero_centred: bool, tokens: int, top_k: int, width: int) -> None:
    """delta as a MoE layer's terms (experts.ExpertTerms: the routed experts' outputs and weights, the shared
    expert's output as down's last column, its logit plain or its product's partials): the kernel that adds them
    gives the bits of combine_experts then the add; a row alone as among others; terms of other rows are refused.
    On the CPU, add_rms_norm adds them with combine_experts' reference. At the 35B-A3B's width and top-k too
    (the tensor-parallel reduce adds a MoE's terms with combine_experts before the all-gather, where one GPU adds
    them in the norm: the same bits at the shapes it runs)."""
    torch.manual_seed(len(shared) + width)
    h, w, _ = inputs((tokens, width), torch.bfloat16)
    weights = experts.route_reference(torch.randn(tokens, 16), top_k, True)[0]
    down = torch.randn(tokens, top_k + (shared != "none"), width).bfloat16()
    router = torch.randn(2, tokens, 17)  # [routed logits | shared gate logit], split in two

    def terms_of(rows: slice) -> experts.ExpertTerms:
        partials = linear.SplitSums(router[:, rows].clone(), torch.bfloat16)
        logit = {"none": None, "column": partials.summed()[:, 16:], "partials": partials.columns(16, 17)}[shared]
        return experts.ExpertTerms(weights[rows], down[rows], None if logit is None else down[rows, top_k], logit)

    terms = terms_of(slice(None))
    want = norm.add_rms_norm_triton(h, experts.combine_experts_triton(*vars(terms).values()), w, EPS, zero_centred)
    got = norm.add_rms_norm_triton(h, terms, w, EPS, zero_centred)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    one = terms_of(slice(2, 3))
    assert torch.equal(norm.add_rms_norm_triton(h[2:3].clone(), one, w, EPS, zero_centred)[1][0], got[1][2])
    if shared != "partials":
        reference = norm.add_rms_norm(h, terms, w, EPS, zero_centred)
        combined = experts.combine_experts_reference(*vars(terms).values())
        want_reference = norm.add_rms_norm_reference(h, combined, w, EPS, zero_centred)
        assert torch.equal(reference[0], want_reference[0]) and torch.equal(reference[1], want_reference[1])
    with pytest.raises(ValueError, match="expert terms"):
        norm.add_rms_norm_triton(h[: tokens - 1], terms, w, EPS, zero_centred)
