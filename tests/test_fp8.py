"""FP8 E4M3 per-tensor (ModelOpt) and 128×128 block (Qwen/transformers) weights against ModelOpt's FP8QTensor,
transformers' dequantizer and the formulas of formats.md §4 written out here."""

from __future__ import annotations

import pytest
import torch
from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor  # ~5-20 s, imported once
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

from specpair.errors import BadInput
from specpair.formats import fp8


def gaussian(rows: int = 256, cols: int = 4096, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def relative_error(parts: dict[str, torch.Tensor], w: torch.Tensor) -> float:
    return ((fp8.dequantize(parts) - w).norm() / w.norm()).item()


def bits(t: torch.Tensor) -> list[int]:
    return t.view(torch.uint8).tolist()


# Casting: round to nearest, ties to even mantissa, saturating at ±448 (formats.md §0)
CASTS = [
    (448.0, 0x7E),
    (464.0, 0x7E),  # 464 is halfway to 480 (0x7F would be odd, and is NaN): down to even
    (232.0, 0x76),
    (248.0, 0x78),  # halfway 224|240 -> 224 (even); 240|256 -> 256 (even)
    (1.0625, 0x38),
    (1.1875, 0x3A),  # halfway 1|1.125 -> 1; 1.125|1.25 -> 1.25
    (2.0**-6, 0x08),
    (2.0**-9, 0x01),  # smallest normal, smallest subnormal
    (2.0**-10, 0x00),
    (3 * 2.0**-10, 0x02),
    (5 * 2.0**-10, 0x02),  # subnormal ties to even
    (-0.0, 0x80),
    (-1.0, 0xB8),
]


def test_torch_casts_to_nearest_even() -> None:
    values = torch.tensor([value for value, _ in CASTS])
    assert bits(values.to(torch.float8_e4m3fn)) == [expected for _, expected in CASTS]
    assert bits(fp8.to_e4m3(values)) == [expected for _, expected in CASTS]


def test_to_e4m3_saturates() -> None:
    assert bits(fp8.to_e4m3(torch.tensor([480.0, 1e9, float("inf"), -1e9, -float("inf")]))) == [0x7E] * 3 + [0xFE] * 2


# Per-tensor (ModelOpt)


@pytest.mark.parametrize(
    "w", [gaussian(), gaussian(64, 256) * 1e-3, gaussian(64, 256).bfloat16()], ids=["gaussian", "small", "bf16"]
)
def test_per_tensor_matches_modelopt(w: torch.Tensor) -> None:
    """Our math is float32 whatever the input (ModelOpt keeps bf16 input in bf16, scale included)."""
    parts = fp8.quantize_per_tensor(w)
    theirs, scale = FP8QTensor.quantize(w.float())
    assert parts[".weight"].dtype == torch.float8_e4m3fn
    assert parts[".weight_scale"].dtype == torch.float32 and parts[".weight_scale"].shape == ()
    assert torch.equal(parts[".weight"].view(torch.uint8), theirs._quantized_data.view(torch.uint8))
    assert parts[".weight_scale"].view(torch.int32) == scale.float().view(torch.int32)
    ours = fp8.dequantize(parts)
    assert torch.equal(ours, theirs.dequantize(dtype=torch.float32, scale=scale))
    assert torch.equal(ours, _dequantize_fp8_weight(parts[".weight"], parts[".weight_scale"], None, torch.float32))


# Blocks (Qwen / transformers `weight_scale_inv`)


def block_dequantize_by_formula(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """formats.md §4: W[i, j] = float(w[i, j]) · weight_scale_inv[i // 128, j // 128]."""
    rows, cols = weight.shape
    return weight.float() * scale.float()[torch.arange(rows)[:, None] // 128, torch.arange(cols)[None, :] // 128]


SHAPES = [(256, 4096), (300, 200), (100, 130), (128, 128)]  # partial edge blocks in both directions, in one


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_block_dequantize_matches_transformers_and_the_formula(
    shape: tuple[int, int], scale_dtype: torch.dtype
) -> None:
    parts = fp8.quantize_block(gaussian(*shape), scale_dtype=scale_dtype)
    weight, scale = parts[".weight"], parts[".weight_scale_inv"]
    assert scale.dtype == scale_dtype and scale.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    ours = fp8.dequantize(parts)
    assert torch.equal(ours, _dequantize_fp8_weight(weight, scale, [128, 128], torch.float32))
    assert torch.equal(ours, block_dequantize_by_formula(weight, scale))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_block_quantize_matches_modelopt(shape: tuple[int, int]) -> None:
    """ModelOpt's block FP8 pads to whole blocks and divides by amax/448, as Qwen's block scales are defined."""
    w = gaussian(*shape)
    parts = fp8.quantize_block(w)
    theirs, scale = FP8QTensor.quantize(w.clone(), block_sizes={-1: 128, -2: 128})
    assert torch.equal(parts[".weight"].view(torch.uint8), theirs._quantized_data.view(torch.uint8))
    assert torch.equal(parts[".weight_scale_inv"], scale)


def test_bf16_block_scales_divide_by_the_stored_scale() -> None:
    w = gaussian(300, 200)
    parts = fp8.quantize_block(w, scale_dtype=torch.bfloat16)
    scale = parts[".weight_scale_inv"].float()
    per_element = scale[torch.arange(300)[:, None] // 128, torch.arange(200)[None, :] // 128]
    assert bits(parts[".weight"]) == bits(fp8.to_e4m3(w / per_element))


def test_errors_on_gaussian() -> None:
    """formats.md §7: 0.0264-0.0266 for either scheme."""
    w = gaussian()
    per_tensor = relative_error(fp8.quantize_per_tensor(w), w)
    block = relative_error(fp8.quantize_block(w), w)
    block_bf16 = relative_error(fp8.quantize_block(w, scale_dtype=torch.bfloat16), w)
    assert 0.025 < per_tensor < 0.028 and 0.025 < block < 0.028 and 0.025 < block_bf16 < 0.028


def test_zero_tensor_and_blocks_get_scale_one() -> None:
    w = torch.zeros(200, 300)
    w[:128, :128] = 1.0
    parts = fp8.quantize_block(w)
    assert parts[".weight_scale_inv"].tolist() == [[(torch.tensor(1.0) / 448).item(), 1.0, 1.0], [1.0, 1.0, 1.0]]
    assert torch.equal(fp8.dequantize(parts), w)
    zero = fp8.quantize_per_tensor(torch.zeros(4, 4))
    assert zero[".weight_scale"] == 1.0 and torch.equal(fp8.dequantize(zero), torch.zeros(4, 4))


def test_leading_dimensions_are_separate_matrices() -> None:
    experts = torch.stack([gaussian(130, 140, seed=0), 1000 * gaussian(130, 140, seed=1)])
    parts = fp8.quantize_block(experts)
    assert parts[".weight_scale_inv"].shape == (2, 2, 2)
    assert torch.equal(fp8.dequantize(parts)[1], fp8.dequantize(fp8.quantize_block(experts[1])))


# Bad input

WEIGHT = fp8.to_e4m3(torch.ones(200, 300))
BAD = {
    "no scale": ({".weight": WEIGHT}, "m.weight", "exactly one"),
    "both scales": (
        {".weight": WEIGHT, ".weight_scale": torch.tensor(1.0), ".weight_scale_inv": torch.ones(2, 3)},
        "m.weight",
        "exactly one",
    ),
    "no weight": ({".weight_scale": torch.tensor(1.0)}, "m.weight", "missing"),
    "weight not FP8": ({".weight": torch.ones(200, 300), ".weight_scale": torch.tensor(1.0)}, "m.weight", "F8_E4M3"),
    "block scale shape": ({".weight": WEIGHT, ".weight_scale_inv": torch.ones(2, 2)}, "m.weight_scale_inv", "[2, 3]"),
    "per-tensor scale vector": ({".weight": WEIGHT, ".weight_scale": torch.ones(200, 1)}, "m.weight_scale", "one"),
    "integer scale": ({".weight": WEIGHT, ".weight_scale": torch.tensor(1)}, "m.weight_scale", "float"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_parts_name_the_tensor(case: str) -> None:
    parts, where, words = BAD[case]
    with pytest.raises(BadInput) as caught:
        fp8.dequantize(parts, module="m")
    assert caught.value.where == where and words in caught.value.problem and "\n" not in str(caught.value)


@pytest.mark.parametrize("quantize", [fp8.quantize_per_tensor, fp8.quantize_block])
@pytest.mark.parametrize(
    "w", [torch.tensor([[1.0, float("nan")]]), torch.ones(3), torch.ones(0, 4)], ids=["nan", "vector", "empty"]
)
def test_bad_weights_are_refused(quantize, w: torch.Tensor) -> None:
    with pytest.raises(BadInput) as caught:
        quantize(w, name="m.weight")
    assert caught.value.where == "m.weight"
