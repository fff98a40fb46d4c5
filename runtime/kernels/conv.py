"""DFlash2's grouped dynamic causal convolution (runtime/drafters/dflash2.py DynamicConv), in float32:

    out[b, t, c] = sum_{j < K} base[j, c] · z[b, t - j, c] + dynamic[b, t, j, c // group_size] · z[b, t - j, c]

added in tap order j = 0, 1, ..., each product and each sum rounded to float32 (as torch's ops round them), rows
t - j < 0 of a block reading zero, rounded once to z's dtype at the end. One kernel instead of a loop of ~15 small
torch ops (four convolutions per drafter layer, inside a CUDA graph), which reads the coefficients in their
projection's dtype (bf16 on the GPU; a strided view of its output) and widens them in registers, not in a float32
copy.

Elementwise, so batch-invariant by construction: an output element's bits depend on its own channel of its own
sequence's rows t - K + 1 .. t alone, never on the other sequences or on where its row sits in the grid. The GPU
kernel is compiled without FMA contraction, so its products and sums round as the reference's do: the same bits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    launch_options,
    require_triton,
    rounded,
    tl,
    triton,
)

BLOCK = 512  # channels per program: B·T is 8..128 rows, so a narrow block spreads them over more SMs


def dynamic_conv(z: Tensor, dynamic: Tensor, base: Tensor, group_size: int) -> Tensor:
    """z [B, T, H] (a block per sequence), dynamic [B, T, K, H / group_size] (any strides), base [K, H] float32."""
    if z.is_cuda:
        return dynamic_conv_triton(z, dynamic, base, group_size)
    return dynamic_conv_reference(z, dynamic, base, group_size)


def dynamic_conv_reference(z: Tensor, dynamic: Tensor, base: Tensor, group_size: int) -> Tensor:
    values = z.float()
    out = torch.zeros_like(values)
    for j in range(base.shape[0]):
        shifted = values if j == 0 else torch.nn.functional.pad(values[:, :-j], (0, 0, j, 0))
        out = out + base[j] * shifted
        out = out + dynamic[:, :, j].float().repeat_interleave(group_size, dim=-1) * shifted
    return out.to(z.dtype)


def dynamic_conv_triton(z: Tensor, dynamic: Tensor, base: Tensor, group_size: int) -> Tensor:
    require_triton("dynamic_conv")
    batch, block, width = z.shape
    taps = base.shape[0]
    if dynamic.shape != (batch, block, taps, width // group_size) or base.shape != (taps, width):
        raise ValueError(f"dynamic_conv: z {list(z.shape)}, dynamic {list(dynamic.shape)}, base {list(base.shape)}")
    z = z if z.stride(-1) == 1 else z.contiguous()
    base = base if base.stride(-1) == 1 else base.contiguous()
    out = torch.empty(z.shape, dtype=z.dtype, device=z.device)
    if out.numel():
        _dynamic_conv_kernel[(batch * block, triton.cdiv(width, BLOCK))](
            z,
            dynamic,
            base,
            out,
            block,
            width,
            z.stride(0),
            z.stride(1),
            *dynamic.stride(),
            base.stride(0),
            TAPS=taps,
            GROUP=group_size,
            BLOCK=BLOCK,
            enable_fp_fusion=False,  # a product and its sum round apart, as the reference's ops do
            **launch_options(),
        )
    return out


if triton is not None:

    @triton.jit(do_not_specialize_on_alignment=["z_ptr", "dynamic_ptr", "base_ptr", "out_ptr"])
    def _dynamic_conv_kernel(
        z_ptr,
        dynamic_ptr,
        base_ptr,
        out_ptr,
        block,
        width,
        z_batch_stride,
        z_row_stride,
        dynamic_batch_stride,
        dynamic_row_stride,
        dynamic_tap_stride,
        dynamic_group_stride,
        base_stride,
        TAPS: tl.constexpr,
        GROUP: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        sequence, t = row // block, row % block
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        coefficients = dynamic_ptr + sequence * dynamic_batch_stride + t * dynamic_row_stride
        total = tl.zeros([BLOCK], tl.float32)
        for j in tl.static_range(TAPS):
            # row t - j of this sequence's block, or zeros before its first row (one vector comparison: the
            # interpreter gives `vector & scalar` masks an integer dtype that its loads refuse)
            present = cols < tl.where(t >= j, width, 0)
            z = tl.load(z_ptr + sequence * z_batch_stride + (t - j) * z_row_stride + cols, mask=present, other=0.0)
            z = z.to(tl.float32)
            w = tl.load(base_ptr + j * base_stride + cols, mask=inside, other=0.0).to(tl.float32)
            d = tl.load(
                coefficients + j * dynamic_tap_stride + (cols // GROUP) * dynamic_group_stride, mask=inside, other=0.0
            ).to(tl.float32)
            total += w * z
            total += d * z
        tl.store(out_ptr + row * width + cols, rounded(total, out_ptr.dtype.element_ty), mask=inside)
