"""runtime/kernels/cpu_rows.py: a row's product has the same bits alone and in any call: in every slot of a tile,
beside any tile-mates, in calls of 1 to more than two tiles of rows, under one thread and two; and the expert
products, which tile an expert's tokens together, keep a token's bits too. CPU, float32, exact."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from specpair.runtime.kernels import linear
from specpair.runtime.kernels.cpu_rows import TILE_ROWS, rows_mm

# (K, N) and how the right operand is laid out: a weight's transposed view (linear's W.T), a copied cache
# slice transposed (attention's scores) and a contiguous one (attention's values); widths of real models and odd ones
OPERANDS: dict[str, Callable[[int, int], Tensor]] = {
    "weight.T": lambda k, n: torch.randn(n, k).T,
    "cache.T": lambda k, n: torch.randn(n, k).clone().T,
    "contiguous": lambda k, n: torch.randn(k, n),
}
SHAPES = [(576, 960), (1536, 576), (64, 37), (37, 64), (64, 7)]


@pytest.mark.parametrize("operand", sorted(OPERANDS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_row_has_its_own_bits_in_any_call(operand: str, shape: tuple[int, int], threads: int) -> None:
    torch.manual_seed(sum(shape))
    k, n = shape
    b = OPERANDS[operand](k, n)
    row = torch.randn(k)
    alone = rows_mm(row[None], b)[0]
    assert torch.allclose(alone.double(), row.double() @ b.double(), rtol=1e-4, atol=1e-4 * k**0.5)
    for count in range(1, 2 * TILE_ROWS + 2):  # past two tiles: a last tile of one row
        for slot in range(count):
            mates = torch.randn(count, k) * 10.0 ** (slot % 3 - 1)  # tile-mates of other magnitudes too
            mates[slot] = row
            assert torch.equal(rows_mm(mates, b)[slot], alone), (count, slot)


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
