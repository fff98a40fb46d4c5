"""Which storage layout each tensor is in, told from tensor headers alone.

A quantized linear is stored as a weight plus companion tensors (scales, sign vectors, markers); the
companions decide the layout. Labels: bf16 | f16 | f32 | fp8-tensor | fp8-block | int8 |
nvfp4-modelopt | nvfp4-ct | nvfp4-mlx | nvfp4-gguf | mxfp4-mlx | int4-ct | affine{bits}-g{group} |
exl3-{bits}bpw | gguf-{TYPE} | int.
"""

from __future__ import annotations

from collections import defaultdict

from specpair.formats import TensorInfo

FLOAT_DTYPES = {"BF16": "bf16", "F16": "f16", "F32": "f32", "F64": "f64"}
FP8_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}

# Suffixes that name the stored weight itself, then companions that only make sense beside one.
WEIGHT_SUFFIXES = (".weight_packed", ".trellis", ".weight")
COMPANION_SUFFIXES = (
    ".weight_scale_inv", ".weight_scale_2", ".weight_scale", ".weight_global_scale", ".weight_zero_point",
    ".weight_shape", ".input_scale", ".input_global_scale", ".scales", ".biases", ".global_scale",
    ".suh", ".svh", ".su", ".sv", ".mcg", ".mul1", ".k_scale", ".v_scale",
)

GGUF_LAYOUTS = {"F32": "f32", "F16": "f16", "BF16": "bf16", "NVFP4": "nvfp4-gguf"}
AFFINE_BITS = (1, 2, 3, 4, 5, 6, 8)  # formats/affine.py, without importing torch
AFFINE_GROUPS = (32, 64, 128)


def split_module(name: str) -> tuple[str, str]:
    """'a.b.weight_scale' -> ('a.b', '.weight_scale'); names without a known suffix are their own module."""
    for suffix in COMPANION_SUFFIXES + WEIGHT_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def classify(tensors: list[TensorInfo], mlx: dict | None = None) -> dict[str, str]:
    """Layout label for every tensor name; `mlx` is an MLX config's `quantization` block when it has one
    (default bits and group size, and per-module overrides)."""
    mlx = mlx if isinstance(mlx, dict) else {}
    modules: dict[str, dict[str, TensorInfo]] = defaultdict(dict)
    for t in tensors:
        module, suffix = split_module(t.name)
        modules[module][suffix] = t
    labels = {}
    for module, parts in modules.items():
        params = mlx.get(module) if isinstance(mlx.get(module), dict) else mlx
        label = _module_layout(parts, _int(params.get("bits")), _int(params.get("group_size")))
        for t in parts.values():
            labels[t.name] = label if label else _plain(t)
    return labels


def gguf_layout(ggml_type: str) -> str:
    return GGUF_LAYOUTS.get(ggml_type, f"gguf-{ggml_type}")


def _module_layout(parts: dict[str, TensorInfo], affine_bits: int | None, affine_group: int | None) -> str | None:
    if ".trellis" in parts and parts[".trellis"].shape:  # a header may give a scalar shape
        bits = parts[".trellis"].shape[-1] / 16
        return f"exl3-{bits:g}bpw"
    if ".weight_packed" in parts:
        scale = parts.get(".weight_scale")
        return "nvfp4-ct" if scale is not None and scale.dtype in FP8_DTYPES else "int4-ct"
    weight = parts.get(".weight")
    if weight is None:
        return None
    if weight.dtype == "U8" and ".weight_scale" in parts and parts[".weight_scale"].dtype in FP8_DTYPES:
        return "nvfp4-modelopt"
    if weight.dtype == "U32" and ".scales" in parts and weight.shape and parts[".scales"].shape:
        return _mlx_layout(weight, parts[".scales"], ".biases" in parts, affine_bits, affine_group)
    if weight.dtype in FP8_DTYPES:
        return "fp8-block" if ".weight_scale_inv" in parts else "fp8-tensor"
    if weight.dtype == "I8" and ".weight_scale" in parts:
        return "int8"
    return None


def _mlx_layout(weight: TensorInfo, scales: TensorInfo, has_biases: bool, bits: int | None, group: int | None) -> str:
    words, groups = weight.shape[-1], scales.shape[-1]
    if not has_biases:  # nvfp4 (group 16) or mxfp4 (group 32): 4-bit codes, 8 per word, 8-bit scales
        return "nvfp4-mlx" if groups and words * 8 == groups * 16 else "mxfp4-mlx"
    if groups == 0:
        return "affine"
    per_group_bits = words * 32 // groups  # = bits * group_size
    # the config's group size, then its bits, then MLX's usual groups: the first that gives a real layout
    candidates = ([group] if group else []) + ([per_group_bits // bits] if bits and per_group_bits % bits == 0 else []) + [64, 32, 128]
    for g in candidates:
        if g in AFFINE_GROUPS and per_group_bits % g == 0 and per_group_bits // g in AFFINE_BITS:
            return f"affine{per_group_bits // g}-g{g}"
    return "affine"


def _plain(t: TensorInfo) -> str:
    if t.dtype in FLOAT_DTYPES:
        return FLOAT_DTYPES[t.dtype]
    if t.dtype in FP8_DTYPES:
        return "fp8-tensor"
    return "int"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
