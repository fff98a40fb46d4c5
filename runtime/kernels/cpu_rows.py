"""Matrix products on the CPU that are batch-invariant by construction.

torch's CPU matmul is not row-invariant: (A @ B)[i] can differ from A[i:i+1] @ B in the last bits, as the
BLAS picks its kernels, blocking and split by the shape. So every product goes through one fixed shape: the
rows are cut into tiles of TILE_ROWS, each copied into a fresh zero-padded tile (torch's allocator: 64-byte
aligned) and multiplied as Bᵀ [N, K] @ tileᵀ [K, TILE_ROWS]. The library then sees the same M, N, K, strides
and alignment for a row whatever the number of rows, its slot in the tile or its tile-mates; it computes each
column of a GEMM from that column alone, every column of one shape alike (no value-dependent paths). The
thread count is the process's (set once by app/device.place_runtime): MKL's split changes a product's bits
for some shapes at 2 threads against 1, for every row alike, so a run must not change it between its calls.
The weight is then streamed once per tile instead of once per row (TILE_ROWS: benchmarks/cpu_tiles.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

# rows per product. MKL's column count for a GEMM against a weight: 4 costs about what one row costs on the
# 2-core benchmark machine (the weight streamed once), 8 twice that (benchmarks/results/demo_dflash.md)
TILE_ROWS = 4


def rows_mm(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] @ b [K, N] in float32, TILE_ROWS rows per product (b may be a transposed view, e.g. W.T)."""
    a = a.float()
    w = b.float().T  # [N, K]: a weight in its own layout when b is W.T
    out = torch.empty(a.shape[0], w.shape[0], dtype=torch.float32)
    tile_out = torch.empty(w.shape[0], TILE_ROWS, dtype=torch.float32)
    for start in range(0, a.shape[0], TILE_ROWS):
        rows = min(TILE_ROWS, a.shape[0] - start)
        tile = torch.zeros(TILE_ROWS, a.shape[1], dtype=torch.float32)
        tile[:rows] = a[start : start + rows]
        torch.mm(w, tile.T, out=tile_out)
        out[start : start + rows] = tile_out.T[:rows]
    return out
