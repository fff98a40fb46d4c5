"""NVFP4: E2M1 codes in blocks of 16 with an E4M3 block scale and a float32 per-tensor scale (formats.md §0, §2).

W[r, c] = E2M1[code] · E4M3(block_scale[r, c // 16]) · global_scale. One in-memory form, `Nvfp4` (ModelOpt's
bits), and four stored flavours (ModelOpt, compressed-tensors, MLX, GGUF) that differ only in names, nibble and
scale grouping and how they store the per-tensor factor. Codes and block scales move between flavours as bits,
never through float. The per-tensor factor is one float32 number that CT stores inverted and MLX times 2688:
MLX's form gives back every global scale the quantizer makes (amax/2688); CT's reciprocal cannot hold about
12% of them (no float32 can), which come back one ulp off.
Tensors are [..., rows, cols]; math runs in float32 on the input's device and gives the same bits on CPU and
CUDA. Bit views assume a little-endian host, as MLX's uint32 words do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.errors import BadInput
from specpair.formats.fp8 import E4M3_MAX, true_divide

BLOCK = 16
GGUF_BLOCK = 64  # 4 sub-blocks of 16 in 36 bytes: 4 scale bytes, then 32 bytes of nibbles
GGUF_BLOCK_BYTES = 36
E2M1_MAX = 6.0
MLX_GLOBAL_FACTOR = E2M1_MAX * E4M3_MAX  # MLX's global_scale is amax-like: its factor is global_scale / 2688
MIN_BLOCK_SCALE = 2.0**-9  # smallest E4M3 subnormal
MAX_UE4M3 = 0x7E  # GGUF's block scales are E4M3 without the sign; 0x7F would be E4M3's NaN

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # code & 7; bit 3 is the sign (code 8 is -0)
E2M1_VALUES = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES))
# Rounding to nearest, ties to the even code: a magnitude on a midpoint rounds down at 0.25, 1.25, 2.5, 5
# (the code below is even) and up at 0.75, 1.75, 3.5 (the code above is even), as ModelOpt and CT round.
_MIDPOINTS = [(low + high) / 2 for low, high in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:])]
_TIES_DOWN, _TIES_UP = _MIDPOINTS[0::2], _MIDPOINTS[1::2]


@dataclass(frozen=True)
class Nvfp4:
    """One NVFP4 weight. `codes` uint8 [..., rows, cols/2] with element 2i in the low nibble and 2i+1 in the high;
    `block_scales` uint8 [..., rows, cols/16] holding E4M3 bits; `global_scale` float32 [] (ModelOpt's
    weight_scale_2); `input_scale` float32 [] or None, the activation scale of W4A4 checkpoints."""

    codes: Tensor
    block_scales: Tensor
    global_scale: Tensor
    input_scale: Tensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.codes.shape[:-1], self.codes.shape[-1] * 2)


def quantize(w: Tensor, global_amax: float | Tensor | None = None, name: str = "weight") -> Nvfp4:
    """ModelOpt's dynamic NVFP4 rule, bit for bit (NVFP4QTensor.quantize(w, 16)).

    global_scale = amax/2688 (`global_amax` replaces the tensor's amax for calibrated checkpoints);
    block scale = block amax/(6·global_scale), 0 -> 1, clamped to [2^-9, 448], cast to E4M3;
    code = E2M1 round-half-even of w/(block scale·global_scale). An all-zero tensor gets global_scale 1
    (ModelOpt would divide 0 by 0 and store NaN scales).
    """
    if w.ndim < 2 or w.numel() == 0 or not w.is_floating_point():
        raise BadInput(name, f"expected a non-empty float matrix, got {w.dtype} {list(w.shape)}")
    _check_block_multiple(w.shape[-1], BLOCK, name)
    blocks = w.float().unflatten(-1, (-1, BLOCK))
    block_amax = blocks.abs().amax(-1)
    if not torch.isfinite(block_amax).all():  # amax carries any NaN or inf through
        raise BadInput(name, "has NaN or infinite values")
    amax = (
        block_amax.amax() if global_amax is None else torch.as_tensor(global_amax, dtype=torch.float32, device=w.device)
    )
    if amax.numel() != 1:
        raise BadInput(name, f"global amax must be one number, got shape {list(amax.shape)}")
    if not torch.isfinite(amax) or amax < 0:
        raise BadInput(name, f"global amax must be finite and ≥ 0, got {amax.item()}")
    global_scale = torch.where(amax > 0, true_divide(amax, MLX_GLOBAL_FACTOR), 1.0).reshape(())
    block_scales = block_amax / (E2M1_MAX * global_scale)
    block_scales = torch.where(block_scales == 0, 1.0, block_scales).clamp(MIN_BLOCK_SCALE, E4M3_MAX)
    block_scales = block_scales.to(torch.float8_e4m3fn)
    # Divide by the product of the two scales (not by each in turn): ModelOpt's rounding, kept for equal bits.
    scaled = blocks / (block_scales.float() * global_scale).unsqueeze(-1)
    return Nvfp4(pack(_round_e2m1(scaled).flatten(-2)), block_scales.view(torch.uint8), global_scale)


def dequantize(q: Nvfp4) -> Tensor:
    """float32 [..., rows, cols]. Multiplies the block scale by the global scale first, as ModelOpt and MLX do."""
    values = E2M1_VALUES.to(q.codes.device)[unpack(q.codes).long()]
    scales = q.block_scales.view(torch.float8_e4m3fn).float() * q.global_scale
    return (values.unflatten(-1, (-1, BLOCK)) * scales.unsqueeze(-1)).flatten(-2)


def pack(codes: Tensor) -> Tensor:
    """uint8 codes [..., n] -> [..., n/2], element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: Tensor) -> Tensor:
    """uint8 [..., n/2] -> codes [..., n]."""
    return torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2)


def _round_e2m1(x: Tensor) -> Tensor:
    magnitude = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for midpoint in _TIES_DOWN:  # the code counts the midpoints below the magnitude...
        code += magnitude > midpoint
    for midpoint in _TIES_UP:  # ...and those it sits on where the tie goes up
        code += magnitude >= midpoint
    return code | ((x < 0).to(torch.uint8) << 3)  # ModelOpt's sign: negatives that round to 0 keep it (-0)


# What each flavour stores beside the module name: role -> (suffix, dtype). GGUF keeps block scales inside
# its weight blocks; MLX has no activation scale (it runs NVFP4 weight-only), so to_mlx leaves input_scale out.
STORED: dict[str, dict[str, tuple[str, torch.dtype]]] = {
    "nvfp4-modelopt": {
        "codes": (".weight", torch.uint8),
        "block_scales": (".weight_scale", torch.float8_e4m3fn),
        "global_scale": (".weight_scale_2", torch.float32),
        "input_scale": (".input_scale", torch.float32),
    },
    "nvfp4-ct": {
        "codes": (".weight_packed", torch.uint8),
        "block_scales": (".weight_scale", torch.float8_e4m3fn),
        "global_scale": (".weight_global_scale", torch.float32),
        "input_scale": (".input_global_scale", torch.float32),
    },
    "nvfp4-mlx": {
        "codes": (".weight", torch.uint32),
        "block_scales": (".scales", torch.uint8),
        "global_scale": (".global_scale", torch.float32),
    },
    "nvfp4-gguf": {
        "codes": (".weight", torch.uint8),
        "global_scale": (".scale", torch.float32),
        "input_scale": (".input_scale", torch.float32),
    },
}


def to_modelopt(q: Nvfp4, module: str = "") -> dict[str, Tensor]:
    """`.weight` U8, `.weight_scale` F8_E4M3, `.weight_scale_2` F32 [], `.input_scale` F32 [] if any.

    (`module` is unused: ModelOpt's layout is the in-memory one, so nothing can fail; every to_* takes it.)
    """
    return _stored(
        "nvfp4-modelopt",
        codes=q.codes,
        block_scales=q.block_scales.view(torch.float8_e4m3fn),
        global_scale=q.global_scale.reshape(()),
        input_scale=_reshape(q.input_scale, ()),
    )


def from_modelopt(parts: dict[str, Tensor], module: str = "") -> Nvfp4:
    codes, block_scales = _codes_and_scales(parts, "nvfp4-modelopt", module, codes_per_unit=2)
    return Nvfp4(
        codes,
        block_scales,
        _scalar(parts, "nvfp4-modelopt", "global_scale", module),
        _scalar(parts, "nvfp4-modelopt", "input_scale", module, required=False),
    )


def to_ct(q: Nvfp4, module: str = "") -> dict[str, Tensor]:
    """compressed-tensors nvfp4-pack-quantized: `.weight_packed` U8, `.weight_scale` F8_E4M3,
    `.weight_global_scale` F32 [1] = 1/global_scale, `.input_global_scale` = 1/input_scale if any
    (what CT's ModelOptNvfp4Converter writes)."""
    global_scale = _finite(1 / q.global_scale, _name(module, ".weight_global_scale"))
    input_scale = None if q.input_scale is None else _finite(1 / q.input_scale, _name(module, ".input_global_scale"))
    return _stored(
        "nvfp4-ct",
        codes=q.codes,
        block_scales=q.block_scales.view(torch.float8_e4m3fn),
        global_scale=global_scale.reshape(1),
        input_scale=_reshape(input_scale, (1,)),
    )


def from_ct(parts: dict[str, Tensor], module: str = "") -> Nvfp4:
    codes, block_scales = _codes_and_scales(parts, "nvfp4-ct", module, codes_per_unit=2)
    input_global_scale = _scalar(parts, "nvfp4-ct", "input_scale", module, required=False)
    return Nvfp4(
        codes,
        block_scales,
        1 / _scalar(parts, "nvfp4-ct", "global_scale", module),
        None if input_global_scale is None else 1 / input_global_scale,
    )


def to_mlx(q: Nvfp4, module: str = "") -> dict[str, Tensor]:
    """MLX mode="nvfp4": `.weight` U32 [..., rows, cols/8] (the same bytes as little-endian words), `.scales` U8,
    and `.global_scale` F32 [] = global_scale·2688, left out when global_scale is 1 (MLX's default)."""
    global_scale = (
        None
        if q.global_scale == 1
        else _finite(q.global_scale * MLX_GLOBAL_FACTOR, _name(module, ".global_scale")).reshape(())
    )
    return _stored(
        "nvfp4-mlx",
        codes=q.codes.contiguous().view(torch.uint32),
        block_scales=q.block_scales,
        global_scale=global_scale,
    )


def from_mlx(parts: dict[str, Tensor], module: str = "") -> Nvfp4:
    codes, block_scales = _codes_and_scales(parts, "nvfp4-mlx", module, codes_per_unit=8)
    mlx_global = _scalar(parts, "nvfp4-mlx", "global_scale", module, required=False)
    global_scale = (
        torch.ones((), device=codes.device) if mlx_global is None else true_divide(mlx_global, MLX_GLOBAL_FACTOR)
    )
    return Nvfp4(codes.contiguous().view(torch.uint8), block_scales, global_scale)


def to_gguf(q: Nvfp4, module: str = "") -> dict[str, Tensor]:
    """GGUF NVFP4 (type 40): `.weight` U8 [..., rows, cols/64·36], each 64-element block its 4 UE4M3 scales then
    4×8 bytes where byte j of a 16-element sub-block holds element j low and j+8 high; `.scale` F32 [1] =
    global_scale, left out when 1 as llama.cpp does (readers take a missing one as 1), and `.input_scale` F32 [1]
    when there is one."""
    cols = q.shape[-1]
    _check_block_multiple(cols, GGUF_BLOCK, _name(module, ".weight"))
    if (q.block_scales > MAX_UE4M3).any():
        raise BadInput(_name(module, ".weight"), "has negative or NaN block scales, which GGUF's UE4M3 cannot hold")
    nibbles = unpack(q.codes).unflatten(-1, (-1, BLOCK))  # [..., cols/16, 16]
    sub_blocks = nibbles[..., :8] | (nibbles[..., 8:] << 4)  # [..., cols/16, 8]
    blocks = torch.cat((q.block_scales.unflatten(-1, (-1, 4)), sub_blocks.unflatten(-2, (-1, 4)).flatten(-2)), -1)
    global_scale = None if q.global_scale == 1 else q.global_scale.reshape(1)
    return _stored(
        "nvfp4-gguf", codes=blocks.flatten(-2), global_scale=global_scale, input_scale=_reshape(q.input_scale, (1,))
    )


def from_gguf(parts: dict[str, Tensor], module: str = "") -> Nvfp4:
    suffix = STORED["nvfp4-gguf"]["codes"][0]
    raw = _take(parts, "nvfp4-gguf", "codes", module)
    if raw.ndim < 2 or raw.shape[-1] == 0 or raw.shape[-1] % GGUF_BLOCK_BYTES:
        raise BadInput(_name(module, suffix), f"shape {list(raw.shape)} is not rows of {GGUF_BLOCK_BYTES}-byte blocks")
    blocks = raw.unflatten(-1, (-1, GGUF_BLOCK_BYTES))
    block_scales = blocks[..., :4].flatten(-2)
    if (block_scales > MAX_UE4M3).any():
        raise BadInput(_name(module, suffix), f"has block scale bytes above {MAX_UE4M3:#x}, which UE4M3 does not use")
    sub_blocks = blocks[..., 4:].unflatten(-1, (4, 8))  # [..., cols/64, 4, 8]
    nibbles = torch.cat((sub_blocks & 0xF, sub_blocks >> 4), -1).flatten(-3)
    global_scale = _scalar(parts, "nvfp4-gguf", "global_scale", module, required=False)
    return Nvfp4(
        pack(nibbles),
        block_scales.contiguous(),
        torch.ones((), device=raw.device) if global_scale is None else global_scale,
        _scalar(parts, "nvfp4-gguf", "input_scale", module, required=False),
    )


@dataclass(frozen=True)
class Flavour:
    to_parts: Callable[[Nvfp4, str], dict[str, Tensor]]
    from_parts: Callable[[dict[str, Tensor], str], Nvfp4]


# Layout label (formats/layouts.py) -> how to write and read it; `module` (the tensors' name without the
# suffix) names them in errors.
FLAVOURS: dict[str, Flavour] = {
    "nvfp4-modelopt": Flavour(to_modelopt, from_modelopt),
    "nvfp4-ct": Flavour(to_ct, from_ct),
    "nvfp4-mlx": Flavour(to_mlx, from_mlx),
    "nvfp4-gguf": Flavour(to_gguf, from_gguf),
}


def _stored(flavour: str, **tensors: Tensor | None) -> dict[str, Tensor]:
    names = STORED[flavour]
    return {names[role][0]: tensor for role, tensor in tensors.items() if tensor is not None}


def _take(parts: dict[str, Tensor], flavour: str, role: str, module: str, required: bool = True) -> Tensor | None:
    suffix, dtype = STORED[flavour][role]
    tensor = parts.get(suffix)
    if tensor is None:
        if required:
            raise BadInput(_name(module, suffix), "missing")
        return None
    if tensor.dtype != dtype:
        raise BadInput(_name(module, suffix), f"dtype {tensor.dtype}, expected {dtype}")
    return tensor


def _codes_and_scales(
    parts: dict[str, Tensor], flavour: str, module: str, codes_per_unit: int
) -> tuple[Tensor, Tensor]:
    """Packed codes and E4M3 scale bits, checked against each other; `codes_per_unit` codes per stored element."""
    codes = _take(parts, flavour, "codes", module)
    block_scales = _take(parts, flavour, "block_scales", module)
    codes_name, scales_name = (_name(module, STORED[flavour][role][0]) for role in ("codes", "block_scales"))
    if codes.ndim < 2 or codes.shape[-1] == 0:
        raise BadInput(codes_name, f"expected a non-empty matrix, got shape {list(codes.shape)}")
    cols = codes.shape[-1] * codes_per_unit
    _check_block_multiple(cols, BLOCK, codes_name)
    expected = (*codes.shape[:-1], cols // BLOCK)
    if tuple(block_scales.shape) != expected:
        raise BadInput(
            scales_name,
            f"shape {list(block_scales.shape)} does not fit {codes_name} "
            f"{list(codes.shape)} (expected {list(expected)})",
        )
    return codes, block_scales.view(torch.uint8)


def _scalar(parts: dict[str, Tensor], flavour: str, role: str, module: str, required: bool = True) -> Tensor | None:
    tensor = _take(parts, flavour, role, module, required)
    if tensor is None:
        return None
    name = _name(module, STORED[flavour][role][0])
    if tensor.numel() != 1 or tensor.ndim > 1:
        raise BadInput(name, f"expected one per-tensor value, got shape {list(tensor.shape)}")
    if not (torch.isfinite(tensor).all() and (tensor > 0).all()):
        raise BadInput(name, f"expected a finite positive scale, got {tensor.item()}")
    return tensor.reshape(())


def _check_block_multiple(cols: int, block: int, name: str) -> None:
    if cols % block:
        raise BadInput(name, f"{cols} columns is not a multiple of the {block}-element NVFP4 block")


def _finite(scale: Tensor, name: str) -> Tensor:
    if not torch.isfinite(scale).all():
        raise BadInput(name, "the per-tensor scale overflows float32 in this layout")
    return scale


def _reshape(scale: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    return None if scale is None else scale.reshape(shape)


def _name(module: str, suffix: str) -> str:
    return f"{module}{suffix}" if module else suffix.lstrip(".")
