"""NVFP4 numeric core against the real references on CPU: ModelOpt, compressed-tensors, MLX and gguf-py.

ModelOpt is the in-memory form, so its quantizer and dequantizer must agree bit for bit. CT divides by the
inverted per-tensor scale and gguf-py leaves the per-tensor scale to a later multiply, so their float results
can differ from ours in the last bit unless that scale is a power of two; there they must agree exactly.
"""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest
import torch
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8
from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor  # ~5-20 s, imported once

from specpair.errors import BadInput
from specpair.formats import nvfp4
from specpair.formats.nvfp4 import FLAVOURS, Nvfp4

CT_SCHEME = preset_name_to_scheme("NVFP4", ["Linear"])
POWER_OF_TWO_AMAX = 2688 * 2.0**-8  # global scale exactly 2^-8, so every reference's float math is exact
MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
# formats.md §0 (≤0.25→0, <0.75→0.5, ≤1.25→1, <1.75→1.5, ≤2.5→2, <3.5→3, ≤5→4): the codes of the midpoints
MIDPOINT_CODES = (0, 2, 2, 4, 4, 6, 6)


def gaussian(rows: int = 256, cols: int = 4096, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def on_rounding_boundaries() -> torch.Tensor:
    """Rows [6·b, +midpoints·b, -midpoints·b, 0] (times 2^-8) for block scales b, exactly and one float32 step
    above and below.

    The tensor amax gives global scale 2^-8 and each row's amax block scale b (an E4M3 value), so
    w/(block scale·global scale) is exact and lands on the midpoints themselves.
    """
    unit = 2.0**-8
    rows = []
    for block in (1.0, 1.125, 0.0625, 2.0**-9 * 3):  # normal, odd mantissa, small, subnormal block scales
        for nudge in (0.0, 100.0, -100.0):
            magnitudes = torch.tensor(MIDPOINTS) * (block * unit)
            if nudge:
                magnitudes = torch.nextafter(magnitudes, torch.full_like(magnitudes, nudge))
            rows.append(torch.cat([torch.tensor([6.0 * block * unit]), magnitudes, -magnitudes, torch.zeros(1)]))
    w = torch.stack(rows).repeat(1, 2)
    w[0, 16] = POWER_OF_TWO_AMAX  # sets the tensor amax in a block of its own
    return w


def ties_under_an_arbitrary_global_scale(amax: float = 5.1) -> torch.Tensor:
    """One block per E4M3 scale from 0.5 to 2.25, holding ±midpoint·P with P = block scale·global scale rounded
    in float32: dividing by P (ModelOpt) gives the midpoints, dividing by each scale in turn misses some."""
    global_scale = torch.tensor(amax) / 2688
    rows = []
    for block in torch.arange(0x30, 0x48, dtype=torch.uint8).view(torch.float8_e4m3fn).float():
        unit = block * global_scale
        rows.append(torch.cat([(6 * unit).reshape(1), torch.tensor(MIDPOINTS) * unit, -torch.tensor(MIDPOINTS) * unit]))
    w = torch.nn.functional.pad(torch.stack(rows), (0, 1)).repeat(1, 2)
    w[0, 16] = amax
    return w


def nasty() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    zeros = torch.randn(32, 128, generator=g)
    zeros[3] = 0.0  # a zero row
    zeros[5, 16:48] = 0.0  # zero blocks
    zeros[7, :16] = torch.tensor([-0.0, 1e-9, -1e-9] + [0.0] * 12 + [1.0])  # -0 and tiny negatives that round to -0
    outlier = torch.randn(32, 128, generator=g)
    outlier[9, 77] = 1e4
    decades = torch.randn(64, 128, generator=g) * torch.logspace(0, -7, 64)[:, None]  # block scales down past 2^-9
    return {
        "zero rows and blocks": zeros,
        "single huge outlier": outlier,
        "subnormal block scales": decades,
        "rounding boundaries": on_rounding_boundaries(),
        "ties under an arbitrary global scale": ties_under_an_arbitrary_global_scale(),
        "bf16 input": torch.randn(32, 256, generator=g).bfloat16(),
    }


def modelopt_quantize(
    w: torch.Tensor, global_amax: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scale_2 = None if global_amax is None else torch.tensor(global_amax) / 2688
    qt, scale, scale_2 = NVFP4QTensor.quantize(w.clone(), 16, weights_scaling_factor_2=scale_2)
    return qt._quantized_data, scale, scale_2


def modelopt_dequantize(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    shape = (*packed.shape[:-1], packed.shape[-1] * 2)
    return NVFP4QTensor(shape, torch.float32, packed).dequantize(
        dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16}
    )


def assert_same_bits(ours: Nvfp4, other: Nvfp4) -> None:
    assert torch.equal(ours.codes, other.codes)
    assert torch.equal(ours.block_scales, other.block_scales)
    assert ours.global_scale.view(torch.int32) == other.global_scale.view(torch.int32)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def with_global_scale(q: Nvfp4, global_scale: float) -> Nvfp4:
    return Nvfp4(q.codes, q.block_scales, torch.tensor(global_scale), q.input_scale)


def ulps_apart(theirs: torch.Tensor, ours: torch.Tensor) -> float:
    """Largest difference in units of our value's last place (±0 count as equal)."""
    ulp = torch.nextafter(ours.abs(), torch.tensor(float("inf"))) - ours.abs()
    return ((theirs - ours).abs() / ulp).max().item()


# ModelOpt: the quantizer and dequantizer, bit for bit


@pytest.mark.parametrize("case", ["gaussian", *nasty()])
def test_quantize_matches_modelopt_bit_for_bit(case: str) -> None:
    w = gaussian() if case == "gaussian" else nasty()[case]
    q = nvfp4.quantize(w)
    packed, scale, scale_2 = modelopt_quantize(w)
    assert torch.equal(q.codes, packed)
    assert torch.equal(q.block_scales, scale.view(torch.uint8))
    assert q.global_scale.dtype == torch.float32 and q.global_scale.shape == ()
    assert q.global_scale.view(torch.int32) == scale_2.view(torch.int32)
    assert torch.equal(nvfp4.dequantize(q), modelopt_dequantize(packed, scale, scale_2))


def test_nasty_inputs_reach_the_cases_they_name() -> None:
    """The inputs above exercise what they claim: ties, -0 codes, subnormal and clamped block scales."""
    cases = nasty()
    codes = nvfp4.unpack(nvfp4.quantize(cases["rounding boundaries"]).codes)
    expected = torch.tensor(MIDPOINT_CODES, dtype=torch.uint8)
    exact, above, below = codes[0::3], codes[1::3], codes[2::3]
    assert (exact[:, 1:8] == expected).all() and (exact[:, 8:15] == expected | 8).all()
    assert (above[:, 1:8] == expected + torch.tensor([1, 0, 1, 0, 1, 0, 1], dtype=torch.uint8)).all()
    assert (below[:, 1:8] == expected - torch.tensor([0, 1, 0, 1, 0, 1, 0], dtype=torch.uint8)).all()
    assert nvfp4.unpack(nvfp4.quantize(cases["zero rows and blocks"]).codes)[7, :3].tolist() == [0, 0, 8]
    decades = nvfp4.quantize(cases["subnormal block scales"]).block_scales
    assert ((decades > 0x01) & (decades < 0x08)).any()  # subnormal E4M3
    assert (decades == 0x01).any()  # clamped at 2^-9


def test_calibrated_global_amax_matches_modelopt() -> None:
    """A calibrated amax below the tensor's pushes block scales past 448: both clamp and saturate the codes."""
    w = gaussian(64, 512)
    global_amax = w.abs().amax().item() / 4
    q = nvfp4.quantize(w, global_amax=global_amax)
    packed, scale, scale_2 = modelopt_quantize(w, global_amax)
    assert (q.block_scales == 0x7E).any()  # 448
    assert torch.equal(q.codes, packed) and torch.equal(q.block_scales, scale.view(torch.uint8))
    assert q.global_scale.view(torch.int32) == scale_2.view(torch.int32)


def test_all_zero_tensor_dequantizes_to_zero() -> None:
    """ModelOpt divides 0 by 0 here and stores NaN block scales; we store global scale 1 and block scale 1."""
    q = nvfp4.quantize(torch.zeros(4, 32))
    assert q.global_scale == 1.0 and (q.block_scales == 0x38).all() and (q.codes == 0).all()
    assert torch.equal(nvfp4.dequantize(q), torch.zeros(4, 32))
    _, scale, scale_2 = modelopt_quantize(torch.zeros(4, 32))
    assert scale_2 == 0 and scale.float().isnan().all()


def test_error_on_gaussian() -> None:
    w = gaussian()
    error = ((nvfp4.dequantize(nvfp4.quantize(w)) - w).norm() / w.norm()).item()
    assert 0.09 < error <= 0.096  # formats.md §7: 0.095-0.096


# compressed-tensors


def test_ct_tensors_are_what_cts_modelopt_converter_writes() -> None:
    q = nvfp4.quantize(gaussian(64, 512))
    q = Nvfp4(q.codes, q.block_scales, q.global_scale, torch.tensor(0.37))
    theirs = ModelOptNvfp4Converter(targets=["re:.*"]).process(
        {f"layer{suffix}": t for suffix, t in nvfp4.to_modelopt(q).items()}
    )
    ours = nvfp4.to_ct(q)
    assert sorted(f"layer{suffix}" for suffix in ours) == sorted(theirs)
    for suffix, tensor in ours.items():
        reference = theirs[f"layer{suffix}"]
        assert tensor.dtype == reference.dtype
        assert torch.equal(as_bytes(tensor), as_bytes(reference))


@pytest.mark.parametrize("case", ["gaussian", "rounding boundaries"])
def test_cts_compressor_packs_the_same_bytes(case: str) -> None:
    w = gaussian() if case == "gaussian" else on_rounding_boundaries()
    ours = nvfp4.to_ct(nvfp4.quantize(w))
    theirs = NVFP4PackedCompressor.compress(
        {
            "weight": w,
            "weight_scale": ours[".weight_scale"].float(),
            "weight_global_scale": ours[".weight_global_scale"],
        },
        CT_SCHEME,
    )
    assert torch.equal(theirs["weight_packed"], ours[".weight_packed"])
    assert torch.equal(theirs["weight_scale"].view(torch.uint8), ours[".weight_scale"].view(torch.uint8))
    assert_same_bits(nvfp4.from_ct({f".{k}": v for k, v in theirs.items()}), nvfp4.from_ct(ours))


def test_cts_pack_and_unpack_agree_with_our_codes() -> None:
    codes = nvfp4.quantize(nasty()["zero rows and blocks"]).codes
    assert (nvfp4.unpack(codes) == 8).any()  # -0 codes are in there
    values = unpack_fp4_from_uint8(codes, 32, 128, torch.float32)
    assert torch.equal(values, nvfp4.E2M1_VALUES[nvfp4.unpack(codes).long()])
    assert torch.equal(pack_fp4_to_uint8(values), codes)


@pytest.mark.parametrize("global_amax", [None, POWER_OF_TWO_AMAX])
def test_cts_dequantize_of_our_tensors(global_amax: float | None) -> None:
    w = gaussian()
    q = nvfp4.quantize(w, global_amax=global_amax)
    ct = nvfp4.to_ct(q)
    theirs = ct_dequantize(
        unpack_fp4_from_uint8(ct[".weight_packed"], *w.shape, torch.float32),
        ct[".weight_scale"].float(),
        args=CT_SCHEME.weights,
        global_scale=ct[".weight_global_scale"],
        dtype=torch.float32,
    )
    ours = nvfp4.dequantize(q)
    if global_amax is None:
        assert 0 < ulps_apart(theirs, ours) <= 2  # CT divides by the inverted scale: two roundings more
    else:
        assert torch.equal(theirs, ours)


# MLX


def mlx_dequantize(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    global_scale = parts.get(".global_scale")
    result = mx.dequantize(
        mx.array(parts[".weight"].numpy()),
        mx.array(parts[".scales"].numpy()),
        mode="nvfp4",
        group_size=16,
        bits=4,
        dtype=mx.float32,
        global_scale=None if global_scale is None else mx.array(global_scale.numpy()),
    )
    return torch.from_numpy(np.array(result))


@pytest.mark.parametrize("case", ["gaussian", *nasty()])
def test_mlx_dequantize_of_our_tensors(case: str) -> None:
    q = nvfp4.quantize(gaussian() if case == "gaussian" else nasty()[case])
    parts = nvfp4.to_mlx(q)
    assert parts[".weight"].dtype == torch.uint32 and parts[".global_scale"].shape == ()
    assert torch.equal(mlx_dequantize(parts), nvfp4.dequantize(q))


def test_mlx_without_global_scale() -> None:
    q = nvfp4.quantize(gaussian(16, 64), global_amax=2688.0)  # global scale 1: MLX stores none
    parts = nvfp4.to_mlx(q)
    assert ".global_scale" not in parts
    assert torch.equal(mlx_dequantize(parts), nvfp4.dequantize(q))
    assert nvfp4.from_mlx(parts).global_scale == 1.0


@pytest.mark.parametrize("with_global", [False, True])
def test_reading_what_mlx_quantizes(with_global: bool) -> None:
    w = mx.array(gaussian(64, 256).numpy())
    global_scale = mx.abs(w).max() if with_global else None
    codes, scales = mx.quantize(w, group_size=16, bits=4, mode="nvfp4", global_scale=global_scale)
    parts = {".weight": torch.from_numpy(np.array(codes)), ".scales": torch.from_numpy(np.array(scales))}
    if with_global:
        parts[".global_scale"] = torch.from_numpy(np.array(global_scale))
    assert torch.equal(nvfp4.dequantize(nvfp4.from_mlx(parts)), mlx_dequantize(parts))


# GGUF


@pytest.mark.parametrize("global_amax", [None, POWER_OF_TWO_AMAX])
def test_gguf_py_dequantize_of_our_blocks(global_amax: float | None) -> None:
    q = nvfp4.quantize(gaussian(), global_amax=global_amax)
    parts = nvfp4.to_gguf(q)
    assert parts[".weight"].shape == (256, 4096 // 64 * 36)
    blocks = gguf.quants.dequantize(parts[".weight"].numpy(), gguf.GGMLQuantizationType.NVFP4)
    assert torch.equal(torch.from_numpy(blocks), nvfp4.dequantize(with_global_scale(q, 1.0)))
    theirs = torch.from_numpy(blocks * parts[".scale"].numpy())
    ours = nvfp4.dequantize(q)
    if global_amax is None:  # gguf-py scales the block product, llama.cpp the matmul output: last bits differ
        assert 0 < ulps_apart(theirs, ours) <= 1
    else:
        assert torch.equal(theirs, ours)


# Between flavours: bits only


def test_modelopt_gguf_ct_mlx_modelopt_is_lossless() -> None:
    q = nvfp4.quantize(gaussian())
    assert 1 / (1 / q.global_scale) == q.global_scale  # this seed's scale survives CT's reciprocal (see below)
    start = nvfp4.to_modelopt(q)
    parts, path = start, ["nvfp4-modelopt", "nvfp4-gguf", "nvfp4-ct", "nvfp4-mlx", "nvfp4-modelopt"]
    for source, target in zip(path, path[1:]):
        step = FLAVOURS[source].from_parts(parts, "layer")
        assert torch.equal(nvfp4.dequantize(step), nvfp4.dequantize(q))
        parts = FLAVOURS[target].to_parts(step, "layer")
    assert start.keys() == parts.keys()
    for suffix in start:
        assert start[suffix].dtype == parts[suffix].dtype and start[suffix].shape == parts[suffix].shape
        assert torch.equal(as_bytes(start[suffix]), as_bytes(parts[suffix]))


@pytest.mark.parametrize("source", FLAVOURS)
@pytest.mark.parametrize("target", FLAVOURS)
def test_every_pair_keeps_codes_and_block_scales(source: str, target: str) -> None:
    q = nvfp4.quantize(nasty()["subnormal block scales"])
    there = FLAVOURS[target].from_parts(
        FLAVOURS[target].to_parts(FLAVOURS[source].from_parts(FLAVOURS[source].to_parts(q, "m"), "m"), "m"), "m"
    )
    assert torch.equal(there.codes, q.codes) and torch.equal(there.block_scales, q.block_scales)


def test_per_tensor_factor_through_mlx_and_ct() -> None:
    """MLX's ×2688 gives back every global scale the quantizer can make (amax/2688, all float32 amax in a binade,
    which repeats in every binade); CT's reciprocal cannot hold about 12% of them in float32: one ulp off."""
    amax = torch.arange(0x3F800000, 0x40000000, dtype=torch.int32).view(torch.float32)
    scale = amax / 2688
    assert torch.equal(scale * 2688 / 2688, scale)
    through_ct = 1 / (1 / scale)
    lost = through_ct != scale
    assert 0.11 < lost.float().mean() < 0.125
    assert (through_ct.view(torch.int32) - scale.view(torch.int32)).abs().max() == 1
    nearest = (1 / scale[lost]).view(torch.int32)
    for step in range(-2, 3):  # no float32 near 1/scale inverts back to it: CT cannot store these at all
        assert not (1 / (nearest + step).view(torch.float32) == scale[lost]).any()
    q = with_global_scale(nvfp4.quantize(gaussian(16, 64)), scale[lost][0].item())
    back = nvfp4.from_ct(nvfp4.to_ct(q))
    assert torch.equal(back.codes, q.codes) and torch.equal(back.block_scales, q.block_scales)
    assert back.global_scale != q.global_scale


def test_input_scale_travels_with_modelopt_ct_and_gguf() -> None:
    q = nvfp4.quantize(gaussian(16, 64))
    q = Nvfp4(q.codes, q.block_scales, q.global_scale, torch.tensor(0.5))
    assert nvfp4.to_ct(q)[".input_global_scale"].item() == 2.0
    for flavour in ("nvfp4-modelopt", "nvfp4-ct", "nvfp4-gguf"):
        assert FLAVOURS[flavour].from_parts(FLAVOURS[flavour].to_parts(q, "m"), "m").input_scale == 0.5
    assert nvfp4.from_mlx(nvfp4.to_mlx(q)).input_scale is None  # MLX runs NVFP4 weight-only


# Bad input


def q_of(cols: int) -> Nvfp4:
    return nvfp4.quantize(gaussian(4, cols))


def modelopt_parts(cols: int = 64, **replace: torch.Tensor | None) -> dict[str, torch.Tensor]:
    parts = {**nvfp4.to_modelopt(q_of(cols)), **replace}
    return {suffix: t for suffix, t in parts.items() if t is not None}


BAD = {
    "quantize: 40 columns": (
        lambda: nvfp4.quantize(gaussian(4, 40), name="m.weight"),
        "m.weight",
        "multiple of the 16",
    ),
    "quantize: negative global amax": (
        lambda: nvfp4.quantize(gaussian(4, 16), global_amax=-1.0, name="m.weight"),
        "m.weight",
        "≥ 0",
    ),
    "quantize: NaN": (lambda: nvfp4.quantize(torch.full((4, 16), float("nan")), name="m.weight"), "m.weight", "NaN"),
    "modelopt: 40 columns": (
        lambda: nvfp4.from_modelopt(
            {
                ".weight": torch.zeros(4, 20, dtype=torch.uint8),
                ".weight_scale": torch.zeros(4, 2).to(torch.float8_e4m3fn),
                ".weight_scale_2": torch.tensor(1.0),
            },
            "m",
        ),
        "m.weight",
        "multiple of the 16",
    ),
    "modelopt: scale shape": (
        lambda: nvfp4.from_modelopt(modelopt_parts(**{".weight_scale": torch.ones(4, 3).to(torch.float8_e4m3fn)}), "m"),
        "m.weight_scale",
        "[4, 4]",
    ),
    "modelopt: scale dtype": (
        lambda: nvfp4.from_modelopt(modelopt_parts(**{".weight_scale": torch.ones(4, 4)}), "m"),
        "m.weight_scale",
        "dtype",
    ),
    "modelopt: no block scales": (
        lambda: nvfp4.from_modelopt(modelopt_parts(**{".weight_scale": None}), "m"),
        "m.weight_scale",
        "missing",
    ),
    "modelopt: no weight_scale_2": (
        lambda: nvfp4.from_modelopt(modelopt_parts(**{".weight_scale_2": None}), "m"),
        "m.weight_scale_2",
        "missing",
    ),
    "modelopt: vector weight_scale_2": (
        lambda: nvfp4.from_modelopt(modelopt_parts(**{".weight_scale_2": torch.ones(2)}), "m"),
        "m.weight_scale_2",
        "one per-tensor",
    ),
    "ct: no global scale": (
        lambda: nvfp4.from_ct({k: v for k, v in nvfp4.to_ct(q_of(64)).items() if k != ".weight_global_scale"}, "m"),
        "m.weight_global_scale",
        "missing",
    ),
    "ct: zero global scale": (
        lambda: nvfp4.from_ct({**nvfp4.to_ct(q_of(64)), ".weight_global_scale": torch.zeros(1)}, "m"),
        "m.weight_global_scale",
        "positive",
    ),
    "mlx: scales shape": (
        lambda: nvfp4.from_mlx({**nvfp4.to_mlx(q_of(64)), ".scales": torch.zeros(4, 8, dtype=torch.uint8)}, "m"),
        "m.scales",
        "[4, 4]",
    ),
    "gguf: 48 columns": (lambda: nvfp4.to_gguf(q_of(48), "m"), "m.weight", "multiple of the 64"),
    "gguf: 40-byte rows": (
        lambda: nvfp4.from_gguf({".weight": torch.zeros(4, 40, dtype=torch.uint8)}, "m"),
        "m.weight",
        "36-byte blocks",
    ),
    "gguf: scale byte with a sign": (
        lambda: nvfp4.from_gguf({".weight": torch.full((4, 36), 0x80, dtype=torch.uint8)}, "m"),
        "m.weight",
        "0x7e",
    ),
    "gguf: negative block scale": (
        lambda: nvfp4.to_gguf(
            Nvfp4(
                torch.zeros(1, 32, dtype=torch.uint8), torch.full((1, 4), 0xB8, dtype=torch.uint8), torch.tensor(1.0)
            ),
            "m",
        ),
        "m.weight",
        "negative",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_the_tensor(case: str) -> None:
    call, where, words = BAD[case]
    with pytest.raises(BadInput) as caught:
        call()
    assert caught.value.where == where
    assert words in caught.value.problem and "\n" not in str(caught.value)
