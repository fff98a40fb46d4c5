"""formats/gguf_planes.py: GGUF blocks as the planes the matmul kernels read. The planes take a tensor's bytes
exactly and give them back (`from_planes` of `to_planes`), and decoding the planes by the order the module's
docstring states, written out here apart from the module, gives gguf-py's values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from specpair.errors import BadInput
from specpair.formats import gguf_planes
from specpair.formats.codecs import codec
from specpair.formats.gguf_quants import block_size

TYPES = sorted(gguf_planes.PLANES)


@pytest.mark.parametrize("qtype", TYPES)
def test_planes_round_trip_any_bytes(qtype: str) -> None:
    """Random bytes (any bit pattern, NaN scales included) of a stacked tensor: the planes hold every byte once,
    in their own dtypes, and give the same bytes back."""
    values, block_bytes = block_size(qtype)
    shape = (2, 24, 2 * values)
    data = torch.randint(0, 256, (math.prod(shape) // values * block_bytes,), dtype=torch.uint8)
    planes = gguf_planes.to_planes(data, qtype, shape)
    desc = gguf_planes.PLANES[qtype]
    assert set(planes) == {p.role for p in desc.planes}
    assert sum(p.nbytes for p in planes.values()) == data.numel()
    for plane in desc.planes:
        assert planes[plane.role].dtype == plane.dtype and planes[plane.role].shape[:2] == shape[:2]
    back = gguf_planes.from_planes(planes, qtype, shape)
    assert back.shape == (*shape[:-1], 2 * block_bytes)
    assert torch.equal(back.reshape(-1), data)


def test_only_q6_k_is_reordered() -> None:
    """Q8_0, Q4_K and Q5_K's codes are in the kernel's order in GGUF already; Q6_K's are not."""
    reordered = {q for q in TYPES for p in gguf_planes.PLANES[q].planes if gguf_planes._order(q, p.role)}
    assert reordered == {"Q6_K"}


def test_wrong_bytes_are_refused() -> None:
    with pytest.raises(BadInput, match="w.weight.*needs 3400"):
        gguf_planes.to_planes(torch.zeros(3399, dtype=torch.uint8), "Q8_0", (10, 320), "w.weight")
    planes = gguf_planes.to_planes(torch.zeros(340, dtype=torch.uint8), "Q8_0", (1, 320))
    with pytest.raises(BadInput, match="planes are scales, codes"):
        gguf_planes.from_planes({"codes": planes["codes"]}, "Q8_0", (1, 320))


def documented_values(planes: dict[str, torch.Tensor], desc: gguf_planes.Planes, rows: int, cols: int) -> np.ndarray:
    """float32 [rows, cols] from planes, by the module docstring's order and nothing of the module's code."""
    out = np.zeros((rows, cols), np.float64)
    per_low = desc.code_bits // desc.low_bits
    codes = planes["codes"].contiguous().view(torch.uint8).numpy().reshape(rows, -1)
    code_elements = codes.view(np.uint16 if desc.code_bits == 16 else np.uint8).astype(np.int64)
    if desc.high_bits:
        per_high = desc.high_element_bits // desc.high_bits
        high = planes["high"].contiguous().view(torch.uint8).numpy().reshape(rows, -1)
        high_elements = high.view(np.uint16 if desc.high_element_bits == 16 else np.uint8).astype(np.int64)
    for r in range(rows):
        for g in range(cols // desc.group):
            low = code_elements[r, (g // per_low) * desc.group : (g // per_low + 1) * desc.group]
            code = (low >> (desc.low_bits * (g % per_low))) & ((1 << desc.low_bits) - 1)
            if desc.low_bits == 8:
                code = code.astype(np.uint8).view(np.int8).astype(np.int64)
            if desc.high_bits:
                bits = high_elements[r, (g // per_high) * desc.group : (g // per_high + 1) * desc.group]
                code = (
                    code | ((bits >> (desc.high_bits * (g % per_high))) & ((1 << desc.high_bits) - 1)) << desc.low_bits
                )
            code = code - desc.code_offset
            block = g * desc.group // desc.values
            if desc.scales == "f16":
                scale, low_min = float(planes["scales"][r, g]), 0.0
            elif desc.scales == "int8":
                scale, low_min = float(planes["super"][r, block]) * int(planes["scales"][r, g]), 0.0
            else:  # d, dmin, then formats.md §6's 6-bit scale j and min j of the block's 12 bytes
                head = planes["scales"][r, 4 * block : 4 * block + 4].contiguous().view(torch.uint8).numpy()
                d, dmin = head[:4].view(np.float16).astype(np.float64)
                s, j = head[4:].astype(np.int64), g % 8
                sc = s[j] & 63 if j < 4 else (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4)
                mn = s[j + 4] & 63 if j < 4 else (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
                scale, low_min = d * sc, dmin * mn
            out[r, g * desc.group : (g + 1) * desc.group] = scale * code - low_min
    return out.astype(np.float32)


@pytest.mark.parametrize("qtype", TYPES)
def test_documented_order_decodes_gguf_values(qtype: str) -> None:
    """The planes of quantized rows, decoded by the docstring's order, are gguf-py's values of the bytes."""
    torch.manual_seed(1)
    desc = gguf_planes.PLANES[qtype]
    rows, cols = 6, 2 * desc.values if desc.values > 32 else 96
    w = torch.randn(rows, cols)
    data = codec(f"gguf-{qtype}", "rtn" if qtype.endswith("_K") else None).encode(w, "w")[""]
    planes = gguf_planes.to_planes(data, qtype, (rows, cols))
    expected = gguf_dequantize(data.numpy().reshape(rows, -1), GGMLQuantizationType[qtype]).reshape(rows, cols)
    np.testing.assert_array_equal(documented_values(planes, desc, rows, cols), expected)
