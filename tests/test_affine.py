"""MLX affine layout: our quantizers and bit stream against mlx 0.32.4 (CPU) and an independent numpy statement.

The references here do not share code with specpair.formats.affine: packing is restated with numpy's
little-endian bit order, bf16 rounding with the integer formula of formats.md §0, and TensorFold's rule
from tensorfold.md §2.3.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

from specpair.errors import BadInput
from specpair.formats.affine import dequantize, pack_codes, quantize, unpack_codes

ALL_BITS = (1, 2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)
COLS = 512
NAME = "model.layers.3.mlp.down_proj.weight"
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def reference_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words of each row's LSB-first bit stream: code i at bits [i·bits, (i+1)·bits)."""
    stream = ((codes[..., None] >> np.arange(bits)) & 1).astype(np.uint8)  # [rows, cols, bits], low bit first
    stream = stream.reshape(codes.shape[0], -1)
    return np.packbits(stream, axis=-1, bitorder="little").view("<u4")


def reference_unpack(words: np.ndarray, bits: int) -> np.ndarray:
    stream = np.unpackbits(words.astype("<u4").view(np.uint8), axis=-1, bitorder="little")
    stream = stream.reshape(words.shape[0], -1, bits).astype(np.int64)
    return (stream << np.arange(bits)).sum(-1).astype(np.uint8)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 -> fp32, round to nearest even on the bit pattern (finite values only)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    top = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (top << 16).astype(np.uint32).view(np.float32)


def tensorfold_reference(w: np.ndarray, bits: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TensorFold's affine rule on fp32 values: (codes, bf16 scales, bf16 biases), the last two as fp32."""
    groups = w.reshape(w.shape[0], -1, group)
    low, high = groups.min(-1), groups.max(-1)
    top = np.float32(2**bits - 1)
    scale = bf16_round(np.maximum((high - low) / top, np.float32(1e-8)))
    bias = bf16_round(low)
    codes = np.clip(np.rint((groups - bias[..., None]) / scale[..., None]), 0, top)
    return codes.astype(np.uint8).reshape(w.shape), scale, bias


def nasty_matrix(dtype: torch.dtype, group: int, seed: int = 0) -> torch.Tensor:
    """Gaussian rows plus rows built to hit every branch of the quantizers."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(28, COLS, generator=gen)
    rows = [normal[:12]]
    rows.append(torch.full((1, COLS), 0.7))  # constant rows: zero range, eps scale
    rows.append(torch.full((1, COLS), -2.5))
    rows.append(torch.zeros(1, COLS))
    zero_groups = normal[12:13].clone()
    zero_groups[0, :group] = 0
    zero_groups[0, 2 * group : 3 * group] = 0
    rows.append(zero_groups)
    outlier = normal[13:14].clone()
    outlier[0, 5] = 3.0e4
    outlier[0, COLS - 3] = -1.0e4
    rows.append(outlier)
    rows.append(-normal[14:16].abs() - 0.1)  # negative-only groups: the low edge is kept
    rows.append(normal[16:18].abs() + 0.1)  # positive-only groups
    rows.append(normal[18:19] * 1e-9)  # below eps: the edge rounds to code 0, bias 0
    single = torch.zeros(1, COLS)
    single[0, 7] = -1.5
    single[0, group + 1] = 2.0
    rows.append(single)
    rows.append(((torch.arange(COLS) % 17) - 8.0).reshape(1, COLS) / 2)  # half-integers: exact ties when rounding
    rows.append(normal[19:28] * torch.logspace(-3, 3, 9).reshape(9, 1))  # magnitudes far from 1
    return torch.cat(rows).to(dtype)


def to_mx(t: torch.Tensor) -> mx.array:
    if t.dtype == torch.uint32:
        return mx.array(t.view(torch.int32).numpy().view(np.uint32))
    if t.dtype in (torch.bfloat16, torch.float16):
        return mx.array(t.view(torch.int16).numpy()).view(mx.bfloat16 if t.dtype == torch.bfloat16 else mx.float16)
    return mx.array(t.numpy())


def from_mx(a: mx.array) -> torch.Tensor:
    if a.dtype == mx.uint32:
        return torch.from_numpy(np.array(a).view(np.int32)).view(torch.uint32)
    if a.dtype in (mx.bfloat16, mx.float16):
        torch_dtype = torch.bfloat16 if a.dtype == mx.bfloat16 else torch.float16
        return torch.from_numpy(np.array(a.view(mx.int16))).view(torch_dtype)
    return torch.from_numpy(np.array(a))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality: -0.0 differs from 0.0 and dtypes must agree."""
    return (
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))
    )


def words_of(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int32).numpy().view(np.uint32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_mlx_method_is_mx_quantize_bit_for_bit(dtype: torch.dtype, bits: int, group: int) -> None:
    w = nasty_matrix(dtype, group, seed=bits * 1000 + group)
    ours = quantize(w, bits, group, "mlx", dtype=dtype, name=NAME)
    mx_words, mx_scales, mx_biases = (from_mx(a) for a in mx.quantize(to_mx(w), group, bits))

    assert ours["weight"].dtype == torch.uint32 and ours["weight"].shape == (w.shape[0], COLS * bits // 32)
    assert np.array_equal(unpack_codes(ours["weight"], bits).numpy(), reference_unpack(words_of(mx_words), bits))
    assert np.array_equal(words_of(ours["weight"]), words_of(mx_words))
    assert same_bits(ours["scales"], mx_scales)
    assert same_bits(ours["biases"], mx_biases)


def test_stacked_experts_match_mx_quantize() -> None:
    """[experts, out, in] quantizes row by row like a 2-D matrix, as MLX does for switch_mlp weights."""
    w = torch.randn(3, 16, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    ours = quantize(w, 4, 64, name=NAME)
    mx_words, mx_scales, mx_biases = (from_mx(a) for a in mx.quantize(to_mx(w), 64, 4))
    assert ours["weight"].shape == (3, 16, 32) and ours["scales"].shape == (3, 16, 4)
    assert torch.equal(ours["weight"].view(torch.int32), mx_words.view(torch.int32))
    assert same_bits(ours["scales"], mx_scales) and same_bits(ours["biases"], mx_biases)
    for e in range(3):
        assert torch.equal(dequantize(ours, 4, 64)[e], dequantize({k: v[e] for k, v in ours.items()}, 4, 64))


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_minmax_is_tensorfold_rule(bits: int, group: int) -> None:
    w = nasty_matrix(torch.bfloat16, group, seed=7 * bits + group)
    ours = quantize(w, bits, group, "minmax", name=NAME)
    codes, scales, biases = tensorfold_reference(w.float().numpy(), bits, group)

    assert np.array_equal(unpack_codes(ours["weight"], bits).numpy(), codes)
    assert np.array_equal(words_of(ours["weight"]), reference_pack(codes, bits))
    assert ours["scales"].dtype == ours["biases"].dtype == torch.bfloat16
    assert np.array_equal(ours["scales"].float().numpy().view(np.uint32), scales.view(np.uint32))
    assert np.array_equal(ours["biases"].float().numpy().view(np.uint32), biases.view(np.uint32))


@pytest.mark.parametrize("method", ["mlx", "minmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", ALL_BITS)
def test_mx_dequantize_reads_our_triple(method: str, dtype: torch.dtype, bits: int) -> None:
    """MLX's reader gives our dequantize exactly once it computes in float32.

    Given bf16 scales, mx.dequantize evaluates bf16(bf16(s·q) + b), two roundings; ours is the float32 value.
    """
    group = 64
    w = nasty_matrix(dtype, group, seed=bits)
    ours = quantize(w, bits, group, method, dtype=dtype, name=NAME)
    expected = dequantize(ours, bits, group, name=NAME)
    float_scales, float_biases = (to_mx(ours[k].float()) for k in ("scales", "biases"))
    read = from_mx(mx.dequantize(to_mx(ours["weight"]), float_scales, float_biases, group, bits))
    assert read.dtype == torch.float32 and torch.equal(read, expected)

    native = from_mx(mx.dequantize(to_mx(ours["weight"]), to_mx(ours["scales"]), to_mx(ours["biases"]), group, bits))
    codes = unpack_codes(ours["weight"], bits).reshape(w.shape[0], -1, group).to(dtype)
    in_dtype = (ours["scales"][..., None] * codes + ours["biases"][..., None]).reshape(
        w.shape
    )  # torch rounds per op too
    assert same_bits(native, in_dtype)


@pytest.mark.parametrize("bits", ALL_BITS)
def test_pack_is_lsb_first_bit_stream(bits: int) -> None:
    codes = torch.randint(0, 2**bits, (9, 3 * 32), generator=torch.Generator().manual_seed(bits), dtype=torch.uint8)
    words = pack_codes(codes, bits)
    assert words.dtype == torch.uint32 and words.shape == (9, 3 * bits)
    assert np.array_equal(words_of(words), reference_pack(codes.numpy(), bits))
    assert torch.equal(unpack_codes(words, bits), codes)
    assert torch.equal(unpack_codes(words.view(torch.int32), bits), codes)  # int32 storage holds the same bits


# formats.md §7, relative Frobenius error of MLX affine (fp32 scales) on i.i.d. N(0,1)
MLX_TABLE = {
    (2, 64): 0.39,
    (3, 64): 0.19,
    (4, 32): 0.081,
    (4, 64): 0.091,
    (4, 128): 0.100,
    (5, 64): 0.044,
    (6, 64): 0.0217,
    (8, 64): 0.0054,
}


def test_errors_on_gaussian_match_formats_table() -> None:
    w = torch.randn(256, 4096, generator=torch.Generator().manual_seed(0))

    def error(bits: int, group: int, method: str, dtype: torch.dtype) -> float:
        restored = dequantize(quantize(w, bits, group, method, dtype=dtype, name=NAME), bits, group, name=NAME)
        return float((restored - w).norm() / w.norm())

    for (bits, group), expected in MLX_TABLE.items():
        assert error(bits, group, "mlx", torch.float32) == pytest.approx(expected, rel=0.03), (bits, group)
    assert 0.085 < error(4, 64, "mlx", torch.bfloat16) <= 0.092
    assert 0.085 < error(4, 64, "minmax", torch.bfloat16) <= 0.092


def bad(call, problem: str) -> None:
    with pytest.raises(BadInput) as caught:
        call()
    assert caught.value.where == NAME
    assert problem in caught.value.problem and "\n" not in str(caught.value)


def test_bad_input_names_the_tensor() -> None:
    w = torch.randn(4, 256)
    parts = quantize(w, 4, 64, name=NAME)
    bad(lambda: quantize(torch.randn(4, 200), 4, 64, name=NAME), "rows of 200 values do not split into groups of 64")
    bad(lambda: quantize(w, 7, 64, name=NAME), "7-bit affine codes are not an MLX layout")
    bad(lambda: quantize(w, 0, 64, name=NAME), "0-bit")
    bad(lambda: quantize(w, 9, 64, name=NAME), "9-bit")
    bad(lambda: quantize(w, 4, 16, name=NAME), "group size 16 is not an MLX layout")
    bad(lambda: quantize(w, 4, 64, "q4mse", name=NAME), "unknown affine quantizer 'q4mse'")
    bad(lambda: quantize(torch.randn(256), 4, 64, name=NAME), "needs a matrix")
    bad(lambda: quantize(torch.ones(4, 256, dtype=torch.int32), 4, 64, name=NAME), "floating-point")
    bad(lambda: quantize(torch.tensor([[float("nan")] * 64]), 4, 64, name=NAME), "NaN or infinite")
    bad(
        lambda: dequantize({"weight": parts["weight"], "scales": parts["scales"]}, 4, 64, name=NAME), "lacks its biases"
    )
    bad(
        lambda: dequantize({**parts, "scales": parts["scales"][:, :2]}, 4, 64, name=NAME),
        "scales shape (4, 2) does not fit weight (4, 32)",
    )
    bad(lambda: dequantize({**parts, "biases": parts["biases"].reshape(2, 8)}, 4, 64, name=NAME), "biases shape (2, 8)")
    bad(lambda: dequantize(parts, 4, 128, name=NAME), "scales shape (4, 4) does not fit")
    bad(lambda: dequantize(parts, 3, 64, name=NAME), "a row of 32 words does not hold whole blocks of 32 3-bit codes")
    bad(
        lambda: dequantize({**parts, "weight": parts["weight"].view(torch.int32).float()}, 4, 64, name=NAME),
        "expected 32-bit words",
    )
    bad(
        lambda: dequantize({**parts, "scales": parts["scales"].to(torch.int16)}, 4, 64, name=NAME),
        "scales are torch.int16",
    )
    bad(lambda: pack_codes(torch.zeros(2, 48, dtype=torch.uint8), 4, name=NAME), "rows of 48 codes")
