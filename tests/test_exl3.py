"""EXL3: our decoder bit for bit against ExLlamaV3's own output (tests/exl3_fixtures, made on a GPU with
exllamav3; see its README), and our encoder's search, error, determinism and refusals.

Runs the torch CPU path; the Triton path was checked against it on the GPU machine (same bytes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from specpair.errors import BadInput
from specpair.formats import exl3

FIXTURES = Path(__file__).parent / "exl3_fixtures" / "exl3_fixtures.safetensors"
SUFFIXES = (".trellis", ".suh", ".svh", ".su", ".sv", ".mcg", ".mul1")
MODULE = "model.layers.0.mlp.down_proj"


def load_fixtures() -> tuple[dict[str, torch.Tensor], dict[str, list[int]], dict[str, str]]:
    with safe_open(FIXTURES, "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        metadata = f.metadata()
    return tensors, json.loads(metadata["shapes"]), metadata


TENSORS, SHAPES, METADATA = load_fixtures()


def parts_of(module: str) -> dict[str, torch.Tensor]:
    return {suffix: TENSORS[module + suffix] for suffix in SUFFIXES if module + suffix in TENSORS}


def codebook_of(module: str) -> str:
    return module.split(".")[0]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_fixtures_cover_every_codebook_and_rate():
    modules = {(codebook_of(m), TENSORS[m + ".trellis"].shape[-1] / 16) for m in SHAPES}
    assert modules >= {(c, float(k)) for c in exl3.CODEBOOKS for k in exl3.BITS}
    assert modules >= {("mul1", k) for k in exl3.HALF_BITS}
    assert METADATA["exllamav3"] == "1.6.5"


@pytest.mark.parametrize("module", [m for m in SHAPES if m + ".reconstruct" in TENSORS])
def test_reconstruct_is_exllamav3s(module: str):
    trellis = TENSORS[module + ".trellis"]
    q = exl3.reconstruct(trellis, trellis.shape[-1] / 16, codebook_of(module))
    assert q.dtype == torch.float16
    assert torch.equal(q.view(torch.int16), TENSORS[module + ".reconstruct"].view(torch.int16))


@pytest.mark.parametrize("module", list(SHAPES))
def test_dequantize_is_get_weight_tensor(module: str):
    expected = TENSORS[module + ".weight"].T.float()  # exllamav3 gives [in_p, out_p] fp16
    out, inp = SHAPES[module]
    w = exl3.dequantize(parts_of(module), (out, inp), module)
    assert w.dtype == torch.float32 and w.shape == (out, inp)
    assert torch.equal(w, expected[:out, :inp])
    assert torch.equal(exl3.dequantize(parts_of(module), module=module), expected)


def test_padding_decodes_to_zero():
    """The crop fixture: a [100, 200] weight padded to [128, 256]; exllamav3 zeroes the padded outputs' scales."""
    w = exl3.dequantize(parts_of("mul1.k4.crop"), module="mul1.k4.crop")
    assert w.shape == (128, 256) and not w[100:].any()


def ring_tiles(count: int, bits: int, codebook: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiles whose values are exactly a random valid state ring: (tiles, their states)."""
    chunks = torch.randint(0, 1 << bits, (count, exl3.TILE_LEN), generator=torch.Generator().manual_seed(seed))
    trellis = exl3.pack_states(chunks, bits)
    states = exl3.unpack_states(trellis, bits)
    return exl3.codebook_values(codebook).float()[states], states


@pytest.mark.parametrize("bits", exl3.BITS)
def test_pack_then_unpack_gives_the_ring(bits: int):
    chunks = torch.randint(0, 1 << bits, (3, exl3.TILE_LEN), generator=torch.Generator().manual_seed(bits))
    states = exl3.unpack_states(exl3.pack_states(chunks, bits), bits)
    assert torch.equal(states & ((1 << bits) - 1), chunks)  # each state ends with its own chunk...
    previous = states.roll(1, -1)  # ...after the previous state's low 16 - K bits (the ring wraps)
    assert torch.equal(states >> bits, previous & ((1 << (16 - bits)) - 1))
    assert torch.equal(exl3.pack_states(states, bits), exl3.pack_states(chunks, bits))


@pytest.mark.parametrize(("bits", "codebook"), [(2, "3inst"), (4, "mul1"), (6, "mcg")])
def test_search_finds_an_exact_ring(bits: int, codebook: str):
    """Tiles that are codebook values of some ring have a zero-error answer; the tail-biting search must find
    one (a ring with the same values, if not the same states)."""
    tiles, _ = ring_tiles(4, bits, codebook, seed=bits)
    states = exl3.viterbi(tiles, bits, codebook)
    assert torch.equal(exl3.codebook_values(codebook).float()[states], tiles)
    assert torch.equal(exl3.unpack_states(exl3.pack_states(states, bits), bits), states)


def gaussian(rows: int = 128, cols: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def mul1_4bit() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    w = gaussian(100, 120)
    return w, exl3.quantize(w, 4, "mul1", name=MODULE, seed=7)


def relative_error(w: torch.Tensor, parts: dict[str, torch.Tensor]) -> float:
    return (torch.linalg.norm(exl3.dequantize(parts, tuple(w.shape)) - w) / torch.linalg.norm(w)).item()


def test_error_at_4_bits(mul1_4bit):
    assert relative_error(*mul1_4bit) <= 0.075


@pytest.mark.parametrize(("bits", "codebook", "bound"), [(3, "mul1", 0.145), (4, "3inst", 0.075), (4, "mcg", 0.075)])
def test_error_bounds(bits: int, codebook: str, bound: float):
    w = gaussian(seed=bits)
    assert relative_error(w, exl3.quantize(w, bits, codebook)) <= bound


def test_same_seed_same_bytes(mul1_4bit):
    w, parts = mul1_4bit
    again = exl3.quantize(w.clone(), 4, "mul1", name=MODULE, seed=7)
    assert parts.keys() == again.keys()
    assert all(torch.equal(parts[key], again[key]) for key in parts)


def test_stored_shapes_describe_quantize(mul1_4bit):
    w, parts = mul1_4bit
    stored = exl3.stored_shapes(tuple(w.shape), 4, "mul1")
    dtypes = {torch.int16: "I16", torch.float16: "F16", torch.int32: "I32"}
    assert stored == {key: (dtypes[t.dtype], tuple(t.shape)) for key, t in parts.items()}
    assert exl3.stored_shapes((100, 200), 3, "3inst") == {  # [out, in]: tiles of the transposed, padded weight
        ".trellis": ("I16", (256 // 16, 128 // 16, 48)),
        ".suh": ("F16", (256,)),
        ".svh": ("F16", (128,)),
    }


def test_zero_and_padded_channels_decode_to_zero():
    w = gaussian(120, 100)
    w[5] = 0  # a dead output channel
    w[:, 9] = 0  # a dead input channel
    decoded = exl3.dequantize(exl3.quantize(w, 4, "mcg"))
    assert decoded.shape == (128, 128)
    assert not decoded[5].any() and not decoded[:, 9].any() and not decoded[120:].any() and not decoded[:, 100:].any()
    assert decoded[6, :9].all() and decoded[:5, 10].all()  # live channels are not zeroed


def test_quantization_config():
    assert exl3.quantization_config(4, 6, "mul1") == {
        "quant_method": "exl3",
        "version": "1.6.5",
        "bits": 4,
        "head_bits": 6,
        "out_scales": "always",
        "codebook": "mul1",
    }


def bad(parts: dict[str, torch.Tensor], **changes: torch.Tensor | None) -> dict[str, torch.Tensor]:
    out = {**parts, **changes}
    return {key: value for key, value in out.items() if value is not None}


GOOD = parts_of("mul1.k4")
TRELLIS = GOOD[".trellis"]


@pytest.mark.parametrize(
    ("parts", "where", "problem"),
    [
        (bad(GOOD, **{".trellis": None}), ".trellis", "missing"),
        (bad(GOOD, **{".trellis": TRELLIS[..., :60]}), ".trellis", "last dim 60 is not 16·bits"),
        (bad(GOOD, **{".trellis": TRELLIS.float()}), ".trellis", "dtype torch.float32"),
        (bad(GOOD, **{".trellis": TRELLIS[0]}), ".trellis", "expected [in/16, out/16, 16·bits]"),
        (bad(GOOD, **{".trellis": TRELLIS[:4]}), ".trellis", "not whole 128-wide blocks"),
        (bad(GOOD, **{".suh": GOOD[".suh"][:64]}), ".suh", "expected torch.float16 [128]"),
        (bad(GOOD, **{".svh": GOOD[".svh"].float()}), ".svh", "got torch.float32 [128]"),
        (bad(GOOD, **{".svh": None}), ".svh", "missing"),
        (bad(GOOD, **{".sv": torch.zeros(4, dtype=torch.int16), ".svh": None}), ".sv", "expected torch.int16 [8]"),
        (bad(GOOD, **{".mul1": torch.tensor(5, dtype=torch.int32)}), ".mul1", "holds 0x5, expected 0x83dcd12d"),
        (bad(GOOD, **{".mul1": torch.zeros(1, dtype=torch.int32)}), ".mul1", "expected an int32 scalar"),
        (bad(GOOD, **{".mcg": TENSORS["mcg.k4.mcg"]}), ".mcg", "both codebook markers"),
        (bad(parts_of("mul1.k2_5"), **{".mul1": None}), ".trellis", "2.5 bits per weight exist only with the mul1"),
    ],
)
def test_bad_stored_tensors_name_the_tensor(parts: dict[str, torch.Tensor], where: str, problem: str):
    with pytest.raises(BadInput) as error:
        exl3.dequantize(parts, module=MODULE)
    assert error.value.where == MODULE + where
    assert problem in error.value.problem
    assert "\n" not in str(error.value)


def test_bad_crop_shape():
    with pytest.raises(BadInput, match=r"^model\.layers\.0\.mlp\.down_proj\.trellis: .*does not pad \[300, 100\]"):
        exl3.dequantize(GOOD, (300, 100), MODULE)


@pytest.mark.parametrize(
    ("w", "bits", "codebook", "problem"),
    [
        (gaussian(), 4, "e8p", "unknown EXL3 codebook 'e8p'"),
        (gaussian(), 9, "mul1", "1..8 bits per weight, not 9"),
        (gaussian(), 2.5, "mul1", "not 2.5"),
        (gaussian(), True, "mul1", "not True"),
        (gaussian()[0], 4, "mul1", "expected a non-empty float matrix"),
        (gaussian().to(torch.int32), 4, "mul1", "expected a non-empty float matrix"),
        (torch.full((128, 128), float("nan")), 4, "mul1", "NaN or infinite"),
        (gaussian() * 1e6, 4, "mul1", "overflows fp16"),
        (gaussian() * 1e-9, 4, "mul1", "underflows fp16"),
    ],
)
def test_bad_encoder_input_names_the_tensor(w: torch.Tensor, bits: int, codebook: str, problem: str):
    with pytest.raises(BadInput) as error:
        exl3.quantize(w, bits, codebook, name=MODULE)
    assert error.value.where == MODULE and problem in error.value.problem


def test_unknown_codebook_in_stored_shapes_and_config():
    with pytest.raises(BadInput, match="unknown EXL3 codebook"):
        exl3.stored_shapes((128, 128), 4, "qtip")
    with pytest.raises(BadInput, match="unknown codebook"):
        exl3.quantization_config(4, 6, "qtip")
