"""SwiGLU's gate: silu(gate) * up, as transformers computes it for bf16 activations: silu in float32
(x / (1 + exp(-x))), rounded to the activations' dtype, times up, rounded again. One kernel instead of the
five elementwise ops (and their four intermediate tensors) that torch runs for it.

gate and up may be views into one fused projection's output ([M, 2I] from a gate|up weight): rows are read
through a row stride, columns must be contiguous. Elementwise, so batch-invariant by construction: an element's
bits depend on its own two inputs alone. `swiglu(gate_up)` takes the fused output whole, or its split-K partials
(linear.SplitSums: the routed experts' gate|up), and `silu_mul` either operand so (a dense MLP's gate and up, column
views of one fused product's partials), which the kernel adds as the matmul's sum kernel would (in split order,
rounded to the activations' dtype) before the SwiGLU: one launch instead of two, the same bits.

The gated attention's output gate: o [..., H, D] times sigmoid(gate) in float32, rounded to o's dtype, times o,
rounded again (sigmoid_mul_reference; on the GPU `sigmoid_gated`, which the attention kernels apply as they store
their output, reading the gate in place or adding its projection's partials).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.linear import SplitSums, planes_of
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
    return silu_mul_triton(*gate_up.split([gate_up.shape[-1] // 2] * 2))


def silu_mul(gate: Tensor | SplitSums, up: Tensor | SplitSums) -> Tensor:
    """silu(gate) * up; either may be its product's split-K partials ([rows, I] out), which the GPU kernel adds."""
    if isinstance(gate, SplitSums) or isinstance(up, SplitSums) or gate.is_cuda:
        return silu_mul_triton(gate, up)
    return silu_mul_reference(gate, up)


def silu_mul_reference(gate: Tensor, up: Tensor) -> Tensor:
    """Written with exp, which gives an element the same bits wherever it sits (torch's own CPU silu takes a
    vector or a scalar path by position, which differ by an ulp)."""
    g = gate.float()
    return (g / (1 + torch.exp(-g))).to(up.dtype) * up


def silu_mul_triton(gate: Tensor | SplitSums, up: Tensor | SplitSums) -> Tensor:
    """Each operand as stored, or its product's float32 partials (a column view of a fused gate|up product's, or a
    product of its own), added in split order and rounded to the product's dtype, as SplitSums.summed does."""
    require_triton("silu_mul")
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"silu_mul: gate {list(gate.shape)} ({gate.dtype}) and up {list(up.shape)} ({up.dtype}) differ"
        )
    shape, width = up.shape, up.shape[-1]
    (gate, gate_plane, gate_splits), (up_rows, up_plane, up_splits) = planes_of(gate), planes_of(up)
    gate, up_rows = _rows(gate), _rows(up_rows)
    out = torch.empty(up_rows.shape, dtype=up.dtype, device=up_rows.device)
    if out.numel():
        _silu_mul_kernel[(out.shape[0], triton.cdiv(width, BLOCK))](
            gate,
            up_rows,
            out,
            width,
            gate.stride(0),
            up_rows.stride(0),
            gate_plane,
            up_plane,
            GATE_SPLITS=gate_splits,
            UP_SPLITS=up_splits,
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
        gate_plane,
        up_plane,
        GATE_SPLITS: tl.constexpr,
        UP_SPLITS: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        dtype = out_ptr.dtype.element_ty
        # as stored, or float32 partials [splits, rows, N] summed as the matmul's sum kernel sums them
        g = summed_values(gate_ptr, row * gate_stride + cols, inside, gate_plane, GATE_SPLITS, dtype).to(tl.float32)
        u = summed_values(up_ptr, row * up_stride + cols, inside, up_plane, UP_SPLITS, dtype).to(tl.float32)
        activated = rounded(g / (1.0 + tl.exp(-g)), dtype).to(tl.float32)
        tl.store(out_ptr + row * width + cols, rounded(activated * u, dtype), mask=inside)

    @device_function
    def sigmoid_gated(x, gate, dtype: tl.constexpr):
        """x · sigmoid(gate) as sigmoid_mul_reference rounds it: x already in dtype, the sigmoid in float32 rounded
        to dtype, the product rounded again."""
        gated = rounded(1.0 / (1.0 + tl.exp(-gate.to(tl.float32))), dtype).to(tl.float32)
        return rounded(x.to(tl.float32) * gated, dtype)
