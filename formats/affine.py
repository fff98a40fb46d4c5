"""MLX group-wise affine layout (`affine{bits}-g{group}`): quantize, dequantize, and the packed bit stream.

Stored triple per quantized tensor `w` of shape [..., cols]:
  weight  uint32 [..., cols·bits/32]  codes q in 0..2^bits-1, each row one little-endian LSB-first bit stream
                                      (code i at bits [i·bits, (i+1)·bits)), so 3/5/6-bit codes straddle words;
  scales  [..., cols/group]           in the model dtype;
  biases  [..., cols/group]           in the model dtype;
and W = scales·q + biases per group of `group` consecutive values of a row.

Two quantizers fill the same triple:
  "mlx"     `mx.quantize` bit for bit: the larger-magnitude group edge is kept exact (bias = that edge, the
            scale may be negative), eps 1e-7; codes use the float32 scale, which is then rounded to the dtype.
            At 1 bit mlx 0.32.4 uses plain min/max instead (bias = min, scale = max(max-min, 1e-7)).
  "minmax"  TensorFold's affine-4 rule (its `quantize4`), generalized from 4 bits / groups of 64 to any
            bits and group: scale = dtype(max((max-min)/(2^bits-1), 1e-8)), bias = dtype(min), codes from
            those rounded values.
Both compute in float32 from the input's values and round half to even. `dequantize` returns the float32
value of the triple; `mx.dequantize` given bf16 scales computes in bf16 instead, bf16(bf16(s·q) + b).
"""

from __future__ import annotations

import torch

from specpair.errors import BadInput

BITS = (1, 2, 3, 4, 5, 6, 8)  # what mlx 0.32.4 quantizes and dequantizes (it refuses 7)
GROUP_SIZES = (32, 64, 128)  # what MLX readers accept; each keeps a row a whole number of words
METHODS = ("mlx", "minmax")

MLX_EPS = 1e-7
MINMAX_EPS = 1e-8
WORD_MASK = 0xFFFFFFFF
CHUNK_ELEMENTS = 1 << 22  # rows are quantized in slices of about this many values to bound float32 temporaries


def quantize(
    w: torch.Tensor,
    bits: int,
    group_size: int,
    method: str = "mlx",
    dtype: torch.dtype = torch.bfloat16,
    name: str = "tensor",
) -> dict[str, torch.Tensor]:
    """{"weight" uint32, "scales" dtype, "biases" dtype} for `w` [..., cols]; `name` is the tensor's name for errors.

    With `method="mlx"` and `dtype=w.dtype` the result equals `mx.quantize(w, group_size, bits)`.
    """
    _check_layout(bits, group_size, name)
    if method not in METHODS:
        raise BadInput(name, f"unknown affine quantizer {method!r}; expected one of {', '.join(METHODS)}")
    if not w.is_floating_point() or not dtype.is_floating_point:
        raise BadInput(name, f"affine quantization needs floating-point values and dtype, got {w.dtype} -> {dtype}")
    if w.ndim < 2:
        raise BadInput(name, f"affine quantization needs a matrix (or a stack of them), got shape {tuple(w.shape)}")
    cols = w.shape[-1]
    if cols == 0 or cols % group_size:
        raise BadInput(name, f"rows of {cols} values do not split into groups of {group_size}")

    rows = w.reshape(-1, cols)
    groups = cols // group_size
    words = torch.empty(rows.shape[0], cols * bits // 32, dtype=torch.uint32, device=w.device)
    scales = torch.empty(rows.shape[0], groups, dtype=dtype, device=w.device)
    biases = torch.empty_like(scales)
    step = max(1, CHUNK_ELEMENTS // cols)
    for start in range(0, rows.shape[0], step):
        chunk = rows[start : start + step].float().reshape(-1, groups, group_size)
        if not torch.isfinite(chunk).all():
            raise BadInput(name, "has NaN or infinite values; affine quantization needs finite weights")
        if method == "mlx":
            codes, scale, bias = _mlx_groups(chunk, bits)
        else:
            codes, scale, bias = _minmax_groups(chunk, bits, dtype)
        words[start : start + step] = pack_codes(codes.reshape(-1, cols), bits, name)
        scales[start : start + step] = scale.to(dtype)
        biases[start : start + step] = bias.to(dtype)
    lead = w.shape[:-1]
    return {
        "weight": words.reshape(*lead, -1),
        "scales": scales.reshape(*lead, groups),
        "biases": biases.reshape(*lead, groups),
    }


def dequantize(parts: dict[str, torch.Tensor], bits: int, group_size: int, name: str = "tensor") -> torch.Tensor:
    """float32 [..., cols] from the stored triple: scales·q + biases, group by group.

    `weight` may be uint32 or int32 (the same 32 bits); scales and biases any float dtype.
    """
    _check_layout(bits, group_size, name)
    missing = [key for key in ("weight", "scales", "biases") if key not in parts]
    if missing:
        raise BadInput(name, f"affine tensor lacks its {' and '.join(missing)}")
    words, scales, biases = parts["weight"], parts["scales"], parts["biases"]
    codes = unpack_codes(words, bits, name)
    cols = codes.shape[-1]
    if cols % group_size:
        raise BadInput(name, f"rows of {cols} values do not split into groups of {group_size}")
    expected = (*words.shape[:-1], cols // group_size)
    for key, companion in (("scales", scales), ("biases", biases)):
        if tuple(companion.shape) != expected:
            raise BadInput(
                name,
                f"{key} shape {tuple(companion.shape)} does not fit weight {tuple(words.shape)}: "
                f"{bits}-bit codes in groups of {group_size} need {expected}",
            )
        if not companion.is_floating_point():
            raise BadInput(name, f"{key} are {companion.dtype}, not floating point")
    grouped = codes.reshape(*expected, group_size).float()
    return (grouped * scales.float()[..., None] + biases.float()[..., None]).reshape(codes.shape)


def pack_codes(codes: torch.Tensor, bits: int, name: str = "tensor") -> torch.Tensor:
    """uint32 [..., cols·bits/32] from integer codes [..., cols]: each row one LSB-first bit stream.

    32 codes fill exactly `bits` words, so each block of 32 is packed with the same fixed shifts.
    """
    cols = codes.shape[-1]
    if cols % 32:
        raise BadInput(name, f"rows of {cols} codes do not fill whole 32-bit words in blocks of 32")
    blocks = codes.reshape(*codes.shape[:-1], cols // 32, 32).to(torch.int64)
    words = torch.zeros(*blocks.shape[:-1], bits, dtype=torch.int64, device=codes.device)
    for position in range(32):
        word, shift = divmod(position * bits, 32)
        code = blocks[..., position]
        words[..., word] |= (code << shift) & WORD_MASK
        if shift + bits > 32:  # the code's high bits open the next word
            words[..., word + 1] |= code >> (32 - shift)
    signed = (words ^ 0x80000000) - 0x80000000  # same 32 bits as int32, so the narrowing cast is exact
    return signed.to(torch.int32).view(torch.uint32).reshape(*codes.shape[:-1], cols * bits // 32)


def unpack_codes(words: torch.Tensor, bits: int, name: str = "tensor") -> torch.Tensor:
    """uint8 codes [..., words·32/bits] from packed uint32 (or int32) words [..., words]."""
    if words.dtype not in (torch.uint32, torch.int32):
        raise BadInput(name, f"packed affine weight is {words.dtype}, expected 32-bit words (uint32)")
    count = words.shape[-1] if words.ndim else 0
    if count == 0 or count % bits:
        raise BadInput(name, f"a row of {count} words does not hold whole blocks of 32 {bits}-bit codes")
    blocks = (words.view(torch.int32).to(torch.int64) & WORD_MASK).reshape(*words.shape[:-1], count // bits, bits)
    codes = torch.empty(*blocks.shape[:-1], 32, dtype=torch.uint8, device=words.device)
    mask = (1 << bits) - 1
    for position in range(32):
        word, shift = divmod(position * bits, 32)
        code = blocks[..., word] >> shift
        if shift + bits > 32:
            code |= blocks[..., word + 1] << (32 - shift)
        codes[..., position] = code & mask
    return codes.reshape(*words.shape[:-1], count * 32 // bits)


def _mlx_groups(groups: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mlx's CPU `quantize` kernel in torch ops: same float32 operations in the same order."""
    top = float((1 << bits) - 1)
    low, high = groups.amin(-1), groups.amax(-1)
    step = ((high - low) / _on_device(top, groups)).clamp_min(MLX_EPS)
    if bits == 1:  # mlx keeps plain min/max: codes 0/1 land on the two edges
        # the bias is the group's first minimal element, as mlx's scan keeps it (it decides the sign of a zero)
        first_low = (groups == low[..., None]).to(torch.uint8).argmax(-1, keepdim=True)
        scale, bias = step, groups.gather(-1, first_low).squeeze(-1)
    else:
        scale, bias = _exact_edge(low, high, step)
    codes = torch.round((groups - bias[..., None]) / scale[..., None]).clamp(0, top)
    return codes.to(torch.uint8), scale, bias


def _exact_edge(low: torch.Tensor, high: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mlx's (scale, bias) for 2+ bits: the larger-magnitude edge becomes the bias and is hit exactly."""
    low_is_larger = low.abs() > high.abs()
    scale = torch.where(low_is_larger, step, -step)  # negative when the top edge is kept: codes still start at 0
    edge = torch.where(low_is_larger, low, high)
    edge_code = torch.round(edge / scale)
    exact_edge = edge_code != 0  # 0 only for an all-zero (or sub-eps) group
    scale = torch.where(exact_edge, edge / edge_code, scale)
    bias = torch.where(exact_edge, edge, torch.zeros_like(edge))
    return scale, bias


def _minmax_groups(
    groups: torch.Tensor, bits: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TensorFold's quantize4 rule: codes come from the scale and bias already rounded to the stored dtype."""
    top = float((1 << bits) - 1)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / _on_device(top, groups)).clamp_min(MINMAX_EPS).to(dtype).float()
    bias = low.to(dtype).float()
    codes = torch.round((groups - bias[..., None]) / scale[..., None]).clamp(0, top)
    return codes.to(torch.uint8), scale, bias


def _on_device(value: float, like: torch.Tensor) -> torch.Tensor:
    """`value` as a float32 tensor beside `like`: CUDA divides by a Python number by multiplying with its
    reciprocal, which rounds differently from a true division (and from mlx) often enough to flip ties."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _check_layout(bits: int, group_size: int, name: str) -> None:
    if bits not in BITS:
        raise BadInput(name, f"{bits}-bit affine codes are not an MLX layout; bits must be one of {BITS}")
    if group_size not in GROUP_SIZES:
        raise BadInput(name, f"affine group size {group_size} is not an MLX layout; it must be one of {GROUP_SIZES}")
