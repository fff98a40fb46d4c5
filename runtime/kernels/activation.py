"""SwiGLU's gate: silu(gate) * up, as transformers computes it for bf16 activations: silu in float32
(x / (1 + exp(-x))), rounded to the activations' dtype, times up, rounded again. One kernel instead of the
five elementwise ops (and their four intermediate tensors) that torch runs for it.

gate and up may be views into one fused projection's output ([M, 2I] from a gate|up weight): rows are read
through a row stride, columns must be contiguous. Elementwise, so batch-invariant by construction: an element's
bits depend on its own two inputs alone. `swiglu(gate_up)` takes the fused output whole, or its split-K partials
(linear.SplitSums: the routed experts' gate|up), which its kernel adds as the matmul's sum kernel would (in split
order, rounded to the activations' dtype) before the SwiGLU: one launch instead of two, the same bits.

The gated attention's output gate: o [..., H, D] times sigmoid(gate) in float32, rounded to o's dtype, times o,
rounded again (sigmoid_mul_reference; on the GPU `sigmoid_gated`, which the attention kernels apply as they store
their output, reading the gate in place or adding its projection's partials).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    device_function,
    launch_options,
    require_triton,
    rounded,
    summed_values,
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


def sigmoid_mul_reference(x: Tensor, gate: Tensor) -> Tensor:
    """sigmoid written with exp, for the same reason as silu_mul_reference's silu."""
    return x * (1 / (1 + torch.exp(-gate.float()))).to(x.dtype)


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
        # as stored, or float32 partials [splits, rows, 2I] summed as the matmul's sum kernel sums them
        g = summed_values(gate_ptr, row * gate_stride + cols, inside, plane, SPLITS, dtype).to(tl.float32)
        u = summed_values(up_ptr, row * up_stride + cols, inside, plane, SPLITS, dtype).to(tl.float32)
        activated = rounded(g / (1.0 + tl.exp(-g)), dtype).to(tl.float32)
        tl.store(out_ptr + row * width + cols, rounded(activated * u, dtype), mask=inside)

    @device_function
    def sigmoid_gated(x, gate, dtype: tl.constexpr):
        """x · sigmoid(gate) as sigmoid_mul_reference rounds it: x already in dtype, the sigmoid in float32 rounded
        to dtype, the product rounded again."""
        gated = rounded(1.0 / (1.0 + tl.exp(-gate.to(tl.float32))), dtype).to(tl.float32)
        return rounded(x.to(tl.float32) * gated, dtype)
