"""Matrix products on the CPU that are batch-invariant by construction.

torch's CPU matmul is not row-invariant: (A @ B)[i] can differ from A[i:i+1] @ B in the last bits, as the
library picks its kernels, blocking and split by the shape. So every product goes through one fixed shape: the
rows are cut into tiles, each copied into a fresh zero-padded tile (torch's allocator: 64-byte aligned) and
multiplied as Bᵀ [N, K] @ tileᵀ [K, rows]. The library then sees the same M, N, K, strides and alignment for a
row whatever the number of rows, its slot in the tile or its tile-mates; it computes each column of a GEMM from
that column alone, every column of one shape alike (no value-dependent paths). The thread count is the process's
(set once by app/device.place_runtime): the library's split changes a product's bits for some shapes at 2 threads
against 1, for every row alike, so a run must not change it between its calls.

A product of a bf16 model (both operands bf16; what `specpair run` serves in on a CPU that multiplies bf16
natively: `native_bf16()`) runs in bf16: oneDNN sums the exact products in float32 and the result is rounded to
bf16, as a GPU's bf16 product is. Any other product runs in float32 on the operands' values (MKL's sgemm): float32
activations with a bf16 or float16 weight too. Each kind has its row of PRODUCTS.

A model's own weight (`weight_mm`) in bf16 on such a CPU is multiplied through a copy of it reordered once into
oneDNN's blocked layout (`_reorder_linear_weight`): torch.mm reorders the weight at every call, which costs about
what the product does (SmolLM2's LM head, 16 rows, 2 threads: 5.8 ms against 3.2). The copy is kept beside the
weight while the weight lives and is made again if the weight is written in place (its version counter: a drafter
trained in place). A reordered product is not row-invariant across row counts either (K = 1536 differs in the last
bit between 11 and 10 rows), so it takes the same fixed tiles.

A tile's row count is set by what its rows are, never by how many there are: generated tokens (decode steps,
verify blocks, drafters' rounds) take the row's `generated`, prompt tokens (a prefill, entered with
`prompt_tiles()`) its `prompt`. The weight is streamed once per tile instead of once per row: the cost per tile
grows with its rows, so a decode step wants few and a prefill many (benchmarks/cpu_tiles.py). Only the bits of one
role's rows are comparable with each other: a prompt token's hidden state is not a decode step's for the same token.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor


@dataclass(frozen=True)
class Product:
    generated: int  # rows per tile of generated tokens
    prompt: int  # rows per tile of prompt tokens


# rows per tile, measured on the 2-core benchmark machine (benchmarks/results/demo_dflash.md; SmolLM2's matmuls, ms a
# pass at 2 threads). float32: MKL's kernel for 4 columns costs about what one row costs (32 ms), 8 twice that; 32
# columns 95 ms, 3 against 8 ms a row. bfloat16 (AVX512-BF16, reordered weights): the products of a decode step
# stream 270 MB in about 21 ms whether a tile holds 1 or 16 rows (a decode step in tiles of 16, 46 ms, costs what
# products a row at a time do, 47), so a verify block of 4 sequences x 4 costs one decode step's products; 64
# rows cost about 3 times 16 (weights in cache: 15.4 against 47 ms a pass)
PRODUCTS = {
    torch.float32: Product(generated=4, prompt=32),
    torch.bfloat16: Product(generated=16, prompt=64),
}

_prompt_rows = contextvars.ContextVar("prompt_rows", default=False)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo); none elsewhere."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no flags read, no native bf16 assumed
        return frozenset()
    return frozenset(
        next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    )


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16), where oneDNN's bf16 products stream
    half the bytes of float32's; elsewhere torch emulates them, slower than float32."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags()) and torch.backends.mkldnn.is_available()


@contextlib.contextmanager
def prompt_tiles() -> Iterator[None]:
    """The products inside are prompt rows' (a prefill): tiles of their product's `prompt` rows."""
    token = _prompt_rows.set(True)
    try:
        yield
    finally:
        _prompt_rows.reset(token)


def tile_rows(dtype: torch.dtype = torch.float32) -> int:
    """The rows of a tile of a `dtype` product here: its `prompt` inside `prompt_tiles()`, else its `generated`."""
    product = PRODUCTS[dtype]
    return product.prompt if _prompt_rows.get() else product.generated


def weight_mm(x: Tensor, w: Tensor) -> Tensor:
    """x [M, K] @ w.T -> float32 [M, N] for a model's weight w [N, K], in tiles of the rows' role (`rows_mm`); a bf16
    product on a CPU that multiplies bf16 natively goes through w's reordered copy."""
    if not (x.dtype == w.dtype == torch.bfloat16 and reorders_weights()):
        return rows_mm(x, w.T)
    reordered = reordered_weight(w)
    return _tiled(
        x,
        w.shape[0],
        torch.bfloat16,
        lambda tile: torch.ops.mkldnn._linear_pointwise(tile, reordered, None, "none", [], ""),
    )


@functools.cache
def reorders_weights() -> bool:
    """Whether weight_mm multiplies bf16 weights through reordered copies here: a CPU with native bf16 products and a
    torch whose oneDNN ops for them exist (private ops: a torch without them multiplies as rows_mm does)."""
    ops = torch.ops.mkldnn
    return native_bf16() and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


# id(weight) -> (a weak reference to it, its version when reordered, the reordered copy); an entry leaves with its
# weight (the reference's callback), so an id reused by a later tensor never finds an old copy
_REORDERED: dict[int, tuple[weakref.ref, int, Tensor]] = {}


def reordered_weight(w: Tensor) -> Tensor:
    """w [N, K] bf16 in oneDNN's blocked layout for tiles of generated rows: one copy while w lives and is unchanged."""
    key = id(w)
    weight, version, reordered = _REORDERED.get(key, (None, -1, None))
    if reordered is not None and weight() is w and version == w._version:
        return reordered
    reordered = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PRODUCTS[torch.bfloat16].generated)
    _REORDERED[key] = (weakref.ref(w, lambda _: _REORDERED.pop(key, None)), w._version, reordered)
    return reordered


def _tiled(a: Tensor, n: int, dtype: torch.dtype, product: Callable[[Tensor], Tensor]) -> Tensor:
    """product(tile) [rows, n] of each zero-padded tile of a's rows in `dtype`, gathered as float32 [M, n]."""
    rows_per_tile = tile_rows(dtype)
    out = torch.empty(a.shape[0], n, dtype=torch.float32)
    for start in range(0, a.shape[0], rows_per_tile):
        rows = min(rows_per_tile, a.shape[0] - start)
        tile = torch.zeros(rows_per_tile, a.shape[1], dtype=dtype)
        tile[:rows] = a[start : start + rows]
        out[start : start + rows] = product(tile)[:rows]
    return out


def rows_mm(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] @ b [K, N] -> float32 [M, N] in tiles of the rows' role: in bf16 when both are bf16, else in float32
    (b may be a transposed view, e.g. W.T)."""
    dtype = torch.bfloat16 if a.dtype == b.dtype == torch.bfloat16 else torch.float32
    w = b.to(dtype).T  # [N, K]: a weight in its own layout when b is W.T
    return _tiled(a, w.shape[0], dtype, lambda tile: torch.mm(w, tile.T).T)
