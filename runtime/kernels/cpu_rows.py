"""Matrix products on the CPU that are batch-invariant by construction.

torch's CPU matmul is not row-invariant: (A @ B)[i] can differ from A[i:i+1] @ B in the last bits, as the
BLAS blocks and splits the work by the number of rows. So the references multiply one row at a time, each
row copied into a fresh buffer from torch's allocator (64-byte aligned) and through the same one-row call,
so a row's bits never depend on how many rows came with it, nor on where it sat in memory. The other
operand is the same tensor for every row: a weight, or a cache slice its caller copied.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rows_mm(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] @ b [K, N] in float32, row by row (b may be a transposed view, e.g. W.T)."""
    a = a.float()
    b = b.float()
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32)
    row = torch.empty(1, a.shape[1], dtype=torch.float32)
    row_out = torch.empty(1, b.shape[1], dtype=torch.float32)
    for i in range(a.shape[0]):
        row.copy_(a[i])
        torch.mm(row, b, out=row_out)
        out[i] = row_out[0]
    return out
