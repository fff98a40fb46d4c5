"""Reading a region of a weight (formats/regions.py; Model.stream with regions, what a tensor-parallel rank loads).

`trace` follows a region back through every map step a shard meets (experts stacked from separate tensors, gate and
up rows of a concatenation, GGUF's reordered value heads, a column order) to cuts of the sources, and the rewritten
map over the cut sources gives the region of the whole. Read from files, every layout with a grain table gives the
whole weight's region, float or packed (same values), from exactly the bytes the plan counts; GGUF planes of a cut are
the cut of the planes (a rank's planes are made from its blocks); a cut through a block is Unaligned.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from fixtures import save, tiny_model
from test_runtime_layouts import convert

from specpair.formats import gguf_planes
from specpair.formats.gguf_quants import block_size
from specpair.formats.packed import Packed
from specpair.formats.regions import Cut, Grain, Region, Unaligned, part_cut, trace
from specpair.formats.transforms import Step, TensorMap
from specpair.runtime.loading import plan_load
from specpair.runtime.parallel import Parallel
from specpair.sources.model import open_model


def cut_of(x: torch.Tensor, cut: Cut) -> torch.Tensor:
    for axis, runs in ((-2, cut.rows), (-1, cut.cols)):
        if runs is not None:
            x = Region(axis, runs).narrow(x)
    return x


MAPS = {  # (map, its sources' shapes)
    "one": (TensorMap("w", (12, 8), ("a",)), [(12, 8)]),
    "stacked experts": (TensorMap("w", (3, 12, 8), ("e0", "e1", "e2"), (Step("stack"),)), [(12, 8)] * 3),
    "gate of a concatenation": (
        TensorMap("w", (3, 6, 8), ("gate", "up"), (Step("cat_rows"), Step("rows", (0, 6)))),
        [(3, 6, 8), (3, 6, 8)],
    ),
    "reordered rows of two sources": (
        TensorMap("w", (10, 8), ("a", "b"), (Step("cat_rows"), Step("take_rows", ((9, 0, 1, 8, 2, 3, 4, 5, 6, 7),)))),
        [(4, 8), (6, 8)],
    ),
    "column order": (TensorMap("w", (6, 8), ("a",), (Step("take_cols", ((4, 5, 6, 7, 0, 1, 2, 3),)),)), [(6, 8)]),
}
REGIONS = [Region(-2, ((0, 3),)), Region(-2, ((1, 2), (4, 6))), Region(-1, ((0, 4),)), Region(-1, ((2, 4), (6, 8)))]


@pytest.mark.parametrize("kind", MAPS)
@pytest.mark.parametrize("region", REGIONS, ids=str)
def test_trace_gives_the_region_from_cut_sources(kind, region):
    m, shapes = MAPS[kind]
    sources = [torch.randn(shape) for shape in shapes]
    traced = trace(m, shapes, region)
    cut = [cut_of(sources[m.sources.index(s)], traced.cuts[s]) for s in traced.map.sources]
    assert torch.equal(traced.map.apply(cut), region.narrow(m.apply(sources)))
    taken = sum(cut_of(torch.ones(shapes[m.sources.index(s)]), c).numel() for s, c in traced.cuts.items())
    assert taken == region.narrow(m.apply(sources)).numel()  # no source row or column more than the region needs


def test_trace_leaves_other_steps_to_the_whole_weight():
    m = TensorMap("w", (4, 8), ("a",), (Step("transpose", (0, 1)),))
    assert trace(m, [(8, 4)], Region(-2, ((0, 2),))) is None
    assert trace(TensorMap("w", (6,), ("a",)), [(6,)], Region(-1, ((0, 3),))) is None


def test_a_cut_through_a_block_is_unaligned():
    scale = part_cut((3, 2), 12, (300, 200), Grain(128, 128), Cut(rows=((0, 256),)), "w.weight_scale_inv")
    assert scale.entry_runs == ((0, 2),) and scale.shape == (2, 2)
    last = part_cut((3, 2), 12, (300, 200), Grain(128, 128), Cut(rows=((256, 300),), cols=((128, 200),)), "s")
    assert last.shape == (1, 1) and last.byte_runs == ((2, 4),)  # the partial edge tile, whole
    with pytest.raises(Unaligned, match="rows 0:150 of w.weight_scale_inv end inside a block of 128 rows"):
        part_cut((3, 2), 12, (300, 200), Grain(128, 128), Cut(rows=((0, 150),)), "w.weight_scale_inv")
    with pytest.raises(Unaligned, match="columns 16:48 of q end inside a block of 32 columns"):
        part_cut((4, 34 * 4), 4 * 34 * 4, (4, 128), Grain(values=32), Cut(cols=((16, 48),)), "q")


# layouts of every grain table: floats (safetensors and GGUF), FP8 per tensor, the four NVFP4 flavours, affine codes
# whose runs end on words every 16 values (6 bits), GGUF blocks
LAYOUTS = (
    "bf16",
    "gguf:F16",
    "fp8:tensor",
    "nvfp4",
    "nvfp4:ct",
    "nvfp4:mlx",
    "gguf:NVFP4",
    "affine:6:32",
    "affine:4:32",
    "gguf:Q8_0",
)
# GGUF tiles the value heads of a Gated DeltaNet with fewer key heads: a rank's heads are runs of stored rows and
# columns (value dims of 64: whole blocks of every layout above)
DIMS = {"linear_value_head_dim": 64, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return save(tiny_model("qwen3_5_moe", init=0.02, **DIMS), tmp_path_factory.mktemp("regions") / "hf", "qwen3")


@pytest.mark.parametrize("to", LAYOUTS)
def test_a_rank_reads_its_region_of_every_weight(source, tmp_path, to):
    model = open_model(str(convert(source, tmp_path / ("out.gguf" if to.startswith("gguf") else "out"), to)))
    whole = dict(model.stream())
    for packed in (False, True):
        for rank in range(2):
            plan = plan_load(model, "cpu", packed=packed, parallel=Parallel(rank, 2))
            read: list[int] = []
            got = dict(
                model.stream(
                    plan.needs, packed=plan.packed.__contains__, regions=plan.regions.get, progress=read.append
                )
            )
            assert (
                sum(read) == plan.stored_bytes < 0.7 * sum(model.read_nbytes(s) for s in model.weights)
            )  # narrow rows: whole
            for name, value in got.items():
                assert isinstance(value, Packed) == (name in plan.packed), name
                want = whole[name] if name not in plan.regions else plan.regions[name].narrow(whole[name])
                assert torch.equal(value.dequantize() if isinstance(value, Packed) else value, want), name
            assert bool(plan.packed) == (packed and to not in ("bf16", "gguf:F16"))
    if to.startswith("gguf"):  # the tiled heads: a rank's value heads are every other head stored
        name = "layers.0.linear_attn.out_proj.weight"
        (_, cut), *_ = model.reading(name, plan.regions[name]).reads
        assert cut.cols == ((64, 128), (192, 256))


@pytest.mark.parametrize("qtype", sorted(gguf_planes.PLANES))
def test_the_planes_of_a_cut_are_the_cut_of_the_planes(qtype):
    """A rank's planes are made from its cut blocks: the same as cutting the whole tensor's planes by rows and by
    whole blocks of every plane."""
    values, block_bytes = block_size(qtype)
    shape = (6, 4 * values)
    data = torch.randint(0, 256, (6, 4 * block_bytes), dtype=torch.uint8)
    cut = Cut(rows=((1, 3), (4, 6)), cols=((values, 3 * values),))
    where = part_cut(shape, data.numel(), shape, Grain(values=values), cut, qtype)
    rows = Region(-2, cut.rows).narrow(data)  # what the reader reads: the cut's rows, whole (columns a page apart)
    shard = torch.from_numpy(where.take(rows.reshape(-1).numpy())).reshape(4, 2 * block_bytes)
    planes = gguf_planes.to_planes(data, qtype, shape)
    for role, plane in gguf_planes.to_planes(shard, qtype, (4, 2 * values)).items():
        blocks = planes[role].reshape(6, 4, -1)
        assert torch.equal(plane, Region(-3, cut.rows).narrow(blocks)[:, 1:3].reshape(4, -1)), role  # rows, blocks
    assert math.prod(shard.shape) == where.nbytes
