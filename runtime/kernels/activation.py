"""SwiGLU's gate: silu(gate) * up, as transformers computes it for bf16 activations: silu in float32
(x / (1 + exp(-x))), rounded to the activations' dtype, times up, rounded again. One kernel instead of the
five elementwise ops (and their four intermediate tensors) that torch runs for it.

gate and up may be views into one fused projection's output ([M, 2I] from a gate|up weight): rows are read
through a row stride, columns must be contiguous. Elementwise, so batch-invariant by construction: an element's
bits depend on its own two inputs alone. `swiglu(gate_up)` takes the fused output whole, or its split-K partials
(linear.SplitSums: the routed experts' gate|up), which its kernel adds as the matmul's sum kernel would (in split
order, rounded to the activations' dtype) before the SwiGLU: one launch instead of two, the same bits.

The gated attention's output gate, sigmoid_mul(o, gate): o [..., H, D] times sigmoid(gate) in float32, rounded to
o's dtype, times o, rounded again; gate may be the strided half of each head of a q|gate projection ([..., H, D]
of a [..., H, 2D] view), read in place. One kernel instead of a copy and seven elementwise ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    launch_options,
    require_triton,
    rounded,
    split_sum,
    tl,
    triton,
)

BLOCK = 1024  # columns per program


def swiglu(gate_up: Tensor | SplitSums) -> Tensor:
    """silu(gate) * up of a fused gate|up product [..., 2I] (gate first), or of its partials ([rows, I] out)."""
    if isinstance(gate_up, Tensor):
        return silu_mul(*gate_up.chunk(2, dim=-1))
    require_triton("swiglu")
    return swiglu_triton(gate_up)


def swiglu_triton(gate_up: SplitSums) -> Tensor:
    """silu(gate) * up [rows, I], adding the gate|up product's partials first, as SplitSums.summed does."""
    splits, rows, width = gate_up.partial.shape[0], gate_up.partial.shape[1], gate_up.partial.shape[2] // 2
    out = torch.empty(rows, width, dtype=gate_up.dtype, device=gate_up.partial.device)
    if out.numel():
        partial = gate_up.partial
        _silu_mul_kernel[(rows, triton.cdiv(width, BLOCK))](
            partial,
            partial[..., width:],
            out,
            width,
            partial.stride(1),
            partial.stride(1),
            partial.stride(0),
            SPLITS=splits,
            BLOCK=BLOCK,
            **launch_options(),
        )
    return out


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    if gate.is_cuda:
        return silu_mul_triton(gate, up)
    return silu_mul_reference(gate, up)


def silu_mul_reference(gate: Tensor, up: Tensor) -> Tensor:
    """Written with exp, which gives an element the same bits wherever it sits (torch's own CPU silu takes a
    vector or a scalar path by position, which differ by an ulp)."""
    g = gate.float()
    return (g / (1 + torch.exp(-g))).to(up.dtype) * up


def silu_mul_triton(gate: Tensor, up: Tensor) -> Tensor:
    require_triton("silu_mul")
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {list(gate.shape)} and up {list(up.shape)} differ")
    shape, width = up.shape, up.shape[-1]
    gate, up = _rows(gate), _rows(up)
    out = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    if out.numel():
        _silu_mul_kernel[(out.shape[0], triton.cdiv(width, BLOCK))](
            gate,
            up,
            out,
            width,
            gate.stride(0),
            up.stride(0),
            0,
            SPLITS=0,
            BLOCK=BLOCK,
            **launch_options(),
        )
    return out.reshape(shape)


def sigmoid_mul(x: Tensor, gate: Tensor) -> Tensor:
    if x.is_cuda:
        return sigmoid_mul_triton(x, gate)
    return sigmoid_mul_reference(x, gate)


def sigmoid_mul_reference(x: Tensor, gate: Tensor) -> Tensor:
    """sigmoid written with exp, for the same reason as silu_mul_reference's silu."""
    return x * (1 / (1 + torch.exp(-gate.float()))).to(x.dtype)


def sigmoid_mul_triton(x: Tensor, gate: Tensor) -> Tensor:
    require_triton("sigmoid_mul")
    if gate.shape != x.shape or x.dim() < 2:
        raise ValueError(f"sigmoid_mul: x {list(x.shape)} and gate {list(gate.shape)} differ")
    heads, width = x.shape[-2:]
    x_rows, gate_rows = x.reshape(-1, heads, width).contiguous(), gate.reshape(-1, heads, width)
    if gate_rows.stride(-1) != 1:
        gate_rows = gate_rows.contiguous()
    out = torch.empty(x_rows.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        _sigmoid_mul_kernel[(out.shape[0], heads)](
            x_rows,
            gate_rows,
            out,
            width,
            gate_rows.stride(0),
            gate_rows.stride(1),
            BLOCK_D=triton.next_power_of_2(width),
            **launch_options(),
        )
    return out.reshape(x.shape)


def _rows(x: Tensor) -> Tensor:
    """x as [rows, width] with unit column stride (a view where it can be one)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


if triton is not None:

    @triton.jit(do_not_specialize_on_alignment=["gate_ptr", "up_ptr", "out_ptr"])
    def _silu_mul_kernel(
        gate_ptr,
        up_ptr,
        out_ptr,
        width,
        gate_stride,
        up_stride,
        plane,
        SPLITS: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        dtype = out_ptr.dtype.element_ty
        if SPLITS > 0:  # float32 partials [splits, rows, 2I], summed as the matmul's sum kernel sums them
            g = split_sum(gate_ptr, plane, SPLITS, row * gate_stride + cols, inside)
            u = split_sum(up_ptr, plane, SPLITS, row * up_stride + cols, inside)
            g, u = rounded(g, dtype).to(tl.float32), rounded(u, dtype).to(tl.float32)
        else:
            g = tl.load(gate_ptr + row * gate_stride + cols, mask=inside, other=0.0).to(tl.float32)
            u = tl.load(up_ptr + row * up_stride + cols, mask=inside, other=0.0).to(tl.float32)
        activated = rounded(g / (1.0 + tl.exp(-g)), dtype).to(tl.float32)
        tl.store(out_ptr + row * width + cols, rounded(activated * u, dtype), mask=inside)

    @triton.jit(do_not_specialize_on_alignment=["x_ptr", "gate_ptr", "out_ptr"])
    def _sigmoid_mul_kernel(
        x_ptr, gate_ptr, out_ptr, width, row_stride, head_stride, BLOCK_D: tl.constexpr, PDL: tl.constexpr
    ):
        after_previous_kernel(PDL)
        row, head = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        inside = cols < width
        at = (row * tl.num_programs(1) + head) * width + cols
        g = tl.load(gate_ptr + row * row_stride + head * head_stride + cols, mask=inside, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        gated = rounded(1.0 / (1.0 + tl.exp(-g)), dtype).to(tl.float32)
        tl.store(out_ptr + at, rounded(x * gated, dtype), mask=inside)
