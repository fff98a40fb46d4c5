"""RMS norms over the last dimension, as transformers' Llama / Qwen3 / Qwen3.5 / Qwen3-Next compute them.

- `rms_norm(x, w, eps, zero_centred=True)`: Qwen3.5 / Qwen3-Next (Gemma-style): everything in float32,
  `x̂ · (1 + w)`, one rounding to x's dtype at the end.
- `rms_norm(x, w, eps, zero_centred=False)`: Llama / Qwen3: x̂ is rounded to x's dtype *before* the weight
  multiplies it (`w * x̂.to(dtype)`), then the product is rounded to x's dtype. transformers returns the
  promoted dtype of (w, x) here; with w in x's dtype, as models load, that is x's dtype and the bits agree.
- `gated_rms_norm(x, gate, w, eps)`: Gated DeltaNet's output norm (`RMSNormGated`), plain w:
  `(w * x̂.to(dtype)) * silu(float32(gate))`, rounded to x's dtype; the middle product is rounded to the
  promoted dtype of (w, x), as transformers' dtype promotion does. x holds a row per (token, head), the gate a
  row per token ([tokens, heads·width], any row stride: a fused projection's columns, read in place); on the GPU
  the gate may be its projection's split partials (SplitSums), added as the sum kernel adds them.
- `add_rms_norm(h, delta, w, eps, zero_centred)`: the residual stream's `h + delta` (rounded to h's dtype, as
  torch's add rounds it) and its `rms_norm`, in one pass: a decoder layer's add and the next norm. On the GPU
  delta may be a split product's float32 partials (linear.SplitSums: a mixer's output projection), which the
  kernel adds first as the matmul's sum kernel would (in split order, rounded to h's dtype), or a MoE layer's terms
  (experts.ExpertTerms), which it adds as combine_experts would: the same bits, one launch fewer.
x̂ = x · rsqrt(mean(x²) + eps), with x widened to float32. Rows are independent: one row per Triton program; the
CPU reference norms all rows in one pass whose every op computes a row from that row alone (`_normed_rows`), so no
row's bits depend on the others.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.experts import ExpertTerms, TermsOperands, terms_operands, terms_sum
from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    launch_options,
    require_triton,
    rounded,
    split_sum,
    tl,
    tl_dtype,
    triton,
)


def rms_norm(x: Tensor, weight: Tensor, eps: float, zero_centred: bool) -> Tensor:
    if x.is_cuda:
        return rms_norm_triton(x, weight, eps, zero_centred)
    return rms_norm_reference(x, weight, eps, zero_centred)


def gated_rms_norm(x: Tensor, gate: Tensor | SplitSums, weight: Tensor, eps: float) -> Tensor:
    if isinstance(gate, SplitSums) or x.is_cuda:
        return gated_rms_norm_triton(x, gate, weight, eps)
    return gated_rms_norm_reference(x, gate, weight, eps)


def add_rms_norm(
    h: Tensor, delta: Tensor | SplitSums | ExpertTerms, weight: Tensor, eps: float, zero_centred: bool
) -> tuple[Tensor, Tensor]:
    """(h + delta, rms_norm(h + delta))."""
    if h.is_cuda:
        return add_rms_norm_triton(h, delta, weight, eps, zero_centred)
    if isinstance(delta, ExpertTerms):
        delta = delta.combined()
    return add_rms_norm_reference(h, delta, weight, eps, zero_centred)


def _normed(row: Tensor, eps: float) -> Tensor:
    h = row.to(torch.float32, copy=True)  # a fresh buffer: the reduction never sees another row's alignment
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def _normed_rows(rows: Tensor, eps: float) -> Tensor:
    """_normed of each row of [M, width], in one pass over all of them with each row's bits its own: the squares
    are elementwise, torch's CPU sum over a contiguous last dim reduces every row alone in an order set by the width
    (unaligned vector loads, a row never split between threads), and the mean's division, + eps, rsqrt (1 / sqrt,
    vector or scalar alike) and the product are one IEEE rounding each (tests/test_norm_rows.py)."""
    h = rows.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float, zero_centred: bool) -> Tensor:
    normed = _normed_rows(x.reshape(-1, x.shape[-1]), eps)
    out = normed * (1.0 + weight.float()) if zero_centred else weight * normed.to(x.dtype)
    return out.to(x.dtype).reshape(x.shape)


def gated_rms_norm_reference(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])
    gates = gate.reshape(rows.shape)
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        out[i] = (weight * _normed(rows[i], eps).to(x.dtype)) * torch.nn.functional.silu(gates[i].float())
    return out.reshape(x.shape)


def add_rms_norm_reference(
    h: Tensor, delta: Tensor, weight: Tensor, eps: float, zero_centred: bool
) -> tuple[Tensor, Tensor]:
    summed = h + delta.reshape(h.shape)  # a MoE's delta comes a row per token
    return summed, rms_norm_reference(summed, weight, eps, zero_centred)


def _check_partials(sums: SplitSums, rows: int, width: int, dtype: torch.dtype, what: str) -> None:
    if sums.partial.shape[1:] != (rows, width) or sums.dtype != dtype:
        raise ValueError(f"{what}: partials {list(sums.partial.shape)} for rows of {rows} x {width}")


def _launch(
    x: Tensor,
    gate: Tensor | SplitSums | None,
    weight: Tensor,
    eps: float,
    zero_centred: bool,
    delta: Tensor | SplitSums | ExpertTerms | None = None,
) -> tuple[Tensor, Tensor]:
    """(the normed rows, and x + delta where delta is given: the rows normed). A kernel adds one product's
    partials at most: delta's, or the gate's."""
    require_triton("rms_norm")
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()
    out = torch.empty_like(rows)
    splits, plane, gates, gate_heads = 0, 0, rows, 1
    if gate is not None and rows.shape[0]:
        tokens = gate.partial.shape[1] if isinstance(gate, SplitSums) else gate.numel() // gate.shape[-1]
        gate_heads = rows.shape[0] // max(tokens, 1)
        if gate_heads * tokens != rows.shape[0]:
            raise ValueError(f"gated_rms_norm: a gate of {tokens} rows for {rows.shape[0]} rows")
        if isinstance(gate, SplitSums):  # the first plane, read in place (columns of a fused product)
            _check_partials(gate, tokens, gate_heads * width, x.dtype, "gated_rms_norm")
            gates, splits, plane = gate.partial[0], gate.partial.shape[0], gate.partial.stride(0)
        else:
            gates = gate.reshape(tokens, gate.shape[-1])
            if gates.stride(-1) != 1:
                gates = gates.contiguous()
        if gates.shape != (tokens, gate_heads * width):
            raise ValueError(f"gated_rms_norm: gate {list(gates.shape)} for rows {list(rows.shape)}")
    terms = None
    if isinstance(delta, ExpertTerms):
        terms = terms_operands(delta)
        if terms.down.shape[0] != rows.shape[0] or terms.down.shape[2] != width or terms.down.dtype != x.dtype:
            raise ValueError(f"add_rms_norm: expert terms {list(terms.down.shape)} for rows {list(rows.shape)}")
        deltas = terms.down
    elif isinstance(delta, SplitSums):
        _check_partials(delta, *rows.shape, x.dtype, "add_rms_norm")
        deltas = delta.partial.contiguous()
        splits, plane = deltas.shape[0], deltas.stride(0)
    else:
        deltas = rows if delta is None else delta.reshape(rows.shape).contiguous()
    if terms is None:
        terms = TermsOperands.absent(rows)
    summed = out if delta is None else torch.empty_like(rows)
    middle = tl_dtype(torch.promote_types(weight.dtype, x.dtype))
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            gates,
            deltas,
            terms.weights,
            terms.shared,
            terms.logits,
            weight.contiguous(),
            out,
            summed,
            width,
            eps,
            gates.stride(0),
            gate_heads,
            plane,
            *terms.strides,
            **terms.constexprs,
            ZERO_CENTRED=zero_centred,
            GATED=gate is not None,
            ADD=delta is not None,
            SPLITS=splits,
            MIDDLE=middle,
            BLOCK=triton.next_power_of_2(width),
            num_warps=max(4, min(16, triton.next_power_of_2(width) // 256)),  # a wide row is one program's work
            **launch_options(),
        )
    return out.reshape(x.shape), summed.reshape(x.shape)


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float, zero_centred: bool) -> Tensor:
    return _launch(x, None, weight, eps, zero_centred)[0]


def gated_rms_norm_triton(x: Tensor, gate: Tensor | SplitSums, weight: Tensor, eps: float) -> Tensor:
    return _launch(x, gate, weight, eps, zero_centred=False)[0]


def add_rms_norm_triton(
    h: Tensor, delta: Tensor | SplitSums | ExpertTerms, weight: Tensor, eps: float, zero_centred: bool
) -> tuple[Tensor, Tensor]:
    normed, summed = _launch(h, None, weight, eps, zero_centred, delta)
    return summed, normed


if triton is not None:

    @triton.jit(
        do_not_specialize=["gate_stride", "gate_heads", "down_stride", "shared_stride", "logit_stride", "logit_plane"],
        do_not_specialize_on_alignment=[
            "x_ptr",
            "gate_ptr",
            "delta_ptr",
            "terms_w_ptr",
            "terms_shared_ptr",
            "terms_logit_ptr",
            "out_ptr",
            "sum_ptr",
        ],
    )
    def _rms_norm_kernel(
        x_ptr,
        gate_ptr,
        delta_ptr,
        terms_w_ptr,
        terms_shared_ptr,
        terms_logit_ptr,
        w_ptr,
        out_ptr,
        sum_ptr,
        width,
        eps,
        gate_stride,
        gate_heads,
        plane,
        down_stride,
        shared_stride,
        logit_stride,
        logit_plane,
        TOP_K: tl.constexpr,
        SHARED: tl.constexpr,
        LOGIT_SPLITS: tl.constexpr,
        ZERO_CENTRED: tl.constexpr,
        GATED: tl.constexpr,
        ADD: tl.constexpr,
        SPLITS: tl.constexpr,
        MIDDLE: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < width
        dtype = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * width + cols, mask=inside, other=0.0).to(tl.float32)
        if ADD:  # the residual add, rounded as torch rounds it, and normed from the rounded sum
            if TOP_K > 0:  # a MoE's terms (delta_ptr: their down outputs), added as combine_experts adds them
                d = terms_sum(
                    terms_w_ptr,
                    delta_ptr,
                    terms_shared_ptr,
                    terms_logit_ptr,
                    row,
                    cols,
                    inside,
                    width,
                    down_stride,
                    shared_stride,
                    logit_stride,
                    logit_plane,
                    TOP_K,
                    SHARED,
                    LOGIT_SPLITS,
                    dtype,
                )
                d = rounded(d, dtype).to(tl.float32)
            elif SPLITS > 0:  # float32 partials [splits, rows, width], summed as the matmul's sum kernel sums them
                d = split_sum(delta_ptr, plane, SPLITS, row * width + cols, inside)
                d = rounded(d, dtype).to(tl.float32)
            else:
                d = tl.load(delta_ptr + row * width + cols, mask=inside, other=0.0).to(tl.float32)
            x_rounded = rounded(x + d, dtype)
            tl.store(sum_ptr + row * width + cols, x_rounded, mask=inside)
            x = x_rounded.to(tl.float32)
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        normed = x * tl.math.rsqrt(tl.sum(x * x, axis=0) / width + eps)
        if ZERO_CENTRED:
            y = normed * (1.0 + w)
        else:
            y = w * rounded(normed, dtype).to(tl.float32)
            if GATED:
                y = rounded(y, MIDDLE).to(tl.float32)
                # a row per (token, head); the gate's row is its token's, the head's columns of it
                at = (row // gate_heads) * gate_stride + (row % gate_heads) * width + cols
                if SPLITS > 0:  # float32 partials of the gate's product, summed as the matmul's sum kernel sums them
                    gate = rounded(split_sum(gate_ptr, plane, SPLITS, at, inside), dtype).to(tl.float32)
                else:
                    gate = tl.load(gate_ptr + at, mask=inside, other=0.0).to(tl.float32)
                y = y * (gate / (1.0 + tl.exp(-gate)))
        tl.store(out_ptr + row * width + cols, rounded(y, dtype), mask=inside)
