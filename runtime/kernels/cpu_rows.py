"""Matrix products on the CPU that are batch-invariant by construction.

torch's CPU matmul is not row-invariant: (A @ B)[i] can differ from A[i:i+1] @ B in the last bits, as the
BLAS picks its kernels, blocking and split by the shape. So every product goes through one fixed shape: the
rows are cut into tiles, each copied into a fresh zero-padded tile (torch's allocator: 64-byte aligned) and
multiplied as Bᵀ [N, K] @ tileᵀ [K, rows]. The library then sees the same M, N, K, strides and alignment for a
row whatever the number of rows, its slot in the tile or its tile-mates; it computes each column of a GEMM from
that column alone, every column of one shape alike (no value-dependent paths). The thread count is the process's
(set once by app/device.place_runtime): MKL's split changes a product's bits for some shapes at 2 threads against
1, for every row alike, so a run must not change it between its calls.

A tile's row count is set by what its rows are, never by how many there are: generated tokens (decode steps,
verify blocks, drafters' rounds) take TILE_ROWS, prompt tokens (a prefill, entered with `prompt_tiles()`)
PROMPT_TILE_ROWS. The weight is streamed once per tile instead of once per row: MKL's cost per tile grows with
its rows, so a decode step wants few and a prefill many (benchmarks/cpu_tiles.py). Only the bits of one role's
rows are comparable with each other: a prompt token's hidden state is not a decode step's for the same token.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor

# rows per product, measured on the 2-core benchmark machine (benchmarks/results/demo_dflash.md). Generated rows:
# MKL's kernel for 4 columns costs about what one row costs (the weight streamed once), 8 twice that. Prompt rows:
# 32 columns cost about 3 tiles of 4 (5 against 13 ms a row at one thread, 3 against 8 at two), so a prompt
# of 12 tokens or more prefills faster than in tiles of 4, and a 46-token chat prompt in 2 products, not 12
TILE_ROWS = 4
PROMPT_TILE_ROWS = 32

_tile_rows = contextvars.ContextVar("tile_rows", default=TILE_ROWS)


@contextlib.contextmanager
def prompt_tiles() -> Iterator[None]:
    """The products inside are prompt rows' (a prefill): tiles of PROMPT_TILE_ROWS."""
    token = _tile_rows.set(PROMPT_TILE_ROWS)
    try:
        yield
    finally:
        _tile_rows.reset(token)


def tile_rows() -> int:
    """The rows of a product's tile here: PROMPT_TILE_ROWS inside `prompt_tiles()`, else TILE_ROWS."""
    return _tile_rows.get()


def rows_mm(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] @ b [K, N] in float32, in tiles of the rows' role (b may be a transposed view, e.g. W.T)."""
    rows_per_tile = tile_rows()
    a = a.float()
    w = b.float().T  # [N, K]: a weight in its own layout when b is W.T
    out = torch.empty(a.shape[0], w.shape[0], dtype=torch.float32)
    tile_out = torch.empty(w.shape[0], rows_per_tile, dtype=torch.float32)
    for start in range(0, a.shape[0], rows_per_tile):
        rows = min(rows_per_tile, a.shape[0] - start)
        tile = torch.zeros(rows_per_tile, a.shape[1], dtype=torch.float32)
        tile[:rows] = a[start : start + rows]
        torch.mm(w, tile.T, out=tile_out)
        out[start : start + rows] = tile_out.T[:rows]
    return out
