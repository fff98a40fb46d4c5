"""FP8 E4M3 weights: ModelOpt per-tensor scale and Qwen/transformers 128×128 block scales (formats.md §2.1, §4).

Both layouts store `.weight` as F8_E4M3 plus a float multiplier, and W = float(weight) · scale, where the scale
is amax/448 of the whole tensor (ModelOpt `.weight_scale`, F32 scalar) or of each block (`.weight_scale_inv`,
[ceil(rows/128), ceil(cols/128)], edge blocks partial; despite its name it holds the multiplier, not its
inverse). Tensors are [..., rows, cols]; math runs in float32 on the input's device and gives the same bits
on CPU and CUDA.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from specpair.errors import BadInput

E4M3_MAX = 448.0
WEIGHT = ".weight"
# Layout label (formats/layouts.py) -> the scale tensor stored beside `.weight`; the layouts differ only in it.
SCALE_SUFFIX = {"fp8-tensor": ".weight_scale", "fp8-block": ".weight_scale_inv"}
BLOCK = (128, 128)


def to_e4m3(x: Tensor) -> Tensor:
    """float -> float8_e4m3fn: round to nearest even, saturating at ±448.

    torch's own cast rounds to nearest even, but past 448 torch 2.11 gives NaN (CPU and CUDA) where 2.13's CPU
    saturates, so clamp first, as every reference does.
    """
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def true_divide(x: Tensor, divisor: float) -> Tensor:
    """x / divisor, correctly rounded on every device: CUDA divides by a Python number through its reciprocal
    (two roundings), so divide by a tensor on x's device instead."""
    return x / torch.tensor(divisor, dtype=x.dtype, device=x.device)


def quantize_per_tensor(w: Tensor, name: str = "weight", amax: float | None = None) -> dict[str, Tensor]:
    """ModelOpt FP8: one scale amax/448 for the tensor; `{".weight": F8_E4M3, ".weight_scale": F32 []}`.
    `amax` is the whole tensor's when `w` is a slice of its rows."""
    w = _float_matrix(w, name)
    scale = _scale_for(w.abs().amax() if amax is None else torch.tensor(amax, device=w.device), name)
    return {WEIGHT: to_e4m3(w / scale), SCALE_SUFFIX["fp8-tensor"]: scale}


def quantize_block(
    w: Tensor, block: tuple[int, int] = BLOCK, scale_dtype: torch.dtype = torch.float32, name: str = "weight"
) -> dict[str, Tensor]:
    """Qwen FP8: a scale amax/448 per block; `{".weight": F8_E4M3, ".weight_scale_inv": scale_dtype}`.

    Qwen's FP8 repos store BF16 scales. The weight is divided by the scale as stored (rounded to `scale_dtype`),
    the one a dequantizer multiplies by; where rounding lowered it, the block's largest values clamp at 448.
    """
    w = _float_matrix(w, name)
    rows, cols = w.shape[-2:]
    block_rows, block_cols = block
    padded = F.pad(w, (0, -cols % block_cols, 0, -rows % block_rows))  # zeros leave each block's amax alone
    tiles = padded.unflatten(-1, (-1, block_cols)).unflatten(-3, (-1, block_rows))  # [..., R, br, C, bc]
    scale = _scale_for(tiles.abs().amax(dim=(-3, -1)), name).to(scale_dtype)
    q = to_e4m3(tiles / scale.float()[..., :, None, :, None])
    return {WEIGHT: q.flatten(-2).flatten(-3, -2)[..., :rows, :cols].contiguous(), SCALE_SUFFIX["fp8-block"]: scale}


def dequantize(parts: dict[str, Tensor], block: tuple[int, int] = BLOCK, module: str = "") -> Tensor:
    """float32 weight from either layout, told apart by which scale tensor is present.

    `parts` maps suffixes to tensors; `module` (the tensors' name without the suffix) names them in errors.
    `block` is the checkpoint's `weight_block_size`, used by the block layout only.
    """
    weight = parts.get(WEIGHT)
    if weight is None:
        raise BadInput(_name(module, WEIGHT), "missing")
    present = [layout for layout, suffix in SCALE_SUFFIX.items() if suffix in parts]
    if len(present) != 1:
        raise BadInput(
            _name(module, WEIGHT),
            f"needs exactly one of {' or '.join(SCALE_SUFFIX.values())} beside it, found {len(present)}",
        )
    if weight.dtype != torch.float8_e4m3fn or weight.ndim < 2:
        raise BadInput(_name(module, WEIGHT), f"expected a F8_E4M3 matrix, got {weight.dtype} {list(weight.shape)}")
    suffix = SCALE_SUFFIX[present[0]]
    scale = parts[suffix]
    if not scale.is_floating_point():
        raise BadInput(_name(module, suffix), f"expected a float scale, got {scale.dtype}")
    if present[0] == "fp8-tensor":
        if scale.numel() != 1:
            raise BadInput(_name(module, suffix), f"expected one per-tensor scale, got shape {list(scale.shape)}")
        return weight.float() * scale.float().reshape(())
    rows, cols = weight.shape[-2:]
    expected = (*weight.shape[:-2], math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale.shape) != expected:
        raise BadInput(
            _name(module, suffix),
            f"shape {list(scale.shape)} does not fit weight {list(weight.shape)} "
            f"in {block[0]}×{block[1]} blocks (expected {list(expected)})",
        )
    per_element = scale.float().repeat_interleave(block[0], -2)[..., :rows, :].repeat_interleave(block[1], -1)
    return weight.float() * per_element[..., :cols]


def _scale_for(amax: Tensor, name: str) -> Tensor:
    if not torch.isfinite(amax).all():  # amax carries any NaN or inf through
        raise BadInput(name, "has NaN or infinite values")
    # An all-zero tensor or block gets scale 1 (as transformers does), so the division stays finite.
    return torch.where(amax > 0, true_divide(amax, E4M3_MAX), 1.0)


def _float_matrix(w: Tensor, name: str) -> Tensor:
    if w.ndim < 2 or w.numel() == 0 or not w.is_floating_point():
        raise BadInput(name, f"expected a non-empty float matrix, got {w.dtype} {list(w.shape)}")
    return w.float()


def _name(module: str, suffix: str) -> str:
    return f"{module}{suffix}" if module else suffix.lstrip(".")
