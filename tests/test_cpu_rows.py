"""runtime/kernels/cpu_rows.py: a row's product has the same bits alone and in any call: in every slot of a tile,
beside any tile-mates, in calls of 1 to more than two tiles of rows, under one thread and two, for generated rows
and for prompt rows, in float32 and in bfloat16 products; and the expert products, which tile an expert's tokens
together, keep a token's bits too. CPU, exact."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from specpair.runtime.kernels import linear
from specpair.runtime.kernels.cpu_rows import PRODUCTS, prompt_tiles, rows_mm, tile_rows

# (K, N) and how the right operand is laid out: a weight's transposed view (linear's W.T), a copied cache
# slice transposed (attention's scores) and a contiguous one (attention's values); widths of real models and odd ones
OPERANDS: dict[str, Callable[[int, int], Tensor]] = {
    "weight.T": lambda k, n: torch.randn(n, k).T,
    "cache.T": lambda k, n: torch.randn(n, k).clone().T,
    "contiguous": lambda k, n: torch.randn(k, n),
}
SHAPES = [(576, 960), (1536, 576), (64, 37), (37, 64), (64, 7)]


ROLES = {"generated": contextlib.nullcontext, "prompt": prompt_tiles}
# a product's result against float64 on the same inputs: float32's sums, or bf16's rounded result
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("operand", sorted(OPERANDS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("role", sorted(ROLES))
@pytest.mark.parametrize("dtype", sorted(PRODUCTS, key=str), ids=str)
def test_a_row_has_its_own_bits_in_any_call(
    dtype: torch.dtype, role: str, operand: str, shape: tuple[int, int], threads: int
) -> None:
    torch.manual_seed(sum(shape))
    k, n = shape
    b = OPERANDS[operand](k, n).to(dtype)
    row = torch.randn(k).to(dtype)
    with ROLES[role]():
        per_tile = tile_rows(dtype)
        alone = rows_mm(row[None], b)[0]
        exact = row.double() @ b.double()
        assert alone.dtype == torch.float32
        assert torch.allclose(alone.double(), exact, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * k**0.5)
        counts = [*range(1, per_tile + 2), 2 * per_tile + 1]  # to a second tile, and past two: a last tile of one
        for count in counts:
            slots = range(count) if count <= 5 else sorted({0, 1, count // 2, count - 2, count - 1})
            for slot in slots:
                mates = (torch.randn(count, k) * 10.0 ** (slot % 3 - 1)).to(dtype)  # tile-mates of other magnitudes too
                mates[slot] = row
                assert torch.equal(rows_mm(mates, b)[slot], alone), (count, slot)


@pytest.mark.parametrize("dtype", sorted(PRODUCTS, key=str), ids=str)
def test_prompt_tiles_hold_inside_the_prefill_only(dtype: torch.dtype) -> None:
    assert tile_rows(dtype) == PRODUCTS[dtype].generated
    with pytest.raises(RuntimeError), prompt_tiles():
        assert tile_rows(dtype) == PRODUCTS[dtype].prompt
        raise RuntimeError("a prefill that fails")
    assert tile_rows(dtype) == PRODUCTS[dtype].generated


def test_a_bf16_model_multiplies_in_bf16_and_anything_else_in_float32() -> None:
    """bf16 rows and a bf16 weight: a bf16 product (its result rounded to bf16, tiles of bf16's rows); float32
    rows with a bf16 or float16 weight: float32's product of the same values, the rows kept whole."""
    torch.manual_seed(3)
    w, row = torch.randn(40, 96).bfloat16(), torch.randn(1, 96)
    in_bf16 = rows_mm(row.bfloat16(), w.T)
    assert in_bf16.dtype == torch.float32 and torch.equal(in_bf16, in_bf16.bfloat16().float())
    assert torch.equal(in_bf16, rows_mm(row.bfloat16(), w.T.clone()))
    in_float32 = rows_mm(row, w.T)
    assert torch.equal(in_float32, rows_mm(row, w.float().T))
    assert not torch.equal(in_float32, in_float32.bfloat16().float())  # not rounded: the row's bits all count
    assert torch.equal(rows_mm(row, w.half().T), rows_mm(row, w.half().float().T))


def test_an_experts_token_has_its_own_bits_among_others() -> None:
    torch.manual_seed(0)
    experts, tokens, k, n = 4, 11, 96, 40
    w = torch.randn(experts, n, k)
    x = torch.randn(tokens, k)
    ids = torch.randint(0, experts, (tokens, 2))
    ids[:, 1] = (ids[:, 0] + 1) % experts  # two distinct experts a token; expert 0..3 each shared by several
    together = linear.matmul_experts_reference(x, w, ids)
    for t in range(tokens):
        alone = linear.matmul_experts_reference(x[t : t + 1].clone(), w, ids[t : t + 1])[0]
        assert torch.equal(alone, together[t]), t
        for s in range(2):
            assert torch.equal(alone[s], rows_mm(x[t : t + 1], w[int(ids[t, s])].T)[0])
