"""The quantization announcements a converted checkpoint carries, per layout, as their consumers read them.

`quantization_files(layouts, ...)` returns what goes into config.json and beside it, from the layout each
module was written in: Qwen FP8's `quantization_config` (transformers FineGrainedFP8), ModelOpt's
`hf_quant_config.json` and config block (the MIXED_PRECISION form of nvidia/Qwen3.6-*-NVFP4, one entry per
quantized module), compressed-tensors' `nvfp4-pack-quantized`, and MLX's `quantization` block with
per-module overrides (`false` for modules left float).
"""

from __future__ import annotations

import re
from typing import Any

from specpair import __version__
from specpair.formats.layouts import AFFINE, EXL3, FP8, NVFP4, layout_of

FLOAT = ("bf16", "f16", "f32", "int")
PRODUCER = {"name": "specpair", "version": __version__}
EXPERT = re.compile(r"\.experts\.\d+\.(gate|up|down)_proj$")


def quantization_files(
    layouts: dict[str, str],
    input_scales: set[str],
    stored: dict[str, dict[str, tuple[str, tuple[int, ...]]]],
    method: str | None,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(keys to set in config.json, extra JSON files) for modules -> layout.

    `layouts` maps every 2-D weight's module (name without ".weight") to the layout written; `input_scales`
    are the modules that kept a W4A4/W8A8 activation scale; `stored` is each module's tensors as written
    (dtype, shape), which EXL3's tensor_storage lists; `method` the quantizer asked for (EXL3's codebook).
    """
    quantized = {m: layout for m, layout in layouts.items() if layout not in FLOAT}
    configs = {config_of(layout) for layout in quantized.values()}
    if not configs:
        return {}, {}
    if len(configs) > 1 or None in configs:
        raise ValueError(f"no single quantization config describes layouts {sorted(set(quantized.values()))}")
    config = configs.pop()
    if config == QWEN_FP8:
        return {"quantization_config": _fp8_block(layouts)}, {}
    if config == MODELOPT:
        return _modelopt(quantized, input_scales)
    if config == COMPRESSED_TENSORS:
        return {"quantization_config": _compressed_tensors(layouts, input_scales)}, {}
    if config == MLX:
        block = _mlx(layouts)
        return {"quantization": block, "quantization_config": dict(block)}, {}
    return _exl3(quantized, stored, method or "mul1")


QWEN_FP8, MODELOPT, COMPRESSED_TENSORS, MLX, EXLLAMA = "Qwen FP8", "ModelOpt", "compressed-tensors", "MLX", "EXL3"
# the config that announces a layout, by its kind and flavour (a kind's row, flavour None, serves every flavour)
CONFIGS: dict[tuple[str, str | None], str] = {
    (FP8, "block"): QWEN_FP8,
    (FP8, "tensor"): MODELOPT,
    (NVFP4, "modelopt"): MODELOPT,
    (NVFP4, "ct"): COMPRESSED_TENSORS,
    (NVFP4, "mlx"): MLX,
    (AFFINE, None): MLX,
    (EXL3, None): EXLLAMA,
}


def config_of(layout: str) -> str | None:
    """The quantization config a checkpoint of `layout` is announced in; None: none of these (GGUF is a file)."""
    form = layout_of(layout)
    return CONFIGS.get((form.kind, form.flavour)) or CONFIGS.get((form.kind, None))


def _fp8_block(layouts: dict[str, str]) -> dict[str, Any]:
    # transformers replaces every Linear not listed here with an FP8 one: list each module left float
    untouched = sorted(m for m, layout in layouts.items() if layout in FLOAT)
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": untouched,
    }


def _modelopt(quantized: dict[str, str], input_scales: set[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    layers: dict[str, dict[str, Any]] = {}
    for module, layout in sorted(quantized.items()):
        key = EXPERT.sub(".experts", module)  # ModelOpt names a layer's routed experts as one module
        if layout_of(layout).kind == FP8:
            layers[key] = {"quant_algo": "FP8"}
        else:
            algo = "NVFP4" if module in input_scales else "W4A16_NVFP4"
            layers[key] = {"quant_algo": algo, "group_size": 16}
    algos = {entry["quant_algo"] for entry in layers.values()}
    algo = algos.pop() if len(algos) == 1 else "MIXED_PRECISION"
    groups = {}
    for k, (bits, algo_name) in enumerate(((8, "FP8"), (4, "W4A16_NVFP4"), (4, "NVFP4"))):
        targets = sorted(m for m, entry in layers.items() if entry["quant_algo"] == algo_name)
        if targets:
            weights = {"dynamic": False, "num_bits": bits, "type": "float", **({"group_size": 16} if bits == 4 else {})}
            activations = dict(weights) if algo_name != "W4A16_NVFP4" else None
            groups[f"group_{k}"] = {"weights": weights, "input_activations": activations, "targets": targets}
    config = {
        "quant_method": "modelopt",
        "quant_algo": algo,
        "producer": PRODUCER,
        "config_groups": groups,
        "ignore": [],
        "quantized_layers": layers,
    }
    hf_quant = {
        "producer": PRODUCER,
        "quantization": {
            "quant_algo": algo,
            "kv_cache_quant_algo": None,
            "exclude_modules": [],
            "quantized_layers": layers,
        },
    }
    if algo != "MIXED_PRECISION":
        hf_quant["quantization"]["group_size"] = 16 if "NVFP4" in algo else None
    return {"quantization_config": config}, {"hf_quant_config.json": hf_quant}


def _compressed_tensors(layouts: dict[str, str], input_scales: set[str]) -> dict[str, Any]:
    weights = {
        "num_bits": 4,
        "type": "float",
        "strategy": "tensor_group",
        "group_size": 16,
        "symmetric": True,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
    }
    activations = {**weights, "dynamic": "local"} if input_scales else None
    quantized = sorted(m for m, layout in layouts.items() if layout_of(layout).kind == NVFP4)
    ignore = sorted(m for m, layout in layouts.items() if layout in FLOAT)
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": quantized,
                "weights": weights,
                "input_activations": activations,
                "output_activations": None,
                "format": "nvfp4-pack-quantized",
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
        "global_compression_ratio": None,
        "version": "0.12.2",
    }


def _mlx(layouts: dict[str, str]) -> dict[str, Any]:
    """MLX's block: defaults from the most common layout, then one entry per module that differs."""
    quantized = [layout for layout in layouts.values() if layout not in FLOAT]
    default = max(sorted(set(quantized)), key=quantized.count)
    block: dict[str, Any] = dict(_mlx_params(default))
    for module, layout in sorted(layouts.items()):
        if layout in FLOAT:
            block[module] = False
        elif layout != default:
            block[module] = _mlx_params(layout)
    return block


def _mlx_params(layout: str) -> dict[str, Any]:
    if layout_of(layout).kind == NVFP4:
        return {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    form = layout_of(layout)
    return {"group_size": form.group, "bits": int(form.bits), "mode": "affine"}


def _exl3(
    quantized: dict[str, str], stored: dict[str, dict[str, tuple[str, tuple[int, ...]]]], codebook: str
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """ExLlamaV3's config block and quantization_config.json (conversion/compile.py's form)."""
    from specpair.formats import exl3

    bits = {m: float(layout.removeprefix("exl3-").removesuffix("bpw")) for m, layout in quantized.items()}
    head = [b for m, b in bits.items() if m.endswith("lm_head")]
    body = [b for m, b in bits.items() if not m.endswith("lm_head")] or head
    config = exl3.quantization_config(max(set(body), key=body.count), int(head[0]) if head else 6, codebook)
    storage = {}
    for module, parts in sorted(stored.items()):
        entry: dict[str, Any] = {
            "stored_tensors": {name: {"shape": list(shape), "dtype": dtype} for name, (dtype, shape) in parts.items()}
        }
        if module in bits:
            entry |= {"quant_format": "exl3", "bits_per_weight": bits[module]}
            if codebook in exl3.MULTIPLIERS:
                entry[f"{codebook}_multiplier"] = exl3.MULTIPLIERS[codebook]
        storage[module] = entry
    return {"quantization_config": config}, {"quantization_config.json": {**config, "tensor_storage": storage}}
