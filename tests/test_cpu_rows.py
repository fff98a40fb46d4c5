"""runtime/kernels/cpu_rows.py: a row's product has the same bits alone and in any call: in every slot of a tile,
beside any tile-mates, in calls of 1 to more than two tiles of rows, under one thread and two, for generated rows
and for prompt rows; and the expert products, which tile an expert's tokens together, keep a token's bits too.
CPU, float32, exact."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from specpair.runtime.kernels import linear
from specpair.runtime.kernels.cpu_rows import PROMPT_TILE_ROWS, TILE_ROWS, prompt_tiles, rows_mm, tile_rows

# (K, N) and how the right operand is laid out: a weight's transposed view (linear's W.T), a copied cache
# slice transposed (attention's scores) and a contiguous one (attention's values); widths of real models and odd ones
OPERANDS: dict[str, Callable[[int, int], Tensor]] = {
    "weight.T": lambda k, n: torch.randn(n, k).T,
    "cache.T": lambda k, n: torch.randn(n, k).clone().T,
    "contiguous": lambda k, n: torch.randn(k, n),
}
SHAPES = [(576, 960), (1536, 576), (64, 37), (37, 64), (64, 7)]


ROLES = {"generated": (contextlib.nullcontext, TILE_ROWS), "prompt": (prompt_tiles, PROMPT_TILE_ROWS)}


@pytest.mark.parametrize("operand", sorted(OPERANDS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_row_has_its_own_bits_in_any_call(role: str, operand: str, shape: tuple[int, int], threads: int) -> None:
    torch.manual_seed(sum(shape))
    k, n = shape
    b = OPERANDS[operand](k, n)
    row = torch.randn(k)
    rows_of_role, tile_rows = ROLES[role]
    with rows_of_role():
        alone = rows_mm(row[None], b)[0]
        assert torch.allclose(alone.double(), row.double() @ b.double(), rtol=1e-4, atol=1e-4 * k**0.5)
        counts = [*range(1, tile_rows + 2), 2 * tile_rows + 1]  # to a second tile, and past two: a last tile of one
        for count in counts:
            slots = range(count) if count <= TILE_ROWS + 1 else sorted({0, 1, count // 2, count - 2, count - 1})
            for slot in slots:
                mates = torch.randn(count, k) * 10.0 ** (slot % 3 - 1)  # tile-mates of other magnitudes too
                mates[slot] = row
                assert torch.equal(rows_mm(mates, b)[slot], alone), (count, slot)


def test_prompt_tiles_hold_inside_the_prefill_only() -> None:
    assert tile_rows() == TILE_ROWS
    with pytest.raises(RuntimeError), prompt_tiles():
        assert tile_rows() == PROMPT_TILE_ROWS
        raise RuntimeError("a prefill that fails")
    assert tile_rows() == TILE_ROWS


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
