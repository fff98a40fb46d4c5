"""DFlash2's grouped dynamic causal convolution (runtime/drafters/dflash2.py DynamicConv), in float32:

    out[b, t, c] = sum_{j < K} base[j, c] · z[b, t - j, c] + dynamic[b, t, j, c // group_size] · z[b, t - j, c]

added in tap order j = 0, 1, ..., each product and each sum rounded to float32 (as torch's ops round them), rows
t - j < 0 of a block reading zero, rounded once to z's dtype at the end. `dynamic` is one side of the coefficients
[B, T, 2, K, G] a projection gives (`side` 0 before the sublayer, 1 after it). One kernel instead of a loop of ~15
small torch ops (four convolutions per drafter layer, inside a CUDA graph), which reads the coefficients in their
projection's dtype (bf16 on the GPU) and widens them in registers, not in a float32 copy. On the GPU z and the
coefficients may each be a split-K product's partials (linear.SplitSums: o_proj's or down_proj's output, the kernel
projection's), which the kernel adds as it reads them, in split order, rounded to the product's dtype: the bits of
summing first (linear.SplitSums.summed), without the sum's launch.

Elementwise, so batch-invariant by construction: an output element's bits depend on its own channel of its own
sequence's rows t - K + 1 .. t alone, never on the other sequences or on where its row sits in the grid. The GPU
kernel is compiled without FMA contraction, so its products and sums round as the reference's do: the same bits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.linear import SplitSums, planes_of
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    launch_options,
    require_triton,
    rounded,
    summed_values,
    tl,
    triton,
)

BLOCK = 512  # channels per program: B·T is 8..128 rows, so a narrow block spreads them over more SMs


def dynamic_conv(
    z: Tensor | SplitSums, coefficients: Tensor | SplitSums, side: int, base: Tensor, group_size: int, block: int
) -> Tensor:
    """z [B, T, H] (a block of T rows per sequence; or its product's partials over the B·T rows), coefficients
    [B, T, 2·K·G] (or partials over the rows), base [K, H] float32: the convolution of z by `side`'s coefficients."""
    if isinstance(z, SplitSums) or isinstance(coefficients, SplitSums) or z.is_cuda:
        return dynamic_conv_triton(z, coefficients, side, base, group_size, block)
    return dynamic_conv_reference(z, coefficients, side, base, group_size)


def dynamic_conv_reference(z: Tensor, coefficients: Tensor, side: int, base: Tensor, group_size: int) -> Tensor:
    taps = base.shape[0]
    dynamic = coefficients.view(*z.shape[:2], 2, taps, -1)[:, :, side]
    values = z.float()
    out = torch.zeros_like(values)
    for j in range(taps):
        shifted = values if j == 0 else torch.nn.functional.pad(values[:, :-j], (0, 0, j, 0))
        out = out + base[j] * shifted
        out = out + dynamic[:, :, j].float().repeat_interleave(group_size, dim=-1) * shifted
    return out.to(z.dtype)


def _rows(x: Tensor | SplitSums, width: int) -> tuple[Tensor, int, int]:
    """(the first plane as [rows, width] with unit column stride, the plane's elements apart, the splits)."""
    plane, apart, splits = planes_of(x)
    rows = plane.reshape(-1, width)
    if rows.stride(-1) != 1 or rows.stride(0) != width:
        raise ValueError(f"dynamic_conv: a product of rows {list(rows.shape)} with strides {rows.stride()}")
    return rows, apart, splits


def dynamic_conv_triton(
    z: Tensor | SplitSums, coefficients: Tensor | SplitSums, side: int, base: Tensor, group_size: int, block: int
) -> Tensor:
    require_triton("dynamic_conv")
    taps, width = base.shape
    dtype = z.dtype
    z_rows, z_plane, z_splits = _rows(z if isinstance(z, SplitSums) else z.contiguous(), width)
    coefficient_width = 2 * taps * (width // group_size)
    c_rows, c_plane, c_splits = _rows(coefficients, coefficient_width)
    rows = z_rows.shape[0]
    if c_rows.shape[0] != rows or rows % block or (c_splits and coefficients.dtype != dtype):
        raise ValueError(
            f"dynamic_conv: z of {rows} rows ({dtype}), coefficients {list(c_rows.shape)} ({coefficients.dtype}), "
            f"blocks of {block}"
        )
    base = base if base.stride(-1) == 1 else base.contiguous()
    out = torch.empty(rows, width, dtype=dtype, device=z_rows.device)
    if out.numel():
        _dynamic_conv_kernel[(rows, triton.cdiv(width, BLOCK))](
            z_rows,
            c_rows,
            base,
            out,
            block,
            width,
            coefficient_width,
            side * taps * (width // group_size),
            base.stride(0),
            z_plane,
            c_plane,
            TAPS=taps,
            GROUP=group_size,
            Z_SPLITS=z_splits,
            C_SPLITS=c_splits,
            BLOCK=BLOCK,
            enable_fp_fusion=False,  # a product and its sum round apart, as the reference's ops do
            **launch_options(),
        )
    return out.view(rows // block, block, width)


if triton is not None:

    @triton.jit(do_not_specialize_on_alignment=["z_ptr", "coefficients_ptr", "base_ptr", "out_ptr"])
    def _dynamic_conv_kernel(
        z_ptr,
        coefficients_ptr,
        base_ptr,
        out_ptr,
        block,
        width,
        coefficient_width,
        side_offset,
        base_stride,
        z_plane,
        coefficient_plane,
        TAPS: tl.constexpr,
        GROUP: tl.constexpr,
        Z_SPLITS: tl.constexpr,
        C_SPLITS: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        t = row % block
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        dtype = out_ptr.dtype.element_ty
        coefficients = row * coefficient_width + side_offset + cols // GROUP
        total = tl.zeros([BLOCK], tl.float32)
        for j in tl.static_range(TAPS):
            # row t - j of this sequence's block, or zeros before its first row (one vector comparison: the
            # interpreter gives `vector & scalar` masks an integer dtype that its loads refuse)
            present = cols < tl.where(t >= j, width, 0)
            z = summed_values(z_ptr, (row - j) * width + cols, present, z_plane, Z_SPLITS, dtype).to(tl.float32)
            w = tl.load(base_ptr + j * base_stride + cols, mask=inside, other=0.0).to(tl.float32)
            d = summed_values(
                coefficients_ptr, coefficients + j * (width // GROUP), inside, coefficient_plane, C_SPLITS, dtype
            ).to(tl.float32)
            total += w * z
            total += d * z
        tl.store(out_ptr + row * width + cols, rounded(total, dtype), mask=inside)
