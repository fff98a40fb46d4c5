"""GGUF quantized types: our quantizers against gguf-py 0.19.0, llama.cpp's reference bytes, and formats.md §6.

The k-quant layouts are restated here from formats.md §6, element by element, sharing no code with
specpair.formats.gguf_quants; gguf-py's dequantizer must agree with that statement bit for bit, on random
bytes and on ours. llama.cpp itself is not built here: GOLDEN holds the sha256 of the bytes its reference
quantizers (quantize_row_*_ref in ggml/src/ggml-quants.c, llama-cpp-python 0.3.36 sdist, compiled alone with
gcc 12 `-O2 -DNDEBUG` on x86-64, as a release build compiles it) wrote for golden_input();
`benchmarks/kquant_errors.py --ggml-src` builds it the same way and compares more inputs.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from specpair.errors import BadInput
from specpair.formats import gguf_quants
from specpair.formats.gguf_quants import BLOCK_SIZES, KQUANT_BLOCKS, WRITABLE, dequantize, quantize

NAME = "blk.7.ffn_down.weight"
KQUANTS = ("Q4_K", "Q5_K", "Q6_K")
GGUF_PY_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")

GOLDEN = {
    "Q4_K": "7093f37bb45911def38ef7b371fbb880828d0c4b9c5987d44dd893e59ae720d4",
    "Q5_K": "1bf8ac35ad294b72a3aff392edafd6305ee1302b7193d6a92eae6252a9ceff24",
    "Q6_K": "19ae8acdd74b26272e06ec141f2199fb7742e76730ec99ba18702ae133309193",
    "Q8_0": "ec8de3187b27272b6d2b497026babc83e35a09e2d23362c658c97f196bdd5fa9",
    "Q4_0": "82a0085aab6f08718ee38d14c313ccd965f9867c53ec0ef1596edae11597b7e4",
}


def golden_input() -> np.ndarray:
    """float32 [64, 2048] from integer arithmetic only (no RNG stream that could change), plus the cases
    llama.cpp branches on: zero, constant, one-signed, outlier-dominated, tiny and tied sub-blocks."""
    z = np.arange(64 * 2048 * 4, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)  # splitmix64 of the index
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    uniform = ((z >> np.uint64(40)).astype(np.float64) + 0.5) / 2.0**24  # its top 24 bits, in (0, 1)
    u = uniform.reshape(4, 64, 2048)
    x = ((u[0] + u[1] + u[2] + u[3] - 2.0) * 1.7320508075688772).astype(np.float32)  # ~N(0, 1), Irwin–Hall
    x[0, :256] = 0  # an all-zero super-block
    x[1, 32:64] = -0.75  # a constant negative sub-block (no range)
    x[1, 64:96] = 0.5  # a constant positive one (the offset is kept at zero)
    x[2, 256:512] = np.abs(x[2, 256:512])  # one-signed super-blocks
    x[5, :256] = -np.abs(x[5, :256])
    x[3, 10] = 1000.0  # an outlier: the other sub-blocks' 6-bit scales round to 0
    x[4, 512:768] *= np.float32(1e-12)  # f16 super-block scales underflow
    x[6] = np.round(x[6] * 3)  # integers: ties in round-half-to-even
    x[7, 16:32] *= np.float32(1e-20)  # a Q6_K sub-block below llama.cpp's 1e-15 zero threshold
    x[7, 512:576] *= np.float32(1e-39)  # denormals: 15/range overflows to inf in the Q4_K/Q5_K fit
    return x


def gaussian(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def relative_error(x: np.ndarray, qtype: str, method: str) -> float:
    y = dequantize(quantize(x, qtype, method, name=NAME), qtype, x.shape, name=NAME)
    return float(np.linalg.norm(y - x) / np.linalg.norm(x))


# ---- formats.md §6, restated per element ------------------------------------------------------------


def spec_affine_fields(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, ...]:
    """Q4_K/Q5_K bytes -> (d [n], dmin [n], sc [n, 8], m [n, 8], q [n, 256]) as formats.md §6 reads them."""
    b = raw.reshape(-1, 144 if qtype == "Q4_K" else 176)
    d = b[:, 0:2].copy().view("<f2")[:, 0].astype(np.float32)
    dmin = b[:, 2:4].copy().view("<f2")[:, 0].astype(np.float32)
    s = b[:, 4:16].astype(np.int64)
    sc = np.empty((len(b), 8), np.int64)
    m = np.empty((len(b), 8), np.int64)
    for j in range(8):
        if j < 4:
            sc[:, j], m[:, j] = s[:, j] & 63, s[:, j + 4] & 63
        else:
            sc[:, j] = (s[:, j + 4] & 15) | ((s[:, j - 4] >> 6) << 4)
            m[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    qs = b[:, 16:144] if qtype == "Q4_K" else b[:, 48:176]
    e = np.arange(256)
    byte = qs[:, 32 * (e // 64) + e % 32].astype(np.int64)
    q = np.where(e % 64 < 32, byte & 15, byte >> 4)
    if qtype == "Q5_K":
        q = q | ((b[:, 16 + e % 32].astype(np.int64) >> (e // 32)) & 1) << 4
    return d, dmin, sc, m, q


def spec_q6_fields(raw: np.ndarray) -> tuple[np.ndarray, ...]:
    """Q6_K bytes -> (d [n], scales [n, 16], q [n, 256] in -32..31) as formats.md §6 reads them."""
    b = raw.reshape(-1, 210)
    e = np.arange(256)
    half, r = e // 128, e % 128
    ql = b[:, 64 * half + r % 64].astype(np.int64)
    low = np.where(r < 64, ql & 15, ql >> 4)
    high = (b[:, 128 + 32 * half + r % 32].astype(np.int64) >> (2 * (r // 32))) & 3
    scales = b[:, 192:208].copy().view(np.int8).astype(np.int64)
    d = b[:, 208:210].copy().view("<f2")[:, 0].astype(np.float32)
    return d, scales, (low | high << 4) - 32


def spec_values(raw: np.ndarray, qtype: str) -> np.ndarray:
    """float32 [n, 256]: y = d·sc·q − dmin·m (Q4_K, Q5_K) or d·scale·q (Q6_K), products in that order."""
    if qtype == "Q6_K":
        d, scales, q = spec_q6_fields(raw)
        return (d[:, None] * scales[:, np.arange(256) // 16].astype(np.float32)) * q.astype(np.float32)
    d, dmin, sc, m, q = spec_affine_fields(raw, qtype)
    j = np.arange(256) // 32
    step, offset = d[:, None] * sc[:, j].astype(np.float32), dmin[:, None] * m[:, j].astype(np.float32)
    return step * q.astype(np.float32) - offset


# ---- tables ------------------------------------------------------------------------------------------


def test_tables_agree_with_gguf_constants() -> None:
    assert set(WRITABLE) == {*GGUF_PY_TYPES, *KQUANTS}
    for name, ggml_type in WRITABLE.items():
        assert ggml_type.name == name and BLOCK_SIZES[name] == GGML_QUANT_SIZES[ggml_type]
    for name, layout in KQUANT_BLOCKS.items():
        assert layout.itemsize == BLOCK_SIZES[name][1]


# ---- F32, F16, BF16, Q8_0, Q4_0: gguf-py's quantizers --------------------------------------------------


@pytest.mark.parametrize("qtype", GGUF_PY_TYPES)
@pytest.mark.parametrize("shape", [(1, 64), (301, 96), (3, 5, 128)], ids=["one-row", "many-rows", "3d"])
def test_gguf_py_types_are_gguf_py_bytes(qtype: str, shape: tuple[int, ...]) -> None:
    x = gaussian(int(np.prod(shape[:-1])), shape[-1], seed=len(shape)).reshape(shape) * np.float32(3)
    ours = quantize(x, qtype, name=NAME)
    theirs = gguf_quantize(x, GGMLQuantizationType[qtype]).view(np.uint8)
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(
        dequantize(ours, qtype, shape, name=NAME), gguf_dequantize(theirs, GGMLQuantizationType[qtype])
    )


def test_lower_case_type_names_are_accepted() -> None:
    x = gaussian(2, 256)
    np.testing.assert_array_equal(quantize(x, "q6_k", name=NAME), quantize(x, "Q6_K", name=NAME))


# ---- k-quants: layout, codes, llama.cpp bytes ---------------------------------------------------------


@pytest.mark.parametrize("qtype", KQUANTS)
def test_gguf_py_reads_random_blocks_as_formats_md_says(qtype: str) -> None:
    """Every bit of every field: random bytes (finite f16 scales) decode the same both ways."""
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (500, BLOCK_SIZES[qtype][1]), dtype=np.uint8)
    scales = rng.uniform(-2, 2, (500, 2)).astype(np.float16).view(np.uint8)
    if qtype == "Q6_K":
        raw[:, 208:210] = scales[:, :2]
    else:
        raw[:, 0:4] = scales
    np.testing.assert_array_equal(gguf_dequantize(raw, GGMLQuantizationType[qtype]), spec_values(raw, qtype))


@pytest.mark.parametrize("method", ["search", "rtn"])
@pytest.mark.parametrize("qtype", KQUANTS)
def test_our_blocks_hold_each_value_at_its_nearest_code(qtype: str, method: str) -> None:
    """gguf-py decodes our bytes as formats.md §6 does, and every stored code is the value's nearest
    level on its sub-block's stored grid: a code packed into another value's slot would not be."""
    x = np.concatenate([gaussian(16, 2048, seed=5), golden_input()], axis=0)
    raw = quantize(x, qtype, method, name=NAME)
    blocks = x.reshape(-1, 256)
    np.testing.assert_array_equal(
        gguf_dequantize(raw, GGMLQuantizationType[qtype]).reshape(-1, 256), spec_values(raw, qtype)
    )
    if qtype == "Q6_K":
        d, scales, q = spec_q6_fields(raw)
        step = d[:, None] * scales[:, np.arange(256) // 16].astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            nearest = np.clip(np.rint(blocks / step), -32, 31)
    else:
        d, dmin, sc, m, q = spec_affine_fields(raw, qtype)
        j = np.arange(256) // 32
        step = d[:, None] * sc[:, j].astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            nearest = np.clip(
                np.rint((blocks + dmin[:, None] * m[:, j].astype(np.float32)) / step), 0, 15 if qtype == "Q4_K" else 31
            )
    used = step != 0
    assert used.mean() > 0.9
    np.testing.assert_array_equal(q[used], nearest[used])


@pytest.mark.parametrize("qtype", [*KQUANTS, "Q8_0", "Q4_0"])
def test_bytes_equal_llama_cpp_reference_quantizers(qtype: str) -> None:
    raw = quantize(golden_input(), qtype, "search", name=NAME)
    assert hashlib.sha256(raw.tobytes()).hexdigest() == GOLDEN[qtype]


def test_zero_q6_k_super_block_is_all_zero_bytes() -> None:
    x = gaussian(1, 768)
    x[0, 256:512] = 0
    raw = quantize(x, "Q6_K", name=NAME).reshape(3, 210)
    assert not raw[1].any() and raw[0].any() and raw[2].any()


@pytest.mark.parametrize("qtype", KQUANTS)
def test_slices_of_many_blocks_match_rows_alone(qtype: str) -> None:
    """More super-blocks than one pass takes: the slices must not mix blocks up."""
    rows, cols = 5, 256 * (gguf_quants.CHUNK_BLOCKS // 4 + 3)
    x = gaussian(rows, cols, seed=11)
    whole = quantize(x, qtype, name=NAME)
    np.testing.assert_array_equal(
        whole, np.concatenate([quantize(x[r : r + 1], qtype, name=NAME) for r in range(rows)])
    )


# ---- errors on N(0, 1) ---------------------------------------------------------------------------------

BOUNDS = {"Q8_0": 0.0055, "Q6_K": 0.019, "Q5_K": 0.038, "Q4_K": 0.078}


@pytest.fixture(scope="module")
def normal_matrix() -> np.ndarray:
    return gaussian(256, 4096, seed=1234)


@pytest.mark.parametrize("qtype", list(BOUNDS))
def test_relative_error_on_gaussian(qtype: str, normal_matrix: np.ndarray) -> None:
    error = relative_error(normal_matrix, qtype, "search")
    assert error <= BOUNDS[qtype]
    if qtype in KQUANTS:
        assert error < relative_error(normal_matrix, qtype, "rtn")


# ---- dequantize ----------------------------------------------------------------------------------------


def test_dequantize_reads_types_we_do_not_write() -> None:
    rng = np.random.default_rng(9)
    raw = rng.integers(0, 256, (2, 3, 4 * 36), dtype=np.uint8)  # NVFP4: 64 values in 36 bytes
    ours = dequantize(raw, "NVFP4", (2, 3, 256), name=NAME)
    assert ours.shape == (2, 3, 256) and ours.dtype == np.float32
    np.testing.assert_array_equal(ours.reshape(6, 256), gguf_dequantize(raw.reshape(6, -1), GGMLQuantizationType.NVFP4))


def test_f32_round_trip_is_exact() -> None:
    x = gaussian(3, 7)
    np.testing.assert_array_equal(dequantize(quantize(x, "F32", name=NAME), "F32", x.shape, name=NAME), x)


# ---- bad input -----------------------------------------------------------------------------------------


def with_nan() -> np.ndarray:
    x = gaussian(2, 256)
    x[1, 3] = np.nan
    return x


def with_outlier(value: float) -> np.ndarray:
    """Large values both ways, so that a block's range (Q4_K's mins included) overflows f16 scales."""
    x = gaussian(2, 256)
    x[1, 3], x[1, 4] = value, -value
    return x


@pytest.mark.parametrize(
    "call, problem",
    [
        (
            lambda: quantize(gaussian(4, 300), "Q4_K", name=NAME),
            "rows of 300 values do not split into Q4_K blocks of 256",
        ),
        (lambda: quantize(gaussian(4, 48), "Q8_0", name=NAME), "rows of 48 values do not split into Q8_0 blocks of 32"),
        (lambda: quantize(gaussian(4, 256), "Q4_K_M", name=NAME), "cannot write GGUF type 'Q4_K_M'"),
        (lambda: quantize(gaussian(4, 256), "Q3_K", name=NAME), "cannot write GGUF type 'Q3_K'"),
        (lambda: quantize(gaussian(4, 256), "Q6_K", "kmeans", name=NAME), "unknown GGUF quantization method 'kmeans'"),
        (lambda: quantize(np.float32(1.0), "F32", name=NAME), "is a scalar"),
        (lambda: quantize(with_nan(), "Q5_K", name=NAME), "has NaN or infinite values; Q5_K cannot encode them"),
        (lambda: quantize(with_nan(), "F16", name=NAME), "has NaN or infinite values; F16 cannot encode them"),
        (
            lambda: quantize(with_outlier(7e4), "F16", name=NAME),
            "has values up to 7e+04, too large for F16's f16 numbers",
        ),
        (lambda: quantize(with_outlier(1e7), "Q8_0", name=NAME), "has values up to 1e+07, too large for Q8_0's"),
        (lambda: quantize(with_outlier(1e6), "Q4_0", name=NAME), "has values up to 1e+06, too large for Q4_0's"),
        (lambda: quantize(with_outlier(1e7), "Q4_K", name=NAME), "has values up to 1e+07, too large for Q4_K's"),
        (lambda: quantize(with_outlier(1e7), "Q5_K", name=NAME), "has values up to 1e+07, too large for Q5_K's"),
        (lambda: quantize(with_outlier(1e9), "Q6_K", name=NAME), "has values up to 1e+09, too large for Q6_K's"),
        (
            lambda: dequantize(np.zeros(100, np.uint8), "Q4_K", (2, 256), name=NAME),
            "has 100 bytes of data; Q4_K [2, 256] needs 288",
        ),
        (lambda: dequantize(np.zeros(288, np.uint8), "Q4_K", (2, 100), name=NAME), "does not split into Q4_K rows"),
        (lambda: dequantize(np.zeros(16, np.uint8), "F64", (2,), name=NAME), "gguf-py cannot dequantize F64"),
        (lambda: dequantize(np.zeros(16, np.uint8), "Q9_9", (2,), name=NAME), "unknown GGUF type 'Q9_9'"),
    ],
)
def test_bad_input_names_the_tensor(call, problem: str) -> None:
    with pytest.raises(BadInput) as caught:
        call()
    assert caught.value.where == NAME
    assert problem in caught.value.problem
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("case", ["normal", "zeros", "ties", "tiny", "negative zero", "large", "many rows"])
def test_torch_q8_0_is_gguf_py_byte_for_byte(case):
    """The torch Q8_0 convert uses (all cores, or the GPU) writes gguf-py's bytes and decodes to its values."""
    import torch

    from specpair.formats.gguf_quants import dequantize_q8_0, quantize_q8_0

    rng = np.random.default_rng(7)
    x = {
        "normal": rng.standard_normal((64, 4096)),
        "zeros": np.zeros((3, 64)),
        "ties": rng.integers(-8, 8, (50, 256)) / 2 * 127 / 4,  # values on every rounding midpoint
        "tiny": rng.standard_normal((7, 96)) * 1e-30,
        "negative zero": np.full((2, 32), -0.0),
        "large": rng.standard_normal((9, 32)) * 6e4,
        "many rows": rng.standard_normal((70_000, 32)),
    }[case].astype(np.float32)
    ours = quantize_q8_0(torch.from_numpy(x)).numpy()
    assert np.array_equal(ours, gguf_quantize(x, GGMLQuantizationType.Q8_0).reshape(ours.shape))
    assert np.array_equal(
        dequantize_q8_0(torch.from_numpy(ours), x.shape).numpy(),
        gguf_dequantize(ours, GGMLQuantizationType.Q8_0).reshape(x.shape),
    )


def test_quantize_in_processes_gives_the_same_bytes_and_errors(monkeypatch):
    """Large tensors are quantized in worker processes (the numpy search holds the GIL); rows quantize
    independently, so the bytes are the one-process bytes, and a bad value comes back as the same one-line error."""
    monkeypatch.setattr(gguf_quants, "PROCESS_POOL_MIN_CPUS", 1)  # the pool, whatever the machine
    rows = gguf_quants.PARALLEL_VALUES * 3 // 1024  # three slices of rows and more
    x = np.random.default_rng(3).standard_normal((rows, 1024)).astype(np.float32)
    assert np.array_equal(gguf_quants.quantize_in_processes(x, "Q4_K"), quantize(x, "Q4_K"))
    x[-1, -1] = 1e30
    with pytest.raises(BadInput, match="layer.weight: has values up to 1e\\+30, too large for Q4_K"):
        gguf_quants.quantize_in_processes(x, "Q4_K", name="layer.weight")


# ---- k-quants in torch: numpy's bytes ------------------------------------------------------------------

# Values whose f16 scales come near 65504 (d for Q6_K, dmin for Q4_K and Q5_K) without reaching it.
NEAR_F16_LIMIT = {"Q4_K": 3.9e6, "Q5_K": 3.9e6, "Q6_K": 2.5e8}


def torch_case(case: str, qtype: str) -> np.ndarray:
    rng = np.random.default_rng(21)
    normal = rng.standard_normal((16, 2048))
    if case == "llama.cpp branches":
        return golden_input()
    if case == "heavy tails":
        tails = rng.standard_t(2, (16, 2048))
        tails[8:] = np.sign(tails[8:]) * np.exp(rng.uniform(-30, 3, (8, 2048)))  # log-uniform magnitudes
        return tails.astype(np.float32)
    if case == "zeros":
        return np.zeros((4, 512), np.float32)
    if case == "constant sub-blocks":  # every 16 and 32 values alike; some zero, some super-blocks one-signed
        levels = np.repeat(rng.standard_normal((16, 2048 // 32)), 32, axis=1)
        levels[:, ::5] = 0
        levels[:4] = np.abs(levels[:4])
        return levels.astype(np.float32)
    if case == "tiny":  # ~1e-38, denormals included: ranges whose inverse overflows
        return (normal * np.exp(rng.uniform(np.log(1e-41), np.log(1e-36), normal.shape))).astype(np.float32)
    if case == "large":
        return (rng.uniform(-1, 1, (16, 2048)) * NEAR_F16_LIMIT[qtype]).astype(np.float32)
    if case == "mixed sign":  # one-signed rows (no offset, or no zero in range), alternating signs, an outlier
        mixed = normal.copy()
        mixed[:4] = np.abs(mixed[:4]) + 3
        mixed[4:8] = -np.abs(mixed[4:8])
        mixed[8:12] *= np.where(np.arange(2048) % 2, 1, -1)
        mixed[12, 100] = 500
        return mixed.astype(np.float32)
    if case == "many rows":  # more super-blocks than one pass takes, a part pass last, 3-d
        return rng.standard_normal((3, 500, 512)).astype(np.float32)
    return normal.astype(np.float32)  # gaussian


TORCH_CASES = (
    "llama.cpp branches",
    "gaussian",
    "heavy tails",
    "zeros",
    "constant sub-blocks",
    "tiny",
    "large",
    "mixed sign",
    "many rows",
)


def torch_devices() -> list[str]:
    """The CPU, and the GPU where there is one: the same bytes are asked of both."""
    import torch

    return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("method", ["search", "rtn"])
@pytest.mark.parametrize("qtype", KQUANTS)
@pytest.mark.parametrize("case", TORCH_CASES)
def test_torch_kquants_are_numpy_bytes(case: str, qtype: str, method: str) -> None:
    import torch

    from specpair.formats.gguf_quants import quantize_kquant_torch

    x = torch_case(case, qtype)
    theirs = quantize(x, qtype, method, name=NAME)
    for device in torch_devices():
        ours = quantize_kquant_torch(torch.from_numpy(x).to(device), qtype, method == "search", NAME)
        assert ours.dtype == torch.uint8 and ours.device.type == device and tuple(ours.shape) == theirs.shape
        np.testing.assert_array_equal(ours.cpu().numpy(), theirs)
    if case == "large":  # the case is what it says: f16 scales within 10% of the largest f16
        offset = 208 if qtype == "Q6_K" else 2
        scales = theirs.reshape(-1, BLOCK_SIZES[qtype][1])[:, offset : offset + 2].copy().view("<f2")
        assert 0.9 * 65504 < np.abs(scales.astype(np.float32)).max() < 65504


@pytest.mark.parametrize("qtype", KQUANTS)
def test_torch_kquants_are_llama_cpp_bytes(qtype: str) -> None:
    import torch

    from specpair.formats.gguf_quants import quantize_kquant_torch

    raw = quantize_kquant_torch(torch.from_numpy(golden_input()), qtype, True, NAME)
    assert hashlib.sha256(raw.numpy().tobytes()).hexdigest() == GOLDEN[qtype]


def with_inf() -> np.ndarray:
    x = gaussian(2, 256)
    x[0, 7] = -np.inf
    return x


@pytest.mark.parametrize(
    "values, qtype",
    [
        (with_nan(), "Q4_K"),
        (with_inf(), "Q6_K"),
        (with_outlier(1e7), "Q4_K"),
        (with_outlier(1e7), "Q5_K"),
        (with_outlier(1e9), "Q6_K"),
        (gaussian(4, 300), "Q5_K"),
        (np.float32(1.0), "Q6_K"),
    ],
    ids=["nan", "inf", "f16-overflow-Q4_K", "f16-overflow-Q5_K", "f16-overflow-Q6_K", "partial-block", "scalar"],
)
def test_torch_kquants_refuse_what_numpy_refuses(values: np.ndarray, qtype: str) -> None:
    import torch

    from specpair.formats.gguf_quants import quantize_kquant_torch

    with pytest.raises(BadInput) as theirs:
        quantize(values, qtype, name=NAME)
    with pytest.raises(BadInput) as ours:
        quantize_kquant_torch(torch.from_numpy(np.asarray(values)), qtype, True, NAME)
    assert (ours.value.where, ours.value.problem) == (theirs.value.where, theirs.value.problem)


@pytest.mark.parametrize("method", ["search", "rtn"])
def test_gguf_codec_encodes_kquants_in_torch_with_numpy_bytes(method: str, monkeypatch) -> None:
    """Without worker processes (a CPU of under 4 cores, or a GPU) the codec quantizes on the tensor's device."""
    import torch

    from specpair.formats.codecs import codec

    monkeypatch.setattr(gguf_quants, "PROCESS_POOL_MIN_CPUS", 1 << 30)  # no worker processes, whatever the machine
    calls, quantize_kquant_torch = [], gguf_quants.quantize_kquant_torch

    def recorded(w: torch.Tensor, qtype: str, search: bool, name: str) -> torch.Tensor:
        calls.append((qtype, search))
        return quantize_kquant_torch(w, qtype, search, name)

    monkeypatch.setattr(gguf_quants, "quantize_kquant_torch", recorded)
    x = gaussian(8, 512, seed=4)
    for qtype in KQUANTS:
        for device in torch_devices():
            parts = codec(f"gguf-{qtype}", method).encode(torch.from_numpy(x).to(device), NAME)
            assert parts[""].device.type == device
            np.testing.assert_array_equal(parts[""].cpu().numpy(), quantize(x, qtype, method, name=NAME))
    assert calls == [(qtype, method == "search") for qtype in KQUANTS for _ in torch_devices()]


@pytest.mark.parametrize("qtype", KQUANTS)
def test_torch_kquant_dequantizer_is_gguf_py_value_for_value(qtype: str) -> None:
    """Random bytes (every code and scale, f16 NaN and inf among them) and our own blocks decode to gguf-py's
    values on every device, bit for bit (NaN where gguf-py has NaN)."""
    import torch

    from specpair.formats.gguf_quants import dequantize_kquant_torch

    block_bytes = BLOCK_SIZES[qtype][1]
    random_blocks = np.random.default_rng(8).integers(0, 256, (3, 70 * block_bytes), dtype=np.uint8)
    ours_blocks = quantize(gaussian(6, 512, seed=9), qtype, name=NAME)
    for data, shape in ((random_blocks, (3, 70 * 256)), (ours_blocks, (6, 512))):
        theirs = gguf_dequantize(data, GGMLQuantizationType[qtype]).reshape(shape)
        for device in torch_devices():
            values = dequantize_kquant_torch(torch.from_numpy(data).to(device), qtype, shape, NAME)
            assert values.dtype == torch.float32 and tuple(values.shape) == shape
            values, nan = values.cpu().numpy(), np.isnan(theirs)  # NaN payloads are the device's own
            assert np.array_equal(np.isnan(values), nan) and (shape[1] < 1000 or nan.any())
            np.testing.assert_array_equal(values[~nan].view(np.uint32), theirs[~nan].view(np.uint32))
    with pytest.raises(BadInput, match=f"{NAME}: has {block_bytes} bytes of data; {qtype} \\[2, 256\\] needs"):
        dequantize_kquant_torch(torch.zeros(block_bytes, dtype=torch.uint8), qtype, (2, 256), NAME)
