"""runtime/kernels/norm.py's CPU reference norms all the rows of a call in one pass, and a row keeps the bits that
transformers' norm gives it alone: in every slot, beside rows of other magnitudes, in calls of 1 to 9 rows, for
SmolLM2's widths, a head's and odd ones, float32 and bf16, plain and zero-centred gains, under one thread and two.
CPU, exact."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from specpair.runtime.kernels import norm

EPS = 1e-5
WIDTHS = [576, 64, 37, 7, 1536, 2053]


def transformers_norm(row: Tensor, weight: Tensor, zero_centred: bool) -> Tensor:
    """One row [width] as transformers' LlamaRMSNorm (plain) and Qwen3NextRMSNorm (zero-centred) compute it."""
    h = row.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return (h * (1.0 + weight.float())).type_as(row) if zero_centred else weight * h.to(row.dtype)


@pytest.mark.parametrize("zero_centred", [False, True], ids=["plain", "zero-centred"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("width", WIDTHS)
def test_a_row_has_its_own_bits_in_any_call(width: int, dtype: torch.dtype, zero_centred: bool, threads: int) -> None:
    torch.manual_seed(width)
    weight = (torch.randn(width) * 0.5 + (0.0 if zero_centred else 1.0)).to(dtype)
    row = (torch.randn(width) * 3.0).to(dtype)
    alone = transformers_norm(row.clone(), weight, zero_centred)
    assert torch.equal(norm.rms_norm_reference(row[None], weight, EPS, zero_centred)[0], alone)
    for count in range(1, 10):
        for slot in range(count):
            mates = (torch.randn(count, width) * 10.0 ** (slot % 3 - 1)).to(dtype)  # other magnitudes too
            mates[slot] = row
            assert torch.equal(norm.rms_norm_reference(mates, weight, EPS, zero_centred)[slot], alone), (count, slot)


def test_heads_and_a_residual_add_keep_their_bits() -> None:
    """A [B, T, heads, head_dim] call (q/k norms) and add_rms_norm's sum: each head row as it is alone."""
    torch.manual_seed(0)
    weight = torch.randn(64)
    q = torch.randn(2, 3, 9, 64)
    out = norm.rms_norm_reference(q, weight, EPS, False)
    for b, t, head in [(0, 0, 0), (1, 2, 8), (0, 1, 4)]:
        assert torch.equal(out[b, t, head], transformers_norm(q[b, t, head].clone(), weight, False))
    h, delta = torch.randn(5, 576), torch.randn(5, 576)
    gain = torch.randn(576)
    summed, normed = norm.add_rms_norm_reference(h, delta, gain, EPS, False)
    for i in range(5):
        assert torch.equal(summed[i], h[i] + delta[i])
        assert torch.equal(normed[i], transformers_norm(h[i] + delta[i], gain, False))
