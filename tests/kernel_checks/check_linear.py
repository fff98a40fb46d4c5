"""runtime/kernels/linear.py: every layout's Triton matmul (interpreted) and torch reference against the
float64 product with `Packed.dequantize()` of parts made by the project's own quantizers; batch invariance
of both (a row alone vs the same row among 19, across two tiles of 16); routed experts likewise; GGUF
weights as planes (the kernel loaders use) at 1 to 16 rows in tiles of 8 and 16."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specpair.errors import BadInput
from specpair.formats import gguf_planes
from specpair.formats.codecs import codec
from specpair.formats.packed import Packed
from specpair.runtime.kernels import linear

N = 40  # two column blocks of 32, the second partial
# K per layout: a partial last loop step where the layout allows one (fp8 and dense past a multiple of 128,
# NVFP4 past one of 256, an odd number of affine groups, 17 Q8_0 blocks), and long enough that the weight's
# shape asks for a split of K (both paths of the kernel run). Q8_0's rows of 17·34 bytes start at 2 mod 4
# every other row, and Q6_K's second block of a row does (210 bytes): the realigned word reads.
LAYOUT_K = {
    "bf16": 528,
    "f16": 528,
    "f32": 528,
    "fp8-tensor": 528,
    "fp8-block": 528,
    "nvfp4-modelopt": 784,
    **{f"affine{bits}-g{group}": {32: 352, 64: 576, 128: 1152}[group] for bits in (4, 8) for group in (32, 64, 128)},
    "gguf-Q8_0": 544,
    "gguf-Q4_K": 1024,
    "gguf-Q5_K": 1024,
    "gguf-Q6_K": 1024,
}
ROWS = 19


def assert_close_to(got: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor, rel: float) -> None:
    """|got − exact| <= rel·scale + half an ulp of got's dtype: `scale` is Σ|x||w| of each output (a float32 sum
    of K products errs by a small multiple of eps·Σ|x||w|), `exact` the float64 result."""
    assert not got.isnan().any(), "unwritten (NaN) elements"
    bound = rel * scale + (2.0**-8 if got.dtype == torch.bfloat16 else 0.0) * exact.abs()
    err = (got.double() - exact).abs()
    worst = (err - bound).argmax()
    assert (err <= bound).all(), (
        f"error {err.flatten()[worst].item():.3g} > bound {bound.flatten()[worst].item():.3g} at {worst.item()}"
    )


def packed(layout: str, w: torch.Tensor, name: str = "model.layers.0.mlp.up_proj.weight") -> Packed:
    return Packed(name, layout, tuple(w.shape), codec(layout).encode(w, name))


def stacked(layout: str, ws: list[torch.Tensor]) -> Packed:
    """Experts quantized one by one (own per-tensor scales), every part stacked with the expert axis first."""
    experts = [packed(layout, w) for w in ws]
    parts = {k: torch.stack([p.parts[k] for p in experts]) for k in experts[0].parts}
    return Packed("model.layers.0.mlp.experts.up_proj.weight", layout, (len(ws), *ws[0].shape), parts)


def exact(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 product and Σ|x||w| per output."""
    return x.double() @ w.double().T, x.double().abs() @ w.double().abs().T


def test_layouts_with_kernels_are_the_ones_listed() -> None:
    assert set(LAYOUT_K) == set(linear.KERNEL_LAYOUTS)


@pytest.mark.parametrize("layout", sorted(LAYOUT_K))
def test_checked_shapes_run_every_loop_path(layout: str) -> None:
    """The K above splits into two or more parts, and (where the layout allows) ends in a partial step."""
    op = linear._operand(packed(layout, torch.randn(N, LAYOUT_K[layout])))
    tiles = linear._config(op)
    assert tiles.splits >= 2
    if layout.startswith(("bf16", "f16", "f32", "fp8", "nvfp4", "affine", "gguf-Q8_0")):
        assert op.k % tiles.step


@pytest.mark.parametrize("layout", sorted(LAYOUT_K))
def test_matmul_layout(layout: str) -> None:
    """bf16 activations, as on the GPU: a bf16 result rounded once from the float32 sum."""
    torch.manual_seed(hash(layout) % 1000)
    k = LAYOUT_K[layout]
    w = packed(layout, torch.randn(N, k))
    x = torch.randn(ROWS, k).bfloat16()
    truth, scale = exact(x, w.dequantize())
    kernel = linear.matmul_triton(x, w)
    reference = linear.matmul_reference(x, w)
    assert kernel.dtype == reference.dtype == torch.bfloat16
    assert_close_to(kernel, truth, scale, 1e-6)
    assert_close_to(reference, truth, scale, 1e-6)
    for row in (0, ROWS - 1):
        alone = x[row : row + 1].clone()
        assert torch.equal(linear.matmul_triton(alone, w)[0], kernel[row])
        assert torch.equal(linear.matmul_reference(alone, w)[0], reference[row])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_matmul_dense_tensor(dtype: torch.dtype) -> None:
    """float32 activations (the CPU's) and a float32 result; a plain tensor as the weight."""
    torch.manual_seed(1)
    w = torch.randn(N, 200).to(dtype)
    x = torch.randn(17, 200)
    truth, scale = exact(x, w.float())
    kernel = linear.matmul_triton(x, w)
    assert_close_to(kernel, truth, scale, 1e-6)
    assert_close_to(linear.matmul_reference(x, w), truth, scale, 1e-6)
    assert torch.equal(linear.matmul_triton(x[16:17].clone(), w)[0], kernel[16])


@pytest.mark.parametrize("layout, k", [("gguf-Q8_0", 288), ("gguf-Q6_K", 256)])
def test_realigned_words(layout: str, k: int) -> None:
    """Q8_0 and Q6_K rows of 306 and 210 bytes: odd rows start at 2 mod 4, and 41 of them do not fill whole
    words (the kernel reads a zero-padded copy); a weight whose bytes start at 2 mod 4 (a view into a larger
    buffer) reads the same bits as an aligned one."""
    torch.manual_seed(5)
    w = packed(layout, torch.randn(41, k))
    data = w.parts[""]
    assert data.numel() % 4 == 2
    buffer = torch.zeros(data.numel() + 2, dtype=torch.uint8)
    buffer[2:] = data.reshape(-1)
    shifted = Packed(w.name, w.layout, w.shape, {"": buffer[2:].view(data.shape)})
    assert shifted.parts[""].data_ptr() % 4 == 2
    x = torch.randn(5, k).bfloat16()
    truth, scale = exact(x, w.dequantize())
    kernel = linear.matmul_triton(x, w)
    assert_close_to(kernel, truth, scale, 1e-6)
    assert torch.equal(linear.matmul_triton(x, shifted), kernel)
    assert torch.equal(linear.matmul_triton(x[4:5].clone(), w)[0], kernel[4])


@pytest.mark.parametrize("layout", ["fp8-tensor", "fp8-block"])
def test_fp8_subnormal_codes(layout: str) -> None:
    """E4M3 codes with a zero exponent (|value| < 2^-6), every sign: decoded through bf16 subnormals."""
    torch.manual_seed(8)
    codes = torch.randint(0, 8, (N, 128), dtype=torch.uint8) | (torch.randint(0, 2, (N, 128), dtype=torch.uint8) << 7)
    base = packed(layout, torch.randn(N, 128))
    parts = {**base.parts, ".weight": codes.view(torch.float8_e4m3fn)}
    w = Packed(base.name, layout, base.shape, parts)
    x = torch.randn(3, 128).bfloat16()
    truth, scale = exact(x, w.dequantize())
    assert_close_to(linear.matmul_triton(x, w), truth, scale, 1e-6)


@pytest.mark.parametrize("layout", ["fp8-tensor", "fp8-block"])
def test_rows_not_whole_words_are_refused(layout: str) -> None:
    """FP8 codes are read four to a word: a K that is not a multiple of 4 is refused, naming the weight."""
    w = packed(layout, torch.randn(N, 130))
    with pytest.raises(BadInput, match="up_proj.weight.*not whole words"):
        linear.matmul_triton(torch.randn(2, 130).bfloat16(), w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_affine_scales_wider_than_bf16(dtype: torch.dtype) -> None:
    """f16 or float32 scales and biases (MLX models stored in those dtypes): a bias enters the dots as two or
    three exact bf16 parts, so its products stay exact."""
    torch.manual_seed(6)
    base = packed("affine4-g64", torch.randn(N, 256))
    groups = base.parts[".scales"].shape
    parts = {
        ".weight": base.parts[".weight"],
        ".scales": (torch.rand(groups) * 0.1 + 0.01).to(dtype),
        ".biases": (torch.randn(groups) * 0.3).to(dtype),
    }
    w = Packed(base.name, base.layout, base.shape, parts)
    assert not torch.equal(parts[".biases"].bfloat16().to(dtype), parts[".biases"])
    x = torch.randn(3, 256).bfloat16()
    truth, scale = exact(x, w.dequantize())
    assert_close_to(linear.matmul_triton(x, w), truth, scale, 1e-6)


def test_matmul_column_order() -> None:
    """A GGUF-tiled out_proj: logical column j is stored column col_order[j]; the kernel permutes x instead."""
    torch.manual_seed(2)
    logical = torch.randn(N, 256)
    col_order = torch.randperm(256)
    stored = torch.empty_like(logical)
    stored[:, col_order] = logical
    base = packed("gguf-Q8_0", stored)
    w = Packed(base.name, base.layout, base.shape, base.parts, col_order)
    x = torch.randn(3, 256)
    truth, scale = exact(x, w.dequantize())
    assert_close_to(linear.matmul_triton(x, w), truth, scale, 1e-6)
    assert_close_to(linear.matmul_reference(x, w), truth, scale, 1e-6)


@pytest.mark.parametrize("layout", ["nvfp4-ct", "nvfp4-mlx", "nvfp4-gguf"])
def test_other_nvfp4_flavours_repack_exactly(layout: str) -> None:
    torch.manual_seed(3)
    w = packed(layout, torch.randn(N, 128))
    repacked = linear.to_kernel_layout(w)
    assert repacked.layout == "nvfp4-modelopt"
    assert torch.equal(repacked.dequantize(), w.dequantize())
    x = torch.randn(2, 128)
    truth, scale = exact(x, w.dequantize())
    assert_close_to(linear.matmul_triton(x, repacked), truth, scale, 1e-6)
    experts = stacked(layout, [torch.randn(N, 128) for _ in range(2)])
    assert torch.equal(linear.to_kernel_layout(experts).dequantize(), experts.dequantize())


def check_experts(w: torch.Tensor | Packed, dequantized: torch.Tensor, x: torch.Tensor, ids: torch.Tensor) -> None:
    truth = torch.stack(
        [torch.stack([x[t].double() @ dequantized[e].double().T for e in row.tolist()]) for t, row in enumerate(ids)]
    )
    scale = torch.stack(
        [
            torch.stack([x[t].double().abs() @ dequantized[e].double().abs().T for e in row.tolist()])
            for t, row in enumerate(ids)
        ]
    )
    kernel = linear.matmul_experts_triton(x, w, ids)
    reference = linear.matmul_experts_reference(x, w, ids)
    assert kernel.shape == reference.shape == (x.shape[0], ids.shape[1], dequantized.shape[1])
    assert_close_to(kernel, truth, scale, 1e-6)
    assert_close_to(reference, truth, scale, 1e-6)
    for t in (0, x.shape[0] - 1):  # a token alone (decode) vs among the others (verify)
        assert torch.equal(linear.matmul_experts_triton(x[t : t + 1].clone(), w, ids[t : t + 1])[0], kernel[t])
        assert torch.equal(linear.matmul_experts_reference(x[t : t + 1].clone(), w, ids[t : t + 1])[0], reference[t])


@pytest.mark.parametrize("layout", sorted(LAYOUT_K))
def test_matmul_experts_layout(layout: str) -> None:
    torch.manual_seed(hash(layout) % 1000 + 1)
    k = 256  # one block of every layout: the expert path differs from the plain one only in where rows start
    w = stacked(layout, [torch.randn(N, k) for _ in range(3)])
    x = torch.randn(3, k)
    ids = torch.tensor([[2, 0], [0, 2], [1, 2]])
    check_experts(w, w.dequantize(), x, ids)


@pytest.mark.parametrize("layout", ["bf16", "nvfp4-modelopt", "gguf-Q6_K"])
def test_matmul_experts_window_equals_sorted(layout: str) -> None:
    """Up to 16 tokens find their expert's other tokens in the kernel (the window); the sorted tile table gives
    the same bits, from the tile table's kernel and from the torch sort: a token naming one expert twice, an
    expert shared by all tokens, 16 tokens of top-16."""
    torch.manual_seed(7)
    experts = 17 if layout == "bf16" else 4
    w = stacked(layout, [torch.randn(N, 256) for _ in range(experts)])
    x = torch.randn(16, 256).bfloat16()
    few = torch.tensor([[0, 0, 2], [2, 0, 0], [1, 2, 3]])
    cases = [(3, few)] + [(16, torch.stack([torch.randperm(17)[:16] for _ in range(16)]))] * (experts == 17)
    for tokens, ids in cases:
        window = linear.matmul_experts_triton(x[:tokens], w, ids, window=True)
        assert torch.equal(window, linear.matmul_experts_triton(x[:tokens], w, ids, window=False))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(linear, "TILE_TABLE_MAX_PAIRS", 0)
            assert torch.equal(window, linear.matmul_experts_triton(x[:tokens], w, ids, window=False))
    check_experts(w, w.dequantize(), x[:3], few)


@pytest.mark.parametrize("layout", ["bf16", "nvfp4-modelopt", "gguf-Q4_K", "gguf-Q4_K planes"])
def test_matmul_experts_per_pair(layout: str) -> None:
    """A row of x per (token, slot) pair (the down projection's SwiGLU outputs): found in the window and in the
    sorted table, the same bits as the pairs given one by one as tokens of top-1 (how the MoE called it before);
    GGUF as stored and as the planes the loader makes of it (the planes kernel)."""
    torch.manual_seed(11)
    w = stacked(layout.removesuffix(" planes"), [torch.randn(N, 256) for _ in range(5)])
    if layout.endswith(" planes"):
        w = linear.to_kernel_layout(w)
    for tokens, ids in [(3, torch.tensor([[0, 0, 2], [2, 4, 0], [1, 2, 3]])), (1, torch.tensor([[4, 1, 3]]))]:
        x = torch.randn(ids.numel(), 256).bfloat16()
        one_by_one = linear.matmul_experts_triton(x, w, ids.reshape(-1, 1)).reshape(tokens, 3, N)
        for window in (True, False):
            assert torch.equal(linear.matmul_experts_triton(x, w, ids, window=window, per_pair=True), one_by_one)
        reference = linear.matmul_experts_reference(x, w, ids, per_pair=True)
        assert torch.equal(reference, linear.matmul_experts_reference(x, w, ids.reshape(-1, 1)).reshape(tokens, 3, N))
        truth = torch.einsum("tsnk,tsk->tsn", w.dequantize()[ids].double(), x.reshape(tokens, 3, -1).double())
        scale = torch.einsum(
            "tsnk,tsk->tsn", w.dequantize()[ids].double().abs(), x.reshape(tokens, 3, -1).double().abs()
        )
        assert_close_to(one_by_one, truth, scale, 1e-6)


@pytest.mark.parametrize("window", [True, False])
def test_matmul_experts_unsummed(window: bool) -> None:
    """A K split in four: its partials, summed, are the bits of the summed product (the SwiGLU adds them)."""
    torch.manual_seed(12)
    w = stacked("nvfp4-modelopt", [torch.randn(N, 2048) for _ in range(4)])
    x = torch.randn(3, 2048).bfloat16()
    ids = torch.tensor([[0, 3], [3, 1], [2, 3]])
    sums = linear.matmul_experts_triton(x, w, ids, window=window, unsummed=True)
    assert isinstance(sums, linear.SplitSums) and sums.partial.shape[:2] == (linear.tiles_of(w).splits, 6)
    assert torch.equal(sums.summed().reshape(3, 2, N), linear.matmul_experts_triton(x, w, ids, window=window))


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "rows"),
    [(17, 9, 257, 16), (64, 9, 257, 16), (3, 2, 5, 16), (100, 8, 16, 16), (33, 4, 4, 8), (1, 1, 1, 16)],
)
def test_tile_table(tokens: int, top_k: int, experts: int, rows: int) -> None:
    """The order is the pairs sorted stably by expert; each expert's pairs are cut into tiles of `rows` from its
    first, each tile in one row of the table, every pair in exactly one tile; the rows no tile takes are empty.
    The kernel's table and the torch sort's (tile_table past TILE_TABLE_MAX_PAIRS) hold the same tiles. Shapes: the
    35B-A3B's (256 experts and the shared one, 9 pairs a token) past the 16-token window, more pairs than experts,
    every expert full, a token's expert named twice, one pair."""
    generator = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)])
    if top_k > 1:
        ids[0, 1] = ids[0, 0]
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=experts)
    want = [
        (e, int(counts[:e].sum()) + b, min(int(counts[:e].sum()) + b + rows, int(counts[: e + 1].sum())))
        for e in range(experts)
        for b in range(0, int(counts[e]), rows)
    ]
    for limit in (linear.TILE_TABLE_MAX_PAIRS, 0):  # the kernel, then the torch sort
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(linear, "TILE_TABLE_MAX_PAIRS", limit)
            table, order = linear.tile_table(ids, experts, rows)
        assert table.dtype == order.dtype == torch.int32 and table.shape[1] == 3
        assert torch.equal(order.long(), torch.argsort(flat, stable=True))
        assert sorted(tuple(t) for t in table.tolist() if t[2] > t[1]) == sorted(want)
        assert all(t[1] == t[2] for t in table.tolist() if t[2] <= t[1])


def test_matmul_experts_share_their_tile_tables() -> None:
    """Past the window, a MoE layer's gate|up and down (a row of x per pair) read one TileTables, which builds a
    table once per (experts, rows): the same bits as each call's own tables; tables of other expert_ids are
    refused."""
    torch.manual_seed(13)
    gate_up, down = torch.randn(4, 32, 64).bfloat16(), torch.randn(4, 64, 16).bfloat16()
    x = torch.randn(20, 64).bfloat16()
    ids = torch.randint(0, 4, (20, 2))
    alone = linear.matmul_experts_triton(x, gate_up, ids, window=False)
    alone_down = linear.matmul_experts_triton(alone[..., :16].reshape(40, 16), down, ids, window=False, per_pair=True)
    tables = linear.TileTables(ids)
    shared = linear.matmul_experts_triton(x, gate_up, ids, window=False, tables=tables)
    shared_down = linear.matmul_experts_triton(
        shared[..., :16].reshape(40, 16), down, ids, window=False, per_pair=True, tables=tables
    )
    assert torch.equal(shared, alone) and torch.equal(shared_down, alone_down)
    rows = linear.tiles_of(gate_up).block_m
    assert all(a is b for a, b in zip(tables(4, rows), tables(4, rows)))
    with pytest.raises(ValueError, match="tile tables of other expert_ids"):
        linear.matmul_experts_triton(x, gate_up, ids.clone(), window=False, tables=tables)


def test_matmul_experts_many_tokens_per_expert() -> None:
    """18 tokens on expert 0 (two tiles of its rows), an untouched expert, a token's two slots on one expert."""
    torch.manual_seed(4)
    w = torch.randn(4, N, 256).bfloat16()
    x = torch.randn(18, 256)
    ids = torch.stack([torch.zeros(18, dtype=torch.int64), torch.randint(1, 3, (18,))], 1)
    ids[5, 1] = 0
    check_experts(w, w.float(), x, ids)
    check_experts(w, w.float(), x[:1].bfloat16(), ids[:1])


@pytest.mark.parametrize("layout", sorted(LAYOUT_K))
def test_fused_rows(layout: str) -> None:
    """Three weights fused into one (q|k|v, gate|up): it dequantizes to their rows in order, bit for bit, and
    its products are the float64 product's within the bound, row-invariant."""
    torch.manual_seed(hash(layout) % 1000 + 2)
    k = LAYOUT_K[layout]
    rows = (256, 128, 40) if layout == "fp8-block" else (N, 24, 8)  # fp8-block: whole 128-row scale tiles
    pieces = [packed(layout, torch.randn(r, k)) for r in rows]
    if codec(layout).tensor_amax:  # one per-tensor scale for all three, as a fused export would have
        whole = torch.randn(sum(rows), k)
        parts = codec(layout).encode(whole, "w", float(whole.abs().max()))
        starts = [0, rows[0], rows[0] + rows[1], sum(rows)]
        pieces = [
            Packed("w", layout, (r, k), {key: p if p.ndim == 0 else p[a:b] for key, p in parts.items()})
            for r, a, b in zip(rows, starts, starts[1:])
        ]
    assert linear.fusable_rows(pieces)
    fused = linear.fuse_rows(pieces)
    assert fused.shape == (sum(rows), k)
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in pieces]))
    x = torch.randn(ROWS, k).bfloat16()
    truth, scale = exact(x, fused.dequantize())
    kernel = linear.matmul_triton(x, fused)
    assert_close_to(kernel, truth, scale, 1e-6)
    assert torch.equal(linear.matmul_triton(x[3:4].clone(), fused)[0], kernel[3])


def test_weights_that_cannot_be_one_operand_are_not_fused() -> None:
    torch.manual_seed(9)
    w = torch.randn(40, 256)
    assert torch.equal(linear.fuse_rows([w.bfloat16(), w.bfloat16()]), torch.cat([w, w]).bfloat16())
    cannot = {
        "dtypes differ": [w.bfloat16(), w.half()],
        "widths differ": [w.bfloat16(), torch.randn(40, 128).bfloat16()],
        "own fp8 tensor scales": [packed("fp8-tensor", w), packed("fp8-tensor", 2 * w)],
        "own nvfp4 tensor scales": [packed("nvfp4-modelopt", w), packed("nvfp4-modelopt", 2 * w)],
        "40 rows cut a 128-row tile": [packed("fp8-block", w), packed("fp8-block", w)],
        "layouts differ": [packed("affine4-g64", w), packed("affine4-g32", w)],
        "dense and packed": [w.bfloat16(), packed("affine4-g64", w)],
    }
    for why, weights in cannot.items():
        assert not linear.fusable_rows(weights), why
        with pytest.raises(ValueError, match="not one operand"):
            linear.fuse_rows(weights)
    assert linear.fusable_rows([packed("fp8-block", torch.randn(128, 256)), packed("fp8-block", w)])


# ---- GGUF weights as planes (formats/gguf_planes.py): the planes kernel --------------------------------------

PLANES_K = {"gguf-Q8_0": 544, "gguf-Q4_K": 512, "gguf-Q5_K": 512, "gguf-Q6_K": 512}  # Q8_0: a partial last step


def planes_tiles(w: Packed, block_m: int) -> linear.Tiles:
    """The weight's own tiles with `block_m` tokens a tile, and rows of 32 (two row groups of 16) so that N = 40
    ends inside a program."""
    return replace(linear.tiles_of(w), block_n=32, warps=2, block_m=block_m)


@pytest.mark.parametrize("block_m", [8, 16])
@pytest.mark.parametrize("layout", sorted(PLANES_K))
def test_planes_matmul(layout: str, block_m: int) -> None:
    """Every GGUF type the planes kernel reads, at 1 to 16 rows (one tile, or two of 8): within the bound of the
    float64 product, and each row's bits the same alone and among the others; the planes hold the GGUF bytes."""
    torch.manual_seed(hash(layout) % 1000 + block_m)
    k = PLANES_K[layout]
    stored = packed(layout, torch.randn(N, k))
    w = linear.to_kernel_layout(stored)
    assert gguf_planes.is_planes(w.parts) and sum(p.nbytes for p in w.parts.values()) == stored.parts[""].nbytes
    assert torch.equal(w.dequantize(), stored.dequantize())
    tiles = planes_tiles(w, block_m)
    x = torch.randn(16, k).bfloat16()
    truth, scale = exact(x, stored.dequantize())
    full = linear.matmul_triton(x, w, tiles)
    assert_close_to(full, truth, scale, 1e-6)
    for rows in (1, 3, 9):
        assert torch.equal(linear.matmul_triton(x[:rows].clone(), w, tiles), full[:rows])
    for row in (0, 7, 15):
        assert torch.equal(linear.matmul_triton(x[row : row + 1].clone(), w, tiles)[0], full[row])


@pytest.mark.parametrize("layout", sorted(PLANES_K))
def test_planes_split_k(layout: str) -> None:
    """K split in two (float32 partials summed in order), the weight's own configuration otherwise."""
    torch.manual_seed(hash(layout) % 1000 + 11)
    k = 1024
    w = linear.to_kernel_layout(packed(layout, torch.randn(N, k)))
    tiles = replace(planes_tiles(w, 16), splits=2)
    x = torch.randn(5, k).bfloat16()
    truth, scale = exact(x, w.dequantize())
    y = linear.matmul_triton(x, w, tiles)
    assert_close_to(y, truth, scale, 1e-6)
    assert torch.equal(linear.matmul_triton(x[2:3].clone(), w, tiles)[0], y[2])


@pytest.mark.parametrize("layout", sorted(PLANES_K))
def test_planes_experts(layout: str) -> None:
    """Routed experts as planes: the in-kernel window and the sorted tile table give the same bits, within the
    bound, a token alone as among the others."""
    torch.manual_seed(hash(layout) % 1000 + 12)
    w = linear.to_kernel_layout(stacked(layout, [torch.randn(N, 256) for _ in range(3)]))
    assert w.experts == 3 and gguf_planes.is_planes(w.parts)
    x = torch.randn(3, 256).bfloat16()
    ids = torch.tensor([[2, 0], [0, 2], [1, 1]])
    tiles = planes_tiles(w, 8)
    window = linear.matmul_experts_triton(x, w, ids, tiles, window=True)
    assert torch.equal(window, linear.matmul_experts_triton(x, w, ids, tiles, window=False))
    check_experts(w, w.dequantize(), x, ids)


def test_planes_fused_rows() -> None:
    """q|k|v of Q6_K planes fuse like any layout: the fused weight's planes are the pieces' rows."""
    torch.manual_seed(13)
    pieces = [linear.to_kernel_layout(packed("gguf-Q6_K", torch.randn(r, 256))) for r in (40, 24, 8)]
    fused = linear.fuse_rows(pieces)
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in pieces]))
    x = torch.randn(4, 256).bfloat16()
    truth, scale = exact(x, fused.dequantize())
    assert_close_to(linear.matmul_triton(x, fused), truth, scale, 1e-6)


@pytest.mark.parametrize("layout", ["bf16", "fp8-block", "nvfp4-modelopt", "gguf-Q4_K"])
def test_a_shared_expert_appended_to_expert_stacks(layout: str) -> None:
    """with_expert: gate and up stacks of 3 experts, fused along their rows where they can be (NVFP4 experts
    quantized one by one have their own per-tensor scales: not), the shared expert's gate and up as expert 3, in
    one weight each (GGUF as the planes loaders give): each expert's rows are its pieces', and a token routed to
    its experts and the shared one gets each product within the bound, alone as among the others."""
    torch.manual_seed(hash(layout) % 1000 + 21)

    def weight(w: torch.Tensor) -> torch.Tensor | Packed:
        return w.bfloat16() if layout == "bf16" else linear.to_kernel_layout(packed(layout, w))

    def stack(ws: list[torch.Tensor]) -> torch.Tensor | Packed:
        return torch.stack(ws).bfloat16() if layout == "bf16" else linear.to_kernel_layout(stacked(layout, ws))

    def dense(w: torch.Tensor | Packed) -> torch.Tensor:
        return w.float() if isinstance(w, torch.Tensor) else w.dequantize()

    gate, up = (stack([torch.randn(128, 256) for _ in range(3)]) for _ in range(2))
    shared = [weight(torch.randn(128, 256)) for _ in range(2)]
    fused = linear.fusable_rows([gate, up]) and linear.fusable_rows(shared)
    assert fused == (layout != "nvfp4-modelopt")
    pairs = [([gate, up], shared)] if fused else [([gate], shared[:1]), ([up], shared[1:])]
    x = torch.randn(3, 256).bfloat16()
    ids = torch.tensor([[2, 0, 3], [0, 1, 3], [1, 2, 3]], dtype=torch.int32)
    for stacks, extra in pairs:
        assert linear.appendable_expert(stacks, extra)
        both = linear.with_expert(stacks, extra)
        assert tuple(both.shape) == (4, 128 * len(stacks), 256)
        for e in range(3):
            assert torch.equal(dense(both)[e], torch.cat([dense(w)[e] for w in stacks]))
        assert torch.equal(dense(both)[3], torch.cat([dense(w) for w in extra]))
        check_experts(both, dense(both), x, ids)
    # what cannot be one more expert: another width, or another layout
    assert not linear.appendable_expert([gate], [weight(torch.randn(64, 256))])
    other = torch.randn(128, 256).bfloat16() if layout != "bf16" else weight(torch.randn(128, 256)).float()
    assert not linear.appendable_expert([gate], [other])
    with pytest.raises(ValueError, match="not one stack of experts"):
        linear.with_expert([gate], [other])
