"""runtime/kernels/cpu_rows.py: a row's product has the same bits alone and in any call: in every slot of a tile,
beside any tile-mates, in calls of 1 to more than two tiles of rows, under one thread and two, for generated rows
and for prompt rows, in float32 and in bfloat16 products, of any operand (rows_mm) and of a model's weight
(weight_mm: a bf16 one reordered once); and the expert products, which tile an expert's tokens
together, keep a token's bits too. CPU, exact."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from specpair.runtime.kernels import cpu_rows, linear
from specpair.runtime.kernels.cpu_rows import PRODUCTS, prompt_tiles, rows_mm, tile_rows, weight_mm

# (K, N) and how the right operand is laid out: a weight's transposed view (linear's W.T), a copied cache
# slice transposed and a contiguous one; widths of real models and odd ones
OPERANDS: dict[str, Callable[[int, int], Tensor]] = {
    "weight.T": lambda k, n: torch.randn(n, k).T,
    "cache.T": lambda k, n: torch.randn(n, k).clone().T,
    "contiguous": lambda k, n: torch.randn(k, n),
}
# a product of rows and b [K, N]: rows_mm, and weight_mm of the weight b.T (a bf16 one reordered once, on a CPU
# that multiplies bf16 natively)
PRODUCTS_OF = {"rows_mm": rows_mm, "weight_mm": lambda rows, b: weight_mm(rows, b.T)}
SHAPES = [(576, 960), (1536, 576), (64, 37), (37, 64), (64, 7)]


ROLES = {"generated": contextlib.nullcontext, "prompt": prompt_tiles}
# a product's result against float64 on the same inputs: float32's sums, or bf16's rounded result
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("product", sorted(PRODUCTS_OF))
@pytest.mark.parametrize("operand", sorted(OPERANDS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("role", sorted(ROLES))
@pytest.mark.parametrize("dtype", sorted(PRODUCTS, key=str), ids=str)
def test_a_row_has_its_own_bits_in_any_call(
    dtype: torch.dtype, role: str, operand: str, shape: tuple[int, int], product: str, threads: int
) -> None:
    torch.manual_seed(sum(shape))
    k, n = shape
    b = OPERANDS[operand](k, n).to(dtype)
    row = torch.randn(k).to(dtype)
    multiply = PRODUCTS_OF[product]
    with ROLES[role]():
        per_tile = tile_rows(dtype)
        alone = multiply(row[None], b)[0]
        exact = row.double() @ b.double()
        assert alone.dtype == torch.float32
        assert torch.allclose(alone.double(), exact, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * k**0.5)
        # every call pads to the same tile, so a few counts stand for the rest: a tile with one to three rows, half
        # full, one short of full, full, a second tile of one, and past two (a last tile of one)
        counts = sorted({1, 2, 3, per_tile // 2, per_tile - 1, per_tile, per_tile + 1, 2 * per_tile + 1})
        for count in counts:
            slots = range(count) if count <= 5 else sorted({0, 1, count // 2, count - 2, count - 1})
            for slot in slots:
                mates = (torch.randn(count, k) * 10.0 ** (slot % 3 - 1)).to(dtype)  # tile-mates of other magnitudes too
                mates[slot] = row
                assert torch.equal(multiply(mates, b)[slot], alone), (count, slot)


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


def test_a_reordered_weight_follows_its_weight() -> None:
    """weight_mm's reordered copy of a bf16 weight, on a CPU that multiplies bf16 natively: what torch.mm gives to
    bf16 rounding, made once while the weight lives (the same copy at the next call), made again after the weight
    is written in place (a drafter trained in place), and let go with the weight. Elsewhere weight_mm is rows_mm."""
    torch.manual_seed(5)
    w, rows = torch.randn(48, 96).bfloat16(), torch.randn(3, 96).bfloat16()
    first = weight_mm(rows, w)
    if not cpu_rows.reorders_weights():
        assert torch.equal(first, rows_mm(rows, w.T))
        return
    assert torch.allclose(first, rows_mm(rows, w.T), rtol=1e-2, atol=1e-2)
    copy = cpu_rows.reordered_weight(w)
    assert torch.equal(weight_mm(rows, w), first) and cpu_rows.reordered_weight(w) is copy
    with torch.no_grad():
        w.mul_(-1)
    assert torch.equal(weight_mm(rows, w), -first)
    fresh = weakref.ref(cpu_rows.reordered_weight(w))
    assert fresh() is not copy
    del w, copy
    gc.collect()
    assert fresh() is None
