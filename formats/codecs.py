"""One codec per weight layout: what a logical float tensor is stored as, and both directions.

A codec turns a float32 tensor [..., out, in] into its stored parts and back. Parts are keyed by suffix:
"" is the logical tensor's own name (float layouts, GGUF block data), any other key is appended to the
module name (the logical name without ".weight"), e.g. ".weight_scale". `stored` gives every part's dtype
and shape from the logical shape alone, so writers lay out headers before any data exists.
Dtypes are safetensors names, or a ggml type name for GGUF block data.

Lossless moves skip float entirely: a layout read and written unchanged keeps its stored bytes, and the four
NVFP4 flavours repack codes and scales as bits (`repack`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from specpair.errors import BadInput
from specpair.formats import affine, exl3, fp8, gguf_planes, gguf_quants, nvfp4
from specpair.formats.layouts import AFFINE, EXL3, FP8, GGUF, NVFP4, layout_of
from specpair.formats.regions import Grain

Stored = dict[str, tuple[str, tuple[int, ...]]]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "BOOL": torch.bool,
}
SAFETENSORS_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}
FLOAT_LAYOUTS = {"bf16": "BF16", "f16": "F16", "f32": "F32"}


@dataclass(frozen=True)
class Codec:
    layout: str
    bits: float  # bits per weight, scales included: orders layouts by precision
    stored: Callable[[tuple[int, ...]], Stored]
    # float32 on any device -> parts; `amax` is the whole tensor's when a slice of its rows is encoded
    encode: Callable[..., dict[str, Tensor]]
    decode: Callable[[dict[str, Tensor], tuple[int, ...], str], Tensor]  # parts -> float32
    rows_exact: bool  # row moves on the stored parts are exact (float and GGUF block layouts)
    tensor_amax: bool = False  # encoding needs the whole tensor's amax (one per-tensor scale)
    row_block: int = 1  # rows encode independently in groups of this many (FP8's 128x128 tiles)
    chunk_values: int = 1 << 18  # values encoded per call when a tensor goes by rows: cache-sized by default
    # how each stored part is cut by rows and columns (formats/regions.py), None for a per-tensor part; a layout
    # without the table is not cut (a tensor-parallel rank reads it whole)
    grains: dict[str, Grain | None] | None = None


def stored_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    if dtype in TORCH_DTYPES:
        return math.prod(shape) * TORCH_DTYPES[dtype].itemsize
    values, block_bytes = gguf_quants.block_size(dtype)
    return math.prod(shape) // values * block_bytes


def _float(layout: str) -> Codec:
    dtype = FLOAT_LAYOUTS[layout]
    torch_dtype = TORCH_DTYPES[dtype]
    return Codec(
        layout,
        torch_dtype.itemsize * 8,
        lambda shape: {"": (dtype, shape)},
        lambda w, name, amax=None: {"": w.to(torch_dtype)},
        lambda parts, shape, name: _only(parts, name).float(),
        rows_exact=True,
        grains={"": Grain()},
    )


def _fp8(layout: str) -> Codec:
    suffix = fp8.SCALE_SUFFIX[layout]
    if layout == "fp8-tensor":

        def stored(shape: tuple[int, ...]) -> Stored:
            return {".weight": ("F8_E4M3", shape), suffix: ("F32", ())}

        def encode(w: Tensor, name: str, amax: float | None = None) -> dict[str, Tensor]:
            return fp8.quantize_per_tensor(_matrix(w, name), name, amax)
    else:

        def stored(shape: tuple[int, ...]) -> Stored:
            grid = (*shape[:-2], -(-shape[-2] // fp8.BLOCK[0]), -(-shape[-1] // fp8.BLOCK[1]))
            return {".weight": ("F8_E4M3", shape), suffix: ("BF16", grid)}

        def encode(w: Tensor, name: str, amax: float | None = None) -> dict[str, Tensor]:
            # Qwen's official FP8 repos store BF16 block multipliers
            return fp8.quantize_block(_matrix(w, name), scale_dtype=torch.bfloat16, name=name)

    def decode(parts: dict[str, Tensor], shape: tuple[int, ...], name: str) -> Tensor:
        return fp8.dequantize({k: v for k, v in parts.items() if k in (".weight", suffix)}, module=_module(name))

    return Codec(
        layout,
        8 + 32 / math.prod(fp8.BLOCK),
        stored,
        encode,
        decode,
        rows_exact=False,
        tensor_amax=layout == "fp8-tensor",
        row_block=fp8.BLOCK[0] if layout == "fp8-block" else 1,
        grains={".weight": Grain(), suffix: Grain(*fp8.BLOCK) if layout == "fp8-block" else None},
    )


def _nvfp4(layout: str) -> Codec:
    names = nvfp4.STORED[layout]

    def stored(shape: tuple[int, ...]) -> Stored:
        lead, cols = shape[:-1], shape[-1]
        if layout == "nvfp4-gguf":
            return {"": ("NVFP4", shape), ".scale": ("F32", (1,))}  # GGUF has no 0-dim tensors
        codes = lead + (cols // 8 if layout == "nvfp4-mlx" else cols // 2,)
        parts = {
            names["codes"][0]: (SAFETENSORS_DTYPES[names["codes"][1]], codes),
            names["block_scales"][0]: (SAFETENSORS_DTYPES[names["block_scales"][1]], lead + (cols // nvfp4.BLOCK,)),
        }
        if layout != "nvfp4-mlx":  # MLX's QuantizedLinear holds no tensor scale
            parts[names["global_scale"][0]] = ("F32", (1,) if layout == "nvfp4-ct" else ())
        return parts

    def encode(w: Tensor, name: str, amax: float | None = None) -> dict[str, Tensor]:
        # MLX: one level of scales (a tensor scale of 1), as mx.quantize(mode="nvfp4") makes them
        amax = nvfp4.MLX_GLOBAL_FACTOR if layout == "nvfp4-mlx" else amax
        return nvfp4_parts(layout, nvfp4.quantize(_matrix(w, name), global_amax=amax, name=name), name)

    def decode(parts: dict[str, Tensor], shape: tuple[int, ...], name: str) -> Tensor:
        return nvfp4.dequantize(nvfp4_read(layout, parts, name))

    # codes: 2 a byte (ModelOpt, CT), 8 a 32-bit word (MLX), GGUF's 36-byte blocks of 64 holding their scales
    codes_key, codes_dtype = names["codes"]
    codes = Grain(values=nvfp4.GGUF_BLOCK) if layout == "nvfp4-gguf" else Grain(values=codes_dtype.itemsize * 2)
    grains: dict[str, Grain | None] = {"" if layout == "nvfp4-gguf" else codes_key: codes}
    if "block_scales" in names:
        grains[names["block_scales"][0]] = Grain(values=nvfp4.BLOCK)
    grains.update({names[role][0]: None for role in ("global_scale", "input_scale") if role in names})
    return Codec(
        layout, 4.5, stored, encode, decode, rows_exact=False, tensor_amax=layout != "nvfp4-mlx", grains=grains
    )


def nvfp4_read(layout: str, parts: dict[str, Tensor], name: str) -> nvfp4.Nvfp4:
    if layout == "nvfp4-gguf":  # GGUF block data is the tensor itself, not a `.weight` companion
        parts = {".weight" if k == "" else k: v for k, v in parts.items()}
    return nvfp4.FLAVOURS[layout].from_parts(parts, _module(name))


def nvfp4_parts(layout: str, q: nvfp4.Nvfp4, name: str, input_scale: bool = False) -> dict[str, Tensor]:
    """The stored parts of one flavour, always the parts `stored` planned (GGUF's factor of 1 is written, not
    left out); the W4A4 activation scale only with `input_scale` (the planner adds it when the source has one)."""
    parts = nvfp4.FLAVOURS[layout].to_parts(q, _module(name))
    if layout == "nvfp4-mlx" and ".global_scale" in parts:
        raise BadInput(name, "has a tensor scale other than 1, which MLX's nvfp4 linear layers cannot hold")
    if layout == "nvfp4-gguf":
        parts = {"" if k == ".weight" else k: v.reshape(1) if k != ".weight" else v for k, v in parts.items()}
        parts.setdefault(".scale", torch.ones(1, device=q.codes.device))  # llama.cpp multiplies by it
    if not input_scale and "input_scale" in nvfp4.STORED[layout]:
        parts.pop(nvfp4.STORED[layout]["input_scale"][0], None)
    return parts


def _affine(layout: str, method: str = "mlx") -> Codec:
    form = layout_of(layout)
    bits, group = int(form.bits), form.group

    def stored(shape: tuple[int, ...]) -> Stored:
        lead, cols = shape[:-1], shape[-1]
        return {
            ".weight": ("U32", lead + (cols * bits // 32,)),
            ".scales": ("BF16", lead + (cols // group,)),
            ".biases": ("BF16", lead + (cols // group,)),
        }

    def encode(w: Tensor, name: str, amax: float | None = None) -> dict[str, Tensor]:
        parts = affine.quantize(w, bits, group, method, torch.bfloat16, name)
        return {"." + k: v for k, v in parts.items()}

    def decode(parts: dict[str, Tensor], shape: tuple[int, ...], name: str) -> Tensor:
        return affine.dequantize({k.lstrip("."): v for k, v in parts.items()}, bits, group, name)

    # a run of codes ends on a word boundary every 32 / gcd(32, bits) values (3, 5, 6 bits straddle words)
    codes = Grain(values=32 // math.gcd(32, bits))
    grains = {".weight": codes, ".scales": Grain(values=group), ".biases": Grain(values=group)}
    return Codec(layout, bits + 32 / group, stored, encode, decode, rows_exact=False, grains=grains)


def _gguf(layout: str, method: str = "search") -> Codec:
    qtype = layout_of(layout).flavour
    values, block_bytes = gguf_quants.block_size(qtype)

    def encode(w: Tensor, name: str, amax: float | None = None) -> dict[str, Tensor]:
        if qtype == "Q8_0":
            return {"": gguf_quants.quantize_q8_0(w, name)}
        if (
            qtype in gguf_quants.KQUANT_BLOCKS
            and method in gguf_quants.METHODS
            and not (w.device.type == "cpu" and gguf_quants.use_processes())
        ):
            # torch on w's device, but for a CPU with worker processes (4 cores or more): they scale with its
            # cores, where a third of the torch search is ops on one number per sub-block, too small for torch
            # to split across threads
            return {"": gguf_quants.quantize_kquant_torch(w.detach(), qtype, method == "search", name)}
        data = gguf_quants.quantize_in_processes(w.detach().float().cpu().numpy(), qtype, method, name)
        return {"": torch.from_numpy(np.ascontiguousarray(data))}

    def decode(parts: dict[str, Tensor], shape: tuple[int, ...], name: str) -> Tensor:
        # planes (the kernels' arrangement, formats/gguf_planes.py) go back to the blocks they came from
        data = (
            gguf_planes.from_planes(parts, qtype, shape, name) if gguf_planes.is_planes(parts) else _only(parts, name)
        )
        if qtype == "Q8_0":
            return gguf_quants.dequantize_q8_0(data, shape, name)
        if qtype in gguf_quants.KQUANT_BLOCKS:
            return gguf_quants.dequantize_kquant_torch(data, qtype, shape, name)
        # other types decode in gguf-py's numpy: back to the device the bytes are on
        return torch.from_numpy(gguf_quants.dequantize(data.cpu().numpy(), qtype, shape, name)).to(data.device)

    # the numpy quantizers take slices big enough to keep every worker process busy, where there are workers
    numpy_in_processes = qtype != "Q8_0" and gguf_quants.use_processes()
    chunk = gguf_quants.PARALLEL_VALUES * (os.cpu_count() or 1) if numpy_in_processes else 1 << 18
    return Codec(
        layout,
        block_bytes * 8 / values,
        lambda shape: {"": (qtype, shape)},
        encode,
        decode,
        rows_exact=True,
        chunk_values=chunk,
        grains={"": Grain(values=values)},
    )


def _exl3(layout: str, codebook: str = "mul1") -> Codec:
    """ExLlamaV3's trellis: `method` is the codebook written (a source's own is told by its marker tensor)."""
    bits = layout_of(layout).bits

    def stored(shape: tuple[int, ...]) -> Stored:
        return exl3.stored_shapes(_matrix_shape(shape, layout), int(bits), codebook)

    def encode(w: Tensor, name: str, amax: float | None = None) -> dict[str, Tensor]:
        return exl3.quantize(_matrix(w, name), int(bits), codebook, name)

    def decode(parts: dict[str, Tensor], shape: tuple[int, ...], name: str) -> Tensor:
        return exl3.dequantize(parts, tuple(shape), _module(name))

    return Codec(layout, bits, stored, encode, decode, rows_exact=False)


def _matrix_shape(shape: tuple[int, ...], layout: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise BadInput(layout, f"holds matrices only; shape {list(shape)} is not one")
    return shape


def codec(layout: str, method: str | None = None) -> Codec:
    """The codec of a layout label (formats/layouts.py); `method` picks the quantizer where a layout has two."""
    try:
        form = layout_of(layout)
    except ValueError:
        raise BadInput(layout, NO_CODEC) from None
    if layout in FLOAT_LAYOUTS:
        return _float(layout)
    if form.kind == FP8:
        return _fp8(layout)
    if form.kind == NVFP4:
        return _nvfp4(layout)
    if form.kind == AFFINE and form.bits:
        return _affine(layout, method or "mlx")
    if form.kind == GGUF:
        return _gguf(layout, method or "search")
    if form.kind == EXL3 and (2 * form.bits).is_integer():  # whole and half-integer trellis rates
        return _exl3(layout, method or "mul1")
    raise BadInput(layout, NO_CODEC)


NO_CODEC = "no codec for this layout: specpair cannot read or write it"


def grains(layout: str) -> dict[str, Grain | None] | None:
    """How each stored part of a layout is cut (Codec.grains); a plain integer tensor is cut as a float."""
    return {"": Grain()} if layout == "int" else codec(layout).grains


def row_slice(shape: tuple[int, ...], rows: int, start: int, stop: int) -> slice | None:
    """Which leading entries of a stored part of `shape` hold rows start:stop of its weight (rows = the
    weight's leading dims flattened): the same rows, or FP8's 128-row tiles; None for a per-tensor value."""
    shape = tuple(shape)
    lead = math.prod(shape[:-1]) if len(shape) > 1 else 1
    if len(shape) > 1 and lead == rows:
        return slice(start, stop)
    if len(shape) == 2 and shape[0] == -(-rows // fp8.BLOCK[0]) and start % fp8.BLOCK[0] == 0:
        return slice(start // fp8.BLOCK[0], -(-stop // fp8.BLOCK[0]))
    if math.prod(shape) <= 1:
        return None
    raise ValueError(f"part of shape {list(shape)} does not split by rows of a {rows}-row weight")


def repack(
    source_layout: str, target_layout: str, parts: dict[str, Tensor], name: str, input_scale: bool
) -> dict[str, Tensor]:
    """NVFP4 flavour -> flavour as bits: the codes and block scales move, nothing is recomputed."""
    return nvfp4_parts(target_layout, nvfp4_read(source_layout, parts, name), name, input_scale)


def _only(parts: dict[str, Tensor], name: str) -> Tensor:
    if "" not in parts:
        raise BadInput(name, f"expected one stored tensor, found parts {sorted(parts)}")
    return parts[""]


def _matrix(w: Tensor, name: str) -> Tensor:
    if w.ndim < 2:
        raise BadInput(name, f"shape {list(w.shape)} is not a matrix; only matrices can be quantized")
    return w


def _module(name: str) -> str:
    return name.removesuffix(".weight")
