"""Make tests/exl3_fixtures/exl3_fixtures.safetensors with ExLlamaV3 itself (needs CUDA and exllamav3).

    python tests/exl3_fixtures/make_fixtures.py OUT_DIR

Per module `<codebook>.k<K>` (K = 1..8 for 3inst, mcg and mul1; K = 1.5, 2.5, 3.5 for mul1, written k1_5 ...):
a seeded N(0, 1) weight [out, in] is quantized by exllamav3's own `quantize_exl3` without calibration data (its
fallback path: a meta Hessian, random signs, channel scales, global scale search, tile Viterbi), and a
LinearEXL3 built from the result gives `<m>.reconstruct` (get_inner_weight_tensor: the rotated Q, fp16
[in_p, out_p], ext.reconstruct) and `<m>.weight` (get_weight_tensor: fp16 [in_p, out_p]) beside the stored
`<m>.trellis`, `<m>.suh`, `<m>.svh` and marker. Extra modules: `mul1.k4.crop` (a [100, 200] weight, zero
padded to [128, 256] as exllamav3's Linear pads) and `mul1.k3.signs` (the old layout: su/sv sign bitfields
made by ext.pack_signs, and the weight LinearEXL3 gives from them). The header metadata holds each module's
logical shape and the versions used.

OUT_DIR also gets analysis.safetensors (not committed): the float32 products of both Hadamard steps of
get_weight_tensor, ExLlamaV3's fused reconstruct_had_slice output, and a larger [512, 1024] module, to
compare our CPU arithmetic with cuBLAS's; and specpair's own dequantize run on CUDA against each module.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

start = time.time()
from exllamav3.ext import exllamav3_ext as ext  # JIT-builds the extension on first import
from exllamav3.modules.quant.exl3 import LinearEXL3
from exllamav3.modules.quant.exl3_lib.quantize import quantize_exl3
from exllamav3.util.hadamard import get_hadamard_dt
from exllamav3.version import __version__ as exllamav3_version
from safetensors.torch import save_file

from specpair.formats import exl3

BUILD_SECONDS = time.time() - start
DEVICE = "cuda:0"


def exllamav3_quantize(w: torch.Tensor, bits: float, codebook: str, seed: int) -> dict[str, torch.Tensor]:
    """exllamav3's uncalibrated quantize_exl3 of w [out, in] (already padded): {suh, svh, trellis, marker}."""
    weight = w.T.contiguous().float().to(DEVICE)  # exllamav3 quantizes [in, out]
    h_data = {"H": torch.empty(weight.shape[0], weight.shape[0], device="meta"), "device": DEVICE, "L": None}
    args = {
        "K": bits,
        "devices": [0],
        "seed": seed,
        "apply_out_scales": None,
        "mcg": codebook == "mcg",
        "mul1": codebook == "mul1",
    }
    _, _, tensors = quantize_exl3(weight, h_data, args, return_weight_q=False)
    return tensors


def linear(tensors: dict[str, torch.Tensor], in_p: int, out_p: int) -> LinearEXL3:
    return LinearEXL3(
        None,
        in_p,
        out_p,
        su=tensors.get("su"),
        sv=tensors.get("sv"),
        suh=tensors.get("suh"),
        svh=tensors.get("svh"),
        trellis=tensors["trellis"],
        mcg=tensors.get("mcg"),
        mul1=tensors.get("mul1"),
    )


def hadamard_steps(layer: LinearEXL3) -> tuple[torch.Tensor, torch.Tensor]:
    """get_weight_tensor's two float32 products, before each fp16 rounding (preapply_had_l / _r's own code)."""
    had = get_hadamard_dt(128, layer.trellis.device, torch.float, 1 / math.sqrt(128))
    q = layer.get_inner_weight_tensor().float()
    k, n = q.shape
    left = (had @ q.view(-1, 128, n)).view(k, n)
    scaled = (left.half() * layer.suh.unsqueeze(1)).float()
    right = (scaled.view(k, -1, 128) @ had).view(k, n)
    return left, right


def reconstruct_case(
    name: str,
    tensors: dict[str, torch.Tensor],
    w: torch.Tensor,
    shape: tuple[int, int],
    target: dict[str, torch.Tensor],
    analysis: dict[str, torch.Tensor],
) -> dict:
    """Store exllamav3's tensors and reconstructions of one module into `target`; what was seen, as a dict."""
    out_p, in_p = w.shape
    layer = linear(tensors, in_p, out_p)
    q = layer.get_inner_weight_tensor()
    weight = layer.get_weight_tensor()
    fused = torch.empty_like(weight)
    ext.reconstruct_had_slice(fused, layer.trellis, layer.suh, layer.svh, layer.K, layer.mcg, layer.mul1, 0)
    left, right = hadamard_steps(layer)
    for key, tensor in tensors.items():
        target[f"{name}.{key}"] = tensor.cpu()
    target[f"{name}.reconstruct"] = q.cpu()
    target[f"{name}.weight"] = weight.cpu()
    analysis.update({f"{name}.left": left.cpu(), f"{name}.right": right.cpu(), f"{name}.fused": fused.cpu()})
    ours_cuda = exl3.dequantize({f".{key}": tensor for key, tensor in tensors.items()}, shape)
    theirs = weight.T.float()[: shape[0], : shape[1]]
    original = w[: shape[0], : shape[1]]
    return {
        "module": name,
        "exllamav3_rel_error": round(
            (torch.linalg.norm(theirs.cpu() - original) / torch.linalg.norm(original)).item(), 5
        ),
        "ours_on_cuda_equal": bool(torch.equal(ours_cuda, theirs)),
        "hadamard_steps_are_get_weight_tensor": bool(torch.equal(right.half() * layer.svh.unsqueeze(0), weight)),
        "fused_vs_weight_max_abs": (fused.float() - weight.float()).abs().max().item(),
    }


def add_sign_bitfield_module(fixtures: dict[str, torch.Tensor], shapes: dict[str, list[int]]) -> None:
    """The old layout: sign bitfields (ext.pack_signs) instead of fp16 scales, on the mul1 K=3 trellis."""
    base = {key: fixtures[f"mul1.k3.{key}"].to(DEVICE) for key in ("trellis", "mul1", "suh", "svh")}
    su = torch.empty(128 // 16, dtype=torch.int16, device=DEVICE)
    sv = torch.empty(128 // 16, dtype=torch.int16, device=DEVICE)
    ext.pack_signs(su, torch.sign(base["suh"]).contiguous())
    ext.pack_signs(sv, torch.sign(base["svh"]).contiguous())
    old = linear({"su": su, "sv": sv, "trellis": base["trellis"], "mul1": base["mul1"]}, 128, 128)
    fixtures.update(
        {
            "mul1.k3.signs.su": su.cpu(),
            "mul1.k3.signs.sv": sv.cpu(),
            "mul1.k3.signs.trellis": fixtures["mul1.k3.trellis"].clone(),
            "mul1.k3.signs.mul1": fixtures["mul1.k3.mul1"].clone(),
            "mul1.k3.signs.weight": old.get_weight_tensor().cpu(),
        }
    )
    shapes["mul1.k3.signs"] = [128, 128]


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    fixtures: dict[str, torch.Tensor] = {}
    analysis: dict[str, torch.Tensor] = {}
    shapes: dict[str, list[int]] = {}
    analysis_shapes: dict[str, list[int]] = {}
    report = []
    cases = [(codebook, bits, (128, 128)) for codebook in exl3.CODEBOOKS for bits in exl3.BITS]
    cases += [("mul1", bits, (128, 128)) for bits in exl3.HALF_BITS]
    cases += [("mul1", 4, (100, 200)), ("3inst", 2, (256, 128)), ("mul1", 4, (512, 1024))]
    for seed, (codebook, bits, shape) in enumerate(cases):
        name = f"{codebook}.k{bits:g}".replace(".5", "_5")
        if shape == (100, 200):
            name += ".crop"
        elif shape != (128, 128):
            name += f".{shape[0]}x{shape[1]}"
        target = analysis if shape == (512, 1024) else fixtures
        out_p, in_p = (-(-size // 128) * 128 for size in shape)
        w = torch.zeros(out_p, in_p)
        w[: shape[0], : shape[1]] = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        try:
            tensors = exllamav3_quantize(w, bits, codebook, seed)
            report.append(reconstruct_case(name, tensors, w, shape, target, analysis))
            (shapes if target is fixtures else analysis_shapes)[name] = list(shape)
        except Exception as error:  # noqa: BLE001 (report it and make the others)
            report.append({"module": name, "error": repr(error)})
        print(json.dumps(report[-1]), flush=True)
    try:
        add_sign_bitfield_module(fixtures, shapes)
    except Exception as error:  # noqa: BLE001 (report it, keep the rest)
        report.append({"module": "mul1.k3.signs", "error": repr(error)})
    metadata = {
        "shapes": json.dumps(shapes),
        "exllamav3": exllamav3_version,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "python": platform.python_version(),
        "command": "python tests/exl3_fixtures/make_fixtures.py OUT_DIR",
    }
    save_file({k: v.contiguous() for k, v in fixtures.items()}, out_dir / "exl3_fixtures.safetensors", metadata)
    save_file(
        {k: v.contiguous() for k, v in analysis.items()},
        out_dir / "analysis.safetensors",
        {"shapes": json.dumps({**shapes, **analysis_shapes})},
    )
    (out_dir / "fixtures_report.json").write_text(
        json.dumps({"build_seconds": BUILD_SECONDS, **metadata, "modules": report}, indent=1)
    )
    print(f"exllamav3 import (extension build) {BUILD_SECONDS:.0f} s; {len(report)} modules", flush=True)


if __name__ == "__main__":
    main()
